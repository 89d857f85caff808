"""Time the Sequoia DP (sequoia.core.trees.dp.optimal_tree) for a few budgets, depths and widths.

Run from the repository root:  python scripts/measure/bench_dp.py [--repeats 3]
Prints the best of ``--repeats`` wall times per case; the headline case is budget
512, depth 16, W = 16.  No model is loaded.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from sequoia.core.trees.dp import optimal_tree  # noqa: E402

CASES = (  # (budget, depth, width W)
    (64, 8, 16),
    (128, 16, 16),
    (256, 16, 16),
    (512, 16, 16),
    (512, 16, 32),
    (1024, 16, 16),
    (1024, 64, 16),
)


def acceptance_vector(width: int, total: float = 0.9, decay: float = 0.6) -> np.ndarray:
    """A deterministic, decreasing vector shaped like measured ones: p_k ~ decay**k, summing to ``total``."""
    p = decay ** np.arange(width)  # [W]
    return p / p.sum() * total


def time_case(budget: int, depth: int, width: int, repeats: int) -> tuple[float, float, int, int]:
    """Best-of-``repeats`` seconds, the optimal value, and the optimal tree's size and depth."""
    p = acceptance_vector(width)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = optimal_tree(p, budget, depth)
        best = min(best, time.perf_counter() - start)
    tree = result.tree()
    return best, result.value(), tree.size, tree.depth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="timed solves per case; the best is printed")
    args = ap.parse_args()
    print(f"{'budget':>7} {'depth':>6} {'W':>4} {'seconds':>9} {'tokens/step':>12} {'tree n':>7} {'tree d':>7}")
    for budget, depth, width in CASES:
        seconds, value, size, tree_depth = time_case(budget, depth, width, args.repeats)
        print(f"{budget:>7} {depth:>6} {width:>4} {seconds:>9.3f} {value:>12.4f} {size:>7} {tree_depth:>7}")


if __name__ == "__main__":
    main()
