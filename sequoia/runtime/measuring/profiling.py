"""Measuring a :class:`~sequoia.core.profiles.profile.HardwareProfile` on the models at hand.

Three parts, all recorded in the profile:

* the two cost curves: target forward by new-token count, draft level by
  width (:func:`_time_grid`, each point the median of a few forwards on a
  cached context);
* the overheads the cost model (:mod:`sequoia.core.profiles.cost`) adds to those
  forwards, from a few real steps of the engine with a fixed chain tree
  (:func:`_measure_overheads`);
* this machine's fingerprint (:func:`~sequoia.runtime.measuring.fingerprint.machine_fingerprint`).

``quick=True`` measures a coarser grid (about a minute or less for the
embedded pair on 2 CPU cores), for measuring in the background of the app.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..._meta import Progress, ProgressFn, library_version, now_iso, pair_name
from ...core.config import GenerationConfig
from ...core.profiles.profile import (DRAFT_GRID, STREAMED_DRAFT_GRID, STREAMED_TARGET_GRID, TARGET_GRID, ContextCurves,
                                      HardwareProfile)
from ...core.trees.tree import Tree
from ...runners.base import Runner
from ...runners.base import shared_vocab
from ..drafter import StaticTreeProposer
from ..engine import SpeculativeEngine, model_lock, sync
from ..lease import ModelLease
from .fingerprint import machine_fingerprint

#: The quick profile's grids: enough points for the optimizer's range on a CPU.
QUICK_TARGET_GRID = (1, 2, 4, 8, 16, 32, 64)
QUICK_DRAFT_GRID = (1, 2, 4, 8, 16)
#: Draft levels of the chain the overheads are measured with.
OVERHEAD_CHAIN = 3


def measure_profile(
    pair,
    context_len: int = 128,
    target_grid: Sequence[int] | None = None,
    draft_grid: Sequence[int] | None = None,
    repeats: int | None = None,
    warmup: int = 1,
    point_s: float | None = None,
    generator: torch.Generator | None = None,
    progress: ProgressFn | None = None,
    stop_ratio: float | None = 16.0,
    overhead_steps: int | None = None,
    quick: bool = False,
    contexts: Sequence[int] = (),
    clock: Callable[[], float] = time.perf_counter,
    background: bool = False,
) -> HardwareProfile:
    """Time ``pair.target`` by new-token count and ``pair.draft`` by level width, then the step overheads.

    Each model prefills ``context_len`` random tokens once; every timed forward
    then appends n tokens and the cache is cropped back, so all points see the
    same realistic cached context.  Each point is the median of up to
    ``repeats`` forwards after ``warmup`` untimed ones; repeats stop early once
    a point has taken ``point_s`` seconds (slow points vary little).  The target
    grid stops once a forward costs more than ``stop_ratio`` times one token
    (None: never): no tree that large can pay for itself, and on a
    compute-bound CPU the points past it would take minutes.  ``generator``
    draws the token ids (costs do not depend on them); a fixed seed is used
    without one.  ``overhead_steps`` engine steps measure the overheads
    (0: skip, the overheads stay 0).  ``contexts`` are further cached-context
    lengths at which both curves are measured again on the same grids (the
    profile's :meth:`~sequoia.core.profiles.profile.HardwareProfile.at_context` prices
    a step at the context it runs at).  ``clock`` (seconds) times every forward
    and the overheads' engine steps: the process's CPU time on a busy machine
    (:func:`sequoia.runtime.measuring.timing.process_clock`, one thread), as the bench.

    The pair's runners are held one grid point at a time (:mod:`sequoia.runtime.lease`), so a request that
    arrives meanwhile runs between two points; ``background``: every waiting request goes first (the app's
    profiler).  A point after another owner's work starts a new session (that work cleared the runner's
    cache), and a profile measured while requests ran says so in its note.

    Parameters left at None take the full preset (grids TARGET_GRID and
    DRAFT_GRID, 3 repeats, 5 s a point, 6 overhead steps: about a minute or
    two for the embedded pair on 2 CPU cores) or, with ``quick``, the quick
    one (QUICK_TARGET_GRID and QUICK_DRAFT_GRID, 2 repeats, 2 s a point,
    4 overhead steps: under a minute there).
    """
    settings = _settings(context_len, target_grid, draft_grid, repeats, warmup, point_s, overhead_steps, contexts,
                         quick, clock)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    n_overhead = settings.overhead_steps + 2 if settings.overhead_steps else 0  # two untimed steps first (prompt, tree)
    points = (len(settings.target_grid) + len(settings.draft_grid)) * (1 + len(settings.contexts))
    tick = Progress(points + n_overhead, progress, "profiling")
    hold = _Holder(pair, background)
    try:
        curves = _curves(pair, settings, gen, tick, stop_ratio, hold)
        overheads = (_measure_overheads(pair, curves, settings.overhead_steps, gen, tick, clock, hold)
                     if settings.overhead_steps else (0.0, 0.0))
        more = tuple(_context_curves(pair, c, curves.target_n, settings.draft_grid, settings.points, gen, tick, hold)
                     for c in settings.contexts)
    finally:
        tick.close()
    prof = _finished(pair, curves, settings, overheads, more)
    shared = hold.visitors()
    if shared:
        prof = dataclasses.replace(prof, note=prof.note + f"; measured while requests ran (between {shared} of "
                                   "their holds of the models: each point timed alone, the machine's cores shared)")
    return prof


class _Holder:
    """The pair's lease for one measurement at a time, and whether another owner came in between."""

    def __init__(self, pair, background: bool) -> None:
        self.pair, self.background = pair, background
        lease = getattr(pair, "lock", None)
        self.lease = lease if isinstance(lease, ModelLease) else None
        self._visitors0 = self.lease.visitor_turns if self.lease else 0
        self._turn = None

    def __call__(self):
        return model_lock(self.pair, self.background)

    def moved_on(self) -> bool:
        """Another owner held the runners since this measurement's last hold (call while holding)."""
        if self.lease is None:
            return False
        moved = self._turn is not None and self.lease.turns != self._turn
        self._turn = self.lease.turns
        return moved

    def visitors(self) -> int:
        return (self.lease.visitor_turns - self._visitors0) if self.lease else 0


