"""Compare in interleaved rounds (issue 42), on the tiny random-weight pair: the choice lists, the rounds' order,
each row's band and verdict, the progress line, the /compare API's bands, and the measured target rate."""

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest

import app
from components.app_state import target_rate
from components.app_state.decode_inputs import DecodeInputs
from components.compare import compare_methods, compare_run, compare_tab, compare_view
from sequoia.core.config import GenerationConfig
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.statistics import rounds
from sequoia.core.statistics.trace import StepRecord
from sequoia.core.trees.tree import Tree
from sequoia.runtime import models
from sequoia.runtime.measuring import runtime_choice
from sequoia.runtime.measuring.runtime_choice import RuntimeDecision

PROFILES = Path(__file__).resolve().parents[2] / "assets" / "profiles"


def _checkbox_choices(demo) -> list[str]:
    """The Compare checkboxes' choices as the built page holds them."""
    box = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sq-compare-methods")
    return [c[1] if isinstance(c, tuple) else c for c in box.choices]


def _llamacpp_choice(**_kwargs) -> RuntimeDecision:
    estimates = (runtime_choice.RuntimeEstimate("hf", True), runtime_choice.RuntimeEstimate("llamacpp", True))
    return RuntimeDecision("llamacpp", "llama.cpp predicts 25.6 tokens/s here (target alone)", estimates)


def test_the_full_list_is_among_the_choices_before_and_after_the_pair_loads(monkeypatch, tmp_path, tiny_app_pair,
                                                                           lanes):
    """Issue 42: the page is built before the pair loads (no profile yet); a profile found at load once put
    "Sequoia (auto)" in the full list only, and Full comparison was refused with HTTP 400."""
    monkeypatch.setattr(runtime_choice, "choose_runtime", _llamacpp_choice)
    monkeypatch.setattr(models, "_load_llamacpp_pair",
                        lambda *a, **k: replace(tiny_app_pair, backend="llamacpp"))
    demo = app.build_from_env({"SEQUOIA_CACHE": str(tmp_path)}, lanes=lanes)
    ctx = demo.sequoia_context
    choices = _checkbox_choices(demo)
    assert not ctx.loaded and ctx.profile is None
    assert set(compare_tab.ticked(ctx, full=True)) <= set(choices)
    assert set(compare_tab.ticked(ctx)) <= set(choices)
    ctx.models.start_loading()
    deadline = time.monotonic() + 60
    while not (ctx.status.ready or ctx.status.error) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ctx.status.ready
    for prof in (None, HardwareProfile.load(PROFILES / "embedded-cpu-avx2-llamacpp-q4_k_m.json")):
        ctx.profile = prof   # whatever the profile search finds after loading
        assert set(compare_tab.ticked(ctx, full=True)) <= set(choices), prof
        assert "Sequoia (auto)" in compare_tab.ticked(ctx, full=True)
        assert set(compare_methods.offered(ctx)) <= set(choices)


