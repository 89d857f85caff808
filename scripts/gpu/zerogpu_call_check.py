"""The ZeroGPU call check: each call in a process forked for it, as ZeroGPU runs the page's work, timed.

    python3 scripts/gpu/zerogpu_call_check.py --out DIR [--device cuda|cpu] [--shapes 1.5b,7b] [--timeout 240]

The draft and target are built on the host in this process (random bf16 weights at Qwen2.5-Coder-0.5B's shapes and
the target's: 1.5B, 7B; ``--device cpu``: tiny stand-ins), CUDA never touched here.  Then, per target shape, two
calls, each in a process forked for it where CUDA is first initialised: one capturing its graphs
(sequoia/runners/hf/graphs/call_graphs.py, as the app's ZeroGPU calls do) and one eager.  Each call moves the weights onto
the card, then decodes the guided example (the 12-token depth-5 tree at T=0.6, 48 tokens) and the page's default
decode (the tree the optimizer picks for the shipped code vector on the H100's measured costs at that shape, T=0,
128 tokens), each beside the target alone in the same call.  Random weights accept nothing, so each tree row is also
projected with the shipped vector (its expected tokens a step over its measured step).  JSON out after each call:
DIR/zerogpu_call_check.json (weights-to-card seconds, each capture's seconds, first-token seconds, tokens/s of each
row, eager beside graphs) and a Markdown summary beside it.  On a CPU the replays are emulated and every number is
the CPU's: the form is checked, not the card.
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
from sequoia.core.profiles.projection import load_elsewhere  # noqa: E402
from sequoia.runtime.measuring.finder import find_acceptance  # noqa: E402
from sequoia.runtime.measuring.gpu_call import proxy_profile  # noqa: E402
from sequoia.tools.gpucheck.models import CPU_DRAFT, CPU_TARGET, DRAFT_05B, TARGET_7B, TARGET_15B  # noqa: E402
from sequoia.tools.gpucheck.zerogpu_call import forked, host_model, one_call, rows, summarise  # noqa: E402

ASSETS = Path(__file__).resolve().parents[2] / "assets"
#: target shape -> (draft shape, target shape, the shipped graph-runner profile the trees are chosen on)
SHAPES = {"1.5b": (DRAFT_05B, TARGET_15B, "h100-1.5b"), "7b": (DRAFT_05B, TARGET_7B, "h100-7b"),
          "tiny": (CPU_DRAFT, replace(CPU_TARGET, vocab=640), None)}   # vocabularies padded apart, as 0.5B vs 7B


def log(msg: str) -> None:
    print(msg, flush=True)


def main(argv: list[str]) -> int:
    args = _args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = ["tiny"] if args.device == "cpu" else [s.strip() for s in args.shapes.split(",") if s.strip()]
    if args.device == "cpu":
        torch.set_num_threads(1)
    result: dict = {"versions": _versions(), "device_asked": args.device, "shapes": {},
                    "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    code_t0, code_t06 = (find_acceptance("code", t, ASSETS).values for t in (0.0, 0.6))

    def save() -> None:
        write_json(out / "zerogpu_call_check.json", result)
        (out / "zerogpu_call_check.md").write_text(markdown(result))

    for name in shapes:
        draft_shape, target_shape, projection = SHAPES[name]
        profile = load_elsewhere(ASSETS / "projections" / f"{projection}.json").profile if projection else \
            proxy_profile(ASSETS)
        decodes = rows(profile, code_t0, code_t06)
        t0 = time.perf_counter()
        draft = host_model(draft_shape, torch.bfloat16 if args.device != "cpu" else torch.float32, seed=1)
        target = host_model(target_shape, torch.bfloat16 if args.device != "cpu" else torch.float32, seed=2)
        entry = result["shapes"][name] = {"draft": draft_shape.name, "target": target_shape.name,
                                          "host_build_s": time.perf_counter() - t0,
                                          "trees_chosen_on": projection or "the H100 proxy (CPU form)",
                                          "calls": {}}
        log(f"{name}: built on the host in {entry['host_build_s']:.1f} s; rows: {[r.method for r in decodes]}")
        vocab = min(draft_shape.vocab, target_shape.vocab)
        for mode in ("graphs", "eager"):
            call = forked(one_call, draft, target, args.device, mode == "graphs", decodes, vocab,
                          timeout=args.timeout)
            entry["calls"][mode] = call
            result.setdefault("device_name", call.get("device_name"))
            log(f"  {mode} call: " + (call.get("error") or f"{call['call_s']:.1f} s in the call "
                                      f"({call['forked_call_s']:.1f} s forked), weights to the card "
                                      f"{call['weights_to_card_s']:.1f} s; {call['line']}"))
            for r in call.get("rows", []):
                log(f"    {r['row']:8} {r['method']:28} {r['tokens_per_s']:8.1f} tokens/s, step {r['step_ms']:.1f} ms, "
                    f"first token {r['first_token_s']:.2f} s, captures {r['captures']} ({r['capture_s']:.2f} s)")
            save()
        entry["summary"] = summarise(entry["calls"])
        del draft, target
        save()
    result["seconds"] = time.perf_counter() - _T0
    save()
    log(markdown(result))
    return 0


def markdown(result: dict) -> str:
    lines = [f"# ZeroGPU call check ({result.get('device_name') or result['device_asked']})", "",
             f"torch {result['versions'].get('torch')}, transformers {result['versions'].get('transformers')}", ""]
    for name, entry in result["shapes"].items():
        lines += [f"## {entry['draft']} -> {entry['target']}", "",
                  "| call | row | method | tokens/s | step ms | first token s | captures (s) | projected tokens/s |",
                  "|---|---|---|---|---|---|---|---|"]
        for mode, call in entry["calls"].items():
            if "error" in call:
                lines.append(f"| {mode} | error | {call['error']} | | | | | |")
                continue
            for r in call["rows"]:
                proj = f"{r['projected_tokens_per_s']:.1f}" if "projected_tokens_per_s" in r else ""
                lines.append(f"| {mode} | {r['row']} | {r['method']} | {r['tokens_per_s']:.1f} | {r['step_ms']:.2f} | "
                             f"{r['first_token_s']:.2f} | {r['captures']} ({r['capture_s']:.2f}) | {proj} |")
        for example, modes in entry.get("summary", {}).items():
            for mode, s in modes.items():
                proj = f", projected {s['projected_ratio']:.2f}x" if "projected_ratio" in s else ""
                lines.append(f"\n{example}, {mode}: the tree {s['measured_ratio']:.2f}x the target alone measured "
                             f"(random weights){proj} (the shipped vector over the measured steps)")
        lines.append("")
    return "\n".join(lines)


def _versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers",):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = "not installed"
    return out


def _args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for zerogpu_call_check.json / .md")
    ap.add_argument("--device", default="cuda", help="cuda (the check) or cpu (its form, tiny models)")
    ap.add_argument("--shapes", default="1.5b,7b", help="target shapes, comma-separated: 1.5b, 7b")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds one call may take before it is killed")
    args = ap.parse_args(argv)
    unknown = [s for s in args.shapes.split(",") if s.strip() and s.strip() not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {', '.join(unknown)}; use 1.5b, 7b")
    return args


_T0 = time.perf_counter()

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
