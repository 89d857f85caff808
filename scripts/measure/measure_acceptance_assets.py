"""Regenerate the shipped acceptance vectors of the embedded pair (assets/acceptance/).

    python scripts/measure/measure_acceptance_assets.py [max_new_tokens] [only] [sets]

``only`` (e.g. ``chat-t1.0``) regenerates just the files whose name contains it.
``sets`` is a comma-separated list of shipped prompt sets (default ``code,chat``),
e.g. ``summarize,rag,edit`` for the long-context sets.
The code and chat files were made with ``48``: about 5 minutes a file on a 2-core CPU,
except chat at T=1.0, where flat distributions make the Monte Carlo slow
(about 15 minutes).  The long-context files (summarize, rag, edit; prompts of
about 550-750 tokens) were made on a contended CPU to fit the time: greedy summarize
with ``32`` (about 5 minutes a prompt), the others with ``16``, greedy and T=0.6 only
(``32 greedy summarize``, ``16 greedy rag,edit``, ``16 t0.6 summarize,rag,edit``).
All greedy files are written before any sampled one, so a stopped run keeps them.

Teacher-forced (see :mod:`sequoia.runtime.measuring.acceptance`), width 16, for each prompt set
(assets/prompts/<set>.jsonl) at greedy, T=0.6 and T=1.0.  The
continuations are written by the target, so this takes a while on a CPU
(about 12 prompts x max_new_tokens target decode steps per file).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from sequoia.core.config import SamplingConfig  # noqa: E402
from sequoia.runtime.measuring.acceptance import load_prompts, measure_acceptance  # noqa: E402
from sequoia.runtime.models import load_pair  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "assets" / "prompts"
OUT = ROOT / "assets" / "acceptance"
SETTINGS = {"greedy": SamplingConfig(0.0), "t0.6": SamplingConfig(0.6), "t1.0": SamplingConfig(1.0)}
WIDTH = 16
SEED = 0


def main(max_new_tokens: int = 48, only: str = "", sets: str = "code,chat") -> None:
    names = [s.strip() for s in sets.split(",") if s.strip()]
    prompt_sets = {name: load_prompts(PROMPTS / f"{name}.jsonl") for name in names}  # fail before loading the pair
    pair = load_pair()
    OUT.mkdir(parents=True, exist_ok=True)
    for tag, sampling in SETTINGS.items():
        for set_name, prompts in prompt_sets.items():
            if only not in f"{set_name}-{tag}":
                continue
            t0 = time.perf_counter()
            vec = measure_acceptance(pair, prompts, sampling, width=WIDTH, max_new_tokens=max_new_tokens,
                                     generator=torch.Generator().manual_seed(SEED), prompt_set=set_name)
            path = OUT / f"embedded-{set_name}-{tag}.json"
            vec.save(path)
            head = ", ".join(f"{v:.3f}" for v in vec.values[:4])
            print(f"{path.name}: p = [{head}, ...] sum {sum(vec.values):.3f} over {vec.positions} positions "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("max_new_tokens", nargs="?", type=int, default=48, help="target-written tokens per prompt")
    ap.add_argument("only", nargs="?", default="", help="regenerate only files whose name contains this")
    ap.add_argument("sets", nargs="?", default="code,chat", help="comma-separated shipped prompt sets")
    return ap.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    main(args.max_new_tokens, args.only, args.sets)
