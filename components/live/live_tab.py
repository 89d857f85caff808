"""Live decoding tab: stream one generation step by step.

The handler is a generator: every :class:`~sequoia.core.statistics.trace.StepRecord` the
engine yields updates the marked-up text, the tree of the newest step and
(throttled) the statistics panel.  A step slider revisits any step's tree
afterwards.  The request's raw inputs are one
:class:`~components.app_state.decode_inputs.DecodeInputs`, parsed once, before it queues,
by :func:`components.app_state.validation.page_request` (the API endpoint and the Compare
tab parse the same way); the handler receives that parse and builds the proposer.
"""

# No ``from __future__ import annotations`` here: gradio reads handler annotations.

import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace

import gradio as gr

from sequoia.core.requests.request import BY_NAME, METHOD_OF_LABEL, DecodeRequest
from sequoia.core.statistics.trace import StepRecord
from sequoia.core.statistics.words import counted
from sequoia.runtime.measuring.finder import DEFAULT_ENTRY
from sequoia.runtime.proposers.dynamic import MAX_DEPTH
from sequoia.runtime.texts import generate_with_texts

from components.app_state import pair_room, serving, target_rate, validation
from components.app_state.context import AppContext
from components.app_state.decode_inputs import DecodeInputs, api_signature
from components.app_state.run_flags import Redraw, RunFlags, stop_after_frame
from components.app_state.runtimes_here import fastest_elsewhere
from components.app_state.validation import EngineInputs
from components.live import inspector_view, no_tree_view, stats_view, text_view
from components.widgets import tree_view
from components.widgets.frames import FRAME_S, Throttle, paced

#: Long enough that the rate is the method's, not the first step's (the prompt's forward and warm caches).
DEFAULT_NEW_TOKENS = 128
#: The one-click example: a code prompt whose trees visibly branch when sampling at T=0.6, sized to show a
#: frame at once (the first frame's event) and end within a minute on a 2-vCPU AVX2-only CPU.  The arithmetic,
#: with llama.cpp's costs there (docs/benchmarks.md, "AVX2 only: llama.cpp runtime"; the runtime such a machine
#: serves on): one target token 86 ms, 8 rows 593 ms, 16 rows 692; the draft 34 ms a level of one row, 59 of two.
#: Budget 12, depth 5 verifies 13 rows (~650 ms) after five draft levels of one to three rows (~300 ms): ~1 s a
#: step.  Measured on the embedded pair (llama.cpp, one thread, CPU time, Zen 4): 48 tokens in 12 steps (4.0 a
#: step), 14.7 s, the first step 0.7 s; the target alone 5.8 s.  Scaled to AVX2 with two threads (single rows
#: ~1.2x, tree rows ~1.35x these): ~20 s, the first step ~1 s; ~45 s at the 2.2x slowdown measured there beside
#: another job.  Budget 32, depth 6 at 128 tokens took 38 s here (~50 s there idle) and 324-362 s on the Hugging
#: Face runtime, where no tree fits a minute on AVX2 (a 16-token bf16 forward costs ~11 tokens').  The tree
#: still branches: the root and two of its descendants have two children each.
GUIDED = dict(prompt="Write a Python function fizzbuzz(n) that returns the FizzBuzz strings for 1..n.",
              method="Sequoia (budget & depth)", budget=12, depth=5, temperature=0.6, max_new_tokens=48, seed=0)
#: What the page opens on: the guided example's fixed DP tree, which draws a tree on every machine (the automatic
#: methods decline every tree where none pays, as on a 2-core CPU); the fastest method here is one click away
#: (components.live.live_teaching.fastest_button).
DEFAULT_METHOD, DEFAULT_BUDGET, DEFAULT_DEPTH = GUIDED["method"], GUIDED["budget"], GUIDED["depth"]
GUIDED_LABEL = "▶ Guided example: a code prompt at T=0.6, 48 tokens (the tree branches)"
#: Always on screen above the tab: where to begin.
START_HERE = ("**Start here:** press **▶ Guided example** (beside this) to watch a code prompt decode, then read "
              "top to bottom: the coloured text, the line under it (how much faster than the target alone, and why), "
              "the tree of the step on the slider, and the inspector under it. *How to read this* explains each piece.")
