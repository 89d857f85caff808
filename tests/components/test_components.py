"""Figure structure of the UI views on hand-made records (no Gradio, no model)."""

from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
import pytest

from components import COLORS, method_label
from components.app_state.context import LoadStatus
from components.compare import compare_view
from components.live import inspector_view, stats_view, text_view
from components.widgets import dp_view, hardware_view, status_view, tree_view
from sequoia.core.profiles import profile as hw
from sequoia.core.statistics.stats import summarize
from sequoia.core.statistics.trace import ACCEPTED, REJECTED, UNREACHED, DynamicInfo, NodeCheck, StepRecord
from sequoia.core.trees import dp, optimizer
from sequoia.core.trees.tree import Tree

# root -> 1, 2, 3 ; 1 -> 4, 5 ; 2 -> 6 ; 4 -> 7
TREE = Tree((-1, 0, 0, 0, 1, 1, 2, 4))


def _trace(fig: go.Figure, name: str):
    found = [t for t in fig.data if t.name == name]
    assert len(found) == 1, f"expected one trace named {name!r}, got {[t.name for t in fig.data]}"
    return found[0]


def _nodes(fig: go.Figure) -> dict[int, str]:
    """node index -> trace (status) name, over the node traces."""
    out = {}
    for t in fig.data:
        if t.mode and "markers" in t.mode and t.name != "added vs static":
            for i in t.customdata:
                assert i not in out, f"node {i} drawn twice"
                out[int(i)] = t.name
    return out


# ------------------------------------------------------------------ tree view
def test_escape_token_makes_whitespace_visible_and_html_safe():
    assert tree_view.escape_token(" def") == "\u2423def"
    assert tree_view.escape_token("\n\t") == "\u21b5\u21e5"
    assert tree_view.escape_token("") == "\u2205"
    assert tree_view.escape_token("<b>") == "&lt;b&gt;"
    assert tree_view.escape_token("x" * 40, max_len=10).endswith("\u2026")


def test_tree_positions_layered_and_parents_centered():
    pos = tree_view.tree_positions(TREE.parents)
    assert [pos[i][1] for i in range(TREE.n_nodes)] == [-d for d in TREE.depths]
    # leaves in DFS order: 7, 5, 6, 3 get x = 0, 1, 2, 3
    assert [pos[i][0] for i in (7, 5, 6, 3)] == [0, 1, 2, 3]
    assert pos[1][0] == (pos[4][0] + pos[5][0]) / 2
    assert pos[0][0] == (pos[1][0] + pos[3][0]) / 2
    # siblings in sampling order, left to right
    assert pos[1][0] < pos[2][0] < pos[3][0]


def test_tree_figure_nodes_statuses_and_bonus():
    rec = StepRecord.fake(TREE, (0, 1, 5))
    fig = tree_view.figure(rec)
    nodes = _nodes(fig)
    assert len(nodes) == TREE.n_nodes + 1  # every node plus the bonus
    assert nodes[0] == "root" and nodes[TREE.n_nodes] == "bonus"
    for i in range(1, TREE.n_nodes):
        assert nodes[i] == rec.status[i]
    assert {i for i, s in nodes.items() if s == ACCEPTED} == {1, 5}
    assert {i for i, s in nodes.items() if s == REJECTED} == {2, 3, 4}
    assert {i for i, s in nodes.items() if s == UNREACHED} == {6, 7}


def test_tree_figure_colours_distinct_per_status():
    fig = tree_view.figure(StepRecord.fake(TREE, (0, 2, 6)))
    for status in ("root", ACCEPTED, REJECTED, UNREACHED, "bonus"):
        assert _trace(fig, status).marker.color == COLORS[status]
    assert len({COLORS[s] for s in ("root", ACCEPTED, REJECTED, UNREACHED, "bonus")}) == 5


def test_tree_figure_highlights_accepted_path_to_bonus():
    rec = StepRecord.fake(TREE, (0, 1, 4, 7))
    fig = tree_view.figure(rec)
    pos = tree_view.tree_positions(list(TREE.parents) + [7])
    hi = _trace(fig, "accepted path")
    segments = [(hi.x[k], hi.y[k], hi.x[k + 1], hi.y[k + 1]) for k in range(0, len(hi.x), 3)]
    path = [0, 1, 4, 7, TREE.n_nodes]
    expected = [(*pos[a], *pos[b]) for a, b in zip(path[:-1], path[1:])]
    assert segments == expected
    plain = _trace(fig, "edges")
    assert len(plain.x) == 3 * (TREE.size - 3)  # the other edges, 3 points each


def test_tree_figure_labels_and_hover():
    rec = StepRecord.fake(TREE, (0,))
    rec = replace(rec, texts=("\n",) + rec.texts[1:], bonus_text=" if")
    fig = tree_view.figure(rec)
    root = _trace(fig, "root")
    assert root.text == ("\u21b5",)
    assert _trace(fig, "bonus").text == ("\u2423if",)
    hover = _trace(fig, REJECTED).hovertext[0]
    assert "q (draft) = 0.5000" in hover and "p (target) = 0.4000" in hover
    assert "depth 1" in hover and "child 1 of its parent (p_1)" in hover and "rank" not in hover
    assert "0 accepted, +1 bonus" in fig.layout.title.text


def test_tree_figure_root_only_tree():
    rec = StepRecord.fake(Tree.root_only(), (0,))
    nodes = _nodes(tree_view.figure(rec))
    assert nodes == {0: "root", 1: tree_view.TARGET_TOKEN}  # nothing drafted: the target's token, not a bonus
    assert "1 token from the target" in tree_view.figure(rec).layout.title.text
    prompt = replace(rec, prompt_tokens=42)       # step 0: the prompt's forward
    assert "the prompt's forward (42 tokens)" in tree_view.figure(prompt).layout.title.text
    one_token = stats_view.summary_markdown([prompt])   # a one-token run: no decode rate to show
    assert "the prompt's forward: 0.03 s" in one_token
    assert "no decode rate yet" in one_token and "after the prompt" not in one_token


