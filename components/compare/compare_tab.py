"""Compare tab: the methods a user picks, on one prompt, in interleaved timed rounds.

The target alone (always: the reference), chain, SpecInfer, Sequoia (static,
auto, dynamic), the n-gram methods (copies from the context alone, and copied
branches in the dynamic tree) and Hugging Face's two kinds of drafting
(assisted generation with the draft model, prompt lookup) run with the same
settings: all three kinds of drafting on one prompt.
Where the server offers it (:attr:`AppContext.offers_reference`), the same
target on llama.cpp, as its shipped GGUF, runs alone as a reference row: what a
CPU user would run instead of any of them.
The tab opens on a short run a class can wait for (:data:`DEFAULT_METHODS`,
:data:`DEFAULT_TOKENS`, :data:`~components.compare.compare_run.DEFAULT_ROUNDS` rounds);
"Full comparison" runs every method (:data:`FULL_METHODS`, :data:`FULL_TOKENS`),
as the ``/compare`` API does.  Which methods: :mod:`components.compare.compare_methods`;
how they are run and timed (a warm-up round, then rounds A B C A B C ...):
:mod:`components.compare.compare_run`; the bars and the table, each ratio with its band
and verdict: :mod:`components.compare.compare_view`.  At temperature 0 every lossless
method must reproduce the target alone's output token for token, which the
"identical" column checks ("checking" while a difference is being traced to a
kernel near-tie).  The handler streams: a line says what loads, warms up or
runs (round k of R), the bars and table grow as each run finishes, and Stop
ends the run between two steps (:class:`CompareSession`), keeping the rows of
the runs that finished.
"""

# No ``from __future__ import annotations``: gr.api reads the return annotation.

import functools
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

import gradio as gr

from sequoia._meta import ProgressFn
from sequoia.core.statistics.words import counted

from components.app_state import serving, validation
from components.app_state.acceptance_choice import acceptance_catalogue, default_acceptance_label, follow_temperature
from components.app_state.context import MODEL_WORK, AppContext
from components.app_state.decode_inputs import COMPARE_FIELDS, DecodeInputs, compare_handler
from components.app_state.run_flags import Redraw, RunFlags, stop_after_frame, stop_lands_last
from components.compare import compare_view
from components.compare.compare_methods import (API_KEYS, DEFAULT_METHODS, FULL_METHODS, FULL_TOKENS, METHODS,
                                                choose_methods, offered, ticked)
from components.compare.compare_run import DEFAULT_ROUNDS, CompareState, iter_comparison
from components.compare.exact_compare import after_comparison
from components.widgets import divergence_view
from components.widgets.frames import FRAME_S, Throttle

__all__ = ["API_KEYS", "DEFAULT_METHODS", "FULL_METHODS", "FULL_TOKENS", "METHODS", "CompareState", "choose_methods",
           "iter_comparison", "offered", "ticked"]

#: New tokens of each run when the tab opens.  The arithmetic, on the default runtime of a 2-vCPU Zen 4 (llama.cpp,
#: the embedded pair, issue 42): one round of the default rows at 32 tokens took 15 s there (the fixed 32/8 tree
#: about 0.3x the target alone, the automatic methods about 1x); three rounds at 16 tokens are 1.5 times the
#: tokens, about 22 s plus the warm-up round: under the 30 s a class waits.  An AVX2-only Zen 3 runs llama.cpp
#: 3-4x slower: 45-52 s a click there, measured (docs/benchmarks.md, "What a class waits for").
DEFAULT_TOKENS = 16
#: Timed rounds of "Full comparison" and the /compare API (every method, FULL_TOKENS tokens each).
FULL_ROUNDS = DEFAULT_ROUNDS
#: The fixed tree's budget and depth when the tab opens ("Sequoia (budget & depth)"): the Live tab's tree
#: (components.live.live_tab.GUIDED), so a class compares the very tree it watched.  On a 2-vCPU CPU a verify of
#: n tokens costs about as much as n tokens of the prompt's forward (arithmetic-bound): a 32/8 tree costs 0.7 s a
#: step on an AVX2-only Zen 3, 16 of the default's 40 s there.
DEFAULT_BUDGET, DEFAULT_DEPTH = 12, 5


