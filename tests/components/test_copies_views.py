"""Views of nodes copied from the context (StepRecord.sources == NGRAM): tree marker, statistics, inspector."""

from __future__ import annotations

from dataclasses import replace

import pytest

from components.dp_explorer import dp_tab
from components.live import inspector_view, stats_view
from components.widgets import tree_view
from sequoia.core.statistics.trace import DRAFT, NGRAM, ROOT, NodeCheck, StepRecord
from sequoia.core.trees.dp import optimal_tree_with_copies
from sequoia.core.trees.tree import Tree

# root -> 1 (copied), 2, 3 (draft); 1 -> 4 (copied), 5 (draft); 2 -> 6
TREE = Tree((-1, 0, 0, 0, 1, 1, 2))
SOURCES = (ROOT, NGRAM, DRAFT, DRAFT, NGRAM, DRAFT, DRAFT)


def _copied_record(accepted=(0, 1, 4), step=0):
    return replace(StepRecord.fake(TREE, accepted, step=step), sources=SOURCES)


def _trace(fig, name):
    return next((t for t in fig.data if t.name == name), None)


def test_tree_marks_copied_nodes_and_keeps_status_colours():
    rec = _copied_record()
    fig = tree_view.figure(rec)
    marker = _trace(fig, tree_view.COPIED)
    assert marker is not None and marker.name == "copied from the context"
    assert marker.marker.symbol == tree_view.COPIED_SYMBOL and list(marker.customdata) == [1, 4]
    assert marker.hoverinfo == "skip"  # the node's own hover (status, source) stays on top
    accepted = _trace(fig, "accepted")
    assert set(accepted.customdata) == {1, 4}  # still coloured by status
    hover = dict(zip(accepted.customdata, accepted.hovertext))
    assert "copied from the context" in hover[1] and "q (draft)" not in hover[1]
    rejected = _trace(fig, "rejected")
    assert "q (draft)" in dict(zip(rejected.customdata, rejected.hovertext))[2]
    assert "2 copied from the context" in fig.layout.title.text


def test_tree_hover_names_the_match_length_when_recorded():
    rec = replace(_copied_record(), match_len=(0, 3, 0, 0, 3, 0, 0))
    accepted = _trace(tree_view.figure(rec), "accepted")
    assert "copied (n-gram match of length 3)" in dict(zip(accepted.customdata, accepted.hovertext))[4]


def test_tree_without_copies_has_no_marker():
    fig = tree_view.figure(StepRecord.fake(TREE, (0, 2, 6)))
    assert _trace(fig, tree_view.COPIED) is None
    assert tree_view.copied_nodes(StepRecord.fake(TREE, (0,))) == []


def test_stats_by_source_only_with_copies():
    plain = [StepRecord.fake(TREE, (0, 2, 6), step=0), StepRecord.fake(TREE, (0,), step=1)]
    fig = stats_view.figure(plain)
    assert all(t.name not in ("draft model", "copied from the context") for t in fig.data)
    assert "copied" not in stats_view.summary_markdown(plain)
    run = [_copied_record(step=0), replace(StepRecord.fake(TREE, (0, 2, 6), step=1), sources=SOURCES)]
    series = stats_view.tokens_by_source(run)
    assert series == {"draft model": [0, 2], "copied from the context": [2, 0], "bonus": [1, 1]}
    fig = stats_view.figure(run)
    copied = [t for t in fig.data if t.name == "copied from the context"][0]
    assert list(copied.y) == [2, 0]
    cum = [t for t in fig.data if t.name == "draft model (cumulative)"][0]
    assert list(cum.y) == [0, 2]
    md = stats_view.summary_markdown(run)
    assert "2 from the draft model, 2 copied from the context" in md


def _checked_copy(accepted: bool, u):
    """Node 1 (copied) tested at the root; if rejected, draft node 2 tested next and accepted."""
    rec = _copied_record(accepted=(0, 1) if accepted else (0, 2))
    ids = (101, 102, 9)
    checks = [NodeCheck(node=1, parent=0, u=u, p_token=0.3, q_token=1.0, accepted=accepted, top_ids=ids,
                        top_texts=("a", "b", "c"), top_p=(0.3, 0.5, 0.2), top_q=(),
                        residual=() if accepted else (0.0, 0.7, 0.3))]
    if not accepted:
        checks.append(NodeCheck(node=2, parent=0, u=0.1, p_token=0.7, q_token=0.6, accepted=True, top_ids=ids,
                                top_texts=("a", "b", "c"), top_p=(0.0, 0.7, 0.3), top_q=(0.0, 0.6, 0.4)))
    return replace(rec, checks=tuple(checks))


def test_inspector_explains_a_copied_node():
    rec = _checked_copy(True, 0.2)
    text = inspector_view.explain(rec, 1)
    assert "copied from the context" in text and "min(1, p(x)/1) = p(x) = 0.300" in text and "accepted" in text
    assert inspector_view.child_name(rec, 1) == "child 1 (copied)"
    fig = inspector_view.figure(rec, 1)
    assert any(t.x and "min(1, p/1)" in t.x for t in fig.data if t.type == "bar")
    greedy = inspector_view.explain(_checked_copy(True, None), 1)
    assert "temperature 0" in greedy and "most likely" in greedy


def test_inspector_draft_sibling_after_a_rejected_copy():
    rec = _checked_copy(False, 0.9)
    text = inspector_view.explain(rec, 2)
    assert "copied: a fixed proposal" in text and "without the copied tokens" in text
    assert "without the copied tokens" in inspector_view.explain(rec, 1)


def test_dp_shape_figure_marks_the_copied_chain():
    p, c = (0.6, 0.2, 0.1), (0.7, 0.9, 0.8)
    r = optimal_tree_with_copies(p, c, 10, 5)
    assert r.n_copied > 0
    fig = tree_view.shape_figure(r.tree, p, sources=r.sources, copies=c)
    marker = _trace(fig, tree_view.COPIED)
    assert marker.marker.symbol == tree_view.COPIED_SYMBOL and len(marker.customdata) == r.n_copied
    # labels are P(path accepted): they sum to E - 1, as the DP counts them
    nodes = [t for t in fig.data if t.mode == "markers+text"]
    reach = sum(float(lbl) for t in nodes for lbl in t.text if lbl)
    assert reach == pytest.approx(r.value - 1.0, abs=0.01 * r.tree.size)


def test_dp_tab_copied_chain_control(lanes):
    assert dp_tab.parse_copies("") == () and dp_tab.parse_copies("0.9, 0.5") == (0.9, 0.5)
    with pytest.raises(ValueError):
        dp_tab.parse_copies("1.5")
    fig, md = dp_tab.copies_views(lanes, "0.6, 0.2", "", 8, 3)
    assert fig is None and "Enter c_1" in md
    fig, md = dp_tab.copies_views(lanes, "0.6, 0.2", "1, 1, 1", 8, 3)
    assert _trace(fig, tree_view.COPIED) is not None and "best m = **3**" in md
    assert "| copied nodes m | expected tokens/step |" in md and "| **3** | **4.000** |" in md  # E = 1 + 3 sure copies
