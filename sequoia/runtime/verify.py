"""What a step does with the target's answer: walk the tree, each node's p, the one readback.

:func:`verify_tree` takes the target's logits at every node of the draft tree and
returns the accepted path and bonus token (a :class:`Walk`), the target's
probability of each node's token, and the draft with its tokens read, all from one
device-to-host transfer (:class:`StepBuffers` on the device, :class:`StepReadback`
on the host, one named field per buffer).  The rule every walk applies is
:mod:`sequoia.core.verification.sampling`'s (its docstring defines node, path, residual, bonus).

Two walks apply it:

* the **host walk** (:func:`walk_tree`) tests the children of the nodes on the
  accepted path one uniform at a time, reading each probability as it tests: at
  T = 0 it compares tokens with every node's argmax (read back with the rest),
  and it is the walk that records what each test saw (``inspect``) and that
  verifies children copied from the context (fixed proposals);
* the **device walk** (:func:`walk_on_device`, T > 0) verifies every node that
  has children at once with the batched form of the rule
  (:func:`~sequoia.core.verification.sampling.verify_rows_state`), one uniform per child slot
  drawn up front; the path's end is found on the device by following the
  accepted children, the bonus is drawn there from the residual (or p at a
  leaf), and the bonus and each node's verdict come back in the readback, from
  which the host retraces the path.  Nothing in it waits for the device.

Why the device walk keeps the output distributed exactly as the target's: a
node's verdict depends only on its own p, q, children and uniforms, all
independent of the other nodes', so the verdicts read along the path are
distributed as the host walk's sequential tests; the verdicts of nodes off the
path are computed and never read.  Only the use of random numbers differs, so a
seed gives other (equally distributed) text than the host walk.
``tests/runtime/test_verify_rows_exact.py`` computes the probability of every outcome of
both walks exactly.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, fields
from functools import lru_cache

import torch

from ..core.config import SamplingConfig
from ..core.statistics.trace import NGRAM, NodeCheck
from ..core.trees.tree import Tree
from ..core.verification.checks import bonus_check, greedy_checks, sampled_checks
from ..core.verification.sampling import (sample_children, sample_token, verify_children, verify_greedy,
                                          verify_rows_state, warp)
from ..runners.base import upload
from .drafter import Draft

_DISPLAY = SamplingConfig(temperature=1.0)  # at T=0, show the models' raw confidence


@dataclass
class Walk:
    path: list[int]                   # accepted node indices, root first
    bonus: int
    verified: set[int]                # nodes the target looked at
    checks: list[NodeCheck] | None = None  # what each test saw (walk_tree(..., inspect=True) only)


@dataclass(frozen=True)
class StepReadback:
    """What the host gets back from a step's one transfer (empty: not asked for)."""

    p: tuple[float, ...] = ()         # [n_nodes - 1] target probability of each node's token (root excluded)
    argmax: tuple[int, ...] = ()      # [n_nodes] the target's argmax at each node (T = 0)
    bonus: tuple[int, ...] = ()       # [1] the device walk's bonus token
    verdicts: tuple[int, ...] = ()    # [R] each device-walk row's first accepted slot, -1: none
    tokens: tuple[int, ...] = ()      # [n_nodes] a device-grown draft's tokens
    q: tuple[float, ...] = ()         # [n_nodes] q of each node's token under its parent (root: 1.0)


@dataclass(frozen=True)
class StepBuffers:
    """The step's answer still on the device, the fields of :class:`StepReadback` (None: not asked for)."""

    p: torch.Tensor | None = None         # [n_nodes - 1] float32
    argmax: torch.Tensor | None = None    # [n_nodes] int64
    bonus: torch.Tensor | None = None     # [1] int64
    verdicts: torch.Tensor | None = None  # [R] int64
    tokens: torch.Tensor | None = None    # [n_nodes] int64
    q: torch.Tensor | None = None         # [n_nodes] float32

    def read(self) -> StepReadback:
        """Every buffer in one device-to-host transfer (one host wait on a GPU)."""
        named = [(f.name, t.reshape(-1)) for f in fields(self) if (t := getattr(self, f.name)) is not None]
        parts = [t for _, t in named]
        if len({t.dtype for t in parts}) > 1:
            parts = [t.double() for t in parts]   # ids below 2**53 and float32 values are exact in float64
        back = (parts[0] if len(parts) == 1 else torch.cat(parts)).tolist() if parts else []
        out, at = {}, 0
        for name, t in named:
            values = back[at: at + t.numel()]
            out[name] = tuple(values if t.is_floating_point() else map(int, values))
            at += t.numel()
        return StepReadback(**out)