def measure_streamed_profile(pair, **kwargs) -> HardwareProfile:
    """:func:`measure_profile` of a pair whose target streams from host memory: the target timed for n = 1, 2,
    4 .. 1024 new tokens and the draft's levels up to 256 wide, never stopped early (a streamed forward of 1024
    tokens may cost little more than one), so the optimizer prices trees of hundreds of nodes from measured
    points.  Other arguments as :func:`measure_profile`'s."""
    kwargs = {"target_grid": STREAMED_TARGET_GRID, "draft_grid": STREAMED_DRAFT_GRID, "stop_ratio": None, **kwargs}
    profile = measure_profile(pair, **kwargs)
    return dataclasses.replace(profile, note=profile.note + "; streamed target (n up to 1024)")


@dataclass(frozen=True)
class _Settings:
    """What one measurement times, presets filled in and checked once."""

    points: "_Plan"                   # how each point is timed, at the profile's own context
    target_grid: tuple[int, ...]      # new-token counts of the target curve
    draft_grid: tuple[int, ...]       # level widths of the draft curve
    overhead_steps: int               # engine steps timed for the overheads (0: none)
    contexts: tuple[int, ...]         # further cached-context lengths, sorted, the profile's own left out
    quick: bool                       # the quick preset (said in the profile's note)


def _settings(context_len, target_grid, draft_grid, repeats, warmup, point_s, overhead_steps, contexts,
              quick, clock=time.perf_counter) -> _Settings:
    """measure_profile's arguments with the preset's value for each one left at None, checked."""
    preset = _QUICK if quick else _FULL
    repeats = preset["repeats"] if repeats is None else repeats
    overhead_steps = preset["overhead_steps"] if overhead_steps is None else overhead_steps
    if repeats < 1 or warmup < 0 or context_len < 1 or overhead_steps < 0:
        raise ValueError("need repeats >= 1, warmup >= 0, context_len >= 1 and overhead_steps >= 0")
    contexts = tuple(sorted({int(c) for c in contexts} - {context_len}))
    if any(c < 1 for c in contexts):
        raise ValueError(f"contexts must be positive token counts, got {list(contexts)}")
    return _Settings(
        points=_Plan(ctx=context_len, repeats=repeats, warmup=warmup,
                     point_s=preset["point_s"] if point_s is None else point_s, clock=clock),
        target_grid=tuple(preset["target_grid"] if target_grid is None else target_grid),
        draft_grid=tuple(preset["draft_grid"] if draft_grid is None else draft_grid),
        overhead_steps=overhead_steps, contexts=contexts, quick=quick)