def run_comparison(ctx: AppContext, prompt, budget, depth, temperature, top_p, max_new_tokens, seed,
                   acceptance=None, chat=True, include_hf=True,
                   progress: ProgressFn | None = None, methods=None, rounds: int = DEFAULT_ROUNDS):
    """All rows (reference first, identical flags set) and notes; ValueError on bad input.  The raw values by
    name, for scripts and tests (``acceptance``: None, a vector or text; ``methods`` None: the full set)."""
    inputs = DecodeInputs(prompt, validation.COMPARE_METHOD, budget, depth, temperature, top_p, max_new_tokens, seed,
                          chat, acceptance)
    shown = None
    for state in iter_comparison(ctx, inputs, include_hf, methods, rounds):
        if progress and (state.phase, state.running, state.round) != shown:
            shown = (state.phase, state.running, state.round)
            progress(state.fraction, state.line() if state.running else "done")
    return state.rows, state.notes


#: Said under the table once every round is in: how the numbers were made and how to read a band.
ROUNDS_NOTE = ("Timed in {rounds} interleaved rounds after an untimed warm-up round: tokens/s is each row's median "
               "end-to-end rate (its tokens over the whole call, the prompt's forward included, so below the Live "
               "tab's decode rates, which start after it; its range over the rounds in brackets), the ratio the "
               "median of the per-round ratios to the target "
               "alone (its band in brackets); \"same within noise\" where the band holds 1 and the median is within "
               "the target alone's own round-to-round noise, \"too noisy to tell\" where the band holds 1 but the "
               "median is further off (more rounds would tell), \"the target alone's work\" where every target call "
               "made one token.")


def _notes_markdown(rows, notes, temperature, checked: bool = True, stopped: bool = False, shared: str = "",
                    alone: str = "") -> str:
    """The notes under the table; ``checked=False``: the differing rows are not yet checked for near-ties
    (``stopped``: and never will be, Stop ended the run); ``shared``: how long other programs held the cores
    during the timed rounds, ``alone``: the target alone's decode rate in them (both after the words on how the
    rounds were timed)."""
    lines = list(notes)
    if float(temperature) == 0:
        unchecked = [r.method for r in rows if r.identical is False and r.near_tie_at is None]
        then = "not checked for a kernel near-tie (the run was stopped)" if stopped else \
            "checking whether at a kernel near-tie…"
        lines.append(compare_view.verdict(rows) if checked or not unchecked else
                     f"*{', '.join(unchecked)}: the text parts from the target alone's; {then}*")
    else:
        lines.append("At temperature > 0 outputs differ by design; only their distribution matches the target's.")
    most = max((len(r.rates) for r in rows), default=0)
    if most > 1:
        lines.append(ROUNDS_NOTE.format(rounds=most))
    lines.append(alone)
    lines.append(shared)
    lines.append(compare_view.outlier_note(rows))
    lines.append(compare_view.reference_work_note(rows))
    lines.append(compare_view.reference_note(rows))
    return "\n\n".join(line for line in lines if line)


@dataclass
class CompareSession(RunFlags):
    """One browser session's comparison (kept in ``gr.State``; :mod:`components.app_state.run_flags`): a comparison
    cancelled while a step computed ended with a red "Error" on the bars, the table and the notes (issue 42).
    Stop draws the rows so far at once; the run reads the flag after every step and ends there."""

    temperature: float = 0.0          # the run's (the notes at T=0 speak of identical outputs)
    state: CompareState | None = None   # where the run stands: Stop's handler draws its rows


