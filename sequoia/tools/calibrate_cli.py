"""``python -m sequoia calibrate``: fit the dynamic tree's confidence-to-acceptance calibration.

    python -m sequoia calibrate --texts sequoia/core/*.py README.md --out-dir assets/acceptance

Writes one ``calibration-NAME-tT.json`` per temperature (see :mod:`sequoia.core.profiles.calibration`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..core.config import SamplingConfig
from ..runtime.measuring.acceptance import load_prompts
from ..runtime.measuring.calibration import calibrate, calibrate_prompts, text_sequences
from .common import add_model_args, load_from_args

DESCRIPTION = "Fit the confidence-to-acceptance calibration of the dynamic tree."


def add_parser(subparsers) -> argparse.ArgumentParser:
    """The ``calibrate`` subcommand on ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    ap = subparsers.add_parser("calibrate", description=DESCRIPTION,
                               help="fit the dynamic tree's confidence-to-acceptance calibration")
    _add_arguments(ap)
    return ap


def _add_arguments(ap: argparse.ArgumentParser) -> None:
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", nargs="+", help="JSONL prompt files: score what the target writes (slow)")
    src.add_argument("--texts", nargs="+", help="text files: score chunks of them (fast)")
    ap.add_argument("--out-dir", default="assets/acceptance")
    ap.add_argument("--name", default="embedded", help="file names: calibration-NAME-tT.json")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.6])
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64, help="continuation length (--prompts)")
    ap.add_argument("--chunk", type=int, default=160, help="tokens per text chunk (--texts)")
    ap.add_argument("--limit", type=int, default=None, help="most prompts or chunks per file")
    add_model_args(ap)


def run(args: argparse.Namespace) -> int:
    samplings = [SamplingConfig(temperature=t) for t in args.temperatures]
    missing = [f for f in (args.texts or args.prompts) if not Path(f).is_file()]
    if missing:  # before the minute it takes to load the models
        raise FileNotFoundError(f"no such file: {', '.join(missing)}")
    pair = load_from_args(args)

    def progress(_fraction: float, desc: str) -> None:
        print(desc, flush=True)

    if args.texts:
        sequences = text_sequences(pair, args.texts, args.chunk, args.limit)
        cals = calibrate(pair, sequences, samplings, args.width, progress=progress,
                         prompt_set="texts:" + ",".join(Path(f).name for f in args.texts))
    else:
        prompts = [pair.encode_prompt(p) for f in args.prompts for p in load_prompts(f)[: args.limit]]
        cals = calibrate_prompts(pair, prompts, samplings, args.max_new_tokens, args.width, progress=progress,
                                 prompt_set=",".join(Path(f).name for f in args.prompts))
    for cal in cals:
        path = Path(args.out_dir) / f"calibration-{args.name}-t{cal.temperature:g}.json"
        cal.save(path)
        print(json.dumps({"out": str(path), "observations": cal.steps, "acceptance": cal.acceptance}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """python -m sequoia.tools.calibrate_cli ...: the same command on its own."""
    ap = argparse.ArgumentParser(prog="python -m sequoia calibrate", description=DESCRIPTION)
    _add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
