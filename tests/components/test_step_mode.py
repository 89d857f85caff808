"""Step mode (components.live.step_mode): one target call's phases, drawn from a hand-built record, no Gradio."""

from __future__ import annotations

from dataclasses import replace

import plotly.graph_objects as go

from components.live import step_mode
from sequoia.core.statistics.trace import NodeCheck, StepRecord
from sequoia.core.trees.tree import Tree

# root -> 1, 2 ; 1 -> 3 ; 2 -> 4: two levels
TREE = Tree((-1, 0, 0, 1, 2))
AXIS = (101, 102, 9)   # the checks' token axis: node 1's token, node 2's, another


def _record(temperature: bool = True) -> StepRecord:
    """Node 1 tested and rejected, node 2 then accepted, node 4 (its child) rejected; the bonus after node 2."""
    base = StepRecord.fake(TREE, (0, 2), step=3, bonus=9)
    checks = (
        NodeCheck(1, 0, 0.9 if temperature else None, 0.2, 0.5, False, AXIS, (), (0.2, 0.5, 0.3), (0.5, 0.4, 0.1),
                  residual=(0.0, 0.25, 0.75) if temperature else ()),
        NodeCheck(2, 0, 0.1 if temperature else None, 0.4, 0.8, True, AXIS, (), (0.0, 0.25, 0.75), (0.0, 0.8, 0.2)),
        NodeCheck(4, 2, 0.7 if temperature else None, 0.1, 0.6, False, (104, 9), (), (0.1, 0.9), (0.6, 0.4),
                  residual=(0.0, 1.0) if temperature else ()),
        NodeCheck(5, 2, None, 0.9, 0.0, True, (9,), (), (1.0,), ()),   # the bonus (node == n_nodes)
    )
    status = ("accepted", "rejected", "accepted", "unreached", "rejected")
    return replace(base, checks=checks, status=status)


def _node_groups(fig: go.Figure) -> dict[int, str]:
    return {int(i): t.name for t in fig.data if t.mode and "markers" in t.mode and t.name != step_mode._CURRENT
            for i in t.customdata}


def test_the_phases_follow_the_step_draft_levels_verify_tests_residuals_bonus():
    kinds = [(p.kind, p.level or (p.check.node if p.check else None)) for p in step_mode.phases(_record())]
    assert kinds == [("draft", 1), ("draft", 2), ("verify", None), ("test", 1), ("residual", 1), ("test", 2),
                     ("test", 4), ("residual", 4), ("bonus", None)]


def test_greedy_steps_have_no_residual_and_a_plain_step_only_verify_and_bonus():
    kinds = [p.kind for p in step_mode.phases(_record(temperature=False))]
    assert kinds == ["draft", "draft", "verify", "test", "test", "test", "bonus"]
    plain = StepRecord.fake(Tree((-1,)), (0,))
    assert [p.kind for p in step_mode.phases(plain)] == ["verify", "bonus"]
    unchecked = StepRecord.fake(TREE, (0, 2))   # recorded without the inspector: the walk at once
    assert [p.kind for p in step_mode.phases(unchecked)] == ["draft", "draft", "verify", "walk", "bonus"]


def test_the_tree_grows_level_by_level_then_its_tests_colour_it():
    rec = _record()
    ph = step_mode.phases(rec)
    assert sorted(_node_groups(step_mode.figure(rec, ph[0]))) == [0, 1, 2]          # level 1 only
    assert set(_node_groups(step_mode.figure(rec, ph[1])).values()) == {"root", step_mode.DRAFTED}
    assert set(_node_groups(step_mode.figure(rec, ph[2])).values()) == {"root", step_mode.SENT}
    after_two = _node_groups(step_mode.figure(rec, ph[5]))                            # node 2's test
    assert after_two == {0: "root", 1: "rejected", 2: "accepted", 3: step_mode.WAITING, 4: step_mode.WAITING}
    ring = next(t for t in step_mode.figure(rec, ph[5]).data if t.name == step_mode._CURRENT)
    assert list(ring.customdata) == [2]
    assert step_mode.figure(rec, ph[3]).layout.title.text.endswith("u = 0.900 vs min(1, p/q) = 0.400: rejected")
    residual = step_mode.figure(rec, ph[4])                                           # the inspector's bars
    assert any(t.name == "residual after rejection" for t in residual.data)


