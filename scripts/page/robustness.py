"""Robustness (the Sequoia paper's rejection-rate figure), teacher-forced on a real pair.

Average rejection rate (the probability that *every* one of k speculated
children of a node is rejected) against k, at several temperatures, for the
three ways of drawing children (:mod:`sequoia.core.verification.sampling`): without replacement
(Sequoia), with replacement (SpecInfer) and top-k.

The target first writes a continuation of each prompt (sampled at
``--context-temperature``), keeping its logits p; one forward of the draft
over prompt + continuation gives q (:mod:`sequoia.runtime.checks.teacher`).  At each
position and temperature a seeded Monte Carlo draws K children and runs the
verification rule vectorised over positions and samples
(:func:`sequoia.runtime.measuring.acceptance.rejection_curves`); the first k of K children drawn are a valid draw of k
children for all three modes, so one run gives the whole curve.

    .venv/bin/python scripts/page/robustness.py --out out/robustness

Writes robustness.json and robustness.html/.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from sequoia._meta import ASSETS  # noqa: E402
from sequoia.core.config import SamplingConfig  # noqa: E402
from sequoia.runtime.checks.teacher import continuation_logits  # noqa: E402
from sequoia.runtime.measuring.acceptance import rejection_curves  # noqa: E402
from sequoia.tools.bench import encode, load_prompt_sets  # noqa: E402
from sequoia.tools.bench_figures import robustness_figure, write_figures  # noqa: E402
from sequoia.tools.common import add_model_args, load_from_args  # noqa: E402


def teacher_logits(args, key: dict, cache: Path, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits over target-written continuations.  # [positions, V] each

    Kept in ``cache`` (with the ``key`` settings that made them) so a rerun skips the models entirely.
    """
    if cache.exists():
        saved = torch.load(cache)
        if saved["settings"] == key:
            return saved["p"], saved["q"]
    pair = load_from_args(args)
    p_rows, q_rows = [], []
    for s in load_prompt_sets(args.prompts, ASSETS / "prompts", args.limit):
        for text in s.prompts:
            cont, p, q = continuation_logits(pair, encode(pair, text), SamplingConfig(args.context_temperature),
                                             args.max_new_tokens, gen)
            p_rows.append(p)
            q_rows.append(q)
            print(f"{s.name}: {len(cont)} positions", file=sys.stderr, flush=True)
    p_logits, q_logits = torch.cat(p_rows), torch.cat(q_rows)
    torch.save({"settings": key, "p": p_logits, "q": q_logits}, cache)
    return p_logits, q_logits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--temperatures", default="0.2,0.6,1.0")
    ap.add_argument("--children", default="1,2,4,8,16,32")
    ap.add_argument("--prompts", default="code,chat")
    ap.add_argument("--limit", type=int, default=4, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="continuation length per prompt")
    ap.add_argument("--context-temperature", type=float, default=0.6, help="temperature the target writes at")
    ap.add_argument("--samples", type=int, default=64, help="Monte Carlo draws per position")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1: stabler on a busy machine)")
    ap.add_argument("--out", default="out/robustness")
    add_model_args(ap)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    temps = [float(t) for t in args.temperatures.split(",")]
    children = sorted(int(k) for k in args.children.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: getattr(args, k) for k in ("prompts", "limit", "max_new_tokens", "context_temperature",
                                               "samples", "seed", "draft", "target", "dtype")}
    gen = torch.Generator().manual_seed(args.seed)
    key = {k: v for k, v in settings.items() if k != "samples"}  # what the logits depend on
    p_logits, q_logits = teacher_logits(args, key, out / "logits.pt", gen)
    rows = []
    for t in temps:
        curves = rejection_curves(p_logits, q_logits, t, children, args.samples, gen)
        for mode, values in curves.items():
            rows += [{"temperature": t, "mode": mode, "children": k, "rejection": v} for k, v in zip(children, values)]
            print(f"T={t:g} {mode:>20}: " + "  ".join(f"k={k}: {v:.3f}" for k, v in zip(children, values)), flush=True)
    (out / "robustness.json").write_text(json.dumps({"format": "sequoia-robustness/1", "settings": settings,
                                                     "positions": int(p_logits.shape[0]), "rows": rows}, indent=1))
    _, note = write_figures({"robustness": robustness_figure(rows)}, out)
    print(f"wrote {out / 'robustness.json'} and the chart" + (f" ({note})" if note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
