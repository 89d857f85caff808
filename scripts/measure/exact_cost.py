"""What exact mode costs, as the app pays it: the float32 target loaded beside the default pair.

    python scripts/measure/exact_cost.py [TOKENS] [ROUNDS]

Loads the default pair (as ``python app.py`` does), reads the process's RSS, loads the exact-mode target
(:func:`sequoia.runtime.checks.exactness.load_exact_target`, the draft shared), reads it again, then times the
target alone (greedy, TOKENS new tokens, default 16) on both targets, interleaved for ROUNDS rounds
(default 2), and one 16-row forward of each after the same prompt.  Prints medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from sequoia.core.config import GenerationConfig
from sequoia.runtime.checks.exactness import exact_pair, load_exact_target
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.measuring.timing import run_method
from sequoia.runtime.methods import make_method
from sequoia.runtime.models import load_pair

PROMPT = "Write a Python function that checks whether a number is prime."


def rss_gb() -> float:
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1e6


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tokens", nargs="?", type=int, default=16, help="new tokens of each target-alone run")
    ap.add_argument("rounds", nargs="?", type=int, default=2, help="interleaved rounds")
    args = ap.parse_args(argv)
    tokens, rounds = args.tokens, args.rounds
    t0 = time.perf_counter()
    pair = load_pair()
    print(f"default pair {pair.draft_name} -> {pair.target_name}: {time.perf_counter() - t0:.1f} s, "
          f"RSS {rss_gb():.2f} GB", flush=True)
    t0 = time.perf_counter()
    exact = exact_pair(pair, load_exact_target(name=pair.target_name))
    print(f"+ float32 target: {time.perf_counter() - t0:.1f} s, RSS {rss_gb():.2f} GB", flush=True)
    ids = pair.encode_prompt(PROMPT)
    config = GenerationConfig(max_new_tokens=tokens)
    times: dict[str, list[float]] = {"default": [], "exact": []}
    wide: dict[str, list[float]] = {"default": [], "exact": []}
    for _ in range(rounds):
        for name, p in (("default", pair), ("exact", exact)):
            run = run_method(SpeculativeEngine(p), p, "ar", ids, config, make_method("ar"))
            times[name].append((run.seconds - run.first_token_s) / max(run.new_tokens - 1, 1))
            session = p.target.session()
            session.forward(ids, keep=1)
            t1 = time.perf_counter()
            session.forward(list(run.tokens[:16]) + [0] * max(0, 16 - len(run.tokens)))
            wide[name].append(time.perf_counter() - t1)
    for name in times:
        print(f"{name}: one-token step {1e3 * statistics.median(times[name]):.0f} ms, 16-row forward "
              f"{1e3 * statistics.median(wide[name]):.0f} ms (medians of {rounds}; load {os.getloadavg()[0]:.1f})")
    print(f"RSS at the end {rss_gb():.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
