"""The Live tab's race panel: the offer in one line, the "Race the runtimes" button, the three lanes side by
side (each run's text as it comes), the tree run's newest tree, the bars with their bands and the sentence.

Where no runtime makes a tree pay, the line says so with the arithmetic (:func:`components.live.race.no_race_line`)
and there is no button.  The run itself is :func:`components.live.race_run.iter_race`; the Live tab's Stop
stops it (its own handler on the same button reads this panel's session).
"""

# No ``from __future__ import annotations`` here: gradio reads handler annotations.

import functools
import html
import importlib.util
import time
from types import SimpleNamespace

import gradio as gr

from sequoia.core.profiles.runtimes import display_name
from sequoia.core.statistics.words import counted
from sequoia.runtime.memory import human

from components.app_state.context import LIGHT_WORK, MODEL_WORK, AppContext
from components.live import race, race_run
from components.live.race_run import RaceState
from components.widgets import tree_view
from components.widgets.frames import FRAME_S, Throttle, paced

RACE_LABEL = "🏁 Race the runtimes"
#: The page's race: timed rounds and new tokens a run (None: the guided example's); read at each click, so a
#: test may make it short (the product's stays race.ROUNDS of the guided example's 48 tokens).
PAGE_RACE = {"rounds": race.ROUNDS, "max_new_tokens": None}
#: How often the tree run's tree is redrawn while it runs.
_TREE_EVERY_S = 0.5
_LANE_STYLE = ("display:flex;gap:8px;align-items:stretch", "flex:1;min-width:0;border:1px solid #ccc;border-radius:6px;"
               "padding:6px;font-size:15px", "white-space:pre-wrap;font-family:monospace;font-size:14px;"
               "max-height:260px;overflow:auto")


def offer_markdown(ctx: AppContext, offer: race.Offer | None) -> str:
    """The panel's line: what the race shows and costs, or why there is none here ("" where nothing is known:
    the pair loading, no profile, no second runtime to load)."""
    if not race_run.on_cpu(ctx):
        return ""
    acceptance = race_run.race_acceptance(race_run.guided_inputs())
    try:
        profiles = race_run.race_profiles(ctx, acceptance)
    except (OSError, ValueError):   # an unreadable cached profile: the Hardware tab says why
        return ""
    if offer is None:
        if not profiles:
            return ""
        serving = ctx.pair().backend
        if serving in profiles and (line := race.serving_pays_line(serving, profiles[serving], acceptance)):
            return line
        installed = ("hf", "llamacpp") if importlib.util.find_spec("llama_cpp") else ("hf",)
        missing = [b for b in installed if b not in profiles]
        return race.no_race_line(profiles, acceptance, missing)
    t, s, n = display_name(offer.tree_backend), display_name(offer.serving_backend), offer.shown_tokens
    size = human(ctx.extras.race_bytes(offer.tree_backend))
    vt, vs = offer.verify_ratio[offer.tree_backend], offer.verify_ratio[offer.serving_backend]
    return (f"**A tree pays one runtime away:** verifying {n} tokens costs {vt:.1f}x one token on {t} against "
            f"{vs:.1f}x on {s} (serving; this machine's profiles), so Sequoia (auto) is predicted at "
            f"{offer.predicted_ratio:.1f}x {t}'s target alone"
            f"{race_run.stand_in_words(ctx, offer.tree_backend, acceptance)}. "
            f"**{RACE_LABEL}** runs the guided example's prompt by Sequoia (auto) on {t}, by {t}'s target alone and "
            f"by {s}'s target alone, in {race.ROUNDS} interleaved rounds; it loads {t}'s pair first (about {size}) "
            "and frees it after.")


def lanes_html(state: RaceState | None) -> str:
    """The three lanes side by side: each one's label, its rates so far and its current run's text."""
    if state is None or state.offer is None:
        return ""
    got = state.bands if state.results else {}
    cols = []
    for lane in state.offer.lanes():
        rate = got[lane.key].text if lane.key in got else ("running…" if state.lane == lane.key else "waiting")
        text = html.escape(state.texts.get(lane.key, ""))
        cols.append(f'<div class="sq-race-lane" data-lane="{lane.key}" style="{_LANE_STYLE[1]}">'
                    f"<b>{html.escape(lane.label)}</b><br><small>{html.escape(rate)}</small>"
                    f'<div style="{_LANE_STYLE[2]}">{text}</div></div>')
    return f'<div style="{_LANE_STYLE[0]}">{"".join(cols)}</div>'


