"""``python -m sequoia``: generate, accept, profile, tree, bench.

Configuration is parsed and validated here, at the edge, into the frozen
dataclasses the library takes; nothing below this module reads argv or the
environment.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from .._meta import ASSETS
from ..core.config import GenerationConfig, SamplingConfig
from ..core.profiles.acceptance import AcceptanceVector
from ..core.profiles.profile import HardwareProfile
from ..core.statistics.stats import summarize
from ..core.statistics.words import counted
from ..core.trees.dp import optimal_tree
from ..core.trees.optimizer import choose_tree
from ..core.trees.sglang_family import ALGORITHMS, EMBEDDED_DRAFT, EMBEDDED_TARGET, MAX_TOPK, best_launch
from ..runtime.engine import SpeculativeEngine
from ..runtime.measuring.acceptance import MEASURING_WAYS, load_prompts, measure_acceptance
from ..runtime.measuring.finder import cache_profile, find_calibration, find_ngram_acceptance, find_profile
from ..runtime.measuring.profiling import measure_profile, measure_streamed_profile
from ..runtime.measuring.timing import process_clock
from ..runtime.methods import ENGINE_METHODS, PRICED_METHODS, make_method
from ..runtime.texts import generate_with_texts
from . import calibrate_cli
from .bench_cli import EXACT_HELP, add_bench_parser, load_pair_for, main_bench
from .common import add_model_args, expected_fingerprint, load_from_args, profile_for


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (exactly the target's greedy output)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=0)


def _add_method_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("method")
    g.add_argument("--method", default="sequoia", choices=ENGINE_METHODS)
    g.add_argument("--budget", type=int, default=None, help="draft tokens per step (tree size n)")
    g.add_argument("--depth", type=int, default=None, help="maximum tree depth d")
    g.add_argument("--width", type=int, default=2, help="branching of specinfer / kary trees")
    g.add_argument("--tree-file", default=None, help="tree JSON for --method file (as written by 'tree')")
    g.add_argument("--acceptance", default=None, help="acceptance-vector JSON (default: shipped vector)")
    g.add_argument("--profile", default=None, help="hardware-profile JSON for sequoia-auto, sequoia-dynamic, ngram and sequoia-ngram "
                   "(default: this machine's cached or shipped one, else measured now and cached)")
    g.add_argument("--calibration", default=None, help="calibration JSON for sequoia-dynamic (default: the "
                   "shipped one nearest the temperature, else the identity)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sequoia", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode a prompt, streaming text and per-step statistics")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--quiet-steps", action="store_true", help="only the text, no per-step lines")
    gen.add_argument("--trace", default=None, help="write the step records as JSON lines here")
    gen.add_argument("--exact", action="store_true", help=EXACT_HELP)
    for add in (add_model_args, _add_sampling_args, _add_method_args):
        add(gen)

    acc = sub.add_parser("accept", help="measure the acceptance vector of a pair")
    acc.add_argument("--prompts", default=str(ASSETS / "prompts" / "code.jsonl"), help="JSONL prompt set")
    acc.add_argument("--width", type=int, default=16)
    acc.add_argument("--max-new-tokens", type=int, default=64)
    acc.add_argument("--way", choices=MEASURING_WAYS, default="teacher")
    acc.add_argument("--out", required=True)
    for add in (add_model_args, _add_sampling_args):
        add(acc)

    prof = sub.add_parser("profile", help="measure target/draft costs on this device (--show: which is used)")
    prof.add_argument("--show", action="store_true", help="print this machine's fingerprint and which profile "
                      "would be used (shipped, cached or none), without loading models or measuring")
    prof.add_argument("--context", type=int, default=128)
    prof.add_argument("--contexts", type=int, nargs="*", default=(512, 1024),
                      help="further cached-context lengths to measure both curves at, so each step is priced at the "
                      "context it runs at (default: 512 1024; none: --contexts with no value)")
    prof.add_argument("--repeats", type=int, default=3)
    prof.add_argument("--threads", type=int, default=None,
                      help="CPU threads of torch and llama.cpp (default: every core); the fingerprint records it, "
                      "so a profile serves runs with the same count (the bench's --threads 1)")
    prof.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                      help="cpu: time with this process's CPU time (needs --threads 1), for a busy shared machine")
    prof.add_argument("--out", default=None, help="where to save the measured profile (default: this machine's "
                      "cache, where the app, bench and CLI find it)")
    add_model_args(prof)

    tree = sub.add_parser("tree", help="optimal tree for an acceptance vector (and a hardware profile)")
    tree.add_argument("--acceptance", required=True)
    tree.add_argument("--profile", default=None)
    tree.add_argument("--budget", type=int, default=64)
    tree.add_argument("--depth", type=int, default=None)
    tree.add_argument("--out", required=True)
    tree.add_argument("--format", choices=("sequoia", "sglang"), default="sequoia",
                      help="sequoia: the tree JSON (parents); sglang: the best SGLang launch within --budget and "
                           "--depth (steps, top-k, draft tokens), its expected tokens beside the Sequoia tree's, "
                           "and the command line")
    tree.add_argument("--target", default=EMBEDDED_TARGET, help="--format sglang: the target's model path")
    tree.add_argument("--draft", default=EMBEDDED_DRAFT,
                      help="--format sglang: the draft model (STANDALONE) or EAGLE head path")
    tree.add_argument("--algorithm", choices=ALGORITHMS, default="STANDALONE",
                      help="--format sglang: STANDALONE for a separate draft model, EAGLE / EAGLE3 for an EAGLE head "
                           "(measure the acceptance vector with that drafter)")
    tree.add_argument("--max-topk", type=int, default=MAX_TOPK, help="--format sglang: widest top-k to try")

    add_bench_parser(sub)
    calibrate_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    torch.set_flush_denormal(True)  # denormals make CPU matmuls of small activations many times slower
    try:
        return _COMMANDS[args.command](args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _sampling(args) -> SamplingConfig:
    return SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)


def load_acceptance(path: str | None) -> tuple[float, ...] | None:
    return None if path is None else tuple(AcceptanceVector.load(path).values)


def proposer_from_args(args, profile: HardwareProfile | None = None):
    """The method the arguments name; ``profile`` prices sequoia-auto / sequoia-dynamic."""
    cal = args.calibration
    if args.method in ("sequoia-dynamic", "sequoia-ngram") and cal is None:
        cal = find_calibration(args.temperature)
    copies = find_ngram_acceptance("", args.temperature) if args.method in ("ngram", "sequoia-ngram") else None
    return make_method(args.method, budget=args.budget, depth=args.depth, width=args.width,
                       acceptance=load_acceptance(args.acceptance), profile=profile,
                       tree_path=args.tree_file, calibration=cal, copy_acceptance=copies)


def _generate(args) -> int:
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, sampling=_sampling(args),
                              stop_strings=tuple(args.stop), seed=args.seed)
    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    proposer = proposer_from_args(args)  # validate before the slow model load; priced methods rebuilt below
    if args.profile is not None:
        HardwareProfile.load(args.profile)
    pair = load_pair_for(args)
    if args.method in PRICED_METHODS:  # without --profile: this machine's, found or measured now
        proposer = proposer_from_args(args, profile_for(pair, args.profile, args.cache_dir).profile)
    ids = pair.encode_prompt(args.prompt, chat=not args.no_chat)
    print(f"[{pair.draft_name} -> {pair.target_name} | {proposer.name}, up to {proposer.max_nodes - 1} draft "
          f"tokens a step]", file=sys.stderr)
    records, shown = [], ""
    trace = open(args.trace, "w") if args.trace else None
    for rec in generate_with_texts(SpeculativeEngine(pair), pair.tokenizer, ids, proposer, config):
        records.append(rec)
        text = pair.tokenizer.decode([t for r in records for t in r.new_tokens], skip_special_tokens=True)
        sys.stdout.write(text[len(shown):])
        sys.stdout.flush()
        shown = text
        if not args.quiet_steps:
            print(f"\n  [step {rec.step}: +{counted(rec.n_new, 'token')}, "
                  f"accepted {rec.n_accepted}/{rec.tree.depth} deep, "
                  f"draft {rec.draft_s * 1e3:.0f} ms, verify {rec.verify_s * 1e3:.0f} ms]", file=sys.stderr)
        if trace:
            trace.write(json.dumps(rec.to_dict()) + "\n")
    if trace:
        trace.close()
    s = summarize(records)
    print(f"\n\n{counted(s.new_tokens, 'token')} in {counted(s.steps, 'target call')} ({s.tokens_per_step:.2f}/call), "
          f"{s.tokens_per_s:.2f} tokens/s, {sum(r.tree.size for r in records) / len(records):.1f} drafted/step; "
          f"finish: {records[-1].finish_reason}", file=sys.stderr)
    return 0


def _accept(args) -> int:
    prompts = load_prompts(args.prompts)
    pair = load_from_args(args)
    vec = measure_acceptance(pair, prompts, _sampling(args), width=args.width, max_new_tokens=args.max_new_tokens,
                             method=args.way, generator=torch.Generator().manual_seed(args.seed),
                             prompt_set=Path(args.prompts).stem)
    vec.save(args.out)
    print(f"p = [{', '.join(f'{v:.3f}' for v in vec.values)}]  ({vec.positions} positions) -> {args.out}")
    return 0


def _profile(args) -> int:
    clock = _profile_clock(args)
    if args.show:
        return _show_profile(args)
    pair = load_from_args(args)
    # A streamed target costs about the same for 1 or 1024 tokens: its profile reaches the largest trees.
    measure = measure_streamed_profile if getattr(pair, "target_streamed", False) else measure_profile
    prof = measure(pair, context_len=args.context, repeats=args.repeats, contexts=args.contexts, clock=clock)
    out = args.out or cache_profile(prof, args.cache_dir)
    if args.out:
        prof.save(args.out)
    print(f"target ms by n: {dict(zip(prof.target_n, (round(x, 1) for x in prof.target_ms)))}")
    print(f"draft ms by width: {dict(zip(prof.draft_width, (round(x, 1) for x in prof.draft_ms)))} -> {out}")
    return 0


def _profile_clock(args):
    """The clock ``--threads`` and ``--clock`` ask for (torch's threads set first, as the bench does)."""
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.clock == "cpu":
        if args.threads != 1:
            raise SystemExit("--clock cpu needs --threads 1 (CPU time sums every thread)")
        return process_clock()
    return time.perf_counter


def _show_profile(args) -> int:
    """This machine's fingerprint (models as they would load, not loaded) and the profile that would be used."""
    fp = expected_fingerprint(args)
    choice = find_profile(fp, cache_dir=args.cache_dir)
    print(f"this machine: {fp.describe()}")
    print(f"fingerprint key: {fp.key()}")
    print(f"profile: {choice.source}" + (f" ({choice.path})" if choice.path else ""))
    print(f"why: {choice.reason}")
    if choice.profile is None:
        print("the app, bench and sequoia-auto / sequoia-dynamic measure one on first use (about a minute); "
              "'python -m sequoia profile' measures a full one now")
    return 0


def _tree(args) -> int:
    acceptance = load_acceptance(args.acceptance)
    if args.format == "sglang":
        return _sglang(acceptance, args)
    profile = HardwareProfile.load(args.profile) if args.profile else None
    if profile is not None:
        c = choose_tree(acceptance, profile, max_budget=args.budget, max_depth=args.depth)
        c.tree.to_json(args.out, expected_tokens=c.expected_tokens, ms_per_token=c.ms_per_token,
                       predicted_speedup=c.speedup)
        print(f"budget {c.budget}, depth {c.depth}: {c.expected_tokens:.3f} tokens/step, "
              f"{c.ms_per_token:.1f} ms/token predicted ({c.speedup:.2f}x the target alone) -> {args.out}")
        return 0
    dp = optimal_tree(acceptance, args.budget, args.depth)
    tree = dp.tree()
    tree.to_json(args.out, expected_tokens=dp.value())
    print(f"budget {tree.size}, depth {tree.depth}: {dp.value():.3f} tokens/step -> {args.out}")
    return 0


def _sglang(acceptance, args) -> int:
    """The best SGLang launch within --budget / --depth, written as JSON and printed as a command line."""
    if args.profile:
        raise ValueError("--profile prices this machine's runtimes, not an SGLang server: --format sglang searches "
                         "within --budget and --depth alone")
    choice = best_launch(acceptance, args.budget, args.depth, args.max_topk, args.algorithm)
    Path(args.out).write_text(json.dumps(choice.to_dict(args.target, args.draft), indent=1) + "\n")
    a = choice.args
    print(f"SGLang {a.algorithm}, {a.steps} steps, top-{a.topk}, {a.num_draft_tokens} draft tokens: "
          f"{choice.family.expected_tokens:.3f} tokens/step; the Sequoia tree of {a.budget} tokens: "
          f"{choice.sequoia_tokens:.3f} -> {args.out}")
    print(a.command_line(args.target, args.draft))
    return 0


_COMMANDS = {"generate": _generate, "accept": _accept, "profile": _profile, "tree": _tree, "bench": main_bench,
             "calibrate": calibrate_cli.run}
