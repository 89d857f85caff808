"""Does a verification rule keep the target's distribution?  A goodness-of-fit check you can run.

At temperature > 0 speculative output differs from the target alone's run to
run; what must match is the *distribution* of every emitted token (see
:mod:`sequoia.core.verification.sampling`).  This module checks that empirically at one
context: given the target's exact distribution p and the draft's q there,
it repeats one verification step N times (draw k children from q, verify them
with the method's rule, take the first emitted token: the accepted child or
the bonus) and tests the N tokens against p.

The rules run are the library's own: :func:`~sequoia.core.verification.sampling.sample_children`,
:func:`~sequoia.core.verification.sampling.verify_children` and
:func:`~sequoia.core.verification.sampling.sample_token`, the functions the engine's
``walk_tree`` calls.  For contrast there is a **teaching foil**,
:func:`broken_verify_children`: the same walk with an acceptance test 20%
too generous (accept when ``u * q < 1.2 * r``).  It lives here, not in
``sampling``, and nothing but this check runs it.

The statistic: Pearson's chi-square against p, with the tokens whose
expected count is under ``min_expected`` pooled into one bin (the usual
validity condition), and its p-value from the chi-square survival function
(the regularised upper incomplete gamma function).  A token of target
probability 0 that is emitted at all fails the test outright: no sample
size makes that a fluctuation.

Names follow :mod:`sequoia.core.verification.sampling`: p target, q draft, k children.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import acceptance_probability, reject, sample_children, sample_token, verify_children, verify_rows

#: Significance level of a verdict: a lossless rule fails it 1% of the time by chance.
ALPHA = 0.01
#: Bins with fewer expected counts than this are pooled (chi-square's usual validity condition).
MIN_EXPECTED = 5.0
#: Tokens tested one by one at most (the rest pooled), see :func:`chi_square_fit`.
MAX_BINS = 8
#: How much the foil over-accepts: ``u * q < FOIL_FACTOR * r`` instead of ``u * q < r``.
FOIL_FACTOR = 1.2
#: Trials per rule on the page: tests/core/test_distribution.py checks the verdicts' power at this N (at 2000
#: the foil slipped through in about a quarter of LM-like cases).
DEFAULT_TRIALS = 5000
#: Children at the root for the tree rules (a chain always has one).
DEFAULT_CHILDREN = 4
#: Mass cut off the far tail of p and of q before the trials (see :func:`head_of`).
TAIL = 1e-3


@dataclass(frozen=True)
class Rule:
    """One verification rule the check runs."""

    name: str            # "sequoia", "specinfer", "chain", "broken"
    label: str           # for the page
    mode: str            # how children are drawn (sequoia.core.verification.sampling.SAMPLING_MODES)
    single_child: bool   # the root has one child whatever k is (a chain)
    lossless: bool       # what the theory says; the check should agree


RULES = (
    Rule("sequoia", "Sequoia (without replacement)", "without_replacement", False, True),
    Rule("specinfer", "SpecInfer (with replacement)", "with_replacement", False, True),
    Rule("chain", "Chain (one child)", "without_replacement", True, True),
    Rule("broken", "Broken verifier (teaching foil: accepts if u·q < 1.2·p)", "without_replacement", False, False),
)
RULES_BY_NAME = {r.name: r for r in RULES}


def broken_verify_children(p: torch.Tensor, q: torch.Tensor, children: list[int], mode: str,
                           generator: torch.Generator | None) -> tuple[int | None, torch.Tensor]:
    """TEACHING FOIL, never used to decode: :func:`~sequoia.core.verification.sampling.verify_children` with its test
    loosened to ``u < min(1, FOIL_FACTOR * r(x) / q(x))``.  p, q: [V].  Same return value.

    The residual update is the real one, so the only fault is the over-acceptance of tokens the draft
    likes more than the target does (q > p); where q <= p / FOIL_FACTOR both rules accept alike.
    """
    if p.ndim != 1 or q.shape != p.shape:
        raise ValueError("p and q must be 1-D distributions over the same vocabulary")
    for i, x in enumerate(children):
        qx = float(q[x])
        if qx <= 0.0:
            continue
        u = float(torch.rand((), generator=generator, device=p.device))
        if u < min(1.0, FOIL_FACTOR * float(p[x]) / qx):
            return i, p
        p, q = reject(p, q, torch.tensor([x], device=p.device), mode)
    return None, p


def children_for(rule: Rule, k: int) -> int:
    """Children drawn at the root under ``rule`` for a slider value ``k``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return 1 if rule.single_child else k


def emit_once(p: torch.Tensor, q: torch.Tensor, rule: Rule, k: int, generator: torch.Generator | None) -> int:
    """One verification step at the root: the first token it emits (an accepted child or the bonus).  p, q: [V]"""
    kids = sample_children(q[None], children_for(rule, k), rule.mode, generator)[0].tolist()
    verify = broken_verify_children if rule.name == "broken" else verify_children
    idx, residual = verify(p, q, kids, rule.mode, generator)
    return kids[idx] if idx is not None else sample_token(residual, generator)