def test_tree_figure_hides_labels_on_big_trees():
    big = Tree.k_ary(3, 4)  # 120 nodes
    fig = tree_view.figure(StepRecord.fake(big, (0, 1)))
    assert all(t.mode == "markers" for t in fig.data if t.name in ("root", ACCEPTED, REJECTED, UNREACHED))


def test_tree_figure_overlay_added_pruned():
    info = DynamicInfo(static_tree_parents=(-1,), added=(3, 6), pruned=(4, 5), predicted_tokens=1.0,
                       predicted_ms=1.0, widths=(1,))
    rec = replace(StepRecord.fake(TREE, (0, 1)), dynamic=info)
    fig = tree_view.figure(rec)
    assert list(_trace(fig, "added vs static").customdata) == [3, 6]
    assert "+2 added" in fig.layout.title.text and "2 pruned" in fig.layout.title.text
    fig = tree_view.figure(rec, overlay=False)
    assert "added vs static" not in [t.name for t in fig.data]


def test_shape_figure_reach_probabilities():
    acc = [0.5, 0.25]
    fig = tree_view.shape_figure(Tree((-1, 0, 0, 1)), acc)
    labels = {int(i): lab for t in fig.data if t.customdata is not None for i, lab in zip(t.customdata, t.text)}
    assert labels[1] == "0.50" and labels[2] == "0.25" and labels[3] == "0.25"


# ------------------------------------------------------------------ stats view
def _run():
    return [
        StepRecord.fake(TREE, (0, 1, 5), step=0),
        StepRecord.fake(TREE, (0,), step=1),
        StepRecord.fake(Tree.chain(3), (0, 1, 2, 3), step=2),
    ]


def test_stats_figure_panels():
    fig = stats_view.figure(_run())
    hist = fig.data[0]
    assert list(hist.x) == [1, 2, 3, 4] and list(hist.y) == [1, 0, 1, 1]
    assert list(fig.data[1].y) == [3, 1, 4]
    by_rank = [t for t in fig.data if t.name == "by rank"][0]
    # rank 0: 6 accepted-path parents (root twice, node 1, the chain's 3 nodes), 4 accepted
    assert by_rank.y[0] == pytest.approx(4 / 6)
    split = {t.name: list(t.y) for t in fig.data if t.name in ("draft", "verify", "other")}
    assert split["draft"] == pytest.approx([10.0] * 3) and split["verify"] == pytest.approx([20.0] * 3)
    assert fig.layout.xaxis2.dtick == 1 and fig.layout.xaxis6.dtick == 1  # short run: whole steps only


def test_stats_mean_sits_in_the_title_and_a_target_alone_run_says_why_acceptance_is_empty():
    """Issue 37: the "mean" label overlapped its line; empty acceptance plots of a target-alone run had no note."""
    fig = stats_view.figure(_run())
    texts = [a.text for a in fig.layout.annotations]
    assert not any(t.startswith("mean") for t in texts) and any("mean 2.67 (dotted)" in t for t in texts)
    # one line at the title's size (issue 58: a <sup> second line was 14 px in the projector view)
    assert not any("<sup>" in t or "<br>" in t for t in texts if "mean" in t)
    assert stats_view.NOTHING_DRAFTED not in texts
    alone = [replace(StepRecord.fake(Tree((-1,)), (0,), step=i), method="ar") for i in range(4)]
    notes = [a for a in stats_view.figure(alone).layout.annotations if a.text == stats_view.NOTHING_DRAFTED]
    # one in each acceptance panel: by depth (top right), by rank (bottom left)
    assert len(notes) == 2 and notes[0].x > 0.6 and notes[0].y > 0.5 and notes[1].x < 0.4 and notes[1].y < 0.5


def test_stats_empty_and_summary():
    fig = stats_view.figure([])
    assert len(fig.data) == 0 and fig.layout.annotations[-1].text == "no steps yet"
    md = stats_view.summary_markdown(_run())
    assert "**8 tokens** in **3 target calls**" in md and "2.67" in md
    assert stats_view.summary_markdown([]) == "*No steps yet.*"


# ------------------------------------------------------------------ text view
def test_text_view_marks_and_escapes():
    rec = StepRecord.fake(TREE, (0, 1, 5))
    rec = replace(rec, texts=rec.texts[:1] + ("<a>",) + rec.texts[2:], bonus_text="&\n")
    out = text_view.html_view([rec], prompt="say <hi>", selected_step=0)
    assert "&lt;a&gt;" in out and "<a>" not in out
    assert "say &lt;hi&gt;" in out and "&amp;\n" in out
    assert out.count('title="draft token accepted by the target"') == 2
    assert out.count('title="bonus token sampled from the target"') == 1
    assert "draft token accepted</span>" in out  # legend
    assert "outline:2px" in out


def test_text_view_respects_trimmed_steps():
    rec = replace(StepRecord.fake(TREE, (0, 1, 5)), new_tokens=(101,))
    assert text_view.step_segments(rec) == [("accepted", "t1")]
    assert text_view.plain_text(_run()) == "t1t5b7b7t1t2t3b7"


# ------------------------------------------------------------------ DP view
def test_dp_heatmap_and_selection():
    table = np.arange(12, dtype=float).reshape(4, 3)
    fig = dp_view.heatmap(table, selected=(2, 1))
    assert fig.data[0].type == "heatmap" and np.asarray(fig.data[0].z).shape == (4, 3)
    rect = fig.layout.shapes[0]
    assert (rect.x0, rect.x1, rect.y0, rect.y1) == (0.5, 1.5, 1.5, 2.5)
    assert "7.000" in fig.layout.title.text
    with pytest.raises(ValueError):
        dp_view.heatmap(np.zeros(3))


