"""Hardware profiles: interpolation, JSON round trip, clear errors, measuring a tiny model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import make_pair, tiny_model

from sequoia.core.profiles.profile import HardwareProfile
from sequoia.runtime.measuring.profiling import measure_profile


def _profile(**kw) -> HardwareProfile:
    base = dict(device="test", dtype="torch.float32", context_len=16, target_n=(1, 2, 4), target_ms=(10.0, 12.0, 20.0),
                draft_width=(1, 4), draft_ms=(2.0, 5.0), pair="a+b", date="2025-01-01", version="0.1.0", repeats=3)
    base.update(kw)
    return HardwareProfile(**base)


def test_interpolation_and_extrapolation():
    prof = _profile()
    assert prof.target(1) == 10.0
    assert prof.target(3) == pytest.approx(16.0)
    assert prof.target(6) == pytest.approx(28.0)  # last segment: slope 4 ms per token
    assert prof.draft(2) == pytest.approx(3.0)
    assert list(prof.target(torch.tensor([1, 3]).numpy())) == pytest.approx([10.0, 16.0])
    with pytest.raises(ValueError, match="n must be >= 1"):
        prof.target(0)


@pytest.mark.parametrize("kw, msg", [
    (dict(target_n=(1, 2)), "has 2 points"),
    (dict(target_n=(1, 4, 2)), "strictly increasing"),
    (dict(target_ms=(10.0, -1.0, 2.0)), "positive finite"),
    (dict(draft_width=()), "must not be empty"),
    (dict(draft_ms=(2.0, float("nan"))), "positive finite"),
])
def test_invalid_profiles(kw, msg):
    if "draft_width" in kw:
        kw["draft_ms"] = ()
    with pytest.raises(ValueError, match=msg):
        _profile(**kw)


def test_json_round_trip(tmp_path):
    prof = _profile()
    path = tmp_path / "hw.json"
    prof.save(path)
    assert HardwareProfile.load(path) == prof
    assert HardwareProfile.load(path, pair="a+b") == prof


@pytest.mark.parametrize("content, msg", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"format": "sequoia-acceptance/1", "values": [0.5]}), r"expected a Sequoia hardware profile file \(format 'sequoia-hardware/2'\), but it is a 'sequoia-acceptance/1' file"),
    (json.dumps({"parents": [-1]}), "no 'format' field"),
])
def test_malformed_files(tmp_path, content, msg):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=msg):
        HardwareProfile.load(path)


def test_broken_fields_name_the_problem(tmp_path):
    data = _profile().to_dict()
    path = tmp_path / "hw.json"
    for key, value, msg in [
        ("target_ms", None, "missing field 'target_ms'"),
        ("target_ms", "fast", "'target_ms' must be list"),
        ("target_n", [1, 2.5, 4], "'target_n' must be a list of integers"),
        ("draft_ms", [2.0, "x"], "'draft_ms' must be a list of finite numbers"),
        ("target_ms", [10.0, 12.0], "has 3 points but target_ms has 2"),
    ]:
        broken = dict(data)
        if value is None:
            del broken[key]
        else:
            broken[key] = value
        path.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=msg) as info:
            HardwareProfile.load(path)
        assert str(path) in str(info.value)


def test_mismatched_pair(tmp_path):
    path = tmp_path / "hw.json"
    _profile().save(path)
    with pytest.raises(ValueError, match="measured for pair 'a\\+b', not 'c\\+d'"):
        HardwareProfile.load(path, pair="c+d")


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="no such Sequoia hardware profile file"):
        HardwareProfile.load(tmp_path / "absent.json")


def test_measure_profile_tiny_model():
    target = tiny_model(0, vocab=64, hidden=32)
    draft = tiny_model(1, vocab=64, hidden=16)
    pair = make_pair(draft, target, 64)
    seen = []
    prof = measure_profile(pair, context_len=12, target_grid=(1, 4, 9), draft_grid=(1, 3), repeats=2, warmup=1,
                           generator=torch.Generator().manual_seed(3), progress=lambda *a: seen.append(a),
                           overhead_steps=2)
    assert prof.target_n == (1, 4, 9) and prof.draft_width == (1, 3)
    assert all(t > 0 for t in prof.target_ms + prof.draft_ms)
    assert prof.context_len == 12 and prof.repeats == 2
    assert prof.pair == "tiny-draft+tiny-target"
    assert prof.dtype == "torch.float32" and prof.device.startswith("cpu")
    import sequoia

    assert prof.version == sequoia.__version__
    # 3 + 2 grid points, then 2 untimed + 2 timed engine steps for the overheads
    assert [s[0] for s in seen] == [i / 9 for i in range(1, 10)]  # progress(fraction, label)
    assert seen[4][1] == "draft width=3" and seen[-1][1] == "overheads, step 4"
    assert prof.step_overhead_ms >= 0.0 and prof.level_overhead_ms >= 0.0
    fp = prof.fingerprint
    assert fp is not None and fp.device_kind == "cpu" and fp.threads == torch.get_num_threads()
    assert (fp.target_dtype, fp.draft_dtype, fp.draft_quant) == ("fp32", "fp32", "none")
    assert fp.pair == prof.pair and "overheads from 2 engine steps" in prof.note


def test_measure_profile_leaves_cache_length_stable(monkeypatch):
    """Every timed forward must see the same context: the cache is cropped back each time."""
    from sequoia.runtime.measuring import profiling as hardware

    from sequoia.runners.hf.runner import HFSession

    lengths = []
    real = HFSession.crop

    def spy(self, length):
        real(self, length)
        lengths.append((len(self), len(self.cache)))

    monkeypatch.setattr(HFSession, "crop", spy)
    pair = make_pair(tiny_model(1, vocab=64, hidden=16), tiny_model(0, vocab=64), 64)
    measure_profile(pair, context_len=7, target_grid=(2, 5), draft_grid=(1,), repeats=1, warmup=1,
                    progress=lambda *a: None, overhead_steps=0)
    assert lengths and set(lengths) == {(7, 7)}


def test_slow_points_stop_repeating(monkeypatch):
    from sequoia.runtime.measuring import profiling as hardware

    calls = []
    monkeypatch.setattr(hardware, "_forward_ms", lambda *a: calls.append(1) or 50.0)
    pair = make_pair(tiny_model(1, vocab=64, hidden=16), tiny_model(0, vocab=64), 64)
    prof = measure_profile(pair, context_len=4, target_grid=(1, 2), draft_grid=(1,), repeats=5, warmup=1,
                           point_s=0.12, progress=lambda *a: None, overhead_steps=0)
    # per point: 1 warm-up (50 ms) + timed runs while the point has spent < 120 ms -> 2 timed runs
    assert len(calls) == 3 * 3
    assert prof.target_ms == (50.0, 50.0)


def test_target_grid_stops_once_a_forward_costs_too_much(monkeypatch):
    """A compute-bound target (cost linear in n) is not profiled past stop_ratio x one token."""
    from sequoia.runtime.measuring import profiling as hardware

    monkeypatch.setattr(hardware, "_forward_ms", lambda session, ids, *a: 100.0 * len(ids))
    pair = make_pair(tiny_model(1, vocab=64, hidden=16), tiny_model(0, vocab=64), 64)
    seen = []
    prof = measure_profile(pair, context_len=4, target_grid=(1, 2, 4, 8, 16, 32), draft_grid=(1, 2), repeats=1,
                           warmup=0, stop_ratio=5.0, progress=lambda *a: seen.append(a), overhead_steps=0)
    assert prof.target_n == (1, 2, 4, 8) and prof.target_ms == (100.0, 200.0, 400.0, 800.0)
    assert len(seen) == 6 + 2 and "skipped" in seen[4][1]
    full = measure_profile(pair, context_len=4, target_grid=(1, 2, 4, 8, 16, 32), draft_grid=(1,), repeats=1,
                           warmup=0, stop_ratio=None, progress=lambda *a: None, overhead_steps=0)
    assert full.target_n == (1, 2, 4, 8, 16, 32)


def test_quick_profile_uses_the_coarse_grid_and_measures_overheads(monkeypatch):
    """The quick preset: coarse grids, 2 repeats; overheads = engine step time beyond the profiled forwards."""
    from sequoia.runtime.measuring import profiling as hardware

    monkeypatch.setattr(hardware, "_forward_ms", lambda model, forward, cache, ids, *a: 1e-3)  # forwards "free"
    pair = make_pair(tiny_model(1, vocab=64, hidden=16), tiny_model(0, vocab=64), 64)
    seen = []
    prof = measure_profile(pair, context_len=8, quick=True, progress=lambda *a: seen.append(a))
    assert prof.target_n == hardware.QUICK_TARGET_GRID and prof.draft_width == hardware.QUICK_DRAFT_GRID
    assert prof.repeats == 2 and "quick" in prof.note
    assert seen[-1][0] == 1.0 and len(seen) == 7 + 5 + 6   # grid points, then 2 untimed + 4 timed engine steps
    # With forwards priced at ~0, the real engine steps' whole time shows up as overhead.
    assert prof.step_overhead_ms > 0.0 and prof.level_overhead_ms > 0.0


def test_format_1_files_are_still_read(tmp_path):
    data = _profile().to_dict()
    for key in ("fingerprint", "step_overhead_ms", "level_overhead_ms", "note"):
        del data[key]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({**data, "format": "sequoia-hardware/1"}))
    prof = HardwareProfile.load(path)
    assert prof == _profile() and prof.fingerprint is None
    assert prof.step_overhead_ms == prof.level_overhead_ms == 0.0


# ---------------------------------------------------------------------------- costs by context length
def _with_contexts():
    from sequoia.core.profiles.profile import ContextCurves

    base = HardwareProfile.hand_made(lambda n: 10.0 + n, lambda w: 2.0 + w, target_n=(1, 4, 16), draft_width=(1, 4))
    base = dataclasses.replace(base, context_len=128, contexts=(
        ContextCurves(1024, (30.0, 33.0, 45.0), (4.0, 7.0)), ContextCurves(512, (20.0, 23.0, 35.0), (3.0, 6.0))))
    return base


def test_costs_are_priced_at_the_context_a_step_runs_at():
    prof = _with_contexts()
    assert [c.context_len for c in prof.contexts] == [512, 1024]            # sorted on entry
    assert prof.at_context(128) is prof
    assert prof.at_context(320).target(1) == pytest.approx(15.5)            # halfway from 128 to 512
    assert prof.at_context(1024).draft(4) == pytest.approx(7.0)
    assert prof.at_context(1536).target(1) == pytest.approx(40.0)           # extended along the last segment
    assert prof.at_context(64).target(1) == pytest.approx(11.0)             # held below the shortest
    assert prof.at_context(700).contexts == ()
    again = HardwareProfile.from_dict(prof.to_dict())
    assert again == prof
    with pytest.raises(ValueError, match="once"):
        dataclasses.replace(prof, contexts=prof.contexts + prof.contexts[:1])


def test_measure_profile_measures_more_contexts_on_the_same_grids():
    pair = make_pair(tiny_model(1, vocab=64, hidden=16), tiny_model(0, vocab=64), 64)
    prof = measure_profile(pair, context_len=4, target_grid=(1, 2), draft_grid=(1,), repeats=1, warmup=0,
                           progress=lambda *a: None, overhead_steps=0, contexts=(16, 4))
    assert [c.context_len for c in prof.contexts] == [16]
    assert len(prof.contexts[0].target_ms) == 2 and len(prof.contexts[0].draft_ms) == 1


def test_the_dynamic_gate_declines_trees_that_do_not_pay_at_a_long_context():
    """Cheap verification at 128 tokens, as dear as plain steps at 1,024: drafting stops on a long prompt."""
    from sequoia.core.profiles.profile import ContextCurves
    from sequoia.core.statistics.trace import StepRecord
    from sequoia.runtime.proposers.dynamic import DynamicTreeProposer

    grid = (1, 2, 4, 8, 16, 32, 64)
    cheap = HardwareProfile.hand_made(lambda n: 30.0 + 0.5 * n, lambda w: 3.0, target_n=grid, draft_width=(1, 2, 4))
    long = ContextCurves(1024, tuple(30.0 * n for n in grid), (3.0, 3.0, 3.0))
    prof = dataclasses.replace(cheap, context_len=128, contexts=(long,))
    dyn = DynamicTreeProposer(profile=prof, budget=16)
    dyn.start()
    assert dyn.can_pay and dyn.wants_draft()
    from sequoia.core.trees.tree import Tree

    dyn.observe(dataclasses.replace(StepRecord.fake(Tree.root_only(), (0,)), prompt_tokens=1000))
    assert not dyn.can_pay and not dyn.wants_draft()
    dyn.start()                                                             # a new generation starts short again
    assert dyn.can_pay


def test_llamacpp_costs_make_the_optimizer_and_the_gate_keep_the_target_alone():
    """llama.cpp's few-row products on 2 cores cost ~k one-token steps (Zen 4, Q4_K_M target, Q4_0 draft, ms as
    measured in shared/MODELS.md): no tree beats the target alone, so sequoia-auto picks none and the dynamic
    gate never drafts -- Sequoia on that runtime runs at the target alone's speed, not below it."""
    from sequoia.core.trees.optimizer import choose_tree
    from sequoia.runtime.proposers.dynamic import DynamicTreeProposer
    from sequoia.runtime.methods import DEFAULT_ACCEPTANCE

    target = dict(zip((1, 2, 4, 8, 16, 32, 64), (28.8, 55.7, 98.0, 218.0, 273.0, 461.0, 779.0)))
    draft = dict(zip((1, 2, 4, 8, 16, 32, 64), (12.5, 23.5, 33.4, 56.2, 87.4, 168.0, 305.0)))
    prof = HardwareProfile.hand_made(target.get, draft.get, target_n=tuple(target), draft_width=tuple(draft))
    assert choose_tree(DEFAULT_ACCEPTANCE, prof, max_budget=63, max_depth=12).budget == 0
    dyn = DynamicTreeProposer(profile=prof)
    dyn.start()
    assert not dyn.can_pay and not dyn.wants_draft()


def test_the_profile_reads_the_clock_it_is_given():
    """measure_profile(clock=): every forward and the overheads' engine steps read that clock (the CLI's --clock
    cpu passes the process's CPU time); a clock advancing 2 ms a reading prices every forward at 2 ms."""
    ticks = iter(range(0, 10**6, 2))
    pair = make_pair(tiny_model(1, vocab=64, hidden=16), tiny_model(0, vocab=64), 64)
    prof = measure_profile(pair, context_len=4, target_grid=(1, 2), draft_grid=(1,), repeats=2, warmup=0,
                           progress=lambda *a: None, overhead_steps=1, clock=lambda: next(ticks) / 1000.0)
    assert prof.target_ms + prof.draft_ms == pytest.approx((2.0, 2.0, 2.0))
    assert "CPU time" in prof.note


def test_profile_cli_refuses_a_cpu_clock_over_several_threads():
    from sequoia.tools.cli import main

    with pytest.raises(SystemExit, match="--clock cpu needs --threads 1"):
        main(["profile", "--clock", "cpu", "--threads", "2", "--show"])
