"""The price gate (sequoia.runtime.proposers.price): pure logic on fake step records, then on the engine with a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_engine import PROMPT, _hf_greedy

from components.widgets import tree_view
from sequoia.core.config import GenerationConfig
from sequoia.core.profiles.profile import ContextCurves, HardwareProfile
from sequoia.core.statistics.trace import DynamicInfo, StepRecord
from sequoia.core.trees.tree import Tree
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import make_method
from sequoia.runtime.proposers.price import FULL, PLAIN, SMALL, PriceGate, PriceSettings

#: The target alone costs 100 ms a token at any context; verification is cheap, so drafting is predicted to pay.
FLAT = HardwareProfile.hand_made(target=lambda n: 100.0 + 2.0 * n, draft=lambda w: 10.0 + 0.5 * w)


def _prompt(n: int = 700) -> StepRecord:
    return replace(StepRecord.fake(Tree.root_only(), (0,)), prompt_tokens=n, verify_s=2.0)


def _plain(ms: float) -> StepRecord:
    return replace(StepRecord.fake(Tree.root_only(), (0,)), draft_s=0.0, verify_s=ms / 1000.0, other_s=0.0)


def _drafted(ms: float, n_new: int) -> StepRecord:
    """A step that drafted a chain of 4 and committed ``n_new`` tokens in ``ms``."""
    rec = StepRecord.fake(Tree.chain(4), tuple(range(n_new)))
    return replace(rec, draft_s=0.3 * ms / 1000.0, verify_s=0.6 * ms / 1000.0, other_s=0.1 * ms / 1000.0)


def _drive(gate: PriceGate, steps: int, draft_ms, plain_ms: float = 100.0, n_new: int = 2) -> list:
    """Run ``steps`` steps: each asks the gate, then reports what the chosen level cost.  draft_ms: level -> ms."""
    gate.observe(_prompt())
    out = []
    for _ in range(steps):
        d = gate.decide()
        out.append(d)
        gate.observe(_plain(plain_ms) if d.level == PLAIN else _drafted(draft_ms(d.level), n_new))
    return out


# --------------------------------------------------------------- settings
@pytest.mark.parametrize("field, value", [("alpha", 0.0), ("margin", 1.5), ("min_steps", 0), ("doubt", 0.5),
                                          ("small_fraction", 2.0), ("probe_after", 0)])
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        PriceSettings(**{field: value})


def test_budget_per_level():
    gate = PriceGate(FLAT)
    for level, want in ((FULL, 48), (SMALL, 12), (PLAIN, 0)):
        gate.decision = replace(gate.decision, level=level)
        assert gate.budget(48) == want


# --------------------------------------------------------------- decisions
def test_winning_trees_stay_full_and_plain_is_not_probed():
    # 2 tokens in 120 ms against 102 ms a token: 1.70x, beyond the doubt factor: no plain step is spent.
    decisions = _drive(PriceGate(FLAT), 30, lambda level: 120.0)
    assert all(d.level == FULL for d in decisions)
    assert "1.70×" in decisions[-1].reason


def test_losing_trees_back_off_to_small_then_plain():
    # 2 tokens in 250 ms against the 100 ms a plain step measures: 0.80x the target alone at every level.
    gate = PriceGate(FLAT)
    decisions = _drive(gate, 11, lambda level: 250.0)
    levels = [d.level for d in decisions if not d.probe]
    assert levels[:3] == [FULL] * 3
    assert SMALL in levels and levels[-1] == PLAIN
    assert gate.level == PLAIN
    assert "backed off to plain" in gate.reason and "0.80×" in gate.reason


def test_a_clear_loss_is_judged_on_one_step():
    # 2 tokens in 600 ms against 100 ms a plain step: 0.33x, far beyond what single steps vary (~15%).  The first
    # step's verification alone (360 ms for 2 tokens: 0.56x) already loses clearly, so it counts too.
    gate = PriceGate(FLAT)
    decisions = _drive(gate, 7, lambda level: 600.0)
    drafting = [d.level for d in decisions if d.level != PLAIN]
    assert drafting == [FULL, SMALL] and gate.level == PLAIN
    assert "0.33×" in gate.reason


def test_probes_back_off_exponentially():
    s = PriceSettings(probe_after=2, max_probe_after=16)
    gate = PriceGate(FLAT, s)
    decisions = _drive(gate, 120, lambda level: 250.0)
    # Runs of plain steps between tries of the small level grow 2, 4, 8, 16, 16, ...
    runs, n = [], 0
    for d in decisions:
        if d.level == PLAIN and not d.probe:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    assert runs[:4] == [2, 4, 8, 16]
    assert all(r == 16 for r in runs[4:])


def test_small_trees_kept_when_only_full_ones_lose():
    # Full trees lose (0.8x); small ones win (2 tokens in 150 ms: 1.33x): the gate settles on small,
    # and each failed try of full trees doubles the wait before the next.
    gate = PriceGate(FLAT, PriceSettings(probe_after=3))
    decisions = _drive(gate, 80, lambda level: 250.0 if level == FULL else 150.0)
    late = [d.level for d in decisions[40:] if not d.probe]
    assert late.count(SMALL) > 0.8 * len(late)
    assert PLAIN not in [d.level for d in decisions if not d.probe]
    assert gate.probe_after > 3


def test_measured_plain_steps_win_over_the_profile():
    # The profile says 102 ms a token; the target alone really takes 150.  Trees at 2 tokens / 250 ms are
    # 0.82x by the profile but 1.2x by measurement: after a plain step measures it, they stay.
    gate = PriceGate(FLAT)
    decisions = _drive(gate, 20, lambda level: 250.0, plain_ms=150.0)
    assert any(d.probe and d.level == PLAIN for d in decisions)
    assert gate.plain_ms() == pytest.approx(150.0, rel=0.01)
    assert gate.level == FULL and "1.20×" in gate.reason


def test_plain_estimate_follows_the_context():
    # The target alone costs 100 ms at 128 cached tokens and 150 at 1024; one plain step at ~700 tokens measured
    # 10% over the profile there: the estimate at 1024 is the profile's 150 ms, 10% over.
    prof = replace(FLAT, context_len=128, contexts=(
        ContextCurves(1024, tuple(1.5 * v for v in FLAT.target_ms), FLAT.draft_ms),))
    gate = PriceGate(prof)
    gate.observe(_prompt(703))
    prior = gate.prior_ms()
    assert prior == pytest.approx(prof.at_context(704).target(1), rel=0.02)
    gate.decide()
    gate.observe(_plain(1.1 * prior))
    gate.context = 1024
    assert gate.plain_ms() == pytest.approx(1.1 * 1.5 * FLAT.target(1), rel=1e-6)


def test_start_forgets_drafting_but_keeps_the_target_alone():
    gate = PriceGate(FLAT)
    _drive(gate, 11, lambda level: 250.0, plain_ms=110.0)
    assert gate.level == PLAIN and gate.plain.n > 0
    gate.start()
    assert gate.level == FULL and gate.means[FULL].n == 0
    assert gate.plain_ms() == pytest.approx(110.0, rel=0.01)


# --------------------------------------------------------------- on the engine
class _Ticks:
    """A clock that advances 1 s a read: every step's draft, verify and other spans take 1 s each."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.mark.parametrize("method", ["sequoia-dynamic", "sequoia-ngram", "sequoia-auto", "ngram"])
