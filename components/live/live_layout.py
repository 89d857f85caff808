"""The Live tab's layout and wiring: the request's fields, the views, and which event feeds which handler.

The handlers themselves (the decode stream, the step views, the inspector) are in :mod:`components.live.live_tab`.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import gradio as gr

from sequoia.core.config import MAX_DEPTH
from sequoia.core.requests.request import METHOD_OF_LABEL

from components.app_state import serving
from components.app_state.acceptance_choice import acceptance_catalogue, default_acceptance_label, follow_temperature
from components.app_state.context import LIGHT_WORK, MODEL_WORK, AppContext
from components.app_state.decode_inputs import PAGE_FIELDS, DecodeInputs, page_handler
from components.app_state.run_flags import Redraw, stop_lands_last
from components.live import after_run, live_teaching, race_panel, stats_view, text_view
from components.live.live_tab import (DEFAULT_BUDGET, DEFAULT_DEPTH, DEFAULT_METHOD, DEFAULT_NEW_TOKENS, GUIDED,
                                      GUIDED_LABEL, HOW_TO_READ, NO_NODE, START_HERE, LiveSession, budget_help,
                                      checked_first_frame, decode_api_fn, decode_stream, inspect_choices, inspect_node,
                                      show_step, stop_views)
from components.widgets.divergence_view import LOADING as EXACT_LOADING


#: The input after the page's fields in the Live handlers: the session state (Stop reads it, live_tab.stop_views).
SESSION = ("session",)
#: Runs in the browser when the guided example starts: the text, summary and tree to the top of the window.
SCROLL_TO_OUTPUT = "() => { document.getElementById('sq-text')?.scrollIntoView({block: 'start'}); }"
#: Runs once when the page loads, for every tab: when a refusal appears beside a field (the validator's message)
#: outside the window, the first one shown is scrolled into view.  At 1280x720 a visitor who scrolled down to
#: Decode saw nothing in view saying why nothing ran: the refusals beside prompt, budget and depth were above it.
SHOW_REFUSALS = """() => {
  if (window.sqRefusals) return;
  let shown = '';
  const look = () => {
    const first = [...document.querySelectorAll('.validation-error')]
      .find(e => e.offsetParent !== null && e.textContent.trim());
    const text = first ? first.textContent : '';
    if (first && text !== shown) {
      const box = first.getBoundingClientRect();
      if (box.top < 0 || box.bottom > window.innerHeight) first.scrollIntoView({block: 'center'});
    }
    shown = text;
  };
  window.sqRefusals = new MutationObserver(look);
  window.sqRefusals.observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


def build(ctx: AppContext, refresh_on=()) -> None:
    """Lay out the tab inside the current ``gr.Blocks`` and wire its events (``refresh_on``: events after which
    the views that depend on the loaded pair's profile are redrawn)."""
    # The guided example first, beside where to begin: above the fold at 1280x720 (under the controls it was
    # below the fold even at 1440x900).
    with gr.Row(equal_height=True, elem_id="sq-start-row"):
        gr.Markdown(START_HERE, elem_id="sq-start")
        guided_btn = gr.Button(GUIDED_LABEL, variant="primary", size="sm", elem_id="sq-guided", scale=0,
                               min_width=260)
        projector = live_teaching.projector_toggle()
    with gr.Accordion("How to read this", open=False):
        gr.Markdown(HOW_TO_READ)
    gr.on(None, None, None, js=SHOW_REFUSALS, api_visibility="private")   # no triggers: on the page's load
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            c = _controls(ctx)
            c.guided_btn, c.projector = guided_btn, projector
        with gr.Column(scale=2):
            v = _outputs_column()
    v.stats = gr.Plot(label="Statistics", elem_id="sq-stats")
    race_panel.build(ctx, c.stop_btn, refresh_on)   # the race between runtimes, where a tree pays on another one
    v.session = gr.State(LiveSession())
    _wire(ctx, c, v, refresh_on)


def _controls(ctx: AppContext) -> SimpleNamespace:
    """The request's fields (named as components.app_state.decode_inputs.PAGE_FIELDS) and the buttons (the left column)."""
    cap = ctx.budget_cap()
    c = SimpleNamespace(choices=list(acceptance_catalogue(ctx.assets_dir)))
    start_vector = default_acceptance_label("code", 0.0, ctx.assets_dir)
    c.prompt = gr.Textbox(label="Prompt", lines=5, elem_id="sq-prompt",
                          value="Write a Python function that checks whether a number is prime.")
    c.chat = gr.Checkbox(value=True, label="apply the chat template")
    c.method = gr.Dropdown(list(METHOD_OF_LABEL), value=DEFAULT_METHOD, label="Method")
    with gr.Row():
        # Number boxes, not sliders: a slider sets 100000 to its maximum and 0 to its minimum in the browser,
        # and the decode ran with a value nobody asked for; here the request check refuses it beside the field.
        c.budget = gr.Number(min(DEFAULT_BUDGET, cap), precision=0, label=f"budget (draft tokens / step, 1..{cap})",
                             elem_id="sq-budget")
        c.depth = gr.Number(DEFAULT_DEPTH, precision=0, label=f"depth (1..{MAX_DEPTH})", elem_id="sq-depth")
    gr.Markdown(budget_help())
    with gr.Row():
        # A number box, not a slider: a slider's box sets -1 to 0 on its own and the decode ran at T=0;
        # here the request check refuses it beside the field and nothing runs.
        c.temperature = gr.Number(0, step=0.05, label=f"temperature (0 = greedy, at most {ctx.limits.max_temperature:g})",
                                  elem_id="sq-temperature")
        c.top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p")
    with gr.Row():
        # Number boxes, not sliders: a slider clamps 100000 to its maximum silently, while the request check
        # answers with the server's cap (before the request queues).  No ``minimum`` either: Gradio would refuse
        # 0 or -1 itself, with its own words in an error toast; the request check names the field instead.
        c.new_cap = ctx.limits.max_new_tokens
        c.max_new_tokens = gr.Number(min(DEFAULT_NEW_TOKENS, c.new_cap), precision=0,
                                     label=f"max new tokens (at most {c.new_cap} here)", elem_classes="sq-max-new")
        c.seed = gr.Number(0, precision=0, label="seed", elem_id="sq-seed")
    c.acceptance = gr.Dropdown(c.choices, value=start_vector if start_vector in c.choices else c.choices[0],
                               label="acceptance vector (for the DP tree)")
    with gr.Row():
        c.go_btn = gr.Button("Decode", variant="primary")
        c.stop_btn = gr.Button("Stop", variant="stop")
    c.refused = gr.Markdown("", elem_id="sq-refused", visible=False)   # why a click ran nothing (validation)
    c.fastest_btn = live_teaching.fastest_button(ctx, c.acceptance.value)
    c.exact_btn = gr.Button("Decode in exact mode (float32 target: at T=0 exactly the target alone's text)",
                            size="sm", elem_id="sq-exact")
    return c


def _outputs_column() -> SimpleNamespace:
    """The text, summary, step slider, tree and inspector (the right column)."""
    v = SimpleNamespace()
    v.text = gr.HTML(text_view.html_view([]), label="Generated text", elem_id="sq-text")
    v.summary_md = gr.Markdown(stats_view.summary_markdown([]), elem_id="sq-summary")
    v.step = gr.Slider(0, 1, value=0, step=1, label="step (tree shown below)", interactive=False,
                       elem_id="sq-step-slider")
    v.tree = gr.Plot(label="Speculated tree", elem_id="sq-tree")
    with gr.Accordion("Inspector: why was a node accepted or rejected?", open=True, elem_id="sq-inspector"):
        v.node = gr.Dropdown([], label="node of the step shown above", elem_id="sq-inspect-node")
        v.explain = gr.Markdown(NO_NODE, elem_id="sq-inspect-text")
        v.inspect_fig = gr.Plot(label="target p and draft q at the test", elem_id="sq-inspect-plot")
        live_teaching.worked_example_accordion()
    v.steps = live_teaching.step_panel()
    return v


def _gpu_seconds(ctx: AppContext, scale: int):
    """ZeroGPU's duration for a Live handler (the page's fields, then the session): ``scale`` decodes of the
    request's new tokens, priced by the profile (its own tree's and the page's budget and depth's, the slower)."""
    def seconds(*values) -> int:
        inputs = DecodeInputs.from_page(*values[:-1])
        return serving.gpu_seconds(inputs.max_new_tokens, scale, ctx.profile, tree=(inputs.budget, inputs.depth))
    return seconds


def _handlers(ctx: AppContext):
    """The decode and exact-mode stream handlers, with the page's named parameters (a refusal before the queue
    names the input it is about, components.app_state.validation)."""
    def exact_stream(inputs: DecodeInputs, session: LiveSession | None):
        if session is not None and session.waiting and session.stopped:
            yield Redraw((gr.skip(),) * 6)   # stopped in the queue: Stop's handler drew the page
            return
        if not ctx.exact_loaded:  # first use: the float32 target loads (components/app_state/extra_runners.py)
            yield gr.skip(), gr.skip(), gr.skip(), EXACT_LOADING, gr.skip(), gr.skip()
        try:
            exact = ctx.exact_context()
        except ValueError as exc:  # e.g. refused by the memory budget: the message says what to free
            # In the summary, as the decode's own refusals are (live_tab._run), not a red Error toast.
            if session is not None:
                session.waiting = False
            gr.Warning(f"Cannot load exact mode: {exc}")
            yield (text_view.html_view([], prompt=inputs.prompt), gr.skip(), gr.skip(),
                   f"**Cannot load exact mode:** {exc}", gr.skip(), gr.skip())
            return
        yield from decode_stream(exact, inputs, session)

    # The page's fields, then its session state; serving.on_gpu: ZeroGPU only; stop_lands_last: Stop's words
    # land after the run's frame in flight, and no older frame after them (components.app_state.run_flags)
    return (stop_lands_last(serving.on_gpu(page_handler(functools.partial(decode_stream, ctx), SESSION),
                                           _gpu_seconds(ctx, 1))),
            stop_lands_last(serving.on_gpu(page_handler(exact_stream, SESSION), _gpu_seconds(ctx, 2))))


def _wire(ctx: AppContext, c: SimpleNamespace, v: SimpleNamespace, refresh_on=()) -> None:
    handler, exact_handler = _handlers(ctx)
    inputs = [getattr(c, name) for name in PAGE_FIELDS]
    outputs = [v.text, v.tree, v.stats, v.summary_md, v.step, v.session]
    # The first frame comes from a light event outside the model queue, so it shows at once (even while
    # another visitor's decode holds the model); it also leaves a session in the state for Stop to find.
    first = (v.text, v.summary_md, v.session, c.refused)
    frame = page_handler(functools.partial(checked_first_frame, ctx), SESSION)
    with_state = [*inputs, v.session]
    # The run follows its first frame (``then``), never beside it: it gets the session the frame left, and the
    # frame's answer cannot land after a refusal and clear the validator's message from the fields.
    # No progress overlay on the outputs: the first frame says what the run does, and after Stop the outputs
    # must read as settled while the step in flight ends (it cannot be cut).
    # A click while a stopped run still ends its step: its run follows that one ("always_last"; Gradio's default
    # "once" dropped it while the stopped run's event was pending on the page).
    runs = dict(show_progress="hidden", trigger_mode="always_last", **MODEL_WORK)
    event = c.go_btn.click(frame, with_state, first, api_visibility="private", show_progress="hidden",
                           concurrency_limit=None).then(handler, with_state, outputs, api_name="decode_stream", **runs)
    guided_run = _wire_guided(ctx, c, v, frame, handler, with_state, outputs)
    exact_event = c.exact_btn.click(frame, with_state, first, api_visibility="private", show_progress="hidden",
                                    concurrency_limit=None).then(exact_handler, with_state, outputs,
                                                                 api_visibility="private", **runs)
    # Stop: its own handler settles every output at once and sets the flag the run reads (live_tab.stop_views).
    # Light work: it must never wait behind the decode it stops.
    c.stop_btn.click(stop_views, v.session, [v.text, v.tree, v.stats, v.summary_md, v.step, v.node, v.inspect_fig,
                                            v.explain], api_visibility="private", show_progress="hidden",
                     concurrency_limit=None)

    def run_after(fields):   # the first frame, then the decode, after an event that set the fields
        return fields.then(frame, with_state, first, api_visibility="private", show_progress="hidden",
                           concurrency_limit=None).then(handler, with_state, outputs, api_visibility="private", **runs)
    fastest_run = live_teaching.wire(ctx, c, v, run_after, refresh_on)
    _wire_inspector(v, (event, guided_run, exact_event, fastest_run))
    for run in (event, guided_run, fastest_run):   # the words after a run and the target alone's measurement
        after_run.wire(lambda: ctx, run, v)
    after_run.wire(ctx.exact_context, exact_event, v)
    gr.api(decode_api_fn(ctx), api_name="decode", **MODEL_WORK)
    follow_temperature(c.temperature, c.acceptance, ctx.assets_dir)


def _wire_guided(ctx, c, v, frame, handler, with_state, outputs):
    """The guided example: fill the fields, show the first frame, decode."""
    fields = [getattr(c, name) for name in GUIDED] + [c.acceptance]   # GUIDED's keys are PAGE_FIELDS names
    # The vector measured nearest the example's temperature, as moving the slider by hand would pick.
    guided_vector = default_acceptance_label("code", GUIDED["temperature"], ctx.assets_dir)
    caps = {"max_new_tokens": c.new_cap, "budget": ctx.budget_cap()}
    guided_values = [min(value, caps[name]) if name in caps else value for name, value in GUIDED.items()]
    # Bring the output into view: the button sits above the controls, the text beside and under them.
    c.guided_btn.click(None, None, None, js=SCROLL_TO_OUTPUT, api_visibility="private")
    guided = c.guided_btn.click(lambda: [*guided_values, guided_vector if guided_vector in c.choices else gr.skip()],
                                None, fields, api_visibility="private", concurrency_limit=None)
    guided = guided.then(frame, with_state, [v.text, v.summary_md, v.session, c.refused], api_visibility="private",
                         show_progress="hidden", concurrency_limit=None)
    return guided.then(handler, with_state, outputs, api_visibility="private", show_progress="hidden",
                       trigger_mode="always_last", **MODEL_WORK)


def _wire_inspector(v, runs) -> None:
    """The step slider redraws the tree; the inspector follows the step shown and the node picked."""
    # input (user moves only, not the updates streamed during decoding); always_last drops stale drags.
    # preprocess=False on every event that reads the slider: its change event fires on the updates a run streams
    # and can reach the server after a later update narrowed the range (a new run, Stop drawn from one step fewer),
    # where Gradio's slider refused the value with a red "Value 2 is greater than maximum value 1" toast (seen with
    # ZeroGPU's per-call processes); the handlers clamp the step themselves.
    v.step.input(show_step, [v.step, v.session], [v.tree, v.text], api_visibility="private",
                 trigger_mode="always_last", preprocess=False, **LIGHT_WORK)
    # change also fires on the slider updates the stream sends, so the inspector follows the tree on screen; a
    # run's end refreshes it too (a new run as long as the last leaves the slider's value, so no change fires).
    inspector = dict(fn=inspect_choices, inputs=[v.step, v.session], outputs=[v.node, v.inspect_fig, v.explain],
                     api_visibility="private", show_progress="hidden", preprocess=False, **LIGHT_WORK)
    v.step.change(trigger_mode="always_last", **inspector)
    for run in runs:
        run.then(**inspector)
    # input: the visitor's own pick (the updates above set figure and words with the picker).
    v.node.input(inspect_node, [v.node, v.step, v.session], [v.inspect_fig, v.explain], api_visibility="private",
                 trigger_mode="always_last", show_progress="hidden", preprocess=False, **LIGHT_WORK)
