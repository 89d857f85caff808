"""Sampling and verification math: the part that makes speculation lossless.

Vocabulary (names follow the Sequoia paper: p is the target, q the draft):

node      one position of the token tree; node 0 (the *root*) is the last
          committed token, every other node holds one draft token.
path      the nodes from the root down to a node.
children  the draft tokens proposed after a node, in *sampling order*; they
          are verified in that order.
accepted  a child the target keeps; the step's accepted path is the longest
          chain of accepted children from the root.
residual  what the target distribution becomes after a child is rejected:
          norm(max(p - q, 0)).  Sampling the residual after every child of a
          node is rejected is what keeps the output distributed exactly as p.
bonus     the token the target emits after the accepted path: drawn from the
          residual if a child of the last accepted node was rejected, from p
          itself if that node had no children.  Every step emits >= 1 token.

Three ways to draw children from q:
``without_replacement`` (Sequoia)  distinct tokens; after a rejection the
                                   rejected token is removed from q and q is
                                   renormalised, so a later sibling never
                                   repeats a rejected token.
``with_replacement`` (SpecInfer)   i.i.d. draws from q; q never changes.
``topk``                           the k most likely draft tokens; verified as
                                   if q were a point mass on each one.

The test: the next child x is accepted with probability min(1, r(x) / q(x)),
r being p for the first child and the residual after each rejection, q the
draft x was drawn from (renormalised without the rejected tokens, or a point
mass for ``topk``).  :func:`acceptance_probability` and :func:`reject` state
that rule once; :func:`verify_children` applies it to one node and
:func:`first_accepted` to many rows at once (the Monte Carlo measurements).

At temperature 0 both p and q are point masses on their argmax; verification
then accepts a child exactly when it equals the target's argmax, so the
output equals the target's greedy output token for token.

Mixed sources (``verify_children(..., n_fixed=m)``): a node's first m
children may be *fixed* proposals that no distribution drew, such as tokens
copied from the context by :mod:`sequoia.core.ngrams.ngram`; the others are the
draft's, drawn without replacement from q *with the fixed tokens removed*
(:func:`without_tokens`, so a draft child never repeats a fixed one).  Why
the emitted token is still distributed exactly as p: every stage proposes a
token x from a distribution s known to the verifier, independent of the
target's randomness, accepts it with probability min(1, r(x) / s(x)) and
otherwise moves the target to norm(max(r - s, 0)).  Then P(emit y) =
min(r(y), s(y)) + P(reject) * residual(y) = min(r, s)(y) + (r - s)+(y) = r(y),
since P(reject) = 1 - sum min(r, s) = sum (r - s)+.  By induction over the
stages the emitted token is distributed as the first r, which is p.  A fixed
token x is a stage with s = delta_x: accept with probability r(x), residual r
with x removed (``topk``'s rule).  The draft's children then form one
without-replacement draw from q' = q without the fixed tokens, which is the
usual Sequoia stage sequence started at the residual r; r is 0 on the fixed
tokens, so removing them from q' only avoids proposals that must fail.  What
would break it is drawing from q but testing against q' (or the reverse): the
verifier must know the distribution each child came from.  A node with only
fixed children needs no q (the draft never forwarded it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..config import SAMPLING_MODES, SamplingConfig

_TINY = 1e-12


def warp(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Logits -> probabilities after temperature, top-k and top-p.  # [..., V] float32

    At temperature 0 the result is one-hot on the argmax.
    """
    logits = logits.float()
    if cfg.greedy:
        out = torch.zeros_like(logits)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p: a token is dropped
        # when the mass *before* it already reaches top_p (the first always stays).
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= cfg.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, idx, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_children(q: torch.Tensor, k: int, mode: str, generator: torch.Generator | None) -> torch.Tensor:
    """Draw ``k`` children from each row of ``q``.  q: [m, V] -> tokens [m, k] int64.

    Without replacement uses the Gumbel-top-k trick: the order of the top k of
    log q + Gumbel noise is distributed exactly as k sequential draws without
    replacement, so any prefix of it is a valid smaller draw as well.  When a
    row has fewer than k tokens of positive probability the extra slots get
    tokens of probability 0, which verification skips.
    """
    if q.ndim != 2:
        raise ValueError(f"q must be [m, V], got shape {tuple(q.shape)}")
    if mode not in SAMPLING_MODES:
        raise ValueError(f"unknown sampling mode {mode!r}; expected one of {SAMPLING_MODES}")
    k = min(k, q.shape[-1])
    if k <= 0:
        return torch.empty(q.shape[0], 0, dtype=torch.long, device=q.device)
    if mode == "topk":
        return torch.topk(q, k, dim=-1).indices
    if mode == "with_replacement":
        return torch.multinomial(q, k, replacement=True, generator=generator)
    u = torch.rand(q.shape, generator=generator, device=q.device, dtype=torch.float32).clamp_(min=_TINY)
    gumbel = -torch.log(-torch.log(u))
    return torch.topk(torch.log(q) + gumbel, k, dim=-1).indices


