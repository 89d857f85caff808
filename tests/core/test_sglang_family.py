"""SGLang's tree family (sequoia.core.trees.sglang_family): its trees and values against independent brute force,
the search against every launch in its bounds, and the flag constraints read from SGLang's argument checks."""

from __future__ import annotations

import itertools
import math
import shlex

import pytest

from sequoia.core.trees.dp import expected_tokens, optimal_tree
from sequoia.core.trees.sglang_family import (MAX_TOPK, SGLangArgs, best_launch, candidates, check_args, family_tree,
                                              family_values)
from sequoia.core.trees.tree import Tree

VECTORS = {
    "peaked": [0.7, 0.15, 0.05],
    "flat": [0.35, 0.3, 0.2],
    "tail-bump": [0.6, 0.05, 0.1, 0.02],    # not non-increasing, as measured vectors often are in their tail
    "short": [0.9],
    "zeros": [0.5, 0.0, 0.3],
}


# ------------------------------------------------------------------ independent references
def naive_family(p, steps, topk, keep):
    """The EAGLE-2 rule written out on rank paths: scores by math.prod, sorted(), ties to the earlier draft."""
    def acc(r):
        return p[r] if r < len(p) else 0.0

    def score(path):  # a younger sibling never outscores an older one: the running minimum of p
        return math.prod(min(acc(j) for j in range(r + 1)) for r in path)

    drafted = [(r,) for r in range(topk)]               # step 1: the root's top-K
    frontier = list(drafted)
    for _ in range(steps - 1):
        new = [f + (r,) for f in frontier for r in range(topk)]
        drafted += new
        order = sorted(range(len(new)), key=lambda i: (-score(new[i]), i))
        frontier = [new[i] for i in order[:topk]]
    order = sorted(range(len(drafted)), key=lambda i: (-score(drafted[i]), i))
    return [drafted[i] for i in order[:keep]]


def enumerated_tokens(tree: Tree, p) -> float:
    """Expected tokens per step by enumerating every outcome of the target's walk down the tree: at each
    accepted node the target picks rank r with chance p_r, or none of the drafted ranks; the step yields
    the accepted nodes plus the bonus token."""
    children = {path: set() for path in tree.rank_paths()}
    for path in tree.rank_paths()[1:]:
        children[path[:-1]].add(path[-1])
    choices = list(range(len(p))) + [None]
    chance = {r: p[r] for r in range(len(p))} | {None: 1.0 - sum(p)}
    total = 0.0
    for outcome in itertools.product(choices, repeat=tree.depth + 1):
        prob, node, accepted = math.prod(chance[r] for r in outcome), (), 0   # the choices are independent
        for r in outcome:
            if r is None or r not in children[node]:
                break
            node, accepted = node + (r,), accepted + 1
        total += prob * (accepted + 1)
    return total


def grid(p, max_steps=3, max_topk=3):
    """Every valid (S, K, N) in small bounds."""
    for steps, topk in itertools.product(range(1, max_steps + 1), range(1, max_topk + 1)):
        sizes = [steps + 1] if topk == 1 else range(2, candidates(steps, topk) + 2)
        for n in sizes:
            yield steps, topk, n


# ------------------------------------------------------------------ the family's trees
def test_a_hand_worked_tree():
    # p = (0.6, 0.3), S = 2, K = 2: candidates (0) .6, (1) .3, (0,0) .36, (0,1) .18, (1,0) .18, (1,1) .09
    three = family_tree([0.6, 0.3], 2, 2, 4)
    assert three.tree.rank_paths()[1:] == [(0,), (1,), (0, 0)]
    assert three.expected_tokens == pytest.approx(1 + 0.6 + 0.3 + 0.36)
    assert three.n_candidates == 2 + 4
    four = family_tree([0.6, 0.3], 2, 2, 5)   # (0,1) and (1,0) tie at .18: the one drafted first
    assert four.tree.rank_paths()[1:] == [(0,), (1,), (0, 0), (0, 1)]
    assert four.expected_tokens == pytest.approx(2.44)


