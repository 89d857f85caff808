"""Exact statistics on hand-built step records."""

import pytest

from sequoia.core.statistics.stats import empirical_acceptance, rank_counts, summarize
from sequoia.core.statistics.trace import StepRecord
from sequoia.core.trees.tree import Tree

# root -> 1, 2, 3 ; 1 -> 4, 5 ; 2 -> 6 ; 4 -> 7
TREE = Tree((-1, 0, 0, 0, 1, 1, 2, 4))


def test_tree_fixture_ranks():
    assert TREE.ranks == (0, 0, 1, 2, 0, 1, 0, 0)


def test_rank_counts_and_vector():
    recs = [
        StepRecord.fake(TREE, (0, 1, 5), step=0),     # root: rank 0 accepted; node 1: rank 1 accepted; node 5 leaf
        StepRecord.fake(TREE, (0, 2), step=1),        # root: rank 1 accepted; node 2 (1 child): none accepted
        StepRecord.fake(TREE, (0,), step=2),          # root: nothing accepted
        StepRecord.fake(TREE, (0, 1, 4, 7), step=3),  # root r0, node 1 r0, node 4 r0, node 7 leaf
    ]
    accepts, parents = rank_counts(recs)
    # parents with >= k children: root x4 (3 kids), node1 x2 (2 kids), node2 x1 (1 kid), node4 x1 (1 kid)
    assert parents == [8, 6, 4]
    assert accepts == [4, 2, 0]
    assert empirical_acceptance(recs, 4) == (0.5, pytest.approx(1 / 3), 0.0, 0.0)


def test_summarize_counts_and_series():
    recs = [
        StepRecord.fake(TREE, (0, 1, 5), step=0),
        StepRecord.fake(TREE, (0,), step=1),
        StepRecord.fake(Tree.chain(3), (0, 1, 2, 3), step=2),
    ]
    s = summarize(recs)
    assert s.steps == 3
    assert s.series_new == (3, 1, 4)
    assert s.new_tokens == 8
    assert s.tokens_per_step == pytest.approx(8 / 3)
    assert s.tokens_per_step_hist == (0, 1, 0, 1, 1)
    assert s.series_cum_tokens == (3, 4, 8)
    assert s.series_accepted == (2, 0, 3)
    assert s.mean_accepted == pytest.approx(5 / 3)
    assert s.accept_by_depth == (pytest.approx(2 / 3), pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert s.series_tree_size == (7, 7, 3)
    assert s.total_s == pytest.approx(3 * 0.031)
    assert s.tokens_per_s == pytest.approx(8 / (3 * 0.031))
    split = s.time_split
    assert sum(split.values()) == pytest.approx(1.0)
    assert split["verify"] == pytest.approx(0.02 / 0.031)


def test_summarize_empty():
    s = summarize([])
    assert s.steps == 0 and s.new_tokens == 0 and s.tokens_per_s == 0.0
    assert s.acceptance == () and s.accept_by_depth == ()


def test_empirical_acceptance_rejects_bad_width():
    with pytest.raises(ValueError):
        empirical_acceptance([], 0)


def test_chain_gives_first_rank_only():
    recs = [StepRecord.fake(Tree.chain(2), acc, step=i) for i, acc in enumerate([(0, 1, 2), (0, 1), (0,)])]
    # parents: root x3, node 1 x2, node 2 never a parent (leaf) -> 5; accepts: 2 + 1 = 3
    assert empirical_acceptance(recs, 2) == (pytest.approx(3 / 5), 0.0)


def test_the_decode_rate_leaves_out_the_prompts_forward():
    import dataclasses

    chain = Tree.chain(2)
    prompt = dataclasses.replace(StepRecord.fake(Tree.root_only(), (0,)), prompt_tokens=50, verify_s=1.0)
    steps = [prompt] + [StepRecord.fake(chain, (0, 1, 2), step=i) for i in (1, 2)]
    s = summarize(steps)
    assert s.first_token_s == pytest.approx(1.011) and s.new_tokens == 7
    assert s.tokens_per_s == pytest.approx(6 / (2 * 0.031))          # 3 tokens a step in 31 ms
    assert s.series_rate == pytest.approx((0.0, 3 / 0.031, 6 / 0.062))  # the running rate, step 0 left out
    assert summarize(steps[1:]).tokens_per_s == pytest.approx(6 / (2 * 0.031))
    assert summarize([prompt]).tokens_per_s == pytest.approx(1 / 1.011)   # only the prompt's forward so far
