"""The model load as the page sees it: progress while it runs, and the error a handler shows meanwhile."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from sequoia._meta import ProgressFn


class ModelsNotReady(ValueError):
    """The model pair is still loading, or failed to load; the message says which."""


class LoadCancelled(RuntimeError):
    """A load's progress report found it cancelled (:attr:`LoadStatus.cancelled`)."""


@dataclass
class LoadStatus:
    """Progress of the model load, written by the loader and read by the page banner.

    Callable as the loader's ``progress(fraction, description)``; ``listener``
    (e.g. a console printer) sees every update too.
    """

    fraction: float = 0.0
    description: str = "waiting to start"
    error: str | None = None
    ready: bool = False
    started: float | None = None            # time.monotonic() when loading began
    listener: ProgressFn | None = field(default=None, repr=False)
    #: Set by whoever no longer wants the load (a stopped race): the loader's next report raises LoadCancelled,
    #: so the load ends at its next stage instead of running on unseen.
    cancelled: threading.Event | None = field(default=None, repr=False)

    def __call__(self, fraction: float, description: str) -> None:
        if self.cancelled is not None and self.cancelled.is_set():
            raise LoadCancelled(f"load cancelled before: {description}")
        if self.started is None:
            self.started = time.monotonic()
        self.fraction, self.description = min(max(float(fraction), 0.0), 1.0), str(description)
        if self.listener is not None:
            self.listener(self.fraction, self.description)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started if self.started is not None else 0.0

    def summary(self) -> str:
        """One line, e.g. "42%, converting the target, 35 s"."""
        return f"{self.fraction:.0%}, {self.description}, {self.elapsed_s:.0f} s"