def test_the_words_give_the_test_in_numbers_and_what_the_call_commits():
    rec = _record()
    words = [step_mode.markdown(rec, i) for i in range(len(step_mode.phases(rec)))]
    assert words[0].startswith("**Target call 3 · phase 1 of 9: the draft grows the tree**")
    assert "in **one** forward" in words[2] and "5 tokens" in words[2]
    assert "u = 0.900 against min(1, p/q) = min(1, 0.200 / 0.500) = 0.400" in words[3] and "**rejected**" in words[3]
    assert "norm(max(p − q, 0))" in words[4] and "node 2, the next sibling, is tested against it" in words[4]
    assert "u = 0.100 against min(1, p/q) = min(1, 0.400 / 0.800) = 0.500" in words[5] and "**accepted**" in words[5]
    assert "the bonus token is drawn from it" in words[7]
    assert "This call commits 2 tokens: 1 accepted draft and the target's own token." in words[8]
    greedy = _record(temperature=False)
    assert "most likely token" in step_mode.markdown(greedy, 3)


def test_step_moves_through_the_phases_then_to_the_next_call_and_stops_at_the_end():
    assert step_mode.advance(0, 0, 3, 2) == (0, 1)
    assert step_mode.advance(0, 2, 3, 2) == (1, 0)
    assert step_mode.advance(1, 2, 3, 2) == (1, 2)


def test_every_printed_test_reproduces_by_hand_to_its_digits():
    """Issue 51: "min(1, 0.000 / 0.007) = 0.041" cannot be redone by hand; p and q get the digits it takes."""
    import itertools
    import random

    from components.live.inspector_view import rule_numbers

    rng = random.Random(0)
    cases = [(0.000287, 0.007, 0.5), (0.3, 0.3, 0.9999), (0.04101, 1.0, 0.04102)]
    cases += [(rng.random() ** 4, rng.random() ** 2, rng.random()) for _ in range(2000)]
    for p, q, u in itertools.chain(cases):
        ps, qs, chance, us = rule_numbers(p, q, u)
        by_hand = min(1.0, float(ps) / float(qs))
        decimals = len(chance.split(".")[1]) if "." in chance else 0
        assert f"{by_hand:.{decimals}f}" == chance, (p, q, ps, qs, chance)
        assert (float(us) < float(chance)) == (u < min(1.0, p / q)) and us != chance, (p, q, u, us, chance)
    words = step_mode.markdown(replace(_record(), checks=(replace(_record().checks[0], p_token=0.000287,
                                                                  q_token=0.007, u=0.5),)), 3)
    assert "min(1, 0.000287 / 0.00700) = 0.0410" in words


def test_next_rejection_jumps_to_the_next_rejected_test_and_wraps():
    rec = _record()
    kinds = [(ph.kind, ph.check.accepted if ph.check else None) for ph in step_mode.phases(rec)]
    first = kinds.index(("test", False))
    assert step_mode.next_rejection([rec, rec], 0, 0) == (0, first)
    later = [k for k, v in enumerate(kinds) if v == ("test", False)][1]
    assert step_mode.next_rejection([rec, rec], 0, first) == (0, later)
    assert step_mode.next_rejection([rec, rec], 1, later) == (0, first)            # wraps to the run's start
    passed = replace(rec, checks=tuple(replace(c, accepted=True) for c in rec.checks))
    assert step_mode.next_rejection([passed], 0, 0) is None