def support(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Token ids where p or q is positive; the only tokens a step can draw or emit.  # [S] int64"""
    if p.ndim != 1 or q.shape != p.shape:
        raise ValueError(f"p and q must be [V] each, got {tuple(p.shape)} and {tuple(q.shape)}")
    return torch.nonzero((p > 0) | (q > 0))[:, 0]


def head_of(p: torch.Tensor, q: torch.Tensor, tail: float = TAIL) -> tuple[torch.Tensor, torch.Tensor]:
    """p and q without their far tails: each keeps its most likely tokens up to ``1 - tail`` of its mass,
    everything else is set to 0, and both are renormalised.  p, q: [V] -> [V], [V]

    Why: one verification step costs time in proportion to the vocabulary it works on, and a model's
    distribution at temperature 1 gives all 151,936 tokens some mass (on the embedded pair at T=1 a tail
    of 1e-5 still left 124,813 tokens, and one check of four rules took 825 s on a loaded 2-core machine).
    Cutting a tail of 1e-3 changes p by at most that much in total variation (N = 5000 trials resolve
    about 0.04) and keeps every token a trial could plausibly emit; the rules are then run, and tested,
    on the cut p and q exactly.
    """
    if not 0 <= tail < 1:
        raise ValueError(f"tail must be in [0, 1), got {tail}")

    def cut(d: torch.Tensor) -> torch.Tensor:
        d = d.double() / d.double().sum()
        if tail == 0:
            return d
        sorted_d, idx = torch.sort(d, descending=True)
        drop_sorted = (sorted_d.cumsum(0) - sorted_d) >= 1.0 - tail   # mass before the token already enough
        out = d.masked_fill(torch.zeros_like(drop_sorted).scatter(0, idx, drop_sorted), 0.0)
        return out / out.sum()

    return cut(p), cut(q)


@dataclass(frozen=True)
class FitTest:
    """Pearson's chi-square of counts against p, small bins pooled."""

    statistic: float
    dof: int
    p_value: float
    n: int                          # trials
    outside: int                    # emitted tokens of target probability 0 (any > 0 fails outright)

    def passed(self, alpha: float = ALPHA) -> bool:
        return self.outside == 0 and self.p_value >= alpha


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square with ``dof`` degrees of freedom."""
    if dof < 1:
        return 1.0
    a = torch.tensor(dof / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(max(x, 0.0) / 2.0, dtype=torch.float64)))


def chi_square_fit(counts: torch.Tensor, p: torch.Tensor, min_expected: float = MIN_EXPECTED,
                   max_bins: int = MAX_BINS) -> FitTest:
    """Test counts [V] of emitted tokens against the distribution p [V].

    Bins: the ``max_bins`` most likely tokens under p that are expected ``min_expected`` times or more,
    each on its own, and everything else pooled into one bin (merged into the smallest kept bin when the
    pool itself expects fewer).  The bins depend on p and N only, never on the counts, so the test is
    valid; keeping few of them concentrates its power where a wrong rule errs most, on the likely tokens
    (the foil is still missed where the draft is close to the target; at N = 2000 it was caught in 73-79%
    of LM-like cases, at N = 5000 in 30 of 30, see tests/core/test_distribution.py).
    """
    if counts.shape != p.shape or counts.ndim != 1:
        raise ValueError(f"counts and p must be [V] each, got {tuple(counts.shape)} and {tuple(p.shape)}")
    counts, p = counts.double(), p.double()
    n = int(counts.sum())
    if n <= 0:
        raise ValueError("no trials to test")
    outside = int(counts[p <= 0].sum())
    expected = p / p.sum() * n
    big = expected >= min_expected
    if int(big.sum()) > max_bins:
        big = torch.zeros_like(big).scatter(0, torch.topk(expected, max_bins).indices, True)
    obs = counts[big].tolist()
    exp = expected[big].tolist()
    pooled_obs, pooled_exp = float(counts[~big & (p > 0)].sum()), float(expected[~big].sum())
    if pooled_exp > 0:
        if pooled_exp >= min_expected or not exp:
            obs.append(pooled_obs)
            exp.append(pooled_exp)
        else:
            j = min(range(len(exp)), key=exp.__getitem__)
            obs[j] += pooled_obs
            exp[j] += pooled_exp
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    dof = len(exp) - 1
    return FitTest(statistic=stat, dof=dof, p_value=chi2_sf(stat, dof), n=n, outside=outside)


def run_trials(p: torch.Tensor, q: torch.Tensor, rule: Rule, k: int, n: int, generator: torch.Generator,
               should_stop=None, chunk_cells: int = 1 << 22) -> torch.Tensor:
    """Counts [V] of the first token emitted in ``n`` independent verification steps at the same context.

    Many trials at once: children from :func:`~sequoia.core.verification.sampling.sample_children`, the test by
    :func:`~sequoia.core.verification.sampling.verify_rows` (``verify_children`` over many rows, the same
    ``acceptance_probability`` and ``reject``; the foil: :func:`_foil_rows`), and where every child is
    rejected the bonus from the residual those rejections leave.  Only the support of p and q is kept
    (tokens outside it are never drawn nor emitted).  ``should_stop()`` is polled between chunks of
    trials; the counts so far are returned when it says so.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    keep = support(p, q)
    ps, qs = p[keep].float(), q[keep].float()
    local = torch.zeros(len(keep), dtype=torch.long)
    rows = max(1, min(n, chunk_cells // max(len(keep), 1)))
    done = 0
    while done < n:
        if done and should_stop is not None and should_stop():
            break
        m = min(rows, n - done)
        local += torch.bincount(emit_rows(ps, qs, rule, k, m, generator), minlength=len(keep))
        done += m
    counts = torch.zeros(p.shape[0], dtype=torch.long)
    counts[keep] = local
    return counts


def emit_rows(p: torch.Tensor, q: torch.Tensor, rule: Rule, k: int, m: int,
              generator: torch.Generator | None) -> torch.Tensor:
    """:func:`emit_once` ``m`` times over, as rows of one batch.  p, q: [V] -> tokens [m] int64"""
    big_p, big_q = p[None].expand(m, -1), q[None].expand(m, -1)
    drawn = sample_children(big_q.contiguous(), children_for(rule, k), rule.mode, generator)   # [m, k]
    u = torch.rand(drawn.shape, generator=generator, device=p.device)                           # [m, k]
    first = (_foil_rows if rule.name == "broken" else verify_rows)(big_p, big_q, drawn, u, rule.mode)
    out = drawn.gather(1, first.clamp(min=0)[:, None])[:, 0]
    none = first < 0
    if none.any():
        r = _residual_after(big_p[none], big_q[none], drawn[none], rule.mode)
        out[none] = torch.multinomial(r, 1, generator=generator)[:, 0]
    return out


def _residual_after(p: torch.Tensor, q: torch.Tensor, drawn: torch.Tensor, mode: str) -> torch.Tensor:
    """The residual after every drawn child was rejected, per row (filler slots skipped, as in
    ``verify_rows``).  p, q: [R, V]; drawn: [R, k] -> [R, V]"""
    r, qc = p, q
    for i in range(drawn.shape[1]):
        x = drawn[:, i:i + 1]
        tested = (qc.gather(-1, x)[:, 0] > 0)[:, None]
        r_next, q_next = reject(r, qc, x, mode)
        r, qc = torch.where(tested, r_next, r), torch.where(tested, q_next, qc)
    return r


def _foil_rows(p: torch.Tensor, q: torch.Tensor, drawn: torch.Tensor, u: torch.Tensor, mode: str) -> torch.Tensor:
    """TEACHING FOIL: ``verify_rows`` with the over-generous test of :func:`broken_verify_children`."""
    first = torch.full((p.shape[0],), -1, dtype=torch.long, device=p.device)
    live = torch.ones(p.shape[0], dtype=torch.bool, device=p.device)
    r, qc = p, q
    for i in range(drawn.shape[1]):
        x = drawn[:, i:i + 1]
        qx = qc.gather(-1, x)[:, 0]
        tested = live & (qx > 0)
        accept = tested & (u[:, i] < acceptance_probability(FOIL_FACTOR * r.gather(-1, x)[:, 0], qx))
        first[accept] = i
        live &= ~accept
        r_next, q_next = reject(r, qc, x, mode)
        moved = (tested & ~accept)[:, None]
        r, qc = torch.where(moved, r_next, r), torch.where(moved, q_next, qc)
    return first


@dataclass(frozen=True)
class RuleResult:
    """One rule's trials at one context."""

    rule: Rule
    k: int                          # children drawn at the root
    counts: torch.Tensor            # [V] int64 first emitted token, per token
    fit: FitTest
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.fit.passed()

    @property
    def verdict(self) -> str:
        return "follows p" if self.passed else "does NOT follow p"

    @property
    def as_expected(self) -> bool:
        """The check agrees with the theory (lossless rules pass, the foil fails)."""
        return self.passed == self.rule.lossless


def check_rule(p: torch.Tensor, q: torch.Tensor, rule: Rule, k: int, n: int, seed: int,
               should_stop=None, clock=None) -> RuleResult:
    """Run ``rule`` ``n`` times from a generator seeded with ``seed`` and test the emitted tokens against p."""
    g = torch.Generator().manual_seed(int(seed))
    t0 = clock() if clock else 0.0
    counts = run_trials(p, q, rule, k, n, g, should_stop)
    return RuleResult(rule, children_for(rule, k), counts, chi_square_fit(counts, p),
                      (clock() - t0) if clock else 0.0)


def total_variation(counts: torch.Tensor, p: torch.Tensor) -> float:
    """Half the L1 distance between the empirical distribution of ``counts`` [V] and p [V]."""
    emp = counts.double() / max(int(counts.sum()), 1)
    return 0.5 * float((emp - p.double() / p.double().sum()).abs().sum())
