"""The Sequoia DP against brute force over every ordered tree, and its invariants."""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pytest

from sequoia.core.config import MAX_DEPTH
from sequoia.core.trees.dp import DPResult, baseline_curves, expected_tokens, optimal_tree
from sequoia.core.trees.tree import MAX_TREE_SIZE, Tree

VECTORS = {
    "decreasing": (0.45, 0.2, 0.1, 0.05),
    "flat": (0.15,) * 5,
    "zeros": (0.6, 0.0, 0.3, 0.0),
    "non_monotone": (0.1, 0.4, 0.05, 0.3),
    "wider_than_budget": (0.07,) * 12,
    "certain": (1.0,),
}
CATALAN = (1, 1, 2, 5, 14, 42, 132, 429, 1430, 4862, 16796)
ATOL = 1e-12


# ------------------------------------------------------------------ brute force
def _children_counts(n: int, counts: list[int]):
    """Every BFS children-count sequence of an ordered tree with n draft nodes."""
    created, processed = 1 + sum(counts), len(counts)
    if processed == created:
        if created == n + 1:
            yield tuple(counts)
        return
    for c in range(n + 1 - created + 1):
        yield from _children_counts(n, counts + [c])


@lru_cache(maxsize=None)
def all_trees(n: int) -> tuple[Tree, ...]:
    """Every ordered tree with exactly n draft nodes (there are Catalan(n) of them)."""
    return tuple(Tree.from_children_counts(c) for c in _children_counts(n, []))


def brute_force_table(acceptance, budget: int) -> np.ndarray:
    """[budget+1, budget+1]: best expected tokens over trees with <= n nodes and <= d levels."""
    best = np.ones((budget + 1, budget + 1))
    for n in range(1, budget + 1):
        for tree in all_trees(n):
            best[n, tree.depth] = max(best[n, tree.depth], expected_tokens(tree, acceptance))
    # "At most n tokens, at most d levels".
    return np.maximum.accumulate(np.maximum.accumulate(best, axis=0), axis=1)


def test_enumeration_is_complete():
    assert tuple(len(all_trees(n)) for n in range(9)) == CATALAN[:9]
    assert len(set(all_trees(6))) == CATALAN[6]


@pytest.mark.parametrize("name", VECTORS)
def test_dp_matches_brute_force_up_to_8(name):
    p = VECTORS[name]
    result = optimal_tree(p, 8)
    np.testing.assert_allclose(result.table, brute_force_table(p, 8), rtol=0, atol=ATOL)


def test_dp_matches_brute_force_at_10():
    p = VECTORS["non_monotone"]
    result = optimal_tree(p, 10)
    np.testing.assert_allclose(result.table, brute_force_table(p, 10), rtol=0, atol=ATOL)


