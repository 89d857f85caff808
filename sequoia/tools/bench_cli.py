"""``python -m sequoia bench``: every method side by side on one pair, in one process.

Writes ``bench.json``, ``bench.md`` and Plotly charts (HTML; PNG when kaleido
finds a local Chromium) to ``--out``.  ``--quick`` is a smoke run for CI: one
prompt per set, 16 tokens, greedy only, a coarse hardware profile.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from .._meta import ASSETS, pair_name, write_json
from ..runtime.checks.exactness import load_exact_pair
from ..runtime.measuring.finder import ProfileChoice, find_ngram_acceptance, list_acceptance
from ..runtime.measuring.timing import process_clock
from ..runtime.methods import STATIC_DEPTH
from ..runtime.models import BACKENDS
from ..runtime.proposers.dynamic import MAX_DEPTH
from .bench import BENCH_METHODS, WORKLOAD_METHODS, BenchConfig, load_prompt_sets
from .bench import run_bench as bench
from .bench_figures import speed_figure, speedup_figure, time_split_figure, write_figures
from .bench_report import markdown_table, summarize_runs, to_dict, write_markdown
from .bench_trees import choose_trees, dynamic_proposers
from .common import add_model_args, backend_of, load_from_args, profile_for

#: What the bench runs on llama.cpp and on the mixed runtime (a llama.cpp draft beside the Hugging Face target):
#: the runtime's target alone, and the methods that choose trees by its costs.
LLAMACPP_METHODS = ("ar", "chain", "sequoia", "sequoia-auto", "sequoia-dynamic", "sequoia-ngram")

EXACT_HELP = ("exact mode: the target in float32 with its plain forward (no int8/int4 or oneDNN-blocked weights, "
              "the model's own attention), so its one-row and many-row forwards make the same greedy choices and "
              "every method prints the target alone's text at T=0; slower, and the embedded 1.5B target holds "
              "6.2 GB instead of 3.1 (the draft keeps its kernels)")


def load_pair_for(args):
    """The pair the model options name; with ``--exact`` the exact-mode pair (:mod:`sequoia.runtime.checks.exactness`)."""
    if not getattr(args, "exact", False):
        return load_from_args(args)
    if args.dtype not in ("auto", "fp32", "float32") or args.target_quant != "none":
        raise ValueError("--exact runs the target in float32, unquantized: drop --dtype and --target-quant")
    return load_exact_pair(args.draft, args.target, device=args.device,
                           draft_quant="none" if args.no_int8 else args.draft_quant, cache_dir=args.cache_dir,
                           blocked_weights=not args.no_blocked_weights)


QUICK = dict(limit=1, max_new_tokens=16, temperatures="0", warmup=2)


def add_bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark every method side by side (tokens/s, speedup, equality)")
    p.add_argument("--prompts", default="code,chat", help="comma-separated shipped sets (code, chat, summarize, rag, edit) or JSONL paths")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperatures", default="0,0.6", help="comma-separated, 0 = greedy")
    p.add_argument("--methods", default=",".join(BENCH_METHODS),
                   help=f"comma-separated subset of {', '.join(BENCH_METHODS)} (default: all; hf-prompt-lookup "
                        "and ngram copy from the context, sequoia-ngram adds the copies to the dynamic tree)")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of each set")
    p.add_argument("--out", default="out/bench", help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=8, help="tokens of the untimed warm-up run of every method (0: none)")
    p.add_argument("--rounds", type=int, default=1,
                   help="timed rounds per prompt, every method once a round in the same order (default 1); from 2 "
                        "on the report shows how much each ratio moved from round to round")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 prompt per set, 16 tokens, T=0, coarse profile")
    g = p.add_argument_group("trees")
    g.add_argument("--chain-budget", type=int, default=5)
    g.add_argument("--specinfer-width", type=int, default=3)
    g.add_argument("--specinfer-depth", type=int, default=4)
    g.add_argument("--assets-dir", default=str(ASSETS),
                   help="folder whose acceptance/ holds the acceptance vectors and calibrations, and profiles/ the "
                        "shipped profiles (missing: the built-in default vector, identity calibration)")
    g.add_argument("--profile", default=None, help="hardware profile JSON (default: this machine's cached or "
                   "shipped one, else a quick one measured now and cached; OUT/profile.json keeps a copy)")
    g.add_argument("--max-budget", type=int, default=None, help="largest Sequoia tree the optimizer may pick")
    g.add_argument("--max-depth", type=int, default=None,
                   help=f"deepest tree: the optimizer's static choice (default {STATIC_DEPTH}) and the dynamic "
                        f"tree's cap (default {MAX_DEPTH})")
    g.add_argument("--sequoia-budget", type=int, default=None,
                   help="run the DP tree of exactly this budget instead of the optimizer's choice")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's); 1 gives stabler ratios on a busy shared machine")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: time with this process's CPU time (needs --threads 1), for a busy shared machine")
    p.add_argument("--no-png", action="store_true", help="HTML charts only")
    p.add_argument("--backends", default=None,
                   help="comma-separated runtimes to bench one after the other in this process, into one table "
                        f"(default: --backend's); on llamacpp and mixed the methods are {', '.join(LLAMACPP_METHODS)}"
                        " and the rows are named llamacpp:METHOD, mixed:METHOD")
    p.add_argument("--exact", action="store_true", help=EXACT_HELP)
    add_model_args(p)


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{what} must be comma-separated numbers, got {text!r}") from None


def main_bench(args) -> int:
    if args.quick:
        args.limit = args.limit or QUICK["limit"]
        args.max_new_tokens, args.temperatures = QUICK["max_new_tokens"], QUICK["temperatures"]
        args.warmup = QUICK["warmup"]
    config = BenchConfig(
        max_new_tokens=args.max_new_tokens, temperatures=_floats(args.temperatures, "--temperatures"),
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()), seed=args.seed,
        chain_budget=args.chain_budget, specinfer_width=args.specinfer_width,
        specinfer_depth=args.specinfer_depth, warmup_tokens=args.warmup, rounds=args.rounds,
    )
    sets = load_prompt_sets(args.prompts, ASSETS / "prompts", args.limit)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.clock == "cpu" and args.threads != 1:
        raise ValueError("--clock cpu needs --threads 1 (CPU time sums every thread)")
    backends = _backends(args)
    result = None
    for backend in backends:
        part = _bench_one(argparse.Namespace(**{**vars(args), "backend": backend}), sets, config, out,
                          prefix="" if backend == backends[0] and backend == "hf" else f"{backend}:")
        result = part if result is None else _merged(result, part)
        gc.collect()
    _write(result, out, png=not args.no_png)
    return 0


def _backends(args) -> list[str]:
    names = [b.strip() for b in (args.backends or backend_of(args)).split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(f"--backends must name distinct runtimes among {', '.join(BACKENDS)}, got {args.backends!r}")
    return names


def _merged(a, b):
    """One result holding both backends' runs (the first's settings and profile, both pairs named)."""
    a.runs.extend(b.runs)
    a.pair = f"{a.pair}; {b.pair}"
    a.seconds += b.seconds
    a.profile_reason = f"{a.profile_reason}; {b.profile_reason}" if b.profile_reason else a.profile_reason
    return a


def _bench_one(args, sets, config, out: Path, prefix: str):
    """The bench on one backend; its rows are named ``prefix + method`` (llama.cpp: its own method set)."""
    if args.backend in ("llamacpp", "mixed"):
        config = replace(config, methods=tuple(m for m in config.methods if m in LLAMACPP_METHODS)
                         or LLAMACPP_METHODS)
        if "ar" not in config.methods:   # the runtime's own target alone: the reference its rows compare with
            config = replace(config, methods=("ar",) + config.methods)
    pair = load_pair_for(args)
    clock = process_clock() if args.clock == "cpu" else time.perf_counter
    choice, trees, dynamic = None, [], None
    if {"sequoia", *WORKLOAD_METHODS} & set(config.methods):
        choice = _profile(args, pair, out)
    if "sequoia" in config.methods:
        trees = _trees(args, pair, sets, config, choice.profile)
    copies = None
    if set(WORKLOAD_METHODS) & set(config.methods):  # the n-gram methods take the dynamic tree's settings
        dynamic = _dynamic(args, pair, sets, config, choice.profile)
        copies = _copies(args, pair, sets, config)
    result = bench(pair, sets, config, trees, dynamic=dynamic, clock=clock, copies=copies,
                   checkpoint=lambda partial: write_json(out / "bench.partial.json", to_dict(partial)))
    if choice is not None:
        result.profile = choice.profile.to_dict()
        result.profile_reason = f"{prefix}{choice.source}: {choice.reason}"
    result.clock = "process" if args.clock == "cpu" else "wall"
    if prefix:
        result.runs = [replace(r, method=prefix + r.method,
                               reference=prefix + r.reference if r.reference else None) for r in result.runs]
    return result


def _profile(args, pair, out: Path) -> ProfileChoice:
    """The finder's choice (given, cached, shipped, or measured now); a copy goes to OUT/profile[-backend].json."""
    choice = profile_for(pair, args.profile if args.backend == "hf" else None, args.cache_dir)
    choice.profile.save(out / ("profile.json" if args.backend == "hf" else f"profile-{args.backend}.json"))
    return choice


