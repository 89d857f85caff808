"""Trees with copied branches: ``ngram`` (copies only, no draft model) and ``sequoia-ngram`` (copies + dynamic tree).

Each step the context (prompt and text so far) is matched against itself
(:mod:`sequoia.core.ngram`) and the candidate continuations form a trie at
the root.  A copied node costs no draft forward but widens the target's
verification, so both methods price it with the one cost model
(:func:`sequoia.core.cost.step_ms`): trie nodes are taken best-first by their
estimated acceptance f(v) = product along the path of
:func:`~sequoia.core.ngram.ngram_prior` (match length, depth), as many as
maximise (1 + sum f) / step_ms.  ``sequoia-ngram`` then grows the draft
model's dynamic tree (:class:`~sequoia.runtime.dynamic.DynamicTreeProposer`)
on top, whose decisions already count the copied nodes' width and expected
tokens; when its gate says the draft does not pay, the step keeps the copies
alone (no draft forward).

Losslessness: copied children are fixed proposals, listed first among their
parent's children and verified as point masses; the draft's children of the
same node are drawn from q without the copied tokens (never a duplicate).
:func:`sequoia.core.sampling.verify_children` (``n_fixed``) states the rule
and the argument.  Copied nodes are never forwarded by the draft, so they
have no draft children (only copied ones) in this version.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..core import cost
from ..core.ngram import NgramIndex, NgramTrie, ngram_prior
from ..core.profile import HardwareProfile
from ..core.sampling import without_tokens
from ..core.trace import DRAFT, NGRAM, ROOT
from ..core.tree import Tree
from .drafter import Draft, Drafter, Proposer
from .dynamic import DynamicTreeProposer, _Growth


@dataclass(frozen=True)
class NgramSettings:
    """How the context is searched; validated once here."""

    length: int = 8            # longest copied continuation (tokens)
    max_branches: int = 4      # distinct continuations per step
    max_ngram: int = 4         # match lengths tried, longest first
    min_ngram: int = 1
    budget: int = 16           # most copied nodes per step

    def __post_init__(self) -> None:
        for name in ("length", "max_branches", "max_ngram", "min_ngram", "budget"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ngram {name} must be a positive integer, got {v!r}")
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"ngram min_ngram ({self.min_ngram}) exceeds max_ngram ({self.max_ngram})")

    def index(self) -> NgramIndex:
        return NgramIndex(max_n=self.max_ngram, min_n=self.min_ngram)


def trie_acceptance(trie: NgramTrie) -> list[float]:
    """Estimated acceptance f(v) of every trie node (root: 1).  # [n_nodes]"""
    f = [1.0] * len(trie.parents)
    for v in range(1, len(trie.parents)):
        f[v] = f[trie.parents[v]] * ngram_prior(trie.match_len[v], trie.depths[v])
    return f


def choose_copies(trie: NgramTrie, profile: HardwareProfile, widths: tuple[int, ...], budget: int,
                  max_depth: int) -> list[int]:
    """Trie nodes worth verifying (sorted, so in breadth-first order): the best-first prefix maximising E / ms.

    ``widths``: the draft forwards the step pays anyway (() without the draft model).  f falls along a
    path and ties go to the shallower node, so the best-first prefix holds every chosen node's parent.
    """
    f = trie_acceptance(trie)
    cand = [v for v in range(1, len(trie.parents)) if trie.depths[v] <= max_depth]
    order = sorted(cand, key=lambda v: (-f[v], trie.depths[v], v))[:budget]
    gains = np.concatenate([[0.0], np.cumsum([f[v] for v in order])])            # [J+1]
    ms = np.array([cost.step_ms(profile, widths, j + 1) for j in range(len(gains))])
    best = int(np.argmax((1.0 + gains) / ms))
    return sorted(order[:best])


def copies_draft(root_token: int, trie: NgramTrie, chosen: list[int]) -> Draft:
    """A tree of copied nodes only (no q anywhere: nothing was drafted)."""
    new_of = {0: 0}
    parents, tokens = [-1], [root_token]
    for v in chosen:
        new_of[v] = len(parents)
        parents.append(new_of[trie.parents[v]])
        tokens.append(trie.tokens[v])
    n = len(parents)
    return Draft(tree=Tree(tuple(parents)), tokens=tokens, q={}, q_token=[1.0] + [0.0] * (n - 1),
                 sources=(ROOT,) + (NGRAM,) * (n - 1))


