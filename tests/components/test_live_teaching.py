"""The Live tab's teaching pieces on the tiny pair: the default draws a tree wherever no tree pays, the fastest
method is one click away, step mode replays a real run, and the worked example sits in the inspector."""

from __future__ import annotations

import gradio as gr
import pytest

from components.app_state.acceptance_choice import DEFAULT_ACCEPTANCE_LABEL
from components.app_state.decode_inputs import DecodeInputs
from components.live import live_tab, live_teaching, no_tree_view, step_mode
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.profiles.runtimes import RuntimeEstimate
from sequoia.core.requests.request import resolve_method
from sequoia.runtime.methods import make_method

#: Verifying n tokens costs n plain steps (a 2-core CPU): no tree pays, the automatic methods draw none.
LINEAR = HardwareProfile.hand_made(target=lambda n: 40.0 * n, draft=lambda w: 20.0)


def _default_inputs(max_new: int = 10) -> DecodeInputs:
    return DecodeInputs.from_page("def f(x):", live_tab.DEFAULT_METHOD, live_tab.DEFAULT_BUDGET,
                                  live_tab.DEFAULT_DEPTH, 0.6, 1.0, max_new, 0, DEFAULT_ACCEPTANCE_LABEL, True)


def _run(ctx, inputs: DecodeInputs) -> live_tab.LiveSession:
    session = None
    for out in live_tab.decode_stream(ctx, inputs):
        session = out[-1] if isinstance(out[-1], live_tab.LiveSession) else session
    return session


def test_the_default_draws_a_tree_where_the_profile_says_none_pays():
    name = resolve_method(live_tab.DEFAULT_METHOD)
    proposer = make_method(name, budget=live_tab.DEFAULT_BUDGET, depth=live_tab.DEFAULT_DEPTH, profile=LINEAR)
    assert proposer.tree.size == live_tab.DEFAULT_BUDGET
    assert no_tree_view.explain(LINEAR, name, proposer) == ""
    dynamic = make_method("sequoia-dynamic", budget=32, depth=8, profile=LINEAR)   # the old default: no tree here
    assert no_tree_view.explain(LINEAR, "sequoia-dynamic", dynamic) != ""


def test_the_page_opens_on_the_default_and_every_step_after_the_prompt_draws_a_tree(demo):
    methods = [b for b in demo.blocks.values() if isinstance(b, gr.Dropdown) and b.label == "Method"]
    assert methods and methods[0].value == live_tab.DEFAULT_METHOD
    session = _run(demo.sequoia_context, _default_inputs())
    assert session.records and all(r.tree.size > 0 for r in session.records[1:])


def test_the_fastest_button_names_the_runtimes_best_method_and_sets_it():
    alone = RuntimeEstimate("llamacpp", True, 26.4, 26.4, "target alone")
    preset = live_teaching.fastest_preset(alone)
    assert preset.method == "Target alone" and preset.budget is None
    assert preset.label == "Run the fastest here: the target alone (~26 tokens/s predicted)"
    tree = live_teaching.fastest_preset(RuntimeEstimate("hf", True, 80.2, 30.0, "Sequoia n=20 d=6"))
    assert (tree.method, tree.budget, tree.depth) == ("Sequoia (budget & depth)", 20, 6)
    assert "budget 20, depth 6 (~80 tokens/s predicted)" in tree.label
    assert live_teaching.fastest_preset(RuntimeEstimate("hf", True)) is None
    assert live_teaching.fastest_preset(None) is None


def test_step_mode_replays_a_run_phase_by_phase_then_moves_the_slider_to_the_next_call(demo):
    session = _run(demo.sequoia_context, _default_inputs(24))
    assert len(session.records) >= 3 and all(r.checks for r in session.records)   # the Live tab records what verification saw
    last = len(session.records) - 1   # where a run leaves the slider
    # Step starts at the call the slider shows (issue 51: it started at call 1 whatever the slider said)
    cursor, fig, words, slider, *_ = live_teaching.step_views(last, (-1, -1, 0), session)
    assert cursor == (last, 0, session.owner) and f"Target call {last} · phase 1 of" in words
    assert slider == gr.skip()   # the slider stays where it is
    # the slider at the prompt's forward: the replay starts at the first drafted call
    cursor, fig, words, slider, *_ = live_teaching.step_views(0, (-1, -1, 0), session)
    assert cursor == (1, 0, session.owner) and "Target call 1 · phase 1 of" in words and slider.value == 1
    n = len(step_mode.phases(session.records[1]))
    for i in range(1, n):
        cursor, fig, words, slider, tree, text = live_teaching.step_views(1, cursor, session)
        assert cursor[:2] == (1, i) and f"phase {i + 1} of {n}" in words
    assert "commits" in words   # the last phase: the bonus
    cursor, fig, words, slider, tree, text = live_teaching.step_views(1, cursor, session)
    assert cursor[:2] == (2, 0) and slider.value == 2 and tree is not None   # the slider and tree follow
    cursor, *_ = live_teaching.step_views(2, cursor, session, "call")
    assert cursor[:2] == (min(3, last), 0)   # the last call stays where it is
    assert live_teaching.step_views(0, cursor, None)[2] == live_teaching.NO_STEP
    # draft == target here: nothing is ever rejected, and Next rejection says so
    assert "No draft was rejected" in live_teaching.step_views(0, cursor, session, "rejection")[2]


def test_the_inspector_holds_the_worked_example_and_the_page_the_projector_box(demo):
    accordions = {b.label for b in demo.blocks.values() if isinstance(b, gr.Accordion)}
    assert live_teaching.WORKED_LABEL in accordions
    boxes = [b for b in demo.blocks.values() if isinstance(b, gr.Checkbox) and b.label == "Projector view"]
    assert len(boxes) == 1 and boxes[0].elem_id == "sq-projector-toggle"


def test_the_button_follows_the_loaded_runtimes_profile(demo):
    ctx = demo.sequoia_context
    assert live_teaching.preset_here(ctx, DEFAULT_ACCEPTANCE_LABEL) is None   # no profile here: no button
    flat = HardwareProfile.hand_made(target=lambda n: 100.0 + 0.5 * n, draft=lambda w: 2.0 + 0.1 * w)
    try:
        ctx.profile = LINEAR                  # verifying n tokens costs n steps: the target alone is fastest
        assert live_teaching.preset_here(ctx, DEFAULT_ACCEPTANCE_LABEL).method == "Target alone"
        ctx.profile = flat                    # verifying is nearly free: a tree, within this server's cap
        preset = live_teaching.preset_here(ctx, DEFAULT_ACCEPTANCE_LABEL)
        assert preset.method == "Sequoia (budget & depth)" and 1 <= preset.budget <= ctx.budget_cap()
    finally:
        ctx.profile = None
