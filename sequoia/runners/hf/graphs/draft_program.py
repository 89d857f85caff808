"""The whole static-tree draft as one program: every level's forward, sampling and next inputs on the device.

Why: grown level by level, a draft replays one graph per level and builds the
next level's inputs eagerly between them: 3.4 ms a level at the 0.5B shapes on
an H100, two thirds of a step (../shared/GPU.md).  For a static tree (the DP's)
every shape is known before the step: which nodes each level forwards, their
cache slots (``base`` plus their order), their positions (the root's plus their
depth), which tree slots each row sees, how many children each row draws.  So
one function runs every level, and one CUDA graph captures it, as SGLang
captures its multi-step draft (``eagle_draft_cuda_graph_runner.py``).

What changes from step to step sits in static buffers (:class:`DraftBuffers`):
``base`` (the cache length before the tree), the root's position and token, the
root's q (from ``Drafter.begin``), and the sampling values: temperature and
top-p are 0-d tensors, not constants baked into a capture.  What a capture
fixes is the structure (:class:`SamplingShape`: greedy or not, the top-k value,
whether a top-p filter runs) and the key window (one graph per window, as the
runner keys its own graphs).

One run (:meth:`DraftProgram.body`)::

    q[0] = root_q
    for each level:  (below the root) forward the level's nodes over the slot cache -> their q rows
                     draw each row's children: top-k at T = 0, else Gumbel-top-k of the draft's own q
                     (``sample_children``: exactly sequential draws without replacement)
                     write each child's token and its q into the outputs

Outputs: ``tokens`` [n_nodes], ``q_token`` [n_nodes] and ``q`` [1 + forwarded, V],
the q of every node with children: the distribution its children were drawn
from, which is what verification needs to stay lossless.

Randomness: run eagerly (off CUDA, or a capture that failed) the program draws
from the generator it is given, in the same calls and shapes as the drafter's
level-by-level path, so one seed gives one tree either way.  A captured graph
draws from the program's own CUDA generator, registered with the graph (replays
advance its philox offset); it is reseeded from the caller's generator's seed
plus a salt whenever the caller's generator changes (a new generation), so the
draft's noise never repeats the walk's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from ....core.config import SamplingConfig
from ....core.trees.tree import Tree
from ....core.verification.sampling import sample_children
from ...base import upload

T = TypeVar("T")
log = logging.getLogger("sequoia")
MODES = ("without_replacement", "topk")   # children draws a program runs (with replacement keeps the levels)
_SALT = 0x5EED_D2AF                       # draft noise seed = the caller's seed + this: a stream the walk never uses


@dataclass(frozen=True)
class SamplingShape:
    """What a capture fixes of the sampling; the values (temperature, top-p) are tensors."""

    greedy: bool
    top_k: int              # 0: no top-k filter
    top_p_filter: bool      # a top-p filter runs (its value is DraftBuffers.top_p)

    @classmethod
    def of(cls, sampling: SamplingConfig) -> "SamplingShape":
        if sampling.greedy:
            return cls(True, 0, False)
        return cls(False, sampling.top_k, sampling.top_p < 1.0)


@dataclass(frozen=True)
class ProgramLevel:
    """One level: its rows of ``DraftBuffers.q`` (row 0 is the root, row 1 + i forwarded node i) and children."""

    depth: int
    rows: tuple[int, int]           # [a, b): q rows drawn from; below the root also forwarded rows a - 1 .. b - 2
    k: int                          # most children of one row
    child_rows: torch.Tensor        # [c] row (within the level) of each child's parent
    child_cols: torch.Tensor        # [c] rank of each child among its parent's draws
    kids: torch.Tensor              # [c] node index of each child


@dataclass(frozen=True)
class DraftPlan:
    """A static tree as the program's index tensors, built once per tree and device."""

    tree: Tree
    levels: tuple[ProgramLevel, ...]
    forwarded: tuple[int, ...]      # [f] nodes forwarded below the root, level by level: slot base + i
    parent_rows: tuple[int, ...]    # [f] each one's parent among them (-1: the root)
    fwd_nodes: torch.Tensor         # [f] the same nodes, on the device
    fwd_depth: torch.Tensor         # [f] their depths (position = the root's + depth)
    offsets: torch.Tensor           # [f] 0 .. f - 1 (slot = base + offset)
    block: torch.Tensor             # [f, f + 1] bool: row i sees forwarded slot j (itself, its ancestors); last col False

    @property
    def n_forwarded(self) -> int:
        return len(self.forwarded)

    def q_nodes(self) -> tuple[int, ...]:
        """Node of each ``q`` row."""
        return (0,) + self.forwarded

    @classmethod
    def build(cls, tree: Tree, device: torch.device) -> "DraftPlan":
        by_level = tree.drafted_levels
        forwarded = [v for parents in by_level[1:] for v in parents]
        row_of = {v: i for i, v in enumerate(forwarded)}
        parent_rows = [row_of.get(tree.parents[v], -1) for v in forwarded]
        f = len(forwarded)
        seen = torch.zeros(f, f + 1, dtype=torch.bool)
        for i, p in enumerate(parent_rows):
            if p >= 0:
                seen[i] = seen[p]
            seen[i, i] = True
        levels, a = [], 0
        as_t = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
        for depth, parents in enumerate(by_level):
            rows, cols, kids = [], [], []
            for r, v in enumerate(parents):
                for c, kid in enumerate(tree.children[v]):
                    rows.append(r), cols.append(c), kids.append(kid)
            k = max(len(tree.children[v]) for v in parents)
            levels.append(ProgramLevel(depth, (a, a + len(parents)), k, as_t(rows), as_t(cols), as_t(kids)))
            a += len(parents)
        return cls(tree, tuple(levels), tuple(forwarded), tuple(parent_rows), as_t(forwarded),
                   as_t([tree.depths[v] for v in forwarded]), as_t(list(range(f))), seen.to(device))


