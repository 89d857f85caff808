"""The GPU check's host part: what an engine step costs outside the model's forwards, by tree size and sampling.

On a GPU the forwards are graph replays; what the host does between them (growing
the tree, the walk, node probabilities, cache compaction, positions and masks)
is the rest of the step, and it is paid in full whenever it is longer than the
GPU's own work.  Here each forward is timed by wrapping the model's own forward
(``GraphRunner.call``) and, on CUDA, each graph replay, both drained before and
after so that the time outside them is the host's work plus the small kernels it
queued.  A second, untimed pass counts the torch operators dispatched outside
the forwards, views aside: each is a kernel launch on a GPU, whatever the CPU it was counted on.

Models: a tiny fp32 target and a noisy copy of it as the draft (some tokens
accepted), on the graph runner (eager off CUDA, the same cache and masks);
trees: the DP trees of the shipped code T=0 acceptance vector with ~55 and ~127
nodes (the sizes the H100 run chose).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...core.config import GenerationConfig, SamplingConfig
from ...core.trees.dp import optimal_tree
from ...core.trees.tree import Tree
from ...runtime.drafter import StaticTreeProposer
from ...runtime.engine import SpeculativeEngine, sync
from ...runtime.measuring.finder import find_acceptance
from .models import pair_of, perturbed, runner, tiny_model

#: (label, budget, depth) of the measured trees: DP trees of the code T=0 vector.
TREES = (("55 nodes", 54, 5), ("127 nodes", 126, 6))
TEMPERATURES = (0.0, 1.0)
VOCAB = 512   # small: the [rows, V] work of the walk is a launch each on a GPU, not a cost to measure here


def trees() -> dict[str, Tree]:
    acc = find_acceptance("code", 0.0).values
    return {label: optimal_tree(acc, budget, depth).tree() for label, budget, depth in TREES}


class _Forwards:
    """Wall ms spent inside each runner's model forwards (and graph replays), drained on both sides."""

    def __init__(self, runners: dict[str, object], device: torch.device) -> None:
        self.runners, self.device = runners, device
        self.ms = dict.fromkeys(runners, 0.0)
        self.current, self.inside = "", False

    def reset(self) -> dict[str, float]:
        taken, self.ms = self.ms, dict.fromkeys(self.runners, 0.0)
        return taken

    def _timed(self, fn):
        def wrapped(*args, **kwargs):
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return fn(*args, **kwargs)   # a graph being captured: no waits allowed, nothing run
            sync(self.device)
            t0, self.inside = time.perf_counter(), True
            try:
                out = fn(*args, **kwargs)
                sync(self.device)
                return out
            finally:
                self.ms[self.current] += (time.perf_counter() - t0) * 1e3
                self.inside = False
        return wrapped

    def _named(self, role: str, fn):
        def wrapped(*args, **kwargs):
            self.current = role
            return fn(*args, **kwargs)
        return wrapped

    @contextlib.contextmanager
    def installed(self) -> Iterator["_Forwards"]:
        for role, rn in self.runners.items():   # instance attributes over the methods, removed below
            rn.call, rn.run = self._timed(rn.call), self._named(role, rn.run)
        replay = torch.cuda.CUDAGraph.replay if self.device.type == "cuda" else None
        if replay is not None:
            torch.cuda.CUDAGraph.replay = self._timed(replay)
        try:
            yield self
        finally:
            for rn in self.runners.values():
                del rn.call, rn.run
            if replay is not None:
                torch.cuda.CUDAGraph.replay = replay


