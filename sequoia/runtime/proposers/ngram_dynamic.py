"""``sequoia-ngram``: copied branches anywhere in the draft model's dynamic tree, under one cost model.

The draft model's dynamic tree (:class:`~sequoia.runtime.proposers.dynamic.DynamicTreeProposer`)
and the copies (priced as in :mod:`sequoia.runtime.proposers.ngram_proposer`) grow in one
tree, copies anywhere in it: below a draft node v with path tokens x_1..x_k,
the tail of context + x_1..x_k is looked up (:meth:`NgramIndex.lookup`,
``extra=``) and its continuations are grafted under v, priced the same way
with f scaled by f(v).  Lookups are bounded: only the level's draft nodes
chosen for a draft forward or the best by f, at most ``lookups`` a step, and
only matches of at least ``min_match_below`` tokens.  The dynamic tree's
decisions count the copied nodes' width and expected tokens, and price the
draft's children of a node behind its copies: a drawn token's calibrated
acceptance is read at the draft's own probability of it (q without the
copied tokens, times what they leave) and at its rank behind them.  Priced
as if first, the draft's second choice under a copy it agrees with looked
likely and drew chains of up to 23 draft levels that could not be reached;
on five edit prompts (256 tokens, T=0, AVX-512-BF16 CPU) this pricing took
the draft's time from 36.1 to 29.0 s and the run from 145 to 127 s.  When
its gate says the draft does not pay, the step keeps the root's copies
alone (no draft forward).

Losslessness: at every node, copied children are fixed proposals, listed
first among their parent's children and verified as point masses; the
draft's children of the same node are drawn from q without the copied
tokens (so no token appears twice among a node's children), and drawn
slots of zero probability (fillers, which verification skips) are dropped.
:func:`sequoia.core.verification.sampling.verify_children` (``n_fixed``) states the rule
and the argument; the engine takes n_fixed per node from the sources
(:meth:`Draft.n_fixed`).  Which copies a node gets depends only on the
context and the node's path, never on the node's own children's draws.
Copied nodes are never forwarded by the draft, so they have copied children
only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import torch

from ...core.ngrams.ngram import NgramTrie
from ...core.ngrams.ngram_acceptance import RequestAcceptance, ngram_prior
from ...core.statistics.trace import DRAFT, NGRAM, ROOT, StepRecord
from ...core.trees.tree import Tree
from ...core.verification.sampling import without_tokens
from ..drafter import Draft, Drafter
from .dynamic import DynamicTreeProposer, _Growth
from .ngram_proposer import (Accept, NgramSettings, choose_copies, copies_alone, copies_can_pay, copies_draft, pricing,
                             trie_acceptance)


@dataclass
class _Graft:
    """Chosen trie nodes hanging below one node of the tree (the root or a draft node)."""

    anchor: int                     # tree node the trie's root stands for
    trie: NgramTrie
    chosen: list[int]               # trie nodes, breadth-first
    f: list[float]                  # [trie nodes] estimated acceptance, the anchor's f included
    node_of: dict[int, int]         # trie node -> tree node (filled as levels are added)

    def at(self, rel_depth: int) -> list[int]:
        return [v for v in self.chosen if self.trie.depths[v] == rel_depth]


@dataclass
class _Step:
    """One step's tree under construction: the dynamic tree's growth plus who proposed each node."""

    g: _Growth
    raw_q: dict[int, torch.Tensor]              # forwarded node -> [V] q (verification removes the copies itself)
    sources: list[str]                          # [n_nodes]
    match_len: list[int]                        # [n_nodes] 0 unless copied
    grafts: list[_Graft] = field(default_factory=list)
    copies_left: int = 0
    lookups_left: int = 0

    def pending(self) -> tuple[int, float]:
        """Chosen copies not yet in the tree: how many and their sum of f."""
        n, f = 0, 0.0
        for gr in self.grafts:
            for v in gr.chosen:
                if v not in gr.node_of:
                    n, f = n + 1, f + gr.f[v]
        return n, f

    def deepest(self) -> int:
        return max((self.g.depths[gr.anchor] + gr.trie.depths[v] for gr in self.grafts for v in gr.chosen),
                   default=0)


@dataclass
class NgramDynamicProposer(DynamicTreeProposer):
    """``sequoia-ngram``: copied branches anywhere in the draft model's dynamic tree, one cost model."""

    # Matches of one token are left to the draft model here: on held-out code (AVX-512-BF16 CPU, T=0.6)
    # they took the draft's likely tokens as copies and the steps made 4.9 tokens instead of 5.8.
    settings: NgramSettings = field(default_factory=lambda: NgramSettings(min_ngram=2))
    accept: Accept = ngram_prior        # acceptance of a copied token by (match length, depth)
    name: str = "sequoia-ngram"
    adapt: bool = True                  # scale ``accept`` by the request's own outcomes (RequestAcceptance)

    _PRICED = DynamicTreeProposer._PRICED + ("copies_can_pay",)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._index = self.settings.index()
        self._root_cache: tuple[tuple, NgramTrie] | None = None
        self._priced = pricing(self.accept, self.adapt)

    def start(self) -> None:
        super().start()
        self._index = self.settings.index()
        self._root_cache = None
        self._priced = pricing(self.accept, self.adapt)

    def wants_draft(self) -> bool:
        """Copies are cheap to find (a step without any is a plain target step anyway): the price gate's decision
        is taken here (its plain steps are root-only proposals) and wants_draft_model asks the rest; only where
        neither the draft model nor copies can pay (:func:`copies_can_pay`) is the step plain before any lookup."""
        self._decide_price()
        return self._priced_plain or self.can_pay or self.copies_can_pay

    @cached_property
    def copies_can_pay(self) -> bool:
        """Whether copies alone could beat the target alone by ``min_gain`` at these prices, as :attr:`can_pay` asks
        of the draft (a smaller gain is within the cost model's error); cleared with it when the prices change."""
        return copies_can_pay(self.profile, self.settings.budget, self.min_gain)

    def observe(self, record: StepRecord) -> None:
        super().observe(record)
        if isinstance(self._priced, RequestAcceptance):
            self._priced.observe(record)
        # Keep the index current between steps, so wants_draft_model can look the copies up before the draft
        # runs (propose syncs with the drafter's context anyway, which also catches a missed step).
        if len(self._index):
            self._index.extend(record.new_tokens)

    def wants_draft_model(self) -> bool:
        """The dynamic tree's gate decides whether the draft model runs, and copies alone win when they do better.

        Copies alone (no draft forward at all) are priced by the cost model; the draft-model steps by the
        gate's running average of their tokens (copies included) per predicted ms.  Where the copies are
        predicted to yield more per ms (a long match, the output quoting its input), the step verifies them
        alone and saves every draft forward.  The choice depends on the committed context only, never on
        this step's draws, so verification stays exact.
        """
        if self._priced_plain:
            return False
        draft_ok = self._predicted_draft()
        if not draft_ok or not len(self._index) or self._gate.ms <= 0.0:
            return draft_ok
        trie = self._root_trie()
        if trie.size == 0:
            return True
        _, copies_rate = copies_alone(trie, self.profile, self.settings, self.max_depth, self._priced)
        return copies_rate <= self._gate.tokens / self._gate.ms

    def _root_trie(self) -> NgramTrie:
        """The context's own continuations, looked up once per context (wants_draft_model, then propose)."""
        key = (len(self._index), tuple(self._index.tokens[-self.settings.max_ngram:]))  # the tail a lookup matches
        if self._root_cache is None or self._root_cache[0] != key:
            self._root_cache = (key, self._index.lookup(self.settings.length, self.settings.max_branches))
        return self._root_cache[1]

    @property
    def max_nodes(self) -> int:
        return self.budget + self.settings.budget + 1

    def propose(self, drafter: Drafter, generator) -> Draft:
        if self._priced_plain:
            return self._priced_plain_draft(drafter)
        s = replace(self.settings, budget=self._step_budget(self.settings.budget))
        self._index.sync(drafter.context)
        trie = self._root_trie()
        if drafter.root_q is None:  # the gate skipped the draft model: copies alone
            chosen, _ = copies_alone(trie, self.profile, s, self.max_depth, self._priced)
            return copies_draft(drafter.root_token, trie, chosen)
        g = _Growth(parents=[-1], depths=[0], tokens=[drafter.root_token], q_token=[1.0], f=[1.0],
                    q={0: drafter.root_q}, budget=self._step_budget(self.budget))
        st = _Step(g=g, raw_q={0: drafter.root_q}, sources=[ROOT], match_len=[0], copies_left=s.budget,
                   lookups_left=s.lookups)
        self._graft(st, 0, trie, (1,))
        frontier = [0]
        for depth in range(1, self.max_depth + 1):
            level = self._grow_level(st, depth, frontier, drafter, generator)
            frontier = []
            if level and depth < self.max_depth and g.size < g.budget:
                frontier = self._choose_expansion(g, level)
            if level and depth < self.max_depth:
                self._graft_below(st, level, frontier)
            if frontier:
                rows = drafter.expand(frontier, g.parents, g.depths, g.tokens)
                st.raw_q.update(zip(frontier, rows))
                g.q.update(zip(frontier, rows))
                g.widths.append(len(frontier))
            if not frontier and depth >= st.deepest():
                break
        tree = Tree(tuple(g.parents))
        q = {v: st.raw_q[v] for v in range(tree.n_nodes) if tree.children[v] and v in st.raw_q}
        return Draft(tree=tree, tokens=g.tokens, q=q, q_token=g.q_token, dynamic=self._annotate(tree, g),
                     sources=tuple(st.sources), match_len=tuple(st.match_len))

    # ------------------------------------------------------------------ one level
    def _grow_level(self, st: _Step, depth: int, frontier: list[int], drafter: Drafter, generator) -> list[int]:
        """Add the level's copies, then the draft's children of ``frontier``; return the new draft nodes."""
        g = st.g
        start = len(g.parents)
        fixed: dict[int, list[int]] = {}          # tree node -> its copied children's tokens
        for gr in st.grafts:
            for v in gr.at(depth - g.depths[gr.anchor]):
                parent = gr.node_of[gr.trie.parents[v]]
                tok = gr.trie.tokens[v]
                q_par = st.raw_q.get(parent)
                gr.node_of[v] = g.add(parent, tok, float(q_par[tok]) if q_par is not None else 0.0, gr.f[v])
                st.sources.append(NGRAM)
                st.match_len.append(gr.trie.match_len[v])
                fixed.setdefault(parent, []).append(tok)
        for u in frontier:  # the draft's children are drawn from q without the copied tokens (merge)
            toks = torch.tensor(fixed.get(u, []), dtype=torch.long, device=st.raw_q[u].device)
            g.q[u] = without_tokens(st.raw_q[u], toks)
            if len(toks):  # ... and priced behind them (DynamicTreeProposer._add_children)
                g.held[u] = (float(st.raw_q[u][toks].sum()), len(toks))
        level = (self._add_children(g, frontier, drafter, generator)
                 if frontier and g.size < g.budget else [])
        st.sources += [DRAFT] * len(level)
        st.match_len += [0] * len(level)
        return self._order_level(st, start)

    def _order_level(self, st: _Step, start: int) -> list[int]:
        """Renumber the level from ``start`` breadth-first: by parent, copies first, draws in order.

        Drawn slots of probability 0 (fillers: q had fewer tokens than slots) are dropped; they could
        repeat a copied token and verification would skip them anyway.  Nothing refers to the level's
        nodes yet except the grafts' maps, remapped here.  Returns the level's draft nodes.
        """
        g = st.g
        old = [v for v in range(start, len(g.parents)) if st.sources[v] == NGRAM or g.q_token[v] > 0.0]
        old.sort(key=lambda v: (g.parents[v], st.sources[v] != NGRAM, v))
        new_of = {v: start + i for i, v in enumerate(old)}
        for seq in (g.parents, g.depths, g.tokens, g.q_token, g.f, st.sources, st.match_len):
            seq[start:] = [seq[v] for v in old]
        for gr in st.grafts:
            gr.node_of = {t: new_of.get(v, v) for t, v in gr.node_of.items()}
        return [v for v in range(start, len(g.parents)) if st.sources[v] == DRAFT]

    # ------------------------------------------------------------------ copies
    def _graft(self, st: _Step, anchor: int, trie: NgramTrie, widths: tuple[int, ...]) -> None:
        """Choose copies of ``trie`` below ``anchor`` under the cost model; they join the tree level by level."""
        if trie.size == 0 or st.copies_left <= 0:
            return
        g = st.g
        n_pend, f_pend = st.pending()
        chosen = choose_copies(trie, self.profile, widths, st.copies_left, self.max_depth - g.depths[anchor],
                               self._priced, scale=g.f[anchor], base_tokens=1.0 + sum(g.f[1:]) + f_pend,
                               base_nodes=g.size + 1 + n_pend)
        if chosen:
            f = [g.f[anchor] * x for x in trie_acceptance(trie, self._priced)]
            st.grafts.append(_Graft(anchor=anchor, trie=trie, chosen=chosen, f=f, node_of={0: anchor}))
            st.copies_left -= len(chosen)

    def _graft_below(self, st: _Step, level: list[int], frontier: list[int]) -> None:
        """Look up continuations of the paths of the level's most promising draft nodes (forwarded ones first)."""
        s, g = self.settings, st.g
        widths = tuple(g.widths) + ((len(frontier),) if frontier else ())
        chosen = set(frontier)
        for v in sorted(level, key=lambda v: (v not in chosen, -g.f[v], v)):
            if st.lookups_left <= 0 or st.copies_left <= 0:
                return
            st.lookups_left -= 1
            path = [g.tokens[u] for u in _path(g.parents, v)[1:]]
            trie = self._index.lookup(s.length, s.max_branches, extra=path, min_match=s.min_match_below)
            self._graft(st, v, trie, widths)


def _path(parents: list[int], v: int) -> list[int]:
    """Root-to-v node indices."""
    out = [v]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return out[::-1]
