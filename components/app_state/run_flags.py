"""Stop without Gradio's ``cancels``: the flags a tab's run and its Stop handler share through ``gr.State``.

A cancelled event could end with Gradio's red "Error" on its outputs and leave them as the run last drew
them.  So each tab's session (the Live tab's, Compare's, the distribution check's) carries these flags: a
click's light first event leaves a fresh session *waiting*, the run that follows *starts* it (unless Stop came
while it waited in the queue), Stop *stops* it, and the run reads ``stopped`` between steps and ends there.

**Across processes.**  On ZeroGPU each model call runs in a process forked for it (``spaces.GPU``): the run
gets a pickled copy of the session, and Stop's handler, in the server's process, flags the original.  So the
flags do not live in the session object: they live in shared memory mapped before any fork (this module's
import), at a slot the session owns, and every copy of a session, in any process forked from the server,
reads and writes the same three flags.  Each flag is one aligned 8-byte word holding the owner's id when set
(a single store: no lock, which a fork could catch held); a slot reused by a later session reads as unset
for every older one.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import threading
from collections.abc import Callable, Iterator
from dataclasses import InitVar, dataclass, field

#: Sessions whose flags can be live at once (a slot is reused after this many newer sessions).
SLOTS = 4096
# One word per slot and flag, in memory every process forked after this import shares (fork's start method:
# RawArray maps an anonymous shared file; the server's process is the one ZeroGPU forks its workers from).
_WORDS = multiprocessing.get_context("fork").RawArray("q", 3 * SLOTS)
_WAITING, _RUNNING, _STOPPED = range(3)
_ids = itertools.count(1)
_ids_lock = threading.Lock()


def _new_id() -> int:
    with _ids_lock:
        owner = next(_ids)
    for flag in (_WAITING, _RUNNING, _STOPPED):
        _WORDS[3 * (owner % SLOTS) + flag] = -owner   # the slot is this session's now: every flag unset
    return owner


@dataclass
class RunFlags:
    """Where one click's run stands; Stop's handler and the run share it (``gr.State``), in one process or
    in processes forked from the server (the flags live in shared memory: the properties below)."""

    waiting: InitVar[bool] = False    # the click's run is queued and has not started
    running: InitVar[bool] = False    # the run's handler has started and not ended
    stopped: InitVar[bool] = False    # Stop was pressed: the run ends after its current step (or never starts)
    owner: int = field(default=0, init=False, repr=False)   # this session's id: its slot is owner % SLOTS

    def __post_init__(self, waiting: bool, running: bool, stopped: bool) -> None:
        self.owner = _new_id()
        self.waiting, self.running, self.stopped = waiting, running, stopped

    def _get(self, flag: int) -> bool:
        return _WORDS[3 * (self.owner % SLOTS) + flag] == self.owner

    def _set(self, flag: int, value: bool) -> None:
        word = 3 * (self.owner % SLOTS) + flag
        if abs(_WORDS[word]) == self.owner:          # a slot a newer session took is left to it
            _WORDS[word] = self.owner if value else -self.owner

    @property
    def on(self) -> bool:
        """A run is queued or running."""
        return self.running or self.waiting

    def stop(self) -> bool:
        """Stop pressed: flag the run that is on; False (nothing changes) when none is."""
        if not self.on:
            return False
        self.stopped = True
        return True

    def settle(self) -> None:
        """The run is over however it ended (a GPU call aborted at its duration included): neither waiting
        nor running, so the page's next click starts a new one."""
        self.waiting = self.running = False


def _flag(index: int) -> property:
    return property(lambda self: self._get(index), lambda self, value: self._set(index, bool(value)))


# Set after the class is made: the dataclass keeps the InitVars' defaults, every instance reads shared memory.
RunFlags.waiting, RunFlags.running, RunFlags.stopped = _flag(_WAITING), _flag(_RUNNING), _flag(_STOPPED)


