"""Write a random-weight draft/target pair as Hugging Face folders at real shapes (no download).

    python scripts/make_random_pair.py --out DIR [--pair embedded|7b] [--tiny] [--seed 0] [--device cuda]
    SEQUOIA_DRAFT=DIR/draft SEQUOIA_TARGET=DIR/target SEQUOIA_DEVICE=cuda python app.py

--pair embedded: Qwen2.5-Coder 0.5B -> 1.5B shapes (4 GB in bf16); --pair 7b: 0.5B -> Qwen2.5-7B shapes
(16 GB); --tiny: a few-MB stand-in for tests.  --device cuda builds the weights on the GPU (a 7B model in
seconds); the same seed on the same device writes the same bytes.  --tokenizer DIR copies a tokenizer folder
(default: the converted embedded target's when present, else a byte-level tokenizer built here).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script from anywhere

from sequoia.runners.hf.loading import resolve_dtype  # noqa: E402
from sequoia.tools.random_pair import PAIRS, make_pair  # noqa: E402


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder to write draft/ and target/ into")
    ap.add_argument("--pair", default="embedded", choices=[p for p in PAIRS if p != "tiny"])
    ap.add_argument("--tiny", action="store_true", help="the tiny stand-in pair (tests; overrides --pair)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="where the weights are drawn (cpu, cuda)")
    ap.add_argument("--dtype", default="bf16", help="bf16 | fp16 | fp32")
    ap.add_argument("--tokenizer", default="auto",
                    help="a folder with tokenizer.json to copy; 'bytes' for the byte-level one; 'auto'")
    args = ap.parse_args(argv)
    if args.seed < 0:
        ap.error("--seed must be >= 0")
    try:
        dtype = resolve_dtype(args.dtype, torch.device("cpu"))
    except ValueError as exc:
        ap.error(f"--dtype: {exc}")
    tokenizer = None if args.tokenizer == "bytes" else args.tokenizer
    if tokenizer not in (None, "auto") and not Path(tokenizer).is_dir():
        ap.error(f"--tokenizer: no such folder {tokenizer!r}")
    written = make_pair(Path(args.out), "tiny" if args.tiny else args.pair, args.seed, args.device, dtype,
                        tokenizer, log=lambda msg: print(msg, flush=True))
    print(f"tokenizer: {written['tokenizer']}; wrote {Path(args.out) / 'random_pair.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
