"""A CPU kind with no profile: each runtime's target alone timed at start picks the runtime (fake probes, no
models), the result kept in the cache, the banner's reason carrying the figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sequoia.core.profiles.acceptance import AcceptanceVector
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.runtime.measuring import runtime_choice, target_probe
from sequoia.runtime.measuring.runtime_choice import FoundProfile, Machine, TargetProbe, decide, needs_probes
from sequoia.runtime.measuring.target_probe import CACHE_NAME, probe_runtimes, summarize, time_steps

ROOT = Path(__file__).resolve().parents[3]
CODE = AcceptanceVector.load(ROOT / "assets" / "acceptance" / "embedded-code-greedy.json").values
AMX = Machine("cpu", ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"), llamacpp_installed=True)


def probe(backend: str, rate: float, cached: bool = False) -> TargetProbe:
    return TargetProbe(backend, rate, rate * 0.9, rate * 1.1, 6, 2.0, "fake", cached)


def hand(target_ms) -> FoundProfile:
    return FoundProfile(HardwareProfile.hand_made(target_ms, lambda w: 10.0 + w), "cached")


def test_the_fastest_target_alone_serves_where_no_profile_ranks_the_runtimes():
    # The Zen 4 of issue 61: a rule of thumb served torch (bf16 kernels), whose target ran 2.7x slower.
    probed = decide(AMX, {}, CODE, probes={"hf": probe("hf", 8.0), "llamacpp": probe("llamacpp", 23.0)})
    assert probed.backend == "llamacpp" and not probed.explicit
    assert probed.reason.startswith("its target alone decoded 23.0 tokens/s (20.7-25.3 over 6 steps) on one "
                                    "thread here against 8.0 (7.2-8.8) on Hugging Face (torch), 2.9x (timed at start")
    assert "llama.cpp (chosen: its target alone decoded 23.0" in probed.summary()
    assert probed.estimate("hf").probe.tokens_per_s == 8.0 and probed.estimate("mixed").probe is None
    # where torch's target is the faster one it serves, and a cached probe says so
    torch_wins = decide(AMX, {}, CODE, probes={"hf": probe("hf", 30.0, True), "llamacpp": probe("llamacpp", 20.0)})
    assert torch_wins.backend == "hf" and "timed at an earlier start" in torch_wins.reason
    # one probe alone (the other failed) does not decide: the rule backed by the CPU kinds measured does
    alone = decide(AMX, {}, CODE, probes={"llamacpp": probe("llamacpp", 23.0)})
    assert alone.backend == "llamacpp" and "every CPU kind measured" in alone.reason


def test_probes_are_wanted_only_where_the_profiles_leave_the_choice_open():
    assert needs_probes(AMX, {}) == ("hf", "llamacpp")
    one = {"llamacpp": hand(lambda n: 40.0 * n)}
    assert needs_probes(AMX, one) == ("hf", "llamacpp")
    both = {**one, "hf": hand(lambda n: 100.0 + n)}
    assert needs_probes(AMX, both) == ()
    assert needs_probes(Machine("cpu", AMX.cpu_features, llamacpp_installed=False), {}) == ()
    assert needs_probes(Machine("cuda", (), llamacpp_installed=True), {}) == ()
    assert needs_probes(Machine("cpu", (), True, fixed_by_models="hf"), {}) == ()
    # profiled both: the profiles decide, the probes are ignored even when given
    ranked = decide(AMX, both, CODE, probes={"hf": probe("hf", 99.0), "llamacpp": probe("llamacpp", 1.0)})
    assert "timed" not in ranked.reason and all(r.probe is None for r in ranked.runtimes)


def test_probe_runtimes_times_once_then_reads_the_cache(tmp_path):
    calls = []

    def fake(backend, rate):
        def run(cache_dir):
            calls.append(backend)
            return probe(backend, rate)
        return run

    def broken(cache_dir):
        raise RuntimeError("no llama")

    fakes = {"hf": fake("hf", 8.0), "llamacpp": fake("llamacpp", 24.0)}
    lines = []
    first = probe_runtimes(("hf", "llamacpp", "mixed"), tmp_path, "k1", fakes, log=lines.append, ceilings={})
    assert calls == ["hf", "llamacpp"] and not first["hf"].cached and len(lines) == 2
    again = probe_runtimes(("hf", "llamacpp"), tmp_path, "k1", fakes)
    assert calls == ["hf", "llamacpp"] and again["llamacpp"].cached and again["llamacpp"].tokens_per_s == 24.0
    assert json.loads((tmp_path / CACHE_NAME).read_text())["key"] == "k1"
    probe_runtimes(("hf",), tmp_path, "k2 (another torch)", fakes, ceilings={})   # another key: timed again
    assert calls == ["hf", "llamacpp", "hf"]
    failed = probe_runtimes(("hf", "llamacpp"), tmp_path / "x", "k3", {**fakes, "llamacpp": broken},
                            log=lines.append, ceilings={})
    assert list(failed) == ["hf"] and "no llama" in lines[-1]


def test_choose_runtime_probes_only_when_asked_and_needed(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime_choice, "machine_here", lambda *a, **k: AMX)
    fakes = {"hf": lambda d: probe("hf", 8.0), "llamacpp": lambda d: probe("llamacpp", 24.0)}
    monkeypatch.setattr(target_probe, "PROBES", fakes)
    monkeypatch.setattr(runtime_choice, "probe_runtimes",
                        lambda b, c, k, log=None, meanwhile=None, time_now=True:
                        probe_runtimes(b, c, k, fakes, log, ceilings={}, time_now=time_now))
    empty = tmp_path / "assets"
    (empty / "profiles").mkdir(parents=True)
    (empty / "acceptance").mkdir()
    for name in ("embedded-code-greedy.json",):
        (empty / "acceptance" / name).write_text((ROOT / "assets" / "acceptance" / name).read_text())
    # the app's start reads the cache only: nothing timed, the rule chooses (the background times them later)
    first = runtime_choice.choose_runtime(cache_dir=tmp_path / "cache", assets_dir=empty, probe=True)
    assert "every CPU kind measured" in first.reason and not (tmp_path / "cache" / CACHE_NAME).exists()
    chosen = runtime_choice.choose_runtime(cache_dir=tmp_path / "cache", assets_dir=empty, probe=True, time_now=True)
    assert chosen.backend == "llamacpp" and "24.0 tokens/s" in chosen.reason
    assert (tmp_path / "cache" / CACHE_NAME).is_file()
    unprobed = runtime_choice.choose_runtime(cache_dir=tmp_path / "other", assets_dir=empty)
    assert "every CPU kind measured" in unprobed.reason and not (tmp_path / "other" / CACHE_NAME).exists()


def test_timing_helpers():
    ticks = iter(range(100))
    times = time_steps(lambda tok: next(ticks), 0, warmup=2, steps=3)
    assert len(times) == 3
    p = summarize("hf", [0.1, 0.125, 0.2], 1.5, "fake")
    assert (p.tokens_per_s, p.low, p.high) == (8.0, 5.0, 10.0) and p.text == "8.0 tokens/s (5.0-10.0 over 3 steps)"


def test_the_hardware_tab_ranks_by_the_probes_the_server_started_with(tmp_path):
    from types import SimpleNamespace

    from components.app_state.runtimes_here import _decide_here

    (tmp_path / "profiles").mkdir()
    started = decide(AMX, {}, CODE, probes={"hf": probe("hf", 8.0), "llamacpp": probe("llamacpp", 24.0)})
    room = SimpleNamespace(runtime=started, profile=None, cache_dir=tmp_path / "cache", assets_dir=tmp_path,
                           later_probes={})
    found, decision = _decide_here(room, None, None, tuple(CODE), 64, 8)
    assert found == {} and decision.backend == "llamacpp" and decision.reason == started.reason
    assert decision.estimate("hf").probe.tokens_per_s == 8.0


def test_a_ceiling_under_a_measured_rate_skips_the_slow_probe(tmp_path):
    calls = []
    fakes = {"llamacpp": lambda d: calls.append("llamacpp") or probe("llamacpp", 6.6),
             "hf": lambda d: calls.append("hf") or probe("hf", 2.7)}
    low = {"hf": lambda d: TargetProbe("hf", 3.9, 3.9, 3.9, 0, 0.4, "at most: 3.1 GB of bf16 weights a token at the "
                                                                       "12 GB/s one thread copies here")}
    got = probe_runtimes(("hf", "llamacpp"), tmp_path / "a", "k", fakes, ceilings=low)
    assert calls == ["llamacpp"] and got["hf"].bound and got["hf"].text.startswith("at most 3.9 tokens/s (3.1 GB")
    chosen = decide(AMX, {}, CODE, probes=got)
    assert chosen.backend == "llamacpp" and "against at most 3.9 tokens/s (3.1 GB of bf16 weights" in chosen.reason
    assert "copies here) on Hugging Face (torch) (timed at start" in chosen.reason   # no ratio to a bound
    high = {"hf": lambda d: TargetProbe("hf", 9.0, 9.0, 9.0, 0, 0.4, "at most: a bound above")}
    lines = []
    again = probe_runtimes(("hf", "llamacpp"), tmp_path / "b", "k", fakes, ceilings=high, log=lines.append)
    # could win: not timed at start (6 s of CPU there), but later, in the background; the timed rate serves
    assert calls == ["llamacpp", "llamacpp"] and again["hf"].bound and "in the background" in lines[-1]
    waits = decide(AMX, {}, CODE, probes=again)
    assert waits.backend == "llamacpp" and "could be faster by that bound and is timed in the background" in \
        waits.reason


def test_weight_bytes_of_the_embedded_target_shape():
    from types import SimpleNamespace

    config = SimpleNamespace(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                             num_key_value_heads=2, vocab_size=151936)
    assert target_probe.weight_bytes(config) == pytest.approx(3.09e9, rel=0.01)   # 1.54 B weights in bf16


def test_the_placeholder_model_writes_every_weight_and_decodes():
    from transformers import DynamicCache, Qwen2Config

    config = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = target_probe.placeholder_model(config)
    assert all(bool((p == 0.02).all()) for p in model.parameters())   # every page written, no zero page read
    assert next(model.parameters()).dtype == torch.bfloat16
    assert all(bool(torch.isfinite(b).all()) for b in model.buffers())   # rotary frequencies recomputed
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3]]), past_key_values=cache, use_cache=True)
        out = model(input_ids=torch.tensor([[4]]), past_key_values=cache, use_cache=True)
    assert out.logits.shape == (1, 1, 96) and cache.get_seq_length() == 4