class StopFlag(RunFlags):
    """A ``threading.Event``'s face (``set``, ``is_set``) on a shared stop flag: what a cancellable API call
    hands its work, which may run in a process forked for it (ZeroGPU), where an Event's lock cannot go."""

    def set(self) -> None:
        self.stopped = True

    def is_set(self) -> bool:
        return self.stopped


# --- Stop's words land last ------------------------------------------------------------------------------------
# A run checks its stop flag, draws a frame and yields it; Gradio postprocesses the frame (a Plotly figure: tens of
# milliseconds, more on a busy machine) and only then queues it for the page.  Stop's handler, pressed in between,
# could queue its words first, and the run's older frame then landed over them until the run's next frame (seen
# in the distribution check under a full test run's load: "Stopped" gone a moment after the page settled).  So the
# run's frames pass through :func:`frames_before_stop`, which marks each one in flight until Gradio asks for the
# next (it queues a frame before it resumes the generator), and :func:`stop_after_frame` waits for the frame in
# flight before Stop's words go.  A frame drawn before the run saw the flag and reaching the page's side after
# Stop is dropped; a :class:`Redraw` (the stopped views a run draws once it sees the flag) always passes.
# The marks are attributes of the session object, which Stop's handler and the run's frames share in the
# server's process (gr.State hands both the same object), also where the run itself is in a forked one.

_frames = threading.Condition()
#: The longest Stop's handler waits for a frame in flight (a frame is queued within milliseconds of its
#: postprocessing; this bounds a page that closed with one pending, whose generator Gradio never resumes).
FRAME_WAIT_S = 2.0


class Redraw(tuple):
    """A frame a run draws after it saw Stop (the stopped views, or skips): it passes :func:`frames_before_stop`
    after Stop, where the run's older frames are dropped."""


def frames_before_stop(session: RunFlags | None, frames: Iterator) -> Iterator:
    """``frames`` (a run's outputs) as Gradio should see them: each marked in flight until the next is asked for,
    and none drawn before the run saw its session's Stop once Stop is pressed (a :class:`Redraw` passes, as a
    plain tuple).  ``session``: the page's; a frame that carries a session (the Live run's ``gr.State`` output)
    makes that one the run's (a click while the last run ended its step starts a session of its own).  None and
    no session in the frames: ``frames`` unchanged."""
    for frame in frames:
        drawn = next((x for x in frame if isinstance(x, RunFlags)), None) if isinstance(frame, tuple) else None
        session = drawn or session
        if session is None:
            yield frame
            continue
        with _frames:
            if session.stopped and not isinstance(frame, Redraw):
                continue
            session.frame_in_flight = True
        try:
            yield tuple(frame) if isinstance(frame, Redraw) else frame
        finally:
            with _frames:
                session.frame_in_flight = False
                session.frames_queued = getattr(session, "frames_queued", 0) + 1
                _frames.notify_all()


def stop_after_frame(session: RunFlags | None, timeout_s: float = FRAME_WAIT_S) -> bool:
    """Stop pressed on ``session`` (:meth:`RunFlags.stop`), returning once the run's frame in flight when it was
    pressed, if any, is queued for the page, so that the words Stop's handler returns next land after it; False
    when no run is on."""
    if session is None:
        return False
    with _frames:
        if not session.stop():
            return False
        if getattr(session, "frame_in_flight", False):
            mark = getattr(session, "frames_queued", 0)
            _frames.wait_for(lambda: getattr(session, "frames_queued", 0) > mark, timeout_s)
    return True


def sessions_in(*values) -> Iterator[RunFlags]:
    """The sessions (run flags) among a handler's argument ``values``."""
    return (value for value in values if isinstance(value, RunFlags))


def stop_lands_last(handler: Callable[..., Iterator]) -> Callable[..., Iterator]:
    """``handler`` (a tab's generator handler; the page's session among its arguments) with its frames passed
    through :func:`frames_before_stop`."""
    @functools.wraps(handler)
    def run(*args, **kwargs):
        session = next(sessions_in(*args, *kwargs.values()), None)
        yield from frames_before_stop(session, handler(*args, **kwargs))
    return run
