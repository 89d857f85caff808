"""SGLang's speculation trees under the Sequoia acceptance model, and the launch arguments that pick one.

SGLang (``python -m sglang.launch_server``) speculates with trees of the EAGLE-2
family, for an EAGLE head (``--speculative-algorithm EAGLE`` / ``EAGLE3``) or a
separate small draft model (``STANDALONE``).  Three numbers fix the shape:
steps S (``--speculative-num-steps``), top-k K (``--speculative-eagle-topk``)
and draft tokens N (``--speculative-num-draft-tokens``).  Read from SGLang
0.5.23 (``speculative/spec_utils.py::select_top_k_tokens``,
``speculative/eagle_utils.py::organize_draft_results``):

``score``      of a drafted node: the product of the draft's probabilities
    along its path from the root (the last verified token).
``step 1``     the root's top-K children are drafted; they are the frontier.
``step s>1``   each of the K frontier nodes gets its top-K children (K*K new
    candidates, in frontier order, then rank order); the K of those with the
    highest score are the next frontier.  S steps make K + (S-1)*K*K candidates.
``keep``       the N-1 candidates with the highest score are verified, with
    the root: N counts the root, so the tree holds N-1 draft tokens (this
    project's budget n = N-1) and at most S levels.

The model.  The draft's probabilities are unknown here; the acceptance vector
p_1..p_W (:mod:`sequoia.core.trees.dp`) stands in for them: a node's score is the
product of p along its rank path, so (p, S, K, N) determines the tree and its
expected tokens per step are 1 + sum over kept nodes of f(v), exactly as for
any tree (:func:`sequoia.core.trees.dp.expected_tokens`).  Two conventions:

* SGLang's children of a node are its top-K by draft probability, so a
  younger sibling never outscores an older one.  A measured p is not always
  non-increasing (noise in its tail), so the *score* uses its running minimum
  min(p_1..p_k); the *acceptance* uses p itself.  For a non-increasing p the
  score is the product of p, the plain rule.
* Ties go to the candidate drafted first.  A parent is drafted before its
  children and scores at least as much, and an older sibling before a
  younger one, so every kept set is a tree whose siblings are a prefix of
  ranks: a :class:`~sequoia.core.trees.tree.Tree`.  Scores do tie (p_1 p_2 =
  p_2 p_1), and torch.topk breaks ties its own way; tied candidates of a
  non-increasing p score alike and so do their children, so the kept scores,
  hence the expected tokens, are the same either way.

At T > 0 SGLang verifies a tree by sampling the target along it (the drafts
taken as one-hot), so the rank-k child is accepted with the target's chance
of that token, which the positional p_k approximates as it does for Sequoia's
own trees.  Ranks beyond W are never accepted.

Constraints SGLang 0.5.23 applies to these flags, encoded in :func:`check_args`
(checked by ``scripts/checks/check_sglang_args.py`` against SGLang's parser, its
argument resolution and its draft-tree code; the record is
``docs/data/sglang-args-check.json``): all three are integers; K = 1 makes
SGLang reset N to S + 1 (a chain of S) with a warning; N - 1 <= K + (S-1)*K*K,
the candidates there are to keep: SGLang accepts a larger N at launch and
fails at the first draft ("selected index k out of range"); N >= 2 here,
since N = 1 verifies no draft token.  Without all three SGLang picks its own
(STANDALONE: 3 steps, top-1, 4 tokens).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

import numpy as np

from ..config import MAX_DEPTH, check_budget
from .dp import DPResult, check_acceptance, optimal_tree
from .tree import Tree

#: ``--speculative-algorithm`` values with this tree family: a separate draft model, or an EAGLE head.
ALGORITHMS = ("STANDALONE", "EAGLE", "EAGLE3")

#: Widest top-k the search tries: each draft forward after the first runs K*K rows, and SGLang's own
#: automatic choices stay at K <= 4.
MAX_TOPK = 8

#: The embedded pair's checkpoints on the Hugging Face hub: SGLang serves those, not the shipped GGUF files.
EMBEDDED_TARGET = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
EMBEDDED_DRAFT = "Qwen/Qwen2.5-Coder-0.5B-Instruct"

#: Ties in expected tokens closer than this go to the smaller launch (fewer tokens, steps, top-k).
TIE = 1e-12


@dataclass(frozen=True)
class SGLangArgs:
    """The speculative flags of one SGLang launch; checked on construction (:func:`check_args`)."""

    algorithm: str          # one of ALGORITHMS
    steps: int              # S, --speculative-num-steps: draft forwards, the tree's depth limit
    topk: int               # K, --speculative-eagle-topk
    num_draft_tokens: int   # N, --speculative-num-draft-tokens: verified tokens, the root included

    def __post_init__(self) -> None:
        check_args(self.algorithm, self.steps, self.topk, self.num_draft_tokens)

    @property
    def budget(self) -> int:
        """Draft tokens per step in this project's terms (the tree's size n)."""
        return self.num_draft_tokens - 1

    def cli_args(self, draft: str | None = None) -> list[str]:
        """The flags, as ``sglang.launch_server`` parses them; ``draft`` the draft model or EAGLE head path."""
        out = ["--speculative-algorithm", self.algorithm]
        if draft:
            out += ["--speculative-draft-model-path", draft]
        return out + ["--speculative-num-steps", str(self.steps), "--speculative-eagle-topk", str(self.topk),
                      "--speculative-num-draft-tokens", str(self.num_draft_tokens)]

    def command_line(self, target: str, draft: str) -> str:
        """A shell line that serves ``target`` with this speculation (paths quoted for the shell)."""
        words = ["python", "-m", "sglang.launch_server", "--model-path", target, *self.cli_args(draft)]
        return " ".join(shlex.quote(w) for w in words)

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "speculative_num_steps": self.steps,
                "speculative_eagle_topk": self.topk, "speculative_num_draft_tokens": self.num_draft_tokens}


def candidates(steps: int, topk: int) -> int:
    """Nodes S steps of top-K draft: K at step 1, K*K at every later step."""
    return topk + (steps - 1) * topk * topk


def check_args(algorithm: str, steps: int, topk: int, num_draft_tokens: int) -> None:
    """Refuse what SGLang would refuse or silently change, naming the flag."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"--speculative-algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    for flag, value in (("--speculative-num-steps", steps), ("--speculative-eagle-topk", topk),
                        ("--speculative-num-draft-tokens", num_draft_tokens)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise ValueError(f"{flag} must be an integer, got {value!r}")
    if steps < 1:
        raise ValueError(f"--speculative-num-steps must be >= 1, got {steps}")
    if topk < 1:
        raise ValueError(f"--speculative-eagle-topk must be >= 1, got {topk}")
    if num_draft_tokens < 2:
        raise ValueError(f"--speculative-num-draft-tokens must be >= 2 (it counts the verified root), "
                         f"got {num_draft_tokens}")
    if topk == 1 and num_draft_tokens != steps + 1:
        raise ValueError(f"--speculative-num-draft-tokens must be steps + 1 = {steps + 1} with "
                         f"--speculative-eagle-topk 1 (SGLang resets it so), got {num_draft_tokens}")
    most = candidates(steps, topk)
    if num_draft_tokens - 1 > most:
        raise ValueError(f"--speculative-num-draft-tokens must be at most 1 + {most} (the nodes {steps} steps of "
                         f"top-{topk} draft), got {num_draft_tokens}")


# ------------------------------------------------------------------ the family's tree
@dataclass(frozen=True)
class _Drafted:
    """Every candidate S steps of top-K draft, in SGLang's order (step 1, then each step's K*K)."""

    parent: np.ndarray   # [C] int64 index of the parent candidate, -1 for the root
    rank: np.ndarray     # [C] int64 0-based rank among the parent's top-K
    score: np.ndarray    # [C] float64 product of the running-min p along the path: the ranking key
    reach: np.ndarray    # [C] float64 f(v), product of p along the path: the chance the node is accepted


def _draft(p: np.ndarray, steps: int, topk: int) -> _Drafted:
    """p: [W] acceptance vector.  Grows the candidates level by level, as SGLang's draft loop does."""
    acc = np.zeros(topk)                                     # [K] p of ranks 1..K, 0 past W
    acc[: min(topk, len(p))] = p[:topk]
    score_k = np.minimum.accumulate(acc)                     # [K] a younger sibling never outscores an older one
    parent, rank = [np.full(topk, -1)], [np.arange(topk)]
    score, reach = [score_k.copy()], [acc.copy()]
    frontier = np.arange(topk)                               # [K] candidate indices, best first
    start = 0
    for _ in range(1, steps):
        base = start + frontier                              # [K] global indices of the frontier
        s = (score[-1][frontier][:, None] * score_k).ravel()  # [K*K] frontier-major, then rank
        r = (reach[-1][frontier][:, None] * acc).ravel()     # [K*K]
        start += len(score[-1])
        parent.append(np.repeat(base, topk))
        rank.append(np.tile(np.arange(topk), topk))
        score.append(s)
        reach.append(r)
        frontier = np.argsort(-s, kind="stable")[:topk]      # stable: ties to the candidate drafted first
    return _Drafted(np.concatenate(parent), np.concatenate(rank), np.concatenate(score), np.concatenate(reach))


def _keep_order(drafted: _Drafted) -> np.ndarray:
    """Candidate indices best first; the first N-1 are the kept tree.  # [C]"""
    return np.argsort(-drafted.score, kind="stable")


@dataclass(frozen=True)
class FamilyTree:
    """The tree SGLang verifies for (p, S, K, N) under the acceptance model, and its value."""

    args: SGLangArgs
    tree: Tree                      # N-1 draft nodes in BFS order, children in rank order
    expected_tokens: float          # 1 + sum of f(v) over the tree's nodes, bonus token included
    n_candidates: int               # K + (S-1)*K*K drafted before the N-1 are kept


def family_tree(acceptance, steps: int, topk: int, num_draft_tokens: int,
                algorithm: str = "STANDALONE") -> FamilyTree:
    """The tree of one launch: S steps of top-K draft, the best N-1 candidates kept."""
    p = check_acceptance(acceptance)
    args = SGLangArgs(algorithm, steps, topk, num_draft_tokens)
    drafted = _draft(p, steps, topk)
    kept = _keep_order(drafted)[: args.budget]
    value = 1.0 + float(drafted.reach[kept].sum())
    return FamilyTree(args, _as_tree(drafted, kept), value, len(drafted.score))


def _as_tree(drafted: _Drafted, kept: np.ndarray) -> Tree:
    """The kept candidates as a Tree: rank paths sorted by length, then ranks (breadth-first)."""
    paths: dict[int, tuple[int, ...]] = {}
    for i in sorted(int(k) for k in kept):                   # a parent's index is below its children's
        j = int(drafted.parent[i])
        paths[i] = (paths[j] if j >= 0 else ()) + (int(drafted.rank[i]),)
    return Tree.from_rank_paths(sorted(paths.values(), key=lambda t: (len(t), t)))


def family_values(acceptance, steps: int, topk: int) -> np.ndarray:
    """Expected tokens per step of every N for one (S, K): value[N-1] for N - 1 = 0..K+(S-1)K*K.  # [C+1]"""
    p = check_acceptance(acceptance)
    check_args(ALGORITHMS[0], steps, topk, steps + 1 if topk == 1 else 2)
    return _values(_draft(p, steps, topk))


def _values(drafted: _Drafted) -> np.ndarray:
    """1 + the cumulative f of the candidates, best first.  # [C+1]"""
    return 1.0 + np.concatenate([[0.0], np.cumsum(drafted.reach[_keep_order(drafted)])])


def _prefix(drafted: _Drafted, n: int) -> _Drafted:
    """The first n candidates: fewer steps draft a prefix of what more steps draft."""
    return _Drafted(drafted.parent[:n], drafted.rank[:n], drafted.score[:n], drafted.reach[:n])


# ------------------------------------------------------------------ the search
@dataclass(frozen=True)
class SGLangChoice:
    """The best SGLang launch within a budget, beside the optimal Sequoia tree of the same size."""

    family: FamilyTree              # its args, tree and expected tokens per step
    sequoia_tokens: float           # the DP's best tree with the same number of draft tokens, depth <= depth
    sequoia_tree: Tree = field(compare=False)
    budget: int                     # the search's bounds: draft tokens (N - 1) ...
    depth: int                      # ... steps S ...
    max_topk: int                   # ... and top-k K

    @property
    def args(self) -> SGLangArgs:
        return self.family.args

    def to_dict(self, target: str | None = None, draft: str | None = None) -> dict:
        out = {"format": "sequoia-sglang/1", **self.args.to_dict(),
               "expected_tokens": self.family.expected_tokens, "sequoia_expected_tokens": self.sequoia_tokens,
               "draft_tokens": self.args.budget, "tree": self.family.tree.to_dict(),
               "sequoia_tree": self.sequoia_tree.to_dict(),
               "bounds": {"budget": self.budget, "depth": self.depth, "max_topk": self.max_topk}}
        if target and draft:
            out["command"] = self.args.command_line(target, draft)
        return out


def best_launch(acceptance, budget: int, depth: int | None = None, max_topk: int = MAX_TOPK,
                algorithm: str = "STANDALONE", dp: DPResult | None = None) -> SGLangChoice:
    """The (S, K, N) with the most expected tokens per step, N - 1 <= budget, S <= depth, K <= max_topk.

    ``depth`` defaults to min(budget, MAX_DEPTH).  Ties go to fewer draft tokens, then fewer steps, then
    a smaller top-k: the cheaper launch.  The Sequoia value beside it is the DP's optimum with the same
    N - 1 draft tokens and the same depth limit, which the family can only equal or trail; ``dp``, a
    table of the same vector already solved at least that far, saves solving it again.
    """
    p = check_acceptance(acceptance)
    check_budget(budget, depth)
    depth = min(budget, MAX_DEPTH) if depth is None else depth
    if not isinstance(max_topk, int) or isinstance(max_topk, bool) or not 1 <= max_topk <= MAX_TOPK:
        raise ValueError(f"max_topk must be an integer in 1..{MAX_TOPK}, got {max_topk!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    best = (0.0, 0, 0, 0)   # (value, kept, steps, topk); every launch beats value 0
    for topk in range(1, max_topk + 1):
        drafted = _draft(p, depth, topk)
        for steps in range(1, depth + 1):
            values = _values(_prefix(drafted, candidates(steps, topk)))   # [C+1] non-decreasing in kept
            if topk == 1:
                if steps > budget:
                    break
                kept = steps                                              # SGLang keeps the whole chain
            else:
                top = values[: budget + 1]
                kept = max(1, int(np.argmax(top >= top[-1] - TIE)))       # fewest tokens within TIE of the most
            if _better((float(values[kept]), kept, steps, topk), best):
                best = (float(values[kept]), kept, steps, topk)
    _, kept, steps, topk = best
    family = family_tree(p, steps, topk, kept + 1, algorithm)
    n, d = family.args.budget, min(depth, family.args.budget)
    if dp is None:
        dp = optimal_tree(p, n, d)
    elif dp.acceptance != tuple(float(x) for x in p) or dp.budget < n or dp.depth < d:
        raise ValueError(f"dp must be a table of the same acceptance vector with budget >= {n} and depth >= {d}")
    return SGLangChoice(family, dp.value(n, d), dp.tree(n, d), budget, depth, max_topk)


def _better(new: tuple, old: tuple) -> bool:
    """More expected tokens, or within TIE of them with fewer tokens, then fewer steps, then a smaller top-k."""
    if abs(new[0] - old[0]) > TIE:
        return new[0] > old[0]
    return new[1:] < old[1:]


__all__ = ["ALGORITHMS", "EMBEDDED_DRAFT", "EMBEDDED_TARGET", "MAX_TOPK", "FamilyTree", "SGLangArgs",
           "SGLangChoice", "best_launch", "candidates", "check_args", "family_tree", "family_values"]
