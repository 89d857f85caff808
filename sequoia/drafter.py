"""The draft side of one step: grow a token tree level by level.

:class:`Drafter` owns the draft model's KV cache.  Each step it first feeds
the committed tokens the draft has not seen (the last step's accepted tail
and bonus), then forwards one *level* of the tree at a time with a tree
attention mask, so a tree of depth d costs d draft forwards however wide it is.
Leaves of the last level are never forwarded: nothing is drafted after them.

A :class:`Proposer` decides the tree shape (static trees take it from a
:class:`~sequoia.tree.Tree`; dynamic policies decide as they go) and returns a
:class:`Draft`: the tree, its tokens and the draft distribution q at every
node that has children.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .config import SamplingConfig
from .kv_cache import KVCache
from .masks import tree_attention_mask
from .sampling import sample_children, warp
from .tree import Tree


@dataclass
class Draft:
    tree: Tree
    tokens: list[int]                 # [n_nodes]; tokens[0] is the root
    q: dict[int, torch.Tensor]        # node -> [V] draft distribution over that node's children
    q_token: list[float]              # [n_nodes] q of each node's token under its parent (root: 1.0)
    extra: dict = field(default_factory=dict)


class Proposer(Protocol):
    name: str
    mode: str  # sampling mode used at temperature > 0 (see sequoia.sampling)

    def propose(self, drafter: "Drafter", generator: torch.Generator | None) -> Draft: ...


class Drafter:
    def __init__(self, model, sampling: SamplingConfig, vocab_size: int) -> None:
        self.model = model
        self.sampling = sampling
        self.vocab_size = vocab_size
        self.cache = KVCache(model.config)
        self.device = next(model.parameters()).device
        self._slots: dict[int, int] = {}  # node -> cache position, this step
        self._base = 0                    # cache length before the step's tree nodes
        self._root_pos = 0                # absolute position of the root token
        self.root_token = 0
        self.root_q: torch.Tensor | None = None  # [V] set by begin()

    # ---------------------------------------------------------------- step API
    def begin(self, committed: list[int]) -> torch.Tensor:
        """Feed committed tokens the cache lacks; return q at the root.  # [V]"""
        start = len(self.cache)
        pending = committed[start:]
        if not pending:
            raise RuntimeError("drafter: the root token must not be cached yet")
        ids = torch.tensor([pending], dtype=torch.long, device=self.device)
        pos = torch.arange(start, start + len(pending), device=self.device)[None]
        logits = self._forward(ids, pos, None)[0, -1]
        self._root_pos = len(committed) - 1
        self._base = len(self.cache)
        self._slots = {0: self._base - 1}
        self.root_token = committed[-1]
        self.root_q = self.probs(logits[None])[0]
        return self.root_q

    def expand(self, tree: Tree, nodes: list[int], tokens: list[int]) -> torch.Tensor:
        """Forward ``nodes`` (whose ancestors are cached); return their q.  # [len(nodes), V]"""
        start = len(self.cache)
        ids = torch.tensor([[tokens[v] for v in nodes]], dtype=torch.long, device=self.device)
        pos = torch.tensor([[self._root_pos + tree.depths[v] for v in nodes]], device=self.device)
        for j, v in enumerate(nodes):
            self._slots[v] = start + j
        mask = self._level_mask(tree, nodes, start)
        logits = self._forward(ids, pos, mask)[0]
        return self.probs(logits)

    def commit(self, path: list[int]) -> None:
        """Compact the cache to the accepted path (nodes the draft forwarded)."""
        keep = [self._slots[v] for v in path[1:] if v in self._slots]
        self.cache.keep(self._base, keep)

    def reset(self) -> None:
        self.cache.reset()

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft distributions; at temperature 0 the raw softmax (children are its top-k)."""
        logits = logits[..., : self.vocab_size]
        if self.sampling.greedy:
            return torch.softmax(logits.float(), dim=-1)
        return warp(logits, self.sampling)

    def sample(self, q: torch.Tensor, k: int, mode: str, generator) -> torch.Tensor:
        """Children tokens for each row of q.  # [m, k]"""
        return sample_children(q, k, "topk" if self.sampling.greedy else mode, generator)

    # ---------------------------------------------------------------- internals
    def _level_mask(self, tree: Tree, nodes: list[int], start: int) -> torch.Tensor:
        # Each new node sees the committed prefix (incl. root) and its own ancestors' slots.
        total = start + len(nodes)
        allowed = torch.zeros(len(nodes), total, dtype=torch.bool)
        allowed[:, : self._base] = True
        for j, v in enumerate(nodes):
            for a in tree.path(v)[1:]:
                allowed[j, self._slots[a]] = True
        return tree_attention_mask(allowed, self.model.dtype, self.device)

    @torch.inference_mode()
    def _forward(self, ids, pos, mask) -> torch.Tensor:
        out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask,
                         past_key_values=self.cache.cache, use_cache=True)
        return out.logits


@dataclass
class StaticTreeProposer:
    """Grows a fixed tree shape: chains, k-ary, SpecInfer, DP-optimal, from file."""

    tree: Tree
    mode: str = "without_replacement"
    name: str = "sequoia"

    def propose(self, drafter: Drafter, generator) -> Draft:
        tree = self.tree
        tokens = [drafter.root_token] + [0] * tree.size
        q: dict[int, torch.Tensor] = {0: drafter.root_q}
        q_token = [1.0] * tree.n_nodes
        for depth, level in enumerate(tree.levels[:-1]):
            parents = [v for v in level if tree.children[v]]
            if depth > 0:
                rows = drafter.expand(tree, parents, tokens)
                q.update(zip(parents, rows))
            k = max(len(tree.children[v]) for v in parents)
            drawn = drafter.sample(torch.stack([q[v] for v in parents]), k, self.mode, generator)
            _assign_children(tree, parents, drawn, q, tokens, q_token)
        return Draft(tree=tree, tokens=tokens, q=q, q_token=q_token)


def _assign_children(tree, parents, drawn, q, tokens, q_token) -> None:
    drawn_list = drawn.tolist()
    for row, v in enumerate(parents):
        kids = tree.children[v]
        toks = drawn_list[row][: len(kids)]
        probs = q[v][drawn[row, : len(kids)]].tolist()
        for c, t, pr in zip(kids, toks, probs):
            tokens[c] = t
            q_token[c] = pr
