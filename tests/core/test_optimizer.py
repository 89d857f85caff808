"""The hardware-aware optimizer on hand-made profiles, where the best answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from sequoia.core.profiles.cost import leaf_mass
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.trees.dp import expected_tokens, optimal_tree
from sequoia.core.trees.optimizer import cell_shapes, choose_tree, draft_widths, predict, predicted_grid, step_cost
from sequoia.core.trees.tree import Tree

ACC = (0.6, 0.15, 0.08, 0.05, 0.03, 0.02)
FLAT = lambda ms: (lambda _: ms)  # noqa: E731


def test_free_verification_cheap_draft_takes_the_largest_tree():
    prof = HardwareProfile.hand_made(target=FLAT(100.0), draft=FLAT(1e-3))
    c = choose_tree(ACC, prof, max_budget=64, max_depth=8)
    dp = optimal_tree(ACC, 64, 8)
    assert (c.budget, c.depth) == (64, 8)
    assert c.expected_tokens == pytest.approx(dp.value(64, 8))
    assert c.tree == dp.tree(64, 8)
    assert c.speedup == pytest.approx(dp.value(64, 8), rel=1e-3)


def test_costly_verification_gives_a_chain():
    # Each verified token costs as much as the whole baseline forward: only the
    # highest-probability node (rank 1 everywhere) can pay for itself.
    prof = HardwareProfile.hand_made(target=lambda n: 100.0 + 30.0 * (n - 1), draft=FLAT(1.0))
    c = choose_tree((0.9, 0.05), prof, max_budget=32, max_depth=16)
    assert c.tree == Tree.chain(c.budget)
    assert 1 <= c.budget < 16
    assert c.speedup > 1


def test_exact_best_on_a_chain_only_vector():
    # p = (0.5,): every tree is a chain; cost per token of chain d = (d + 100 + 10 d) / (2 - 0.5^d).
    prof = HardwareProfile.hand_made(target=lambda n: 100.0 + 10.0 * (n - 1), draft=FLAT(1.0))
    c = choose_tree((0.5,), prof, max_budget=20, max_depth=20)
    costs = {d: (d * 1.0 + 100.0 + 10.0 * d) / (2 - 0.5**d) for d in range(1, 21)}
    best = min(costs, key=costs.get)
    assert (c.budget, c.depth) == (best, best)
    assert c.ms_per_token == pytest.approx(costs[best])
    assert c.speedup == pytest.approx(100.0 / costs[best])


def test_zero_acceptance_falls_back_to_the_target_alone():
    prof = HardwareProfile.hand_made(target=FLAT(100.0), draft=FLAT(5.0))
    c = choose_tree((0.0, 0.0), prof, max_budget=16, max_depth=4)
    assert (c.budget, c.depth, c.speedup) == (0, 0, 1.0)
    assert c.tree == Tree.root_only()
    assert c.ms_per_token == c.baseline_ms == 100.0


def test_draft_too_slow_falls_back_to_the_target_alone():
    prof = HardwareProfile.hand_made(target=FLAT(100.0), draft=FLAT(100.0))
    c = choose_tree(ACC, prof, max_budget=16, max_depth=4)
    assert c.budget == 0 and c.speedup == 1.0


def test_grid_matches_per_tree_prediction():
    prof = HardwareProfile.hand_made(target=lambda n: 50.0 + 2.0 * n, draft=lambda w: 5.0 + 0.5 * w)
    dp = optimal_tree(ACC, 24, 6)
    grid = predicted_grid(dp, prof)
    assert grid.shape == (25, 7)
    assert np.all(grid[0] == prof.target(1)) and np.all(grid[:, 0] == prof.target(1))
    for n, d in [(1, 1), (5, 2), (24, 6), (13, 3), (24, 1)]:
        tree = dp.tree(n, d)
        assert grid[n, d] == pytest.approx(step_cost(tree, dp.value(n, d), prof, leaf_mass(tree, ACC)).ms_per_token)
        assert grid[n, d] == pytest.approx(predict(tree, ACC, prof).ms_per_token)
    c = choose_tree(ACC, prof, max_budget=24, max_depth=6)
    assert c.ms_per_token == pytest.approx(grid.min())


@pytest.mark.parametrize("acc", [ACC, (0.3, 0.3, 0.2), (0.9,), (0.5, 0.0, 0.3), (0.0,)])
def test_cell_shapes_match_rebuilt_trees(acc):
    dp = optimal_tree(acc, 30, 7)
    sizes, widths = cell_shapes(dp)
    for n in range(31):
        for d in range(8):
            tree = dp.tree(n, d)
            assert sizes[n, d] == tree.size
            expect = [0] * 7
            for level, w in enumerate(draft_widths(tree)):
                expect[level] = w
            assert list(widths[n, d]) == expect


def test_draft_widths_follow_the_drafter():
    tree = Tree((-1, 0, 0, 1, 1, 2, 3))  # level 1: nodes 1, 2 both have children; level 2: only node 3
    assert draft_widths(tree) == (1, 2, 1)
    assert draft_widths(Tree.root_only()) == ()
    prof = HardwareProfile.hand_made(target=FLAT(10.0), draft=lambda w: w)
    cost = predict(tree, ACC, prof)
    assert cost.expected_tokens == pytest.approx(expected_tokens(tree, ACC))
    # The first forward also feeds the last step's accepted leaf, when the path ended on one (its expected count).
    assert cost.draft_ms == pytest.approx(1.0 + leaf_mass(tree, ACC) + 2.0 + 1.0)
    assert cost.target_ms == 10.0


def test_choice_serialises():
    prof = HardwareProfile.hand_made(target=lambda n: 50.0 + n, draft=FLAT(3.0))
    d = choose_tree(ACC, prof, max_budget=16, max_depth=4).to_dict()
    assert Tree.from_dict(d["tree"]).size == d["budget"]
    assert d["speedup"] > 1