@dataclass(frozen=True)
class ChildTest:
    """What verifying one child saw; recorded only when ``verify_children`` is given ``events``."""

    index: int                        # position in ``children``
    token: int
    u: float                          # the uniform draw; accepted iff u < min(1, p(token) / q(token))
    p: torch.Tensor                   # [V] target distribution at the test (residual after earlier siblings)
    q: torch.Tensor | None            # [V] draft distribution at the test (renormalised); None for topk
    accepted: bool
    residual: torch.Tensor | None     # [V] norm(max(p - q, 0)) after this rejection; None if accepted


def verify_children(
    p: torch.Tensor,
    q: torch.Tensor | None,
    children: list[int],
    mode: str,
    generator: torch.Generator | None,
    events: list[ChildTest] | None = None,
    n_fixed: int = 0,
) -> tuple[int | None, torch.Tensor]:
    """Verify one node's children in order against the target.

    The first ``n_fixed`` children are fixed proposals (point masses, e.g.
    copied n-grams); the rest were drawn in ``mode`` from
    ``without_tokens(q, children[:n_fixed])`` (see the module docstring).

    p: [V] target distribution at the node; q: [V] draft distribution (ignored
    for ``topk``).  Returns (index into ``children`` of the accepted child or
    None, the distribution to draw the bonus from if nothing was accepted).
    ``events``, when given, gets one :class:`ChildTest` per tested child (the
    random draws are the same with or without it).  :func:`first_accepted` is
    the same rule over many rows at once.
    """
    if p.ndim != 1 or (q is not None and q.shape != p.shape):
        raise ValueError("p and q must be 1-D distributions over the same vocabulary")
    if n_fixed and q is not None and mode != "topk":
        q = without_tokens(q, torch.tensor(children[:n_fixed], dtype=torch.long, device=q.device))
    q_draft = None if mode == "topk" else q
    for i, x in enumerate(children):
        fixed = i < n_fixed
        q, mode_now = (None, "topk") if fixed else (q_draft, mode)
        qx = 1.0 if q is None else float(q[x])
        if qx <= 0.0:
            continue  # a zero-probability filler slot: it can never be proposed, so skip it
        u = float(torch.rand((), generator=generator, device=p.device))
        if u < acceptance_probability(float(p[x]), qx):
            if events is not None:
                events.append(ChildTest(i, x, u, p, q, True, None))
            return i, p
        before, before_q = p, q
        p, q = reject(p, q, torch.tensor([x], device=p.device), mode_now)
        if not fixed:
            q_draft = q
        if events is not None:  # reject never writes in place, so the tensors recorded stay as they were
            events.append(ChildTest(i, x, u, before, before_q, False, p))
    return None, p