def _curves(pair, settings: _Settings, gen: torch.Generator, tick: Progress,
            stop_ratio: float | None, hold: _Holder) -> HardwareProfile:
    """The two cost curves at the profile's own context (a profile with nothing else filled in)."""
    target_ms = _time_grid(pair.target, settings.target_grid, _verify_parents, settings.points, gen,
                           lambda n: tick(f"target n={n}"), stop_ratio, hold)
    for n in settings.target_grid[len(target_ms):]:
        tick(f"target n={n} skipped (over {stop_ratio:g}x one token)")
    draft_ms = _time_grid(pair.draft, settings.draft_grid, _level_parents, settings.points, gen,
                          lambda w: tick(f"draft width={w}"), hold=hold)
    return HardwareProfile(device="", dtype="", context_len=settings.points.ctx,
                           target_n=settings.target_grid[: len(target_ms)], target_ms=tuple(target_ms),
                           draft_width=settings.draft_grid, draft_ms=tuple(draft_ms))


_FULL = dict(target_grid=TARGET_GRID, draft_grid=DRAFT_GRID, repeats=3, point_s=5.0, overhead_steps=6)
_QUICK = dict(target_grid=QUICK_TARGET_GRID, draft_grid=QUICK_DRAFT_GRID, repeats=2, point_s=2.0, overhead_steps=4)


def _finished(pair, curves: HardwareProfile, settings: _Settings, overheads: tuple[float, float],
              more: tuple[ContextCurves, ...]) -> HardwareProfile:
    """The measured curves with the rest of the profile: the machine, the pair, the overheads, other contexts."""
    device = torch.device(getattr(pair, "device", None) or pair.target.device)
    note = ("quick profile (coarser grid)" if settings.quick else "full profile") + (
        "" if settings.points.clock is time.perf_counter else "; timed with this process's CPU time") + (
        f"; overheads from {settings.overhead_steps} engine steps of a {OVERHEAD_CHAIN}-token chain"
        if settings.overhead_steps else "; overheads not measured (0)")
    return dataclasses.replace(
        curves, device=describe_device(device), dtype=str(pair.dtype), pair=pair_name(pair), date=now_iso(),
        version=library_version(), repeats=settings.points.repeats, fingerprint=machine_fingerprint(pair),
        step_overhead_ms=overheads[0], level_overhead_ms=overheads[1], contexts=more, note=note)


def _context_curves(pair, ctx: int, target_grid, draft_grid, plan: "_Plan", gen: torch.Generator,
                    tick: Progress, hold: _Holder) -> ContextCurves:
    """Both curves again after ``ctx`` cached tokens, on the grids already measured."""
    at = dataclasses.replace(plan, ctx=ctx)
    target = _time_grid(pair.target, target_grid, _verify_parents, at, gen,
                        lambda n: tick(f"target n={n}, ctx {ctx}"), hold=hold)
    draft = _time_grid(pair.draft, draft_grid, _level_parents, at, gen,
                       lambda w: tick(f"draft width={w}, ctx {ctx}"), hold=hold)
    return ContextCurves(context_len=ctx, target_ms=tuple(target), draft_ms=tuple(draft))