def test_dp_tree_figure_and_curves():
    fig = dp_view.tree_figure(Tree.chain(3), [0.8, 0.1], value=2.952)
    assert len(_nodes(fig)) == 4 and "2.952" in fig.layout.title.text
    fig = dp_view.curves([1, 2, 4], {"sequoia": [1.8, 2.4, 3.0], "chain": [1.8, 2.4, 2.9]})
    assert [t.name for t in fig.data] == ["Sequoia (DP)", "chain"]
    with pytest.raises(ValueError):
        dp_view.curves([1, 2], {"chain": [1.0]})
    assert dp_view.curve_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert dp_view.curve_sizes(16) == [1, 2, 4, 8, 16]


def test_dp_view_with_real_dp():
    res = dp.optimal_tree([0.797, 0.104, 0.048, 0.02, 0.01, 0.005], 16, 6)
    fig = dp_view.tree_figure(res.tree(16, 6), res.acceptance, res.value(16, 6))
    assert len(_nodes(fig)) == res.tree(16, 6).n_nodes


def test_sglang_views_show_the_launch_beside_the_sequoia_tree():
    from sequoia.core.trees.sglang_family import best_launch

    choice = best_launch([0.7, 0.15, 0.05], 12, 4)
    fig = dp_view.sglang_tree_figure(choice, [0.7, 0.15, 0.05])
    a = choice.args
    assert len(_nodes(fig)) == a.num_draft_tokens and f"top-{a.topk}" in fig.layout.title.text
    md = dp_view.sglang_markdown(choice)
    assert f"**{choice.family.expected_tokens:.3f}**" in md and f"**{choice.sequoia_tokens:.3f}**" in md
    assert f"{a.steps} steps, top-{a.topk}, num-draft-tokens {a.num_draft_tokens} (SGLang counts the root too)" in md


# ------------------------------------------------------------------ compare view
def test_compare_rows_flags_and_figure():
    run = _run()
    rows = [compare_view.row_from_records("Target alone", run, seconds=2.0),
            compare_view.row_from_records("Sequoia (budget & depth)", run, seconds=1.0),
            compare_view.CompareRow("HF assisted", tokens=8, seconds=1.6, token_ids=(1, 2))]
    rows = compare_view.mark_identical(rows)
    assert [r.identical for r in rows] == [True, True, False]
    assert compare_view.speedups(rows) == [1.0, 2.0, 1.25]
    tab = compare_view.table(rows)
    assert len(tab[0]) == len(compare_view.HEADERS)
    assert tab[1][-1] == "✓ identical" and tab[2][-1] == "✗ differs" and tab[2][5] == "–"
    assert "✗ differs for HF assisted" in compare_view.verdict(rows)
    tied = compare_view.mark_near_ties(rows, {"HF assisted": 50})
    assert compare_view.table(tied)[2][-1] == "≈ identical up to a kernel near-tie at token 50 (certify: exact mode)"
    assert "differs" not in compare_view.verdict(tied) and "1 of them up to a kernel near-tie" in compare_view.verdict(tied)
    assert tab[0][3] == "–" and tab[2][3] == "–"   # no first-token time given (the tab takes it from RunResult)
    fig = compare_view.figure(rows)
    assert len(fig.data) == 8 and list(fig.data[3].x) == [1.0, 2.0, 1.25]   # four bar panels, then their labels
    assert list(fig.data[2].x)[:2] == [pytest.approx(8 / 3)] * 2


def test_compare_without_reference():
    rows = [compare_view.CompareRow("sequoia", 4, 1.0)]
    assert compare_view.mark_identical(rows)[0].identical is None
    assert compare_view.table(rows)[0][7] == "–"
    assert len(compare_view.figure([]).data) == 0


def test_compare_numbers_are_short_and_whole():
    """About three significant digits, never a long tail ("53.725" broke across lines on a projector)."""
    assert [compare_view.number(x) for x in (853.4, 53.725, 5.1249, 0.354, 0.0, 120.0)] == [
        "853", "53.7", "5.12", "0.35", "0.00", "120"]
    rows = compare_view.mark_identical([compare_view.CompareRow("Target alone", 64, 53.725, 64, (1,), first_token_s=20.512),
                                        compare_view.CompareRow("Sequoia (dynamic)", 64, 63.2, 64, (1,), first_token_s=20.1)])
    tab = compare_view.table(rows)
    assert tab[0][:8] == ["Target alone", 64, "53.7", "20.5", "1.19", 64, "1.00", "1× (reference)"]
    assert tab[1][7] == "0.85× (1 round)"
    assert all(" " not in str(v) for row in tab for v in row[1:7])   # numbers never break at a space either


def test_compare_api_records_keep_numbers_and_stable_names():
    rows = compare_view.mark_identical([compare_view.CompareRow("Target alone", 8, 2.0, 8, (1,), first_token_s=0.5),
                                        compare_view.CompareRow("Sequoia (dynamic)", 8, 1.0, 4, (1,), first_token_s=0.5)])
    out = compare_view.records(rows, {"Target alone": "target only", "Sequoia (dynamic)": "sequoia-dynamic"})
    assert [r["method"] for r in out] == ["target only", "sequoia-dynamic"]
    assert [r["label"] for r in out] == ["Target alone", "Sequoia (dynamic)"]
    assert out[1]["speedup"] == 2.0 and out[1]["tokens/s"] == 8.0 and out[1]["identical"] == "✓ identical"
    assert set(compare_view.API_KEYS) <= set(out[0])


