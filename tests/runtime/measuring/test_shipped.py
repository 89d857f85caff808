"""The measurements shipped in assets/ and the library functions the scripts call on them (no models loaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sequoia.core.profiles.acceptance import AcceptanceVector
from sequoia.core.profiles.calibration import Calibration
from sequoia.core.profiles.cost import illustrative_gpu_profile
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.trees.optimizer import choose_tree, trees_to_check
from sequoia.runtime.measuring.finder import find_calibration

ROOT = Path(__file__).resolve().parents[3]
ACCEPTANCE = ROOT / "assets" / "acceptance"
PROFILES = ROOT / "assets" / "profiles"


@pytest.mark.parametrize("path", sorted(ACCEPTANCE.glob("embedded-*.json")), ids=lambda p: p.stem)
def test_shipped_acceptance_vectors(path):
    vec = AcceptanceVector.load(path)
    set_name, tag = path.stem.split("-")[1:3]
    # The long-context sets (summarize, rag, edit) were measured with fewer new tokens: 6 prompts x 16-32.
    least = 300 if set_name in ("code", "chat") else 96
    assert vec.prompt_set == set_name and vec.method == "teacher" and vec.positions >= least
    assert vec.temperature == (0.0 if tag == "greedy" else float(tag[1:]))
    assert len(vec.values) == 16 and 0.5 < vec.values[0] < 1.0 and sum(vec.values) <= 1.0 + 1e-6
    assert "Qwen2.5-Coder" in vec.pair


def test_every_setting_is_shipped():
    stems = {p.stem for p in ACCEPTANCE.glob("embedded-*.json")}
    for s in ("code", "chat"):
        for tag in ("greedy", "t0.6", "t1.0"):
            assert f"embedded-{s}-{tag}" in stems


def test_shipped_calibrations_and_profile():
    cal = find_calibration(0.5)
    assert isinstance(cal, Calibration) and cal.temperature == 0.6 and cal.steps > 100
    assert find_calibration(0.0).temperature == 0.0


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.json")), ids=lambda p: p.stem)
def test_shipped_profiles_say_what_they_were_measured_on(path):
    prof = HardwareProfile.load(path)
    assert prof.device.startswith("cpu") and prof.target_n[0] == 1
    fp = prof.fingerprint
    assert fp is not None and fp.device_kind == "cpu" and fp.threads == 2 and "Qwen2.5-Coder" in fp.pair
    assert prof.note  # says how it was made and that the overheads are unknown
    kind = "avx512bf16" if "avx512_bf16" in fp.cpu_features else "avx2"
    # The file name says the configuration, per runtime (GGUF weight types in lower case):
    names = {"hf": f"bf16-{fp.draft_quant}",                                   # <target dtype>-<draft quantization>
             "llamacpp": f"llamacpp-{fp.target_dtype.lower()}",                 # llamacpp-<target weights>
             "llamacpp+hf": f"mixed-{fp.target_dtype}-{fp.draft_dtype.lower()}"}  # mixed-<target dtype>-<draft weights>
    assert path.stem == f"embedded-cpu-{kind}-{names[fp.runtime]}"
    if fp.runtime != "llamacpp":   # a torch target: bf16, unquantized
        assert prof.dtype == "torch.bfloat16" and (fp.target_dtype, fp.target_quant) == ("bf16", "none")


def test_the_int4_draft_profile_measured_here_prices_a_deep_tree():
    """The AVX-512-BF16 profile with the int4 draft (measured with the overheads, one-token forwards without
    oneDNN, wider ones from oneDNN-blocked weights): a draft level costs ~23% of a target step and 16 tokens
    verify for ~1.8 steps, and the optimizer drafts a deep tree on code."""
    prof = HardwareProfile.load(PROFILES / "embedded-cpu-avx512bf16-bf16-int4.json")
    assert prof.step_overhead_ms > 0 and prof.draft(1) < 0.25 * prof.target(1) and prof.target(17) < 3 * prof.target(1)
    choice = choose_tree(AcceptanceVector.load(ACCEPTANCE / "embedded-code-greedy.json").values, prof)
    assert choice.depth >= 6 and choice.speedup > 1.6


def test_the_two_cpu_kinds_choose_differently():
    avx2 = HardwareProfile.load(PROFILES / "embedded-cpu-avx2-bf16-int8.json")
    avx512 = HardwareProfile.load(PROFILES / "embedded-cpu-avx512bf16-bf16-int4.json")   # its default draft
    assert not avx2.matches(avx512.fingerprint) and not avx512.matches(avx2.fingerprint)
    assert any("CPU features" in m for m in avx2.mismatches(avx512.fingerprint))
    vec = AcceptanceVector.load(ACCEPTANCE / "embedded-code-greedy.json")
    # AVX2 only: verifying 16 tokens costs ~11x one, no tree pays and the optimizer keeps the target alone.
    assert choose_tree(vec.values, avx2).budget == 0
    # AVX-512-BF16: 16 tokens verify for ~1.8 one-token steps, so a real tree pays.
    choice = choose_tree(vec.values, avx512)
    assert choice.budget >= 4 and choice.speedup > 1.5


def test_what_if_gpu_cost_model_picks_big_trees():
    """scripts/measure/what_if.py's table: on a GPU-like cost model verification is free, so big trees pay."""
    vec = AcceptanceVector.load(ACCEPTANCE / "embedded-code-greedy.json")
    small, this = (choose_tree(vec.values, illustrative_gpu_profile(r), max_depth=16) for r in (0.05, 0.35))
    assert small.budget > 16 and small.speedup > 2.0
    assert this.speedup < small.speedup  # a costlier draft pays less


def test_check_prediction_trees():
    prof = HardwareProfile.hand_made(lambda n: 100.0 + 0.5 * n, lambda w: 5.0)
    choice, trees = trees_to_check((0.8, 0.1), prof, budgets=[4, 8], chains=[2])
    labels = [label for label, _ in trees]
    assert labels[0] == "target alone" and trees[0][1].size == 0
    assert labels[1].startswith("optimizer's choice") and choice.budget > 0
    assert [t.size for _, t in trees[2:]] == [2, 4, 8]
