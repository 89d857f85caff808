"""Profile one speculative step on the embedded pair, component by component.

Run from the repository root:

    python scripts/measure/profile_step.py --method sequoia --budget 16 --tokens 48
    python scripts/measure/profile_step.py --compare /tmp/base   # before/after, interleaved
    python scripts/measure/profile_step.py --methods sequoia-dynamic,sequoia-auto,chain,hf-assisted

Each component is timed by wrapping the library function that does it (no
edits to the library): draft begin (pending tokens -> q at the root), draft
levels, target forward (and the lm_head inside it), the verification walk, the
per-node display probabilities, cache compaction.  ``--compare DIR`` also runs
a copy of the package found at ``DIR/sequoia_base`` (e.g. a snapshot taken
before an optimisation) prompt by prompt, interleaved with the current code,
so both see the same machine load.  Prints median ms per step of each
component and tokens/s.

``--methods`` instead runs whole methods side by side, interleaved prompt by
prompt (tokens/s, tokens per target call, tree sizes); the hardware profile
the cost-aware methods need is measured first on a coarse grid unless
``--profile`` names one, and ``--calibration`` feeds sequoia-dynamic.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

#: The modules whose functions are timed, under the package (``sequoia`` or a snapshot of it).
COMPONENT_MODULES = ("runtime.drafter", "runtime.engine", "runtime.verify", "runners.hf.runner", "runtime.methods")

PROMPTS = {
    "code": "Write a Python function that parses a CSV file and returns a list of dictionaries.",
    "chat": "Explain in simple terms why the sky is blue.",
}


class Timers:
    """Accumulates wall time per component within one step."""

    def __init__(self) -> None:
        self.step: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []

    def wrap(self, owner, attr: str, key: str) -> None:
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.step[key] += (time.perf_counter() - t0) * 1e3

        setattr(owner, attr, timed)

    def hook_module(self, module, key: str) -> None:
        start = {}
        module.register_forward_pre_hook(lambda *_: start.__setitem__("t", time.perf_counter()))
        module.register_forward_hook(lambda *_: self.step.__setitem__(
            key, self.step[key] + (time.perf_counter() - start["t"]) * 1e3))

    def close_step(self, record) -> None:
        s = dict(self.step)
        s["step_total"] = record.total_s * 1e3
        s["draft_total"] = record.draft_s * 1e3
        s["verify_total"] = record.verify_s * 1e3
        s["other_total"] = record.other_s * 1e3
        s["tokens"] = record.n_new
        s["tree_size"] = record.tree.size
        self.steps.append(s)
        self.step.clear()


def instrument(pkg: str, timers: Timers):
    """Wrap the components of package ``pkg`` (``sequoia`` or a snapshot of it)."""
    drafter, engine, verify, hf_runner, _ = (importlib.import_module(f"{pkg}.{m}") for m in COMPONENT_MODULES)
    timers.wrap(drafter.Drafter, "begin", "draft_begin")
    timers.wrap(drafter.Drafter, "expand", "draft_levels")
    timers.wrap(engine.SpeculativeEngine, "_verify_forward", "target_forward")
    timers.wrap(verify, "walk_tree", "walk")
    timers.wrap(verify, "node_target_probs", "node_p")
    timers.wrap(hf_runner.HFSession, "keep", "cache_keep")
    timers.wrap(engine.SpeculativeEngine, "_prefill", "prefill")
    return engine


def run(engine_mod, methods_mod, pair, ids, args, timers: Timers) -> float:
    from sequoia.core.config import GenerationConfig, SamplingConfig

    kwargs = {"budget": args.budget} if args.budget else {}
    proposer = methods_mod.make_method(args.method, **kwargs)
    cfg = GenerationConfig(max_new_tokens=args.tokens, sampling=SamplingConfig(temperature=args.temperature),
                           seed=0)
    t0 = time.perf_counter()
    n = 0
    for rec in engine_mod.SpeculativeEngine(pair).generate(ids, proposer, cfg):
        timers.close_step(rec)
        n += rec.n_new
    return n / (time.perf_counter() - t0)


def compare_methods(pair, args) -> None:
    """Whole methods side by side, interleaved prompt by prompt."""
    from sequoia.core.config import GenerationConfig, SamplingConfig
    from sequoia.core.profiles.profile import HardwareProfile
    from sequoia.runtime.engine import SpeculativeEngine
    from sequoia.runtime.methods import make_method
    from sequoia.runtime.measuring.profiling import measure_profile
    from sequoia.runtime.measuring.timing import run_method, warmup

    if args.profile:
        profile = HardwareProfile.load(args.profile)
    else:
        profile = measure_profile(pair, context_len=128, target_grid=(1, 2, 4, 8, 16), draft_grid=(1, 2, 4, 8),
                                  repeats=2)
        print("measured profile: target", [round(x) for x in profile.target_ms], "draft",
              [round(x) for x in profile.draft_ms], flush=True)
    proposers = {m: make_method(m, profile=profile, calibration=args.calibration,
                                budget=args.budget if m == "sequoia-dynamic" else None)
                 for m in args.methods.split(",") if not m.startswith("hf-")}
    cfg = GenerationConfig(max_new_tokens=args.tokens, sampling=SamplingConfig(temperature=args.temperature))
    rows = defaultdict(list)
    names = args.methods.split(",")
    runs = [(r, label, prompt) for r in range(args.rounds) for label, prompt in PROMPTS.items()]
    engine = SpeculativeEngine(pair)
    warmup(engine, pair, pair.encode_prompt(next(iter(PROMPTS.values()))),
           [(m, proposers.get(m)) for m in names], tokens=2)
    for k, (_, label, prompt) in enumerate(runs):
        ids = pair.encode_prompt(prompt)
        for m in names[k % len(names):] + names[: k % len(names)]:  # rotate the order run by run
            run = run_method(engine, pair, m, ids, cfg, proposers.get(m))
            size = run.tree_size or 0.0
            rows[m].append((label, run.tokens_per_s, run.tokens_per_call, size))
            print(f"{label:5s} {m:16s} {run.tokens_per_s:6.2f} tok/s  {run.tokens_per_call:5.2f} tok/call  "
                  f"tree {size:5.1f}", flush=True)
    ref = "hf-assisted" if "hf-assisted" in rows else names[0]
    for m, vals in rows.items():
        ratios = [v[1] / r[1] for v, r in zip(vals, rows[ref])]  # same run, same machine load
        print(f"== {m:16s} median tok/s {statistics.median(v[1] for v in vals):.2f}   "
              f"median ratio to {ref} {statistics.median(ratios):.2f}")


def report(name: str, timers: Timers, tps: list[float]) -> None:
    prefills = [s["prefill"] for s in timers.steps if "prefill" in s]
    steps = [s for s in timers.steps if "prefill" not in s]  # a run's first step includes the prefill
    keys = ["draft_begin", "draft_levels", "draft_total", "target_lm_head", "target_forward", "verify_total",
            "walk", "node_p", "cache_keep", "other_total", "step_total", "tree_size", "tokens"]
    print(f"\n== {name}: {len(steps)} steps, tokens/s per prompt {[round(t, 2) for t in tps]}")
    print(f"  prefill (ms, per run): {[round(p) for p in prefills]}")
    for k in keys:
        vals = [s.get(k, 0.0) for s in steps]
        if vals:
            print(f"  {k:16s} median {statistics.median(vals):8.1f}   mean {statistics.fmean(vals):8.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="sequoia")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=1, help="passes over the prompts")
    ap.add_argument("--compare", default=None, help="directory holding a snapshot package sequoia_base")
    ap.add_argument("--methods", default=None, help="comma-separated methods to run side by side (hf-assisted too)")
    ap.add_argument("--profile", default=None, help="hardware profile JSON for --methods (default: measure)")
    ap.add_argument("--calibration", default=None, help="calibration JSON for sequoia-dynamic")
    ap.add_argument("--dtype", default="auto", help="target dtype (fp32 verifies trees far cheaper on AVX2-only CPUs)")
    # One thread: on a shared 2-core machine two OpenMP threads spin against other
    # processes and a forward can take 10-30x longer; one thread gives stable ratios.
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sequoia.runtime.models import load_pair

    pair = load_pair(dtype=args.dtype)
    print(f"cpu capability {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s), "
          f"target {pair.dtype}", flush=True)
    if args.methods:
        compare_methods(pair, args)
        return 0
    impls = [("sequoia", "current")]
    if args.compare:
        sys.path.insert(0, args.compare)
        impls.insert(0, ("sequoia_base", "before"))
    timers = {name: Timers() for _, name in impls}
    engines = {name: instrument(pkg, timers[name]) for pkg, name in impls}
    methods = {name: importlib.import_module(f"{pkg}.runtime.methods") for pkg, name in impls}
    lm_timer = Timers()
    lm_timer.hook_module(pair.target.model.lm_head, "target_lm_head")  # a Hugging Face runner's model
    tps = defaultdict(list)
    for _ in range(args.rounds):
        for label, prompt in PROMPTS.items():
            ids = pair.encode_prompt(prompt)
            for _, name in impls:
                lm_timer.step.clear()
                before = len(timers[name].steps)
                tps[name].append(run(engines[name], methods[name], pair, ids, args, timers[name]))
                n = len(timers[name].steps) - before
                share = lm_timer.step.get("target_lm_head", 0.0) / max(n, 1)
                for s in timers[name].steps[before:]:
                    s["target_lm_head"] = share
    for _, name in impls:
        report(f"{name} ({args.method}, budget {args.budget}, T={args.temperature})", timers[name], tps[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
