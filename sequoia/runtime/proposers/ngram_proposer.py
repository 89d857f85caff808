"""Copied continuations of the context as a tree: ``ngram`` (copies only, no draft model), and the pricing
of copies that ``sequoia-ngram`` (:mod:`sequoia.runtime.proposers.ngram_dynamic`) shares.

Each step the context (prompt and text so far) is matched against itself
(:mod:`sequoia.core.ngrams.ngram`) and the candidate continuations form a trie at
the root.  A copied node costs no draft forward but widens the target's
verification, so both methods price it with the one cost model
(:func:`sequoia.core.profiles.cost.step_ms`): trie nodes are taken best-first by their
estimated acceptance f(v) = product along the path of ``accept(match length,
depth)`` (default :func:`~sequoia.core.ngrams.ngram_acceptance.ngram_prior`), as many as
maximise (1 + sum f) / step_ms.  During a request, ``accept`` is scaled by how
the request's own copies have fared (:class:`~sequoia.core.ngrams.ngram_acceptance.RequestAcceptance`,
``adapt=True``): a table cannot tell an answer that quotes its passage from
fresh code.

Losslessness: copied nodes are fixed proposals, verified as point masses
(:func:`sequoia.core.verification.sampling.verify_children`, ``n_fixed``; the engine takes
n_fixed per node from the sources, :meth:`Draft.n_fixed`), and which copies a
step proposes depends only on the context, never on a draw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ...core.ngrams.ngram import NgramIndex, NgramTrie
from ...core.ngrams.ngram_acceptance import RequestAcceptance, ngram_prior
from ...core.profiles import cost
from ...core.profiles.profile import HardwareProfile
from ...core.statistics.trace import NGRAM, ROOT, StepRecord
from ...core.trees.tree import Tree
from ..drafter import Draft, Drafter, Proposer
from .dynamic import MAX_DEPTH
from .price import PLAIN, PriceGate, PriceSettings

#: accept(match_len, depth) -> probability that a copied token is accepted given its parent was.
Accept = Callable[[int, int], float]


@dataclass(frozen=True)
class NgramSettings:
    """How the context is searched; validated once here."""

    # Long copies cost verification width only, and the cost model takes as many as pay: on five edit prompts
    # (256 tokens, T=0, AVX-512-BF16 CPU) 24 / 32 took 215 target calls where 8 / 16 took 231.
    length: int = 24           # longest copied continuation (tokens)
    max_branches: int = 4      # distinct continuations per lookup
    max_ngram: int = 4         # match lengths tried, longest first
    min_ngram: int = 1
    budget: int = 32           # most copied nodes per step
    lookups: int = 8           # most lookups below draft nodes per step
    min_match_below: int = 2   # shortest match worth grafting below a draft node

    def __post_init__(self) -> None:
        for name in ("length", "max_branches", "max_ngram", "min_ngram", "budget", "lookups", "min_match_below"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ngram {name} must be a positive integer, got {v!r}")
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"ngram min_ngram ({self.min_ngram}) exceeds max_ngram ({self.max_ngram})")

    def index(self) -> NgramIndex:
        return NgramIndex(max_n=self.max_ngram, min_n=self.min_ngram)


def trie_acceptance(trie: NgramTrie, accept: Accept = ngram_prior) -> list[float]:
    """Estimated acceptance f(v) of every trie node relative to its root (root: 1).  # [n_nodes]"""
    f = [1.0] * len(trie.parents)
    for v in range(1, len(trie.parents)):
        f[v] = f[trie.parents[v]] * accept(trie.match_len[v], trie.depths[v])
    return f


def choose_copies(trie: NgramTrie, profile: HardwareProfile, widths: tuple[int, ...], budget: int,
                  max_depth: int, accept: Accept = ngram_prior, scale: float = 1.0,
                  base_tokens: float = 1.0, base_nodes: int = 1) -> list[int]:
    """Trie nodes worth verifying (sorted, so in breadth-first order): the best-first prefix maximising E / ms.

    ``widths``: the draft forwards the step pays anyway (() without the draft model).  The trie hangs
    below a node of estimated acceptance ``scale`` in a tree already holding ``base_nodes`` nodes
    (root included) expected to yield ``base_tokens``.  Ties go to the shallower node; a node whose
    parent was not chosen is dropped (f falls along a path when accept <= 1, so that only guards
    odd ``accept`` callables).
    """
    f = trie_acceptance(trie, accept)
    cand = [v for v in range(1, len(trie.parents)) if trie.depths[v] <= max_depth]
    order = sorted(cand, key=lambda v: (-f[v], trie.depths[v], v))[:max(budget, 0)]
    gains = np.concatenate([[0.0], np.cumsum([scale * f[v] for v in order])])   # [J+1]
    ms = np.array([cost.step_ms(profile, widths, base_nodes + j) for j in range(len(gains))])
    best = int(np.argmax((base_tokens + gains) / ms))
    kept = {0}
    for v in sorted(order[:best]):
        if trie.parents[v] in kept:
            kept.add(v)
    return sorted(kept - {0})


