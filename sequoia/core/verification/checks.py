"""What verification saw, reduced to a few tokens per node for the inspector.

The engine records these only when asked (``generate(..., inspect=True)``):
for every tested child a :class:`~sequoia.core.statistics.trace.NodeCheck` holding the
parent's target p and draft q over its most likely tokens, the uniform draw
and, after a rejection, the residual norm(max(p - q, 0)); plus one check for
the bonus draw.  Full [V] distributions never leave the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from ..statistics.trace import NodeCheck
from .sampling import ChildTest

#: Tokens per distribution on the shared axis of a check.
TOP_K = 8


def token_axis(dists: Sequence[torch.Tensor | None], token: int | None, k: int = TOP_K) -> list[int]:
    """The k tokens most likely under any of ``dists`` ([V] each), with ``token`` always among them."""
    live = [d for d in dists if d is not None]
    best = torch.stack(live).amax(0)                                  # [V]
    ids = torch.topk(best, min(k, best.numel())).indices.tolist()
    if token is not None and token not in ids:
        ids[-1] = token
    return ids


def _at(dist: torch.Tensor | None, ids: list[int]) -> tuple[float, ...]:
    return () if dist is None else tuple(float(x) for x in dist[ids].tolist())


def sampled_checks(parent: int, kids: Sequence[int], tests: Sequence[ChildTest]) -> list[NodeCheck]:
    """Checks of one node's children at temperature > 0 (``tests`` from verify_children's events)."""
    out = []
    for t in tests:
        ids = token_axis([t.p, t.q, t.residual], t.token)
        out.append(NodeCheck(
            node=kids[t.index], parent=parent, u=t.u, p_token=float(t.p[t.token]),
            q_token=1.0 if t.q is None else float(t.q[t.token]), accepted=t.accepted,
            top_ids=tuple(ids), top_texts=(), top_p=_at(t.p, ids), top_q=_at(t.q, ids),
            residual=_at(t.residual, ids)))
    return out


def greedy_checks(parent: int, kids: Sequence[int], kid_tokens: Sequence[int], accepted: int | None,
                  p: torch.Tensor, q: torch.Tensor | None) -> list[NodeCheck]:
    """Checks at temperature 0: a child passes when it is the target's argmax (no draw, no residual).

    p, q: [V] the models' raw softmax, shown so a student sees how sure each was.
    """
    tested = len(kids) if accepted is None else accepted + 1
    out = []
    for i in range(tested):
        tok = kid_tokens[i]
        ids = token_axis([p, q], tok)
        out.append(NodeCheck(
            node=kids[i], parent=parent, u=None, p_token=float(p[tok]),
            q_token=float(q[tok]) if q is not None else 1.0, accepted=i == accepted,
            top_ids=tuple(ids), top_texts=(), top_p=_at(p, ids), top_q=_at(q, ids)))
    return out


def bonus_check(parent: int, bonus_node: int, bonus: int, dist: torch.Tensor) -> NodeCheck:
    """The bonus draw: ``dist`` [V] is the residual, p itself, or (T=0) the raw target softmax."""
    ids = token_axis([dist], bonus)
    return NodeCheck(node=bonus_node, parent=parent, u=None, p_token=float(dist[bonus]), q_token=0.0,
                     accepted=True, top_ids=tuple(ids), top_texts=(), top_p=_at(dist, ids), top_q=())


def with_texts(checks: Sequence[NodeCheck], decode: Callable[[list[list[int]]], list[str]]) -> tuple[NodeCheck, ...]:
    """The checks with ``top_texts`` filled in by a batch decoder (one call for the whole step)."""
    flat = [i for c in checks for i in c.top_ids]
    texts = iter(decode([[i] for i in flat]) if flat else [])
    out = []
    for c in checks:
        names = tuple(next(texts) for _ in c.top_ids)
        out.append(replace(c, top_texts=names))
    return tuple(out)