def begin_comparison(ctx: AppContext, inputs: DecodeInputs, methods: list[str], session: CompareSession | None):
    """A click's first, light event: (session, refusal line): a fresh session for the run that follows (Stop
    finds it while that run waits in the queue), the line under the buttons hidden.  A refused request leaves the
    state as it is, and the run that follows then does nothing; the line says why (the validator's messages
    beside the fields go at the page's next status: :func:`validation.refusal_line`).  A click while this page's
    run is on (and not stopped) changes nothing; a click after Stop starts a new run, which waits for the stopped
    one's last step."""
    if session is not None and session.on and not session.stopped:
        return gr.skip(), gr.skip()
    try:
        validation.page_request(ctx, inputs)   # remembered: the validator's and the handler's parse reuse it
    except ValueError as exc:
        return gr.skip(), validation.refusal_line(exc, "Not run")
    return CompareSession(waiting=True, temperature=inputs.temperature), validation.refusal_line(None)


def stopped_line(state: CompareState | None) -> str:
    """What the notes say of a comparison Stop ended."""
    if state is None or not state.runs:
        return "**Stopped** before a timed run finished: nothing was timed."
    runs = counted(state.runs, "timed run")
    return (f"**Stopped** in round {state.round} of {state.rounds}: the rows show the {runs} that "
            "finished (each row's median over its rounds so far).")


def stopped_views(session: CompareSession) -> tuple:
    """(bars, table, notes) of a stopped comparison: the rows of the runs that finished, and the Stop line."""
    state = session.state
    rows = state.rows if state is not None else []
    md = stopped_line(state)
    if rows:
        md += "\n\n" + _notes_markdown(rows, state.notes, session.temperature, checked=False, stopped=True,
                                        shared=state.shared, alone=state.alone_decode)
    return (compare_view.figure(rows), compare_view.table(rows), md) if rows else (gr.skip(), gr.skip(), md)


def stop_comparison(session: CompareSession | None) -> tuple:
    """Stop's handler: (bars, table, notes) settled at once from the runs done so far, however long the step in
    flight takes; it sets the flag the run reads.  Pressed with no comparison on, it changes nothing."""
    if not stop_after_frame(session):   # the run's frame in flight lands first (run_flags)
        return gr.skip(), gr.skip(), gr.skip()
    return stopped_views(session)


def on_compare(ctx: AppContext, inputs: DecodeInputs, methods: list[str], session: CompareSession | None = None,
               exact: bool = False, rounds: int = DEFAULT_ROUNDS):
    """Generator handler of the tab's inputs (the acceptance a catalogue label): the bars and table grow as each
    run finishes; a line says what runs now (round k of R).

    ``methods``: the ticked checkbox labels (:data:`METHODS`).  ``session``: the page's, as its click's first
    event left it (:func:`begin_comparison`); Stop may have stopped it while the run waited in the queue (then
    nothing runs), and a session that is not waiting belongs to a run already on (the click is ignored).  None
    (scripts, tests): a session of this call's own.  ``exact``: run on the exact-mode pair
    (:meth:`AppContext.exact_context`); at T=0 a differing output gets its first divergence explained.
    """
    if session is not None and (not session.waiting or session.stopped):
        yield Redraw((gr.skip(),) * 3)          # stopped in the queue (Stop drew the page), or a run is on: a
        return                                  # generator that yields nothing would blank every output
    session = session or CompareSession(temperature=inputs.temperature)
    session.waiting, session.running = False, True
    try:
        yield from _compare(ctx, inputs, methods, session, exact, rounds)
    finally:
        session.running = False


