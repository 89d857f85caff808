"""scripts/measure/check_context_prices.py: each step's measured times beside the profile's price at its context."""

from __future__ import annotations


import pytest
from conftest import load_script

from sequoia.core.profiles.profile import ContextCurves, HardwareProfile
from sequoia.core.statistics.trace import StepRecord
from sequoia.core.trees.tree import Tree



@pytest.fixture(scope="module")
def script():
    return load_script("check_context_prices")


def profile() -> HardwareProfile:
    """Target forwards at 10 ms a token after 128 cached tokens, 20 ms after 1,128."""
    return HardwareProfile(device="cpu", dtype="bf16", context_len=128, target_n=(1, 4), target_ms=(10.0, 40.0), draft_width=(1,), draft_ms=(1.0,),
                           contexts=(ContextCurves(context_len=1128, target_ms=(20.0, 80.0), draft_ms=(1.0,)),))


def test_steps_are_priced_at_their_own_context(script):
    first = StepRecord.fake(Tree.root_only(), (0,))
    first = first.__class__(**{**first.__dict__, "prompt_tokens": 628})       # the prompt's forward: 628 tokens
    tree = Tree((-1, 0, 1, 2))                                                   # a chain of 3 drafts
    step = StepRecord.fake(tree, (0, 1, 2, 3), step=1)                          # all accepted + bonus: 4 tokens
    rows = script.step_rows([first, step, step], profile())
    assert [r["context"] for r in rows] == [629, 633]                           # 628 + 1, then + 4
    assert rows[0]["verify_priced_ms"] == pytest.approx(40.0 + 40.0 * 501 / 1000)  # n = 4, halfway-ish to 1,128
    assert rows[0]["verify_ms"] == pytest.approx(20.0) and rows[0]["tokens"] == 4
    s = script.summary(rows)
    assert s["steps"] == 2 and s["tokens_per_step"] == 4
    cut = rows[1] | {"cut": True, "tokens": 1}                                   # the length limit's last step
    assert script.summary([rows[0], cut])["tokens_per_step"] == 4
    assert s["verify_measured_over_priced"] == pytest.approx(20.0 / rows[1]["verify_priced_ms"], rel=0.02)
    assert s["tokens_predicted_per_step"] is None                               # static trees predict nothing here
