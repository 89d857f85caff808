"""The GPU check's part (b): what a forward, a step and every baseline cost at real shapes (random bf16 weights).

Per target shape (the draft is the 0.5B shape throughout): the forward of n new
tokens after ``ctx`` cached ones on the graph runner and the eager one; the
project's hardware profile measured on the graph runner; the optimizer's choice
under each shipped acceptance vector; engine steps timed end to end against the
profile's prediction (the target alone and the tree chosen for code at T=0); and
what a user would run instead (:mod:`.baselines`: the target alone on graphs, HF
``generate`` eager, and with ``compile`` the compiled graph target alone and HF
``generate`` with a static cache and torch.compile).  Projected Sequoia tokens/s is the
chosen tree's expected tokens per step (shipped acceptance vector: random
weights accept nothing) over the measured step time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ...core.config import GenerationConfig
from ...core.trees.optimizer import choose_tree
from ...core.trees.tree import Tree
from ...runtime.drafter import StaticTreeProposer
from ...runtime.engine import SpeculativeEngine, sync
from ...runtime.measuring.finder import find_acceptance, list_acceptance
from ...runtime.measuring.profiling import measure_profile
from .baselines import target_baselines
from .models import Shape, pair_of, random_model, runner

NS = (1, 2, 4, 8, 16, 32, 64, 128)


def forward_ms(rn, ns, ctx: int, repeats: int, warmup: int = 3) -> list[float]:
    """Median wall ms (host included) of one forward of n new tokens (a binary-ish tree) after ``ctx`` cached."""
    gen = torch.Generator().manual_seed(0)
    session = rn.session()
    session.forward(torch.randint(rn.vocab_size, (ctx,), generator=gen).tolist(), keep=1)
    out = []
    for n in ns:
        ids = torch.randint(rn.vocab_size, (n,), generator=gen).tolist()
        parents = [ctx - 1] + [ctx + (i - 1) // 2 for i in range(1, n)]
        times = []
        for i in range(warmup + repeats):
            sync(rn.device)
            t0 = time.perf_counter()
            session.forward(ids, parents)
            sync(rn.device)
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
            session.crop(ctx)
        out.append(statistics.median(times))
    return out


def engine_steps(pair, tree: Tree, ctx: int, new_tokens: int, name: str) -> dict:
    """A greedy decode with a fixed tree; per-step medians (ms) after two untimed steps, and wall tokens/s."""
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(pair.vocab_size, (ctx,), generator=gen).tolist()
    config = GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False)
    walls, records = [], []
    t = time.perf_counter()
    for record in SpeculativeEngine(pair).generate(prompt, StaticTreeProposer(tree, name=name), config):
        now = time.perf_counter()
        walls.append((now - t) * 1e3)
        records.append(record)
        t = now
    timed = records[2:] or records
    levels = max(tree.depth, 1)
    return {
        "steps": len(records), "tree_nodes": tree.n_nodes, "depth": tree.depth,
        "step_ms": statistics.median(walls[2:] or walls),
        "draft_ms": statistics.median(1e3 * r.draft_s for r in timed),
        "draft_level_ms": statistics.median(1e3 * r.draft_s / levels for r in timed),
        "verify_ms": statistics.median(1e3 * r.verify_s for r in timed),
        "other_ms": statistics.median(1e3 * r.other_s for r in timed),
        "tokens_per_step": sum(len(r.new_tokens) for r in timed) / len(timed),
    }


def check_costs(device: torch.device, dtype: torch.dtype, draft_shape: Shape, targets: list[Shape], ctx: int,
                new_tokens: int, repeats: int, compile_static: bool, log: Callable[[str], None] = print,
                compiled: bool = False, out: dict | None = None, saved: Callable[[], None] = lambda: None,
                artifacts: str | None = None) -> dict:
    """Part (b) for each target shape, results keyed by the shape's name, filled into ``out`` (``saved()``
    after each part).  ``compiled``: the graph runners compile their forwards (inductor) before capturing,
    through the compile cache (artifacts under ``artifacts``; compile and capture seconds reported apart)."""
    out = {} if out is None else out
    t0 = time.perf_counter()
    draft_model = random_model(draft_shape, device, dtype, seed=1)
    out.update({"draft": draft_shape.name, "ctx": ctx, "compiled_runners": compiled, "targets": {}})
    kinds = ("graph",) if compiled else ("graph", "eager")
    draft_graph = runner(draft_model, "graph", "draft", compile=compiled, artifacts=artifacts)
    out["draft_compile"] = compile_row(draft_graph)
    draft_costs = {kind: forward_ms(draft_graph if kind == "graph" else runner(draft_model, kind, "draft"), NS,
                                    ctx, repeats) for kind in kinds}
    out["draft_forward_ms"] = draft_costs
    out["draft_seconds"] = time.perf_counter() - t0
    saved()
    log("  draft forwards " + " / ".join(f"{k} {_fmt(v)}" for k, v in draft_costs.items()) + " ms")
    for shape in targets:
        model = random_model(shape, device, dtype, seed=2)
        out["targets"][shape.name] = _one_target(model, draft_graph, shape, ctx, new_tokens, repeats,
                                                  compile_static, log, compiled, saved, artifacts)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def compile_row(rn) -> dict:
    """A graph runner's compile and capture, apart: what the report shows of a compiled runner."""
    return {"status": rn.compile_status.line(), "compile_s": rn.compile_status.seconds,
            "capture_s": getattr(rn, "capture_seconds", None)}