def _compare(ctx: AppContext, inputs: DecodeInputs, methods: list[str], session: CompareSession, exact: bool,
             rounds: int):
    temperature = inputs.temperature
    checking = float(temperature) == 0   # a differing row reads "checking" until its near-tie check answers
    inputs = replace(inputs, acceptance=acceptance_catalogue(ctx.assets_dir).get(inputs.acceptance))
    seen, frame = (-1, "", None, 0), Throttle(FRAME_S)   # (runs, phase, method, round) last shown
    try:
        if exact and not ctx.exact_loaded:
            yield gr.skip(), gr.skip(), divergence_view.LOADING
        run_ctx = ctx.exact_context() if exact else ctx
        for state in iter_comparison(run_ctx, inputs, methods=list(methods or ()), rounds=rounds):
            session.state = state
            if session.stopped:   # ends the engine's run at this step (closing this loop closes it)
                break
            now = (state.runs, state.phase, state.running, state.round)
            if now == seen and not frame.due(time.monotonic()):
                continue  # only the "n tokens so far" line would change: at most once a frame
            grew, seen = now[0] != seen[0], now
            md = state.line() if state.running else _notes_markdown(state.rows, state.notes, temperature,
                                                                    checked=False, shared=state.shared,
                                                                    alone=state.alone_decode)
            if grew:   # a run finished: the bars and the table show it at once
                yield compare_view.figure(state.rows), compare_view.table(state.rows, checking=checking), md
            else:
                yield gr.skip(), gr.skip(), md
        # Then, at T=0, where outputs part (replays of the prefix): Stop ends that too.
        after = () if session.stopped else after_comparison(
            run_ctx, inputs.prompt, inputs.chat, state.rows, temperature, exact,
            lambda rows: _notes_markdown(rows, state.notes, temperature, shared=state.shared,
                                         alone=state.alone_decode))
        for out in after:
            if session.stopped:
                break
            yield out
        if session.stopped:
            # Stop's handler drew these already; drawn again last, so no frame of the run lands after them.
            yield Redraw(stopped_views(session))
    except ValueError as exc:
        raise gr.Error(str(exc), title="Cannot compare") from None
    except RuntimeError as exc:
        raise gr.Error(f"comparison failed: {exc}", title="Decoding error") from None


def compare_api_fn(ctx: AppContext):
    def work(stop, prompt, budget, depth, temperature, top_p, max_new_tokens, seed, include_hf):
        inputs = DecodeInputs(prompt, validation.COMPARE_METHOD, budget, depth, temperature, top_p, max_new_tokens,
                              seed)
        states = iter_comparison(ctx, inputs, include_hf=include_hf, rounds=FULL_ROUNDS)
        rows = serving.drain(states, stop)[-1].rows  # a cancelled request stops within a step
        return compare_view.records(rows, API_KEYS)

    gpu_work = serving.on_gpu(work, lambda stop, *a: serving.gpu_seconds(
        a[5], (FULL_ROUNDS + 1) * len(FULL_METHODS), ctx.profile, tree=(a[1], a[2])))

    async def compare(prompt: str, budget: int = 32, depth: int = 8, temperature: float = 0.0, top_p: float = 1.0,
                      max_new_tokens: int = 64, seed: int = 0, include_hf: bool = True) -> list:
        """Run the full comparison on one prompt (:data:`FULL_METHODS`: all three kinds of drafting;
        ``include_hf=False``: no Hugging Face baselines) in interleaved rounds (:data:`FULL_ROUNDS`, after a
        warm-up round); one object per method (method, label, tokens, seconds, speedup with its band
        ``speedup min`` / ``max`` over the rounds, ``verdict``, identical…)."""
        args = (prompt, budget, depth, temperature, top_p, max_new_tokens, seed, include_hf)
        try:
            return await serving.run_cancellable(lambda stop: gpu_work(stop, *args))
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
    return compare


HOW_TO_READ = """\
**Run comparison** runs a short default (the boxes ticked when the page opens, 16 tokens, 3 rounds), **Full comparison** every method on 64 tokens (minutes on a CPU); rows grow as each run finishes.
Every method decodes the same prompt with the same seed: first an untimed warm-up round, then timed rounds in which every method runs once in turn (A B C A B C ...), so a busy machine slows all of them alike. Each run is timed by the bench's runner (prefill included).
**tokens / s** is each row's median over the rounds, its range in brackets; **speedup** is the median of the per-round ratios to the target alone, its band in brackets: where the band holds 1 and the median is within the target alone's own round-to-round noise (9% at most) the row is **the same as the target alone within noise**; where the band holds 1 but the median is further off, the rounds are **too noisy to tell**; a row whose every target call made one token did **the target alone's work** (its ratio is noise, never a speedup). **tokens/call** is new tokens per target forward; **identical** says whether the text equals the target alone's (it must at temperature 0; "checking" while a difference is traced).
Above 0 the texts differ run to run, but each is a sample from exactly the target's distribution.
Three kinds of drafting: a draft model (Sequoia's trees, HF assisted), copies of n-grams already in the prompt or the text so far (n-gram copies only, HF prompt lookup: no draft cost, right where the answer quotes the input), and both in one tree (Sequoia + n-gram copies).
"""