def copies_alone(trie: NgramTrie, profile: HardwareProfile, settings: NgramSettings, max_depth: int,
                 accept: Accept = ngram_prior) -> tuple[list[int], float]:
    """The copies a step without the draft model verifies, and their predicted tokens per ms."""
    chosen = choose_copies(trie, profile, (), settings.budget, max_depth, accept)
    f = trie_acceptance(trie, accept)
    return chosen, (1.0 + sum(f[v] for v in chosen)) / cost.step_ms(profile, (), len(chosen) + 1)


def copies_can_pay(profile: HardwareProfile, budget: int, min_gain: float = 0.0) -> bool:
    """Whether copies alone could pay under ``profile``: some j <= ``budget`` copies, each surely accepted (every
    estimate is at most 1), beat the root alone by more than ``min_gain``.  With ``min_gain`` 0 this bounds
    :func:`choose_copies`; where none can (verifying j + 1 tokens costs about j + 1 plain steps, as on a
    compute-bound CPU), a step needs no lookup at all."""
    one = cost.step_ms(profile, (), 1)
    return any((1 + j) / cost.step_ms(profile, (), 1 + j) > (1.0 + min_gain) / one for j in range(1, budget + 1))


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
                 sources=(ROOT,) + (NGRAM,) * (n - 1),
                 match_len=(0,) + tuple(trie.match_len[v] for v in chosen))


@dataclass
class NgramProposer(Proposer):
    """``ngram``: copied continuations only; the draft model is never run."""

    profile: HardwareProfile
    settings: NgramSettings = field(default_factory=NgramSettings)
    max_depth: int = MAX_DEPTH
    accept: Accept = ngram_prior        # acceptance of a copied token by (match length, depth)
    mode: str = "without_replacement"   # unused: every child is a fixed proposal
    name: str = "ngram"
    adapt: bool = True                  # scale ``accept`` by the request's own outcomes (RequestAcceptance)
    price: PriceSettings | None = None  # judge steps by their measured cost (sequoia.runtime.proposers.price); None: don't

    def __post_init__(self) -> None:
        self._price = PriceGate(self.profile, self.price) if self.price is not None else None
        self._copies_pay = copies_can_pay(self.profile, self.settings.budget)
        self.start()

    def start(self) -> None:
        self._index = self.settings.index()
        self._priced = pricing(self.accept, self.adapt)
        if self._price is not None:
            self._price.start()

    def observe(self, record: StepRecord) -> None:
        if isinstance(self._priced, RequestAcceptance):
            self._priced.observe(record)
        if self._price is not None:
            self._price.observe(record)

    def wants_draft(self) -> bool:
        """False while the price gate keeps to the target alone (copies verified cost more than they gave), and
        where no copies can pay under the profile (no lookup either)."""
        if not self._copies_pay:
            return False
        return self._price is None or self._price.decide().level != PLAIN

    def wants_draft_model(self) -> bool:
        return False

    @property
    def max_nodes(self) -> int:
        return self.settings.budget + 1

    def propose(self, drafter: Drafter, generator) -> Draft:
        self._index.sync(drafter.context)
        trie = self._index.lookup(self.settings.length, self.settings.max_branches)
        settings = self.settings
        if self._price is not None:   # the price gate's small level: fewer copies
            settings = replace(settings, budget=self._price.budget(settings.budget))
        chosen, _ = copies_alone(trie, self.profile, settings, self.max_depth, self._priced)
        return copies_draft(drafter.root_token, trie, chosen)


def pricing(accept: Accept, adapt: bool) -> Accept:
    """What prices copies during one request: ``accept``, scaled by the request's outcomes when ``adapt``."""
    return RequestAcceptance(accept) if adapt else accept