@pytest.mark.parametrize("name", VECTORS)
def test_family_trees_match_the_naive_rule_and_enumeration(name):
    p = VECTORS[name]
    for steps, topk, n in grid(p):
        fam = family_tree(p, steps, topk, n)
        want = naive_family(p, steps, topk, n - 1)
        assert fam.tree.rank_paths()[1:] == sorted(want, key=lambda t: (len(t), t)), (steps, topk, n)
        assert fam.tree.size == n - 1 and fam.tree.depth <= steps
        assert fam.expected_tokens == pytest.approx(enumerated_tokens(fam.tree, p), abs=1e-12)
        assert fam.expected_tokens == pytest.approx(expected_tokens(fam.tree, p), abs=1e-12)


@pytest.mark.parametrize("name", VECTORS)
def test_values_of_every_n_are_the_trees_values(name):
    p = VECTORS[name]
    for steps, topk in itertools.product(range(1, 4), range(2, 4)):
        values = family_values(p, steps, topk)
        assert len(values) == candidates(steps, topk) + 1 and values[0] == 1.0
        for n in range(2, len(values) + 1):
            assert values[n - 1] == pytest.approx(family_tree(p, steps, topk, n).expected_tokens, abs=1e-12)


@pytest.mark.parametrize("steps", [1, 2, 5, 9])
def test_topk_one_is_a_chain(steps):
    p = [0.8, 0.1]
    fam = family_tree(p, steps, 1, steps + 1)
    assert fam.tree == Tree.chain(steps)
    assert fam.expected_tokens == pytest.approx(expected_tokens(Tree.chain(steps), p))
    assert fam.expected_tokens == pytest.approx(sum(0.8 ** k for k in range(steps + 1)))


@pytest.mark.parametrize("name", VECTORS)
def test_the_dp_is_never_worse_for_the_same_tokens_and_depth(name):
    p = VECTORS[name]
    for steps, topk, n in grid(p, 4, 3):
        fam = family_tree(p, steps, topk, n)
        assert optimal_tree(p, n - 1, steps).value() >= fam.expected_tokens - 1e-12, (steps, topk, n)


def test_a_tail_bump_ranks_by_the_running_minimum():
    # p_3 > p_2: by p alone the rank-2 child (index 2) would outscore its older sibling; SGLang's top-K never does
    fam = family_tree([0.6, 0.05, 0.1], 1, 3, 3)
    assert fam.tree.rank_paths()[1:] == [(0,), (1,)]
    assert fam.expected_tokens == pytest.approx(1.65)


# ------------------------------------------------------------------ the search
@pytest.mark.parametrize("name", VECTORS)
@pytest.mark.parametrize("budget,depth,max_topk", [(1, 1, 1), (3, 2, 2), (6, 3, 3), (12, 3, 3)])
def test_the_search_finds_the_best_launch_in_its_bounds(name, budget, depth, max_topk):
    p = VECTORS[name]
    best = max(family_tree(p, s, k, n).expected_tokens for s, k, n in grid(p, depth, max_topk) if n - 1 <= budget)
    choice = best_launch(p, budget, depth, max_topk)
    args = choice.args
    assert choice.family.expected_tokens == pytest.approx(best, abs=1e-12)
    assert args.budget <= budget and args.steps <= depth and args.topk <= max_topk
    assert choice.family == family_tree(p, args.steps, args.topk, args.num_draft_tokens)
    assert choice.sequoia_tokens == pytest.approx(optimal_tree(p, args.budget, min(depth, args.budget)).value())
    assert choice.sequoia_tokens >= choice.family.expected_tokens - 1e-12
    assert expected_tokens(choice.sequoia_tree, p) == pytest.approx(choice.sequoia_tokens)


def test_a_solved_table_gives_the_same_answer():
    p = VECTORS["flat"]
    alone = best_launch(p, 12, 3)
    reused = best_launch(p, 12, 3, dp=optimal_tree(p, 20, 5))
    assert reused == alone and reused.sequoia_tree == alone.sequoia_tree
    with pytest.raises(ValueError, match="dp must be a table of the same acceptance vector"):
        best_launch(p, 12, 3, dp=optimal_tree(VECTORS["peaked"], 20, 5))
    with pytest.raises(ValueError, match="budget >= 12"):
        best_launch(p, 12, 3, dp=optimal_tree(p, 8, 5))


