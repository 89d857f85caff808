"""The sampled walk (T > 0) on the device, read back once: every node's children verified at once.

The host walk (:func:`sequoia.runtime.engine.walk_tree`) verifies the children of
the nodes on the accepted path one uniform at a time, and each test reads a
probability back from the GPU.  Here every node that has children is verified in
one batch with :mod:`sequoia.core.sampling`'s own rule over rows
(:func:`~sequoia.core.sampling.verify_rows_state`), with one uniform per child drawn up front; the path
then follows the accepted children on the device, the bonus token is drawn from
the residual (or p at a leaf), and the path, the bonus and each node's verdict
come back in one readback.

Why the output is still distributed exactly as the target's: a node's verdict
depends only on its own p, q, children and uniforms, all independent of the other
nodes', so the verdicts the walk reads along its path are distributed as the host
walk's sequential tests; the verdicts of nodes off the path are computed and never
read.  Only the use of random numbers differs, so a seed gives other (equally
distributed) text than the host walk.  Children copied from the context (fixed
proposals) and inspection keep the host walk.
"""

from __future__ import annotations

import torch

from ..core.config import SamplingConfig
from ..core.sampling import verify_rows_state, warp
from ..core.trace import NGRAM
from ..runners.base import upload


def can_walk_on_device(draft, sampling: SamplingConfig, inspect: bool) -> bool:
    """True where this walk applies: T > 0, no inspection, only the draft's own children, q at every parent."""
    if sampling.greedy or inspect or draft.tree.size == 0:
        return False
    if draft.sources is not None and NGRAM in draft.sources:
        return False
    return all(v in draft.q and draft.q[v] is not None for v in range(draft.tree.n_nodes)
               if draft.tree.children[v])


def walk_on_device(draft, logits: torch.Tensor, sampling: SamplingConfig, mode: str, gen):
    """(path, bonus, verified) of one step, as the host walk returns them.  logits: [n_nodes, V] target."""
    tree, dev = draft.tree, logits.device
    internal = [v for v in range(tree.n_nodes) if tree.children[v]]
    k = max(len(tree.children[v]) for v in internal)
    row_of = [-1] * tree.n_nodes
    for r, v in enumerate(internal):
        row_of[v] = r
    kids = [list(tree.children[v]) + [0] * (k - len(tree.children[v])) for v in internal]
    valid = [[1] * len(tree.children[v]) + [0] * (k - len(tree.children[v])) for v in internal]
    host = torch.tensor([sum(kids, []), sum(valid, [])], dtype=torch.long)
    up = upload(host, dev)
    kids_d, valid_d = up[0].view(len(internal), k), up[1].view(len(internal), k).bool()   # [R, k]
    rows_d, tokens_d = upload(torch.tensor(row_of), dev), upload(torch.tensor(draft.tokens), dev)
    p = warp(logits, sampling)                                                  # [n, V]
    q = torch.stack([draft.q[v] for v in internal]).float()                    # [R, V]
    u = torch.rand((len(internal), k), generator=gen, device=dev)              # one uniform per child slot
    first, residual = verify_rows_state(p[upload(torch.tensor(internal), dev)], q, tokens_d[kids_d], u, mode,
                                        valid_d)
    node, path = torch.zeros((), dtype=torch.long, device=dev), []
    for _ in range(tree.depth):   # follow accepted children; a node with none (or a leaf) stays put
        r = rows_d[node]
        f = first[r.clamp(min=0)]
        node = torch.where((r >= 0) & (f >= 0), kids_d[r.clamp(min=0), f.clamp(min=0)], node)
        path.append(node)
    end = rows_d[node]
    dist = torch.where(end >= 0, residual[end.clamp(min=0)], p[node])
    bonus = torch.multinomial(dist, 1, generator=gen)[0]
    back = torch.cat([torch.stack(path + [bonus]), first]).tolist()            # the one readback
    steps, bonus_tok, verdicts = back[: tree.depth], back[tree.depth], back[tree.depth + 1:]
    walked = [0] + [v for i, v in enumerate(steps) if v != ([0] + steps)[i]]
    verified = set()
    for v in walked:
        if tree.children[v]:
            f = verdicts[row_of[v]]
            verified.update(tree.children[v] if f < 0 else tree.children[v][: f + 1])
    return walked, int(bonus_tok), verified
