"""The static tree with one copied chain at the root (sequoia.core.trees.dp.optimal_tree_with_copies)."""

from __future__ import annotations

import itertools

import pytest

from sequoia.core.statistics.trace import DRAFT, NGRAM, ROOT
from sequoia.core.trees.dp import expected_tokens, optimal_tree, optimal_tree_with_copies
from sequoia.core.trees.tree import Tree

P = (0.6, 0.2, 0.1)


def _trees(size: int, depth: int):
    """Every BFS tree with exactly ``size`` draft nodes and depth <= ``depth`` (children counts per node)."""
    def grow(counts, n_nodes, placed):
        node = len(counts)
        if placed == size:
            yield Tree.from_children_counts(counts)
            return
        if node >= n_nodes:
            return
        for k in range(size - placed + 1):
            yield from grow(counts + [k], n_nodes + k, placed + k)
    for t in grow([], 1, 0):
        if t.depth <= depth:
            yield t


def _brute(p, c, n, d) -> float:
    best = -1.0
    for m in range(min(len(c), n, d) + 1):
        chain = sum(_prod(c[:j]) for j in range(1, m + 1))
        weight = 1.0 if m == 0 else 1.0 - c[0]
        gain = max(expected_tokens(t, p) - 1.0 for k in range(n - m + 1) for t in _trees(k, d))
        best = max(best, 1.0 + chain + weight * gain)
    return best


def _prod(xs) -> float:
    out = 1.0
    for x in xs:
        out *= x
    return out


def _value_of(result, p, c) -> float:
    """E of the returned tree, evaluated from its shape and sources alone (not from the DP table)."""
    paths = result.tree.rank_paths()
    m = sum(s == NGRAM for s in result.sources)
    draft = [(path[0] - (1 if m else 0),) + path[1:] for path, s in zip(paths, result.sources) if s == DRAFT]
    gain = expected_tokens(Tree.from_rank_paths(sorted(draft, key=lambda t: (len(t), t))), p) - 1.0
    weight = 1.0 if m == 0 else 1.0 - c[0]
    return 1.0 + sum(_prod(c[:j]) for j in range(1, m + 1)) + weight * gain


def test_no_copies_is_optimal_tree_exactly():
    dp = optimal_tree(P, 12, 5)
    r = optimal_tree_with_copies(P, (), 12, 5)
    assert r.n_copied == 0 and r.tree == dp.tree() and r.value == dp.value()
    assert r.sources == (ROOT,) + (DRAFT,) * r.tree.size
    assert r.value_by_copies == (dp.value(),)


def test_value_at_zero_copies_is_optimal_tree():
    r = optimal_tree_with_copies(P, (0.9, 0.8), 12, 5)
    assert r.value_by_copies[0] == optimal_tree(P, 12, 5).value()


def test_useless_copies_are_not_used():
    r = optimal_tree_with_copies(P, (0.0, 0.0, 0.0), 10, 4)
    assert r.n_copied == 0 and r.tree == optimal_tree(P, 10, 4).tree()
    assert NGRAM not in r.sources


def test_sure_copies_make_a_long_chain():
    r = optimal_tree_with_copies(P, (1.0,) * 6, 10, 8)
    assert r.n_copied == 6 and r.value == pytest.approx(7.0)
    assert r.tree == Tree.chain(6)  # the draft's nodes would never be reached
    assert r.sources == (ROOT,) + (NGRAM,) * 6


def test_chain_respects_depth_and_budget():
    assert optimal_tree_with_copies(P, (1.0,) * 9, 4, 8).n_copied == 4
    assert optimal_tree_with_copies(P, (1.0,) * 9, 10, 3).n_copied == 3


def test_copied_chain_is_first_under_the_root():
    r = optimal_tree_with_copies(P, (0.7, 0.9, 0.9), 10, 5)
    assert r.n_copied > 0
    node = 0
    for _ in range(r.n_copied):
        node = r.tree.children[node][0]
        assert r.sources[node] == NGRAM
    assert sum(s == NGRAM for s in r.sources) == r.n_copied
    assert r.tree.size <= 10


@pytest.mark.parametrize("p, c, n, d", [
    (P, (0.5, 0.9), 4, 3),
    ((0.5, 0.3), (0.3, 0.5, 0.9), 5, 4),
    ((0.8,), (0.6, 0.6), 5, 5),
    ((0.4, 0.4, 0.1), (0.95,), 5, 2),
    ((0.2, 0.1), (0.9, 0.9, 0.9, 0.9), 4, 4),
])
def test_matches_brute_force(p, c, n, d):
    r = optimal_tree_with_copies(p, c, n, d)
    assert r.value == pytest.approx(_brute(p, c, n, d), abs=1e-12)
    assert _value_of(r, p, c) == pytest.approx(r.value, abs=1e-12)
    assert r.value == max(r.value_by_copies)


@pytest.mark.parametrize("bad", [(1.2,), (-0.1,), (float("nan"),), "ab", 0.5, ((0.5,),)])
def test_rejects_bad_copies(bad):
    with pytest.raises(ValueError):
        optimal_tree_with_copies(P, bad, 4, 2)


def test_all_trees_enumerator_counts():
    # Catalan numbers: ordered trees with k non-root nodes, no depth limit
    assert [sum(1 for _ in _trees(k, k)) for k in range(5)] == [1, 1, 2, 5, 14]
    assert list(itertools.islice(_trees(0, 0), 2)) == [Tree.root_only()]
