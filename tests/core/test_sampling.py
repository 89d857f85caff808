"""Verification is lossless on enumerable distributions, for every way of drawing children."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from sequoia.core.config import SamplingConfig
from sequoia.core.verification.sampling import sample_children, verify_children, verify_greedy, warp

# A correct rule fails a test with probability 1e-6 at most.
ALPHA = 1e-6


def _dist(*xs) -> torch.Tensor:
    t = torch.tensor(xs, dtype=torch.float32)
    return t / t.sum()


CASES = {
    "equal": (_dist(4, 3, 2, 1, 0), _dist(4, 3, 2, 1, 0)),
    "disjoint": (_dist(5, 3, 0, 0, 2), _dist(0, 0, 6, 4, 0)),
    "p_one_hot": (_dist(0, 0, 1, 0, 0), _dist(3, 3, 2, 1, 1)),
    "q_one_hot": (_dist(3, 3, 2, 1, 1), _dist(0, 1, 0, 0, 0)),
    "q_zero_where_p_not": (_dist(2, 2, 2, 2, 2), _dist(5, 5, 0, 0, 0)),
    "skewed": (_dist(1, 2, 3, 4, 10), _dist(10, 4, 3, 2, 1)),
}


def _simulate(p, q, k, mode, n, seed=0) -> torch.Tensor:
    """Empirical distribution of the emitted token after one node's verification."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros_like(p)
    for _ in range(n):
        kids = sample_children(q[None], k, mode, g)[0].tolist()
        idx, residual = verify_children(p, q, kids, mode, g)
        tok = kids[idx] if idx is not None else int(torch.multinomial(residual, 1, generator=g))
        counts[tok] += 1
    return counts


def _chi2_pvalue(counts: torch.Tensor, p: torch.Tensor) -> float:
    support = p > 0
    assert counts[~support].sum() == 0, "emitted a token the target gives probability 0"
    expected = p[support] * counts.sum()
    if support.sum() == 1:
        return 1.0
    return float(stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode,k", [("without_replacement", 1), ("without_replacement", 3),
                                    ("with_replacement", 2), ("topk", 2)])
def test_verification_preserves_target_distribution(case, mode, k):
    p, q = CASES[case]
    counts = _simulate(p, q, k, mode, n=4000)
    assert _chi2_pvalue(counts, p) > ALPHA


def test_a_rule_without_residual_is_caught(monkeypatch):
    """The test above has power: drawing the bonus from p instead of the residual fails it."""
    import sequoia.core.verification.sampling as sampling

    monkeypatch.setattr(sampling, "_residual", lambda p, q, x: p)
    p, q = CASES["skewed"]
    counts = _simulate(p, q, 1, "without_replacement", n=4000)
    assert _chi2_pvalue(counts, p) < ALPHA


def test_without_replacement_children_are_distinct_and_follow_q():
    g = torch.Generator().manual_seed(1)
    q = _dist(5, 3, 1, 1)
    draws = sample_children(q.expand(20000, 4).contiguous(), 2, "without_replacement", g)
    assert (draws[:, 0] != draws[:, 1]).all()
    first = torch.bincount(draws[:, 0], minlength=4).float()
    assert stats.chisquare(first.numpy(), (q * 20000).numpy()).pvalue > ALPHA


def test_one_gumbel_draw_of_an_unnormalised_residual_is_a_draw_from_it():
    """The device walk's bonus (verify.walk_on_device): one Gumbel-max draw of the residual max(p - q, 0), left
    unnormalised and with zeros, follows the normalised residual as torch.multinomial's draw did, with no
    host wait; a draw that ignored the zeros' -inf logs would fail the support check."""
    g = torch.Generator().manual_seed(2)
    residual = torch.tensor([0.0, 0.3, 0.05, 0.0, 0.15, 0.2])          # sums to 0.7
    n = 20000
    drawn = sample_children(residual.expand(n, 6).contiguous(), 1, "without_replacement", g)[:, 0]
    counts = torch.bincount(drawn, minlength=6).float()
    assert _chi2_pvalue(counts, residual / residual.sum()) > ALPHA
    reference = torch.multinomial(residual, n, replacement=True, generator=g)   # what the walk drew before
    assert _chi2_pvalue(torch.bincount(reference, minlength=6).float(), residual / residual.sum()) > ALPHA


def test_filler_children_beyond_q_support_are_skipped():
    p, q = _dist(1, 1, 1, 1), _dist(1, 0, 0, 0)
    kids = sample_children(q[None], 3, "without_replacement", torch.Generator().manual_seed(0))[0].tolist()
    assert kids[0] == 0
    counts = _simulate(p, q, 3, "without_replacement", n=2000)
    assert _chi2_pvalue(counts, p) > ALPHA


def test_greedy_accepts_only_the_target_argmax():
    assert verify_greedy(3, [5, 3, 1]) == 1
    assert verify_greedy(3, [5, 1]) is None
    assert verify_greedy(3, []) is None


def test_warp_temperature_zero_is_one_hot():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]])
    out = warp(logits, SamplingConfig(temperature=0))
    assert torch.equal(out, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_warp_top_p_and_top_k():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    top_p = warp(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(top_p, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    top_k = warp(logits, SamplingConfig(temperature=1.0, top_k=3))
    assert top_k[3] == 0 and torch.isclose(top_k.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("kwargs", [{"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}])
def test_bad_sampling_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


def test_shapes_are_checked():
    with pytest.raises(ValueError, match=r"\[m, V\]"):
        sample_children(torch.ones(4), 2, "topk", None)
    with pytest.raises(ValueError, match="unknown sampling mode"):
        sample_children(torch.ones(1, 4) / 4, 2, "nucleus", None)