def without_tokens(q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """q with ``tokens`` removed and renormalised (all zeros if nothing is left).  q: [..., V]; tokens: [..., m]

    What the draft's children of a node are drawn from when the node also has fixed (copied) children.
    """
    if tokens.shape[-1] == 0:
        return q
    q = q.scatter(-1, tokens, 0.0)
    total = q.sum(-1, keepdim=True)
    return torch.where(total > _TINY, q / total.clamp(min=_TINY), torch.zeros_like(q))


def acceptance_probability(r_x, q_x):
    """The rule: a child x is accepted with probability min(1, r(x) / q(x)).

    r is the target's (residual) distribution and q the draft's at the test;
    floats or tensors (elementwise), q_x > 0.  With the residual update of
    :func:`reject` this makes the emitted token distributed exactly as p.
    """
    ratio = r_x / q_x
    return ratio.clamp(max=1.0) if isinstance(ratio, torch.Tensor) else min(1.0, ratio)


def reject(
    r: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor, mode: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The state after child ``x`` is rejected: (residual, the draft the next sibling is tested against).

    r, q: [..., V] (q None: a point mass on x, ``topk``); x: [..., 1] int64.
    Without replacement the rejected token also leaves q, which is
    renormalised (all zeros once q's support is used up: later slots are
    fillers).  Never writes in place.
    """
    r_next = _residual(r, q, x)
    if mode == "without_replacement":
        q = _drop(q, x)
    return r_next, q


def _drop(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """q without token x per row, renormalised (all zeros once its support is used up).  [..., V]"""
    q = q.scatter(-1, x, 0.0)
    total = q.sum(-1, keepdim=True)
    return torch.where(total > _TINY, q / total.clamp(min=_TINY), torch.zeros_like(q))


def _residual(p: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)) per row; with q a point mass on x that is p with x removed.  [..., V]"""
    r = p.scatter(-1, x, 0.0) if q is None else (p - q).clamp(min=0.0)
    total = r.sum(-1, keepdim=True)
    # total ~ 0 is only reachable through rounding when p == q (a rejection of
    # probability ~0); p itself is then the right distribution.
    return torch.where(total > _TINY, r / total.clamp(min=_TINY), p)


def first_accepted(p: torch.Tensor, q: torch.Tensor, k: int, mode: str,
                   generator: torch.Generator | None) -> torch.Tensor:
    """Draw k children per row and verify them: index of the first accepted, -1 if all are rejected.

    p, q: [R, V] -> [R] int64.  :func:`verify_children` over many rows at once
    (the Monte Carlo measurements), with the same :func:`acceptance_probability`
    and :func:`reject`; the first j of the k children drawn are a valid draw of
    j children in every mode, so one call answers every j <= k.
    """
    if p.ndim != 2 or p.shape != q.shape:
        raise ValueError(f"p and q must both be [R, V], got {tuple(p.shape)} and {tuple(q.shape)}")
    drawn = sample_children(q, k, mode, generator)                      # [R, k]
    u = torch.rand(drawn.shape, generator=generator, device=p.device)   # [R, k]
    return verify_rows(p, q, drawn, u, mode)


def verify_rows(p: torch.Tensor, q: torch.Tensor, drawn: torch.Tensor, u: torch.Tensor, mode: str) -> torch.Tensor:
    """Verify drawn children given their uniforms: index of the first accepted per row, -1 if none.

    p, q: [R, V]; drawn, u: [R, k] (children in sampling order, one uniform per slot) -> [R] int64.
    """
    return verify_rows_state(p, q, drawn, u, mode)[0]


def verify_rows_state(p: torch.Tensor, q: torch.Tensor, drawn: torch.Tensor, u: torch.Tensor, mode: str,
                      widths: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`verify_rows`, and each row's target distribution after its rejections (the residual a bonus
    token is drawn from when nothing was accepted).  No host reads: it runs on a GPU without waiting.

    ``widths``: for rows with fewer children than ``drawn`` has slots, sorted by child count (widest
    first), how many rows have a child in each slot: slot i is tested in rows [0, widths[i]) only, and
    the rows past them take no part in its work (most nodes of a Sequoia tree have one child, a few many);
    the draft's next state is worked out only for rows with a next slot.
    """
    n_rows, k = drawn.shape
    widths = [n_rows] * k if widths is None else list(widths)
    if len(widths) != k or any(not 0 <= w <= n_rows for w in widths) or sorted(widths, reverse=True) != widths:
        raise ValueError(f"widths must be {k} non-increasing row counts in 0..{n_rows}, got {widths}")
    first = torch.full((n_rows,), -1, dtype=torch.long, device=p.device)
    live = torch.ones(n_rows, dtype=torch.bool, device=p.device)   # no child accepted yet
    r, qc = p.clone(), (None if mode == "topk" else q.clone())     # updated in place, a slice per slot
    for i, m in enumerate(widths):
        x = drawn[:m, i:i + 1]                                          # [m, 1]
        r_m, q_m = r[:m], (None if qc is None else qc[:m])
        qx = torch.ones(m, dtype=p.dtype, device=p.device) if q_m is None else q_m.gather(-1, x)[:, 0]
        tested = live[:m] & (qx > 0)                                    # fillers are skipped, as in verify_children
        accept = tested & (u[:m, i] < acceptance_probability(r_m.gather(-1, x)[:, 0], qx))
        first[:m].masked_fill_(accept, i)
        live[:m].logical_and_(~accept)
        moved = (tested & ~accept)[:, None]                             # [m, 1] rows whose state changes
        r_m.copy_(torch.where(moved, _residual(r_m, q_m, x), r_m))      # what reject does, row by row
        # The draft's next state, without replacement, only in rows with a child in the next slot.
        m_next = widths[i + 1] if i + 1 < k else 0
        if mode == "without_replacement" and m_next:
            q_n = qc[:m_next]
            q_n.copy_(torch.where(moved[:m_next], _drop(q_n, x[:m_next]), q_n))
        if not m_next:
            break
    return first, r


def sample_token(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from a 1-D distribution (argmax if it is one-hot)."""
    return int(torch.multinomial(probs, 1, generator=generator))


def verify_greedy(target_argmax: int, children: list[int]) -> int | None:
    """Temperature 0: the child equal to the target's argmax, if any."""
    for i, x in enumerate(children):
        if x == target_argmax:
            return i
    return None
