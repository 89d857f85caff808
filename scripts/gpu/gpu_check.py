"""The GPU check: is Sequoia lossless on this device, and what does it cost at real shapes?  No download.

    python scripts/gpu/gpu_check.py --out DIR [--device cuda|cpu] [--preset no-compile|compiled-draft] [--compile]
                                [--compile-runners] [--artifacts DIR] [--child-timeout S] [--skip-costs]
                                [--skip-correctness] [--skip-host] [--skip-draft] [--skip-draft-compile]
                                [--skip-capture]

Presets (the device recipe, ``scripts/gpu/gpu_calls.sh``: each one call of under five minutes on one H100):
``no-compile``: parts (a)-(e) without compiling anything, (a) quick, (b) at the 7B shapes only;
``compiled-draft``: part (d) alone, with the compiled draft's cold and warm starts (children of at most
``--child-timeout`` seconds each).  Flags given beside a preset add to it.

(a) correctness on tiny fp32 models, on the graph runner (CUDA graphs over a slot cache) and the eager one:
greedy equality of every method with the target's greedy ``generate``, a tree's logits against each node's
chain, graph replay against eager, the chi-square of a sampled joint and of a broken residual (must fail);
(b) costs with random bf16 weights at the embedded pair's shapes and a 7B target's: forwards by new-token
count, the hardware profile, the optimizer's choice under each shipped acceptance vector, engine steps
against the prediction, and baselines (sequoia/tools/gpucheck/baselines.py: target alone on graphs, HF ``generate`` eager;
``--compile``: the compiled graph target alone, HF ``generate`` with a static cache, and with a static cache and
torch.compile; a baseline that fails is a row with its error); (c) host work per engine step (the step minus its forwards, with the torch
operators and scalar reads outside them) for DP trees of 55 and 127 nodes at T=0 and T=1 on tiny models; (d) the
draft alone at the 0.5B shapes: a static tree's whole draft as one graph against one replay per level, and the
compiled draft's cold and warm start (child processes, fresh inductor caches).  (e) the capture time of one CUDA graph per bucket on fresh runners (what a ZeroGPU call pays before replaying,
sequoia/runtime/measuring/gpu_call.py).  Writes DIR/gpu_check.json and DIR/gpu_check.md (after each part, so a run
cut short keeps what it did).  ``--device cpu`` runs the same on tiny stand-in shapes in seconds.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

import transformers  # noqa: E402

from sequoia._meta import write_json  # noqa: E402
from sequoia.tools.gpucheck.capture import capture_markdown, check_capture  # noqa: E402
from sequoia.tools.gpucheck.correctness import check_correctness  # noqa: E402
from sequoia.tools.gpucheck.costs import check_costs  # noqa: E402
from sequoia.tools.gpucheck.draft import CHILD_TIMEOUT_S, check_draft  # noqa: E402
from sequoia.tools.gpucheck.host import check_host  # noqa: E402
from sequoia.tools.gpucheck.models import CPU_DRAFT, CPU_TARGET, DRAFT_05B, TARGET_7B, TARGET_15B  # noqa: E402
from sequoia.tools.gpucheck.report import markdown  # noqa: E402

#: The device recipe's calls (scripts/gpu/gpu_calls.sh): defaults each preset sets, before the flags given.
PRESETS = {
    "no-compile": {"targets": "7b", "quick": True, "skip_draft_compile": True},
    "compiled-draft": {"skip_correctness": True, "skip_costs": True, "skip_host": True, "skip_capture": True},
}


def log(msg: str) -> None:
    print(msg, flush=True)


def versions(device: torch.device) -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    else:
        out["cpu"] = platform.processor() or platform.machine()
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="one call of the device recipe (see above)")
    ap.add_argument("--artifacts", help="where compiled runners keep their artifacts (default: a temporary folder)")
    ap.add_argument("--child-timeout", type=float, default=CHILD_TIMEOUT_S,
                    help="seconds each compiled-draft start of part (d) may take")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--trials", type=int, default=None, help="runs per chi-square (default 1500)")
    ap.add_argument("--repeats", type=int, default=None, help="timed forwards per point (default 20 cuda, 3 cpu)")
    ap.add_argument("--ctx", type=int, default=128, help="cached tokens before timed forwards")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--targets", default="1.5b,7b", help="target shapes on CUDA: 1.5b, 7b")
    ap.add_argument("--compile", action="store_true", help="also the compiled baselines (slow: minutes of compilation each)")
    ap.add_argument("--compile-runners", action="store_true",
                    help="part (b) with graph runners whose forwards are compiled (inductor) before capture")
    ap.add_argument("--quick", action="store_true", help="one prompt and one sampled rule in part (a)")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--skip-costs", action="store_true")
    ap.add_argument("--skip-host", action="store_true")
    ap.add_argument("--skip-draft", action="store_true")
    ap.add_argument("--skip-draft-compile", action="store_true", help="part (d) without the compiled starts")
    ap.add_argument("--skip-capture", action="store_true")
    preset = ap.parse_known_args(argv)[0].preset
    if preset:
        ap.set_defaults(**PRESETS[preset])
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here (use --device cpu)")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="sequoia-compiled-") as tmp:
        return run(args, args.artifacts or tmp)


def run(args: argparse.Namespace, artifacts: str) -> int:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"versions": versions(device), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "preset": args.preset}
    log(f"gpu_check on {result['versions']}")

    def save() -> None:
        write_json(out_dir / "gpu_check.json", result)
        (out_dir / "gpu_check.md").write_text(markdown(result) + capture_markdown(result.get("capture")))

    t0 = time.perf_counter()
    if not args.skip_correctness:
        log("(a) correctness, tiny fp32 models")
        result["correctness"] = check_correctness(device, ("graph", "eager"), args.trials or 1500, log=log,
                                                  quick=args.quick)
        result["correctness"]["seconds"] = time.perf_counter() - t0
        save()
    if not args.skip_costs:
        log("(b) costs, random bf16 weights at real shapes" if cuda else "(b) costs, tiny stand-in shapes (CPU)")
        shapes = {"1.5b": TARGET_15B, "7b": TARGET_7B}
        targets = [shapes[t.strip().lower()] for t in args.targets.split(",") if t.strip()] if cuda else [CPU_TARGET]
        t1 = time.perf_counter()
        result["costs"] = {}
        check_costs(device, torch.bfloat16, DRAFT_05B if cuda else CPU_DRAFT, targets, args.ctx, args.new_tokens,
                    args.repeats or (20 if cuda else 3), args.compile, log=log, compiled=args.compile_runners,
                    out=result["costs"], saved=save, artifacts=artifacts)
        result["costs"]["seconds"] = time.perf_counter() - t1
        save()
    if not args.skip_host:
        log("(c) host work per engine step, tiny models on the graph runner")
        t1 = time.perf_counter()
        result["host"] = check_host(device, new_tokens=args.new_tokens, log=log)
        result["host"]["seconds"] = time.perf_counter() - t1
        save()
    if not args.skip_draft:
        log("(d) the draft alone: one graph for the whole tree against one per level; compiled starts")
        t1 = time.perf_counter()
        result["draft"] = check_draft(device, args.ctx, args.repeats or (20 if cuda else 3), log=log,
                                      compile_check=not args.skip_draft_compile, child_timeout=args.child_timeout)
        result["draft"]["seconds"] = time.perf_counter() - t1
        save()
    if not args.skip_capture:
        log("(e) capture time per CUDA graph, fresh runners" if cuda else "(e) capture time, tiny shapes (CPU)")
        result["capture"] = check_capture(device, torch.bfloat16, [DRAFT_05B, TARGET_15B] if cuda else [CPU_DRAFT],
                                          args.ctx, log=log)
        save()
    result["seconds"] = time.perf_counter() - t0
    save()
    passed = result.get("correctness", {}).get("passed", True)
    log(f"done in {result['seconds']:.0f} s; correctness {'passed' if passed else 'FAILED'}; "
        f"wrote {out_dir / 'gpu_check.md'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
