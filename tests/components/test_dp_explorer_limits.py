"""The DP explorer's cell within the limits it solves (issue 58): narrowing the largest budget or depth below the
selected cell clamps the cell before the solve, so no event is refused ("Value 32 is greater than maximum value
16") and the figures never stay one edit behind."""

import gradio as gr
import pytest

from components.dp_explorer import dp_tab
from sequoia._meta import ASSETS

VECTOR = "0.8, 0.1"


def test_the_cell_is_clamped_to_the_limits_and_a_raw_value_never_fails():
    assert dp_tab.clamped_cell(32, 8, 16, 4) == (16, 4)
    assert dp_tab.clamped_cell(5, 2, 16, 4) == (5, 2)
    assert dp_tab.clamped_cell(-3, -1, 16, 4) == (0, 0)
    assert dp_tab.clamped_cell("12", 3.0, 16, 4) == (12, 3)           # as a slider's raw payload may come
    assert dp_tab.clamped_cell(None, "x", 16, 4) == (16, 4)           # no number: the largest cell


@pytest.mark.parametrize("edits", [
    # the four edits, in order, then limits above and below the selection
    [(16, 8), (16, 4), (8, 4), (8, 3), (32, 3), (32, 10), (4, 10), (4, 1), (128, 16), (1, 1)],
])
def test_every_edit_of_the_limits_solves_with_the_cell_inside_them(lanes, edits):
    session, n, d = dp_tab.DPSession(), 32, 8      # the cell the page shows: the sliders' values
    session = dp_tab.on_solve(lanes, VECTOR, 32, 8, n, d, session)[-1]
    for budget, depth in edits:
        heat, tree, md, curves, n_slider, d_slider, session = dp_tab.on_solve(lanes, VECTOR, budget, depth, n, d,
                                                                             session)
        n, d = n_slider.value, d_slider.value
        assert (n_slider.maximum, d_slider.maximum) == (budget, depth)
        assert 0 <= n <= budget and 0 <= d <= depth, (budget, depth, n, d)
        assert f"**n = {n}, d = {d}**" in md and session.result.budget == budget
        assert tree.layout.title.text      # the selected cell's tree, not an error
        # the events after the solve read the sliders raw: a stale value (the old cell) is clamped, not refused
        fig, words = dp_tab.copies_views(lanes, VECTOR, "0.9", 32, 8, session)
        assert words.startswith(f"**n = {min(32, budget)}, d = {min(8, depth)}**")
        _, sglang_md, command = dp_tab.sglang_views(lanes, VECTOR, 128, 64, "t", "d", "STANDALONE", session)
        assert "Cannot" not in sglang_md


def test_the_views_after_a_solve_use_the_clamped_cell(lanes):
    session = dp_tab.on_solve(lanes, VECTOR, 16, 4, 32, 8, dp_tab.DPSession())[-1]
    _, words = dp_tab.copies_views(lanes, VECTOR, "0.9", 32, 8, session)
    assert words.startswith("**n = 16, d = 4**")
    _, md, command = dp_tab.sglang_views(lanes, VECTOR, 32, 8, "t", "d", "STANDALONE", session)
    assert command and md == dp_tab.sglang_views(lanes, VECTOR, 16, 4, "t", "d", "STANDALONE", session)[1]
    heat, tree, cell = dp_tab.on_cell(lanes, 32, 8, session)
    assert "**n = 16, d = 4**" in cell


def test_every_dp_event_reads_the_cell_raw(lanes):
    """Gradio's own slider check refused a value the same edit narrowed (a red toast): every event whose inputs
    hold a cell slider skips it, and its handler clamps."""
    with gr.Blocks() as demo:
        dp_tab.build(lanes, ASSETS, demo)
    sliders = {b._id for b in demo.blocks.values() if isinstance(b, gr.Slider)
               and b.label in ("tree size n", "depth d")}
    reading = [fn for fn in demo.fns.values() if {b._id for b in fn.inputs} & sliders]
    assert len(reading) >= 10 and all(not fn.preprocess for fn in reading)
