"""The draft side of one step: grow a token tree level by level.

:class:`Drafter` owns the draft model's KV cache.  Each step it first feeds
the committed tokens the draft has not seen (the last step's accepted tail
and bonus), then forwards one *level* of the tree at a time with a tree
attention mask, so a tree of depth d costs d draft forwards however wide it is.
Leaves of the last level are never forwarded: nothing is drafted after them.
Every draft forward is a :class:`~sequoia.runners.base.Session` forward of the
draft runner (slots and parents: the runner builds the masks its runtime needs).

A :class:`Proposer` decides the tree shape (static trees take it from a
:class:`~sequoia.core.trees.tree.Tree`; dynamic policies decide as they go, see
:mod:`sequoia.runtime.proposers.dynamic`) and returns a :class:`Draft`: the tree, its tokens and
the draft distribution q at every node that has children.  The engine calls
``start()`` once per generation, ``wants_draft()`` before each step (False:
a plain target step, no draft forward), ``propose()`` and ``observe(record)``
after it; decisions taken from past records keep decoding lossless.

Node indices are those of the finished tree (breadth-first), so a proposer
must add nodes level by level; :meth:`Drafter.expand` takes the parent and
depth of every node so far rather than a finished :class:`Tree`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from ..core.config import SamplingConfig
from ..core.statistics.trace import NGRAM, DynamicInfo, StepRecord
from ..core.trees.tree import Tree
from ..core.verification.sampling import sample_children, warp
from ..runners.base import Runner


@dataclass
class Draft:
    tree: Tree
    tokens: list[int]                 # [n_nodes]; tokens[0] is the root (empty while token_ids is unread)
    q: dict[int, torch.Tensor]        # node -> [V] draft distribution over that node's children
    q_token: list[float]              # [n_nodes] q of each node's token under its parent (root: 1.0; empty, likewise)
    dynamic: DynamicInfo | None = None  # a dynamic tree's decisions, copied into the step record
    # [n_nodes] who proposed each node (root: "root"): DRAFT, or NGRAM (copied from the context, a fixed
    # proposal verified as a point mass before the draft's children of the same parent, never forwarded).
    # None: every node is the draft's.
    sources: tuple[str, ...] | None = None
    match_len: tuple[int, ...] | None = None  # [n_nodes] n of the match that proposed each copied node (0: not copied)
    # A tree grown on the device leaves its tokens and q_token there ([n_nodes] each): the target verifies
    # the device tokens and the engine reads both back with the step's walk (see ``read``).
    token_ids: torch.Tensor | None = None
    q_token_ids: torch.Tensor | None = None

    @property
    def unread(self) -> bool:
        return self.token_ids is not None and not self.tokens

    def read(self, values: list[float]) -> "Draft":
        """This draft with ``tokens`` and ``q_token`` filled from ``values``, the read-back concatenation of
        ``token_ids`` and ``q_token_ids`` (ids below 2**53 are exact in float64)."""
        n = self.tree.n_nodes
        return replace(self, tokens=[int(t) for t in values[:n]], q_token=list(values[n: 2 * n]))

    def n_fixed(self, node: int) -> int:
        """How many of ``node``'s first children are fixed (copied) proposals; see sampling.verify_children."""
        if self.sources is None:
            return 0
        return sum(1 for c in self.tree.children[node] if self.sources[c] == NGRAM)


