"""How often a streaming handler updates the page (shared by the Live and Compare tabs).

A browser re-rendering Plotly figures for every step of a fast method (target
only: ~10 steps/s) falls behind and stops answering clicks, Stop included, so
the handlers send a frame at most every :data:`FRAME_S`.

At GPU speed (a step in tens of milliseconds) building those frames (text HTML,
Plotly figures) costs more than a step, so the Live tab runs the engine ahead in
a worker thread (:class:`Ahead`) and builds each frame from everything that has
arrived since the last one (:func:`paced`): the engine never waits for the page.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, nullcontext
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")

#: The text and the summary line: at most one update this often while streaming.
FRAME_S = 0.2


@dataclass
class Throttle:
    """``due(now)`` is True at most once every ``period_s`` (and always the first time, or when forced)."""

    period_s: float
    last: float = float("-inf")

    def due(self, now: float, force: bool = False) -> bool:
        if force or now - self.last >= self.period_s:
            self.last = now
            return True
        return False


# ------------------------------------------------------------------ the engine ahead of the page
@dataclass(frozen=True)
class Frame(Generic[T]):
    """What arrived since the previous frame (in order); ``final``: the stream has ended."""

    items: list[T]
    final: bool


class Source(Protocol[T]):
    def wait_new(self, timeout: float | None) -> tuple[list[T], bool]:
        """The items that arrived since the last call, and whether the stream has ended.  Returns when it has
        ended, or after ``timeout`` seconds, or (``timeout`` None) as soon as something has arrived."""

    def close(self) -> None: ...


class Ahead(Generic[T]):
    """``steps`` drained by a worker thread into a list, so a slow consumer never holds the producer back.

    ``close()`` asks the worker to stop after its current item and waits for it: ``steps`` is closed in the
    worker's own thread (an engine generator then frees its KV caches), and the model is free on return.
    """

    def __init__(self, steps: Iterator[T]) -> None:
        self._cv = threading.Condition()
        self._items: list[T] = []
        self._done = False
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(steps,), name="sequoia-ahead", daemon=True)
        self._thread.start()

    def _run(self, steps: Iterator[T]) -> None:
        try:
            with closing(steps) if hasattr(steps, "close") else nullcontext():
                for item in steps:
                    with self._cv:
                        self._items.append(item)
                        self._cv.notify_all()
                    if self._stop.is_set():
                        break
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised in its thread
            self._error = exc
        finally:
            with self._cv:
                self._done = True
                self._cv.notify_all()

    def wait_new(self, timeout: float | None) -> tuple[list[T], bool]:
        with self._cv:
            if timeout is None:
                self._cv.wait_for(lambda: self._items or self._done)
            elif timeout > 0:
                self._cv.wait_for(lambda: self._done, timeout)
            items, self._items = self._items, []
            if self._done and self._error is not None:
                raise self._error
            return items, self._done

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def paced(source: Source[T] | Iterator[T], period_s: float = FRAME_S,
          clock: Callable[[], float] = time.monotonic) -> Iterator[Frame[T]]:
    """Frames of ``source`` (an iterator runs :class:`Ahead`, in a worker thread): at most one every
    ``period_s`` by ``clock``, each with every item since the one before, and the final one always (at once,
    however recent the one before).  The first frame goes as soon as the first item arrives.  Closing this
    generator closes the source."""
    src = source if hasattr(source, "wait_new") else Ahead(source)
    last, pending = float("-inf"), []
    try:
        while True:
            due = last + period_s
            items, done = src.wait_new(max(0.0, due - clock()) if pending else None)
            pending += items
            if done:
                yield Frame(pending, True)
                return
            now = clock()
            if pending and now >= due:
                yield Frame(pending, False)
                last, pending = now, []
    finally:
        src.close()
