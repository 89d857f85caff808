"""Scalability (the Sequoia paper's first figure), measured with real decoding.

Tokens per target call against tree size for Sequoia DP trees, chains, k
independent chains and binary trees, decoding a few prompts with the engine
on a real pair.  The DP's prediction for every measured tree is stored beside
it (dotted lines in the chart).

Run from the repository root (about 15 minutes on a 2-core CPU with the defaults):

    .venv/bin/python scripts/measure/scalability.py --out out/scalability

Writes scalability.json (one row per shape and size), scalability.html/.png.
Rows are appended to scalability.partial.jsonl as they finish, and a rerun
with the same settings skips the rows already there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from sequoia._meta import ASSETS  # noqa: E402
from sequoia.core.config import GenerationConfig, SamplingConfig  # noqa: E402
from sequoia.core.trees.dp import expected_tokens, optimal_tree  # noqa: E402
from sequoia.core.trees.tree import Tree  # noqa: E402
from sequoia.runtime.drafter import StaticTreeProposer  # noqa: E402
from sequoia.runtime.measuring.timing import run_method, warmup  # noqa: E402
from sequoia.tools.bench import encode, load_prompt_sets  # noqa: E402
from sequoia.tools.common import add_model_args as _add_model_args  # noqa: E402
from sequoia.tools.common import load_from_args as _load  # noqa: E402

SHAPES = ("sequoia", "chain", "k_chains", "binary")


def shape_tree(shape: str, n: int, acceptance, k: int = 4, max_depth: int | None = None) -> Tree:
    """The ``shape`` tree of n draft tokens.  k_chains and binary trees are cut to n nodes in BFS order."""
    if shape == "sequoia":
        return optimal_tree(acceptance, n, max_depth).tree()
    if shape == "chain":
        return Tree.chain(n)
    if shape == "k_chains":  # node i > k hangs under node i - k
        return Tree((-1,) + tuple(0 if i <= k else i - k for i in range(1, n + 1)))
    if shape == "binary":
        return Tree((-1,) + tuple((i - 1) // 2 for i in range(1, n + 1)))
    raise ValueError(f"unknown shape {shape!r}")


def measure(engine, tree: Tree, prompts: list[list[int]], gen: GenerationConfig) -> dict:
    """Decode every prompt with ``tree`` through the bench's runner; tokens per target call over all steps
    (the prefill forward not counted) and the mean step time."""
    # Every shape samples children without replacement, so the shape is the only difference.
    proposer = StaticTreeProposer(tree, mode="without_replacement", name="scalability")
    warmup(engine, engine.pair, prompts[0], [("scalability", proposer)], tokens=2)
    steps = new = 0
    seconds = 0.0
    for ids in prompts:
        run = run_method(engine, engine.pair, "scalability", ids, gen, proposer)
        steps += run.steps
        new += run.new_tokens
        seconds += run.draft_s + run.verify_s + run.other_s
    return {"steps": steps, "new_tokens": new, "tokens_per_call": new / steps, "step_s": seconds / steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--prompts", default="code,chat")
    ap.add_argument("--limit", type=int, default=2, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--k", type=int, default=4, help="chains in the k-independent-chains shape")
    ap.add_argument("--acceptance", default=None, help="acceptance-vector JSON for the DP trees "
                    "(default: the best match in assets/acceptance, else the shipped default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1: stabler on a busy machine)")
    ap.add_argument("--out", default="out/scalability")
    _add_model_args(ap)
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from sequoia._meta import pair_name
    from sequoia.core.profiles.acceptance import AcceptanceVector
    from sequoia.runtime.engine import SpeculativeEngine
    from sequoia.runtime.measuring.finder import find_acceptance
    from sequoia.tools.bench_figures import scalability_figure, write_figures

    sizes = [int(x) for x in args.sizes.split(",")]
    shapes = [s.strip() for s in args.shapes.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pair = _load(args)
    sets = load_prompt_sets(args.prompts, ASSETS / "prompts", args.limit)
    if args.acceptance:
        acceptance, source = tuple(AcceptanceVector.load(args.acceptance).values), args.acceptance
    else:
        entry = find_acceptance(sets[0].name, args.temperature, ASSETS, pair_name(pair))
        acceptance, source = entry.values, entry.label
    print(f"acceptance for the DP trees: {source}: {[round(a, 3) for a in acceptance]}", file=sys.stderr)
    prompts = [encode(pair, p) for s in sets for p in s.prompts]
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, sampling=SamplingConfig(args.temperature),
                           seed=args.seed)
    engine = SpeculativeEngine(pair)
    partial = out / "scalability.partial.jsonl"
    settings = dict(temperature=args.temperature, max_new_tokens=args.max_new_tokens, prompts=args.prompts,
                    limit=args.limit, k=args.k, acceptance=list(acceptance), seed=args.seed, pair=pair_name(pair))
    done = _read_partial(partial, settings)
    for n in sizes:  # sizes outer: a partial run still covers every shape at small sizes
        for shape in shapes:
            if (shape, n) in done:
                continue
            tree = shape_tree(shape, n, acceptance, args.k)
            row = {"shape": shape, "size": n, "tree_size": tree.size, "depth": tree.depth,
                   "predicted": expected_tokens(tree, acceptance), **measure(engine, tree, prompts, gen)}
            done[(shape, n)] = row
            with partial.open("a") as f:
                f.write(json.dumps({"settings": settings, **row}) + "\n")
            print(f"{shape:>8} n={n:<4} depth {tree.depth:<3} {row['tokens_per_call']:.2f} tokens/call "
                  f"(predicted {row['predicted']:.2f}), {row['step_s'] * 1e3:.0f} ms/step", flush=True)
    rows = [done[(s, n)] for n in sizes for s in shapes]
    (out / "scalability.json").write_text(json.dumps({"format": "sequoia-scalability/1", "settings": settings,
                                                      "acceptance_source": source, "rows": rows}, indent=1))
    predicted = {s: [done[(s, n)]["predicted"] for n in sizes] for s in shapes}
    _, note = write_figures({"scalability": scalability_figure(rows, predicted, sizes)}, out)
    print(f"wrote {out / 'scalability.json'} and the chart" + (f" ({note})" if note else ""))
    return 0


def _read_partial(path: Path, settings: dict) -> dict:
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.pop("settings") == settings:
                done[(row["shape"], row["size"])] = row
    return done


if __name__ == "__main__":
    sys.exit(main())
