"""The one cost model: its formula, the optimizer and the dynamic tree pricing alike, the conservative stand-in."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sequoia.core.profiles import cost
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.trees.dp import optimal_tree
from sequoia.core.trees.optimizer import cell_shapes, choose_tree, predict, predicted_grid
from sequoia.core.trees.tree import Tree
from sequoia.runtime.methods import make_method
from sequoia.runtime.proposers.dynamic import DynamicTreeProposer

ACC = (0.75, 0.1, 0.05, 0.03, 0.02)
#: Cheap verification, a draft at ~15% of the target, and measured overheads.
PROF = HardwareProfile.hand_made(target=lambda n: 180.0 + 2.0 * n, draft=lambda w: 30.0 + 4.0 * w,
                                 step_overhead_ms=12.0, level_overhead_ms=2.5)


class ConfidentDrafter:
    """Every node's q puts ``top`` on token 0 and spreads the rest: enough of a Drafter for propose()."""

    def __init__(self, top: float, vocab: int = 32) -> None:
        self.q = torch.full((vocab,), (1.0 - top) / (vocab - 1))
        self.q[0] = top
        self.root_token, self.root_q = 5, self.q

    def expand(self, nodes, parents, depths, tokens):
        return self.q.expand(len(nodes), -1)

    def sample(self, q, k, mode, generator):
        return torch.topk(q, k, dim=-1).indices


def test_step_ms_is_overheads_plus_forwards():
    tree = Tree((-1, 0, 0, 1, 3))                    # root, two children, a chain below the first
    widths = cost.draft_widths(tree)
    assert widths == (1, 1, 1)
    expected = 12.0 + 3 * (34.0 + 2.5) + (180.0 + 2.0 * 5)
    assert cost.step_ms(PROF, widths, tree.n_nodes) == pytest.approx(expected)
    # The target alone is one forward a token: the step overhead is measured on, and paid by, tree steps only.
    assert cost.baseline_ms(PROF) == pytest.approx(182.0)
    c = cost.step_cost(tree, 2.5, PROF)
    assert c.total_ms == pytest.approx(expected) and c.ms_per_token == pytest.approx(expected / 2.5)
    assert (c.overhead_ms, c.target_ms) == (12.0, pytest.approx(190.0))
    assert cost.step_ms(PROF, (), 1) == pytest.approx(cost.baseline_ms(PROF))


def test_static_and_dynamic_price_the_same_tree_identically():
    choice = choose_tree(ACC, PROF, max_budget=24, max_depth=8)
    assert choice.budget > 0
    dynamic = DynamicTreeProposer(profile=PROF, budget=24, max_depth=8)
    widths = cost.draft_widths(choice.tree, cost.leaf_mass(choice.tree, ACC))
    priced = dynamic.step_ms(widths, choice.tree.n_nodes)
    assert priced == pytest.approx(choice.cost.total_ms)
    assert priced / choice.expected_tokens == pytest.approx(choice.ms_per_token)
    assert predict(choice.tree, ACC, PROF).total_ms == pytest.approx(priced)
    # The vectorised grid of the optimizer agrees with the scalar model cell by cell.
    dp = optimal_tree(ACC, 12, 5)
    grid = predicted_grid(dp, PROF)
    sizes, _ = cell_shapes(dp)
    for n, d in [(0, 0), (3, 2), (7, 4), (12, 5)]:
        tree = dp.tree(n, d)
        assert tree.size == sizes[n, d]
        widths = cost.draft_widths(tree, cost.leaf_mass(tree, ACC))
        assert grid[n, d] == pytest.approx(dynamic.step_ms(widths, tree.n_nodes) / dp.value(n, d))
    # And both agree on the target alone.
    assert choice.baseline_ms == pytest.approx(cost.baseline_ms(dynamic.profile))


