"""``python -m sequoia bench``: every method side by side on one pair, in one process.

Writes ``bench.json``, ``bench.md`` and Plotly charts (HTML; PNG when kaleido
finds a local Chromium) to ``--out``.  ``--quick`` is a smoke run for CI: one
prompt per set, 16 tokens, greedy only, a coarse hardware profile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._meta import ASSETS

QUICK = dict(limit=1, max_new_tokens=16, temperatures="0", warmup=2)
#: Profile grids measured at the start of a bench when no profile is given: trees up to 63 tokens
#: (larger ones do not pay on a CPU, and 256-token forwards take minutes there); coarser for --quick.
BENCH_GRIDS = dict(target_grid=(1, 2, 4, 8, 16, 24, 32, 48, 64), draft_grid=(1, 2, 4, 8, 16, 32))
QUICK_GRIDS = dict(target_grid=(1, 4, 16, 32), draft_grid=(1, 4, 8), repeats=1)


def add_bench_parser(sub) -> None:
    from .bench import BENCH_METHODS
    from .cli import _add_model_args

    p = sub.add_parser("bench", help="benchmark every method side by side (tokens/s, speedup, equality)")
    p.add_argument("--prompts", default="code,chat", help="comma-separated shipped sets (code, chat) or JSONL paths")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperatures", default="0,0.6", help="comma-separated, 0 = greedy")
    p.add_argument("--methods", default=",".join(BENCH_METHODS),
                   help=f"comma-separated subset of {', '.join(BENCH_METHODS)}")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of each set")
    p.add_argument("--out", default="out/bench", help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=8, help="tokens of the untimed warm-up run of every method (0: none)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 prompt per set, 16 tokens, T=0, coarse profile")
    g = p.add_argument_group("trees")
    g.add_argument("--chain-budget", type=int, default=5)
    g.add_argument("--specinfer-width", type=int, default=3)
    g.add_argument("--specinfer-depth", type=int, default=4)
    g.add_argument("--acceptance-dir", default=str(ASSETS / "acceptance"),
                   help="directory of acceptance-vector and calibration JSON files (missing: the shipped default vector, "
                        "identity calibration)")
    g.add_argument("--profile", default=None, help="hardware profile JSON (default: newest matching one in "
                   "assets/profiles, else measured now, trees up to 63 tokens, and saved to OUT/profile.json)")
    g.add_argument("--max-budget", type=int, default=None, help="largest Sequoia tree the optimizer may pick")
    g.add_argument("--max-depth", type=int, default=16)
    g.add_argument("--sequoia-budget", type=int, default=None,
                   help="run the DP tree of exactly this budget instead of the optimizer's choice")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's); 1 gives stabler ratios on a busy shared machine")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: time with this process's CPU time (needs --threads 1), for a busy shared machine")
    p.add_argument("--no-png", action="store_true", help="HTML charts only")
    _add_model_args(p)


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{what} must be comma-separated numbers, got {text!r}") from None


def run_bench(args) -> int:
    from contextlib import nullcontext

    from .bench import BenchConfig, load_prompt_sets, process_clock
    from .bench import run_bench as bench
    from .bench_report import write_json

    if args.quick:
        args.limit = args.limit or QUICK["limit"]
        args.max_new_tokens, args.temperatures = QUICK["max_new_tokens"], QUICK["temperatures"]
        args.warmup = QUICK["warmup"]
    config = BenchConfig(
        max_new_tokens=args.max_new_tokens, temperatures=_floats(args.temperatures, "--temperatures"),
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()), seed=args.seed,
        chain_budget=args.chain_budget, specinfer_width=args.specinfer_width,
        specinfer_depth=args.specinfer_depth, warmup_tokens=args.warmup,
    )
    sets = load_prompt_sets(args.prompts, ASSETS / "prompts", args.limit)
    if args.threads is not None:
        import torch

        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from .cli import _load

    if args.clock == "cpu" and args.threads != 1:
        raise ValueError("--clock cpu needs --threads 1 (CPU time sums every thread)")
    pair = _load(args)
    with process_clock() if args.clock == "cpu" else nullcontext():
        profile, trees, dynamic = None, [], None
        if {"sequoia", "sequoia-dynamic"} & set(config.methods):
            profile = _profile(args, pair, out)
        if "sequoia" in config.methods:
            trees = _trees(args, pair, sets, config, profile)
        if "sequoia-dynamic" in config.methods:
            dynamic = _dynamic(args, pair, sets, config, profile)
        result = bench(pair, sets, config, trees, dynamic=dynamic,
                       checkpoint=lambda partial: write_json(partial, out / "bench.partial.json"))
    result.profile = profile.to_dict() if profile is not None else None
    result.clock = "process" if args.clock == "cpu" else "wall"
    _write(result, out, png=not args.no_png)
    return 0


def _profile(args, pair, out: Path):
    from .._meta import pair_name
    from ..core.profile import HardwareProfile
    from ..runtime.profiling import measure_profile
    from .bench_trees import find_profile

    if args.profile:
        return HardwareProfile.load(args.profile, pair=pair_name(pair))
    found = None if args.quick else find_profile(ASSETS / "profiles", pair_name(pair), str(pair.target.dtype))
    if found is not None:
        print(f"hardware profile: {found.date} from assets/profiles", file=sys.stderr)
        return found
    prof = measure_profile(pair, **(QUICK_GRIDS if args.quick else BENCH_GRIDS))
    prof.save(out / "profile.json")
    print(f"hardware profile measured -> {out / 'profile.json'}", file=sys.stderr)
    return prof


def _trees(args, pair, sets, config, profile):
    from .._meta import pair_name
    from .bench_trees import acceptance_files, choose_trees

    files = acceptance_files(args.acceptance_dir, pair_name(pair))
    trees = choose_trees(sets, config.temperatures, files, profile, max_budget=args.max_budget,
                         max_depth=args.max_depth, fixed_budget=args.sequoia_budget)
    for t in trees:
        print(f"sequoia tree for {t.prompt_set} T={t.temperature:g}: {t.tree.size} tokens, depth {t.tree.depth}, "
              f"predicted {t.predicted_speedup:.2f}x (acceptance: {t.acceptance_source})", file=sys.stderr)
    return trees


def _dynamic(args, pair, sets, config, profile):
    from .._meta import pair_name
    from .bench_trees import acceptance_files, dynamic_proposers

    name = pair_name(pair)
    found = dynamic_proposers(sets, config.temperatures, acceptance_files(args.acceptance_dir, name), profile,
                              args.acceptance_dir, name, budget=args.max_budget, max_depth=args.max_depth)
    for (set_name, temp), method in found.items():
        print(f"sequoia-dynamic for {set_name} T={temp:g}: budget {method.budget}, depth {method.max_depth}, "
              f"calibration {method.calibration.prompt_set or 'identity'}"
              + ("" if method.can_pay else " (the profile says no tree pays: it will not draft)"), file=sys.stderr)
    return found


def _write(result, out: Path, png: bool) -> None:
    from .bench_figures import speed_figure, speedup_figure, time_split_figure, write_figures
    from .bench_report import markdown_table, summarize_runs, write_json, write_markdown

    write_json(result, out / "bench.json")
    write_markdown(result, out / "bench.md")
    summaries = summarize_runs(result.runs)
    figs = {"speed": speed_figure(summaries), "speedup": speedup_figure(summaries),
            "time_split": time_split_figure(summaries)}
    _, note = write_figures(figs, out, png=png)
    print("\n" + markdown_table(summaries, wall_column=result.clock == "process"))
    print(f"wrote {out / 'bench.json'}, {out / 'bench.md'} and charts in {out}" + (f" ({note})" if note else ""))
