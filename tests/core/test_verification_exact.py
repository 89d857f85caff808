"""Verification is lossless EXACTLY: the emitted token's distribution equals p to 1e-9.

For small p and q the draws of k children can be enumerated: every sequence
of children has a probability under its drawing scheme (computed here from q,
independently of the library), and each child's acceptance test integrates in
closed form over the uniform draw u: P(u < a) = a with a the library's
:func:`acceptance_probability`.  After each rejection the state moves by the
library's own :func:`reject`, and when every child is rejected the bonus is
drawn from the final residual.  Summing gives the exact distribution of the
emitted token, so a rule that is wrong by any margin fails, unlike the
chi-square tests of ``test_sampling.py`` (which a 5% over-acceptance passes).
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from sequoia.core.config import SAMPLING_MODES
from sequoia.core.verification import sampling
from sequoia.core.verification.sampling import first_accepted, sample_children, verify_children, verify_rows

TOL = 1e-9


def _dist(*xs) -> torch.Tensor:
    t = torch.tensor(xs, dtype=torch.float64)
    return t / t.sum()


CASES = {
    "equal": (_dist(4, 3, 2, 1, 0), _dist(4, 3, 2, 1, 0)),
    "disjoint": (_dist(5, 3, 0, 0, 2), _dist(0, 0, 6, 4, 0)),
    "skewed": (_dist(1, 2, 3, 4, 10), _dist(10, 4, 3, 2, 1)),
    "p_one_hot": (_dist(0, 0, 1, 0, 0), _dist(3, 3, 2, 1, 1)),
    "q_one_hot": (_dist(3, 3, 2, 1, 1), _dist(0, 1, 0, 0, 0)),
    "q_zero_where_p_not": (_dist(2, 2, 2, 2, 2), _dist(5, 5, 0, 0, 0)),
    "three_tokens": (_dist(1, 1, 1), _dist(6, 3, 1)),
    "four_tokens_close": (_dist(30, 25, 25, 20), _dist(25, 30, 20, 25)),
}


def _draws(q: torch.Tensor, drawn: list[int], k: int, mode: str) -> list[tuple[int, float]]:
    """(next child, its probability given the children drawn so far) under ``mode``'s drawing scheme."""
    if mode == "topk":
        return [(int(sample_children(q[None], k, "topk", None)[0, len(drawn)]), 1.0)]
    if mode == "with_replacement":
        return [(x, float(q[x])) for x in range(len(q)) if q[x] > 0]
    left = [x for x in range(len(q)) if x not in drawn and q[x] > 0]
    if not left:  # q's support is used up: the slot holds some token of probability 0 (a filler)
        return [(next(x for x in range(len(q)) if x not in drawn), 1.0)]
    mass = sum(float(q[x]) for x in left)
    return [(x, float(q[x]) / mass) for x in left]


