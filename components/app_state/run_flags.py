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

import itertools
import multiprocessing
import threading
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
