"""Stop's words land last: a run's frame in flight is queued before Stop's words, and a frame the run drew before it
saw Stop never lands after them (components.app_state.run_flags).

The page plays the part of Gradio's queue: it takes a frame from the handler, queues it (appends it to what the
page shows) and only then asks for the next, as ``gradio.queueing`` does; Stop's handler appends its words when it
returns.  Each test waits on events, never on time."""

from __future__ import annotations

import threading

from components.app_state.run_flags import (Redraw, RunFlags, frames_before_stop, stop_after_frame,
                                            stop_lands_last)


def test_stop_waits_for_the_frame_in_flight_and_its_words_land_after_it():
    session = RunFlags(running=True)
    shown: list[str] = []
    drawn, queued = threading.Event(), threading.Event()

    def run():
        yield "step 1"                      # drawn before Stop
        yield Redraw(("stopped views",))    # the run saw Stop

    frames = frames_before_stop(session, run())
    frame = next(frames)                   # Gradio postprocesses it: in flight
    drawn.set()

    def stop():
        shown.append("Stop's words" if stop_after_frame(session, timeout_s=60) else "no run on")
        queued.set()

    stopper = threading.Thread(target=stop)
    stopper.start()
    assert not queued.wait(0.2), "Stop returned while the run's frame was in flight"
    shown.append(frame)                    # the frame queued, then the generator resumed
    assert next(frames) == ("stopped views",)
    assert queued.wait(60)
    assert shown == ["step 1", "Stop's words"]


def test_a_frame_drawn_before_stop_is_dropped_and_the_redraw_passes_as_a_tuple():
    session = RunFlags(running=True)

    def run():
        yield "step 1"
        session.stop()                     # Stop lands while the run draws its next frame
        yield "step 2 (drawn before the run saw Stop)"
        yield Redraw(("stopped views",))

    out = list(frames_before_stop(session, run()))
    assert out == ["step 1", ("stopped views",)]
    assert type(out[1]) is tuple           # Gradio gets a plain tuple


def test_stop_with_no_run_on_changes_nothing_and_none_passes_frames_through():
    idle = RunFlags()
    assert not stop_after_frame(idle) and not idle.stopped
    assert not stop_after_frame(None)
    assert list(frames_before_stop(None, iter(["a", "b"]))) == ["a", "b"]


def test_stop_without_a_frame_in_flight_returns_at_once():
    session = RunFlags(running=True)
    frames = frames_before_stop(session, iter(["a", "b"]))
    assert next(frames) == "a"
    assert next(frames) == "b"             # "a" queued; "b" in flight until the next ask
    assert list(frames) == []              # the run ended: nothing in flight
    assert stop_after_frame(session, timeout_s=60)


def test_the_wrapped_handler_finds_the_session_among_its_arguments():
    session = RunFlags(running=True)

    def handler(prompt, state):
        yield prompt
        state.stop()
        yield "late"
        yield Redraw((prompt, "stopped"))

    wrapped = stop_lands_last(handler)
    assert list(wrapped("p", session)) == ["p", ("p", "stopped")]
    assert list(stop_lands_last(lambda prompt: iter([prompt]))("q")) == ["q"]


def test_a_run_that_starts_a_session_of_its_own_is_gated_by_that_one():
    """A Live click while the stopped run ended its step: the new run gets the stopped session and starts one of
    its own, drawn in its first frame; its frames pass (the stopped one's Stop is not theirs)."""
    old = RunFlags(running=True)
    old.stop()
    new = RunFlags(running=True)

    def run():
        yield ("first frame", new)
        yield ("step 1", new)

    assert list(frames_before_stop(old, run())) == [("first frame", new), ("step 1", new)]