def exact_verification(p: torch.Tensor, q: torch.Tensor, k: int, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(distribution of the emitted token [V], distribution of the first accepted index [k + 1], last: none).

    Mirrors :func:`verify_children` step by step with the library's own
    acceptance probability and state update; only the drawing scheme and the
    integration over u are the test's.
    """
    k = min(k, len(q))
    emitted = torch.zeros_like(p)
    rank = torch.zeros(k + 1, dtype=torch.float64)

    def walk(r, q_now, drawn, weight):
        if len(drawn) == k:
            emitted.add_(weight * r)                # every child rejected: the bonus comes from the residual
            rank[k] += weight
            return
        for x, w in _draws(q, drawn, k, mode):
            qx = 1.0 if q_now is None else float(q_now[x])
            if qx <= 0.0:                           # a filler: verify_children skips it without a test
                walk(r, q_now, drawn + [x], weight * w)
                continue
            a = float(sampling.acceptance_probability(float(r[x]), qx))
            emitted[x] += weight * w * a
            rank[len(drawn)] += weight * w * a
            if a < 1.0:
                r_next, q_next = sampling.reject(r, q_now, torch.tensor([x]), mode)
                walk(r_next, q_next, drawn + [x], weight * w * (1.0 - a))

    walk(p, None if mode == "topk" else q, [], 1.0)
    return emitted, rank


def check_exact(p: torch.Tensor, q: torch.Tensor, k: int, mode: str) -> None:
    emitted, rank = exact_verification(p, q, k, mode)
    assert rank.sum().item() == pytest.approx(1.0, abs=TOL)
    err = (emitted - p).abs().max().item()
    if err > TOL:
        raise AssertionError(f"{mode}, k={k}: emitted {emitted.tolist()} != p {p.tolist()} (max error {err:.3g})")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", SAMPLING_MODES)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_emitted_token_is_exactly_p(case, mode, k):
    p, q = CASES[case]
    check_exact(p, q, k, mode)


def test_over_accepting_by_five_percent_is_caught(monkeypatch):
    """``u * q < 1.05 * p`` fails the exact check (the chi-square tests of test_sampling.py let it through)."""
    monkeypatch.setattr(sampling, "acceptance_probability", lambda r_x, q_x: min(1.0, 1.05 * r_x / q_x))
    p, q = CASES["skewed"]
    with pytest.raises(AssertionError, match="max error"):
        check_exact(p, q, 1, "without_replacement")
    failures = 0
    for case in sorted(CASES):
        for mode in SAMPLING_MODES:
            try:
                check_exact(*CASES[case], 2, mode)
            except AssertionError:
                failures += 1
    assert failures >= 10


def test_a_rule_without_residual_is_caught(monkeypatch):
    monkeypatch.setattr(sampling, "_residual", lambda p, q, x: p)
    with pytest.raises(AssertionError, match="max error"):
        check_exact(*CASES["skewed"], 2, "without_replacement")


def test_a_rule_that_keeps_rejected_tokens_in_q_is_caught(monkeypatch):
    """Sequoia's draft after a rejection must drop the rejected token; keeping q whole (SpecInfer's q) is wrong
    for children drawn without replacement."""
    plain_reject = sampling.reject
    monkeypatch.setattr(sampling, "reject", lambda r, q, x, mode: (plain_reject(r, q, x, mode)[0], q))
    with pytest.raises(AssertionError, match="max error"):
        check_exact(*CASES["skewed"], 3, "without_replacement")


# ------------------------------------------------- the vectorised verifier against the scalar one
@pytest.mark.parametrize("case", ["skewed", "q_zero_where_p_not", "disjoint", "four_tokens_close"])
@pytest.mark.parametrize("mode", SAMPLING_MODES)
def test_first_accepted_follows_the_exact_rank_distribution(case, mode):
    """Vectorised and scalar verification both match the exact P(first accepted = i)."""
    p, q = CASES[case]
    k, n = 3, 20000
    _, exact = exact_verification(p, q, k, mode)
    first = first_accepted(p.float().expand(n, -1), q.float().expand(n, -1), k, mode,
                           torch.Generator().manual_seed(0))
    vector = torch.bincount(first % (k + 1), minlength=k + 1).double()    # -1 -> slot k
    g = torch.Generator().manual_seed(1)
    scalar = torch.zeros(k + 1, dtype=torch.float64)
    for _ in range(n // 10):
        kids = sample_children(q.float()[None], k, mode, g)[0].tolist()
        idx, _ = verify_children(p.float(), q.float(), kids, mode, g)
        scalar[k if idx is None else idx] += 1
    for counts in (vector, scalar):
        support = exact > 1e-12
        assert counts[~support].sum() == 0
        if support.sum() > 1:
            expected = exact[support] * counts.sum()
            assert stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue > 1e-6, (counts, exact)


@pytest.mark.parametrize("mode", SAMPLING_MODES)
def test_vectorised_and_scalar_verification_agree_draw_for_draw(mode):
    """Given the same children and the same uniforms, both verifiers pick the same child."""
    g = torch.Generator().manual_seed(4)
    rows, k = 300, 4
    p = torch.softmax(torch.randn(rows, 6, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(rows, 6, generator=g) * 2, -1)   # full support: no filler slots
    drawn = sample_children(q, k, mode, g)
    seeds = torch.randint(2**31 - 1, (rows,), generator=g).tolist()
    u = torch.stack([torch.rand(k, generator=torch.Generator().manual_seed(s)) for s in seeds])
    vector = verify_rows(p, q, drawn, u, mode)
    for t in range(rows):  # verify_children draws its uniforms one child at a time from the same stream
        idx, _ = verify_children(p[t], q[t], drawn[t].tolist(), mode, torch.Generator().manual_seed(seeds[t]))
        assert vector[t].item() == (-1 if idx is None else idx), t
    assert 0 < (vector >= 0).sum() < rows


def test_first_accepted_equals_the_scalar_rule_when_it_is_deterministic():
    """One-hot p: only the target's token can be accepted, and it always is; top-k children are fixed."""
    p = _dist(0, 0, 1, 0, 0).float()
    q = _dist(3, 3, 2, 1, 1).float()
    g = torch.Generator().manual_seed(0)
    kids = sample_children(q[None], 3, "topk", None)[0].tolist()
    idx, _ = verify_children(p, q, kids, "topk", g)
    first = first_accepted(p.expand(50, -1), q.expand(50, -1), 3, "topk", g)
    assert idx == kids.index(2) and (first == idx).all()