def build(ctx: AppContext) -> None:
    """Lay out the tab inside the current ``gr.Blocks`` and wire its events."""
    with gr.Accordion("How to read this", open=False):
        gr.Markdown(HOW_TO_READ)
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            c = _controls(ctx)
        with gr.Column(scale=2):
            bars = gr.Plot(label="comparison", elem_id="sq-compare-bars")
            # Tall enough for every row of a full run: the table never hides rows in a scroll area of its own.
            table = gr.Dataframe(headers=compare_view.HEADERS, label="results", interactive=False,
                                 elem_id="sq-compare-table", wrap=True, column_widths=compare_view.COLUMN_WIDTHS,
                                 max_height=2000)
            notes = gr.Markdown(elem_id="sq-compare-notes")
    _wire(ctx, c, [bars, table, notes])


def _controls(ctx: AppContext) -> SimpleNamespace:
    """The request's fields (named as components.app_state.decode_inputs.COMPARE_FIELDS) and the buttons (the left column)."""
    cap, choices = ctx.budget_cap(), list(acceptance_catalogue(ctx.assets_dir))
    c = SimpleNamespace()
    c.prompt = gr.Textbox(label="Prompt", lines=4, value="Write a Python function that reverses a linked list.")
    c.chat = gr.Checkbox(value=True, label="apply the chat template")
    with gr.Row():
        c.budget = gr.Slider(1, cap, value=min(DEFAULT_BUDGET, cap), step=1, label="budget")
        c.depth = gr.Slider(1, 32, value=DEFAULT_DEPTH, step=1, label="depth")
    with gr.Row():
        # A number box, as on the Live tab: a slider would set -1 to 0 without a word.
        c.temperature = gr.Number(0, step=0.05, label="temperature (0 = greedy)")
        c.top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p")
    with gr.Row():
        # A number box, not a slider: a slider clamps 100000 to its maximum silently, while the
        # request check answers with the server's cap (before the request queues).
        new_cap = ctx.limits.max_new_tokens
        # No minimum on either box: Gradio's own "less than minimum" toast names no field, while the request
        # check refuses 0 or -1 naming it (as the Live tab's boxes do).
        c.max_new_tokens = gr.Number(min(DEFAULT_TOKENS, new_cap), precision=0,
                                     label=f"max new tokens (at most {new_cap} here)", elem_classes="sq-max-new")
        c.seed = gr.Number(0, precision=0, label="seed")
    c.acceptance = gr.Dropdown(choices, value=default_acceptance_label("code", 0.0, ctx.assets_dir),
                               label="acceptance vector (Sequoia tree)")
    c.methods = gr.CheckboxGroup(offered(ctx), value=ticked(ctx), label="methods", elem_id="sq-compare-methods",
                                 info="Target alone always runs: the others are compared with it. HF: Hugging Face "
                                 "generate with the draft model (assisted) or with copies from the prompt (prompt "
                                 "lookup).")
    with gr.Row():
        c.run_btn = gr.Button("Run comparison", variant="primary")
        c.stop_btn = gr.Button("Stop", variant="stop", elem_id="sq-compare-stop")
    c.refused = gr.Markdown("", elem_id="sq-compare-refused", visible=False)   # validation.refusal_line
    c.full_btn = gr.Button(f"Full comparison (every method, {FULL_TOKENS} tokens: minutes on a CPU)", size="sm",
                           elem_id="sq-compare-full")
    c.exact_btn = gr.Button("Run in exact mode (float32 target: T=0 outputs identical)", size="sm",
                            elem_id="sq-compare-exact")
    return c


