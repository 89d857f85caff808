"""Measure the acceptance of copied tokens (by match length and depth) on the embedded pair.

    .venv/bin/python scripts/measure/measure_ngram_acceptance.py [set ...] [--tokens N] [--prompts K] [--only greedy|t0.6]

Writes ``assets/acceptance/ngram-embedded-<set>-<greedy|t0.6>.json`` for each prompt set
(``assets/prompts/<set>.jsonl``; default: code and chat), from real ``ngram`` decodes where
every node of each step's trie is verified (see :mod:`sequoia.runtime.measuring.ngram_acceptance`).
Defaults: the first 6 prompts, 48 new tokens each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from sequoia.core.config import SamplingConfig
from sequoia.runtime.measuring.acceptance import load_prompts
from sequoia.runtime.measuring.ngram_acceptance import measure_ngram_acceptance
from sequoia.runtime.models import load_pair

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "assets" / "prompts"
OUT = ROOT / "assets" / "acceptance"
SETTINGS = {"greedy": SamplingConfig(0.0), "t0.6": SamplingConfig(0.6)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", nargs="*", default=["code", "chat"])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--only", choices=sorted(SETTINGS), default=None)
    args = ap.parse_args()
    pair = load_pair()
    OUT.mkdir(parents=True, exist_ok=True)
    for set_name in args.sets:
        prompts = load_prompts(PROMPTS / f"{set_name}.jsonl")[:args.prompts]
        for tag, sampling in SETTINGS.items():
            if args.only and tag != args.only:
                continue
            t0 = time.perf_counter()
            acc = measure_ngram_acceptance(pair, prompts, sampling, args.tokens, prompt_set=set_name)
            path = OUT / f"ngram-embedded-{set_name}-{tag}.json"
            acc.save(path)
            print(f"{path.name}: {acc.tokens} tokens, {time.perf_counter() - t0:.0f} s", flush=True)
            for n, (row, cnt) in enumerate(zip(acc.table, acc.counts), 1):
                cells = " ".join(f"{v:.2f}({c})" for v, c in zip(row, cnt))
                print(f"  n={n}: {cells}", flush=True)


if __name__ == "__main__":
    main()