HOW_TO_READ = """\
Read top to bottom on the right: text, summary, tree, inspector; the statistics are at the bottom of the page.
**Summary**: "× the target alone" divides this run's decode rate by the target alone's on the same prompt and settings: a Live run of the target alone (drawn on the page as it ran, like this run) where there is one, else one measured in the server after the run (not drawn; once; until then it says "predicted" and from which hardware profile); its source says which. Where other programs held the cores during the run (a browser on the same machine), a line says how long.
**Text**: green tokens are drafts the target accepted, blue ones the target drew itself (the bonus); a thin bar starts each target call, and the slider outlines one step.
**Tree**: the step's draft tree, first-sampled child on the left (the one p_1 is about); green = accepted path, red = tested and rejected, grey = never tested, open = cut by the length limit.
**Inspector**: pick a node to see the target's p and the draft's q over the likeliest tokens, the random draw u against min(1, p/q), and the residual the next sibling is tested against.
"""
# While streaming, update the page at most every FRAME_S (components.widgets.frames), the tree and statistics
# less often.
_TREE_EVERY_S = 0.5    # the tree (with the step slider and the outlined step, which follow it)
_STATS_EVERY_S = 2.0   # the six-panel statistics


@dataclass
class LiveSession(RunFlags):
    """Per-browser-session state (kept in ``gr.State``; its run's flags, which Stop's handler reads on the very
    object the run fills: :mod:`components.app_state.run_flags`)."""

    records: list[StepRecord] = field(default_factory=list)
    prompt: str = ""
    rate: target_rate.TargetRate | None = None   # the target alone's rate, measured or predicted (it says which)
    itself: bool = False              # this run is the target alone: its own reference (1.00×)
    elsewhere: str = ""               # the fastest configuration measured here, when another one (see context)
    no_tree: str = ""                 # why this automatic method draws no tree here (components.live.no_tree_view)
    rate_key: tuple = ()              # the target alone's rate's key: this run's prompt and settings
    projection: str = ""              # after a run: what its trees would do elsewhere (components.live.after_run)
    request: DecodeRequest | None = None   # the run's parsed request: what the events after it read (after_run)
    acceptance: str = ""              # the acceptance label the run was given (its projection's vector)
    cores: target_rate.CoreWait | None = None   # after a run: how long its threads waited for a core held elsewhere
    call_graphs: str = ""             # on ZeroGPU: what the run's GPU call captured, or why it ran eagerly


def budget_help() -> str:
    """What budget and depth mean for each method on the page, in the registry's words."""
    parts = []
    for label, name in METHOD_OF_LABEL.items():
        info = BY_NAME[name]
        if info.budget or info.depth:
            words = info.budget if info.budget == info.depth or not info.depth else f"{info.budget}, {info.depth}"
            parts.append(f"{label}: {words}".replace("the policy's limit", str(MAX_DEPTH)))
    return "<small>" + " · ".join(parts) + "</small>"


def generated_text(ctx: AppContext, records: list[StepRecord]) -> str:
    ids = [t for r in records for t in r.new_tokens]
    return ctx.pair().tokenizer.decode(ids, skip_special_tokens=True)


def run_decode(ctx: AppContext, req: EngineInputs,
               should_stop: Callable[[], bool] | None = None) -> Iterator[StepRecord]:
    """The engine's step stream for a parsed request's engine inputs, with the token texts the views show;
    ``should_stop()`` is read after every step and between chunks of a long prompt (Stop)."""
    steps = generate_with_texts(ctx.engine(), ctx.pair().tokenizer, req.prompt_ids, req.proposer, req.config,
                                should_stop=should_stop, inspect=req.inspect)
    return steps if ctx.learned is None else _learning(ctx, steps, req.config.sampling.temperature)


def _learning(ctx: AppContext, steps: Iterator[StepRecord], temperature: float) -> Iterator[StepRecord]:
    """``steps``, and once they have all been read, what they show of the pair's acceptance kept by the server
    (:meth:`AppContext.learn`; a generator closed early adds nothing)."""
    seen = []
    with closing(steps):
        for record in steps:
            seen.append(record)
            yield record
    ctx.learn(seen, temperature)


# ------------------------------------------------------------------ handlers
def _views(session: LiveSession, selected: int | None, stats: bool, tree: bool = True):
    recs = session.records
    html = text_view.html_view(recs, prompt=session.prompt, selected_step=selected)
    if not tree:
        tree_fig = gr.skip()
    else:
        tree_fig = tree_view.figure(recs[selected]) if recs and selected is not None else None
    stats_fig = stats_view.figure(recs) if stats else gr.skip()
    return html, tree_fig, stats_fig, summary(session)