class Proposer:
    """What the engine needs of a decoding method; subclasses define ``name``, ``mode`` and ``propose``.

    ``mode`` is the sampling mode of the children at temperature > 0 (see :mod:`sequoia.core.verification.sampling`).
    """

    name: str
    mode: str

    def propose(self, drafter: "Drafter", generator: torch.Generator | None) -> Draft:
        raise NotImplementedError

    def start(self) -> None:
        """A new generation begins (forget per-generation state)."""

    def observe(self, record: StepRecord) -> None:
        """The step just decoded (also plain target steps, where ``wants_draft`` said False)."""

    def wants_draft(self) -> bool:
        """False: make the next step a plain target step (no draft forward)."""
        return True

    def wants_draft_model(self) -> bool:
        """Asked after ``wants_draft`` said True.  False: ``propose`` gets a drafter that has not run the draft
        model this step (``Drafter.skip``: ``root_q`` is None), for proposals that need only the context."""
        return True

    @property
    def max_nodes(self) -> int:
        """Most tree nodes (root included) one step may ask the target to verify."""
        raise NotImplementedError


#: How long one chunk of a long chain (a prompt) may take, Stop being read between two: the chunk's size follows the
#: rate the chunks so far went at.  On 2 AVX2 cores the 1.5B target reads ~30 tokens/s at 3,000 tokens of context
#: (llama.cpp, 64-token chunks 2.0 s each, 32-token ones 1.2 s), so a fixed size either frees the models late on a
#: CPU or wastes a GPU's batch; sized by time, Stop frees them within about a second on both.
CHUNK_S = 1.0
#: The first chunk's size and the bounds of the others (tokens).
FIRST_CHUNK, MIN_CHUNK, MAX_CHUNK = 32, 16, 1024


class Stopped(Exception):
    """The caller asked to stop in the middle of a long forward (between two chunks of a prompt)."""


def forward_chain(session, tokens: Sequence[int], should_stop: Callable[[], bool] | None = None,
                  clock: Callable[[], float] = time.perf_counter) -> torch.Tensor:
    """Forward ``tokens`` as a chain in chunks of about CHUNK_S seconds each, reading ``should_stop()`` between two
    (raises :class:`Stopped`); the logits of the last token only.  # [1, V]

    Without ``should_stop`` (nothing can stop it: the bench, Compare's timed runs) the chain goes in one forward,
    as a session's forward count is the bench's count of target calls."""
    tokens = list(tokens)
    if should_stop is None:
        return session.forward(tokens, keep=1)
    start, size = 0, FIRST_CHUNK
    while len(tokens) - start > size:
        t0 = clock()
        session.forward(tokens[start:start + size], keep=1)
        seconds = clock() - t0
        start += size
        if should_stop():
            raise Stopped
        size = min(max(int(size * CHUNK_S / max(seconds, 1e-6)), MIN_CHUNK), MAX_CHUNK)
    return session.forward(tokens[start:], keep=1)