def test_rounds_interleave_the_methods_after_a_warm_up_round(ctx, monkeypatch):
    order, real = [], compare_run.iter_run

    def spy(engine, pair, method, ids, gen, proposer=None):
        order.append((method, gen.max_new_tokens))
        return (yield from real(engine, pair, method, ids, gen, proposer))

    def warm(engine, pair, ids, runs, tokens):
        order.extend(("warm-up", tokens) for _ in runs)
        return real_warmup(engine, pair, ids, runs, tokens)

    real_warmup = compare_run.warmup
    monkeypatch.setattr(compare_run, "iter_run", spy)
    monkeypatch.setattr(compare_run, "warmup", warm)
    ctx.warmed.clear()   # nothing warmed in this process yet
    lines = []
    rows, notes = compare_tab.run_comparison(ctx, "x = 1", 8, 3, 0.0, 1.0, 6, 0, include_hf=False,
                                             methods=["Chain", "Sequoia (dynamic)"], rounds=3,
                                             progress=lambda f, line: lines.append(line))
    # the warm-up round first, then A B C A B C A B C
    assert order == [("warm-up", compare_run.WARMUP_TOKENS)] * 3 + [
        (m, 6) for m in ("target only", "chain", "sequoia-dynamic")] * 3
    assert [len(r.rates) for r in rows] == [3, 3, 3] and all(r.identical for r in rows)
    assert any(line.startswith("*Round 2 of 3: running **Chain**") for line in lines)
    assert lines[0].startswith("*Warm-up round")

    # A second comparison: first-call costs are paid, so only the method new to this pair warms up (and a
    # fixed tree of another shape counts as new: a runtime may capture per size).
    order.clear(), lines.clear()
    compare_tab.run_comparison(ctx, "x = 2", 8, 3, 0.0, 1.0, 4, 0, include_hf=False,
                               methods=["Chain", "SpecInfer"], rounds=1, progress=lambda f, line: lines.append(line))
    assert order == [("warm-up", compare_run.WARMUP_TOKENS)] + [(m, 4) for m in ("target only", "chain", "specinfer")]
    assert sum(line.startswith("*Warm-up round") for line in lines) == 1
    order.clear()
    compare_tab.run_comparison(ctx, "x = 2", 8, 3, 0.0, 1.0, 4, 0, include_hf=False,
                               methods=["Sequoia (budget & depth)"], rounds=1)
    compare_tab.run_comparison(ctx, "x = 2", 6, 3, 0.0, 1.0, 4, 0, include_hf=False,
                               methods=["Sequoia (budget & depth)"], rounds=1)
    assert [o for o in order if o[0] == "warm-up"] == [("warm-up", compare_run.WARMUP_TOKENS)] * 2


def test_a_row_that_did_the_target_alones_work_is_named_so(ctx):
    ctx.profile = None   # Sequoia (auto) under the conservative stand-in: the root-only tree, one token a call
    rows, notes = compare_tab.run_comparison(ctx, "x = 1", 8, 3, 0.0, 1.0, 6, 0, include_hf=False,
                                             methods=["Sequoia (auto)", "Chain"], rounds=2)
    by = {r.method: r for r in rows}
    assert by["Sequoia (auto)"].reference_work and not by["Chain"].reference_work
    verdicts = dict(zip(by, compare_view.verdicts(rows)))
    assert verdicts["Sequoia (auto)"] == rounds.REFERENCE_WORK and verdicts["Target alone"] == rounds.REFERENCE
    table = {r[0]: r for r in compare_view.table(rows)}
    assert table["Sequoia (auto)"][7].endswith(") the target alone's work")
    md = compare_tab._notes_markdown(rows, notes, 0.0)
    assert "interleaved rounds" in md and "target alone's work" in md


def test_rows_stream_as_each_run_of_each_round_finishes(ctx):
    outs = list(compare_tab.on_compare(ctx, DecodeInputs("x = 1", "", 8, 3, max_new_tokens=4), ["Chain"], rounds=2))
    tables = [o[1] for o in outs if isinstance(o[1], list)]
    assert [len(t) for t in tables] == [0, 1, 2, 2, 2]    # cleared, round 1 row by row, round 2 updates them
    assert all("(" in t[0][4] for t in tables[3:])       # two rounds: tokens/s with its range
    assert "Identical at T=0" in outs[-1][2]
    # Beside the table's end-to-end rates, the target alone's decode rate in the same rounds, the definition the
    # Live tab and Measure use, with the gap between the two named (issue 58)
    assert "The target alone's decode rate in these rounds, after the prompt's forward" in outs[-1][2]
    assert "its end-to-end" in outs[-1][2] and "the difference is the prompt's forward" in outs[-1][2]


def test_the_target_alones_decode_rate_beside_its_end_to_end_rate():
    note = compare_run.decode_note(target_rate.TargetRate(20.1, True, "measured by Compare", 19.5, 20.6), 16.8)
    assert "**20.1 tokens/s (19.5–20.6)**, 1.20× its end-to-end 16.8 tokens/s in the table" in note
    assert "its end-to-end" not in compare_run.decode_note(target_rate.TargetRate(20.1, True, "x"), 0.0)