def summary(session: LiveSession) -> str:
    """The statistics line plus this run's speed against the target alone (predicted by the profile), and
    that it was stopped, when it was."""
    if session.stopped and not session.records:
        return "**Stopped** before the first step finished: nothing was generated."
    md = stats_view.summary_markdown(session.records)
    line = stats_view.speedup_markdown(session.records, session.rate, session.itself)
    drawing = target_rate.drawing_words(session.cores, session.rate)   # the rate may be measured after the run
    extra = [x for x in (line, drawing, session.no_tree, session.elsewhere, session.projection,
                         session.call_graphs) if x]
    md += "".join("  \n" + x for x in extra)
    return md + ("  \n" + stopped_line(session.records) if session.stopped else "")


def stopped_line(records: list[StepRecord]) -> str:
    """What the summary says of a run Stop ended (records: the steps it completed)."""
    if records[-1].finished:   # Stop came while the target alone was being measured
        return "**Stopped** while measuring the target alone: the run itself had finished."
    n = sum(len(r.new_tokens) for r in records)
    calls = counted(len(records), "target call")
    return f"**Stopped** after {counted(n, 'token')} ({calls}): the run ended at your Stop."


def first_frame(prompt: str, method: str = "") -> tuple[str, str]:
    """What the page shows the moment Decode is pressed (``method``: the engine's name): the prompt and what
    the first step does, before it is done.  The target alone drafts nothing, so its note says so."""
    if method == "ar":
        waiting, note = "the target reads the prompt…", "*The target alone reads the prompt and draws the first token…*"
    else:
        waiting, note = "reading the prompt…", "*Reading the prompt, then drafting and verifying the first step…*"
    return text_view.html_view([], prompt=prompt or "", waiting=waiting), note


def checked_first_frame(ctx: AppContext, inputs: DecodeInputs, session: LiveSession | None):
    """(text, summary, session, refusal): the first frame of a request the server will take, and a session
    that Stop finds before the run starts (it may wait behind another visitor's).  A refused one leaves the
    last good output in place, with no placeholder waiting for a run that never starts, and says why in the
    refusal line under Decode (:func:`validation.refusal_line`); so does a click while this page's run is on
    (the Decode button's event ignores it), without a word.  A taken one clears the line."""
    if session is not None and session.running:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    try:
        req = validation.page_request(ctx, inputs)   # remembered: the validator's and the handler's parse reuse it
    except ValueError as exc:
        return gr.skip(), gr.skip(), gr.skip(), validation.refusal_line(exc)
    if session is not None and not session.waiting:
        session.stopped = True   # the last run's events still queued after it (after_run) end: a new one comes
    return (*first_frame(inputs.prompt, req.method.name), LiveSession(prompt=inputs.prompt, waiting=True),
            validation.refusal_line(None))


def stop_views(session: LiveSession | None):
    """Stop's handler: (text, tree, stats, summary, slider, node, inspector figure, inspector words), settled
    at once from the steps done so far, however long the step in flight takes.

    It also sets the stop flag the run reads: the engine ends after the step in flight (a step cannot be cut),
    and a run still waiting in the queue never starts (decode_stream).  Why not Gradio's ``cancels``: a cancelled
    event leaves the outputs as the run last drew them (during the first step, the first frame's "reading the
    prompt…", for good), and one cancelled while its step computed ended with a red "Error" on every output.
    Pressed with no run on, Stop changes nothing.
    """
    if not stop_after_frame(session):   # the run's frame in flight lands first (run_flags)
        return (gr.skip(),) * 8
    return stopped_views(session)


def stopped_views(session: LiveSession):
    """The 8 outputs of :func:`stop_views` for a stopped session: the steps done when Stop was pressed."""
    recs = session.records
    last = len(recs) - 1 if recs else None
    node, inspect_fig, words = inspect_choices(last or 0, session)
    return (text_view.html_view(recs, prompt=session.prompt, selected_step=last),
            tree_view.figure(recs[last]) if recs else None, stats_view.figure(recs), summary(session),
            _slider(len(recs)), node, inspect_fig, words)


