"""The offload check: a target larger than the GPU streamed from pinned host memory, what it costs, what Sequoia
would make of it.  No download, nothing written but the report.

    python scripts/gpu/offload_check.py --out DIR [--device cuda|cpu] [--shapes 32b|tiny] [--layers K]
                                    [--draft 1.5b|7b] [--in-flight 2] [--ctx 128] [--repeats 2] [--steps 4]

Random bf16 weights at Qwen2.5-32B's shapes (64 layers, hidden 5120, ~65 GB) built straight into pinned host
memory (sequoia/tools/gpucheck/offload.py), a resident draft at the 1.5B (or 7B) shapes, then in order:
(1) the pinned host-to-device rate of one layer and the floor it sets (the layers' bytes over that rate);
(2) the hardware profile of the pair with the streamed target timed for n = 1, 2, 4 .. 1024 new tokens and the
draft's levels (sequoia.runtime.measuring.profiling.measure_streamed_profile), saved as DIR/offload_profile.json;
(3) accelerate's cpu_offload target alone over the same host weights (its error as the row if it fails);
(4) the optimizer's tree for each shipped acceptance vector (depth <= 20) and its projected speedup over the
streamed target alone and over accelerate; the vectors are the embedded 0.5B -> 1.5B pair's, an optimistic
stand-in for a 32B target; (5) engine steps with the code T=0 tree against the profile's prediction.
``--layers K`` streams only the first K layers (the estimate: 65 GB over ~50 GB/s is ~1.3 s a forward, so the
whole run at 64 layers is ~3-4 minutes on an H100; K = 16 keeps it near one) and also projects to the full depth
by scaling the target's costs by 64 / K.  ``--device cpu --shapes tiny`` runs the same code in well under a
minute.  Writes DIR/offload_check.json and DIR/offload_check.md after each part.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from sequoia._meta import write_json  # noqa: E402
from sequoia.core.trees.optimizer import predict  # noqa: E402
from sequoia.core.trees.optimizer import choose_tree  # noqa: E402
from sequoia.runtime.measuring.finder import find_acceptance  # noqa: E402
from sequoia.runtime.measuring.profiling import measure_streamed_profile  # noqa: E402
from sequoia.tools.gpucheck.baselines import row  # noqa: E402
from sequoia.tools.gpucheck.costs import engine_steps  # noqa: E402
from sequoia.tools.gpucheck.models import (CPU_DRAFT, CPU_TARGET, TARGET_7B, TARGET_15B, TARGET_32B,  # noqa: E402
                                           pair_of, random_model, runner)
from sequoia.tools.gpucheck.offload import (MAX_DEPTH, accelerate_alone, accelerate_ordinary,  # noqa: E402
                                            build_target, copy_rate, pageable_copy_rate, projections)

SHAPES = {"32b": TARGET_32B, "tiny": replace(CPU_TARGET, layers=8)}
DRAFTS = {"1.5b": TARGET_15B, "7b": TARGET_7B, "tiny": CPU_DRAFT}
STANDIN = ("acceptance vectors: the embedded Qwen2.5-Coder 0.5B -> 1.5B pair's (shipped in assets/acceptance), "
           "an optimistic stand-in for a 32B target with this draft")


def log(msg: str) -> None:
    print(msg, flush=True)


def main(argv: list[str]) -> int:
    args = _args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)      # tiny shapes gain nothing from threads; a shared CPU loses to them
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    full = SHAPES[args.shapes]
    shape = replace(full, layers=args.layers or full.layers)
    result: dict = {"versions": _versions(), "device": _device_name(device), "target": shape.name,
                    "layers": shape.layers,
                    "full_layers": full.layers, "in_flight": args.in_flight, "ctx": args.ctx, "note": STANDIN,
                    "started": time.strftime("%Y-%m-%d %H:%M:%S")}

    def save() -> None:
        write_json(out / "offload_check.json", result)
        (out / "offload_check.md").write_text(markdown(result))

    log(f"offload check on {result['device']}: {shape.name}, {shape.layers} of {full.layers} layers streamed")
    target, built_s = build_target(shape, device, torch.bfloat16, args.in_flight)
    result["build"] = {"seconds": built_s, "host_bytes": target.host_bytes, "resident_bytes": target.resident_bytes}
    log(f"built in {built_s:.1f} s: {target.host_bytes / 1e9:.2f} GB in host memory, "
        f"{target.resident_bytes / 1e9:.2f} GB resident")
    result["copy"] = copy_rate(target)
    result["copy_pageable"] = pageable_copy_rate(target)
    log(f"(1) host -> device {result['copy']['gb_per_s']:.1f} GB/s (pageable: "
        f"{result['copy_pageable']['gb_per_s']:.1f}); floor {result['copy']['floor_ms']:.1f} ms")
    save()
    draft_shape = DRAFTS["tiny" if args.shapes == "tiny" else args.draft]
    draft = runner(random_model(draft_shape, device, torch.bfloat16, seed=1), "graph", draft_shape.name)
    pair = pair_of(draft, target, f"{draft_shape.name} -> {shape.name} (streamed)")
    profile = measure_streamed_profile(pair, context_len=args.ctx, repeats=args.repeats, warmup=1, point_s=1e9,
                                       overhead_steps=2, progress=lambda f, d: log(f"(2) {d}"))
    profile.save(out / "offload_profile.json")
    result["profile"] = {"target_n": list(profile.target_n), "target_ms": list(profile.target_ms),
                         "draft_width": list(profile.draft_width), "draft_ms": list(profile.draft_ms),
                         "step_overhead_ms": profile.step_overhead_ms, "level_overhead_ms": profile.level_overhead_ms}
    save()
    log("(3) accelerate cpu_offload target alone")
    result["accelerate"] = row(lambda: accelerate_alone(target, args.ctx, args.repeats))
    log(f"    {result['accelerate']}")
    acc_ms = result["accelerate"].get("ms_per_token")
    result["accelerate_ordinary"] = accelerate_ordinary(result["accelerate"], result["copy"]["gb_per_s"],
                                                        result["copy_pageable"]["gb_per_s"])
    ord_ms = result["accelerate_ordinary"].get("ms_per_token")
    result["projections"] = projections(profile, acc_ms, accelerate_ordinary_ms=ord_ms)
    if shape.layers != full.layers:
        result["projections_full"] = projections(profile, acc_ms, scale=full.layers / shape.layers,
                                                 accelerate_ordinary_ms=ord_ms)
    save()
    result["steps"] = row(lambda: _steps(pair, profile, args))
    log(f"(5) {result['steps']}")
    result["seconds"] = time.perf_counter() - _T0
    save()
    log(markdown(result))
    return 0


def _steps(pair, profile, args) -> dict:
    """Engine steps with the code T=0 tree (random weights accept nothing; the step's cost is the tree's)."""
    choice = choose_tree(find_acceptance("code", 0.0).values, profile, max_depth=MAX_DEPTH)
    new_tokens = (args.steps + 2)                     # one token a step: nothing is accepted
    measured = engine_steps(pair, choice.tree, args.ctx, new_tokens, "sequoia")
    predicted = predict(choice.tree, find_acceptance("code", 0.0).values, profile).total_ms
    return {**measured, "predicted_step_ms": predicted, "measured_over_predicted": measured["step_ms"] / predicted}


def markdown(r: dict) -> str:
    lines = [f"# Offload check: {r['target']} streamed on {r['device']}", "",
             f"{r['layers']} of {r['full_layers']} layers streamed, {r['in_flight']} in flight, "
             f"context {r['ctx']} tokens.  {r['note']}.", ""]
    if "copy" in r:
        c = r["copy"]
        lines += [f"- host -> device: **{c['gb_per_s']:.1f} GB/s** (one {c['layer_bytes'] / 1e6:.1f} MB layer); "
                  f"floor of a forward {c['floor_ms']:.1f} ms ({c['host_bytes'] / 1e9:.3f} GB)"]
    if "profile" in r:
        p = r["profile"]
        one = p["target_ms"][0]
        lines += ["", "| n new tokens | " + " | ".join(str(n) for n in p["target_n"]) + " |",
                  "|---" * (len(p["target_n"]) + 1) + "|",
                  "| streamed forward ms | " + " | ".join(f"{ms:.1f}" for ms in p["target_ms"]) + " |",
                  "| / one token | " + " | ".join(f"{ms / one:.2f}" for ms in p["target_ms"]) + " |", ""]
        if "copy" in r:
            lines.append(f"- one token at {one / r['copy']['floor_ms']:.2f}x the floor")
        lines.append("- draft level ms: " + ", ".join(f"w={w}: {ms:.1f}" for w, ms in zip(p["draft_width"],
                                                                                        p["draft_ms"])))
    if "copy_pageable" in r:
        lines.append(f"- host -> device from ordinary (pageable) memory: {r['copy_pageable']['gb_per_s']:.1f} GB/s")
    if "accelerate" in r:
        a = r["accelerate"]
        lines.append(f"- accelerate cpu_offload alone, weights in pinned buffers (measured): "
                     + (f"{a['ms_per_token']:.1f} ms/token" if "ms_per_token" in a else f"failed: {a['error']}"))
    if "accelerate_ordinary" in r:
        o = r["accelerate_ordinary"]
        lines.append(f"- accelerate cpu_offload alone, weights in ordinary memory (projected: {o.get('how', '')}): "
                     + (f"{o['ms_per_token']:.1f} ms/token" if "ms_per_token" in o else o["error"]))
    for key, title in (("projections", "measured layers"), ("projections_full", "projected to every layer")):
        if key in r:
            lines += ["", f"Projected Sequoia ({title}; depth <= {MAX_DEPTH}):", "",
                      "| vector | budget | depth | tokens/step | ms/token | x streamed alone | x accelerate (pinned, "
                      "measured) | x accelerate (ordinary memory, projected) |",
                      "|---|---|---|---|---|---|---|---|"]
            lines += [f"| {p['vector']} | {p['budget']} | {p['depth']} | {p['expected_tokens']:.2f} | "
                      f"{p['ms_per_token']:.1f} | {p['speedup_vs_streamed']:.2f} | "
                      + (f"{p['speedup_vs_accelerate']:.2f} |" if p["speedup_vs_accelerate"] else "- |")
                      + (f" {p['speedup_vs_accelerate_ordinary']:.2f} |"
                         if p.get("speedup_vs_accelerate_ordinary") else " - |")
                      for p in r[key]]
    if "steps" in r:
        s = r["steps"]
        lines += ["", "- engine step, code T=0 tree: " + (f"{s['step_ms']:.1f} ms measured, {s['predicted_step_ms']:.1f}"
                                                          f" predicted ({s['measured_over_predicted']:.2f}x)"
                                                          if "step_ms" in s else f"failed: {s['error']}")]
    return "\n".join(lines) + "\n"


def _versions() -> dict:
    """What ran: Python, torch, transformers and accelerate (a missing one named as such)."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "accelerate"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = "not installed"
    return out


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"


def _args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for offload_check.json / .md and offload_profile.json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="32b")
    ap.add_argument("--layers", type=int, default=None, help="stream only the first K layers (default: all)")
    ap.add_argument("--draft", choices=("1.5b", "7b"), default="1.5b")
    ap.add_argument("--in-flight", type=int, default=2, help="layers on the device at once")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="timed forwards per point (each point gets them all)")
    ap.add_argument("--steps", type=int, default=4, help="timed engine steps in part (5)")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here (use --device cpu --shapes tiny)")
    return args


_T0 = time.perf_counter()

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
