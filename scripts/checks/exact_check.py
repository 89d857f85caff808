"""Exact mode on the embedded pair: does every method print the target alone's greedy text?

    python scripts/checks/exact_check.py OUT.json [SETS] [PROMPTS] [TOKENS] [THREADS]

SETS: comma-separated prompt sets of assets/prompts (default: all, short ones first); PROMPTS per set
(default 5); TOKENS new tokens (default 32); THREADS torch threads (default 1: on a shared 2-core machine
one thread per process wastes less to contention).  Loads the pair as ``--exact`` does (float32 plain
target, the default draft) and, at T=0, runs the target alone and chain, SpecInfer and Sequoia on every
prompt, one after the other.  Results are written after every prompt, so a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from sequoia._meta import ASSETS
from sequoia.core.config import GenerationConfig
from sequoia.runtime.checks.exactness import is_exact, load_exact_pair
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.measuring.acceptance import load_prompts
from sequoia.runtime.measuring.timing import run_method
from sequoia.runtime.methods import make_method

SETS = ("code", "chat", "summarize", "rag", "edit")
METHODS = {"chain": dict(budget=4), "specinfer": dict(width=2, depth=4), "sequoia": dict(budget=16, depth=6)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="JSON file the results are written to (after every prompt)")
    ap.add_argument("sets", nargs="?", default="", help="comma-separated prompt sets (default: all)")
    ap.add_argument("prompts", nargs="?", type=int, default=5, help="prompts per set")
    ap.add_argument("tokens", nargs="?", type=int, default=32, help="new tokens")
    ap.add_argument("threads", nargs="?", type=int, default=1, help="torch threads")
    args = ap.parse_args(argv)
    out = Path(args.out)
    sets = args.sets.split(",") if args.sets else list(SETS)
    per_set, tokens = args.prompts, args.tokens
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    pair = load_exact_pair(progress=lambda f, d: print(f"  {f:.0%} {d}", file=sys.stderr))
    assert is_exact(pair), "the exact pair's target must be float32 with the plain forward"
    engine = SpeculativeEngine(pair)
    config = GenerationConfig(max_new_tokens=tokens)
    report = dict(pair=f"{pair.draft_name} -> {pair.target_name}", tokens=tokens, threads=torch.get_num_threads(),
                  load_s=time.perf_counter() - t0, machine=os.uname().nodename, prompts=[])
    for name in sets:
        for i, prompt in enumerate(load_prompts(ASSETS / "prompts" / f"{name}.jsonl")[:per_set]):
            ids = pair.encode_prompt(prompt, chat=True)
            ref = run_method(engine, pair, "ar", ids, config, make_method("ar"))
            row = dict(set=name, index=i, prompt_tokens=len(ids), reference=list(ref.tokens),
                       seconds={"ar": ref.seconds}, identical={}, load1=os.getloadavg()[0])
            for method, kwargs in METHODS.items():
                run = run_method(engine, pair, method, ids, config, make_method(method, **kwargs))
                row["identical"][method] = run.tokens == ref.tokens
                row["seconds"][method] = run.seconds
            report["prompts"].append(row)
            out.write_text(json.dumps(report, indent=1))
            same = all(row["identical"].values())
            print(f"{name}[{i}] {len(ids)} prompt tokens: {'identical' if same else 'DIFFERS'} "
                  f"{row['identical']} {({k: round(v, 1) for k, v in row['seconds'].items()})} "
                  f"load {row['load1']:.1f}", flush=True)
    report["total_s"] = time.perf_counter() - t0
    out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