def _slider(n_records: int) -> gr.Slider:
    return gr.Slider(minimum=0, maximum=max(n_records - 1, 1), value=max(n_records - 1, 0),
                     interactive=n_records > 1)


def decode_stream(ctx: AppContext, inputs: DecodeInputs, session: LiveSession | None = None):
    """Generator handler of the Live tab's inputs (the acceptance a catalogue label): yields (html, tree, stats,
    summary, slider, session) as steps arrive.

    The request was parsed by the validator before it queued; this call gets that parse back
    (components.app_state.validation) and builds the proposer once.

    ``session``: the page's, as its first frame left it (checked_first_frame): this run's, which Stop may have
    stopped while the run waited in the queue (then nothing runs).  Otherwise (an API call, exact mode's
    stream) a new one goes into ``gr.State`` before anything slow.  The engine reads its stop flag between
    steps; a closed page closes this generator at a ``yield``, and ``closing`` then closes the engine's at once,
    which frees its KV caches instead of leaving them to the garbage collector.
    """
    if session is not None and session.waiting and session.stopped:
        yield Redraw((gr.skip(),) * 6)   # stopped in the queue: Stop's handler drew the page (a generator that
        return                   # yields nothing would blank every output)
    if session is None or not session.waiting:
        session = LiveSession(prompt=inputs.prompt)
    session.waiting, session.running = False, True
    try:
        yield (gr.skip(),) * 5 + (session,)
        yield from _run(ctx, inputs, session)
        if session.stopped:
            # Stop's handler drew these at once; drawn again last, with what the run kept after Stop (a frame
            # drawn before the run saw the flag is dropped: run_flags.stop_lands_last).
            yield Redraw((*stopped_views(session)[:5], session))
    finally:
        session.running = False


def _run(ctx: AppContext, inputs: DecodeInputs, session: LiveSession):
    """The road of a Live request: the request parsed once (the validator's parse) with its proposer built once,
    the engine's steps, and around them the run's own lines (why no tree, the rate it divides by, the cores'
    sharing).  The words composed from the finished run and the target alone's measurement are events of their
    own after it (components.live.after_run)."""
    try:
        req = validation.page_request(ctx, inputs)
        job = validation.engine_inputs(ctx, req)
    except ValueError as exc:
        raise gr.Error(str(exc), title="Cannot decode") from None
    try:
        steps = run_decode(ctx, replace(job, inspect=True), lambda: session.stopped)   # lazy: starts when read
        _describe(ctx, req, job, session)
        session.request, session.acceptance = req, inputs.acceptance   # what the events after the run read
        with closing(steps):
            threads, start = target_rate.thread_times(), time.perf_counter()
            yield from _stream_views(session, steps)
            cores = target_rate.core_wait(threads, target_rate.thread_times(), time.perf_counter() - start)
        session.cores = None if session.stopped else cores   # Stop's words stay the last a stopped run shows
        session.call_graphs = pair_room.line()   # in a GPU call: its captures (counted in its time)
        if not session.stopped:   # Stop's handler drew the page; the words after a run are its own events
            yield (gr.skip(),) * 3 + (summary(session), gr.skip(), session)   # (components.live.after_run)
    except (ValueError, RuntimeError) as exc:
        # A message beside the page, not an error state on every output: the first frame's placeholder goes.
        what = "Cannot decode" if isinstance(exc, ValueError) else "Decoding failed"
        gr.Warning(f"{what}: {exc}")
        yield (text_view.html_view([], prompt=inputs.prompt), gr.skip(), gr.skip(), f"**{what}:** {exc}", gr.skip(),
               gr.skip())


def _describe(ctx: AppContext, req, job: EngineInputs, session: LiveSession) -> None:
    """What the summary says beside the run: why no tree is drawn (or a fallback's warning), the target alone's
    rate on this prompt if measured already (else the profile's labelled prediction), a faster choice here."""
    name = req.method.name
    session.no_tree, note = no_tree_view.run_words(ctx.profile, name, job.proposer, ctx.profile_note)
    if note:   # a no-tree line is said in the summary instead
        gr.Warning(note)
    session.rate_key = target_rate.rate_key(ctx.pair(), job.prompt_ids, job.config)
    # A Live run is drawn as it runs: it divides by a rate measured so where there is one (its source says which)
    session.rate = target_rate.pick(ctx.target_rates, session.rate_key, drawn=True) or target_rate.predicted(ctx.choice)
    session.itself = name == "ar"
    try:   # the fastest configuration measured here, when another one; a summary line must never fail
        vector = req.acceptance if req.acceptance is not None else DEFAULT_ENTRY.values
        session.elsewhere = fastest_elsewhere(ctx, vector, name)
    except (OSError, ValueError):   # an unreadable cached profile: the Hardware tab says why
        session.elsewhere = ""


