"""Hardware-aware choice of tree budget and depth (Sequoia section 3.3).

The DP (:mod:`sequoia.core.trees.dp`) gives, for every budget n and depth limit d, the
tree with the most expected tokens per step.  Which cell is best depends on
the machine: a step costs what :mod:`sequoia.core.profiles.cost` says (overhead, one
draft forward per level, one target forward of the tree's n + 1 tokens) and
yields E(n, d) tokens on average, so the predicted time per token is

    cost.step_ms(widths(n, d), n + 1) / E(n, d),

the first width counting the accepted leaf the draft catches up on (:func:`cell_leaf_mass`).

The baseline is the target alone (:func:`sequoia.core.profiles.cost.baseline_ms`).
When no cell beats it, the answer is the root-only tree (budget 0, speedup 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..profiles.cost import StepCost, baseline_ms, draft_widths, leaf_mass, overhead_ms, step_cost
from ..profiles.profile import HardwareProfile
from .dp import DPResult, expected_tokens, optimal_tree
from .tree import MAX_TREE_SIZE, Tree

# draft_widths and step_cost live in .cost; re-exported for callers of the optimizer.
__all__ = ["Choice", "StepCost", "cell_leaf_mass", "cell_shapes", "choose_tree", "draft_widths", "predict",
           "predicted_grid", "step_cost", "trees_to_check"]


@dataclass(frozen=True)
class Choice:
    budget: int                    # draft tokens in the chosen tree (0: no speculation)
    depth: int                     # its levels of draft tokens
    tree: Tree
    expected_tokens: float         # per step, bonus included
    ms_per_token: float            # predicted
    speedup: float                 # baseline_ms / ms_per_token
    baseline_ms: float             # target alone: cost.baseline_ms (target(1)) per token
    cost: StepCost
    # [max_budget+1, max_depth+1] predicted ms/token of the DP tree of every cell;
    # row 0 and column 0 (no draft tokens) hold the baseline.
    grid: np.ndarray = field(compare=False, repr=False)

    def to_dict(self) -> dict:
        return {
            "budget": self.budget, "depth": self.depth, "tree": self.tree.to_dict(),
            "expected_tokens": self.expected_tokens, "ms_per_token": self.ms_per_token,
            "speedup": self.speedup, "baseline_ms": self.baseline_ms,
            "draft_ms_per_step": self.cost.draft_ms, "target_ms_per_step": self.cost.target_ms,
            "overhead_ms_per_step": self.cost.overhead_ms,
        }


def predict(tree: Tree, acceptance, profile: HardwareProfile) -> StepCost:
    """Predicted step cost of any tree (e.g. a baseline shape or one read from a file)."""
    return step_cost(tree, expected_tokens(tree, acceptance), profile, leaf_mass(tree, acceptance))


def choose_tree(acceptance, profile: HardwareProfile, max_budget: int | None = None,
                max_depth: int | None = None) -> Choice:
    """The (budget, depth) cell whose DP tree minimises predicted ms per token.

    One DP solve covers every cell; ``max_budget`` defaults to the largest
    tree the profile measured (``profile.max_tokens - 1``), ``max_depth`` to
    the DP's default.
    """
    if max_budget is None:
        max_budget = min(profile.max_tokens - 1, MAX_TREE_SIZE)
    baseline = baseline_ms(profile)
    if max_budget < 1 or max_depth == 0:
        return _root_only(profile, np.full((max(max_budget, 0) + 1, (max_depth or 0) + 1), baseline))
    dp = optimal_tree(acceptance, max_budget, max_depth)   # the DP's entry checks the vector, once
    grid = predicted_grid(dp, profile)
    n, d = np.unravel_index(np.argmin(grid), grid.shape)  # first minimum: the smallest budget, then depth
    if grid[n, d] >= baseline:
        return _root_only(profile, grid)
    tree = dp.tree(int(n), int(d))
    cost = step_cost(tree, dp.value(int(n), int(d)), profile, leaf_mass(tree, dp.acceptance))
    return Choice(budget=tree.size, depth=tree.depth, tree=tree, expected_tokens=cost.expected_tokens,
                  ms_per_token=cost.ms_per_token, speedup=baseline / cost.ms_per_token,
                  baseline_ms=baseline, cost=cost, grid=grid)


def trees_to_check(acceptance, profile: HardwareProfile, budgets, chains) -> tuple[Choice, list[tuple[str, Tree]]]:
    """The optimizer's choice and the trees to time beside it, as (label, tree): the target alone,
    the choice, a chain of each length in ``chains`` and the DP tree of each budget in ``budgets``
    (depth at most 8).  Measuring them checks the prediction's ranking."""
    choice = choose_tree(acceptance, profile)
    out = [("target alone", Tree.root_only()), (f"optimizer's choice (n={choice.budget})", choice.tree)]
    out += [(f"chain n={n}", Tree.chain(n)) for n in chains]
    out += [(f"DP tree n={n}", optimal_tree(acceptance, n, min(n, 8)).tree()) for n in budgets]
    return choice, out