@dataclass
class NgramProposer(Proposer):
    """``ngram``: copied continuations only; the draft model is never run."""

    profile: HardwareProfile
    settings: NgramSettings = field(default_factory=NgramSettings)
    max_depth: int = 16
    mode: str = "without_replacement"   # unused: every child is a fixed proposal
    name: str = "ngram"

    def __post_init__(self) -> None:
        self._index = self.settings.index()

    def start(self) -> None:
        self._index = self.settings.index()

    def wants_draft_model(self) -> bool:
        return False

    @property
    def max_nodes(self) -> int:
        return self.settings.budget + 1

    def propose(self, drafter: Drafter, generator) -> Draft:
        self._index.sync(drafter.context)
        trie = self._index.lookup(self.settings.length, self.settings.max_branches)
        chosen = choose_copies(trie, self.profile, (), self.settings.budget, self.max_depth)
        return copies_draft(drafter.root_token, trie, chosen)


@dataclass
class NgramDynamicProposer(DynamicTreeProposer):
    """``sequoia-ngram``: copied branches at the root plus the draft model's dynamic tree, one cost model."""

    settings: NgramSettings = field(default_factory=NgramSettings)
    name: str = "sequoia-ngram"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._index = self.settings.index()

    def start(self) -> None:
        super().start()
        self._index = self.settings.index()

    def wants_draft(self) -> bool:
        return True  # copies are free to find; a step without any is a plain target step anyway

    def wants_draft_model(self) -> bool:
        return super().wants_draft()  # the dynamic tree's gate decides whether the draft model runs

    @property
    def max_nodes(self) -> int:
        return self.budget + self.settings.budget + 1

    def propose(self, drafter: Drafter, generator) -> Draft:
        self._index.sync(drafter.context)
        trie = self._index.lookup(self.settings.length, self.settings.max_branches)
        if drafter.root_q is None:  # the gate skipped the draft model: copies alone
            return copies_draft(drafter.root_token, trie, choose_copies(trie, self.profile, (),
                                                                        self.settings.budget, self.max_depth))
        chosen = choose_copies(trie, self.profile, (1,), self.settings.budget, self.max_depth)
        f = trie_acceptance(trie)
        by_depth: dict[int, list[int]] = {}
        for v in chosen:
            by_depth.setdefault(trie.depths[v], []).append(v)
        first = torch.tensor([trie.tokens[v] for v in by_depth.get(1, [])], dtype=torch.long,
                             device=drafter.root_q.device)
        # The draft's children of the root are drawn from q without the copied tokens (sampling.verify_children).
        g = _Growth(parents=[-1], depths=[0], tokens=[drafter.root_token], q_token=[1.0], f=[1.0],
                    q={0: without_tokens(drafter.root_q, first)})
        node_of = {0: 0}
        sources = [ROOT]
        frontier = [0]
        deepest = max(by_depth, default=0)
        for depth in range(1, self.max_depth + 1):
            # Copies first: their parents (copies one level up, or the root) precede the draft's nodes.
            for v in by_depth.get(depth, []):
                q_tok = float(drafter.root_q[trie.tokens[v]]) if depth == 1 else 0.0
                node_of[v] = g.add(node_of[trie.parents[v]], trie.tokens[v], q_tok, f[v])
                sources.append(NGRAM)
            level = (self._add_children(g, frontier, drafter, generator)
                     if frontier and g.size < self.budget else [])
            sources += [DRAFT] * len(level)
            frontier = []
            if level and depth < self.max_depth and g.size < self.budget:
                frontier = self._choose_expansion(g, level)
                if frontier:
                    rows = drafter.expand(frontier, g.parents, g.depths, g.tokens)
                    g.q.update(zip(frontier, rows))
                    g.widths.append(len(frontier))
            if not frontier and depth >= deepest:
                break
        tree = Tree(tuple(g.parents))
        q = {v: g.q[v] for v in range(tree.n_nodes) if tree.children[v] and v in g.q}
        q[0] = drafter.root_q   # verification removes the copied tokens itself
        return Draft(tree=tree, tokens=g.tokens, q=q, q_token=g.q_token, dynamic=self._annotate(tree, g),
                     sources=tuple(sources))