def _stream_views(session: LiveSession, steps: Iterator[StepRecord]):
    """The views, at most every FRAME_S (the tree and statistics less often); the last step in full."""
    tree, stats = Throttle(_TREE_EVERY_S), Throttle(_STATS_EVERY_S)
    shown = None  # the step whose tree is on screen
    for batch in paced(steps, FRAME_S):   # the engine runs ahead in a worker thread (components.widgets.frames)
        if session.stopped:
            # Stop drew the page from the steps done when it was pressed, and said so once: what the engine
            # finished after that (the step in flight cannot be cut) is dropped, not drawn over Stop's message.
            return
        if not batch.items:
            continue
        session.records.extend(batch.items)
        rec, now = session.records[-1], time.monotonic()
        new_tree = tree.due(now, rec.finished)
        if new_tree:
            shown = len(session.records) - 1
        slider = _slider(len(session.records)) if new_tree else gr.skip()
        yield (*_views(session, shown, stats.due(now, rec.finished), new_tree), slider, session)
    if session.records and not session.records[-1].finished and not session.stopped:   # ended early: show the end
        yield (*_views(session, len(session.records) - 1, True), _slider(len(session.records)), session)


def show_step(step, session: LiveSession):
    """Slider handler: the tree of one step and the text with that step outlined."""
    if session is None or not session.records:
        return None, gr.skip()
    i = min(max(int(step), 0), len(session.records) - 1)
    return (tree_view.figure(session.records[i]),
            text_view.html_view(session.records, prompt=session.prompt, selected_step=i))


def decode_api_fn(ctx: AppContext):
    """The typed function behind the ``/decode`` API endpoint."""
    def work(stop, inputs: DecodeInputs):
        req = validation.parse_inputs(ctx, inputs)
        # a cancelled request stops within a step
        records = serving.drain(run_decode(ctx, validation.engine_inputs(ctx, req), stop.is_set), stop)
        return generated_text(ctx, records), [r.to_dict() for r in records]

    gpu_work = serving.on_gpu(work, lambda stop, inputs: serving.gpu_seconds(
        inputs.max_new_tokens, profile=ctx.profile, tree=(inputs.budget, inputs.depth)))

    async def decode(*values, **named):
        """Generate with one method; returns the text and one JSON object per step.

        ``acceptance`` (e.g. "0.8, 0.1, 0.05") sets the vector the Sequoia tree is built for.
        """
        inputs = DecodeInputs(*values, **named)
        try:
            return await serving.run_cancellable(lambda stop: gpu_work(stop, inputs))
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
    return api_signature(decode, tuple[str, list])  # the parameters DecodeInputs lists, typed, for gr.api


# ------------------------------------------------------------------ layout
NO_NODE = "*Decode something, then pick a node of the step shown above.*"


def inspect_choices(step, session: LiveSession):
    """The picker for one step (tested nodes, then the bonus; the first rejected preselected) with the figure
    and words of that very node.

    All three together: the node's number alone often stays the same from step to step (the bonus of a
    chain), and a picker whose value did not change fires no change event, which left the words and the
    figure on an older step while the picker named the new one.
    """
    if session is None or not session.records:
        return gr.Dropdown(choices=[], value=None), None, NO_NODE
    rec = session.records[min(max(int(step), 0), len(session.records) - 1)]
    choices = inspector_view.node_choices(rec)
    node = inspector_view.default_node(rec)
    return (gr.Dropdown(choices=choices, value=node), inspector_view.figure(rec, node),
            inspector_view.explain(rec, node))


def inspect_node(node, step, session: LiveSession):
    """Inspector handler: figure and explanation of one node of the shown step."""
    if session is None or not session.records or node is None:
        return None, NO_NODE
    rec = session.records[min(max(int(step), 0), len(session.records) - 1)]
    return inspector_view.figure(rec, int(node)), inspector_view.explain(rec, int(node))