def _rounds_rows():
    """The issue's case in three rounds: the machine slowed down in rounds 2 and 3 for every method alike."""
    alone = compare_view.CompareRow("Target alone", 32, 2.2, 32, (1,), rates=(18.0, 12.6, 12.3), reference_work=True)
    dynamic = compare_view.CompareRow("Sequoia (dynamic)", 32, 2.0, 32, (1,), rates=(18.5, 13.0, 12.0),
                                      reference_work=True)
    tree = compare_view.CompareRow("Sequoia (budget & depth)", 32, 7.0, 12, (1,), rates=(5.4, 3.9, 3.8))
    ngram = compare_view.CompareRow("n-gram copies only", 32, 2.1, 30, (1,), rates=(17.0, 13.2, 12.9))
    return compare_view.mark_identical([alone, dynamic, tree, ngram])


def test_compare_rows_in_rounds_carry_bands_and_verdicts():
    rows = _rounds_rows()
    assert rows[0].tokens_per_s == 12.6 and rows[0].rate_spread.lo == 12.3   # the median of the rounds
    bands = compare_view.bands(rows)
    assert bands[0].lo == bands[0].hi == 1.0
    assert bands[2].median == pytest.approx(3.8 / 12.3) and bands[2].lo == pytest.approx(5.4 / 18.0)
    assert compare_view.verdicts(rows) == ["reference", "reference's work", "slower", "same within noise"]
    tab = [[str(v).replace("\u2060", "") for v in row] for row in compare_view.table(rows)]   # word joiners
    assert "\u2060–\u2060" in compare_view.table(rows)[0][4]        # a range never breaks at its dash
    assert tab[0][4] == "12.6 (12.3–18.0)"
    assert tab[1][7].endswith("(0.98–1.03) the target alone's work")   # its band beside it, named, not a speedup
    assert tab[1][7].startswith(f"{bands[1].median:.2f}×")          # the band's own median: never a fixed 1.00
    assert tab[2][7] == "0.31× (0.30–0.31)"       # the band holds the slow round 1 too: paired ratios
    assert tab[3][7].endswith("same within noise") and tab[3][7].startswith("1.05× (0.94–1.05)")
    fig = compare_view.figure(rows)
    assert list(fig.data[3].x)[:2] == [1.0, pytest.approx(bands[1].median)]   # drawn at its band's median
    assert fig.data[3].error_x.arrayminus[2] == pytest.approx(3.8 / 12.3 - 5.4 / 18.0)
    assert fig.data[1].error_x.array[0] == pytest.approx(18.0 - 12.6)
    out = compare_view.records(rows, {})
    assert out[1]["verdict"] == "reference's work" and out[1]["rounds"] == 3
    assert out[2]["speedup min"] == 0.3 and out[0]["tokens/s max"] == 18.0


def test_compare_warns_of_an_outlier_round():
    note = compare_view.outlier_note(_rounds_rows())
    assert "Target alone round 1 (18.0 tokens/s against a median of 12.6)" in note and "quiet machine" in note
    assert "Sequoia (budget & depth) round 1" in note                 # the slow rounds 2 and 3 show in every row
    steady = compare_view.CompareRow("Chain", 8, 1.0, 4, (1,), rates=(10.0, 10.3, 9.9))
    assert compare_view.outlier_note([steady]) == ""


def test_compare_says_checking_until_the_near_tie_check_answers():
    rows = [compare_view.CompareRow("Target alone", 4, 1.0, 4, (1, 2)), compare_view.CompareRow("Chain", 4, 1.0, 2, (1, 3))]
    rows = compare_view.mark_identical(rows)
    assert compare_view.table(rows, checking=True)[1][-1] == "… checking"
    assert compare_view.table(rows)[1][-1] == "✗ differs"


def test_compare_figure_is_horizontal_and_grows_with_rows():
    """Names on one axis, once (horizontal bars never overlap their labels), values written outside the bars."""
    rows = [compare_view.CompareRow(name, 8, 1.0 + i) for i, name in enumerate(
        ["Target alone", "llama.cpp target alone", "Sequoia + n-gram copies", "HF prompt lookup"])]
    fig = compare_view.figure(rows)
    bars, labels = fig.data[:4], fig.data[4:]
    assert all(t.orientation == "h" for t in bars) and all(t.mode == "text" for t in labels)
    assert list(fig.data[0].y) == [r.method for r in rows] and labels[0].text[1] == "2.00"
    assert fig.layout.yaxis.autorange == "reversed"     # the first row on top, as in the table
    more = compare_view.figure(rows * 3)
    assert more.layout.height - fig.layout.height == 8 * compare_view.BAR_ROW_PX


def test_compare_labels_clear_their_whiskers_and_the_1x_line():
    """Issue 58: a value label written at its bar's end was struck through by the whisker and the 1× line."""
    rows = _rounds_rows()
    fig = compare_view.figure(rows)
    for col in range(4):
        bar, label = fig.data[col], fig.data[4 + col]
        whiskers = bar.error_x.array if bar.error_x and bar.error_x.array is not None else [0.0] * len(rows)
        assert all(at >= x + up - 1e-12 for at, x, up in zip(label.x, bar.x, whiskers))
        assert label.textposition == "middle right" and label.hoverinfo == "skip"
    assert all(at > 1.0 for at in fig.data[7].x)           # the ratio's labels right of the dotted 1× line
    gap = compare_view.LABEL_GAP * 2.2
    assert compare_view.label_positions([0.5, 2.0], [0.1, 0.2], line=1.0) == pytest.approx([1.0 + gap, 2.2 + gap])
    assert compare_view.label_positions([0.5], None) == pytest.approx([0.5 * (1 + compare_view.LABEL_GAP)])


