"""The GPU check's draft part: a static tree's whole draft as one graph against one replay per level, compiled
and not, and what a compiled draft costs to start cold and warm.

A draft's cost is timed on its own (``Drafter.begin`` outside the timing, each
draft drained before and after), the two ways interleaved on one runner and one
cache: the program (:mod:`sequoia.runners.hf.graphs.draft_program`, one replay on CUDA)
and the levels (one replay per level, sampling and next inputs eager between).
Per level = the draft's ms over the levels it forwards.  The compiled draft runs
in child processes with a fresh inductor cache each, so the first compiles cold
(saving its artifacts) and the second starts warm from them: what a server's
first and next starts cost.  Off CUDA (or without triton) the children run the
uncompiled forward, so the same code runs, and the result says compiling was
unavailable and why.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ...core.config import SamplingConfig
from ...core.trees.dp import optimal_tree
from ...core.trees.tree import Tree
from ...runners.base import RunnerInfo
from ...runners.hf.graphs.capture import warm_up
from ...runners.hf.graphs.compile_cache import CompilePlan, artifacts_path, compile_key, unavailable_reason
from ...runners.hf.graphs.graph_runner import GraphRunner
from ...runners.hf.loading import dtype_name
from ...runtime.drafter import Drafter, StaticTreeProposer, _parents_by_level
from ...runtime.engine import sync
from ...runtime.measuring.finder import find_acceptance
from .models import CPU_DRAFT, DRAFT_05B, Shape, random_model

SAMPLINGS = {"T=0": SamplingConfig(), "T=1": SamplingConfig(temperature=1.0)}


def draft_tree(cuda: bool) -> Tree:
    """The DP tree of the shipped code T=0 vector: 127 nodes, depth 8 on CUDA (the 7B choice); 31, 5 on CPU."""
    budget, depth = (126, 8) if cuda else (30, 5)
    return optimal_tree(find_acceptance("code", 0.0).values, budget, depth).tree()


def draft_runner(shape: Shape, device: torch.device, compile: CompilePlan | bool = False) -> GraphRunner:
    model = random_model(shape, device, torch.bfloat16)
    info = RunnerInfo(runtime="hf", weights=dtype_name(model.dtype), device=str(device), kernels="draft check")
    return GraphRunner(model, shape.name, info, capacity=1024, compile=compile)


def time_drafts(runner: GraphRunner, tree: Tree, ctx: int, repeats: int) -> dict:
    """Median draft ms (and per forwarded level) of ``tree`` at each sampling, program and levels interleaved."""
    levels = len(_parents_by_level(tree)) - 1
    out = {}
    for label, sampling in SAMPLINGS.items():
        drafter = Drafter(runner, sampling, runner.vocab_size)
        proposer, gen = StaticTreeProposer(tree), torch.Generator(runner.device).manual_seed(0)
        committed = [(7 * i + 1) % runner.vocab_size for i in range(ctx)]
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(2 * (repeats + 1)):
            runner.programs = i % 2 == 0
            committed.append((5 * i + 3) % runner.vocab_size)
            drafter.begin(committed)
            sync(runner.device)
            t0 = time.perf_counter()
            proposer.propose(drafter, gen)
            sync(runner.device)
            times[runner.programs].append(time.perf_counter() - t0)
            drafter.commit([0])
        runner.programs = True
        for programs, name in ((True, "program"), (False, "levels")):
            ms = 1e3 * statistics.median(times[programs][1:])
            out[f"{label}, {name}"] = {"draft_ms": ms, "level_ms": ms / max(levels, 1)}
    return {"levels": levels, "nodes": tree.n_nodes, "rows": out}


#: Seconds each compiled-draft child may take: a cold start (compile, captures, timings) and a warm one, both
#: inside one device call of at most 600 s (the compile was 104 s cold when it compiled six times).
CHILD_TIMEOUT_S = 200


def check_draft(device: torch.device, ctx: int, repeats: int, log: Callable[[str], None] = print,
                compile_check: bool = True, child_timeout: float = CHILD_TIMEOUT_S) -> dict:
    """The draft part of the GPU check (see the module docstring)."""
    threads = torch.get_num_threads()
    if device.type == "cpu":   # tiny stand-ins: one thread, so that OpenMP's waits do not swamp them
        torch.set_num_threads(1)
    try:
        return _check_draft(device, ctx, repeats, log, compile_check, child_timeout)
    finally:
        torch.set_num_threads(threads)


def _check_draft(device: torch.device, ctx: int, repeats: int, log: Callable[[str], None],
                 compile_check: bool, child_timeout: float) -> dict:
    cuda = device.type == "cuda"
    shape, tree = (DRAFT_05B if cuda else CPU_DRAFT), draft_tree(cuda)
    runner = draft_runner(shape, device)
    status = warm_up(runner, trees=[tree], samplings=tuple(SAMPLINGS.values()))
    log(f"  {shape.name}: {status.line()}")
    result = {"draft": shape.name, "tree": f"{tree.n_nodes} nodes, depth {tree.depth}", "capture": status.line(),
              "capture_s": status.seconds, "uncompiled": time_drafts(runner, tree, ctx, repeats)}
    _log_rows(log, "uncompiled", result["uncompiled"])
    del runner
    if compile_check:
        result["compile"] = check_compile(device, ctx, repeats, log, child_timeout)
    return result


def check_compile(device: torch.device, ctx: int, repeats: int, log: Callable[[str], None],
                  timeout: float = CHILD_TIMEOUT_S) -> dict:
    """Cold then warm start of the compiled draft, each in a child process with a fresh inductor cache and at
    most ``timeout`` seconds (a start cut short is a row with its error)."""
    reason = unavailable_reason(device)
    out: dict = {"unavailable": reason} if reason else {"key": compile_key(device).slug()}
    with tempfile.TemporaryDirectory() as tmp:
        for start in ("cold", "warm"):
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / f"inductor-{start}")}
            cmd = [sys.executable, "-m", "sequoia.tools.gpucheck.draft", "--device", str(device),
                   "--artifacts", tmp, "--ctx", str(ctx), "--repeats", str(repeats)]
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                                      cwd=Path(__file__).resolve().parents[3])
            except subprocess.TimeoutExpired as exc:
                # Where it was when cut (the child says each step on stderr), and on to the warm start: what a
                # cut cold start saved, if anything, is what the next server start would find.
                said = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
                last = (said.strip().splitlines() or ["(nothing said)"])[-1][:300]
                out[start] = {"error": f"timed out after {timeout:.0f} s", "last_step": last,
                              "artifacts_saved": _artifact_bytes(Path(tmp))}
                log(f"  {start} start failed: timed out after {timeout:.0f} s at: {last}")
                continue
            if proc.returncode:
                out[start] = {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
                log(f"  {start} start failed: {out[start]['error']}")
                break
            out[start] = {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_s": time.perf_counter() - t0}
            log(f"  {start} start: warm-up {out[start]['warm_up_s']:.1f} s ({out[start]['compile']})")
    if "timings" in out.get("warm", {}):
        _log_rows(log, "compiled" if not reason else f"uncompiled ({reason})", out["warm"]["timings"])
    return out


def _log_rows(log, what: str, timed: dict) -> None:
    for name, r in timed["rows"].items():
        log(f"  {what}, {name}: draft {r['draft_ms']:.2f} ms, {r['level_ms']:.2f} ms a level ({timed['levels']} levels)")


def _child(argv: list[str]) -> int:
    """One start of the compiled draft: compile (or load artifacts), capture, time; one JSON line out."""
    import argparse   # noqa: PLC0415 - the child's own command line

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", required=True)
    ap.add_argument("--artifacts", required=True)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    reason = unavailable_reason(device)
    plan = CompilePlan(False, reason) if reason else CompilePlan(True, artifacts=artifacts_path(args.artifacts,
                                                                                               compile_key(device)))
    shape, tree = (DRAFT_05B if cuda else CPU_DRAFT), draft_tree(cuda)
    runner = draft_runner(shape, device, plan)
    status = warm_up(runner, trees=[tree], samplings=tuple(SAMPLINGS.values()),
                     progress=lambda f, what: print(what, file=sys.stderr, flush=True))   # a cut start says where
    timings = time_drafts(runner, tree, args.ctx, args.repeats)
    print(json.dumps({"warm_up_s": status.seconds or 0.0, "compile": runner.compile_status.line(),
                      "compile_s": runner.compile_status.seconds, "compiles": _compile_counts(),
                      "compile_state": runner.compile_status.state, "capture": status.line(), "timings": timings}),
          flush=True)
    return 0


def _artifact_bytes(folder: Path) -> int:
    """Bytes of compile artifacts saved under ``folder`` so far (what a later start could load)."""
    return sum(p.stat().st_size for p in folder.glob("*") if p.is_file())


def _compile_counts() -> dict:
    """Dynamo's graphs compiled in this process and inductor's FX-graph cache hits and misses (a warm start:
    hits only); torch's own counters, empty where this torch names them otherwise."""
    try:
        from torch._dynamo.utils import counters   # noqa: PLC0415 - private, read once at the child's end
    except ImportError:
        return {}
    return {"graphs": counters["stats"]["unique_graphs"], "fx_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
            "fx_cache_misses": counters["inductor"]["fxgraph_cache_miss"]}


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