def _trees(args, pair, sets, config, profile):
    entries = list_acceptance(args.assets_dir, pair_name(pair))
    trees = choose_trees(sets, config.temperatures, entries, profile, max_budget=args.max_budget,
                         max_depth=args.max_depth or STATIC_DEPTH, fixed_budget=args.sequoia_budget)
    for t in trees:
        print(f"sequoia tree for {t.prompt_set} T={t.temperature:g}: {t.tree.size} tokens, depth {t.tree.depth}, "
              f"predicted {t.predicted_speedup:.2f}x (acceptance: {t.acceptance_source})", file=sys.stderr)
    return trees


def _dynamic(args, pair, sets, config, profile):
    name = pair_name(pair)
    found = dynamic_proposers(sets, config.temperatures, list_acceptance(args.assets_dir, name), profile,
                              args.assets_dir, name, budget=args.max_budget, max_depth=args.max_depth)
    for (set_name, temp), method in found.items():
        print(f"dynamic tree (sequoia-dynamic, sequoia-ngram, ngram) for {set_name} T={temp:g}: "
              f"budget {method.budget}, depth {method.max_depth}, "
              f"calibration {method.calibration.prompt_set or 'identity'}"
              + ("" if method.can_pay else " (the profile says no draft-model tree pays: the draft model will not run)"), file=sys.stderr)
    return found


def _copies(args, pair, sets, config) -> dict:
    """(prompt set, temperature) -> the measured acceptance of copied tokens the n-gram methods price with."""
    found = {(s.name, t): find_ngram_acceptance(s.name, t, args.assets_dir, pair_name(pair))
             for s in sets for t in config.temperatures}
    for (set_name, temp), acc in found.items():
        print(f"copied tokens for {set_name} T={temp:g}: "
              + (f"measured on {acc.prompt_set or 'any prompts'} at T={acc.temperature:g} "
                 f"({sum(map(sum, acc.counts))} nodes)" if acc else "hand-set prior (no measured table)"),
              file=sys.stderr)
    return found


def _write(result, out: Path, png: bool) -> None:
    write_json(out / "bench.json", to_dict(result))
    write_markdown(result, out / "bench.md")
    summaries = summarize_runs(result.runs)
    figs = {"speed": speed_figure(summaries), "speedup": speedup_figure(summaries),
            "time_split": time_split_figure(summaries)}
    _, note = write_figures(figs, out, png=png)
    print("\n" + markdown_table(summaries, wall_column=result.clock == "process"))
    print(f"wrote {out / 'bench.json'}, {out / 'bench.md'} and charts in {out}" + (f" ({note})" if note else ""))