# ------------------------------------------------------------------ expected tokens
def test_expected_tokens_by_hand():
    #      0          ranks: 1, 2 under the root; 3, 4 under node 1; 5 under 2; 6 under 4
    #    1   2
    #   3 4   5
    #     6
    tree = Tree((-1, 0, 0, 1, 1, 2, 4))
    assert expected_tokens(tree, [0.5, 0.3]) == pytest.approx(1 + 0.5 + 0.3 + 0.25 + 0.15 + 0.15 + 0.075)
    # Rank 2 does not exist in a width-1 vector: nodes 2, 4 and their subtrees count 0.
    assert expected_tokens(tree, [0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(Tree.root_only(), [0.5]) == 1.0
    assert expected_tokens(Tree.chain(4), [0.5]) == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)


def test_certain_acceptance_is_one_token_per_level():
    result = optimal_tree([1.0], 12, 5)
    for n in range(13):
        for d in range(6):
            assert result.value(n, d) == 1 + min(n, d)


# ------------------------------------------------------------------ reconstruction
@pytest.mark.parametrize("name", VECTORS)
def test_every_cell_rebuilds_a_tree_worth_its_value(name):
    p = VECTORS[name]
    result = optimal_tree(p, 40, 7)
    for n in range(41):
        for d in range(8):
            tree = result.tree(n, d)
            assert tree.size <= n and tree.depth <= d
            assert expected_tokens(tree, p) == pytest.approx(result.value(n, d), abs=ATOL)


def test_default_cell_is_budget_and_depth():
    result = optimal_tree(VECTORS["decreasing"], 20, 4)
    assert result.value() == result.value(20, 4)
    assert result.tree() == result.tree(20, 4)
    assert result.tree(0, 4) == Tree.root_only()
    assert result.tree(20, 1).parents == (-1, 0, 0, 0, 0)  # one level: one child per rank


def test_zero_acceptance_builds_nothing():
    result = optimal_tree([0.0, 0.0], 10)
    assert result.tree() == Tree.root_only()
    assert np.all(result.table == 1.0)


def test_zero_rank_nodes_only_enable_their_younger_siblings():
    p = VECTORS["zeros"]
    tree = optimal_tree(p, 30).tree()
    assert max(tree.ranks) <= 2  # the trailing zero rank is never drafted
    for node in range(1, tree.n_nodes):
        if p[tree.ranks[node]] == 0:
            assert tree.children[node] == ()
            assert tree.children[tree.parents[node]][-1] != node  # a rank-3 sibling follows


def test_depth_limit_is_respected():
    p = VECTORS["decreasing"]
    for d in (1, 2, 3, 5):
        tree = optimal_tree(p, 60, d).tree()
        assert tree.depth == d
        # Every p_k > 0, so the tree fills the budget or the full 4-ary tree of depth d.
        assert tree.size == min(60, sum(4**j for j in range(1, d + 1)))


@pytest.mark.parametrize("name", ["decreasing", "flat", "non_monotone"])
def test_dp_never_loses_to_fixed_shapes(name):
    p = VECTORS[name]
    result = optimal_tree(p, 120, 12)
    shapes = [Tree.chain(n) for n in range(1, 13)]
    shapes += [Tree.k_chains(k, n) for k in (2, 3, 4, 8) for n in range(1, 13) if k * n <= 120]
    shapes += [Tree.k_ary(k, d) for k, d in [(2, 1), (2, 3), (2, 5), (3, 3), (4, 2), (10, 2)]]
    shapes += [Tree.specinfer(5, 4), Tree.from_children_counts([3, 2, 1, 1, 0, 1])]
    for tree in shapes:
        assert result.value(tree.size, tree.depth) >= expected_tokens(tree, p) - ATOL, tree


# ------------------------------------------------------------------ table invariants
@pytest.mark.parametrize("name", VECTORS)
def test_table_is_monotone(name):
    table = optimal_tree(VECTORS[name], 100, 10).table
    assert table.shape == (101, 11)
    assert np.all(table[0] == 1.0) and np.all(table[:, 0] == 1.0)
    assert np.all(np.diff(table, axis=0) >= 0)
    assert np.all(np.diff(table, axis=1) >= 0)


def test_depth_defaults_to_budget_capped():
    p = VECTORS["decreasing"]
    assert optimal_tree(p, 10).depth == 10
    assert optimal_tree(p, 100).depth == MAX_DEPTH
    assert optimal_tree(p, 1).tree() == Tree.chain(1)


def test_to_dict_is_json():
    result = optimal_tree(VECTORS["decreasing"], 6, 3)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["format"] == "sequoia-dp/1"
    assert (data["budget"], data["depth"], data["acceptance"]) == (6, 3, list(VECTORS["decreasing"]))
    assert np.array_equal(np.array(data["table"]), result.table)
    assert data["value"] == result.value()
    assert Tree.from_dict(data["tree"]) == result.tree()


def test_results_compare_by_inputs():
    a, b = optimal_tree([0.5, 0.2], 8), optimal_tree((0.5, 0.2), 8)
    assert isinstance(a, DPResult) and a == b and hash(a) == hash(b)
    assert a != optimal_tree([0.5, 0.2], 8, 3)


# ------------------------------------------------------------------ baselines
def test_baseline_curves():
    p = VECTORS["decreasing"]
    sizes = [1, 2, 3, 5, 8, 16, 33]
    curves = baseline_curves(p, sizes)
    assert set(curves) == {"sequoia", "chain", "k_chains", "binary"}
    assert all(len(v) == len(sizes) for v in curves.values())
    assert curves["chain"] == pytest.approx([1 + sum(p[0] ** j for j in range(1, n + 1)) for n in sizes])
    assert curves["sequoia"] == pytest.approx([optimal_tree(p, n).value() for n in sizes])
    assert curves["binary"][2] == pytest.approx(1 + 0.45 + 0.2 + 0.45**2)  # root, two children, one grandchild
    # At n = 8, four chains of two beat two chains of four and eight of one.
    assert curves["k_chains"][4] == pytest.approx(expected_tokens(Tree.k_chains(4, 2), p))
    for name in ("chain", "k_chains", "binary"):
        assert all(s >= b - ATOL for s, b in zip(curves["sequoia"], curves[name])), name


# ------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(
    "acceptance, message",
    [
        ([0.5, -0.1], r"\[0, 1\]"),
        ([1.5], r"\[0, 1\]"),
        ([0.6, 0.5], "sum to at most 1"),
        ([], "non-empty"),
        ([[0.5]], "1-D"),
        ([float("nan")], "finite"),
        (["high"], "sequence of numbers"),
        ([[0.5], [0.1, 0.2]], "sequence of numbers"),
    ],
)
def test_bad_acceptance_raises(acceptance, message):
    with pytest.raises(ValueError, match=message):
        optimal_tree(acceptance, 4)
    with pytest.raises(ValueError, match=message):
        expected_tokens(Tree.chain(2), acceptance)


def test_sum_within_tolerance_is_accepted():
    assert optimal_tree([0.5, 0.5 + 1e-7], 4).value() > 1


@pytest.mark.parametrize(
    "budget, depth",
    [(0, None), (MAX_TREE_SIZE + 1, None), (2.5, None), (4, 0), (4, MAX_DEPTH + 1), (4, 1.5)],
)
def test_bad_budget_or_depth_raises(budget, depth):
    with pytest.raises(ValueError, match="budget|depth"):
        optimal_tree([0.5], budget, depth)


def test_cells_outside_the_table_raise():
    result = optimal_tree([0.5], 5, 3)
    for n, d in [(6, 3), (-1, 3), (5, 4), (5, -1)]:
        with pytest.raises(ValueError, match="must be an integer"):
            result.value(n, d)
        with pytest.raises(ValueError, match="must be an integer"):
            result.tree(n, d)


def test_baseline_curves_rejects_bad_sizes():
    with pytest.raises(ValueError, match="empty"):
        baseline_curves([0.5], [])
    with pytest.raises(ValueError, match="budget"):
        baseline_curves([0.5], [4, 0])