@dataclass(frozen=True)
class DraftBuffers:
    """The program's static inputs (written before a run) and outputs (written by it)."""

    where: torch.Tensor             # [3] long in: base slot, root position, root token
    root_q: torch.Tensor            # [V] float32 in: q at the root
    temperature: torch.Tensor       # [] float32 in
    top_p: torch.Tensor             # [] float32 in
    tokens: torch.Tensor            # [n_nodes] long out (node 0: the root)
    q_token: torch.Tensor           # [n_nodes] float32 out: q of each node's token under its parent (root 1)
    q: torch.Tensor                 # [1 + f, V] float32 out: q of the root, then of each forwarded node

    @classmethod
    def allocate(cls, plan: DraftPlan, vocab: int, device: torch.device) -> "DraftBuffers":
        n = plan.tree.n_nodes
        f32 = dict(dtype=torch.float32, device=device)
        return cls(torch.zeros(3, dtype=torch.long, device=device), torch.full((vocab,), 1 / vocab, **f32),
                   torch.ones((), **f32), torch.ones((), **f32), torch.zeros(n, dtype=torch.long, device=device),
                   torch.ones(n, **f32), torch.zeros(1 + plan.n_forwarded, vocab, **f32))


@dataclass(frozen=True)
class ProgramResult:
    """One run's draft, left on the device (the engine reads tokens and q_token back with its walk)."""

    tokens: torch.Tensor            # [n_nodes] a copy (the next run overwrites the buffers)
    q_token: torch.Tensor           # [n_nodes] a copy
    q: dict[int, torch.Tensor]      # node -> [V] rows of DraftBuffers.q: valid until the next run
    slots: dict[int, int]           # forwarded node -> its cache slot


