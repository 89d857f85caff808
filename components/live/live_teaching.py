"""The Live tab's teaching pieces, laid out and wired: step mode, the worked example, the projector view and the
button that runs the fastest method here.

The views are pure (:mod:`components.live.step_mode`, :mod:`components.live.worked_example`); this module only places
them and connects their buttons to the session the Live tab's run fills (:class:`components.live.live_tab.LiveSession`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import SimpleNamespace

import gradio as gr

from sequoia.core.profiles.runtimes import RuntimeEstimate
from sequoia.runtime.measuring.finder import DEFAULT_ENTRY

from components.app_state.acceptance_choice import acceptance_catalogue
from components.app_state.context import LIGHT_WORK, AppContext
from components.app_state.runtimes_here import runtimes_here
from components.live import step_mode, worked_example
from components.live.live_tab import LiveSession, show_step

#: The figures a class reads (assets/studio.css sizes their other texts).
PROJECTOR_FIGURES = "#sq-tree, #sq-step-plot, #sq-inspect-plot, #sq-worked-plot, #sq-stats"
#: Runs in the browser when the projector box changes: the page's CSS (assets/studio.css) keys on the body's class.
#: Two texts CSS cannot enlarge alone, as Plotly places them for its own font size: legends (larger text ran into
#: the next item) and the labels of text traces (a tree's token under its node: larger text grew up under the
#: marker).  Plotly lays both out at 20 px, and every half second re-applies that to figures a new step or run
#: redrew, until the box is unticked (then back to Plotly's size: the traces it set, marked on the figure).
PROJECTOR_JS = ("""(on) => {
  document.body.classList.toggle('sq-projector', !!on);
  const legends = () => {
    if (!window.Plotly) return;
    document.querySelectorAll(':is(FIGURES) .js-plotly-plot').forEach((gd) => {
      const shown = gd._fullLayout && gd._fullLayout.showlegend && gd._fullLayout.legend;
      const ours = gd.layout && gd.layout.legend && gd.layout.legend.font && gd.layout.legend.font.size === 20;
      if (on ? shown && shown.font.size < 20 : ours) window.Plotly.relayout(gd, {'legend.font.size': on ? 20 : null});
      const small = (gd.data || []).map((t, i) => (String(t.mode || '').includes('text') &&
        !(t.textfont && t.textfont.size >= 20)) ? i : -1).filter((i) => i >= 0);
      if (on && small.length) {
        gd.sqLabels = small;
        window.Plotly.restyle(gd, {'textfont.size': 20}, small);
      } else if (!on && gd.sqLabels) {
        const set = gd.sqLabels.filter((i) => i < (gd.data || []).length);
        delete gd.sqLabels;
        if (set.length) window.Plotly.restyle(gd, {'textfont.size': null}, set);
      }
    });
  };
  clearInterval(window.sqProjectorLegends);
  legends();
  window.sqProjectorLegends = on ? setInterval(legends, 500) : undefined;
}""").replace("FIGURES", PROJECTOR_FIGURES)
NO_STEP = "*Decode something, then press **Step** to replay the step on the slider one phase at a time.*"
WORKED_LABEL = "Worked example: one rejection on a five-word vocabulary (the residual, by hand)"
_TREE_METHOD = re.compile(r"Sequoia n=(\d+) d=(\d+)")   # how runtime_choice names a tree (RuntimeEstimate.method)


# ------------------------------------------------------------------------------ the fastest method, one click away
@dataclass(frozen=True)
class FastestPreset:
    """The fields that run the fastest method this runtime's profile predicts, and the button's words."""

    method: str           # the page's method label
    budget: int | None    # None: leave the field as it is (the target alone drafts nothing)
    depth: int | None
    label: str


def fastest_preset(estimate: RuntimeEstimate | None) -> FastestPreset | None:
    """The preset for a runtime's estimate (None: not measured here, so nothing to name)."""
    if estimate is None or not estimate.measured:
        return None
    rate = f"~{estimate.tokens_per_s:.0f} tokens/s predicted"
    tree = _TREE_METHOD.fullmatch(estimate.method)
    if tree is None:
        return FastestPreset("Target alone", None, None, f"Run the fastest here: the target alone ({rate})")
    budget, depth = int(tree[1]), int(tree[2])
    return FastestPreset("Sequoia (budget & depth)", budget, depth,
                         f"Run the fastest here: Sequoia, budget {budget}, depth {depth} ({rate})")


def preset_here(ctx: AppContext, acceptance_label: str | None) -> FastestPreset | None:
    """The preset for the loaded runtime and the page's acceptance vector (a catalogue label; the built-in
    vector for one typed by hand), trees within this server's cap (None before the pair loads)."""
    if not ctx.loaded:
        return None
    vector = acceptance_catalogue(ctx.assets_dir).get(acceptance_label or "", DEFAULT_ENTRY.values)
    try:
        decision = runtimes_here(ctx, vector, budget=ctx.budget_cap())[1]
    except (OSError, ValueError):   # an unreadable cached profile: the Hardware tab says why
        return None
    return fastest_preset(decision.estimate(ctx.pair().backend))


def _button_update(preset: FastestPreset | None):
    return gr.Button(value=preset.label if preset else "Run the fastest here", visible=preset is not None)


def fastest_button(ctx: AppContext, acceptance_label: str) -> gr.Button:
    """The button, named from the profile when one is measured here (hidden otherwise)."""
    preset = preset_here(ctx, acceptance_label)
    return gr.Button(preset.label if preset else "Run the fastest here", size="sm", visible=preset is not None,
                     elem_id="sq-fastest")


