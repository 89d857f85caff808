"""Predicted vs measured time per token: does the hardware profile's cost model hold on real decoding?

    .venv/bin/python scripts/measure/check_prediction.py --profile assets/profiles/<file>.json \\
        --acceptance assets/acceptance/embedded-code-greedy.json --prompts code --limit 3

For the optimizer's choice and a few fixed trees (chains, DP trees of fixed budgets), prints the
predicted ms/token and tokens/step (from :func:`sequoia.core.trees.optimizer.predict`) beside what the engine
measures decoding the prompts greedily (or at ``--temperature``) with the embedded pair, and the
relative error.  Writes the table as JSON with ``--out``.  The profile should have been measured
on this machine, with the same thread count, when it was as quiet as it is now.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sequoia.core.config import GenerationConfig, SamplingConfig  # noqa: E402
from sequoia.core.profiles.acceptance import AcceptanceVector  # noqa: E402
from sequoia.core.profiles.profile import HardwareProfile  # noqa: E402
from sequoia.core.trees.optimizer import predict, trees_to_check  # noqa: E402
from sequoia.core.trees.tree import Tree  # noqa: E402
from sequoia.runtime.drafter import StaticTreeProposer  # noqa: E402
from sequoia.runtime.engine import SpeculativeEngine  # noqa: E402
from sequoia.runtime.measuring.acceptance import load_prompts  # noqa: E402
from sequoia.runtime.measuring.finder import find_calibration  # noqa: E402
from sequoia.runtime.measuring.timing import run_method, warmup  # noqa: E402
from sequoia.runtime.methods import make_method  # noqa: E402
from sequoia.runtime.models import load_pair  # noqa: E402


def measure(engine, prompts, tree, config, proposer=None, parts: dict | None = None) -> tuple[float, float, int]:
    """(ms per token, tokens per step, tokens) over all prompts, through the bench's runner.

    The prediction prices decoding steps, so the steps' time is compared (the run's prefill is left out).
    ``proposer`` replaces the static tree (the dynamic tree, which has no single shape to predict).
    ``parts`` (a dict) receives the summed draft, verify and other seconds and the step count, for the
    breakdown against the profile's draft-level and verify costs.
    """
    seconds, tokens, steps = 0.0, 0, 0
    proposer = proposer or StaticTreeProposer(tree)
    warmup(engine, engine.pair, prompts[0], [("tree", proposer)], tokens=2)
    for ids in prompts:
        run = run_method(engine, engine.pair, "tree", ids, config, proposer)
        seconds += run.draft_s + run.verify_s + run.other_s
        tokens += run.new_tokens
        steps += run.steps
        if parts is not None:
            for key, value in (("draft_s", run.draft_s), ("verify_s", run.verify_s), ("other_s", run.other_s),
                               ("steps", run.steps)):
                parts[key] = parts.get(key, 0) + (value or 0)
    return 1000 * seconds / max(tokens, 1), tokens / max(steps, 1), tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--acceptance", required=True)
    ap.add_argument("--prompts", default="code", help="code, chat or a JSONL file")
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--budgets", default="4,8,16")
    ap.add_argument("--chains", default="2,4")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--backend", default="hf", choices=("hf", "llamacpp", "mixed"),
                    help="the runtime to decode on (the profile should be this runtime's)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--dynamic", action="store_true",
                    help="also time the dynamic tree (the page's default method) under the same profile")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    profile = HardwareProfile.load(args.profile)
    acc = AcceptanceVector.load(args.acceptance).values
    path = Path(args.prompts)
    if not path.is_file():
        path = ROOT / "assets" / "prompts" / f"{args.prompts}.jsonl"
    pair = load_pair(dtype=args.dtype, backend=args.backend)
    prompts = [pair.encode_prompt(p) for p in load_prompts(path)[: args.limit]]
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, sampling=SamplingConfig(args.temperature))
    engine = SpeculativeEngine(pair)
    choice, trees = trees_to_check(acc, profile, [int(b) for b in args.budgets.split(",") if b],
                                   [int(c) for c in args.chains.split(",") if c])
    measure(engine, prompts[:1], Tree.chain(2), GenerationConfig(max_new_tokens=4))  # warm-up
    rows = []
    print("| tree | nodes | predicted ms/token | measured ms/token | error | predicted tokens/step "
          "| measured tokens/step | verify ms/step: predicted, measured | draft ms/step: predicted, measured |"
          "\n|---|---|---|---|---|---|---|---|---|", flush=True)
    for label, tree in trees:
        pred = predict(tree, acc, profile)
        t0 = time.perf_counter()
        parts: dict = {}
        ms, per_step, tokens = measure(engine, prompts, tree, config, parts=parts)
        n_steps = max(parts.get("steps", 0), 1)
        verify_ms, draft_ms = 1000 * parts.get("verify_s", 0) / n_steps, 1000 * parts.get("draft_s", 0) / n_steps
        row = dict(tree=label, nodes=tree.size, predicted_ms_per_token=pred.ms_per_token, measured_ms_per_token=ms,
                   relative_error=ms / pred.ms_per_token - 1.0, predicted_tokens_per_step=pred.expected_tokens,
                   measured_tokens_per_step=per_step, tokens=tokens, wall_s=time.perf_counter() - t0,
                   predicted_verify_ms=pred.target_ms, measured_verify_ms=verify_ms,
                   predicted_draft_ms=pred.draft_ms, measured_draft_ms=draft_ms)
        rows.append(row)
        print(f"| {label} | {tree.size} | {pred.ms_per_token:.0f} | {ms:.0f} | {row['relative_error']:+.0%} "
              f"| {pred.expected_tokens:.2f} | {per_step:.2f} | {pred.target_ms:.0f}, {verify_ms:.0f} "
              f"| {pred.draft_ms:.0f}, {draft_ms:.0f} |", flush=True)
    if args.dynamic:  # no fixed shape, so no prediction: its measured speed beside the static trees
        dyn = make_method("sequoia-dynamic", acceptance=acc, profile=profile,
                          calibration=find_calibration(args.temperature))
        t0 = time.perf_counter()
        ms, per_step, tokens = measure(engine, prompts, None, config, dyn)
        rows.append({"tree": "dynamic tree", "nodes": None, "predicted_ms_per_token": None,
                     "measured_ms_per_token": ms, "relative_error": None, "predicted_tokens_per_step": None,
                     "measured_tokens_per_step": per_step, "tokens": tokens, "wall_s": time.perf_counter() - t0})
        print(f"| dynamic tree | - | - | {ms:.0f} | - | - | {per_step:.2f} |", flush=True)
    best = min(rows, key=lambda r: r["measured_ms_per_token"])
    print(f"\nfastest measured: {best['tree']} ({best['measured_ms_per_token']:.0f} ms/token)", flush=True)
    for row in [rows[1]] + rows[len(trees):]:  # the automatic choices: the optimizer's tree, the dynamic tree
        print(f"{row['tree']}: {best['measured_ms_per_token'] / row['measured_ms_per_token']:.0%} of its speed",
              flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "profile": str(args.profile), "acceptance": str(args.acceptance), "prompts": str(path.name),
            "limit": args.limit, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
            "threads": torch.get_num_threads(), "pair": pair.target_name, "dtype": str(pair.dtype),
            "choice": {"budget": choice.budget, "depth": choice.depth, "speedup": choice.speedup},
            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
