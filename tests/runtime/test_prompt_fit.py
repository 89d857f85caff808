"""The dynamic tree's prompt fit (sequoia.runtime.proposers.prompt_fit): acceptance estimates follow what verification saw."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_dynamic import CHEAP, CPU_LIKE, FakeDrafter  # noqa: F401

from sequoia.core.statistics.trace import StepRecord
from sequoia.core.trees.tree import Tree
from sequoia.runtime.proposers.dynamic import DynamicTreeProposer
from sequoia.runtime.proposers.prompt_fit import MIN_SCALE, PRIOR, PromptFit

#: Root with two children (1, 2); node 1 has one child (3).
TREE = Tree((-1, 0, 0, 1))


def test_observed_over_expected_with_a_prior():
    fit = PromptFit()
    assert fit.scale == 1.0
    fit.observe(StepRecord.fake(TREE, (0,)), {1: 0.6, 2: 0.3, 3: 0.5})   # root reached, both children rejected
    # node 3's parent was never reached: it says nothing about the calibration
    assert fit.expected == pytest.approx(0.9) and fit.observed == 0.0
    assert fit.scale == pytest.approx(PRIOR / (PRIOR + 0.9))
    fit.observe(StepRecord.fake(TREE, (0, 1, 3)), {1: 0.6, 2: 0.3, 3: 0.5})  # 1 and 3 accepted, 2 was reached too
    assert fit.observed == pytest.approx(2.0)
    assert fit.expected == pytest.approx(0.95 * 0.9 + 1.4)


def test_the_scale_stays_between_its_floor_and_one():
    fit = PromptFit()
    for _ in range(200):
        fit.observe(StepRecord.fake(TREE, (0,)), {1: 0.9, 2: 0.05})
    assert fit.scale == MIN_SCALE
    fit.start()
    for _ in range(50):
        fit.observe(StepRecord.fake(TREE, (0, 1, 3)), {1: 0.2, 3: 0.2})  # far better than predicted
    assert fit.scale == 1.0


def test_a_prediction_for_a_node_the_tree_lacks_is_refused():
    with pytest.raises(ValueError, match="node 7 of a 4-node tree"):
        PromptFit().observe(StepRecord.fake(TREE, (0,)), {7: 0.5})


def _rejected_steps(proposer: DynamicTreeProposer, steps: int) -> None:
    """Steps whose drafts were all rejected at the root, fed back as the engine would."""
    proposer.start()
    for _ in range(steps):
        draft = proposer.propose(FakeDrafter(0.8), None)
        record = replace(StepRecord.fake(draft.tree, (0,)), dynamic=draft.dynamic)
        proposer.observe(record)


def test_a_prompt_harder_than_the_calibration_gets_smaller_trees():
    fitted, fixed = DynamicTreeProposer(profile=CPU_LIKE), DynamicTreeProposer(profile=CPU_LIKE, fit=False)
    first = fitted.propose(FakeDrafter(0.8), None)
    _rejected_steps(fitted, 12)
    _rejected_steps(fixed, 12)
    assert fitted.scale < 0.5 and fixed.scale == 1.0
    after, unchanged = fitted.propose(FakeDrafter(0.8), None), fixed.propose(FakeDrafter(0.8), None)
    assert unchanged.tree == first.tree
    assert after.tree.size < first.tree.size
    assert after.dynamic.predicted_tokens < unchanged.dynamic.predicted_tokens
    fitted.start()                                    # a new generation trusts the calibration again
    assert fitted.scale == 1.0


def test_a_calibration_too_sure_for_the_pair_at_hand_is_scaled_down(tiny_pairs):
    """Calibrated on a draft equal to its target, then decoding with an unrelated draft: the fit shrinks the
    trees and brings the predicted tokens per step toward the realized ones; the output is unchanged (T=0)."""
    from test_engine import PROMPT, _run

    from sequoia.core.config import GenerationConfig, SamplingConfig
    from sequoia.runtime.measuring.calibration import calibrate
    from sequoia.runtime.checks.teacher import target_continuation

    same = tiny_pairs["same"]
    seqs = [(PROMPT, target_continuation(same.target, PROMPT, SamplingConfig(), 16, None))]
    cal, = calibrate(same, seqs, [SamplingConfig()], width=3)
    runs = {}
    for fit in (True, False):
        proposer = DynamicTreeProposer(profile=CHEAP, calibration=cal, fit=fit, gate=False)
        tokens, records = _run(tiny_pairs["random"], proposer, GenerationConfig(max_new_tokens=40))
        steps = [r for r in records[1:-1] if r.dynamic is not None]
        runs[fit] = (tokens, sum(r.tree.size for r in steps) / len(steps),
                     sum(r.dynamic.predicted_tokens for r in steps) / sum(r.n_new for r in steps))
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] < runs[False][1]                # smaller trees
    assert 1.0 <= runs[True][2] < runs[False][2]         # predicted over realized: nearer 1