def test_gate_backs_off_losslessly_on_the_engine(tiny_pairs, tiny_target, method):
    # A random draft accepts almost nothing: a drafting step costs 3 s for ~1 token, a plain one 2 s.  Cheap
    # verification makes the cost model draft anyway; the measured price makes the gate stop.
    pair = tiny_pairs["random"]
    proposer = make_method(method, budget=8, depth=4, profile=FLAT)
    engine = SpeculativeEngine(pair, clock=_Ticks())
    records = list(engine.generate(PROMPT, proposer, GenerationConfig(max_new_tokens=40)))
    tokens = [t for r in records for t in r.new_tokens]
    assert tokens == _hf_greedy(tiny_target, PROMPT, 40)
    assert any(r.tree.size == 0 for r in records[1:])
    if method in ("sequoia-dynamic", "sequoia-ngram"):
        plain = [r for r in records if r.dynamic is not None and r.dynamic.gate == "plain"]
        assert plain and all(r.tree.size == 0 for r in plain)
        assert any("backed off" in r.dynamic.gate_note for r in plain)


def test_price_none_drafts_by_prediction_alone(tiny_pairs):
    proposer = make_method("sequoia-dynamic", budget=8, depth=4, profile=FLAT, price=None)
    engine = SpeculativeEngine(tiny_pairs["random"], clock=_Ticks())
    records = list(engine.generate(PROMPT, proposer, GenerationConfig(max_new_tokens=20)))
    assert all(r.dynamic is None or r.dynamic.gate == "" for r in records)


