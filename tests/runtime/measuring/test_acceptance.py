"""Acceptance vectors: exact math on small distributions, JSON files, measuring tiny models."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import make_pair, perturbed, tiny_model
from test_verification_exact import exact_verification

from sequoia.core.config import SamplingConfig
from sequoia.core.profiles.acceptance import AcceptanceVector
from sequoia.runtime.checks.teacher import continuation_logits, logits_over, target_continuation, teacher_logits
from sequoia.runtime.measuring.acceptance import (greedy_rank_hits, load_prompts, measure_acceptance, rejection_curves,
                                                  sampled_rank_probs)

ASSETS = Path(__file__).resolve().parents[3] / "assets" / "prompts"
QUIET = dict(progress=lambda *a: None)


# ------------------------------------------------------------------ exact math
@pytest.mark.parametrize("p, q", [
    ([0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]),
    ([0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]),
    ([0.0, 0.0, 1.0, 0.0], [0.6, 0.3, 0.1, 0.0]),    # target is sure, the draft ranks it last
])
def test_monte_carlo_matches_enumeration(p, q):
    exact = exact_verification(torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64), 3,
                               "without_replacement")[1][:3].tolist()    # P(first accepted = rank k)
    pt, qt = torch.tensor([p]), torch.tensor([q])
    est = sampled_rank_probs(pt, qt, 3, samples=40000, gen=torch.Generator().manual_seed(0), tail=0.0)[0]
    assert est[0].item() == pytest.approx(sum(min(a, b) for a, b in zip(p, q)), abs=1e-6)  # rank 1 is analytic
    for k in range(3):
        se = math.sqrt(max(exact[k] * (1 - exact[k]), 1e-4) / 40000)
        assert abs(est[k].item() - exact[k]) < 5 * se, (k, est.tolist(), exact)
    assert est.sum() <= 1 + 1e-6


def test_truncation_keeps_results_close():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(4, 500, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(4, 500, generator=g) * 3, -1)
    full = sampled_rank_probs(p, q, 4, samples=4000, gen=torch.Generator().manual_seed(2), tail=0.0)
    cut = sampled_rank_probs(p, q, 4, samples=4000, gen=torch.Generator().manual_seed(2), tail=1e-3)
    assert torch.allclose(full, cut, atol=0.03)


def test_rejection_curves_fall_with_more_children():
    g = torch.Generator().manual_seed(3)
    p_logits, q_logits = torch.randn(6, 40, generator=g) * 2, torch.randn(6, 40, generator=g) * 2
    curves = rejection_curves(p_logits, q_logits, 1.0, [1, 2, 4], samples=200, gen=g)
    assert set(curves) == {"without_replacement", "with_replacement", "topk"}
    for values in curves.values():
        assert all(0.0 <= b <= a <= 1.0 for a, b in zip(values, values[1:]))
    same = rejection_curves(p_logits, p_logits, 1.0, [1, 2], samples=50, gen=g)["without_replacement"]
    assert same == pytest.approx([0.0, 0.0], abs=1e-6)   # q == p: the first child is always accepted


def test_greedy_rank_hits():
    p_logits = torch.tensor([[0.0, 5.0, 1.0, 2.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 9.0]])
    q_logits = torch.tensor([[0.0, 4.0, 1.0, 0.0], [0.0, 3.0, 2.0, 1.0], [0.0, 1.0, 2.0, 3.0]])
    hits = greedy_rank_hits(p_logits, q_logits, 3)
    # row 0: target 1 is the draft's top; row 1: target 0 is the draft's 4th (outside width 3); row 2: top again
    assert hits.tolist() == [[1, 0, 0], [0, 0, 0], [1, 0, 0]]
    assert greedy_rank_hits(p_logits, q_logits.flip(-1), 4)[2].tolist() == [0, 0, 0, 1]


# ------------------------------------------------------------------ files
def _vector(**kw) -> AcceptanceVector:
    base = dict(values=(0.6, 0.2, 0.1), stderr=(0.01, 0.01, 0.005), pair="d+t", temperature=0.6, top_p=0.9,
                prompt_set="code", positions=512, method="teacher", mc_samples=128, date="2025-01-01",
                version="0.1.0")
    base.update(kw)
    return AcceptanceVector(**base)


def test_json_round_trip(tmp_path):
    vec = _vector()
    path = tmp_path / "acc.json"
    vec.save(path)
    assert AcceptanceVector.load(path) == vec
    assert AcceptanceVector.load(path, pair="d+t", sampling=SamplingConfig(0.6, 0.9)) == vec
    assert json.loads(path.read_text())["format"] == "sequoia-acceptance/1"


@pytest.mark.parametrize("kw, msg", [
    (dict(values=(0.7, 0.5)), "sum to at most 1"),
    (dict(values=(1.2,), stderr=()), r"lie in \[0, 1\]"),
    (dict(values=()), "non-empty"),
    (dict(stderr=(0.1,)), "stderr has 1 entries"),
    (dict(temperature=-1.0), "temperature"),
])
def test_invalid_vectors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        _vector(**kw)


def test_malformed_and_mismatched_files(tmp_path):
    path = tmp_path / "acc.json"
    path.write_text('{"format": "sequoia-hardware/1"}')
    with pytest.raises(ValueError, match=r"expected a Sequoia acceptance vector file"):
        AcceptanceVector.load(path)
    data = _vector().to_dict()
    for key, value, msg in [("values", "0.5", "'values' must be list"), ("values", [0.5, None], "finite numbers"),
                            ("values", [0.9, 0.9], "sum to at most 1"), ("temperature", None, "missing field")]:
        broken = dict(data)
        if value is None and key == "temperature":
            del broken[key]
        else:
            broken[key] = value
        path.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=msg) as info:
            AcceptanceVector.load(path)
        assert str(path) in str(info.value)
    _vector().save(path)
    with pytest.raises(ValueError, match="measured for pair 'd\\+t', not 'x\\+y'"):
        AcceptanceVector.load(path, pair="x+y")
    with pytest.raises(ValueError, match="measured at temperature=0.6"):
        AcceptanceVector.load(path, sampling=SamplingConfig(temperature=0.0))


def test_prompt_sets_ship_and_parse(tmp_path):
    for name in ("code", "chat"):
        prompts = load_prompts(ASSETS / f"{name}.jsonl")
        assert len(prompts) == 12 and len(set(prompts)) == 12
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_prompts(bad)


# ------------------------------------------------------------------ tiny models
@pytest.fixture(scope="module")
def tiny():
    target = tiny_model(0)
    return {"same": make_pair(target, target, 48), "close": make_pair(perturbed(target, 0.12, 3), target, 48)}


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(48, (5,), generator=g).tolist() for _ in range(n)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_identical_models_accept_the_first_child(tiny, temperature):
    vec = measure_acceptance(tiny["same"], _prompts(2), SamplingConfig(temperature=temperature), width=3,
                             max_new_tokens=10, generator=torch.Generator().manual_seed(0), mc_samples=16, **QUIET)
    assert vec.values[0] == pytest.approx(1.0, abs=1e-5)
    assert vec.values[1:] == pytest.approx((0.0, 0.0), abs=1e-5)
    assert vec.positions == 20 and vec.pair == "tiny-draft+tiny-target" and vec.temperature == temperature
    assert vec.mc_samples == (16 if temperature else 0)


def test_teacher_logits_without_a_second_target_forward(tiny):
    """The logits the target decoded with are those one forward over prompt + continuation gives."""
    pair, prompt = tiny["close"], _prompts(1)[0]
    cont, p_logits = target_continuation(pair.target, prompt, SamplingConfig(temperature=1.0), 12,
                                         torch.Generator().manual_seed(0), return_logits=True)
    assert len(cont) == 12 and p_logits.shape == (12, 48)
    torch.testing.assert_close(p_logits, logits_over(pair.target, prompt, cont, 48), atol=1e-4, rtol=1e-4)
    again, p2, q2 = continuation_logits(pair, prompt, SamplingConfig(temperature=1.0), 12,
                                        torch.Generator().manual_seed(0))
    assert again == cont
    p3, q3 = teacher_logits(pair, prompt, cont)
    torch.testing.assert_close(p2, p3, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(q2, q3)
    assert len(target_continuation(pair.target, prompt, SamplingConfig(), 5, None)) == 5  # greedy: no generator


def test_measurement_is_seeded(tiny):
    def run():
        return measure_acceptance(tiny["close"], _prompts(2), SamplingConfig(temperature=1.0), width=3,
                                  max_new_tokens=8, generator=torch.Generator().manual_seed(5), mc_samples=8, **QUIET)
    assert run().values == run().values


def test_rejects_bad_arguments(tiny):
    with pytest.raises(ValueError, match="unknown method"):
        measure_acceptance(tiny["same"], _prompts(1), SamplingConfig(), method="guess", **QUIET)
    with pytest.raises(ValueError, match="width >= 1"):
        measure_acceptance(tiny["same"], _prompts(1), SamplingConfig(), width=0, **QUIET)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_teacher_forced_agrees_with_real_decoding(tiny, temperature):
    """The fast method and the engine's step records estimate the same p_1..p_3."""
    pair, prompts, sampling = tiny["close"], _prompts(6, seed=1), SamplingConfig(temperature=temperature)
    teacher = measure_acceptance(pair, prompts, sampling, width=3, max_new_tokens=50, mc_samples=64,
                                 generator=torch.Generator().manual_seed(0), **QUIET)
    decode = measure_acceptance(pair, prompts, sampling, width=3, max_new_tokens=50, method="decode",
                                generator=torch.Generator().manual_seed(0), **QUIET)
    assert decode.method == "decode" and decode.positions > 100
    for k in range(3):
        se = math.hypot(teacher.stderr[k], decode.stderr[k])
        assert abs(teacher.values[k] - decode.values[k]) < 4 * se + 0.02, (k, teacher.values, decode.values)


@pytest.mark.embedded
def test_teacher_forced_agrees_with_real_decoding_on_the_embedded_pair(embedded_pair_fp32):
    """Issue 3: on the real pair the fast estimate and the engine's own step records agree (greedy)."""

    prompts = load_prompts(Path(__file__).resolve().parents[3] / "assets" / "prompts" / "code.jsonl")[:2]
    kw = dict(width=3, max_new_tokens=24, generator=torch.Generator().manual_seed(0), **QUIET)
    teacher = measure_acceptance(embedded_pair_fp32, prompts, SamplingConfig(), **kw)
    kw["generator"] = torch.Generator().manual_seed(0)
    decode = measure_acceptance(embedded_pair_fp32, prompts, SamplingConfig(), method="decode", **kw)
    assert teacher.positions >= 30 and decode.positions >= 10
    assert 0.5 < teacher.values[0] < 1.0
    for k in range(3):
        se = math.hypot(teacher.stderr[k], decode.stderr[k])
        assert abs(teacher.values[k] - decode.values[k]) < 4 * se + 0.03, (k, teacher.values, decode.values)
