"""Where model-free work runs, so that it never slows a decode: one low-priority thread, one DP process.

**Light work.**  :class:`LightLane` runs model-free work (DP solves, their figures) on one worker thread of
the lowest CPU priority (Linux nice 19): on a 2-core machine a DP solve then takes a core only while the
model's threads leave it idle, instead of halving a decode's speed.

**DP work.**  :class:`DPLane` runs ``/dp`` solves in one child process of the lowest CPU priority where fork
exists (:data:`DP_LANE`): measured on 2 cores (docs/serving.md), on the light-work *thread* the solves'
Python loops held the GIL the decode's thread needs between its torch calls, and a nice-19 holder of the GIL
is itself starved of CPU, so eight DP clients slowed three decode clients about 3x; a process has its own GIL.

Both are started on first use and belong to the app state (:class:`WorkLanes`, made with the app).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import TypeVar

from components.app_state.memo import RequestMemo

T = TypeVar("T")

#: Linux nice value of the light-work thread and the DP process (19: runs when the model leaves a core idle).
LIGHT_NICE = 19
#: "process": DP solves run in a forked child; "thread": on the light-work thread, where fork is not available.
DP_LANE = "process" if "fork" in multiprocessing.get_all_start_methods() else "thread"
#: Parsed ``/dp`` requests remembered between the validator's parse and the handler's.
DP_MEMO_SIZE = 256


class LightLane:
    """One low-priority worker thread, started on first use."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.priority = "not started"   # once started: "nice 19", or why the priority stayed plain

    def run(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the light-work thread and return its result (its errors propagate)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sequoia-light",
                                                initializer=_lower_priority, initargs=(self,))
        return self._pool.submit(work).result()


def _lower_priority(lane: LightLane) -> None:
    try:  # per thread on Linux: the model's threads keep their priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LIGHT_NICE)
        lane.priority = f"nice {LIGHT_NICE}"
    except (AttributeError, OSError) as exc:  # another OS, or not permitted: plain priority, still one thread
        lane.priority = f"plain ({type(exc).__name__}: {exc})"


class DPLane:
    """The DP process (:data:`DP_LANE`), one job at a time; the light thread where there is no fork."""

    def __init__(self, light: LightLane) -> None:
        self.light = light
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def run(self, work: Callable[..., T], *args) -> T:
        """``work(*args)`` in the DP lane; its errors propagate."""
        if DP_LANE != "process":
            return self.light.run(lambda: work(*args))
        pool = self.start()
        try:
            return pool.submit(work, *args).result()
        except BrokenProcessPool:  # the child died (killed for memory?): start a new one next time, answer now
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            return self.light.run(lambda: work(*args))

    def prepare(self) -> None:
        """Fork the DP process now where DP work runs in one (the DP tab's build: before the server listens)."""
        if DP_LANE == "process":
            self.start()

    def start(self) -> ProcessPoolExecutor:
        """The DP process, forked now if it is not running (the DP tab's build calls this before the server
        listens and before the model pair loads, so the child holds neither the socket nor the weights)."""
        with self._lock:
            if self._pool is None:
                # fork: the child starts at once with the parent's modules loaded (no second import of torch); it
                # only runs numpy, never torch, so the parent's thread pools do not matter to it.
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"),
                                                 initializer=_dp_worker_init, initargs=(os.getpid(),))
                self._pool.submit(os.getpid).result()  # fork now, not at the first request
            return self._pool


def _dp_worker_init(parent: int) -> None:
    """In the child: lowest priority, and exit when the server does (a forked child keeps the server's pipes
    open, so it would not see them close)."""
    try:
        os.nice(LIGHT_NICE)
    except (AttributeError, OSError):
        pass
    threading.Thread(target=_exit_with, args=(parent,), name="sequoia-dp-watchdog", daemon=True).start()


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _new_dp_lane() -> DPLane:
    return DPLane(LightLane())


@dataclass
class WorkLanes:
    """The app's model-free work: the DP lane (with its light thread) and the parsed DP requests."""

    dp: DPLane = field(default_factory=_new_dp_lane)
    dp_requests: RequestMemo = field(default_factory=lambda: RequestMemo(DP_MEMO_SIZE))

    @property
    def light(self) -> LightLane:
        return self.dp.light