class Drafter:
    """The draft runner's session for one generation, grown level by level (see the module docstring)."""

    def __init__(self, runner: Runner, sampling: SamplingConfig, vocab_size: int,
                 should_stop: Callable[[], bool] | None = None) -> None:
        self.runner = runner
        self.sampling = sampling
        self.vocab_size = vocab_size
        self.session = runner.session()
        self.device = runner.device
        self._slots: dict[int, int] = {}  # node -> cache slot, this step
        self._base = 0                    # cache length before the step's tree nodes
        self.root_token = 0
        self.root_q: torch.Tensor | None = None  # [V] set by begin(); None after skip()
        self.context: list[int] = []             # the committed tokens (prompt + generated), root last
        self.should_stop = should_stop           # read between chunks of a long catch-up (Stop)

    # ---------------------------------------------------------------- step API
    def begin(self, committed: list[int]) -> torch.Tensor:
        """Feed committed tokens the cache lacks; return q at the root.  # [V]"""
        start = len(self.session)
        pending = committed[start:]
        if not pending:
            raise RuntimeError("drafter: the root token must not be cached yet")
        # Only the root's logits are needed: skip the output head for the other pending tokens.  A long catch-up
        # (the prompt, at the first drafted step) goes in chunks, Stop read between two.
        logits = forward_chain(self.session, pending, self.should_stop)[-1]
        self._base = len(self.session)
        self._slots = {0: self._base - 1}
        self.root_token = committed[-1]
        self.root_q = self.probs(logits[None])[0]
        self.context = committed
        return self.root_q

    def skip(self, committed: list[int]) -> None:
        """A step without the draft model: the root and context are known, nothing is forwarded.

        The draft cache keeps lagging; the next ``begin`` feeds it every committed token it lacks.
        """
        self._base = len(self.session)
        self._slots = {}
        self.root_token = committed[-1]
        self.root_q = None
        self.context = committed

    def expand(self, nodes: Sequence[int], parents: Sequence[int], depths: Sequence[int],
               tokens: Sequence[int]) -> torch.Tensor:
        """Forward ``nodes`` (their parents already forwarded); return their q.  # [len(nodes), V]

        ``parents`` and ``tokens`` describe every node so far (at least up to max(nodes)); ``depths``
        is kept for callers that track it (a slot's position follows from its parent's).
        """
        start = len(self.session)
        nodes = list(nodes)
        logits = self.session.forward([tokens[v] for v in nodes], [self._slots[parents[v]] for v in nodes])
        for j, v in enumerate(nodes):
            self._slots[v] = start + j
        return self.probs(logits)

    def expand_ids(self, nodes: Sequence[int], parents: Sequence[int], ids: torch.Tensor) -> torch.Tensor:
        """:meth:`expand` with the nodes' tokens as a device tensor (never read back).  # [len(nodes), V]"""
        start = len(self.session)
        nodes = list(nodes)
        logits = self.session.forward(ids, [self._slots[parents[v]] for v in nodes])
        for j, v in enumerate(nodes):
            self._slots[v] = start + j
        return self.probs(logits)

    def run_program(self, tree: Tree, mode: str, generator) -> Draft | None:
        """The whole static ``tree`` drafted by the runner's draft program (every level's forward and draws in
        one run, one graph replay on CUDA), left on the device; None: the runner has no program for it."""
        make = getattr(self.runner, "draft_program", None)
        program = make(tree, mode, self.sampling, self.vocab_size) if make is not None else None
        out = program.run(self.session, self.root_q, self.root_token, generator, self.sampling) if program else None
        if out is None:
            return None
        self._slots.update(out.slots)
        return Draft(tree=tree, tokens=[], q=out.q, q_token=[], token_ids=out.tokens, q_token_ids=out.q_token)

    @property
    def on_device(self) -> bool:
        """The draft runner takes device token tensors: a static tree grows without reading back each level."""
        return bool(getattr(self.runner, "device_tokens", False))

    def commit(self, path: list[int]) -> None:
        """Compact the cache to the accepted path (nodes the draft forwarded)."""
        keep = [self._slots[v] for v in path[1:] if v in self._slots]
        self.session.keep(self._base, keep)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft distributions; at temperature 0 the raw softmax (children are its top-k)."""
        logits = logits[..., : self.vocab_size]
        if self.sampling.greedy:
            return torch.softmax(logits.float(), dim=-1)
        return warp(logits, self.sampling)

    def sample(self, q: torch.Tensor, k: int, mode: str, generator) -> torch.Tensor:
        """Children tokens for each row of q.  # [m, k]"""
        return sample_children(q, k, "topk" if self.sampling.greedy else mode, generator)