def predicted_grid(dp: DPResult, profile: HardwareProfile) -> np.ndarray:
    """Predicted ms/token of the DP tree of every cell.  # [budget+1, depth+1]; no-draft cells = baseline"""
    sizes, widths = cell_shapes(dp)                         # [B+1, D+1], [B+1, D+1, D]
    expected = dp.table                                     # [B+1, D+1]
    # cost.step_ms, vectorised over cells: each level that forwards pays its forward and its overhead.
    widths = widths.astype(np.float64)
    widths[..., 0] += np.where(widths[..., 0] > 0, cell_leaf_mass(dp), 0.0)   # the caught-up leaf
    level = profile.draft(np.maximum(widths, 1)) + profile.level_overhead_ms
    draft = np.where(widths > 0, level, 0.0)                # [B+1, D+1, D]
    overhead = np.where(sizes > 0, profile.step_overhead_ms, 0.0)   # cost.overhead_ms: trees only
    total = overhead + draft.sum(-1) + profile.target(sizes + 1)
    return total / expected


def cell_shapes(dp: DPResult) -> tuple[np.ndarray, np.ndarray]:
    """Size and per-level draft width of the DP tree of every cell, without building the trees.

    Returns sizes [B+1, D+1] (draft tokens of ``dp.tree(n, d)``) and widths
    [B+1, D+1, D] (``widths[n, d, l]``: nodes at level l of that tree that have
    children).  Mirrors :meth:`DPResult.tree`, vectorised over the node budget:
    the subtree of a node with k nodes below it and L levels to go has
    children of sizes ``choice[L, i, k_left]`` (0 = stop) for ranks i = 0, 1, ...
    """
    B, D = dp.budget, dp.depth
    below = np.zeros((D + 1, B + 1), dtype=np.int64)         # [L, k] nodes below a subtree root
    shape = np.zeros((D + 1, B + 1, D), dtype=np.int64)      # [L, k, level] nodes with children
    ks = np.arange(B + 1)
    for L in range(1, D + 1):
        left = ks.copy()
        alive = np.ones(B + 1, dtype=bool)
        for row in dp.choice[L]:                             # [B+1] one rank
            a = np.where(alive, row[left], 0)
            alive &= a > 0
            child = np.maximum(a - 1, 0)                     # nodes below each child
            below[L] += np.where(alive, a, 0)
            shape[L, :, 1:] += np.where(alive[:, None], shape[L - 1, child, : D - 1], 0)
            left = left - a
        shape[L, :, 0] = below[L] > 0
    return below.T.copy(), shape.transpose(1, 0, 2).copy()


def cell_leaf_mass(dp: DPResult) -> np.ndarray:
    """:func:`sequoia.core.profiles.cost.leaf_mass` of the DP tree of every cell, without building the trees.
    # [B+1, D+1]

    ``mass[L, k]``: the probability that the accepted path, having reached a node with k nodes below it and L
    levels to go, ends on a leaf of that subtree (1 for a leaf itself); the rank-i child is accepted with p_i, as
    in the DP.  A cell's value is its root's, the root excluded (a root-only tree has no draft leaf).
    """
    B, D = dp.budget, dp.depth
    p = np.asarray(dp.acceptance, dtype=np.float64)
    ks = np.arange(B + 1)
    mass = np.ones((D + 1, B + 1))                           # [L, k] a subtree root accepted
    below = np.zeros((D + 1, B + 1))                         # [L, k] the same, the subtree root excluded
    for L in range(1, D + 1):
        left = ks.copy()
        alive = np.ones(B + 1, dtype=bool)
        for i, row in enumerate(dp.choice[L]):               # [B+1] one rank
            a = np.where(alive, row[left], 0)
            alive &= a > 0
            accept = p[i] if i < p.size else 0.0
            below[L] += np.where(alive, accept * mass[L - 1, np.maximum(a - 1, 0)], 0.0)
            left = left - a
        has_child = dp.choice[L][0] > 0 if len(dp.choice[L]) else np.zeros(B + 1, dtype=bool)
        mass[L] = np.where(has_child, below[L], 1.0)         # no child (no room, or none pays): a leaf
    return below.T.copy()


def _root_only(profile: HardwareProfile, grid: np.ndarray) -> Choice:
    baseline = baseline_ms(profile)
    cost = StepCost(draft_ms=0.0, target_ms=float(profile.target(1)), expected_tokens=1.0,
                    overhead_ms=overhead_ms(profile, 1))
    return Choice(budget=0, depth=0, tree=Tree.root_only(), expected_tokens=1.0, ms_per_token=baseline,
                  speedup=1.0, baseline_ms=baseline, cost=cost, grid=grid)
