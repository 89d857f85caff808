"""CUDA graphs captured inside one GPU call, for that call only: how a ZeroGPU Space decodes fast.

Why: ZeroGPU runs every ``@spaces.GPU`` call in a worker process made for it
(reused only while alive and idle), so a graph captured in one call is gone in
the next, and the loader cannot capture at start (no GPU is attached outside a
call).  Eager forwards are launch-bound: on an H100 a 1.5B forward costs 20 ms
eagerly and 4.5 ms replayed, a 0.5B draft level 16 ms and 3.1 ms
(docs/data/gpu-check-h100.md).  So a call that decodes more than a few steps
builds graph runners over the eager runners' own models (no weight is copied),
each capturing a forward shape (bucket of rows, key window) the first time the
call's decode needs it, and drops them when the call ends.  The captures count
in the call's time, and :class:`CallGraphs` counts and times each one; a shape
whose capture fails runs eagerly (the graph runner's own fallback), and a pair
that cannot run on graph runners at all (llama.cpp, a streamed target) stays
eager with the reason.

Off CUDA the replays are **emulated** (:class:`ReplayedEagerly`): the same
static buffers, padding, scratch slots and masks as a captured graph, with the
forward run eagerly at each replay.  So everything but the capture itself runs
and is tested on a CPU (the ZeroGPU stand-in, ``--device cpu`` of
``scripts/gpu/zerogpu_call_check.py``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch

from ...base import RunnerInfo
from .forward_graph import ForwardGraph, window_of
from .graph_runner import GraphRunner
from ..runner import HFRunner


#: The smallest key window of a call's forwards.  Why one window: a capture costs a few eager forwards, and a
#: request crossing 256 and 512 keys would capture every bucket twice; attending to 1,024 keys instead of 256 adds
#: ~0.4% to a 7B step's bytes (1,024 slots x 57 KB of keys and values against 15 GB of weights; ~1% for the 0.5B).
CALL_WINDOW = 1024


@dataclass(frozen=True)
class CallGraphsReport:
    """What one call's graphs did: for the page's summary, the log and the ZeroGPU call check."""

    mode: str                         # "graphs" | "emulated" (replays run eagerly, off CUDA) | "eager"
    reason: str                       # why this mode
    captures: int = 0                 # forward shapes captured in this call
    capture_s: float = 0.0            # their seconds, part of the call's own
    failed: tuple[str, ...] = ()      # "key: error" of each capture that failed (those shapes ran eagerly)

    def line(self) -> str:
        """One sentence for the page."""
        if self.mode == "eager":
            return f"This GPU call ran eagerly: {self.reason}."
        what = "CUDA graphs" if self.mode == "graphs" else "graph replays (emulated: no CUDA here)"
        failed = (f"; {len(self.failed)} capture(s) failed and ran eagerly (first: {self.failed[0]})"
                  if self.failed else "")
        return (f"This GPU call captured {self.captures} {what} in {self.capture_s:.2f} s (counted in the call's "
                f"time, dropped when it ended){failed}.")


class CallGraphRunner(GraphRunner):
    """A :class:`GraphRunner` built inside one call over a model already loaded: every capture timed
    (``captured``: (key, seconds, ok) in order), no compile (ZeroGPU has no ``torch.compile``), whole-draft
    programs only where asked.  ``emulate``: off CUDA, replays run the forward eagerly over the static buffers."""

    def __init__(self, model, name: str, info: RunnerInfo, emulate: bool = False, programs: bool = False,
                 capacity: int | None = None) -> None:
        super().__init__(model, name, info, capacity=capacity, graphs=not emulate, compile=False,
                         programs=programs and not emulate)
        self.emulated = emulate
        if emulate:
            self.graphs, self.graph_class = True, ReplayedEagerly
        self.captured: list[tuple[tuple, float, bool]] = []
        self._seen: set[tuple[int, int]] = set()   # shapes forwarded once: captured the second time only
        self._planned = False

    def run(self, ids, host, block, chain: int, start: int) -> torch.Tensor:
        if start == 0:   # a prompt's (first) forward: once a decode, never worth a capture
            return self._eager(ids, host, block, chain, host.shape[1])
        return super().run(ids, host, block, chain, start)

    def prepare(self, buckets, window: int) -> None:
        """Capture these buckets of rows at ``window`` keys now, before the decode that replays them."""
        self._planned = True
        try:
            for b in sorted(set(buckets)):
                if (b, window) not in self._graphs and (b, window) not in self.capture_errors:
                    self._capture(b, window)
        finally:
            self._planned = False

    def window_for(self, length: int) -> int:
        """Keys a forward attends to: at least :data:`CALL_WINDOW` (one window serves a whole page request, so
        each bucket is captured once a call instead of once a window it passes)."""
        return window_of(max(length, CALL_WINDOW), self.capacity)

    def _capture(self, bucket: int, window: int) -> ForwardGraph | None:
        if not self._planned and (bucket, window) not in self._seen:
            self._seen.add((bucket, window))   # a one-off forward (a prompt) runs eagerly: no capture to pay back
            return None
        t0 = time.perf_counter()
        graph = super()._capture(bucket, window)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)   # the warm-up forwards are asynchronous: time them whole
        self.captured.append(((bucket, window), time.perf_counter() - t0, graph is not None))
        return graph

    def release(self) -> None:
        """Drop every graph, program and cache block of this call (the model stays: it is the server's)."""
        self._graphs.clear()
        self._programs.clear()
        self._blocks.clear()
        self.cache = None
        self._owner = None


class ReplayedEagerly(ForwardGraph):
    """A :class:`ForwardGraph` off CUDA: the static inputs and output as captured, each replay the forward run
    eagerly over them (the cache writes at the graph's own slot tensor, as a replay does)."""

    def new_graph(self) -> _EagerReplay:
        return _EagerReplay(self)

    @classmethod
    @torch.inference_mode()
    def capture(cls, runner: GraphRunner, bucket: int, window: int) -> ReplayedEagerly:
        g = cls(runner, bucket, window)
        runner.cache.write_at(g.slots, window)
        g.logits = runner.call(g.ids, g.pos, g.mask).clone()   # the output buffer every replay writes into
        return g


class _EagerReplay:
    """``torch.cuda.CUDAGraph``'s ``replay`` for :class:`ReplayedEagerly`."""

    def __init__(self, graph: ReplayedEagerly) -> None:
        self.g = graph

    @torch.inference_mode()
    def replay(self) -> None:
        g = self.g
        g.runner.cache.write_at(g.slots, g.window)
        g.logits.copy_(g.runner.call(g.ids, g.pos, g.mask))


class CallGraphs:
    """One call's graph runners over ``pair``'s models, built on first use of :attr:`pair` and dropped by
    :meth:`close`.  ``capture`` False: the call runs eagerly (``reason`` says why, e.g. the plan's arithmetic).
    ``emulate_ok`` False: a pair off CUDA stays eager (emulated replays are for tests and checks)."""

    def __init__(self, pair, capture: bool = True, reason: str = "", programs: bool = False,
                 emulate_ok: bool = True) -> None:
        self._base, self._reason, self._programs = pair, reason, programs
        self._emulate_ok = emulate_ok
        self._pair = None
        self.final: CallGraphsReport | None = None   # the report as the call ended (close)
        self._why_eager = "" if capture else (reason or "capturing was not asked")

    @property
    def pair(self):
        """The pair this call decodes with: graph runners over the same models, or the eager pair itself."""
        if self._pair is None:
            self._pair = self._build()
        return self._pair

    def _build(self):
        if self._why_eager:
            return self._base
        why = _not_wrappable(self._base)
        if not why and self._base.device.type != "cuda" and not self._emulate_ok:
            why = (f"no CUDA in this call (the pair is on {self._base.device.type}; "
                   "SEQUOIA_CALL_GRAPHS=1 captures with emulated replays)")
        if why:
            self._why_eager = why
            return self._base
        try:
            emulate = self._base.device.type != "cuda"
            draft, target = (_graph_runner(r, emulate, self._programs and r is self._base.draft)
                             for r in (self._base.draft, self._base.target))
        except Exception as exc:   # noqa: BLE001 - e.g. out of device memory for the caches: eager instead
            self._why_eager = f"the graph runners could not be built ({type(exc).__name__}: {str(exc)[:160]})"
            return self._base
        return _with_runners(self._base, draft, target)

    def prepare(self, draft_buckets, target_buckets, context: int) -> None:
        """Capture what a decode reaching ``context`` slots will replay, before it starts (so that its steps'
        times are replays, the captures counted in the call's time only); a no-op on an eager call."""
        pair = self.pair
        for runner, buckets in ((pair.draft, draft_buckets), (pair.target, target_buckets)):
            if isinstance(runner, CallGraphRunner) and buckets:
                runner.prepare(buckets, runner.window_for(min(context, runner.capacity)))

    def runners(self) -> list[CallGraphRunner]:
        p = self._pair
        return [r for r in (p.draft, p.target) if isinstance(r, CallGraphRunner)] if p is not None else []

    def report(self) -> CallGraphsReport:
        runners = self.runners()
        if not runners:
            return CallGraphsReport("eager", self._why_eager or "the pair was not used in this call")
        events = [e for r in runners for e in r.captured]
        failed = tuple(f"{r.name} {k}: {v}" for r in runners for k, v in r.capture_errors.items())
        mode = "emulated" if runners[0].emulated else "graphs"
        return CallGraphsReport(mode, self._reason, sum(ok for _, _, ok in events), sum(s for _, s, _ in events),
                                failed)

    def close(self) -> None:
        """Drop what this call captured (its process may be reused; the models are the server's)."""
        self.final = self.report()
        for r in self.runners():
            r.release()
        if self.runners() and self._base.device.type == "cuda":
            torch.cuda.empty_cache()
        self._pair = None


def _with_runners(pair, draft, target):
    """``pair`` with its runners replaced (a ModelPair, or a namespace with the same fields)."""
    if dataclasses.is_dataclass(pair):
        return replace(pair, draft=draft, target=target)
    return SimpleNamespace(**{**vars(pair), "draft": draft, "target": target})


def _not_wrappable(pair) -> str:
    """Why ``pair`` cannot decode on graph runners ("" when it can)."""
    if getattr(pair, "target_streamed", False):
        return "the target streams from host memory (its own runner)"
    for role in ("draft", "target"):
        r = getattr(pair, role)
        if isinstance(r, GraphRunner):
            return f"the {role} already runs on graphs captured at load"
        if not isinstance(r, HFRunner):
            return f"the {role} runs on {r.info.runtime}, not on the Hugging Face runtime graphs are captured for"
    return ""


def _graph_runner(runner: HFRunner, emulate: bool, programs: bool) -> CallGraphRunner:
    kernels = "CUDA graphs captured in this call" if not emulate else "graph replays emulated off CUDA"
    info = replace(runner.info, kernels=kernels)
    # The eager runner's context limit: a request the server accepted fits the call's cache too.
    return CallGraphRunner(runner.model, runner.name, info, emulate=emulate, programs=programs,
                           capacity=min(int(runner.max_context or 4096), 4096))
