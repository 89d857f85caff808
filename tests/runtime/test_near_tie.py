"""Sequoia (auto) where its best tree is priced at a near tie with the target alone: measured, not assumed.

The optimizer keeps the target alone, but the cost model's errors on a CPU reach the gap either way (a chain the
profile priced below the target alone measured 1.08-1.12x it on a 2-core Xeon), so the method starts plain and
tries the tree under the price gate.  Clocks are made of forward counts (never timed), so who wins is by
construction.
"""

from __future__ import annotations

import pytest
from test_engine import PROMPT, _hf_greedy

from sequoia.core.config import GenerationConfig
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.trees.optimizer import choose_tree
from sequoia.runtime.drafter import StaticTreeProposer
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import DEFAULT_ACCEPTANCE, NEAR_TIE, PricedTreeProposer, make_method, near_tie
from sequoia.runtime.proposers.price import PLAIN

#: Verifying two tokens costs 1.6 plain steps and a draft forward a fifth of one: a chain of one is priced at
#: 0.92x the target alone under the default vector, the best tree there is.
TIE = HardwareProfile.hand_made(target=lambda n: 100.0 + 60.0 * (n - 1), draft=lambda w: 20.0 + 20.0 * (w - 1))
#: Verifying n tokens costs n plain steps: nothing comes near.
LINEAR = HardwareProfile.hand_made(target=lambda n: 100.0 * n, draft=lambda w: 20.0)


class _Clock:
    """Seconds made of forward counts: ``target`` s a target forward, ``draft`` s a draft forward."""

    def __init__(self, pair, target: float, draft: float) -> None:
        self.pair, self.target, self.draft = pair, target, draft

    def __call__(self) -> float:
        return self.target * self.pair.target.forward_calls + self.draft * self.pair.draft.forward_calls


def test_near_tie_names_the_best_drafting_cell_within_the_band():
    choice = choose_tree(DEFAULT_ACCEPTANCE, TIE, max_budget=8, max_depth=4)
    assert choice.budget == 0
    (n, d), speedup = near_tie(choice)
    assert (n, d) == (1, 1) and NEAR_TIE <= speedup < 1.0
    assert near_tie(choose_tree(DEFAULT_ACCEPTANCE, LINEAR, max_budget=8, max_depth=4)) is None


def test_auto_starts_plain_at_a_near_tie_and_not_without_a_measured_profile():
    proposer = make_method("sequoia-auto", budget=8, depth=4, profile=TIE)
    assert isinstance(proposer, PricedTreeProposer) and proposer.tree.size == 1
    assert proposer.gate.first_level == PLAIN and "near tie" in proposer.gate.reason
    assert not proposer.wants_draft()
    # Without a profile (the stand-in), or without the price gate, nothing is tried: the target alone.
    for kwargs in ({"profile": None}, {"profile": TIE, "price": None}, {"profile": LINEAR}):
        plain = make_method("sequoia-auto", budget=8, depth=4, **kwargs)
        assert type(plain) is StaticTreeProposer and plain.tree.size == 0


def _run(pair, proposer, n, clock):
    records = list(SpeculativeEngine(pair, clock=clock).generate(PROMPT, proposer, GenerationConfig(max_new_tokens=n)))
    return [t for r in records for t in r.new_tokens], records[1:]


def test_a_near_tie_that_measures_faster_drafts_and_stays_lossless(tiny_pairs, tiny_target):
    pair = tiny_pairs["same"]                                  # every draft token accepted
    tokens, steps = _run(pair, make_method("sequoia-auto", budget=8, depth=4, profile=TIE), 40,
                         _Clock(pair, target=1.0, draft=0.1))
    assert tokens == _hf_greedy(tiny_target, PROMPT, 40)
    assert all(r.tree.size == 0 for r in steps[:4])            # the target alone first
    assert sum(r.tree.size > 0 for r in steps) >= 0.6 * len(steps)


@pytest.mark.parametrize("kind", ["noisy", "random"])
def test_a_near_tie_that_measures_slower_goes_back_to_the_target_alone(tiny_pairs, tiny_target, kind):
    pair = tiny_pairs[kind]
    tokens, steps = _run(pair, make_method("sequoia-auto", budget=8, depth=4, profile=TIE), 60,
                         _Clock(pair, target=1.0, draft=3.0))
    assert tokens == _hf_greedy(tiny_target, PROMPT, 60)
    drafting = sum(r.tree.size > 0 for r in steps)
    assert drafting <= 8, f"{drafting} drafting steps of {len(steps)}"