def verify_tree(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, mode: str, gen,
                inspect: bool = False, on_device: bool = False) -> tuple[Draft, Walk, tuple[float, ...]]:
    """(draft with its tokens read, the walk, p of each node's token with the root's 1.0).  logits: [n_nodes, V]

    ``on_device``: the device walk where it applies (:func:`can_walk_on_device`), else the host walk.
    """
    p = node_target_probs(draft, logits, sampling)
    unread = {"tokens": draft.token_ids, "q": draft.q_token_ids} if draft.unread else {}
    if on_device and can_walk_on_device(draft, sampling, inspect):
        pending = walk_on_device(draft, logits, sampling, mode, gen)
        back = StepBuffers(p=p, bonus=pending.bonus, verdicts=pending.verdicts, **unread).read()
        return _filled(draft, back), pending.finish(back), (1.0,) + back.p
    back = StepBuffers(p=p, argmax=logits.argmax(-1) if sampling.greedy else None, **unread).read()
    draft = _filled(draft, back)
    top = list(back.argmax) if sampling.greedy else None
    return draft, walk_tree(draft, logits, sampling, mode, gen, inspect, top=top), (1.0,) + back.p


def read_draft(draft: Draft) -> Draft:
    """A device-grown draft with its tokens and q read now (for a target that takes host tokens)."""
    return _filled(draft, StepBuffers(tokens=draft.token_ids, q=draft.q_token_ids).read())


def _filled(draft: Draft, back: StepReadback) -> Draft:
    return draft.read(list(back.tokens) + list(back.q)) if draft.unread else draft


# ------------------------------------------------------------------ the host walk
def walk_tree(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, mode: str, gen,
              inspect: bool = False, top: list[int] | None = None) -> Walk:
    """Accept a path from the root and draw the bonus token.  logits: [n_nodes, V] target.

    ``inspect`` fills ``Walk.checks`` (same random draws, same result); ``top``: each node's target argmax
    (greedy), where the caller read it back already.
    """
    tree, node, path, verified = draft.tree, 0, [0], set()
    checks: list[NodeCheck] | None = [] if inspect else None
    # One readback of every node's argmax, not one per node on the path (each is a host wait on a GPU).
    if sampling.greedy and top is None:
        top = logits.argmax(-1).tolist()
    while True:
        kids = list(tree.children[node])
        kid_tokens = [draft.tokens[c] for c in kids]
        if sampling.greedy:
            target = top[node]
            idx, bonus_dist = verify_greedy(target, kid_tokens), None
            verified.update(kids if idx is None else kids[: idx + 1])
            if checks is not None:  # the raw softmax, to show how sure each model was
                bonus_dist = warp(logits[node], _DISPLAY)
                checks += greedy_checks(node, kids, kid_tokens, idx, bonus_dist, draft.q.get(node))
        else:
            p = warp(logits[node], sampling)
            events = [] if checks is not None else None
            idx, bonus_dist = (verify_children(p, draft.q.get(node), kid_tokens, mode, gen, events,
                                               n_fixed=draft.n_fixed(node))
                               if kids else (None, p))
            verified.update(kids if idx is None else kids[: idx + 1])
            if checks is not None:
                checks += sampled_checks(node, kids, events or [])
        if idx is None:
            bonus = target if sampling.greedy else sample_token(bonus_dist, gen)
            if checks is not None:
                checks.append(bonus_check(node, tree.n_nodes, bonus, bonus_dist))
            return Walk(path=path, bonus=bonus, verified=verified, checks=checks)
        node = kids[idx]
        path.append(node)


# ------------------------------------------------------------------ the device walk
def can_walk_on_device(draft, sampling: SamplingConfig, inspect: bool) -> bool:
    """True where the device walk applies: T > 0, no inspection, only the draft's own children, q at every parent."""
    if sampling.greedy or inspect or draft.tree.size == 0:
        return False
    if draft.sources is not None and NGRAM in draft.sources:
        return False
    return all(v in draft.q and draft.q[v] is not None for v in range(draft.tree.n_nodes)
               if draft.tree.children[v])


@dataclass(frozen=True)
class WalkLayout:
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
def walk_layout(tree: Tree, device: str) -> WalkLayout:
    rows = tuple(sorted((v for v in range(tree.n_nodes) if tree.children[v]), key=lambda v: -len(tree.children[v])))
    k = len(tree.children[rows[0]])
    row_of = [-1] * tree.n_nodes
    for r, v in enumerate(rows):
        row_of[v] = r
    kids = [list(tree.children[v]) + [v] * (k - len(tree.children[v])) for v in rows]
    up = _upload_fields(torch.device(device), rows=list(rows), row_of=row_of, kids=sum(kids, []),
                        nodes=list(range(tree.n_nodes)))
    return WalkLayout(rows, tuple(row_of), tuple(sum(len(tree.children[v]) > i for v in rows) for i in range(k)),
                      up["rows"], up["row_of"], up["kids"].view(len(rows), k), up["nodes"],
                      max(1, math.ceil(math.log2(tree.depth + 1))))


def _upload_fields(device: torch.device, **lists: list[int]) -> dict[str, torch.Tensor]:
    """Host integer lists on the device in one upload (no host wait), each under its own name.  # [len] int64"""
    up = upload(torch.tensor(sum(lists.values(), []), dtype=torch.long), device)
    out, at = {}, 0
    for name, values in lists.items():
        out[name], at = up[at: at + len(values)], at + len(values)
    return out


