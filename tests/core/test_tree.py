"""Exact unit tests of the frozen Tree type on small hand-built trees."""

from __future__ import annotations

import json

import pytest
import torch

from sequoia.core.trees.tree import MAX_TREE_SIZE, Tree

# Root with children 1, 2; node 1 has children 3, 4; node 2 has child 5; node 4 has child 6.
#
#          0
#        /   \
#       1     2
#      / \     \
#     3   4     5
#         |
#         6
SAMPLE = Tree((-1, 0, 0, 1, 1, 2, 4))


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "parents, message",
    [
        ((), "needs a root"),
        ((0, 0), "needs a root"),
        ((-1, -1), "parents must precede"),
        ((-1, 1), "parents must precede"),        # its own parent
        ((-1, 2, 0), "parents must precede"),     # parent listed after the child
        ((-1, 0, 1, 0), "breadth-first"),         # depth goes 1, 2, 1
        ((-1, 0, 0, 1, 2, 1), "breadth-first"),   # node 1's children split by node 2's
    ],
)
def test_invalid_parents_raise(parents, message):
    with pytest.raises(ValueError, match=message):
        Tree(parents)


def test_too_large_raises():
    Tree.chain(MAX_TREE_SIZE)  # the limit itself is allowed
    with pytest.raises(ValueError, match="maximum"):
        Tree.chain(MAX_TREE_SIZE + 1)


def test_parents_are_normalised_to_int_tuple():
    tree = Tree([-1, 0, 0])
    assert tree.parents == (-1, 0, 0)
    assert tree == Tree((-1, 0, 0))
    assert hash(tree) == hash(Tree((-1, 0, 0)))


# ------------------------------------------------------------------ shape
def test_shape_of_sample():
    assert SAMPLE.n_nodes == 7
    assert SAMPLE.size == 6
    assert SAMPLE.depths == (0, 1, 1, 2, 2, 2, 3)
    assert SAMPLE.depth == 3
    assert SAMPLE.levels == ((0,), (1, 2), (3, 4, 5), (6,))
    assert SAMPLE.children == ((1, 2), (3, 4), (5,), (), (6,), (), ())
    assert SAMPLE.ranks == (0, 0, 1, 0, 1, 0, 0)


def test_paths():
    assert SAMPLE.path(0) == (0,)
    assert SAMPLE.path(2) == (0, 2)
    assert SAMPLE.path(6) == (0, 1, 4, 6)
    assert SAMPLE.path(5) == (0, 2, 5)


def test_root_only_shape():
    tree = Tree.root_only()
    assert tree.parents == (-1,)
    assert (tree.size, tree.depth, tree.levels, tree.children, tree.ranks) == (0, 0, ((0,),), ((),), (0,))


# ------------------------------------------------------------------ tensors
def test_position_ids():
    pos = SAMPLE.position_ids(offset=10)
    assert pos.dtype == torch.long
    assert pos.tolist() == [10, 11, 11, 12, 12, 12, 13]
    assert Tree.root_only().position_ids(0).tolist() == [0]


def test_ancestor_mask_of_sample():
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0, 0],
            [1, 1, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 1, 0, 0],
            [1, 0, 1, 0, 0, 1, 0],
            [1, 1, 0, 0, 1, 0, 1],
        ],
        dtype=torch.bool,
    )
    mask = SAMPLE.ancestor_mask()
    assert mask.dtype == torch.bool and mask.shape == (7, 7)
    assert torch.equal(mask, expected)


def test_ancestor_mask_rows_match_paths():
    tree = Tree.k_ary(3, 3)
    mask = tree.ancestor_mask()
    for node in range(tree.n_nodes):
        assert set(torch.nonzero(mask[node]).flatten().tolist()) == set(tree.path(node))


def test_chain_mask_is_causal():
    assert torch.equal(Tree.chain(4).ancestor_mask(), torch.tril(torch.ones(5, 5, dtype=torch.bool)))


# ------------------------------------------------------------------ constructors
def test_chain():
    assert Tree.chain(0) == Tree.root_only()
    tree = Tree.chain(3)
    assert tree.parents == (-1, 0, 1, 2)
    assert (tree.size, tree.depth) == (3, 3)
    with pytest.raises(ValueError, match="length"):
        Tree.chain(-1)


def test_k_chains():
    tree = Tree.k_chains(3, 2)
    assert tree.parents == (-1, 0, 0, 0, 1, 2, 3)
    assert tree.ranks == (0, 0, 1, 2, 0, 0, 0)
    assert Tree.k_chains(1, 4) == Tree.chain(4)
    assert Tree.k_chains(2, 3).parents == (-1, 0, 0, 1, 2, 3, 4)
    for bad in [(0, 2), (2, 0)]:
        with pytest.raises(ValueError):
            Tree.k_chains(*bad)


def test_k_ary():
    tree = Tree.k_ary(2, 2)
    assert tree.parents == (-1, 0, 0, 1, 1, 2, 2)
    assert Tree.k_ary(3, 0) == Tree.root_only()
    assert Tree.k_ary(1, 5) == Tree.chain(5)
    assert Tree.k_ary(4, 3).size == 4 + 16 + 64
    with pytest.raises(ValueError, match="exceeds"):
        Tree.k_ary(2, 10)  # 2046 nodes
    with pytest.raises(ValueError, match="k"):
        Tree.k_ary(0, 2)


def test_specinfer_is_independent_sequences():
    assert Tree.specinfer(4, 3) == Tree.k_chains(4, 3)
    tree = Tree.specinfer(2, 3)
    assert tree.levels == ((0,), (1, 2), (3, 4), (5, 6))


def test_from_children_counts():
    assert Tree.from_children_counts([2, 2, 1, 0, 1]) == SAMPLE
    assert Tree.from_children_counts([]) == Tree.root_only()
    assert Tree.from_children_counts([0]) == Tree.root_only()
    assert Tree.from_children_counts([1, 1, 1]) == Tree.chain(3)


# ------------------------------------------------------------------ (de)serialise
def test_dict_round_trip():
    data = SAMPLE.to_dict()
    assert data == {"format": "sequoia-tree/1", "parents": [-1, 0, 0, 1, 1, 2, 4], "size": 6, "depth": 3}
    assert Tree.from_dict(data) == SAMPLE


def test_json_round_trip(tmp_path):
    path = tmp_path / "tree.json"
    SAMPLE.to_json(path, note="hand-built")
    assert json.loads(path.read_text())["note"] == "hand-built"
    assert Tree.from_json(path) == SAMPLE


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not valid JSON"),
        ("[-1, 0]", "expected a JSON object"),
        ('{"size": 3}', "expected a JSON object"),
        ('{"parents": "-1,0"}', "list of integers"),
        ('{"parents": [-1, 0.5]}', "list of integers"),
        ('{"parents": [0, 0]}', "needs a root"),
    ],
)
def test_malformed_json_raises(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        Tree.from_json(path)
