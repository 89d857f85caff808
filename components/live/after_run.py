"""After a Live run, off its road: the words composed from the finished run, then the target alone measured.

Two events follow every Live run (:func:`wire`), each its own, so the run's handler
(:func:`components.live.live_tab.decode_stream`) ends with its last step and its own lines (the cores' sharing,
a GPU call's captures):

* :func:`words`, light work: what the run's trees would do on other hardware
  (:mod:`components.widgets.projection_view`), and a run of the target alone kept as the drawn condition's
  measurement (:func:`target_rate.live_rate`);
* :func:`measure`, model work: the target alone on the run's prompt and settings, measured once in the server
  and not drawn (:func:`target_rate.probe`), where no rate was measured yet; the summary then divides by it.

Both read what the run left in its session (its parsed request, the acceptance label it was given), never the
page's fields again: a visitor may have edited them since.  A session that a newer click replaced, or that Stop
ended, gets neither (the new click's first frame flags the old session stopped: live_tab.checked_first_frame).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import gradio as gr

from sequoia.runtime.measuring.finder import AcceptanceEntry, find_acceptance, list_acceptance

from components.app_state import serving, target_rate, validation
from components.app_state.context import LIGHT_WORK, MODEL_WORK, AppContext
from components.live.live_tab import LiveSession, run_decode, summary
from components.widgets import projection_view

#: Shown while the target alone is measured (Stop ends it: "Stopped while measuring the target alone").
MEASURING = "*Measuring the target alone on this prompt (once)…*"


def finished(session: LiveSession | None) -> bool:
    """The session holds a run that ended by itself, and no newer click or Stop came since."""
    return (session is not None and bool(session.records) and session.request is not None
            and not (session.stopped or session.running or session.waiting))


def projection_entry(ctx: AppContext, label: str, temperature: float) -> AcceptanceEntry:
    """The measured vector that prices the tree a run without one would have drawn: the one picked on the page
    (its acceptance label), else the one measured nearest the run's temperature (code prompts first)."""
    picked = next((e for e in list_acceptance(ctx.assets_dir) if e.label == label), None)
    return picked or find_acceptance("code", float(temperature), ctx.assets_dir)


def words(ctx: AppContext, session: LiveSession | None):
    """(summary, session) once a run has ended: where its trees would pay, and a run of the target alone kept as
    its own measurement (drawn on the page as it ran)."""
    if not finished(session):
        return gr.skip(), gr.skip()
    if session.itself:
        rate = target_rate.live_rate(session.records)
        if rate is not None:
            ctx.target_rates.put(session.rate_key, rate)
    temperature = session.request.sampling.temperature
    session.projection = projection_view.projection_markdown(
        session.records, ctx, projection_entry(ctx, session.acceptance, temperature), temperature)
    return summary(session), session


def measure(ctx: AppContext, session: LiveSession | None):
    """Generator: (summary, session) while the target alone is measured on the run's prompt and settings (once
    per prompt and settings, cached), and after.  Stop ends it between the measuring runs' steps."""
    if not finished(session) or session.itself or (session.rate is not None and session.rate.measured) \
            or len(session.records) < 2:
        yield gr.skip(), gr.skip()
        return
    session.running = True   # Stop finds it on (stop_views)
    try:
        yield summary(session) + "  \n" + MEASURING, session
        alone = validation.engine_inputs(ctx, session.request.for_method("Target alone"))
        rate = target_rate.probe(
            lambda config: run_decode(ctx, replace(alone, config=config), lambda: session.stopped), alone.config)
        if session.stopped:   # Stop drew the summary ("while measuring the target alone"): its words stay the last
            yield gr.skip(), session
            return
        if rate is not None:
            ctx.target_rates.put(session.rate_key, rate)
            session.rate = rate
        yield summary(session), session
    finally:
        session.running = False


def wire(context: Callable[[], AppContext], run, v) -> None:
    """Chain the two events after ``run`` (a Live run's event): the words at once, outside the model's queue,
    then the measurement in it.  ``context()``: the run's context (exact mode's float32 target has its own),
    asked for only once the session holds a finished run."""
    def run_words(session: LiveSession | None):
        return words(context(), session) if finished(session) else (gr.skip(), gr.skip())

    def run_measure(session: LiveSession | None):
        yield from measure(context(), session) if finished(session) else iter([(gr.skip(), gr.skip())])

    def seconds(session) -> serving.PlannedSeconds:   # ZeroGPU's duration: the measuring runs' tokens
        return serving.gpu_seconds(target_rate.PROBE_TOKENS * target_rate.PROBE_ROUNDS, profile=context().profile)

    io = dict(inputs=v.session, outputs=[v.summary_md, v.session], api_visibility="private", show_progress="hidden")
    run.then(run_words, **io, **LIGHT_WORK).then(serving.on_gpu(run_measure, seconds), **io, **MODEL_WORK)