@dataclass(frozen=True)
class PendingWalk:
    """The device walk's result, still on the device until the step's readback."""

    tree: Tree
    layout: WalkLayout
    bonus: torch.Tensor               # [1] int64
    verdicts: torch.Tensor            # [R] int64 each row's first accepted slot, -1: none

    def finish(self, back: StepReadback) -> Walk:
        """The walk, as the host walk returns it, retraced from the verdicts read back."""
        tree, row_of = self.tree, self.layout.row_of
        node, path, verified = 0, [0], set()
        while tree.children[node]:
            kids, f = tree.children[node], back.verdicts[row_of[node]]
            verified.update(kids if f < 0 else kids[: f + 1])
            if f < 0:
                break
            node = kids[f]
            path.append(node)
        return Walk(path=path, bonus=back.bonus[0], verified=verified)


def walk_on_device(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, mode: str, gen) -> PendingWalk:
    """One step's walk, queued on the device without a host wait.  logits: [n_nodes, V] target."""
    lay = walk_layout(draft.tree, str(logits.device))
    u = torch.rand(lay.kids_d.shape, generator=gen, device=logits.device)    # [R, k] one uniform per child slot
    verdicts, dist = walk_verdicts(draft, logits, sampling, mode, u)
    # The bonus by the Gumbel-max trick (sample_children, one draw without replacement): exactly a draw from
    # dist, and device work only; torch.multinomial would wait for the device in a walk meant to wait for nothing.
    bonus = sample_children(dist[None], 1, "without_replacement", gen)[0]    # [1]
    return PendingWalk(draft.tree, lay, bonus, verdicts)


def walk_verdicts(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, mode: str,
                  u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The device walk given its uniforms: (each row's first accepted slot or -1 [R], the distribution the
    bonus is drawn from at the path's end [V]).  u: [R, k], one per child slot of :func:`walk_layout`."""
    tree, dev = draft.tree, logits.device
    lay = walk_layout(tree, str(dev))
    tokens = draft.token_ids if draft.token_ids is not None else upload(torch.tensor(draft.tokens), dev)
    q = torch.stack([draft.q[v] for v in lay.rows]).float()                   # [R, V]
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
    return first, dist[0]


# ------------------------------------------------------------------ each node's p
def node_target_probs(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor | None:
    """p of each node's token under its parent's target distribution, root excluded (None: the root alone).
    # [n_nodes - 1] on the device

    Only rows of nodes that have children are warped, and without top-k/top-p
    a token's probability is exp(logit / T - logsumexp): no [rows, V] softmax.
    Queued without a host wait; :func:`verify_tree` reads it back with the walk.
    """
    tree = draft.tree
    if tree.size == 0:
        return None
    cfg = _DISPLAY if sampling.greedy else sampling
    # Chunks bound the [rows, V] float32 copy on a CPU; on a GPU one chunk saves a dozen launches per 32 rows.
    ix = _probs_index(tree, str(logits.device), 256 if logits.device.type == "cuda" else 32)
    tokens = draft.token_ids if draft.token_ids is not None else upload(torch.tensor(draft.tokens), logits.device)
    tok = tokens[ix.nodes]                                                     # [n - 1] by parent row
    pieces = []
    for rows, r, a, b in ix.chunks:
        part, t = logits[rows].float(), tok[a:b]
        if cfg.top_k or cfg.top_p < 1.0:
            pieces.append(warp(part, cfg)[r, t])
        else:
            part = part / cfg.temperature
            pieces.append(torch.exp(part[r, t] - torch.logsumexp(part, -1)[r]))
    out = torch.empty(tree.size, dtype=torch.float32, device=logits.device)
    out[ix.order] = torch.cat(pieces).float()
    return out


@dataclass(frozen=True)
class _ProbsIndex:
    """Where each node's probability is read: parent rows in chunks, nodes grouped by them (device tensors)."""

    nodes: torch.Tensor                                            # [n - 1] nodes, by parent row
    order: torch.Tensor                                            # [n - 1] their places in the output (node - 1)
    chunks: tuple[tuple[torch.Tensor, torch.Tensor, int, int], ...]   # (parent rows, row of each node, a, b)


@lru_cache(maxsize=64)
def _probs_index(tree: Tree, device: str, size: int) -> _ProbsIndex:
    # Worked out on the host once per tree shape: boolean masks or a unique on the device would each wait.
    rows_list = sorted(set(tree.parents[1:]))
    row_of = {p: i for i, p in enumerate(rows_list)}
    order = sorted(range(tree.size), key=lambda j: row_of[tree.parents[j + 1]])   # nodes - 1, by parent row
    inv_sorted = [row_of[tree.parents[j + 1]] for j in order]
    dev = torch.device(device)
    chunks = []
    for lo in range(0, len(rows_list), size):
        a, b = bisect.bisect_left(inv_sorted, lo), bisect.bisect_left(inv_sorted, lo + size)
        host = torch.tensor([v - lo for v in inv_sorted[a:b]], dtype=torch.long)
        chunks.append((upload(torch.tensor(rows_list[lo: lo + size], dtype=torch.long), dev), upload(host, dev), a, b))
    up = _upload_fields(dev, nodes=[j + 1 for j in order], order=order)
    return _ProbsIndex(up["nodes"], up["order"], tuple(chunks))