def test_leaf_mass_is_the_chance_the_accepted_path_ends_on_a_leaf():
    assert cost.leaf_mass(Tree.root_only(), ACC) == 0.0
    assert cost.leaf_mass(Tree.chain(1), ACC) == pytest.approx(0.75)
    assert cost.leaf_mass(Tree.chain(3), ACC) == pytest.approx(0.75 ** 3)          # only the last node is a leaf
    tree = Tree((-1, 0, 0, 1))                      # the first child has a child; the second is a leaf
    assert cost.leaf_mass(tree, ACC) == pytest.approx(0.1 + 0.75 * 0.75)
    # Brute force: walk the tree with each child accepted with p_rank (at most one per node), count leaf endings.
    rng = np.random.default_rng(0)
    tree = optimal_tree(ACC, 10, 4).tree()
    ends = 0
    for _ in range(20000):
        v = 0
        while tree.children[v]:
            u = rng.random()
            picks = np.cumsum([ACC[tree.ranks[c]] for c in tree.children[v]])
            hit = int(np.searchsorted(picks, u, side="right"))
            if hit == len(tree.children[v]):
                break
            v = tree.children[v][hit]
        ends += v != 0 and not tree.children[v]
    assert ends / 20000 == pytest.approx(cost.leaf_mass(tree, ACC), abs=0.015)


def test_the_grid_prices_each_cells_caught_up_leaf_as_the_scalar_model_does():
    from sequoia.core.trees.optimizer import cell_leaf_mass
    for acc in (ACC, (0.95,), (0.5, 0.2, 0.1, 0.05, 0.02), (0.3, 0.0)):
        dp = optimal_tree(acc, 30, 7)
        mass = cell_leaf_mass(dp)
        assert mass.shape == (31, 8)
        for n in range(31):
            for d in range(8):
                assert mass[n, d] == pytest.approx(cost.leaf_mass(dp.tree(n, d), acc), abs=1e-12)


def test_a_chain_pays_for_the_leaf_the_draft_catches_up_on():
    """A draft whose 2-token forward costs 1.65x its 1-token one (llama.cpp on a 2-vCPU CPU): a chain of one is
    priced with the accepted leaf fed at the next step, as the engine's first draft forward does."""
    prof = HardwareProfile.hand_made(target=lambda n: 77.0 + 55.6 * (n - 1), draft=lambda w: 38.2 + 25.0 * (w - 1))
    chain = predict(Tree.chain(1), (0.92,), prof)
    assert chain.draft_ms == pytest.approx(38.2 + 0.92 * 25.0)
    assert cost.draft_widths(Tree.chain(1), 0.92) == (1.92,)
    assert cost.draft_widths(Tree.chain(1)) == (1,)


def test_the_dynamic_tree_records_the_cost_models_price():
    draft = DynamicTreeProposer(profile=PROF, budget=16, max_depth=6).propose(ConfidentDrafter(0.9), None)
    info = draft.dynamic
    assert draft.tree.size > 0
    assert info.predicted_ms == pytest.approx(cost.step_ms(PROF, info.widths, draft.tree.n_nodes))


def test_overheads_move_the_choice_both_ways():
    base = HardwareProfile.hand_made(target=lambda n: 100.0 + 3.0 * n, draft=lambda w: 14.0 + w)
    plain = choose_tree(ACC, base, max_budget=24, max_depth=8)
    # A costly level makes deep trees lose; a costly step (paid by tree steps only, not by the target alone)
    # makes every tree pay less, and the tree that pays best grows to spread the fixed cost over more tokens.
    costly_level = choose_tree(ACC, dataclasses.replace(base, level_overhead_ms=40.0), max_budget=24, max_depth=8)
    costly_step = choose_tree(ACC, dataclasses.replace(base, step_overhead_ms=60.0), max_budget=24, max_depth=8)
    assert costly_level.depth < plain.depth and costly_level.speedup < plain.speedup
    assert costly_step.speedup < plain.speedup and costly_step.budget >= plain.budget


def test_conservative_profile_drafts_nothing():
    prof = cost.conservative_profile()
    assert prof.fingerprint is None and "no tree pays" in prof.note
    assert prof.target(16) == pytest.approx(16 * prof.target(1))
    assert choose_tree((0.99,), prof, max_budget=32, max_depth=16).budget == 0
    assert not DynamicTreeProposer(profile=prof, min_gain=0.0).can_pay
    # The methods fall back to it without a profile, and say why through the profile's note.
    dyn = make_method("sequoia-dynamic", acceptance=(0.99,))
    assert not dyn.can_pay and not dyn.wants_draft() and "no tree pays" in dyn.profile.note
    assert make_method("sequoia-auto", acceptance=(0.99,)).tree.size == 0


def test_predicted_grid_no_draft_cells_are_the_baseline():
    dp = optimal_tree(ACC, 8, 4)
    grid = predicted_grid(dp, PROF)
    assert np.allclose(grid[0, :], cost.baseline_ms(PROF)) and np.allclose(grid[:, 0], cost.baseline_ms(PROF))