def _measure_overheads(pair, curves: HardwareProfile, steps: int, gen: torch.Generator,
                       tick: Progress, clock: Callable[[], float] = time.perf_counter,
                       hold: _Holder | None = None) -> tuple[float, float]:
    """(step, level) overheads in ms: what real engine steps cost beyond the forwards ``curves`` predicts.

    Runs the engine greedily for ``steps`` timed steps (after two untimed) with
    a fixed chain of OVERHEAD_CHAIN draft tokens on a random prompt of the
    profile's context length, so every step forwards the same widths (1 per
    level) and verifies the same OVERHEAD_CHAIN + 1 tokens whatever is accepted.
    Per step, the step overhead is ``other_s + verify_s - target(n)`` (the walk,
    sampling, cache compaction, and what the verify forward costs beyond the
    timed forward: its mask and position ids) and the level overhead is
    ``(draft_s - sum draft(w)) / levels`` (sampling each level, its masks),
    the first width 2 after a step whose whole chain was accepted (the draft
    catches up on that leaf: :func:`sequoia.core.profiles.cost.leaf_mass`
    prices it) and 1 otherwise.  Each is the median over steps, clipped at
    0: a negative overhead is timing noise.
    """
    vocab = shared_vocab(pair)
    prompt = torch.randint(vocab, (curves.context_len,), generator=gen).tolist()
    tree = Tree.chain(OVERHEAD_CHAIN)
    config = GenerationConfig(max_new_tokens=(steps + 2) * (OVERHEAD_CHAIN + 1), stop_at_eos=False)
    records = []
    with (hold or _Holder(pair, False))():   # one generation, a few steps: its engine joins this hold
        for record in SpeculativeEngine(pair, clock=clock).generate(
                prompt, StaticTreeProposer(tree, name="overheads"), config):
            records.append(record)
            tick(f"overheads, step {len(records)}")
            if len(records) == steps + 2:
                break
    first = 2 if len(records) > 2 else 0   # step 0 is the prompt's forward, step 1 feeds the draft the prompt
    target = float(curves.target(tree.n_nodes))

    def drafts(i: int) -> float:          # the forwards of step i: its first width counts the caught-up leaf
        caught = 1 if i > 0 and records[i - 1].ended_on_leaf else 0
        return float(curves.draft(1 + caught)) + float(curves.draft(1)) * (OVERHEAD_CHAIN - 1)

    step = statistics.median(1000.0 * (r.other_s + r.verify_s) - target for r in records[first:])
    level = statistics.median((1000.0 * records[i].draft_s - drafts(i)) / OVERHEAD_CHAIN
                              for i in range(first, len(records)))
    return max(0.0, step), max(0.0, level)


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    # The CPU kind decides whether a tree pays at all (bf16 matmuls or not), so every figure names it.
    return machine_fingerprint().describe()


def _verify_parents(n: int, ctx: int) -> list[int]:
    """Parent slots of a tree of n nodes (a heap-shaped binary tree) verified after ``ctx`` cached tokens."""
    return [ctx - 1] + [ctx + (i - 1) // 2 for i in range(1, n)]


def _level_parents(width: int, ctx: int) -> list[int]:
    """Parent slots of one tree level of ``width`` nodes: each sees the context and itself."""
    return [ctx - 1] * width


@dataclass(frozen=True)
class _Plan:
    ctx: int          # cached context tokens
    repeats: int      # timed forwards per point, at most
    warmup: int       # untimed forwards per point
    point_s: float    # stop repeating a point once this much time went into it (>= 1 timed run)
    clock: Callable[[], float] = time.perf_counter   # seconds; the process's CPU time on a busy machine


def _time_grid(runner: Runner, grid, parents_of: Callable[[int, int], list[int]], plan: _Plan,
               gen: torch.Generator, on_point: Callable[[int], None], stop_ratio: float | None = None,
               hold: _Holder | None = None) -> list[float]:
    """Median ms per grid point of one session forward (+ softmax of its logits) after ``plan.ctx`` cached tokens.

    The forward is the one the engine runs for this runner (a draft runner's sessions take its draft
    forward).  With ``stop_ratio``, stops after the first point costing more than that times the first
    one (the list is then shorter than ``grid``; at least two points are measured).

    ``hold``: the pair's lease, taken for one point at a time (a request runs between two points); a point
    after another owner's work makes a new session with the context again, as that work cleared the cache.
    """
    vocab = runner.vocab_size
    session = None
    out = []
    for n in grid:
        with (hold() if hold is not None else nullcontext()):
            moved = hold is not None and hold.moved_on()
            if session is None or moved:
                session = runner.session()
                session.forward(torch.randint(vocab, (plan.ctx,), generator=gen).tolist(), keep=1)
            ids = torch.randint(vocab, (n,), generator=gen).tolist()
            parents = parents_of(n, plan.ctx)
            spent = sum(_forward_ms(session, ids, parents, plan, runner.device) for _ in range(plan.warmup))
            times = [_forward_ms(session, ids, parents, plan, runner.device)]
            while len(times) < plan.repeats and spent + sum(times) < plan.point_s * 1000.0:
                times.append(_forward_ms(session, ids, parents, plan, runner.device))
        out.append(statistics.median(times))
        on_point(n)
        if stop_ratio is not None and len(out) >= 2 and out[-1] > stop_ratio * out[0]:
            break
    return out


def _forward_ms(session, ids: list[int], parents: list[int], plan: _Plan, device) -> float:
    """One timed forward of ``ids`` on the cached context; the cache is cropped back to ``plan.ctx`` after."""
    sync(device)
    t0 = plan.clock()
    logits = session.forward(ids, parents)
    torch.softmax(logits.float(), dim=-1)
    sync(device)
    ms = (plan.clock() - t0) * 1000.0
    session.crop(plan.ctx)
    return ms