class _OpCount(TorchDispatchMode):
    """Counts torch operators (views aside) dispatched while ``forwards.inside`` is False, and the scalar reads
    (``.item()``, ``int(t)``, indexing by a 0-d tensor: each a host wait on a GPU; ``.tolist()`` is not seen)."""

    def __init__(self, forwards: _Forwards) -> None:
        super().__init__()
        self.forwards, self.n, self.reads = forwards, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.forwards.inside and not _is_view(func):
            self.n += 1
            self.reads += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def _is_view(func) -> bool:
    """An operator returning an alias of an input it does not write (a slice, a view): no device work."""
    returns = func._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def measure_step_host(pair, tree: Tree, sampling: SamplingConfig, new_tokens: int, ctx: int = 32,
                      skip: int = 2) -> dict:
    """Per-step medians (ms) of one decode with ``tree``: the step, its forwards, the host work (the rest) and
    the engine's draft / verify / other, with the host's part of draft and verify; ops outside the forwards."""
    prompt = torch.randint(pair.vocab_size, (ctx,), generator=torch.Generator().manual_seed(1)).tolist()
    config = GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False, sampling=sampling, seed=3)
    forwards = _Forwards({"draft": pair.draft, "target": pair.target}, torch.device(pair.device))
    rows = []
    with forwards.installed():
        for record in _engine(pair).generate(prompt, StaticTreeProposer(tree), config):
            ms = forwards.reset()
            rows.append({"step_ms": 1e3 * (record.draft_s + record.verify_s + record.other_s),
                         "forward_ms": ms["draft"] + ms["target"], "draft_forward_ms": ms["draft"],
                         "target_forward_ms": ms["target"], "draft_ms": 1e3 * record.draft_s,
                         "verify_ms": 1e3 * record.verify_s, "other_ms": 1e3 * record.other_s,
                         "tokens": len(record.new_tokens)})
        ops, reads = _ops_per_step(pair, tree, prompt, config, forwards)
    timed = rows[skip:] or rows
    med = {k: statistics.median(r[k] for r in timed) for k in timed[0]}
    return {"steps": len(rows), "nodes": tree.n_nodes, "depth": tree.depth,
            "step_ms": med["step_ms"], "forward_ms": med["forward_ms"],
            "host_ms": statistics.median(r["step_ms"] - r["forward_ms"] for r in timed),
            "draft_host_ms": statistics.median(r["draft_ms"] - r["draft_forward_ms"] for r in timed),
            "verify_host_ms": statistics.median(r["verify_ms"] - r["target_forward_ms"] for r in timed),
            "other_ms": med["other_ms"], "tokens_per_step": sum(r["tokens"] for r in timed) / len(timed),
            "ops_outside_forwards": ops, "scalar_reads": reads}


def _ops_per_step(pair, tree: Tree, prompt, config, forwards: _Forwards, steps: int = 4) -> tuple[float, float]:
    """Median torch operators and scalar reads outside the forwards per step (steps after the first two)."""
    counts = []
    counter = _OpCount(forwards)
    with counter:
        for i, _record in enumerate(_engine(pair).generate(prompt, StaticTreeProposer(tree), config)):
            if i >= 2:
                counts.append((counter.n, counter.reads))
            counter.n = counter.reads = 0
            if len(counts) == steps:
                break
    if not counts:
        return 0.0, 0.0
    return statistics.median(c[0] for c in counts), statistics.median(c[1] for c in counts)


def _engine(pair) -> SpeculativeEngine:
    """The engine as it runs on a GPU: the sampled walk on the device (on a CPU too, to measure it)."""
    return SpeculativeEngine(pair, device_walk=True)


def check_host(device: torch.device, new_tokens: int = 48, log: Callable[[str], None] = print,
               kind: str = "graph") -> dict:
    """Host work per step for each tree of :data:`TREES` at each of :data:`TEMPERATURES` on ``device``."""
    threads = torch.get_num_threads()
    if device.type == "cpu":   # tiny models: one thread, so that the host's work is not mixed with OpenMP's waits
        torch.set_num_threads(1)
    try:
        return _check_host(device, new_tokens, log, kind)
    finally:
        torch.set_num_threads(threads)


def _check_host(device: torch.device, new_tokens: int, log: Callable[[str], None], kind: str) -> dict:
    target = tiny_model(0, device, vocab=VOCAB)
    draft = perturbed(target, 0.3, 1)
    pair = pair_of(runner(draft, kind, "tiny-draft"), runner(target, kind, "tiny-target"), "tiny host pair")
    out: dict = {"runner": kind, "vocab": VOCAB, "rows": {}}
    for label, tree in {"target alone (ar)": Tree.root_only(), **trees()}.items():
        for temp in TEMPERATURES if tree.size else (0.0,):
            name = f"{label}, T={temp:g}"
            res = measure_step_host(pair, tree, SamplingConfig(temperature=temp), new_tokens)
            out["rows"][name] = res
            log(f"  {name}: step {res['step_ms']:.2f} ms, forwards {res['forward_ms']:.2f}, host "
                f"{res['host_ms']:.2f} (draft {res['draft_host_ms']:.2f}, verify {res['verify_host_ms']:.2f}, "
                f"other {res['other_ms']:.2f}); {res['ops_outside_forwards']:.0f} ops outside forwards, "
                f"{res['scalar_reads']:.0f} scalar reads")
    return out