# ------------------------------------------------------------------------------ layout
def projector_toggle() -> gr.Checkbox:
    return gr.Checkbox(False, label="Projector view", elem_id="sq-projector-toggle", scale=0, min_width=160)


def worked_example_accordion() -> None:
    """The worked example (static: computed once, from fixed numbers and seed), for the inspector."""
    example = worked_example.work()
    with gr.Accordion(WORKED_LABEL, open=False, elem_id="sq-worked"):
        gr.Plot(worked_example.figure(example), show_label=False, elem_id="sq-worked-plot")
        gr.Markdown(worked_example.markdown(example), elem_id="sq-worked-text")


def step_panel() -> SimpleNamespace:
    """Step mode's words, buttons and figure."""
    s = SimpleNamespace()
    with gr.Accordion("Step mode: one target call, phase by phase", open=True, elem_id="sq-step-mode"):
        with gr.Row():
            s.step_btn = gr.Button("Step ▶ (next phase)", size="sm", elem_id="sq-step-btn")
            s.next_btn = gr.Button("Next target call »", size="sm", elem_id="sq-next-call")
            s.reject_btn = gr.Button("Next rejection »", size="sm", elem_id="sq-next-rejection")
        s.text = gr.Markdown(NO_STEP, elem_id="sq-step-text")
        s.plot = gr.Plot(show_label=False, elem_id="sq-step-plot")
    s.cursor = gr.State((-1, -1, 0))   # (step, phase, id of the session it replays)
    return s


# ------------------------------------------------------------------------------ handlers
def step_views(slider, cursor, session: LiveSession | None, move: str = "phase"):
    """(cursor, figure, words, slider, tree, text) after one press of Step (``move``: "phase"), Next target call
    ("call") or Next rejection ("rejection": the next rejected test, wrapping to the run's start).

    A replay starts at the call the slider shows (the first call after the prompt's forward when it shows the
    prompt's), and starts over there when the slider is moved by hand.  When the replay moves to another call,
    the slider, the tree and the text follow."""
    if session is None or not session.records:
        return cursor, None, NO_STEP, gr.skip(), gr.skip(), gr.skip()
    records = session.records
    on_slider = min(max(int(slider or 0), 0), len(records) - 1)
    step, phase, run = cursor
    fresh = run != session.owner or step != on_slider
    if fresh:
        step, phase = (on_slider if on_slider > 0 else min(1, len(records) - 1)), 0
    note = ""
    if move == "rejection":
        spot = step_mode.next_rejection(records, step, phase - 1 if fresh else phase)
        if spot is None:
            note = "**No draft was rejected in this run**: every test passed (a lower temperature or another " \
                   "prompt makes rejections likelier).\n\n"
        else:
            step, phase = spot
    elif fresh:   # the first press of a replay shows where it starts
        return _shown(step, 0, session, on_slider, note)
    elif move == "call":
        step, phase = (step + 1, 0) if step + 1 < len(records) else (step, phase)
    else:
        step, phase = step_mode.advance(step, phase, len(step_mode.phases(records[step])), len(records))
    return _shown(step, phase, session, on_slider, note)


def _shown(step: int, phase: int, session: LiveSession, on_slider: int, note: str = ""):
    """step_views' outputs for the replay at (``step``, ``phase``); the slider, tree and text follow a new call."""
    rec = session.records[step]
    phase = min(phase, len(step_mode.phases(rec)) - 1)
    follow = (gr.Slider(value=step), *show_step(step, session)) if step != on_slider else (gr.skip(),) * 3
    return ((step, phase, session.owner), step_mode.figure(rec, step_mode.phases(rec)[phase]),
            note + step_mode.markdown(rec, phase), *follow)


def wire(ctx: AppContext, c: SimpleNamespace, v: SimpleNamespace, run_after_fields, refresh_on=()):
    """Connect the projector box, the fastest button and step mode.  ``run_after_fields(event)``: the Live tab's
    first frame and decode after an event that set the fields (returns the run's event); ``refresh_on``: events
    after which the fastest button is renamed (the pair and its profile load after the page is built)."""
    c.projector.change(None, c.projector, None, js=PROJECTOR_JS, api_visibility="private")

    def set_fastest(acceptance_label):
        preset = preset_here(ctx, acceptance_label)
        if preset is None:
            return gr.skip(), gr.skip(), gr.skip()
        return (preset.method, gr.skip() if preset.budget is None else preset.budget,
                gr.skip() if preset.depth is None else preset.depth)

    fields = c.fastest_btn.click(set_fastest, c.acceptance, [c.method, c.budget, c.depth], api_visibility="private",
                                 concurrency_limit=None)
    for trigger in (*refresh_on, c.acceptance.change):
        trigger(lambda label: _button_update(preset_here(ctx, label)), c.acceptance, c.fastest_btn,
                api_visibility="private", show_progress="hidden", concurrency_limit=None)
    s = v.steps
    outputs = [s.cursor, s.plot, s.text, v.step, v.tree, v.text]
    for button, move in ((s.step_btn, "phase"), (s.next_btn, "call"), (s.reject_btn, "rejection")):
        button.click(lambda slider, cursor, session, m=move: step_views(slider, cursor, session, m),
                     [v.step, s.cursor, v.session], outputs, api_visibility="private", show_progress="hidden",
                     preprocess=False, **LIGHT_WORK)   # the slider's raw value (live_layout._wire_inspector)
    return run_after_fields(fields)