def words(state: RaceState) -> str:
    """What the panel says under the lanes: the progress line, or the sentence with the memory held."""
    if state.phase == "done":
        memory = state.memory_words()
        return f"**{state.line}**" + (f"  \n{memory[0].upper()}{memory[1:]}; the second runtime is freed now."
                                      if memory else "")
    if state.stopped:
        runs = counted(len(state.results), "timed run")
        return f"**Stopped** after {runs}: the race ended at your Stop, and the second runtime is freed."
    return f"*{html.escape(state.line)}…*" if state.line else ""


def _views(state: RaceState, tree: bool = True):
    bars = race.figure(state.offer.lanes(), state.bands) if state.results else gr.skip()
    tree_fig = tree_view.figure(state.tree) if tree and state.tree is not None else gr.skip()
    return lanes_html(state), bars, tree_fig, words(state)


def first_frame(ctx: AppContext, session: RaceState | None):
    """The click's light event: a new session waiting for the model slot (Stop finds it), the lanes shown."""
    if session is not None and session.on:
        return (gr.skip(),) * 5
    offer = race_run.race_offer(ctx, race_run.race_acceptance(race_run.guided_inputs()))
    if offer is None:
        return gr.skip(), gr.skip(), "*No race is offered on this server now.*", RaceState(), gr.skip()
    state = RaceState(offer=offer, waiting=True)
    state.line = "queued for the models (a run already on them goes first)"
    return lanes_html(state), gr.skip(), words(state), state, gr.Column(visible=True)


def race_stream(ctx: AppContext, state: RaceState, rounds: int | None = None, max_new_tokens: int | None = None):
    """The race's handler: yields (lanes, bars, tree, words, session) as it goes (``rounds``, ``max_new_tokens``:
    None, the page's: PAGE_RACE)."""
    if state is None or state.offer is None or (state.waiting and state.stopped):
        yield (gr.skip(),) * 5
        return
    state.waiting, state.running = False, True
    state.rounds = int(rounds or PAGE_RACE["rounds"])
    max_new_tokens = max_new_tokens or PAGE_RACE["max_new_tokens"]
    tree = Throttle(_TREE_EVERY_S)
    try:
        for frame in paced(race_run.iter_race(ctx, state, race_run.guided_inputs(max_new_tokens)), FRAME_S):
            if state.stopped:
                break
            yield (*_views(state, tree.due(time.monotonic(), frame.final)), state)
        yield (*_views(state), state)
    finally:
        state.running = False


def stop(state: RaceState | None):
    """Stop's handler for the race: flags the run (it ends after the step in flight) and says so at once."""
    if state is None or not state.stop():
        return gr.skip(), gr.skip()
    return lanes_html(state), words(state)


def build(ctx: AppContext, stop_btn: gr.Button, refresh_on=()) -> SimpleNamespace:
    """The panel inside the current layout, wired: its button to the race, ``stop_btn`` to stopping it;
    ``refresh_on``: events after which the offer is read again (the pair loaded, a profile measured)."""
    offer = race_run.race_offer(ctx, race_run.race_acceptance(race_run.guided_inputs())) if ctx.loaded else None
    p = SimpleNamespace()
    p.offer_md = gr.Markdown(offer_markdown(ctx, offer), elem_id="sq-race-offer")
    p.button = gr.Button(RACE_LABEL, visible=offer is not None, elem_id="sq-race-btn", size="sm")
    with gr.Column(visible=False) as p.column:
        p.lanes = gr.HTML("", elem_id="sq-race-lanes")
        with gr.Row():
            p.bars = gr.Plot(label="The race: tokens/s with bands", elem_id="sq-race-bars")
            p.tree = gr.Plot(label="The tree run's newest tree", elem_id="sq-race-tree")
        p.words = gr.Markdown("", elem_id="sq-race-words")
    p.state = gr.State(RaceState())
    first = [p.lanes, p.bars, p.words, p.state, p.column]
    p.event = p.button.click(functools.partial(first_frame, ctx), p.state, first, api_visibility="private",
                             show_progress="hidden", concurrency_limit=None).then(
        functools.partial(race_stream, ctx), p.state, [p.lanes, p.bars, p.tree, p.words, p.state],
        api_visibility="private", show_progress="hidden", **MODEL_WORK)
    stop_btn.click(stop, p.state, [p.lanes, p.words], api_visibility="private", show_progress="hidden",
                   concurrency_limit=None)

    def refresh():
        now = race_run.race_offer(ctx, race_run.race_acceptance(race_run.guided_inputs()))
        return offer_markdown(ctx, now), gr.Button(visible=now is not None)
    for trigger in refresh_on:
        trigger(refresh, None, [p.offer_md, p.button], api_visibility="private", show_progress="hidden", **LIGHT_WORK)
    return p
