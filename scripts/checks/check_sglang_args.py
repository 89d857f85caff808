"""Check the SGLang launches of sequoia.core.trees.sglang_family against SGLang's own code (where sglang is installed).

1. Flags: every launch ``best_launch`` picks for the shipped acceptance vectors, at several budgets and
   depths, plus edge launches (a chain, every candidate kept), is parsed by SGLang's parser
   (``ServerArgs.add_cli_args``), built and resolved (``ServerArgs.from_cli_args``, ``resolve_once``: the
   speculative hook among the rest) and comes out unchanged; a top-k 1 launch with N != S + 1, which
   ``check_args`` refuses, comes out reset to S + 1.
2. Trees: SGLang's draft-tree selection (``select_top_k_tokens`` for every step, then
   ``organize_draft_results``) run on draft probabilities equal to the model's scores keeps a tree of the
   same expected tokens as ``family_tree``, and the same nodes wherever no two candidates tie; the parent
   of each kept node is read with the convention of SGLang's tree-building kernel (parent slot =
   index // topk).  Random strictly decreasing vectors: scores still tie, since p_1 p_2 = p_2 p_1, and
   torch.topk breaks those ties its own way.

Resolution reads the models' configs: ``--target`` and ``--draft`` must be local folders holding a
config.json (nothing is downloaded).  Needs no GPU (``--device cpu``; set TORCHDYNAMO_DISABLE=1 where
torch.compile has no compiler).  Nothing of SGLang is copied into this project: it is imported.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sequoia.core.profiles.acceptance import AcceptanceVector  # noqa: E402
from sequoia.core.trees.sglang_family import SGLangArgs, best_launch, candidates, family_tree  # noqa: E402

FIELDS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
BOUNDS = ((4, 2), (8, 4), (16, 6), (32, 8), (64, 10))       # (budget, depth) searched per shipped vector


def launches() -> list[SGLangArgs]:
    """The best launches for the shipped vectors, then edge launches of every algorithm."""
    out = []
    for path in sorted((ROOT / "assets" / "acceptance").glob("embedded-*.json")):
        p = AcceptanceVector.load(path).values
        out += [best_launch(p, budget, depth).args for budget, depth in BOUNDS]
    for algorithm, (steps, topk) in itertools.product(("STANDALONE", "EAGLE", "EAGLE3"), ((1, 1), (5, 1), (3, 4))):
        n = steps + 1 if topk == 1 else candidates(steps, topk) + 1
        out += [SGLangArgs(algorithm, steps, topk, n)]
    return list(dict.fromkeys(out))


def resolved(parser, argv: list[str]) -> tuple:
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs.from_cli_args(parser.parse_args(argv))
    server_args.resolve_once()
    return tuple(resolution_result(server_args, f) for f in FIELDS)


def check_flags(target: str, draft: str, device: str) -> dict:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    checked = []
    for args in launches():
        # The command line as a user copies it, less "python -m sglang.launch_server".
        argv = shlex.split(args.command_line(target, draft))[3:] + ["--device", device]
        got = resolved(parser, argv)
        want = (args.algorithm, args.steps, args.topk, args.num_draft_tokens)
        if got != want:
            raise SystemExit(f"SGLang resolved {want} to {got}")
        checked.append(args.to_dict())
    base = ["--model-path", target, "--speculative-draft-model-path", draft, "--device", device]
    reset = resolved(parser, base + ["--speculative-algorithm", "STANDALONE", "--speculative-num-steps", "4",
                                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "10"])
    if reset[1:] != (4, 1, 5):
        raise SystemExit(f"expected SGLang to reset N to steps + 1 = 5 with top-k 1, got {reset}")
    return {"launches_unchanged": len(checked), "topk1_reset": list(reset), "examples": checked[:3]}


def sglang_tree(score_k: np.ndarray, steps: int, topk: int, n: int) -> list[tuple[int, ...]]:
    """Rank paths of the nodes SGLang keeps when the draft's top-K probabilities are ``score_k`` at every node."""
    import torch
    from sglang.srt.speculative.eagle_utils import organize_draft_results
    from sglang.srt.speculative.spec_utils import select_top_k_tokens

    probs = torch.tensor(score_k, dtype=torch.float64)[None]           # [1, K] the root's top-K
    ranks = torch.arange(topk)[None]                                   # [1, K] token ids = ranks
    scores, score_list, token_list, parents_list = None, [], [], []
    for i in range(steps):
        if i > 0:                                                      # every frontier node: the same top-K
            probs, ranks = probs.new_tensor(score_k).repeat(topk, 1), ranks.new_tensor(range(topk)).repeat(topk, 1)
        _, _, scores, info = select_top_k_tokens(i, probs, ranks, None, scores, topk)
        score_list.append(info[0])
        token_list.append(info[1])
        parents_list.append(info[2])
    parent_list, index, tokens = organize_draft_results(score_list, token_list, parents_list, n)
    paths: dict[int, tuple[int, ...]] = {}
    for idx, token in zip(index[0].tolist(), tokens[0].tolist()):     # ascending: parents first
        slot = idx // topk
        parent = () if slot == 0 else paths[int(parent_list[0, slot])]
        paths[idx] = parent + (int(token),)
    return sorted(paths.values(), key=lambda t: (len(t), t))


def path_tokens(paths: list[tuple[int, ...]], p: np.ndarray) -> float:
    """1 + the chance of each path's acceptance: expected tokens per step of the kept nodes."""
    return 1.0 + sum(float(np.prod([p[r] for r in path])) for path in paths)


def check_trees(trials: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    compared = identical = 0
    for _ in range(trials):
        # Strictly decreasing, sum < 1, positive for every rank drafted (K <= 4): a draft's softmax is never 0,
        # and at score 0 SGLang's topk may keep a node without its parent.
        width = int(rng.integers(4, 7))
        p = np.sort(rng.dirichlet(np.ones(width + 1))[:width])[::-1].copy()
        for steps, topk in itertools.product(range(1, 5), range(1, 5)):
            sizes = [steps + 1] if topk == 1 else range(2, candidates(steps, topk) + 2)
            for n in sizes:
                score_k = p[:topk]
                ours = family_tree(p, steps, topk, n)
                theirs = sglang_tree(score_k, steps, topk, n)
                if abs(path_tokens(theirs, p) - ours.expected_tokens) > 1e-12:
                    raise SystemExit(f"p={p.tolist()} S={steps} K={topk} N={n}: ours {ours.tree.rank_paths()}, "
                                     f"SGLang's {theirs}")
                compared += 1
                identical += theirs == ours.tree.rank_paths()[1:]
    return {"trees_same_expected_tokens": compared, "trees_identical": identical, "trials": trials, "seed": seed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="local folder with the target's config.json")
    ap.add_argument("--draft", required=True, help="local folder with the draft's config.json")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--trials", type=int, default=20, help="random vectors for the tree comparison")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the record as JSON here")
    args = ap.parse_args()
    import platform

    import sglang
    import torch

    record = {"sglang": sglang.__version__, "torch": torch.__version__, "python": platform.python_version(),
              "how": "ServerArgs.add_cli_args, from_cli_args and resolve_once on the command lines the family writes "
                     f"(--device {args.device}; --target / --draft: local folders holding only a config.json); "
                     "select_top_k_tokens and organize_draft_results on the CPU",
              "flags": check_flags(args.target, args.draft, args.device),
              "trees": check_trees(args.trials, args.seed)}
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