def test_tree_view_says_why_the_gate_backed_off():
    note = "backed off to plain: full trees made 0.80x the target alone (measured); next try in 4 steps"
    info = DynamicInfo(static_tree_parents=(-1,), added=(), pruned=(), predicted_tokens=1.0, predicted_ms=100.0,
                       widths=(), gate="plain", gate_note=note)
    rec = replace(StepRecord.fake(Tree.root_only(), (0,)), dynamic=info)
    assert note in tree_view.figure(rec).layout.title.text
    full = replace(rec, dynamic=replace(info, gate="full", gate_note="full trees: 1.50x the target alone"))
    assert "price gate" not in tree_view.figure(full).layout.title.text


def test_the_drafts_read_of_the_prompt_is_not_evidence():
    # The first drafting step also feeds the draft model the prompt (1.2 s at 779 tokens on a Xeon): left out,
    # the gate judges trees by the steps after it and keeps them.
    gate = PriceGate(FLAT)
    gate.observe(_prompt())
    costs = iter([1500.0] + [120.0] * 10)
    for _ in range(8):
        d = gate.decide()
        gate.observe(_plain(100.0) if d.level == PLAIN else _drafted(next(costs), 2))
    assert gate.level == FULL and gate.means[FULL].ms == pytest.approx(120.0)


# --------------------------------------------------------------- prices along the context
def test_context_interpolation_is_exact_for_costs_affine_in_the_context():
    # Attention reads every cached token once per new token, so a forward's cost is A(n) + B(n) * context; the
    # profile's piecewise-linear prices between (and past) measured contexts then equal it at 740 tokens.
    def cost(n, ctx):
        return 100.0 + 3.0 * n + (0.02 + 0.004 * n) * ctx

    base = HardwareProfile.hand_made(lambda n: cost(n, 128), lambda w: 20.0 + w)
    prof = replace(base, context_len=128, contexts=tuple(
        ContextCurves(c, tuple(cost(n, c) for n in base.target_n), base.draft_ms) for c in (512, 1024)))
    for ctx in (740, 1536):
        at = prof.at_context(ctx)
        assert [at.target(n) for n in (1, 16, 33)] == pytest.approx([cost(n, ctx) for n in (1, 16, 33)])
    assert prof.at_context(64).target(8) == pytest.approx(cost(8, 128))   # held below the shortest context


def test_a_level_that_drafts_nothing_does_not_hold_the_gate():
    # Backed off to small trees, the method then drafts nothing (its predicted gate skips every step): with no
    # evidence at that level, the gate still tries full trees again.
    gate = PriceGate(FLAT, PriceSettings(probe_after=2))
    gate.observe(_prompt())
    levels = []
    for _ in range(16):
        levels.append(gate.decide().level)
        gate.observe(_drafted(250.0, 2) if levels[-1] == FULL else _plain(100.0))
    first_small = levels.index(SMALL)
    assert FULL in levels[first_small:]
