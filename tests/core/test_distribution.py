"""The distribution check: its statistic, its rules, and its power against the teaching foil."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from sequoia.core.verification.distribution import (ALPHA, DEFAULT_CHILDREN, DEFAULT_TRIALS, RULES, RULES_BY_NAME,
                                                    FitTest, check_rule, chi2_sf, chi_square_fit, emit_once, head_of,
                                                    run_trials, total_variation)


def _dist(*xs) -> torch.Tensor:
    t = torch.tensor(xs, dtype=torch.float64)
    return t / t.sum()


def lm_like(seed: int, vocab: int = 64, noise: float = 0.8) -> tuple[torch.Tensor, torch.Tensor]:
    """A target with a Zipf-like head and a draft that agrees only partly (log-normal noise on p)."""
    g = torch.Generator().manual_seed(seed)
    logits = -1.3 * torch.log(torch.arange(1, vocab + 1, dtype=torch.float64))
    logits = logits[torch.randperm(vocab, generator=g)]
    p = torch.softmax(logits, 0)
    q = torch.softmax(logits + noise * torch.randn(vocab, generator=g, dtype=torch.float64), 0)
    return p, q


def test_chi2_sf_matches_scipy():
    for x, dof in [(0.5, 1), (3.0, 2), (12.0, 7), (80.0, 49), (200.0, 150)]:
        assert chi2_sf(x, dof) == pytest.approx(stats.chi2.sf(x, dof), rel=1e-9, abs=1e-15)


def test_fit_pools_small_bins_and_catches_impossible_tokens():
    p = _dist(50, 30, 10, 5, 3, 2, 0)
    perfect = (p * 100).round().long()
    fit = chi_square_fit(perfect, p)
    assert fit.passed() and fit.p_value > 0.99 and fit.dof == 4   # 5 bins of >= 5 expected (3 + 2 pooled)
    impossible = perfect.clone()
    impossible[6] = 1
    assert not chi_square_fit(impossible, p).passed() and chi_square_fit(impossible, p).outside == 1
    skewed = perfect.clone()
    skewed[0] += 25
    skewed[1] -= 25
    assert chi_square_fit(skewed, p).p_value < 1e-5
    with pytest.raises(ValueError):
        chi_square_fit(torch.zeros(7, dtype=torch.long), p)


def test_head_of_cuts_only_the_far_tail():
    p, q = lm_like(0, vocab=5000)
    hp, hq = head_of(p, q, tail=1e-3)
    for full, cut in ((p, hp), (q, hq)):
        assert cut.sum().item() == pytest.approx(1.0)
        assert 0.5 * (full - cut).abs().sum().item() <= 1.01e-3
        assert (cut > 0).sum() < (full > 0).sum()
        assert torch.equal(cut > 0, full >= full[cut > 0].min())      # a head: the most likely tokens only


@pytest.mark.parametrize("rule", [r for r in RULES if r.lossless], ids=lambda r: r.name)
@pytest.mark.parametrize("case", ["skewed", "disjoint", "lm"])
def test_lossless_rules_pass(rule, case):
    p, q = {"skewed": (_dist(1, 2, 3, 4, 10), _dist(10, 4, 3, 2, 1)),
            "disjoint": (_dist(5, 3, 0, 0, 2), _dist(0, 0, 6, 4, 0)), "lm": lm_like(1)}[case]
    res = check_rule(p, q, rule, 3, 6000, seed=5)
    assert res.fit.outside == 0 and res.fit.p_value > 1e-6


def test_batched_trials_match_the_scalar_rule():
    """run_trials (many rows at once) and emit_once (verify_children, as walk_tree calls it) draw the same law."""
    p, q = _dist(1, 2, 3, 4, 10), _dist(10, 4, 3, 2, 1)
    g = torch.Generator().manual_seed(3)
    for rule in RULES:
        scalar = torch.bincount(torch.tensor([emit_once(p.float(), q.float(), rule, 2, g) for _ in range(3000)]),
                                minlength=5)
        batched = run_trials(p, q, rule, 2, 3000, g)
        table = torch.stack([scalar, batched]).numpy()
        assert stats.chi2_contingency(table[:, table.sum(0) > 0]).pvalue > 1e-6, rule.name


def test_foil_is_caught_where_the_draft_is_overconfident():
    p, q = _dist(1, 2, 3, 4, 10), _dist(10, 4, 3, 2, 1)
    res = check_rule(p, q, RULES_BY_NAME["broken"], 1, 6000, seed=0)
    assert not res.passed and res.fit.p_value < 1e-6
    assert total_variation(res.counts, p) > 0.03


@pytest.mark.slow
def test_verdicts_are_right_at_the_pages_trials():
    """Power at the page's N: over 100 seeded runs on LM-like p and q, every rule's verdict is right >= 95%
    of the time (lossless rules pass, the foil fails)."""
    right = {r.name: 0 for r in RULES}
    runs = 100
    for seed in range(runs):
        p, q = lm_like(100 + seed)
        for i, rule in enumerate(RULES):
            res = check_rule(p, q, rule, DEFAULT_CHILDREN, DEFAULT_TRIALS, seed=seed * 10 + i)
            right[rule.name] += res.as_expected
    assert all(n >= 0.95 * runs for n in right.values()), right


def test_bad_arguments():
    p = _dist(1, 1)
    with pytest.raises(ValueError):
        run_trials(p, p, RULES[0], 2, 0, torch.Generator())
    with pytest.raises(ValueError):
        check_rule(p, p, RULES[0], 0, 10, seed=0)
    assert FitTest(1.0, 1, 0.5, 10, 0).passed(ALPHA)