def test_a_row_doing_the_target_alones_work_says_why_it_is_not_1x():
    """Issue 58: "0.81× the target alone's work" with no reason; the note names the time a call against the
    reference's and what the difference is."""
    alone = compare_view.CompareRow("Target alone", 16, 1.0, 16, first_token_s=0.25, rates=(20.0,),
                                    reference_work=True)
    auto = compare_view.CompareRow("Sequoia (auto)", 16, 1.2, 16, first_token_s=0.25, rates=(16.2,),
                                   reference_work=True)
    note = compare_view.reference_work_note([alone, auto])
    assert "**Sequoia (auto)** made one token a target call" in note
    assert "63.3 ms a call against 50.0 ms" in note and "13.3 ms a call more" in note
    assert "the method's own work around each call" in note and "not a slower target" in note
    assert compare_view.reference_work_note([alone]) == ""
    tree = compare_view.CompareRow("Sequoia (budget & depth)", 16, 0.5, 6, rates=(40.0,))
    assert compare_view.reference_work_note([alone, tree]) == ""


def test_compare_progress_says_loading_apart_from_running():
    loading = compare_view.progress("loading", "the llama.cpp reference")
    assert loading.startswith("*Loading the llama.cpp reference") and " of " not in loading
    assert "Warm-up round (untimed, a few tokens each): **Chain**, 2 of 5" in compare_view.progress("warming", "Chain", 2, 5)
    running = compare_view.progress("running", "Sequoia (dynamic)", 3, 5, 12, 32, 2, 3)
    assert running == "*Round 2 of 3: running **Sequoia (dynamic)**, 3 of 5: 12 of 32 tokens so far…*"
    assert compare_view.progress("running", "HF assisted", 5, 5, None, 32, 1, 3) == \
        "*Round 1 of 3: running **HF assisted**, 5 of 5…*"
    with pytest.raises(ValueError, match="phase"):
        compare_view.progress("thinking")


# ------------------------------------------------------------------ hardware view
def test_hardware_figures():
    cost = hardware_view.CostSeries((1, 2, 4, 8, 16), (300, 310, 330, 360, 420), (1, 2, 4), (40, 41, 45), "cpu")
    fig = hardware_view.cost_figure(cost, chosen_n=15)
    assert list(fig.data[0].y) == [300, 310, 330, 360, 420]
    assert [t.name for t in fig.data][2].startswith("draft")
    assert [t for t in fig.data if t.name == "chosen: 15 draft tokens"][0].x == (16, 16)
    rows = [hardware_view.PredictionRow("sequoia n=15", 100, 120, chosen=True),
            hardware_view.PredictionRow("chain n=4", 150)]
    fig = hardware_view.prediction_figure(rows)
    assert [t.name for t in fig.data] == ["predicted", "measured (median, range over rounds)"]
    assert fig.data[0].x[0].startswith("★")
    with pytest.raises(ValueError):
        hardware_view.cost_figure(hardware_view.CostSeries((1, 2), (0.1,)))


def test_hardware_from_profile_and_choice():
    prof = hw.HardwareProfile.hand_made(lambda n: 300 + 2 * n, lambda w: 40 + w)
    cost = hardware_view.cost_series(prof)
    assert cost.target_n == prof.target_n and cost.draft_ms == prof.draft_ms
    choice = optimizer.choose_tree([0.797, 0.104, 0.048, 0.02, 0.01, 0.005], prof, max_budget=32, max_depth=8)
    md = hardware_view.choice_markdown(choice, "code")
    assert f"{choice.budget} draft tokens" in md and "speedup" in md
    slow_draft = hw.HardwareProfile.hand_made(lambda n: 10.0, lambda w: 1000.0)
    assert "No speculation" in hardware_view.choice_markdown(optimizer.choose_tree([0.5], slow_draft, 8, 4))


def test_runner_curves_eager_and_graph():
    from components.hardware import runners_view as rv

    graph = hardware_view.CostSeries((1, 16, 128), (4.5, 5.3, 5.8), (1, 16), (3.2, 3.7))
    eager = hardware_view.CostSeries((1, 16, 128), (38.4, 45.2, 55.2), (1, 16), (32.7, 35.7))
    both = rv.RunnerCurves("cuda", graph, eager, cache_note="Graph runner slot caches: target 4096 slots (112 MiB).")
    fig = rv.runners_figure(both)
    assert [t.name for t in fig.data] == [f"{rv.GRAPH}: verify (target forward)", f"{rv.GRAPH}: draft level",
                                          f"{rv.EAGER}: verify (target forward)", f"{rv.EAGER}: draft level"]
    assert list(fig.data[2].y) == [38.4, 45.2, 55.2] and "not measured" not in fig.layout.title.text
    md = rv.runners_markdown(both)
    assert "one-token verify 4.50 ms on graphs against 38.40 ms eager (8.5×)" in md and "4096 slots" in md
    only_graph = rv.runners_figure(rv.RunnerCurves("cuda", graph=graph))
    assert len(only_graph.data) == 2 and f"{rv.EAGER}: not measured" in only_graph.layout.title.text
    assert f"The {rv.EAGER} is not measured" in rv.runners_markdown(rv.RunnerCurves("cuda", graph=graph))
    cpu = rv.RunnerCurves("cpu", eager=eager)
    assert "do not apply on a CPU" in rv.runners_figure(cpu).layout.title.text
    assert rv.runners_markdown(cpu).startswith(rv.CPU_NOTE) and rv.runners_markdown(cpu).count("not measured") == 0
    assert "no profile of it is measured yet" in rv.runners_markdown(rv.RunnerCurves("cpu"))
    assert len(rv.runners_figure(rv.RunnerCurves("cuda")).data) == 0


# ------------------------------------------------------------------ status banner
def test_status_banner_loading_failed_ready():
    status = LoadStatus()
    status(0.42, "converting <target>")
    html = status_view.banner_html(status, "ignored while loading")
    assert "Loading the model pair: 42%" in html and "converting &lt;target&gt;" in html and "width:42%" in html
    status.error = "ModelLoadError: no model 'x<y'"
    html = status_view.banner_html(status, "")
    assert "could not be loaded" in html and "x&lt;y" in html and "DP explorer works" in html
    status.error, status.ready = None, True
    ready = status_view.banner_html(status, "draft <b>a</b>")
    assert ready == '<div class="sq-status sq-status-ready">draft <b>a</b></div>'