@dataclass
class StaticTreeProposer(Proposer):
    """Grows a fixed tree shape: chains, k-ary, SpecInfer, DP-optimal, from file."""

    tree: Tree
    mode: str = "without_replacement"
    name: str = "sequoia"
    _levels: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # device -> [_Level]

    def wants_draft(self) -> bool:
        return self.tree.size > 0  # a root-only tree (``ar``) needs no draft forward

    @property
    def max_nodes(self) -> int:
        return self.tree.n_nodes

    def propose(self, drafter: Drafter, generator) -> Draft:
        if drafter.on_device:   # the whole tree as one program where the runner has one, else level by level
            draft = drafter.run_program(self.tree, self.mode, generator)
            return draft if draft is not None else _grow_on_device(self, drafter, generator)
        tree = self.tree
        tokens = [drafter.root_token] + [0] * tree.size
        q: dict[int, torch.Tensor] = {0: drafter.root_q}
        q_token = [1.0] * tree.n_nodes
        for depth, parents in enumerate(_parents_by_level(tree)):
            if depth > 0:
                rows = drafter.expand(parents, tree.parents, tree.depths, tokens)
                q.update(zip(parents, rows))
            k = max(len(tree.children[v]) for v in parents)
            drawn = drafter.sample(torch.stack([q[v] for v in parents]), k, self.mode, generator)
            _assign_children(tree, parents, drawn, q, tokens, q_token)
        return Draft(tree=tree, tokens=tokens, q=q, q_token=q_token)


@dataclass(frozen=True)
class _Level:
    """One level of a static tree as device index tensors (built once per tree and device)."""

    parents: list[int]                # nodes of this level with children
    parent_ids: torch.Tensor          # [m] the same, on the device
    k: int                            # most children of one of them
    rows: torch.Tensor                # [c] row (parent) of each child
    cols: torch.Tensor                # [c] rank of each child among its parent's draws
    kids: torch.Tensor                # [c] node index of each child


def _device_levels(proposer: "StaticTreeProposer", device: torch.device) -> list[_Level]:
    tree, key = proposer.tree, str(device)
    levels = proposer._levels.get(key)
    if levels is None:
        levels = []
        for parents in _parents_by_level(tree):
            rows, cols, kids = [], [], []
            for r, v in enumerate(parents):
                for c, kid in enumerate(tree.children[v]):
                    rows.append(r), cols.append(c), kids.append(kid)
            as_t = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
            levels.append(_Level(parents, as_t(parents), max(len(tree.children[v]) for v in parents),
                                 as_t(rows), as_t(cols), as_t(kids)))
        proposer._levels[key] = levels
    return levels


def _grow_on_device(proposer: StaticTreeProposer, drafter: Drafter, generator) -> Draft:
    """The static tree grown level by level on the device; its tokens and q stay there (``Draft.read``).

    Same draws as the host path (one ``sample`` call per level over the same rows), so the same tree.
    """
    tree, dev = proposer.tree, drafter.device
    tokens = torch.full((tree.n_nodes,), drafter.root_token, dtype=torch.long, device=dev)   # [n_nodes]
    q_tok = torch.ones(tree.n_nodes, dtype=torch.float32, device=dev)                         # [n_nodes]
    q: dict[int, torch.Tensor] = {0: drafter.root_q}
    for depth, level in enumerate(_device_levels(proposer, dev)):
        if depth == 0:
            rows = drafter.root_q[None]
        else:
            rows = drafter.expand_ids(level.parents, tree.parents, tokens[level.parent_ids])
            q.update(zip(level.parents, rows))
        drawn = drafter.sample(rows, level.k, proposer.mode, generator)    # [m, k]
        picked = drawn[level.rows, level.cols]                              # [c]
        tokens[level.kids] = picked
        q_tok[level.kids] = rows[level.rows, picked].float()
    return Draft(tree=tree, tokens=[], q=q, q_token=[], token_ids=tokens, q_token_ids=q_tok)


def _parents_by_level(tree: Tree) -> list[list[int]]:
    """Nodes with children, level by level (:attr:`Tree.drafted_levels`)."""
    return [list(level) for level in tree.drafted_levels]


def _assign_children(tree, parents, drawn, q, tokens, q_token) -> None:
    drawn_list = drawn.tolist()
    for row, v in enumerate(parents):
        kids = tree.children[v]
        toks = drawn_list[row][: len(kids)]
        probs = q[v][drawn[row, : len(kids)]].tolist()
        for c, t, pr in zip(kids, toks, probs):
            tokens[c] = t
            q_token[c] = pr
