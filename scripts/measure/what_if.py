"""What the optimizer would pick on other hardware: illustrative cost models, measured acceptance vectors.

    .venv/bin/python scripts/measure/what_if.py [assets/acceptance/embedded-*.json ...]

For every acceptance vector and a few *hand-made* cost models (not measurements), prints the
tree size and depth :func:`sequoia.core.trees.optimizer.choose_tree` picks, its expected tokens per target
call and the predicted speedup over the target alone.  The models, in units of one target
decoding step:

* ``gpu, small draft``: a memory-bound target (a forward of n <= 64 tokens costs about one
  token, then grows slowly) and a draft step 5% of a target step (the paper's 68M/7B setting);
* ``gpu, this draft``: the same target, a draft step 35% of it (a 0.5B draft for a 1.5B target);
* ``cpu, measured``: the measured profile given with ``--profile`` (default: the shipped one).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sequoia.core.profiles.acceptance import AcceptanceVector  # noqa: E402
from sequoia.core.profiles.cost import illustrative_gpu_profile  # noqa: E402
from sequoia.core.profiles.profile import HardwareProfile  # noqa: E402
from sequoia.core.trees.optimizer import choose_tree  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--profile", default=str(ROOT / "assets" / "profiles" / "embedded-cpu-avx2-bf16-int8.json"))
    ap.add_argument("--max-budget", type=int, default=128)
    ap.add_argument("--max-depth", type=int, default=16)
    args = ap.parse_args(argv)
    files = args.files or sorted(str(p) for p in (ROOT / "assets" / "acceptance").glob("embedded-*.json"))
    models = {"gpu, small draft (5%)": illustrative_gpu_profile(0.05),
              "gpu, this draft (35%)": illustrative_gpu_profile(0.35)}
    if Path(args.profile).is_file():
        models["cpu, measured profile"] = HardwareProfile.load(args.profile)
    print("| acceptance | cost model | tree size | depth | tokens / call | predicted speedup |\n|---|---|---|---|---|---|")
    for f in files:
        vec = AcceptanceVector.load(f)
        for label, prof in models.items():
            c = choose_tree(vec.values, prof, max_budget=min(args.max_budget, prof.max_tokens - 1),
                            max_depth=args.max_depth)
            print(f"| {Path(f).stem} | {label} | {c.budget} | {c.depth} | {c.expected_tokens:.2f} | {c.speedup:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
