"""Stop without Gradio's ``cancels``: the flags a tab's run and its Stop handler share through ``gr.State``.

A cancelled event could end with Gradio's red "Error" on its outputs and leave them as the run last drew
them.  So each tab's session (the Live tab's, Compare's, the distribution check's) carries these flags: a
click's light first event leaves a fresh session *waiting*, the run that follows *starts* it (unless Stop came
while it waited in the queue), Stop *stops* it, and the run reads ``stopped`` between steps and ends there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunFlags:
    """Where one click's run stands; Stop's handler and the run share the very object (``gr.State``)."""

    waiting: bool = False             # the click's run is queued and has not started
    running: bool = False             # the run's handler has started and not ended
    stopped: bool = False             # Stop was pressed: the run ends after its current step (or never starts)

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