def warp_tensors(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: int,
                 top_p_filter: bool) -> torch.Tensor:
    """:func:`sequoia.core.verification.sampling.warp` (T > 0) with temperature and top-p as 0-d tensors.  # [m, V] float32

    The same operations in the same order, so the same distribution to rounding.
    """
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p_filter:
        sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, idx, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class DraftProgram:
    """One static tree's draft on one :class:`~sequoia.runners.hf.graphs.graph_runner.GraphRunner` (see the module)."""

    def __init__(self, runner, tree: Tree, mode: str, shape: SamplingShape, vocab: int) -> None:
        if mode not in MODES:
            raise ValueError(f"a draft program draws {MODES}, not {mode!r}")
        self.runner, self.shape, self.vocab = runner, shape, vocab
        self.mode = "topk" if shape.greedy else mode
        self.plan = DraftPlan.build(tree, runner.device)
        self.buffers = DraftBuffers.allocate(self.plan, vocab, runner.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}    # key window -> captured run
        self.failed = ""                                       # a capture's error: the program is off
        self.generator = torch.Generator(runner.device) if runner.graphs else None
        self._source: torch.Generator | None = None            # the caller's generator the noise is seeded from
        self.runs = 0

    # ------------------------------------------------------------------ one run
    def body(self, window: int, generator: torch.Generator | None, base: int | None = None) -> None:
        """Every level of the draft, device work only (what a graph captures).  Reads and writes ``buffers``.

        ``base`` given (eager only): each level attends to the keys up to its own last slot, as a level-by-level
        forward does off graphs (same shapes, so the same numbers); else every level to ``window`` keys.
        """
        b, plan, run = self.buffers, self.plan, self.runner
        mask = self._mask(window)                                          # [f, window]
        slots = b.where[0] + plan.offsets                                  # [f]
        pos = b.where[1] + plan.fwd_depth                                  # [f]
        b.tokens[:1].copy_(b.where[2:])
        b.q[0].copy_(b.root_q)
        for level in plan.levels:
            a, e = level.rows
            if level.depth:
                f0, f1 = a - 1, e - 1
                ids = b.tokens[plan.fwd_nodes[f0:f1]]
                keys = window if base is None else base + f1
                run.cache.write_at(slots[f0:f1], keys)
                # pos[f0:f1][None], not pos[None, f0:f1]: the strides a compiled forward saw from the runner's own
                # calls (a guard on them would compile it again)
                logits = run.call(ids[None], pos[f0:f1][None], mask[f0:f1, :keys][None, None])[0]
                b.q[a:e].copy_(self._probs(logits))
            rows = b.q[a:e]                                                # [m, V]
            drawn = sample_children(rows, level.k, self.mode, generator)  # [m, k]
            picked = drawn[level.child_rows, level.child_cols]             # [c]
            b.tokens[level.kids] = picked
            b.q_token[level.kids] = rows[level.child_rows, picked]

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The drafter's q of logits rows (``Drafter.probs``), sampling values read from the buffers.  # [m, V]"""
        logits = logits[..., : self.vocab]
        if self.shape.greedy:
            return torch.softmax(logits.float(), dim=-1)
        b = self.buffers
        return warp_tensors(logits, b.temperature, b.top_p, self.shape.top_k, self.shape.top_p_filter)

    def _mask(self, window: int) -> torch.Tensor:
        """Additive mask of every forwarded row: the chain below ``base`` whole, tree slots by ancestry.
        # [f, window]"""
        plan, base = self.plan, self.buffers.where[0]
        f = plan.n_forwarded
        cols = torch.arange(window, device=self.runner.device)
        rel = cols - base
        index = torch.where((rel >= 0) & (rel < f), rel, f)               # tree slot, else the all-False column
        seen = plan.block[:, index] | (cols < base)
        zero = torch.zeros((), dtype=self.runner.dtype, device=self.runner.device)
        return torch.where(seen, zero, torch.full_like(zero, self.runner.neg))

    # ------------------------------------------------------------------ the caller's side
    @torch.inference_mode()
    def prepare(self, window: int) -> bool:
        """Capture the graph of ``window`` keys now (a warm-up, with no session on the runner: it writes slots
        from 0); False: the capture failed."""
        return self.runner.graphs and (window in self.graphs or self._capture(window) is not None)

    @torch.inference_mode()
    def run(self, session, root_q: torch.Tensor, root_token: int, generator: torch.Generator | None,
            sampling: SamplingConfig) -> ProgramResult | None:
        """Draft the tree after ``session``'s last slot (the root); None: the capture failed (nothing drafted,
        the caller grows the tree level by level)."""
        root_pos = session.root_position()
        base, f = len(session), self.plan.n_forwarded
        if root_pos is None:
            raise RuntimeError("a draft program hangs its tree off a session that is one chain")
        if base + f > self.runner.capacity:
            raise ValueError(f"draft program: {base + f} slots exceed this runner's cache of {self.runner.capacity}")
        self._load(base, root_pos, root_token, root_q, sampling)
        if self.runner.graphs:
            window = self.runner.window_for(base + f)
            graph = self.graphs.get(window) or self._capture(window)
            if graph is None:
                return None
            self._reseed(generator)
            graph.replay()
        else:
            self.body(base + f, generator, base)
        self.runs += 1
        session.note_forwarded([base - 1 if p < 0 else base + p for p in self.plan.parent_rows],
                               len(self.plan.levels) - 1)
        b = self.buffers
        return ProgramResult(tokens=b.tokens.clone(), q_token=b.q_token.clone(),
                             q=dict(zip(self.plan.q_nodes(), b.q)),
                             slots={v: base + i for i, v in enumerate(self.plan.forwarded)})

    def _load(self, base: int, root_pos: int, root_token: int, root_q: torch.Tensor,
              sampling: SamplingConfig) -> None:
        """The step's inputs into the static buffers: device work only, no host wait."""
        b = self.buffers
        b.where.copy_(upload(torch.tensor([base, root_pos, root_token], dtype=torch.long), b.where.device))
        b.root_q.copy_(root_q[: self.vocab])
        if not self.shape.greedy:
            b.temperature.fill_(float(sampling.temperature))
            b.top_p.fill_(float(sampling.top_p))

    def _reseed(self, generator: torch.Generator | None) -> None:
        if generator is not self._source:
            self._source = generator
            seed = generator.initial_seed() if generator is not None else torch.initial_seed()
            self.generator.manual_seed((seed + _SALT) % 2**63)

    def _capture(self, window: int) -> torch.cuda.CUDAGraph | None:
        """One graph of the whole draft at ``window`` keys (warm-up on a side stream first, as torch advises)."""
        if self.failed:
            return None
        key = ("draft program", self.plan.tree.n_nodes, window)
        graph, error = try_capture(lambda: self._capture_once(window), self.runner, key)
        if graph is None:   # the levels run as before, said on the runner
            self.failed = error
            self.runner.note_capture_error(key, error)
            return None
        self.graphs[window] = graph
        return graph

    def _capture_once(self, window: int) -> torch.cuda.CUDAGraph:
        dev = self.runner.device
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.body(window, self.generator)
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self.generator)
        # thread_local: only this thread's unsafe calls invalidate the capture (another thread's sync does not)
        with torch.cuda.graph(graph, pool=self.runner.graph_pool, capture_error_mode="thread_local"):
            self.body(window, self.generator)
        return graph