# ------------------------------------------------------------------ labels, names, cut steps
def test_labels_escape_once_and_show_whitespace():
    assert tree_view.escape_token('"""') == '"""'  # Plotly does not decode &quot;: escape once, quotes as they are
    assert tree_view.escape_token("a<b&c") == "a&lt;b&amp;c"
    assert tree_view.escape_token("\u0120x\u010a") == "\u2423x\u21b5"  # byte-level BPE space / newline
    assert tree_view.escape_token("\ufffd") == "\u25af" and tree_view.escape_token("\x01") == "\\x01"
    rec = replace(StepRecord.fake(TREE, (0, 1)), texts=('"""',) * TREE.n_nodes)
    fig = tree_view.figure(rec)
    assert all("&quot;" not in str(t.text) + str(t.hovertext) for t in fig.data)


def test_wide_trees_get_short_labels():
    assert tree_view.label_length(4) == 12 and tree_view.label_length(32) <= 2
    wide = Tree((-1,) + (0,) * 32)
    fig = tree_view.figure(replace(StepRecord.fake(wide, (0,)), texts=("root",) + ("abcdefgh",) * 32))
    assert max(len(x) for x in _trace(fig, REJECTED).text) <= tree_view.label_length(33)


def test_cut_last_step_counts_what_was_kept():
    full = StepRecord.fake(Tree.chain(8), tuple(range(9)), step=0)
    cut = replace(StepRecord.fake(Tree.chain(8), tuple(range(9)), step=1), new_tokens=(101, 102),
                  finished=True, finish_reason="length")
    s = summarize([full, cut])
    assert s.new_tokens == 9 + 2 and s.series_accepted == (8, 2) and s.mean_accepted == 5.0
    md = stats_view.summary_markdown([full, cut])
    assert "**11 tokens** in **2 target calls**" in md and "5.00 accepted drafts/step" in md
    title = tree_view.figure(cut).layout.title.text
    assert "8 drafted, 8 accepted, +1 bonus<br>the length limit kept 2 tokens" in title   # wrapped at " · "
    nodes = _nodes(tree_view.figure(cut))
    assert [i for i, g in nodes.items() if g == tree_view.DROPPED] == [3, 4, 5, 6, 7, 8, 9]
    assert "8 accepted" not in text_view.html_view([cut]) and "2 accepted" in text_view.html_view([cut])


def test_target_alone_is_named_and_has_no_bonus():
    rec = replace(StepRecord.fake(Tree.root_only(), (0,)), method="ar")
    assert method_label("ar") == "Target alone"
    fig = tree_view.figure(rec)
    assert "Target alone" in fig.layout.title.text and "bonus" not in fig.layout.title.text
    assert set(_nodes(fig).values()) == {"root", tree_view.TARGET_TOKEN}
    html = text_view.html_view([rec])
    assert "token from the target alone" in html and "bonus token sampled" not in html
    assert "ar)" not in html


def test_first_frame_and_speedup():
    from components.app_state.target_rate import TargetRate

    assert "drafting" in text_view.html_view([], prompt="hi", waiting="drafting…")
    assert stats_view.speedup_markdown(_run(), None) == ""
    rate = summarize(_run()).tokens_per_s
    line = stats_view.speedup_markdown(_run(), TargetRate(rate / 2, False, "predicted (profile: shipped, cpu)"))
    assert "**2.00× the target alone (predicted)**" in line and "the latter predicted (profile: shipped" in line
    # the reading: tokens per target call and seconds a call, over the steps after the prompt's forward
    assert "why: 2.5 tokens per target call at 31.0 ms a call" in line and line.count("×") == 1
    line = stats_view.speedup_markdown(_run(), TargetRate(rate / 3, True, "measured on this prompt (24 target calls)"))
    assert "**3.00× the target alone**" in line and "predicted" not in line and "measured on this prompt" in line
    # the target alone is its own reference, whatever rate was known
    alone = stats_view.speedup_markdown(_run(), TargetRate(rate * 2, False, "predicted"), itself=True)
    assert alone.startswith("**1.00× the target alone**") and "0.50" not in alone


def test_target_rates_are_a_bounded_cache():
    from components.app_state import target_rate

    cache = target_rate.TargetRates(size=2)
    for i in range(3):
        cache.put(i, target_rate.TargetRate(float(i + 1), True, "measured"))
    assert len(cache) == 2 and cache.get(0) is None and cache.get(2).tokens_per_s == 3.0
    assert target_rate.measured_rate(_run()[:1], "x") is None       # one step: no decode rate yet
    assert target_rate.measured_rate(_run(), "by this run").measured


def test_tree_height_is_capped_and_long_titles_wrap():
    chain = StepRecord.fake(Tree.chain(16), tuple(range(17)))
    fig = tree_view.figure(chain)
    assert fig.layout.height == tree_view.MAX_HEIGHT
    title = "step 12 · Sequoia (budget & depth) · 32 drafted, 4 accepted + 1 bonus · +3 added / −2 pruned vs static"
    wrapped = tree_view.wrap_title(title)
    assert "<br>" in wrapped and all(len(line) <= tree_view.TITLE_LINE for line in wrapped.split("<br>"))
    assert wrapped.replace("<br>", " · ") == title


