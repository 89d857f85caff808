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

At temperature 0 both p and q are point masses on their argmax; verification
then accepts a child exactly when it equals the target's argmax, so the
output equals the target's greedy output token for token.
"""

from __future__ import annotations

import torch

from .config import SAMPLING_MODES, SamplingConfig

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


def verify_children(
    p: torch.Tensor,
    q: torch.Tensor | None,
    children: list[int],
    mode: str,
    generator: torch.Generator | None,
) -> tuple[int | None, torch.Tensor]:
    """Verify one node's children in order against the target.

    p: [V] target distribution at the node; q: [V] draft distribution (ignored
    for ``topk``).  Returns (index into ``children`` of the accepted child or
    None, the distribution to draw the bonus from if nothing was accepted).
    """
    if p.ndim != 1 or (q is not None and q.shape != p.shape):
        raise ValueError("p and q must be 1-D distributions over the same vocabulary")
    p = p.clone()
    q = None if mode == "topk" else q.clone()
    for i, x in enumerate(children):
        qx = 1.0 if q is None else float(q[x])
        if qx <= 0.0:
            continue  # a zero-probability filler slot: it can never be proposed, so skip it
        u = float(torch.rand((), generator=generator, device=p.device))
        px = float(p[x])
        if u * qx < px:
            return i, p
        p = _residual(p, q, x)
        if mode == "without_replacement":
            q[x] = 0.0
            total = q.sum()
            if total <= _TINY:
                q = None  # q's whole support was rejected; later slots are fillers
                break
            q /= total
    return None, p


def _residual(p: torch.Tensor, q: torch.Tensor | None, x: int) -> torch.Tensor:
    """norm(max(p - q, 0)); with q a point mass on x that is p with x removed."""
    if q is None:
        r = p.clone()
        r[x] = 0.0
    else:
        r = (p - q).clamp_(min=0.0)
    total = r.sum()
    if total <= _TINY:
        # Only reachable through rounding when p == q (a rejection of
        # probability ~0); p itself is then the right distribution.
        return p
    return r / total


def sample_token(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from a 1-D distribution (argmax if it is one-hot)."""
    return int(torch.multinomial(probs, 1, generator=generator))


def verify_greedy(target_argmax: int, children: list[int]) -> int | None:
    """Temperature 0: the child equal to the target's argmax, if any."""
    for i, x in enumerate(children):
        if x == target_argmax:
            return i
    return None