def _gpu_seconds(ctx: AppContext, runs_per_method: int):
    """ZeroGPU's duration for a Compare handler: ``runs_per_method`` decodes (one a round) of every ticked method
    and the reference, priced by the profile (the slower of its tree's and the page's budget and depth's)."""
    def seconds(*values) -> int:
        named = dict(zip(COMPARE_FIELDS, values))
        return serving.gpu_seconds(named["max_new_tokens"], runs_per_method * (len(named["methods"] or ()) + 1),
                                   ctx.profile, tree=(named["budget"], named["depth"]))
    return seconds


def _wire(ctx: AppContext, c: SimpleNamespace, outputs: list) -> None:
    """Run, exact mode and Stop; the ``/compare`` endpoint.  The handlers take the page's named parameters: a
    refusal before the queue names the input it is about (components.app_state.validation)."""
    session = gr.State(CompareSession())
    inputs = [*(getattr(c, name) for name in COMPARE_FIELDS), session]
    method, extra = validation.COMPARE_METHOD, ("session",)
    handler = compare_handler(functools.partial(on_compare, ctx), method, extra)
    exact_handler = compare_handler(functools.partial(on_compare, ctx, exact=True), method, extra)
    full_handler = compare_handler(functools.partial(on_compare, ctx, rounds=FULL_ROUNDS), method, extra)
    # Each click first leaves a fresh session in the state (light: it never waits behind a run), then the run
    # follows it (``then``) and gets that very session, which Stop flags (stop_comparison).  A click while the
    # stopped run still finishes its step: the page defers its run to that run's end ("always_last"; Gradio's
    # default "once" dropped it, issue 59).
    light = dict(api_visibility="private", show_progress="hidden", concurrency_limit=None)
    run = dict(api_visibility="private", trigger_mode="always_last", **MODEL_WORK)
    begin = compare_handler(functools.partial(begin_comparison, ctx), method, extra)

    def begun(trigger):
        return trigger(begin, inputs, [session, c.refused], **light)

    # stop_lands_last: Stop's words land after the run's frame in flight, and no older frame after them.
    handler, exact_handler, full_handler = (
        stop_lands_last(serving.on_gpu(h, _gpu_seconds(ctx, rounds)))
        for h, rounds in ((handler, DEFAULT_ROUNDS), (exact_handler, DEFAULT_ROUNDS + 1), (full_handler, FULL_ROUNDS)))
    begun(c.run_btn.click).then(handler, inputs, outputs,
                                api_name="compare_stream", **run)  # the name: validation finds it
    begun(c.exact_btn.click).then(exact_handler, inputs, outputs, **run)
    # The full run: tick every method and set the tokens where the visitor sees them, then run as Run does.  The
    # choices are set with the ticks: both read this server's methods now, so the ticks are always among them
    # (issue 42: a tick missing from choices fixed before the pair loaded was refused with HTTP 400).
    full_tokens = min(FULL_TOKENS, ctx.limits.max_new_tokens)
    ticks = c.full_btn.click(
        lambda: (gr.update(choices=offered(ctx), value=ticked(ctx, full=True)), full_tokens), None,
        [c.methods, c.max_new_tokens], queue=False, api_visibility="private")
    full = begun(ticks.then).then(full_handler, inputs, outputs, api_name="compare_full", **run)
    # ...and the default ticks and tokens back after it (stopped or not), so the next Run comparison is the short
    # default again, not the full set.
    full.then(lambda: (gr.update(value=ticked(ctx)), DEFAULT_TOKENS), None, [c.methods, c.max_new_tokens],
              queue=False, api_visibility="private")
    # Stop: its own light handler settles the outputs at once and sets the flag the run reads.
    c.stop_btn.click(stop_comparison, session, outputs, **light)
    gr.api(compare_api_fn(ctx), api_name="compare", **MODEL_WORK)
    follow_temperature(c.temperature, c.acceptance, ctx.assets_dir)
    for slider, name in ((c.budget, "budget"), (c.depth, "depth")):
        validation.say_when_clamped(slider, name)