def test_ties_go_to_the_cheaper_launch():
    # nothing past rank 1 is ever accepted: a wider top-k adds nothing, so the chain wins
    choice = best_launch([0.5], 8, 4)
    assert (choice.args.steps, choice.args.topk, choice.args.num_draft_tokens) == (4, 1, 5)
    # a zero acceptance: one draft token is as good as any
    assert best_launch([0.0, 0.0], 8, 4).args.num_draft_tokens == 2


def test_a_large_search_stays_quick():
    import time

    start = time.process_time()
    choice = best_launch([0.7, 0.1, 0.05, 0.03, 0.02], 256, 16)
    # 2 s of CPU: over 100x the 0.013 s measured (2-vCPU Xeon with AMX), against an exhaustive search, not a speed
    assert time.process_time() - start < 2.0
    assert choice.args.budget <= 256 and choice.sequoia_tokens >= choice.family.expected_tokens - 1e-12


# ------------------------------------------------------------------ the flags
def test_flags_and_command_line():
    args = SGLangArgs("STANDALONE", 4, 3, 12)
    assert args.budget == 11
    line = args.command_line("Qwen/Qwen2.5-Coder-1.5B-Instruct", "/models/my draft")
    assert shlex.split(line) == [
        "python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2.5-Coder-1.5B-Instruct",
        "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "/models/my draft",
        "--speculative-num-steps", "4", "--speculative-eagle-topk", "3", "--speculative-num-draft-tokens", "12"]
    assert args.to_dict() == {"algorithm": "STANDALONE", "speculative_num_steps": 4, "speculative_eagle_topk": 3,
                              "speculative_num_draft_tokens": 12}


@pytest.mark.parametrize("values,match", [
    (("VLLM", 2, 2, 3), "--speculative-algorithm must be one of"),
    (("EAGLE", 0, 2, 3), "--speculative-num-steps must be >= 1"),
    (("EAGLE", 2, 0, 3), "--speculative-eagle-topk must be >= 1"),
    (("EAGLE", 2, 2, 1), "--speculative-num-draft-tokens must be >= 2"),
    (("EAGLE", 2.0, 2, 3), "--speculative-num-steps must be an integer"),
    (("EAGLE", 2, True, 3), "--speculative-eagle-topk must be an integer"),
    (("STANDALONE", 3, 1, 8), r"must be steps \+ 1 = 4 with --speculative-eagle-topk 1"),
    (("STANDALONE", 2, 2, 8), r"at most 1 \+ 6"),      # 2 + 1*4 candidates
    (("EAGLE3", 1, 4, 6), r"at most 1 \+ 4"),
])
def test_bad_flags_are_refused_naming_the_flag(values, match):
    with pytest.raises(ValueError, match=match):
        check_args(*values)
    with pytest.raises(ValueError, match=match):
        SGLangArgs(*values)


def test_the_bounds_are_exact():
    for steps, topk in itertools.product(range(1, 5), range(2, 5)):
        check_args("EAGLE", steps, topk, candidates(steps, topk) + 1)      # every candidate kept: allowed
        with pytest.raises(ValueError):
            check_args("EAGLE", steps, topk, candidates(steps, topk) + 2)
    check_args("EAGLE", 5, 1, 6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(acceptance=[0.5, 0.6], budget=4), "sum to at most 1"),
    (dict(acceptance=[0.5], budget=0), "budget must be an integer"),
    (dict(acceptance=[0.5], budget=4, depth=0), "depth must be an integer"),
    (dict(acceptance=[0.5], budget=4, max_topk=MAX_TOPK + 1), "max_topk must be an integer"),
    (dict(acceptance=[0.5], budget=4, algorithm="eagle"), "algorithm must be one of"),
])
def test_bad_search_inputs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        best_launch(**kwargs)