def _one_target(model, draft_graph, shape: Shape, ctx, new_tokens, repeats, compile_static, log, compiled,
                saved, artifacts=None) -> dict:
    res: dict = {"params_b": round(shape.params_b, 2)}
    t0 = time.perf_counter()
    t_graph = runner(model, "graph", shape.name, compile=compiled, artifacts=artifacts)
    res["compile"] = compile_row(t_graph)
    res["forward_ms"] = {"graph": forward_ms(t_graph, NS, ctx, repeats)}
    res["graph_seconds"] = time.perf_counter() - t0     # compiled runners: compile and captures included
    if not compiled:
        res["forward_ms"]["eager"] = forward_ms(runner(model, "eager", shape.name), NS, ctx, max(3, repeats // 4))
    saved()
    log(f"  {shape.name}: target forwards " + " / ".join(f"{k} {_fmt(v)}" for k, v in res["forward_ms"].items())
        + " ms")
    pair = pair_of(draft_graph, t_graph, f"random {shape.name}")
    t0 = time.perf_counter()
    profile = measure_profile(pair, context_len=ctx, progress=lambda done, label: None)
    res["profile"] = {"seconds": time.perf_counter() - t0, "target_n": profile.target_n,
                      "target_ms": profile.target_ms, "draft_width": profile.draft_width,
                      "draft_ms": profile.draft_ms, "step_overhead_ms": profile.step_overhead_ms,
                      "level_overhead_ms": profile.level_overhead_ms}
    log(f"  profile in {res['profile']['seconds']:.1f} s: step overhead {profile.step_overhead_ms:.2f} ms, "
        f"level overhead {profile.level_overhead_ms:.2f} ms")
    saved()
    res["choices"] = {}
    for entry in list_acceptance():
        c = choose_tree(entry.values, profile)
        res["choices"][entry.label] = {"budget": c.budget, "depth": c.depth, "expected_tokens": c.expected_tokens,
                                       "predicted_step_ms": c.cost.total_ms, "speedup": c.speedup}
    code = choose_tree(find_acceptance("code", 0.0).values, profile)
    ar = engine_steps(pair, Tree.root_only(), ctx, new_tokens, "ar")
    seq = engine_steps(pair, code.tree, ctx, new_tokens, "sequoia") if code.budget else None
    res["engine"] = {"ar": ar, "sequoia_code_t0": seq,
                     "predicted_ar_step_ms": float(profile.target(1)) + profile.step_overhead_ms,
                     "predicted_sequoia_step_ms": code.cost.total_ms if code.budget else None}
    measured = seq["step_ms"] if seq else ar["step_ms"]
    res["projection"] = {
        "tree": f"{code.budget} tokens, depth {code.depth}", "expected_tokens": code.expected_tokens,
        "sequoia_tokens_per_s": 1e3 * code.expected_tokens / measured,
        "target_alone_tokens_per_s": 1e3 / ar["step_ms"],
        "speedup": ar["step_ms"] * code.expected_tokens / measured,
    }
    log(f"  engine: ar {ar['step_ms']:.2f} ms/step; Sequoia ({res['projection']['tree']}) "
        f"{measured:.2f} ms/step, predicted {res['engine']['predicted_sequoia_step_ms'] or 0:.2f}; projected "
        f"{res['projection']['sequoia_tokens_per_s']:.0f} tok/s = {res['projection']['speedup']:.2f}x")
    saved()
    res["baselines"] = target_baselines(
        model, shape.name, ctx, new_tokens, ar["step_ms"], compile_static, log=log,
        alone=lambda target: engine_steps(pair_of(draft_graph, target, shape.name), Tree.root_only(), ctx,
                                          new_tokens, "ar"))
    saved()
    return res


def _fmt(values) -> str:
    return " / ".join(f"{v:.2f}" for v in values)