def test_first_accepted_checks_shapes():
    with pytest.raises(ValueError, match=r"\[R, V\]"):
        first_accepted(torch.ones(4) / 4, torch.ones(4) / 4, 2, "topk", None)


# ------------------------------------------------- mixed sources: fixed (copied) children, then the draft's
def _without(q: torch.Tensor, fixed: list[int]) -> torch.Tensor:
    """The test's own removal of the fixed tokens from q (renormalised; zeros if nothing is left)."""
    out = q.clone()
    out[fixed] = 0.0
    return out / out.sum() if out.sum() > 0 else out


def exact_mixed(p: torch.Tensor, q: torch.Tensor | None, fixed: list[int], k: int, mode: str,
                draw_without_fixed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (emitted distribution [V], first accepted index [m + k + 1]) of ``verify_children(..., n_fixed=m)``.

    The fixed children are point masses tested first; then k draft children are drawn in ``mode`` from q
    without the fixed tokens (``draw_without_fixed=False``: from q itself, the mutation that must fail).
    Verification mirrors verify_children with the library's acceptance rule, ``reject`` and ``without_tokens``.
    """
    m = len(fixed)
    k = 0 if q is None else min(k, len(q) - m)
    emitted = torch.zeros_like(p)
    rank = torch.zeros(m + k + 1, dtype=torch.float64)
    r, weight = p, 1.0
    for i, x in enumerate(fixed):                   # stage s = delta_x: accept with probability r(x)
        a = float(sampling.acceptance_probability(float(r[x]), 1.0))
        emitted[x] += weight * a
        rank[i] += weight * a
        weight *= 1.0 - a
        r, _ = sampling.reject(r, None, torch.tensor([x]), "topk")
    if k == 0:
        emitted.add_(weight * r)
        rank[m] += weight
        return emitted, rank[: m + 1]
    q_draw = _without(q, fixed) if draw_without_fixed else q
    q_test = sampling.without_tokens(q, torch.tensor(fixed, dtype=torch.long))
    if mode == "topk":
        q_test = None

    def walk(r, q_now, drawn, w_now):
        if len(drawn) == k:
            emitted.add_(w_now * r)
            rank[m + k] += w_now
            return
        for x, w in _draws(q_draw, drawn, k, mode):
            qx = 1.0 if q_now is None else float(q_now[x])
            if qx <= 0.0:
                walk(r, q_now, drawn + [x], w_now * w)
                continue
            a = float(sampling.acceptance_probability(float(r[x]), qx))
            emitted[x] += w_now * w * a
            rank[m + len(drawn)] += w_now * w * a
            if a < 1.0:
                r_next, q_next = sampling.reject(r, q_now, torch.tensor([x]), mode)
                walk(r_next, q_next, drawn + [x], w_now * w * (1.0 - a))

    walk(r, q_test, [], weight)
    return emitted, rank


def _check_mixed(p, q, fixed, k, mode, **kw) -> None:
    emitted, rank = exact_mixed(p, q, fixed, k, mode, **kw)
    assert rank.sum().item() == pytest.approx(1.0, abs=TOL)
    err = (emitted - p).abs().max().item()
    if err > TOL:
        raise AssertionError(f"{mode}, fixed={fixed}, k={k}: emitted {emitted.tolist()} != p (max error {err:.3g})")


# fixed tokens: one outside q's support (4 in "q_zero_where_p_not"), one the draft would also propose (0), both
MIXED_FIXED = [[0], [4], [4, 0], [2, 1]]


@pytest.mark.parametrize("case", ["skewed", "q_zero_where_p_not", "disjoint", "p_one_hot", "equal"])
@pytest.mark.parametrize("mode", SAMPLING_MODES)
@pytest.mark.parametrize("fixed", MIXED_FIXED, ids=str)
@pytest.mark.parametrize("k", [0, 1, 2])
def test_mixed_sources_emit_exactly_p(case, mode, fixed, k):
    p, q = CASES[case]
    _check_mixed(p, q, fixed, k, mode)


@pytest.mark.parametrize("fixed", MIXED_FIXED, ids=str)
def test_fixed_children_alone_need_no_q(fixed):
    """A node the draft never forwarded has only copied children and no q."""
    for case in ("skewed", "p_one_hot", "equal"):
        _check_mixed(CASES[case][0], None, fixed, 0, "without_replacement")


def test_drawing_from_q_with_copied_tokens_in_is_lossless_but_wastes_slots():
    """Not removing the copied tokens before drawing is NOT a loss of exactness: a drawn copy of a fixed token
    has probability 0 under the q the verifier tests against, so it is skipped like a filler, and where it
    falls in a draw without replacement is independent of the other children's order.  It only wastes a slot:
    the draft children are accepted less often.  (The mutations that do break exactness are below.)"""
    for case in ("skewed", "q_zero_where_p_not", "equal", "four_tokens_close"):
        for fixed in ([0], [1], [0, 1]):
            _check_mixed(*CASES[case], fixed, 2, "without_replacement", draw_without_fixed=False)
    p, q = CASES["equal"]
    _, removed = exact_mixed(p, q, [0], 1, "without_replacement")
    _, wasted = exact_mixed(p, q, [0], 1, "without_replacement", draw_without_fixed=False)
    assert wasted[1] < removed[1] - 0.05   # one draft child: a wasted slot is a lost chance


def test_testing_a_copied_token_as_a_draw_from_q_is_caught(monkeypatch):
    """A copied token is a point mass: testing it with min(1, r(x) / q(x)) as if q had drawn it over-accepts."""
    p, q = CASES["skewed"]
    plain = sampling.acceptance_probability
    monkeypatch.setattr(sampling, "acceptance_probability",
                        lambda r_x, q_x: plain(r_x, float(q[0])) if q_x == 1.0 else plain(r_x, q_x))
    with pytest.raises(AssertionError, match="max error"):
        _check_mixed(p, q, [0], 1, "without_replacement")


def test_a_rejected_copied_token_left_in_the_residual_is_caught(monkeypatch):
    plain_reject = sampling.reject
    monkeypatch.setattr(sampling, "reject",
                        lambda r, q, x, mode: (r, None) if q is None else plain_reject(r, q, x, mode))
    with pytest.raises(AssertionError, match="max error"):
        _check_mixed(*CASES["skewed"], [4], 1, "without_replacement")


def test_a_verifier_that_keeps_copied_tokens_in_q_is_caught(monkeypatch):
    """Drawing from q without the copied tokens but testing against q itself is wrong as well."""
    monkeypatch.setattr(sampling, "without_tokens", lambda q, tokens: q)
    with pytest.raises(AssertionError, match="max error"):
        _check_mixed(*CASES["skewed"], [0], 2, "without_replacement")


@pytest.mark.parametrize("mode", SAMPLING_MODES)
def test_verify_children_with_fixed_children_follows_the_exact_ranks(mode):
    """The library's verify_children(n_fixed=m) against the exact distribution of the accepted index."""
    p, q = CASES["skewed"]
    fixed, k, n = [0, 4], 2, 6000
    _, exact = exact_mixed(p, q, fixed, k, mode)
    g = torch.Generator().manual_seed(3)
    q_draw = sampling.without_tokens(q.float(), torch.tensor(fixed))
    counts = torch.zeros(len(exact), dtype=torch.float64)
    for _ in range(n):
        kids = fixed + sample_children(q_draw[None], k, mode, g)[0].tolist()
        idx, _ = verify_children(p.float(), q.float(), kids, mode, g, n_fixed=len(fixed))
        counts[len(exact) - 1 if idx is None else idx] += 1
    support = exact > 1e-12
    assert counts[~support].sum() == 0
    assert stats.chisquare(counts[support].numpy(), (exact[support] * n).numpy()).pvalue > 1e-6, (counts, exact)
