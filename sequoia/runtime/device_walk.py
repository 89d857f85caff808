"""The sampled walk (T > 0) on the device, read back once: every node's children verified at once.

The host walk (:func:`sequoia.runtime.engine.walk_tree`) verifies the children of
the nodes on the accepted path one uniform at a time, and each test reads a
probability back from the GPU.  Here every node that has children is verified in
one batch with :mod:`sequoia.core.sampling`'s own rule over rows
(:func:`~sequoia.core.sampling.verify_rows_state`), with one uniform per child drawn up front; the path's
end is found on the device by following the accepted children, the bonus token is drawn from the
residual there (or p at a leaf), and the bonus and each node's verdict come back in the step's one
readback, from which the host retraces the path.  Nothing here waits for the device.

Why the output is still distributed exactly as the target's: a node's verdict
depends only on its own p, q, children and uniforms, all independent of the other
nodes', so the verdicts the walk reads along its path are distributed as the host
walk's sequential tests; the verdicts of nodes off the path are computed and never
read.  Only the use of random numbers differs, so a seed gives other (equally
distributed) text than the host walk.  Children copied from the context (fixed
proposals) and inspection keep the host walk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..core.config import SamplingConfig
from ..core.sampling import verify_rows_state, warp
from ..core.trace import NGRAM
from ..core.tree import Tree
from ..runners.base import upload


def can_walk_on_device(draft, sampling: SamplingConfig, inspect: bool) -> bool:
    """True where this walk applies: T > 0, no inspection, only the draft's own children, q at every parent."""
    if sampling.greedy or inspect or draft.tree.size == 0:
        return False
    if draft.sources is not None and NGRAM in draft.sources:
        return False
    return all(v in draft.q and draft.q[v] is not None for v in range(draft.tree.n_nodes)
               if draft.tree.children[v])


@dataclass(frozen=True)
class _Layout:
    """A tree's nodes with children as rows of one batch, widest first (built once per tree and device)."""

    rows: tuple[int, ...]             # [R] node of each row
    row_of: tuple[int, ...]           # [n_nodes] row of each node (-1: a leaf)
    widths: tuple[int, ...]           # [k] rows with a child in each slot (see verify_rows_state)
    rows_d: torch.Tensor              # [R] the same on the device
    row_of_d: torch.Tensor            # [n_nodes]
    kids_d: torch.Tensor              # [R, k] child node in each slot (padding: the row's own node)
    nodes_d: torch.Tensor             # [n_nodes] 0, 1, ...: each node's own index
    hops: int                         # doublings that follow any path to its end (2**hops >= depth)


@lru_cache(maxsize=64)
def _layout(tree: Tree, device: str) -> _Layout:
    rows = tuple(sorted((v for v in range(tree.n_nodes) if tree.children[v]), key=lambda v: -len(tree.children[v])))
    k = len(tree.children[rows[0]])
    row_of = [-1] * tree.n_nodes
    for r, v in enumerate(rows):
        row_of[v] = r
    kids = [list(tree.children[v]) + [v] * (k - len(tree.children[v])) for v in rows]
    host = torch.tensor([list(rows) + row_of + list(range(tree.n_nodes)) + sum(kids, [])], dtype=torch.long)[0]
    up = upload(host, torch.device(device))
    n, nr = tree.n_nodes, len(rows)
    return _Layout(rows, tuple(row_of), tuple(sum(len(tree.children[v]) > i for v in rows) for i in range(k)),
                   up[:nr], up[nr: nr + n], up[nr + 2 * n:].view(nr, k), up[nr + n: nr + 2 * n],
                   max(1, math.ceil(math.log2(tree.depth + 1))))


@dataclass
class PendingWalk:
    """The walk's result still on the device: ``values`` ([1 + R] int64: the bonus token, then each row's
    first accepted slot or -1) are read back by the caller, with whatever else it reads, and given to
    :meth:`finish`."""

    tree: Tree
    layout: _Layout
    values: torch.Tensor

    def finish(self, values: list[int]) -> tuple[list[int], int, set[int]]:
        """(path, bonus, verified), as the host walk returns them, from the values read back."""
        tree, row_of, verdicts = self.tree, self.layout.row_of, values[1:]
        node, path, verified = 0, [0], set()
        while tree.children[node]:
            kids, f = tree.children[node], verdicts[row_of[node]]
            verified.update(kids if f < 0 else kids[: f + 1])
            if f < 0:
                break
            node = kids[f]
            path.append(node)
        return path, int(values[0]), verified


def walk_on_device(draft, logits: torch.Tensor, sampling: SamplingConfig, mode: str, gen) -> PendingWalk:
    """One step's walk, queued on the device without a host wait.  logits: [n_nodes, V] target."""
    tree, dev = draft.tree, logits.device
    lay = _layout(tree, str(dev))
    tokens = draft.token_ids if draft.token_ids is not None else upload(torch.tensor(draft.tokens), dev)
    q = torch.stack([draft.q[v] for v in lay.rows]).float()                   # [R, V]
    u = torch.rand(lay.kids_d.shape, generator=gen, device=dev)               # one uniform per child slot
    first, residual = verify_rows_state(warp(logits[lay.rows_d], sampling), q, tokens[lay.kids_d], u, mode,
                                        lay.widths)
    # Each node's next node on the path (itself where the path ends), then its end from the root by doubling:
    # a few gathers, whatever the depth, and no host read.
    nxt = lay.nodes_d.clone()
    kid = lay.kids_d.gather(1, first.clamp(min=0)[:, None])[:, 0]
    nxt[lay.rows_d] = torch.where(first >= 0, kid, lay.rows_d)
    for _ in range(lay.hops):
        nxt = nxt[nxt]
    end = nxt[:1]                                                             # [1]
    end_row = lay.row_of_d[end]
    dist = torch.where(end_row[:, None] >= 0, residual[end_row.clamp(min=0)], warp(logits[end], sampling))
    bonus = torch.multinomial(dist, 1, generator=gen)[0]                      # [1]
    return PendingWalk(tree, lay, torch.cat([bonus, first]))