def test_a_two_line_tree_title_starts_below_the_badge():
    """Issue 37: Plotly lifts a title of several lines, and its first line sat half under the "Speculated tree"
    badge; the figure anchors it lower by that lift (the browser test measures the result)."""
    one = tree_view.figure(StepRecord.fake(TREE, (0, 1, 5)))
    two = tree_view.figure(StepRecord.fake(TREE, (0, 1, 5)), overlay=False)
    two.update_layout(title_text="")   # the same tree, a title of two lines
    tree_view._style(two, {0: (0, 0), 1: (1, -3)}, "step 1 · Sequoia · " + "x" * 70)
    assert "<br>" in two.layout.title.text and "<br>" not in one.layout.title.text
    px = lambda fig: (1 - fig.layout.title.y) * fig.layout.height   # noqa: E731 (the anchor, px from the top)
    assert px(one) == pytest.approx(tree_view.BADGE_PX)
    assert px(two) == pytest.approx(tree_view.BADGE_PX + tree_view.TITLE_LIFT_PX)
    assert two.layout.margin.t >= px(two) + 2 * 18   # both lines above the plot


def test_inspector_tick_labels_stay_level_and_short():
    """Issue 37: long one-line labels were tilted, and the first ran into the next row's title."""
    rec = _checked()
    long = replace(rec.checks[0], top_texts=("ĠFizzBuzzFizzBuzz", "b", "c", '"'))
    fig = inspector_view.figure(replace(rec, checks=(long,) + rec.checks[1:]), 2)
    first = fig.data[0].x[0]
    assert first.endswith("<br>(101)") and len(first.split("<br>")[0]) <= inspector_view.TICK_CHARS + 1
    assert fig.layout.xaxis.tickangle == 0 and fig.layout.xaxis.automargin


# ------------------------------------------------------------------ inspector
def _checked():
    """root -> 1, 2, 3: child 1 rejected, child 2 accepted; node 2 has one child (6) rejected; bonus."""
    rec = StepRecord.fake(TREE, (0, 2))
    ids = (101, 102, 103, 9)
    checks = (
        NodeCheck(node=1, parent=0, u=0.9, p_token=0.1, q_token=0.5, accepted=False, top_ids=ids,
                  top_texts=("a", "b", "c", '"'), top_p=(0.1, 0.6, 0.2, 0.1), top_q=(0.5, 0.3, 0.1, 0.1),
                  residual=(0.0, 0.6, 0.2, 0.0)),
        NodeCheck(node=2, parent=0, u=0.2, p_token=0.6, q_token=0.6, accepted=True, top_ids=ids,
                  top_texts=("a", "b", "c", '"'), top_p=(0.0, 0.6, 0.2, 0.0), top_q=(0.0, 0.6, 0.2, 0.2)),
        NodeCheck(node=6, parent=2, u=0.7, p_token=0.05, q_token=0.5, accepted=False, top_ids=(106, 7),
                  top_texts=("x", "b7"), top_p=(0.05, 0.5), top_q=(0.5, 0.1), residual=(0.0, 0.9)),
        NodeCheck(node=TREE.n_nodes, parent=2, u=None, p_token=0.9, q_token=0.0, accepted=True, top_ids=(7, 106),
                  top_texts=("b7", "x"), top_p=(0.9, 0.0), top_q=()),
    )
    return replace(rec, checks=checks, status=("accepted", "rejected", "accepted", "unreached", "unreached",
                                                "unreached", "rejected", "unreached"))


def test_inspector_figure_rows_bars_and_draw():
    rec = _checked()
    fig = inspector_view.figure(rec, 2)
    names = [t.name for t in fig.data if t.type == "bar"]
    # two rows: the rejected first child (p, q, residual, chance) then node 2 itself (p, q, chance)
    assert names.count("target p") == 2 and names.count("residual after rejection") == 1
    draws = [t for t in fig.data if t.type == "scatter"]
    assert [d.y[0] for d in draws] == [0.9, 0.2]
    assert any("child 2 (p_2)" in a.text and "accepted" in a.text for a in fig.layout.annotations)
    bonus = inspector_view.figure(rec, TREE.n_nodes)
    assert [t.name for t in bonus.data] == ["target p"]
    assert "residual" in bonus.layout.annotations[0].text
    assert inspector_view.figure(rec, 4).layout.annotations[0].text.startswith("Node 4 was never tested")


def test_inspector_explain_in_plain_words():
    rec = _checked()
    text = inspector_view.explain(rec, 2)
    assert "child 1 (p_1)" in text and "rejected" in text and "child 2 (p_2)" in text and "**accepted**" in text
    assert "u = 0.200" in text and "rank" not in text
    assert "residual" in inspector_view.explain(rec, 6)
    assert "residual left after every child was rejected" in inspector_view.explain(rec, TREE.n_nodes)
    assert "without the inspector" in inspector_view.explain(StepRecord.fake(TREE, (0,)), 1)
    choices = inspector_view.node_choices(rec)
    assert [n for _, n in choices] == [1, 2, 6, TREE.n_nodes]


def test_live_tab_records_checks_and_feeds_the_inspector(tiny_app_pair, tmp_path):
    from components.live import after_run, live_tab
    from components.app_state.context import AppContext
    from components.app_state.decode_inputs import DecodeInputs
    from components.app_state.acceptance_choice import acceptance_catalogue

    ctx = AppContext.from_pair_or_loader(tiny_app_pair, assets_dir=tmp_path, max_budget=24)
    vector = next(iter(acceptance_catalogue(tmp_path)))
    outs = list(live_tab.decode_stream(ctx, DecodeInputs.from_page("def f(x):", "Sequoia (budget & depth)", 8, 3, 0.6,
                                                                   1.0, 8, 0, vector, True)))
    session = outs[-1][-1]
    assert all(r.checks for r in session.records)
    picker, fig0, text0 = live_tab.inspect_choices(0, session)
    fig, text = live_tab.inspect_node(picker.value, 0, session)
    assert fig is not None and text == text0
    # The inspector follows the step: at the last step its words and figure are about the picked node there.
    last = len(session.records) - 1
    picker, fig, text = live_tab.inspect_choices(last, session)
    rec = session.records[last]
    assert picker.value == inspector_view.default_node(rec)
    assert text.startswith(f"**{inspector_view.heading(rec, picker.value)}**")
    assert f"step {rec.step}" in fig.layout.title.text
    # After the run, in an event of its own, the target alone is measured on its prompt: the ratio says so, cached.
    assert len(ctx.target_rates) == 0 and "measured on this prompt" not in outs[-1][3]
    measured = list(after_run.measure(ctx, session))
    assert "the latter measured on this prompt" in measured[-1][0] and len(ctx.target_rates) == 1
    html, note = live_tab.first_frame("say <hi>")
    assert "say &lt;hi&gt;" in html and "reading the prompt" in html and "drafting" in note
    html, note = live_tab.first_frame("hi", "ar")   # the target alone drafts nothing
    assert "the target reads the prompt" in html and "drafting" not in html and "draft" not in note.lower()


