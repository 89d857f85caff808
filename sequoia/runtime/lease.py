"""Who owns a pair's runners now: one owner at a time, visitors before background work.

A llama.cpp runner keeps one KV cache, so a new ``session()`` clears it and every older session refuses
its next call; a Hugging Face graph runner's slot cache and static graph inputs are shared the same way.
So model work that keeps sessions across calls (a generation, a profile's grid) must own the runners
from its first call to its last, and nothing else may start a session meanwhile.

:class:`ModelLease` is that ownership.  Unlike a lock it is not tied to a thread: a streamed generation is
resumed on whichever worker thread the server picks, and its steps run while the generation owns the
lease, wherever they run (:meth:`ModelLease.acting`).  ``with lease:`` takes it for the current thread
(re-entrant: work done inside, a generation consumed in the same thread included, joins that hold).

Two priorities.  A visitor's work (the default) waits only for the owner to finish; background work
(:meth:`ModelLease.background`: the profiler measuring this machine) also waits while any visitor
waits, and takes the lease for one measurement at a time, so a visitor's request starts within one
measurement of arriving.  ``turns`` counts changes of owner: background work that finds it moved on
since its last hold knows its sessions were cleared and makes new ones; ``visitor_turns`` counts the
visitors' holds (a profile measured while they decoded says so).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ModelLease:
    """The pair's one owner of model work (``ModelPair.lock``); see the module's docstring."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: object = None
        self._depth = 0
        self._last: object = None
        self._visitors_waiting = 0
        self._local = threading.local()
        self.turns = 0            # owner changes so far
        self.visitor_turns = 0    # visitors' holds so far

    # ------------------------------------------------------------------ owners
    def _me(self) -> object:
        """The owner the current thread acts for: a generation whose step it runs, else the thread itself."""
        return getattr(self._local, "owner", None) or ("thread", threading.get_ident())

    def held_here(self) -> object | None:
        """The owner the current thread acts for when that owner holds the lease now, else None."""
        me = self._me()
        with self._cond:
            return me if self._owner == me else None

    @property
    def owned(self) -> bool:
        """Someone holds the lease now."""
        with self._cond:
            return self._owner is not None

    def acquire(self, owner: object | None = None, background: bool = False, timeout: float | None = None) -> bool:
        """Take the lease for ``owner`` (None: the current thread's); True once held, False after ``timeout``
        seconds.  Re-entrant for the owner that holds it."""
        owner = self._me() if owner is None else owner
        with self._cond:
            if self._owner == owner:
                self._depth += 1
                return True
            if not background:
                self._visitors_waiting += 1
            try:
                free = (lambda: self._owner is None) if not background else \
                    (lambda: self._owner is None and self._visitors_waiting == 0)
                if not self._cond.wait_for(free, timeout):
                    return False
                self._owner, self._depth = owner, 1
                if owner != self._last:
                    self.turns += 1
                    self._last = owner
                if not background:
                    self.visitor_turns += 1
                return True
            finally:
                if not background:
                    self._visitors_waiting -= 1
                    self._cond.notify_all()   # a background waiter re-checks whether visitors still wait

    def release(self, owner: object | None = None) -> None:
        owner = self._me() if owner is None else owner
        with self._cond:
            if self._owner != owner:
                raise RuntimeError("the model lease is released by an owner that does not hold it")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()

    # ------------------------------------------------------------------ context managers
    def __enter__(self) -> ModelLease:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    @contextmanager
    def background(self) -> Iterator[ModelLease]:
        """Hold the lease for the current thread as background work (after every waiting visitor)."""
        self.acquire(background=True)
        try:
            yield self
        finally:
            self.release()

    @contextmanager
    def acting(self, owner: object) -> Iterator[None]:
        """Run the current thread on behalf of ``owner`` (a generation's step): ``with lease:`` inside joins
        that owner's hold instead of waiting for it."""
        before = getattr(self._local, "owner", None)
        self._local.owner = owner
        try:
            yield
        finally:
            self._local.owner = before
