"""The Distribution check tab's work from the command line, timed (the pair the app loads by default).

    python scripts/checks/distribution_check.py ["PROMPT"] [TEMPERATURE] [TRIALS] [SEEDS] [TOP_P]

Loads the default pair (as ``python app.py`` does), then runs :func:`sequoia.runtime.checks.distribution_check.iter_check`
(both prompt forwards, then every rule's trials) SEEDS times (default 1) and prints each rule's verdict,
p-value and the seconds each whole check took, the forwards included.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from sequoia.core.config import SamplingConfig
from sequoia.core.verification.distribution import DEFAULT_CHILDREN, DEFAULT_TRIALS
from sequoia.runtime.checks.distribution_check import run_check
from sequoia.runtime.models import load_pair


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("prompt", nargs="?", default="Write a haiku about autumn leaves.")
    ap.add_argument("temperature", nargs="?", type=float, default=1.0)
    ap.add_argument("trials", nargs="?", type=int, default=DEFAULT_TRIALS, help="trials per rule")
    ap.add_argument("seeds", nargs="?", type=int, default=1, help="checks to run")
    ap.add_argument("top_p", nargs="?", type=float, default=0.95, help="the tab's default")
    args = ap.parse_args(argv)
    prompt, temperature, trials, seeds, top_p = args.prompt, args.temperature, args.trials, args.seeds, args.top_p
    t0 = time.perf_counter()
    pair = load_pair()
    print(f"loaded {pair.draft_name} -> {pair.target_name} in {time.perf_counter() - t0:.1f} s", flush=True)
    ids = pair.encode_prompt(prompt)
    right = 0
    for seed in range(seeds):
        t1 = time.perf_counter()
        state = run_check(pair, ids, SamplingConfig(temperature=temperature, top_p=top_p), trials, DEFAULT_CHILDREN, seed)
        seconds = time.perf_counter() - t1
        right += all(r.as_expected for r in state.results)
        support = int(((state.p > 0) | (state.q > 0)).sum())
        print(f"seed {seed}: {seconds:.1f} s (forwards {state.forward_s:.1f} s, support {support} tokens, "
              f"load {os.getloadavg()[0]:.1f}); " + "; ".join(
                  f"{r.rule.name} p={r.fit.p_value:.3g} {'pass' if r.passed else 'FAIL'} ({r.seconds:.1f} s)"
                  for r in state.results), flush=True)
    print(f"{right}/{seeds} checks with every verdict as the theory says")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