def test_the_vector_follows_the_temperature_and_the_prompt_kind():
    from components.app_state.context import ASSETS
    from components.app_state.acceptance_choice import (acceptance_catalogue, default_acceptance_label,
                                                        label_for_temperature)

    code0 = default_acceptance_label("code", 0.0, ASSETS)
    chat0 = default_acceptance_label("chat", 0.0, ASSETS)
    assert code0.startswith("code, T=0") and chat0.startswith("chat, T=0")
    assert label_for_temperature(0.6, code0, ASSETS).startswith("code, T=0.6")
    assert label_for_temperature(0.7, chat0, ASSETS).startswith("chat, T=0.6")   # the nearest measured
    assert label_for_temperature(0.0, label_for_temperature(1.0, code0, ASSETS), ASSETS) == code0
    assert label_for_temperature(0.6, "custom", ASSETS) is None                  # typed by hand: left alone
    rag0 = default_acceptance_label("rag", 0.0, ASSETS)
    assert rag0.startswith("rag, T=0") and label_for_temperature(0.6, rag0, ASSETS).startswith("rag, T=0.6")
    assert all("calibration" not in label for label in acceptance_catalogue(ASSETS))


def test_runtimes_are_shown_side_by_side():
    from components.widgets import hardware_view as hv

    series = [hv.CostSeries((1, 4), (300.0, 330.0), (1, 2), (40.0, 45.0), label="hf"),
              hv.CostSeries((1, 4), (30.0, 98.0), (1, 2), (12.5, 23.5), label="llamacpp")]
    fig = hv.runtimes_figure(series)
    assert [t.name for t in fig.data] == ["hf: target", "hf: draft level", "llamacpp: target", "llamacpp: draft level"]


# ------------------------------------------------------------------ near-ties at T=0
def _divergence(method: str, lead: float, gap: float, disagree: bool = False, position: int = 49):
    from sequoia.runtime.checks.divergence import Divergence, KernelView

    one = KernelView("one-row", 5, lead, lead)
    many = KernelView("many-row", 6 if disagree else 5, lead, lead)
    return Divergence(method, position, 5, 6, ".\n\n", " and", "return x", one, many, gap=gap)


def test_a_near_tie_within_the_kernel_gap_is_one_explanation_for_all_rows():
    from components.widgets import divergence_view

    ties = [_divergence(m, 0.02, 0.05) for m in ("chain", "specinfer", "sequoia")]
    assert all(d.near_tie for d in ties)
    assert _divergence("x", 0.02, 0.001, disagree=True).near_tie       # the kernels pick differently: a tie
    wrong = _divergence("broken", 3.0, 0.05)
    assert not wrong.near_tie                                           # far beyond the gap: a real difference
    text = divergence_view.markdown(ties)
    assert text.count("Identical up to a kernel near-tie") == 1 and "chain, specinfer, sequoia" in text
    assert "token 50" in text and "Where the outputs part" not in text
    both = divergence_view.markdown([*ties, wrong])
    assert both.count("**broken**") == 1 and both.count("Identical up to a kernel near-tie") == 1


def test_the_cache_note_says_each_graph_runners_capture_status():
    from types import SimpleNamespace

    from components.hardware.hardware_tab import cache_note
    from conftest import tiny_model
    from sequoia.runners.base import RunnerInfo
    from sequoia.runners.hf.graphs.graph_runner import GraphRunner

    runner = GraphRunner(tiny_model(0), "d", RunnerInfo(runtime="hf", weights="fp32", device="cpu"))
    note = cache_note(SimpleNamespace(target=runner, draft=object()))
    assert note.startswith("Graph runner slot caches: target ") and "CUDA graphs need a CUDA device" in note


def test_full_comparison_runs_every_method_the_tab_offers():
    """Issue 51: "Full comparison (every method)" ticks them all (n-gram copies only was left out), and the short
    default stays a subset of it."""
    from components.compare import compare_methods

    assert set(compare_methods.FULL_METHODS) == {m.label for m in compare_methods.METHODS}
    assert set(compare_methods.DEFAULT_METHODS) <= set(compare_methods.FULL_METHODS)


def test_a_profiles_label_speaks_of_its_own_runtime():
    """Issue 51: the cost figure of a llama.cpp server read "oneDNN bf16 ... torch.float32" (torch's words)."""
    from components.app_state.context import ASSETS
    from components.widgets.hardware_view import profile_label
    from sequoia.core.profiles.profile import HardwareProfile

    llama = profile_label(HardwareProfile.load(ASSETS / "profiles" / "embedded-cpu-avx2-llamacpp-q4_k_m.json"))
    assert "llama.cpp, Q4_K_M" in llama and "oneDNN" not in llama and "torch" not in llama
    mixed = profile_label(HardwareProfile.load(ASSETS / "profiles" / "embedded-cpu-avx512bf16-mixed-bf16-q4_0.json"))
    assert "mixed" in mixed and "target bf16, draft Q4_0" in mixed
    hf = profile_label(HardwareProfile.load(ASSETS / "profiles" / "embedded-cpu-avx2-bf16-int8.json"))
    assert "torch.bfloat16" in hf
