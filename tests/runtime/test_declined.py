"""Where no tree pays, the automatic methods are the target alone: no draft forward, the same text as ``ar``.

Forwards are counted, never timed (a busy shared machine makes any time bound flaky); the clocks here are
made of the counts, so the price gate sees drafting lose by construction.
"""

from __future__ import annotations

import pytest
from test_engine import PROMPT, _hf_greedy

from sequoia.core.config import GenerationConfig
from sequoia.core.ngrams.ngram import NgramIndex
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import make_method
from sequoia.runtime.proposers.ngram_proposer import copies_can_pay

AUTOMATIC = ("sequoia-dynamic", "sequoia-ngram", "sequoia-auto")
#: Verifying n tokens costs n plain steps (a compute-bound CPU): no tree pays, whatever the draft.
LINEAR = HardwareProfile.hand_made(target=lambda n: 100.0 * n, draft=lambda w: 20.0)
#: Verification nearly free: every method's cost model drafts, and only measurement can stop it.
FLAT = HardwareProfile.hand_made(target=lambda n: 100.0 + 2.0 * n, draft=lambda w: 10.0 + 0.5 * w)


class _CountingClock:
    """Seconds made of forward counts: a target forward costs 1 s, a draft forward 3 s (drafting loses)."""

    def __init__(self, pair) -> None:
        self.pair = pair

    def __call__(self) -> float:
        return 1.0 * self.pair.target.forward_calls + 3.0 * self.pair.draft.forward_calls


def _generate(pair, proposer, n: int, clock=None):
    """(tokens, records, draft forwards made during each record's step)."""
    engine = SpeculativeEngine(pair) if clock is None else SpeculativeEngine(pair, clock=clock)
    records, forwards = [], []
    before = pair.draft.forward_calls
    for rec in engine.generate(PROMPT, proposer, GenerationConfig(max_new_tokens=n)):
        records.append(rec)
        forwards.append(pair.draft.forward_calls - before)
        before = pair.draft.forward_calls
    return [t for r in records for t in r.new_tokens], records, forwards


@pytest.mark.parametrize("method", AUTOMATIC)
def test_where_no_tree_pays_no_step_runs_the_draft(tiny_pairs, tiny_target, method):
    pair = tiny_pairs["noisy"]
    proposer = make_method(method, budget=8, depth=4, profile=LINEAR)
    tokens, records, forwards = _generate(pair, proposer, 24)
    alone, _, _ = _generate(pair, make_method("ar"), 24)
    assert tokens == alone == _hf_greedy(tiny_target, PROMPT, 24)
    assert all(r.tree.size == 0 for r in records) and sum(forwards) == 0


@pytest.mark.parametrize("method", AUTOMATIC)
def test_once_the_price_gate_declines_its_plain_steps_run_no_draft(tiny_pairs, tiny_target, method):
    # A random draft accepts almost nothing and its forwards cost 3 plain steps: each drafting step loses
    # clearly, so the gate backs off after one measured step per level and then probes rarely.
    pair = tiny_pairs["random"]
    proposer = make_method(method, budget=8, depth=4, profile=FLAT)
    tokens, records, forwards = _generate(pair, proposer, 60, clock=_CountingClock(pair))
    alone, _, _ = _generate(pair, make_method("ar"), 60)
    assert tokens == alone == _hf_greedy(tiny_target, PROMPT, 60)
    priced_plain = [f for r, f in zip(records, forwards) if r.dynamic is not None and r.dynamic.gate == "plain"]
    assert all(f == 0 for f in priced_plain)
    drafting = sum(1 for f in forwards if f)
    # Full: the draft's read of the prompt and one judged step; small: one; then tries of small after 4, 8 and 16
    # plain steps (a lagging step and a judged one each): 9.  Judged on three steps a level, sequoia-auto
    # drafted in 19 steps of 60 and the dynamic methods in 11.
    assert drafting <= 10, f"{drafting} drafting steps of {len(records)}"


@pytest.mark.parametrize("method", ["ngram", "sequoia-ngram"])
def test_where_no_copy_can_pay_nothing_is_looked_up(tiny_pairs, monkeypatch, method):
    looked = []
    lookup = NgramIndex.lookup
    monkeypatch.setattr(NgramIndex, "lookup", lambda self, *a, **k: looked.append(1) or lookup(self, *a, **k))
    proposer = make_method(method, budget=8, depth=4, profile=LINEAR)
    _, records, forwards = _generate(tiny_pairs["noisy"], proposer, 16)
    assert not looked and sum(forwards) == 0 and all(r.tree.size == 0 for r in records)
    assert copies_can_pay(FLAT, 8) and not copies_can_pay(LINEAR, 8)