def test_the_compare_api_returns_bands_from_rounds(ctx):
    rows = asyncio.run(compare_tab.compare_api_fn(ctx)("x", 4, 2, 0.0, 1.0, 3, 0, False))
    assert all(r["rounds"] == compare_tab.FULL_ROUNDS for r in rows)
    assert all(r["speedup min"] <= r["speedup"] <= r["speedup max"] for r in rows)
    assert rows[0]["verdict"] == "reference" and all(isinstance(r["verdict"], str) for r in rows)


def test_bad_rounds_are_refused(ctx):
    with pytest.raises(ValueError, match="rounds"):
        next(compare_run.iter_comparison(ctx, DecodeInputs("x", "", 4, 2, max_new_tokens=2), rounds=0))


def test_compare_measures_the_target_rate_the_hardware_tab_shows(ctx):
    ctx.target_rates._items.clear()
    compare_tab.run_comparison(ctx, "y = 2", 8, 3, 0.0, 1.0, 6, 0, include_hf=False, methods=[], rounds=3)
    rate = ctx.target_rates.latest()
    assert rate.measured and rate.lo <= rate.tokens_per_s <= rate.hi and "3 rounds" in rate.source
    md = target_rate.reconcile_markdown(target_rate.TargetRate(25.6, False, "predicted (profile: shipped)"), rate)
    assert "predicted **25.6 tokens/s**" in md and f"measured **{rate.band_text()}**" in md


def test_the_gap_to_the_prediction_is_explained_by_the_side_it_falls():
    """Issue 58: a measurement 8x faster than a profile measured on a busy machine read "the step's own overhead
    and a busy machine show there", reasons that only ever make a measurement slower."""
    predicted = target_rate.TargetRate(10.0, False, "predicted (profile: cached)")
    words = {r: target_rate.reconcile_markdown(predicted, target_rate.TargetRate(r, True, "measured by Compare"))
             for r in (4.0, 10.5, 81.2)}
    assert "0.40× the prediction: the step's own overhead and a busy machine" in words[4.0]
    assert "1.05× the prediction: within 10%" in words[10.5]
    assert "8.12× the prediction, faster than it: the profile was measured under other conditions" in words[81.2]
    assert all("overhead" not in words[r].split("no step overhead")[1] for r in (10.5, 81.2))


def test_the_target_rate_probe_measures_in_rounds():
    calls = []

    def run(config):
        calls.append(config.max_new_tokens)
        return [_fake_step(0.5, prompt_tokens=5)] + [_fake_step(0.1 * len(calls))] * 4

    rate = target_rate.probe(run, GenerationConfig(max_new_tokens=64))
    assert calls == [target_rate.PROBE_TOKENS] * target_rate.PROBE_ROUNDS
    assert rate.tokens_per_s == pytest.approx(5.0) and rate.lo == pytest.approx(1 / 0.3) and rate.hi == 10.0
    assert "3 runs" in rate.source and rate.band_text() == "5.0 tokens/s (3.3–10.0)"


def _fake_step(seconds: float, prompt_tokens: int = 0) -> StepRecord:
    """A step of one token taking ``seconds`` (``prompt_tokens``: the prompt's forward)."""
    return replace(StepRecord.fake(Tree((-1,)), (0,)), draft_s=0.0, verify_s=seconds, other_s=0.0,
                   prompt_tokens=prompt_tokens)


def test_compare_opens_on_the_live_tabs_tree():
    from components.live import live_tab

    assert (compare_tab.DEFAULT_BUDGET, compare_tab.DEFAULT_DEPTH) == (live_tab.GUIDED["budget"], live_tab.GUIDED["depth"])


def test_per_pair_values_go_with_their_pair():
    import gc

    from components.app_state.context import PerPair

    class Pair:   # unhashable, as the ModelPair dataclass
        __hash__ = None

    memo, a, b = PerPair(), Pair(), Pair()
    memo.setdefault(a, set()).add("Chain")
    assert memo.get(a) == {"Chain"} and memo.get(b) is None
    del a
    gc.collect()
    memo.setdefault(b, set())
    assert len(memo._by_id) == 1 and memo.get(b) == set()
