"""Where does a slow dynamic step lose: the price of its forwards at this context, or its acceptance?

    PYTHONPATH=. .venv/bin/python scripts/measure/check_context_prices.py --profile PROFILE.json \\
        --prompts docs/data/prompts-retrieval-long.jsonl --kind rag --threads 1 --clock cpu --out OUT.json

Decodes each prompt with the target alone (``ar``) and with ``sequoia-dynamic`` (the price gate off, so every
step drafts what the prior and the profile choose; ``--fit both`` also without the prompt fit of
:mod:`sequoia.runtime.proposers.prompt_fit`, interleaved), and sets every step's measured times beside the profile's
price at that step's context (:meth:`HardwareProfile.at_context`): the verify forward of the step's n nodes,
the whole step (the dynamic tree's own prediction), and the target alone's one-token step.  The tokens a step
committed are set beside the tokens it predicted.  Medians of measured over priced say whether the curves
follow the context; realized over predicted tokens whether the acceptance prior fits these prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sequoia._meta import ASSETS, pair_name  # noqa: E402
from sequoia.core.config import GenerationConfig  # noqa: E402
from sequoia.core.profiles.profile import HardwareProfile  # noqa: E402
from sequoia.runtime.engine import SpeculativeEngine  # noqa: E402
from sequoia.runtime.measuring.acceptance import load_prompts  # noqa: E402
from sequoia.runtime.measuring.finder import find_acceptance, find_calibration, find_ngram_acceptance, list_acceptance  # noqa: E402
from sequoia.runtime.measuring.timing import run_with_records, warmup  # noqa: E402
from sequoia.runtime.methods import make_method  # noqa: E402
from sequoia.runtime.models import load_pair  # noqa: E402


def step_rows(records, profile: HardwareProfile) -> list[dict]:
    """One row per decoding step (step 0, the prompt's forward, left out): measured and priced ms, tokens."""
    rows, context = [], 0
    for r in records:
        if r.prompt_tokens:
            context = r.prompt_tokens
        else:
            at = profile.at_context(context)
            n = r.tree.n_nodes
            row = {"context": context, "nodes": n, "verify_ms": 1e3 * r.verify_s,
                   "verify_priced_ms": float(at.target(n)), "step_ms": 1e3 * r.total_s, "tokens": r.n_new,
                   "cut": r.finish_reason == "length"}
            if r.dynamic is not None:
                row.update(step_predicted_ms=r.dynamic.predicted_ms, tokens_predicted=r.dynamic.predicted_tokens)
            rows.append(row)
        context += r.n_new
    return rows


def summary(rows: list[dict]) -> dict:
    """Medians of measured over priced; tokens per step without the step the length limit cut short (it
    commits what is left to generate, not what its tree yields)."""
    whole = [r for r in rows if not r.get("cut")]

    def med(key_a, key_b):
        pairs = [r[key_a] / r[key_b] for r in rows if r.get(key_b)]
        return statistics.median(pairs) if pairs else None
    return {"steps": len(rows), "median_nodes": statistics.median(r["nodes"] for r in rows) if rows else None,
            "verify_measured_over_priced": med("verify_ms", "verify_priced_ms"),
            "step_measured_over_predicted": med("step_ms", "step_predicted_ms"),
            "tokens_per_step": statistics.mean(r["tokens"] for r in whole) if whole else None,
            "tokens_predicted_per_step": (statistics.mean(r["tokens_predicted"] for r in whole if "tokens_predicted" in r)
                                          if any("tokens_predicted" in r for r in whole) else None)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--prompts", required=True, help="a JSONL prompt file")
    ap.add_argument("--kind", default="rag", help="acceptance prior (code, chat, rag, summarize, edit)")
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: this process's CPU time (with --threads 1), for a busy shared machine")
    ap.add_argument("--fit", choices=("on", "off", "both"), default="on",
                    help="the dynamic tree's prompt fit (scale on its acceptance estimates); both: each in turn")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    profile = HardwareProfile.load(args.profile)
    pair = load_pair()
    name = pair_name(pair)
    entry = find_acceptance(args.kind, 0.0, entries=list_acceptance(ASSETS, name))
    fits = {"on": (True,), "off": (False,), "both": (True, False)}[args.fit]
    variants = {fit: make_method("sequoia-dynamic", acceptance=entry.values, profile=profile,
                                 calibration=find_calibration(0.0, ASSETS, name),
                                 copy_acceptance=find_ngram_acceptance(args.kind, 0.0, ASSETS, name), price=None)
                for fit in fits}
    for fit, method in variants.items():
        method.fit = fit
    engine = SpeculativeEngine(pair, clock=clock)
    prompts = [pair.encode_prompt(p) for p in load_prompts(args.prompts)[: args.limit]]
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
    warmup(engine, pair, prompts[0], [("engine", make_method("ar"))] + [("engine", m) for m in variants.values()],
           tokens=4)
    out = []
    for i, ids in enumerate(prompts):
        alone, _ = run_with_records(engine, pair, "engine", ids, gen, make_method("ar"))
        a_rows = step_rows(alone, profile)
        a_sum = summary(a_rows)
        ar_ms = statistics.median(r["step_ms"] for r in a_rows)
        for fit, method in variants.items():
            tree, _ = run_with_records(engine, pair, "engine", ids, gen, method)
            t_rows = step_rows(tree, profile)
            t_sum = summary(t_rows)
            tree_ms_per_token = sum(r["step_ms"] for r in t_rows) / max(sum(r["tokens"] for r in t_rows), 1)
            out.append({"prompt": i, "prompt_tokens": len(ids), "fit": fit, "alone": a_sum, "dynamic": t_sum,
                        "alone_step_ms": ar_ms, "dynamic_ms_per_token": tree_ms_per_token,
                        "dynamic_vs_alone": ar_ms / tree_ms_per_token, "alone_steps": a_rows, "dynamic_steps": t_rows})
            print(f"prompt {i} ({len(ids)} tokens): target alone {ar_ms:.0f} ms/step, priced "
                  f"x{a_sum['verify_measured_over_priced']:.2f}; dynamic (fit {'on' if fit else 'off'}) "
                  f"{tree_ms_per_token:.0f} ms/token ({ar_ms / tree_ms_per_token:.2f}x), {t_sum['median_nodes']} "
                  f"nodes, verify priced x{t_sum['verify_measured_over_priced']:.2f}, step predicted "
                  f"x{t_sum['step_measured_over_predicted']:.2f}, tokens {t_sum['tokens_per_step']:.2f} of "
                  f"{t_sum['tokens_predicted_per_step']:.2f} predicted", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"profile": args.profile, "prompts": args.prompts, "kind": args.kind,
                                              "threads": torch.get_num_threads(), "clock": args.clock,
                                              "pair": name, "rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
