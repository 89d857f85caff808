"""Graphs captured before serving: the graph runner's warm-up and what it reports.

Why: captured lazily, a graph is built inside the first request that needs its
shape (a first visitor waits for every capture and, with a compiled forward,
for the compile); and a capture that failed fell back to eager without a word.
:func:`warm_up` captures every (bucket, window) forward and, for the trees it is
given, the whole-draft programs (:mod:`sequoia.runners.hf.graphs.draft_program`) at
load, reporting progress through the loader's callback, timing the compile
that the first calls of a compiled forward run (apart from the captures), and
saving its artifacts (:mod:`sequoia.runners.hf.graphs.compile_cache`).  :func:`capture_status` says what
was captured, what failed and what runs instead: one line for the Hardware
tab and the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ....core.config import SamplingConfig
from ....core.trees.tree import Tree
from .compile_cache import CompileStatus, finish, resave
from .graph_runner import MIN_WINDOW, GraphRunner

log = logging.getLogger("sequoia")
ProgressFn = Callable[[float, str], None]
#: Sampling shapes a program is captured for at warm-up: greedy, and T > 0 without top-k or top-p filters.
SAMPLINGS = (SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0))


@dataclass(frozen=True)
class CaptureStatus:
    """What a graph runner captured and what runs where it could not (see :func:`capture_status`)."""

    state: str                      # "captured" | "partial" | "not warmed" | "eager"
    graphs: int                     # forwards captured ((bucket, window) pairs)
    programs: int                   # whole-draft graphs captured (tree, sampling shape, window)
    seconds: float | None           # the warm-up's time (None: no warm-up ran)
    errors: tuple[str, ...]         # "key: error" of each failed capture
    compile: CompileStatus
    instead: str                    # what runs where nothing is captured

    def line(self) -> str:
        """One line for the page and the log."""
        if self.state == "eager":
            return f"no CUDA graphs ({self.instead}); {self.compile.line()}"
        took = f" in {self.seconds:.1f} s" if self.seconds is not None else ""
        head = {"captured": f"graphs captured before serving{took}",
                "partial": f"graphs captured{took}, {len(self.errors)} failed ({self.instead})",
                "not warmed": "graphs captured at first use (no warm-up ran)"}[self.state]
        return (f"{head}: {self.graphs} forwards, {self.programs} whole-draft programs; {self.compile.line()}"
                + (f"; first error: {self.errors[0]}" if self.errors else ""))


def capture_status(runner: GraphRunner) -> CaptureStatus:
    errors = tuple(f"{k}: {v}" for k, v in runner.capture_errors.items())
    if not runner.graphs:
        state = "eager"
        instead = "eager forwards: " + ("graphs are off" if runner.device.type == "cuda"
                                        else "CUDA graphs need a CUDA device")
    else:
        state = "partial" if errors else "captured" if runner.capture_seconds is not None else "not warmed"
        instead = "eager forwards for the failed shapes, the level-by-level draft for failed programs"
    return CaptureStatus(state, runner.graph_count, runner.program_graph_count, runner.capture_seconds, errors,
                         runner.compile_status, instead)


def windows(capacity: int) -> list[int]:
    """Every key window a forward may attend to: powers of two from MIN_WINDOW, then the capacity."""
    out, w = [], MIN_WINDOW
    while w < capacity:
        out.append(w)
        w *= 2
    return out + [capacity]


def warm_up(runner: GraphRunner, progress: ProgressFn | None = None, trees: Sequence[Tree] = (),
            samplings: Sequence[SamplingConfig] = SAMPLINGS, vocab: int | None = None,
            mode: str = "without_replacement") -> CaptureStatus:
    """Capture every forward shape, and the draft program of each of ``trees`` under each of ``samplings``
    at every window, now; ``progress(fraction, what)`` is told each step.  A no-op off graphs."""
    report = progress or (lambda frac, desc: None)
    if not runner.graphs:
        return capture_status(runner)
    if runner.compile_status.state == "pending":
        report(0.0, f"{runner.name}: compiling the forward "
                    + ("(saved artifacts loaded)" if runner.compile_status.loaded_bytes
                       else "cold (no saved artifacts for this torch, triton and GPU: minutes)"))
        t0 = time.perf_counter()
        _first_call(runner)
        runner.compile_status = finish(runner.compile_status, time.perf_counter() - t0)
    t0 = time.perf_counter()
    shapes = [(b, w) for w in windows(runner.capacity) for b in runner.buckets]
    programs = [(t, s) for t in trees for s in samplings]
    total = len(shapes) + len(programs) * len(windows(runner.capacity))
    for i, (bucket, window) in enumerate(shapes):
        report(i / total, f"{runner.name}: capturing {bucket} rows x {window} keys ({i + 1}/{total})")
        runner.capture(bucket, window)
    done = len(shapes)
    for tree, sampling in programs:
        program = runner.draft_program(tree, mode, sampling, vocab or runner.vocab_size)
        for window in windows(runner.capacity):
            done += 1
            report(done / total, f"{runner.name}: capturing the {tree.n_nodes}-node draft at {window} keys "
                                 f"({done}/{total})")
            if program is not None and window >= tree.n_nodes:
                program.prepare(window)
    torch.cuda.synchronize(runner.device)
    runner.capture_seconds = time.perf_counter() - t0
    # Saved again after the captures: a shape that compiled again during them (a guard the first calls did not
    # meet) is then in the artifacts too, and a warm start compiles nothing.
    runner.compile_status = resave(runner.compile_status)
    status = capture_status(runner)
    (log.warning if status.errors else log.info)("%s: %s", runner.name, status.line())
    report(1.0, f"{runner.name}: {status.line()}")
    return status


def _first_call(runner: GraphRunner) -> None:
    """The compiled forward's first calls (the compile), eagerly at scratch slots: one row, then two (one
    compile specialised to a single row, one for every wider forward and window: ``compile_forward`` marks the
    shapes dynamic), so every capture after them compiles nothing.  A failure leaves the uncompiled forward in
    place before any graph is captured."""
    dev, keys = runner.device, min(MIN_WINDOW, runner.capacity)
    try:
        # Inference tensors, as every other caller's (a guard on the dispatch keys would compile again), and
        # ids apart from positions (a guard on their being one tensor would too).
        with torch.inference_mode():
            for rows in (1, 2):
                runner.cache.write_at(torch.arange(runner.capacity, runner.capacity + rows, device=dev), keys)
                ids, pos = (torch.zeros(1, rows, dtype=torch.long, device=dev) for _ in range(2))
                runner.call(ids, pos, torch.zeros(1, 1, rows, keys, dtype=runner.dtype, device=dev))
    except Exception as exc:   # noqa: BLE001 - any compile failure: the model's own forward runs instead
        runner.uncompile(exc)


def warm_up_pair(draft, target, progress: ProgressFn | None = None, trees: Sequence[Tree] = ()) -> None:
    """:func:`warm_up` each graph runner of a pair (the draft with the programs of ``trees``) before serving;
    runners of other kinds are left as they are."""
    report = progress or (lambda frac, desc: None)
    vocab = min(int(draft.vocab_size), int(target.vocab_size))   # the drafter's q covers the shared vocabulary
    if isinstance(target, GraphRunner):
        warm_up(target, lambda f, d: report(0.5 * f, d))
    if isinstance(draft, GraphRunner):
        warm_up(draft, lambda f, d: report(0.5 + 0.5 * f, d), trees=trees, vocab=vocab)
