"""The events after a Live run (components/live/after_run.py), on the tiny random-weight pair: the words composed
from the finished run and the target alone's measurement are their own events, off the run's road (issue 58)."""

import inspect

import gradio as gr
import pytest

import app
from components.app_state.acceptance_choice import DEFAULT_ACCEPTANCE_LABEL
from components.app_state.decode_inputs import DecodeInputs
from components.live import after_run, live_tab


@pytest.fixture(scope="module")
def demo(tiny_app_pair, tmp_path_factory, lanes):
    return app.build_demo(tiny_app_pair, assets_dir=tmp_path_factory.mktemp("assets"), max_budget=24, lanes=lanes)


def _inputs(method="Chain", prompt="def f(x):") -> DecodeInputs:
    return DecodeInputs.from_page(prompt, method, 4, 3, 0.0, 1.0, 8, 0, DEFAULT_ACCEPTANCE_LABEL, True)


def _ran(ctx, inputs: DecodeInputs) -> live_tab.LiveSession:
    """A page's run as the page starts it: the first frame's session, then the run."""
    _, _, session, _ = live_tab.checked_first_frame(ctx, inputs, None)
    outs = list(live_tab.decode_stream(ctx, inputs, session))
    assert outs[-1][-1] is session and session.records and after_run.finished(session)
    return session


def test_the_run_ends_with_its_steps_and_the_events_after_it_add_the_words_and_the_measurement(demo):
    ctx = demo.sequoia_context
    ctx.target_rates = type(ctx.target_rates)()
    session = _ran(ctx, _inputs(prompt="def after(x):"))
    # The run's own road: no projection, no measuring (the handler never reaches them)
    assert session.projection == "" and len(ctx.target_rates) == 0 and session.rate is None   # no profile here
    assert session.request.prompt_ids and session.acceptance == DEFAULT_ACCEPTANCE_LABEL
    summary, same = after_run.words(ctx, session)
    assert same is session and "**Where this run would pay**" in summary
    frames = list(after_run.measure(ctx, session))
    assert after_run.MEASURING in frames[0][0] and not session.running     # said while it measures, then settled
    assert "the latter measured on this prompt" in frames[-1][0] and len(ctx.target_rates) == 1
    assert session.rate.source.startswith("measured on this prompt") and not session.rate.drawn
    # Measured once: the next run on the same prompt divides by it at once and measures nothing
    again = _ran(ctx, _inputs(prompt="def after(x):"))
    assert again.rate is session.rate and list(after_run.measure(ctx, again)) == [(gr.skip(), gr.skip())]


def test_a_run_of_the_target_alone_is_its_own_measurement(demo):
    ctx = demo.sequoia_context
    ctx.target_rates = type(ctx.target_rates)()
    session = _ran(ctx, _inputs("Target alone", prompt="def alone(x):"))
    after_run.words(ctx, session)
    kept = ctx.target_rates.get(session.rate_key, drawn=True)
    assert kept is not None and kept.drawn and "Live run of the target alone" in kept.source
    assert list(after_run.measure(ctx, session)) == [(gr.skip(), gr.skip())]   # nothing more to measure


def test_stop_ends_the_measurement_and_its_words_stay_the_last(demo):
    ctx = demo.sequoia_context
    ctx.target_rates = type(ctx.target_rates)()
    session = _ran(ctx, _inputs(prompt="def stop(x):"))
    frames = after_run.measure(ctx, session)
    assert after_run.MEASURING in next(frames)[0] and session.running   # Stop finds it on
    words = live_tab.stop_views(session)[3]
    assert "**Stopped** while measuring the target alone" in words
    assert list(frames) == [(gr.skip(), session)] and not session.running   # the run's steps end at the flag
    assert len(ctx.target_rates) == 0 and (session.rate is None or not session.rate.measured)


def test_a_new_click_or_stop_leaves_the_last_runs_events_nothing_to_do(demo):
    ctx = demo.sequoia_context
    session = _ran(ctx, _inputs(prompt="def new(x):"))
    live_tab.checked_first_frame(ctx, _inputs(prompt="def newer(x):"), session)   # a new click's first frame
    assert not after_run.finished(session)
    assert after_run.words(ctx, session) == (gr.skip(), gr.skip())
    assert list(after_run.measure(ctx, session)) == [(gr.skip(), gr.skip())]
    assert not after_run.finished(live_tab.LiveSession()) and not after_run.finished(None)   # nothing ran


def test_every_live_run_is_followed_by_both_events(demo):
    names = [f.name for f in demo.fns.values()]
    # the decode, the guided example, Run the fastest here, exact mode
    assert names.count("run_words") == names.count("run_measure") == 4
    # The run's road reaches neither: its module neither projects nor probes
    source = inspect.getsource(live_tab)
    assert "projection_view" not in source and "probe(" not in source

