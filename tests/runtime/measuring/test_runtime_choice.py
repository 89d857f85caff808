"""The runtime chosen by measurement: the rule (no models), the app's and the CLI's wiring, the Hardware views."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import app
from components.compare import compare_tab
from components.hardware import hardware_tab, runners_view
from components.widgets import hardware_view, runtime_view
from sequoia.core.profiles.acceptance import AcceptanceVector
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.runners.embedded import EMBEDDED, converted_dir, default_cache_dir, gguf_path, is_converted, is_gguf_kept
from sequoia.runners.hf.convert import tokenizer_from_gguf
from sequoia.runners.hf.loading import load_tokenizer
from sequoia.runtime import models
from sequoia.runtime.measuring import runtime_choice
from sequoia.runtime.measuring.runtime_choice import (FoundProfile, Machine, RuntimeDecision, decide, runtime_fixed_by,
                                                      same_cpu_kind)
from sequoia.tools import common

ROOT = Path(__file__).resolve().parents[3]
PROFILES = ROOT / "assets" / "profiles"
CODE = AcceptanceVector.load(ROOT / "assets" / "acceptance" / "embedded-code-greedy.json").values
AVX2 = Machine("cpu", ("avx2",), llamacpp_installed=True)
ZEN4 = Machine("cpu", ("avx2", "avx512f", "avx512_bf16"), llamacpp_installed=True)


def shipped(name: str) -> FoundProfile:
    return FoundProfile(HardwareProfile.load(PROFILES / f"embedded-cpu-{name}.json"), "shipped")


def hand(target_ms, draft_ms=lambda w: 10.0 + w) -> FoundProfile:
    return FoundProfile(HardwareProfile.hand_made(target_ms, draft_ms), "cached")


# ------------------------------------------------------------------ the rule
def test_avx2_chooses_llamacpp_by_its_measured_costs_and_by_rule_without_them():
    measured = decide(AVX2, {"hf": shipped("avx2-bf16-int8"), "llamacpp": shipped("avx2-llamacpp-q4_k_m")}, CODE)
    assert measured.backend == "llamacpp" and not measured.explicit
    hf, llama, mixed = (measured.estimate(b) for b in ("hf", "llamacpp", "mixed"))
    assert llama.tokens_per_s > 2.5 * hf.tokens_per_s        # 13.0 against 4.3 predicted (measured 9.5 vs 2.3)
    assert llama.method == "target alone" and hf.method == "target alone"   # no tree pays on either
    assert mixed.installed and not mixed.measured and mixed.rate_text == "not measured here"
    assert "mixed" in measured.reason and "not measured here" in measured.reason
    by_rule = decide(AVX2, {}, CODE)
    assert by_rule.backend == "llamacpp" and "no bf16 matrix kernels" in by_rule.reason
    assert all(not r.measured for r in by_rule.runtimes) and by_rule.fastest() is None
    # llama.cpp unmeasured still wins over a measured torch target where torch has no bf16 kernels
    assert decide(AVX2, {"hf": shipped("avx2-bf16-int8")}, CODE).backend == "llamacpp"


def test_avx512_bf16_with_every_profile_takes_whichever_predicts_faster():
    fast_trees = hand(lambda n: 100.0 + 0.5 * n, lambda w: 2.0)        # trees pay: ~2-3x over 10 tokens/s
    llama = hand(lambda n: 40.0 * n)                                  # 25 tokens/s, no tree pays
    assert decide(ZEN4, {"hf": fast_trees, "mixed": fast_trees, "llamacpp": llama}, CODE).backend == "hf"
    slow_trees = hand(lambda n: 100.0 + 20.0 * n, lambda w: 30.0)
    won = decide(ZEN4, {"hf": slow_trees, "mixed": slow_trees, "llamacpp": llama}, CODE)
    assert won.backend == "llamacpp" and won.reason.startswith("llama.cpp predicts 25.0 tokens/s")
    # The profiles shipped for this Zen 4 kind: llama.cpp alone 25.6, mixed's tree 22.4, hf's tree 17.9.
    real = decide(ZEN4, {"hf": shipped("avx512bf16-bf16-int4"), "llamacpp": shipped("avx512bf16-llamacpp-q4_k_m"),
                         "mixed": shipped("avx512bf16-mixed-bf16-q4_0")}, CODE)
    assert real.backend == "llamacpp" and real.fastest().backend == "llamacpp"
    assert real.estimate("mixed").method.startswith("Sequoia n=") and real.estimate("hf").tokens_per_s < 22
    # Partly measured with bf16 kernels: the fastest of those measured, the rest named as not measured.
    part = decide(ZEN4, {"hf": fast_trees}, CODE)
    assert part.backend == "hf" and "not measured here" in part.reason
    # none measured, no probe: llama.cpp, faster alone on every CPU kind measured (issue 61: torch took 99 s)
    unmeasured = decide(ZEN4, {}, CODE)
    assert unmeasured.backend == "llamacpp" and "every CPU kind measured" in unmeasured.reason


def test_a_gpu_runs_the_graph_runner_and_missing_llamacpp_leaves_hf():
    gpu = decide(Machine("cuda", (), llamacpp_installed=True), {"llamacpp": hand(lambda n: 1.0)}, CODE)
    assert gpu.backend == "hf" and "graph runner" in gpu.reason
    bare = decide(replace(AVX2, llamacpp_installed=False), {"llamacpp": shipped("avx2-llamacpp-q4_k_m")}, CODE)
    assert bare.backend == "hf" and "llama-cpp-python is not installed" in bare.reason
    assert [r.installed for r in bare.runtimes] == [True, False, False]


def test_the_model_names_can_leave_one_runtime():
    assert runtime_fixed_by("embedded", "embedded") == ""
    assert runtime_fixed_by("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct") == "hf"
    assert runtime_fixed_by("/m/d.gguf", "/m/t.GGUF") == "llamacpp"
    assert runtime_fixed_by("/m/d.gguf", "Qwen/x") == "mixed"
    hub = decide(replace(AVX2, fixed_by_models="hf"), {"llamacpp": shipped("avx2-llamacpp-q4_k_m")}, CODE)
    assert hub.backend == "hf" and "Hugging Face ids" in hub.reason


def test_an_explicit_backend_wins_and_a_bad_one_is_named():
    chosen = decide(AVX2, {"llamacpp": shipped("avx2-llamacpp-q4_k_m")}, CODE)
    named = chosen.overridden("hf", "SEQUOIA_BACKEND")
    assert named.backend == "hf" and named.explicit and "SEQUOIA_BACKEND=hf" in named.reason
    assert named.runtimes == chosen.runtimes and "named:" in named.summary()
    with pytest.raises(ValueError, match="SEQUOIA_BACKEND='gpu' is not a runtime"):
        chosen.overridden("gpu", "SEQUOIA_BACKEND")
    with pytest.raises(ValueError, match="backend must be one of"):
        RuntimeDecision("gpu", "", ())


def test_a_profile_of_the_same_cpu_kind_with_other_threads_ranks_the_runtimes():
    prof = HardwareProfile.load(PROFILES / "embedded-cpu-avx512bf16-llamacpp-q4_k_m.json")
    found = same_cpu_kind(replace(prof.fingerprint, threads=8))
    assert found is not None and found.profile == prof and "measured with 2 threads" in found.source
    assert same_cpu_kind(replace(prof.fingerprint, cpu_features=("avx2", "avx512f"), threads=8)) is None


# ------------------------------------------------------------------ the app and the CLI
def _llamacpp_choice(**_kwargs) -> RuntimeDecision:
    estimates = (runtime_choice.RuntimeEstimate("hf", True), runtime_choice.RuntimeEstimate("llamacpp", True))
    return RuntimeDecision("llamacpp", "llama.cpp predicts 25.6 tokens/s here (target alone)", estimates)


def test_an_explicit_backend_wins_in_the_app_and_the_cli(monkeypatch):
    monkeypatch.setattr(runtime_choice, "choose_runtime", _llamacpp_choice)
    assert app.backend_from_env({}) == "llamacpp" and app.backend_from_env({"SEQUOIA_BACKEND": "HF "}) == "hf"
    assert app.runtime_from_env({"SEQUOIA_BACKEND": "mixed"}).explicit
    with pytest.raises(ValueError, match="SEQUOIA_BACKEND='cuda'"):
        app.runtime_from_env({"SEQUOIA_BACKEND": "cuda"})
    monkeypatch.setattr(common, "choose_runtime", _llamacpp_choice)
    monkeypatch.delenv("SEQUOIA_BACKEND", raising=False)
    args = argparse.Namespace(backend=None, device=None, draft="embedded", target="embedded", cache_dir=None)
    assert common.backend_of(args) == "llamacpp" and args.backend == "llamacpp"   # decided once
    assert common.backend_of(argparse.Namespace(backend="mixed")) == "mixed"
    monkeypatch.setenv("SEQUOIA_BACKEND", "hf")
    assert common.backend_of(argparse.Namespace(backend=None)) == "hf"


def test_the_app_on_the_chosen_llamacpp_converts_nothing_before_the_first_decode(monkeypatch, tmp_path, capsys,
                                                                               tiny_app_pair, lanes):
    """No SEQUOIA_BACKEND: the app serves on the choice; on llama.cpp nothing converts the GGUFs at start (not the
    loader, the memory plan, the exact or reference loaders, nor the profile search) and the page says why."""
    monkeypatch.setattr(runtime_choice, "choose_runtime", _llamacpp_choice)
    loads = []

    def no_conversion(*args, **kwargs):
        raise AssertionError("the GGUF files were converted at start")

    def load_llamacpp(draft, target, cache_dir, progress, threads=None):
        loads.append((draft, target))
        return replace(tiny_app_pair, backend="llamacpp")

    monkeypatch.setattr(models, "ensure_converted", no_conversion)
    monkeypatch.setattr(models, "_load_llamacpp_pair", load_llamacpp)
    demo = app.build_from_env({"SEQUOIA_CACHE": str(tmp_path)}, lanes=lanes)
    ctx = demo.sequoia_context
    assert ctx.hardware.runtime.backend == "llamacpp" and not ctx.offers_reference  # target only is that row
    hf_rows = {"HF assisted", "HF prompt lookup", "llama.cpp target alone"}
    assert not hf_rows & set(compare_tab.offered(ctx))   # Compare offers no row this runtime cannot run
    out = capsys.readouterr().out
    assert "runtime: llama.cpp (chosen: llama.cpp predicts" in out and "converts" not in out
    ctx.models.start_loading()
    deadline = time.monotonic() + 60
    while not (ctx.status.ready or ctx.status.error) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ctx.status.ready and loads == [("embedded", "embedded")]
    assert not hf_rows & set(compare_tab.offered(ctx))
    banner = app._banner(ctx)
    assert "Runtime: <b>llama.cpp</b>, chosen: llama.cpp predicts" in banner and "converts" not in banner
    # Exact mode's memory is planned from an estimate, not from converted files (those come on its first use).
    plan = app.memory_from_env({"SEQUOIA_CACHE": str(tmp_path), "SEQUOIA_BACKEND": "llamacpp"})
    assert plan.exact_bytes(SimpleNamespace(target=SimpleNamespace())) > app.CONVERSION_BYTES
    assert not any("BLOCKED" in h for h in plan.hints) and not list(tmp_path.glob("*/model.safetensors"))


# ------------------------------------------------------------------ the Hardware views
def test_the_runtimes_table_lists_every_runtime_and_its_fastest_line_is_the_choice():
    decision = decide(AVX2, {"hf": shipped("avx2-bf16-int8"), "llamacpp": shipped("avx2-llamacpp-q4_k_m")}, CODE)
    md = runtime_view.runtimes_markdown(decision, running="llamacpp", started=decision)
    assert "| ★ llama.cpp<br><small>target Q4_K_M, draft Q4_K_M; costs: shipped</small> | yes | 13.0 tok/s |" in md
    assert "| Hugging Face (torch)<br><small>target bf16, draft int8; costs: shipped</small> | yes |" in md
    assert "| mixed (torch target, llama.cpp draft) | yes | not measured here | | not measured here |" in md
    assert "**Fastest here: target alone on llama.cpp, 13.0 tokens/s**" in md and "This server runs llama.cpp." in md
    assert "mixed (torch target, llama.cpp draft) not measured here" in md
    bare = decide(replace(AVX2, llamacpp_installed=False), {}, CODE)
    md = runtime_view.runtimes_markdown(bare, running="hf")
    assert md.count("no (needs llama-cpp-python)") == 2 and "by rule: llama-cpp-python is not installed" in md
    named = decision.overridden("hf", "SEQUOIA_BACKEND")
    md = runtime_view.runtimes_markdown(named, running="hf", started=named)
    assert "| ★ Hugging Face (torch)<br>" in md and "Fastest here: target alone on llama.cpp" in md
    assert "This server runs Hugging Face (torch): SEQUOIA_BACKEND=hf names it" in md
    assert runtime_view.banner_html(None) == ""
    assert "Runtime: <b>Hugging Face (torch)</b>, named: SEQUOIA_BACKEND=hf" in runtime_view.banner_html(named)
    # a fresh machine: chosen by rule with the runtimes unmeasured; once the server measured its profile the
    # banner no longer says "not measured here" (issue 51)
    fresh = decide(AVX2, {}, CODE)
    assert "not measured here" in runtime_view.banner_html(fresh)
    since = runtime_view.banner_html(fresh, measured_since=True)
    assert "not measured here" not in since and "chosen at start" in since and "since then this server measured" in since


def test_the_other_runtimes_are_offered_where_their_memory_fits():
    decision = decide(AVX2, {"hf": shipped("avx2-bf16-int8"), "llamacpp": shipped("avx2-llamacpp-q4_k_m")}, CODE)
    md = runtime_view.runtimes_markdown(decision, running="llamacpp", started=decision, room_gb=23.5)
    assert "- Serve on Hugging Face (torch): restart with `SEQUOIA_BACKEND=hf python app.py` (about 8.5 GB" in md
    assert "- Serve on mixed (torch target, llama.cpp draft): restart with `SEQUOIA_BACKEND=mixed python app.py` " \
           "(its memory not measured here)" in md
    assert "SEQUOIA_BACKEND=llamacpp" not in md                      # the one running is not offered again
    small = runtime_view.switch_lines(decision, "llamacpp", room_gb=6.0)
    assert "- Hugging Face (torch): does not fit here (about 8.5 GB after start; this server has 6.0 GB)." in small
    assert not any("SEQUOIA_BACKEND=hf" in line for line in small)
    bare = decide(replace(AVX2, llamacpp_installed=False), {}, CODE)
    assert runtime_view.switch_lines(bare, "hf", room_gb=23.5) == []   # nothing else installed: no section


def test_the_chosen_bar_is_the_target_alone_where_no_tree_pays_and_measured_is_announced():
    ctx = SimpleNamespace(profile=HardwareProfile.hand_made(lambda n: 30.0 * n, lambda w: 10.0))  # no tree pays
    choice, rows = hardware_tab.predictions(ctx, CODE, 16, 4, {})
    assert choice.budget == 0 and [r.label for r in rows if r.chosen] == ["target alone (no tree pays)"]
    fig = hardware_view.prediction_figure(rows)
    assert fig.layout.showlegend and [t.name for t in fig.data] == ["predicted"]
    assert fig.layout.annotations[0].text == hardware_view.NOT_MEASURED_YET
    ctx = SimpleNamespace(profile=HardwareProfile.hand_made(lambda n: 100.0 + 0.5 * n, lambda w: 2.0))
    _, rows = hardware_tab.predictions(ctx, CODE, 16, 4, {"target only": (100.0, 104.0, 98.0),
                                                          "sequoia (chosen)": (50.0, 60.0, 45.0)})
    chosen = [r for r in rows if r.chosen][0]
    assert chosen.label.startswith("sequoia n=") and (chosen.measured_ms, chosen.measured_lo, chosen.measured_hi,
                                                      chosen.rounds) == (50.0, 45.0, 60.0, 3)
    fig = hardware_view.prediction_figure(rows)
    assert [t.name for t in fig.data] == ["predicted", "measured (median, range over rounds)"] and not fig.layout.annotations
    assert list(fig.data[1].error_y.array[:2]) == [4.0, 10.0] and list(fig.data[1].error_y.arrayminus[:2]) == [2.0, 5.0]
    assert fig.data[1].customdata[1] == "median of 3 rounds (45.0–60.0)" and fig.data[1].customdata[2] == ""
    md = hardware_view.measured_markdown(rows, 48)
    assert md.startswith("**Measured here** (median of 3 interleaved rounds of 48 tokens") and md.count("ms/token") == 2
    assert "target only **100.0 ms/token** (98.0–104.0), " in md and hardware_view.measured_markdown(rows[2:], 48) == ""
    assert "after the prompt's forward" in md           # issue 51: which rate, named
    # past 10% off the prediction the line says by how much and the likely why (the cores shared, or the profile)
    off = {r.label: (r.measured_ms / r.predicted_ms - 1) * 100 for r in rows if r.measured_ms is not None}
    if any(abs(v) > 10 for v in off.values()):
        busy = hardware_view.measured_markdown(rows, 48, cores=hardware_view.CoresWait(0.5, 9.0),
                                               profile_note="shipped for this CPU kind")
        assert "More than 10% off the prediction" in busy and "other programs shared the cores" in busy
        assert "shipped for this CPU kind" in busy


def test_log_axes_have_a_few_readable_ticks():
    assert hardware_view.log_ticks([1, 2, 256]) == {"tickmode": "array", "tickvals": [1, 2, 4, 8, 16, 32, 64, 128, 256],
                                                    "ticktext": ["1", "2", "4", "8", "16", "32", "64", "128", "256"]}
    assert hardware_view.log_ticks([3, 20000])["tickvals"] == [1, 10, 100, 1000, 10000, 100000]
    assert hardware_view.log_ticks([]) == {}
    cost = hardware_view.CostSeries((1, 2, 4, 8, 16, 24, 32, 48, 64), (39, 60, 100, 238, 260, 300, 400, 500, 700),
                                    (1, 2, 4, 8), (24, 46, 55, 90), label="llama.cpp")
    for fig in (hardware_view.runtimes_figure([cost]), hardware_view.cost_figure(cost),
                runners_view.runners_figure(runners_view.RunnerCurves("cpu", eager=cost))):
        assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [1, 2, 4, 8, 16, 32, 64]


def test_the_llamacpp_runtime_reads_the_tokenizer_the_hf_runtime_converted(monkeypatch):
    """The tokenizer read from the shipped GGUF by its class, never through AutoTokenizer's model config (which
    spent 40+ s parsing every metadata field), is the one the Hugging Face runtime's conversion wrote: same ids,
    specials and chat template.  (How long the read takes depends on the transformers release: 5 s with 5.23,
    23 s of CPU with 5.17 on an AVX2 Zen 3; no timing is asserted here.)"""
    import transformers

    spec, cache = EMBEDDED["target"], default_cache_dir()
    if not (is_gguf_kept(spec, cache) and is_converted(spec, cache)):
        pytest.skip("the embedded target is not kept and converted in this machine's cache (scripts/prepare_models.py)")

    def no_config(*args, **kwargs):
        raise AssertionError("the tokenizer was read through AutoConfig (the slow path)")
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_config)
    tok = tokenizer_from_gguf(gguf_path(spec, cache))
    monkeypatch.undo()
    ref = load_tokenizer(converted_dir(spec, cache))
    assert tok.get_vocab() == ref.get_vocab() and tok.chat_template == ref.chat_template
    assert (tok.eos_token, tok.pad_token) == (ref.eos_token, ref.pad_token)
    # transformers 5.17 (the GPU machine's) builds 3 of the 22 special tokens from the file; the llama.cpp runtime
    # runs where requirements.txt pins 5.23, which builds all of them
    if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (5, 23):
        assert tok.added_tokens_decoder == ref.added_tokens_decoder
    else:
        assert set(tok.added_tokens_decoder) <= set(ref.added_tokens_decoder)
    text = "def f(x):\n    return x * 2  # héllo 日本\n<|im_end|>"
    assert tok(text)["input_ids"] == ref(text)["input_ids"]
