"""``python -m sequoia``: generate, accept, profile, tree, bench.

Configuration is parsed and validated here, at the edge, into the frozen
dataclasses the library takes; nothing below this module reads argv or the
environment.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .._meta import ASSETS
from ..core.config import GenerationConfig, SamplingConfig


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--draft", default="embedded", help="draft model: 'embedded' (offline default), a hub id or a path")
    g.add_argument("--target", default="embedded", help="target model: 'embedded', a hub id or a path")
    g.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    g.add_argument("--dtype", default="auto", help="auto / bf16 / fp32 / fp16")
    g.add_argument("--no-int8", action="store_true", help="keep the CPU draft in floating point")
    g.add_argument("--cache-dir", default=None, help="where the embedded pair is converted to (default ~/.cache/sequoia-studio)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (exactly the target's greedy output)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=0)


def _add_method_args(p: argparse.ArgumentParser) -> None:
    from ..runtime.methods import METHODS

    g = p.add_argument_group("method")
    g.add_argument("--method", default="sequoia", choices=METHODS)
    g.add_argument("--budget", type=int, default=None, help="draft tokens per step (tree size n)")
    g.add_argument("--depth", type=int, default=None, help="maximum tree depth d")
    g.add_argument("--width", type=int, default=2, help="branching of specinfer / kary trees")
    g.add_argument("--tree-file", default=None, help="tree JSON for --method file (as written by 'tree')")
    g.add_argument("--acceptance", default=None, help="acceptance-vector JSON (default: shipped vector)")
    g.add_argument("--profile", default=None, help="hardware-profile JSON (needed by sequoia-auto; prices "
                   "sequoia-dynamic, which otherwise uses built-in CPU figures)")
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
    for add in (_add_model_args, _add_sampling_args, _add_method_args):
        add(gen)

    acc = sub.add_parser("accept", help="measure the acceptance vector of a pair")
    acc.add_argument("--prompts", default=str(ASSETS / "prompts" / "code.jsonl"), help="JSONL prompt set")
    acc.add_argument("--width", type=int, default=16)
    acc.add_argument("--max-new-tokens", type=int, default=64)
    acc.add_argument("--way", choices=("teacher", "decode"), default="teacher")
    acc.add_argument("--out", required=True)
    for add in (_add_model_args, _add_sampling_args):
        add(acc)

    prof = sub.add_parser("profile", help="measure target/draft costs on this device")
    prof.add_argument("--context", type=int, default=128)
    prof.add_argument("--repeats", type=int, default=3)
    prof.add_argument("--out", required=True)
    _add_model_args(prof)

    tree = sub.add_parser("tree", help="optimal tree for an acceptance vector (and a hardware profile)")
    tree.add_argument("--acceptance", required=True)
    tree.add_argument("--profile", default=None)
    tree.add_argument("--budget", type=int, default=64)
    tree.add_argument("--depth", type=int, default=None)
    tree.add_argument("--out", required=True)

    from .bench_cli import add_bench_parser

    add_bench_parser(sub)
    sub.add_parser("calibrate", add_help=False,
                   help="fit the dynamic tree's confidence-to-acceptance calibration ('calibrate --help')")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    calibrate = argv[:1] == ["calibrate"]  # it has its own parser (sequoia.runtime.calibration.main)
    args = None if calibrate else build_parser().parse_args(argv)
    import torch

    torch.set_flush_denormal(True)  # denormals make CPU matmuls of small activations many times slower
    try:
        if calibrate:
            from ..runtime.calibration import main as run_calibration

            return run_calibration(argv[1:])
        return _COMMANDS[args.command](args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _sampling(args) -> SamplingConfig:
    return SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)


def _load(args):
    from ..runtime.models import load_pair

    return load_pair(args.draft, args.target, device=args.device, dtype=args.dtype,
                     draft_int8=False if args.no_int8 else None, cache_dir=args.cache_dir)


def load_acceptance(path: str | None) -> tuple[float, ...] | None:
    if path is None:
        return None
    from ..runtime.acceptance import AcceptanceVector

    return tuple(AcceptanceVector.load(path).values)


def load_profile(path: str | None):
    if path is None:
        return None
    from ..core.profile import HardwareProfile

    return HardwareProfile.load(path)


def proposer_from_args(args):
    from ..runtime.calibration import find_calibration
    from ..runtime.methods import make_method

    calibration = args.calibration
    if args.method == "sequoia-dynamic" and calibration is None:
        calibration = find_calibration(ASSETS / "acceptance", args.temperature)
    return make_method(args.method, budget=args.budget, depth=args.depth, width=args.width,
                       acceptance=load_acceptance(args.acceptance), profile=load_profile(args.profile),
                       tree_path=args.tree_file, calibration=calibration)


def _generate(args) -> int:
    from ..core.stats import summarize
    from ..runtime.engine import SpeculativeEngine

    config = GenerationConfig(max_new_tokens=args.max_new_tokens, sampling=_sampling(args),
                              stop_strings=tuple(args.stop), seed=args.seed)
    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    proposer = proposer_from_args(args)  # validate before the slow model load
    pair = _load(args)
    ids = pair.encode_prompt(args.prompt, chat=not args.no_chat)
    print(f"[{pair.draft_name} -> {pair.target_name} | {proposer.name}, tree of {proposer.tree.size} tokens, "
          f"depth {proposer.tree.depth}]", file=sys.stderr)
    records, shown = [], ""
    trace = open(args.trace, "w") if args.trace else None
    for rec in SpeculativeEngine(pair).generate(ids, proposer, config):
        records.append(rec)
        text = pair.tokenizer.decode([t for r in records for t in r.new_tokens], skip_special_tokens=True)
        sys.stdout.write(text[len(shown):])
        sys.stdout.flush()
        shown = text
        if not args.quiet_steps:
            print(f"\n  [step {rec.step}: +{rec.n_new} tokens, accepted {rec.n_accepted}/{rec.tree.depth} deep, "
                  f"draft {rec.draft_s * 1e3:.0f} ms, verify {rec.verify_s * 1e3:.0f} ms]", file=sys.stderr)
        if trace:
            trace.write(json.dumps(record_to_json(rec)) + "\n")
    if trace:
        trace.close()
    s = summarize(records)
    print(f"\n\n{s.new_tokens} tokens in {s.steps} target calls ({s.tokens_per_step:.2f}/call), "
          f"{s.tokens_per_s:.2f} tokens/s; finish: {records[-1].finish_reason}", file=sys.stderr)
    return 0


def record_to_json(rec) -> dict:
    return {
        "step": rec.step, "parents": list(rec.tree.parents), "tokens": list(rec.tokens), "texts": list(rec.texts),
        "q": list(rec.q), "p": list(rec.p), "accepted": list(rec.accepted), "status": list(rec.status),
        "bonus": rec.bonus, "new_tokens": list(rec.new_tokens), "draft_s": rec.draft_s,
        "verify_s": rec.verify_s, "other_s": rec.other_s, "finish_reason": rec.finish_reason,
    }


def _accept(args) -> int:
    import torch

    from ..runtime.acceptance import load_prompts, measure_acceptance

    prompts = load_prompts(args.prompts)
    pair = _load(args)
    vec = measure_acceptance(pair, prompts, _sampling(args), width=args.width, max_new_tokens=args.max_new_tokens,
                             method=args.way, generator=torch.Generator().manual_seed(args.seed),
                             prompt_set=Path(args.prompts).stem)
    vec.save(args.out)
    print(f"p = [{', '.join(f'{v:.3f}' for v in vec.values)}]  ({vec.positions} positions) -> {args.out}")
    return 0


def _profile(args) -> int:
    from ..runtime.profiling import measure_profile

    pair = _load(args)
    prof = measure_profile(pair, context_len=args.context, repeats=args.repeats)
    prof.save(args.out)
    print(f"target ms by n: {dict(zip(prof.target_n, (round(x, 1) for x in prof.target_ms)))}")
    print(f"draft ms by width: {dict(zip(prof.draft_width, (round(x, 1) for x in prof.draft_ms)))} -> {args.out}")
    return 0


def _tree(args) -> int:
    from ..core.dp import optimal_tree

    acceptance = load_acceptance(args.acceptance)
    profile = load_profile(args.profile)
    if profile is not None:
        from ..core.optimizer import choose_tree

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


def _bench(args) -> int:
    from .bench_cli import run_bench

    return run_bench(args)


_COMMANDS = {"generate": _generate, "accept": _accept, "profile": _profile, "tree": _tree, "bench": _bench}