def try_capture(capture: Callable[[], T], runner, key: tuple) -> tuple[T | None, str]:
    """``capture()``, retried once after a failure: (what it returned, "") or (None, the second error).

    Why a retry: a capture can fail for a passing reason (a lazy initialisation or an allocation the first try
    made outside the capture); a shape that fails twice is left to the eager fallback, and the caller says so.
    A device left in a sticky error state (an illegal access: every later call fails) is not retried: the drain
    after a failure is itself guarded, and a failure there ends the tries with both errors, so the load goes on
    to the eager fallback instead of crashing in the handler.
    """
    error = ""
    for attempt in (1, 2):
        try:
            return capture(), ""
        except Exception as exc:   # noqa: BLE001 - any capture failure: retried once, then the fallback
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
            try:
                if torch.device(runner.device).type == "cuda":
                    torch.cuda.synchronize(runner.device)   # the failed try's queued work, before a retry
            except Exception as sticky:   # noqa: BLE001 - a sticky device error: no retry can succeed
                return None, f"{error}; then the device failed: {type(sticky).__name__}: {str(sticky)[:200]}"
            if attempt == 1:
                log.warning("%s: capturing %s failed (%s); retrying once", runner.name, key, error)
    return None, error


def program_key(tree: Tree, mode: str, sampling: SamplingConfig, vocab: int) -> tuple | None:
    """The cache key of a program for this draft; None: no program runs it (children drawn with replacement)."""
    shape = SamplingShape.of(sampling)
    if not shape.greedy and mode not in MODES:
        return None
    return (tree, "topk" if shape.greedy else mode, shape, vocab)

