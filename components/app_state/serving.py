"""Guards for a shared server: per-request caps, cancellable API calls, ZeroGPU.

What one request may ask is derived once, with the app state
(:func:`components.app_state.context.server_limits`); the checks before the queue live
in :mod:`components.app_state.validation`.

**Cancellation.**  Gradio runs a plain (non-generator) handler in a worker
thread.  Cancelling the request (``gradio_client``'s ``job.cancel()``) cancels
the asyncio task awaiting it and frees the queue slot, but the thread computes
on.  :func:`run_cancellable` runs the work in a thread with a stop flag the
work checks after every step (:func:`drain`); on cancellation it sets the flag
and keeps the slot until the work has stopped, so submitting and cancelling
cannot run many decodes at once.

Model-free work runs in the app's lanes (:mod:`components.app_state.lanes`).

**ZeroGPU.**  Where the ``spaces`` package reports ZeroGPU, :func:`on_gpu`
wraps the model work in ``spaces.GPU(duration=...)`` sized from the request and
the card's hardware profile (:func:`gpu_seconds`); elsewhere it returns the work
unchanged (the ``spaces`` package's own decorator also passes through outside Spaces).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import TypeVar

from sequoia.core.profiles.profile import HardwareProfile
from sequoia.runtime.measuring.finder import DEFAULT_ENTRY
from sequoia.runtime.measuring.gpu_call import plan_call

try:  # only on Hugging Face Spaces; nothing else here needs it
    import spaces  # type: ignore[import-not-found]
except ImportError:
    spaces = None

T = TypeVar("T")

#: The vector a call's duration is priced with when the request gives none (the page's default: code, T=0).
DEFAULT_ACCEPTANCE = DEFAULT_ENTRY.values


# ------------------------------------------------------------------ cancellation
def drain(steps: Iterator[T], stop: threading.Event) -> list[T]:
    """Every item of ``steps`` until it ends or ``stop`` is set; the generator is closed either way
    (an engine generator then frees its KV caches at once)."""
    out: list[T] = []
    with closing(steps):
        for item in steps:
            out.append(item)
            if stop.is_set():
                break
    return out


async def run_cancellable(work: Callable[[threading.Event], T]) -> T:
    """``work(stop)`` in a worker thread; if this request is cancelled, set ``stop`` and wait for the work
    to return before letting the cancellation through (the queue slot stays held until the model is free)."""
    stop = threading.Event()
    future = asyncio.get_running_loop().run_in_executor(None, work, stop)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        stop.set()
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                continue  # cancelled again (e.g. at shutdown): still wait, the work stops within a step
            except Exception:
                break
        raise


# ------------------------------------------------------------------ ZeroGPU
def zerogpu() -> bool:
    """True on a ZeroGPU Space (the ``spaces`` package is installed and says so)."""
    config = getattr(spaces, "config", None)
    return bool(getattr(getattr(config, "Config", None), "zero_gpu", False))


def gpu_seconds(max_new_tokens, n_methods: int = 1, profile: HardwareProfile | None = None,
                acceptance=None) -> int:
    """GPU seconds to ask ZeroGPU for: the request's expected time under this card's hardware profile (the
    tree it chooses, eager or with graphs captured in the call, :func:`sequoia.runtime.measuring.gpu_call.plan_call`), or
    a flat rate per token without one."""
    try:
        n = max(int(max_new_tokens), 0)
    except (TypeError, ValueError):
        n = 0
    return plan_call(n, profile, DEFAULT_ACCEPTANCE if acceptance is None else acceptance,
                     n_runs=max(int(n_methods), 1)).duration_s


def on_gpu(work: Callable[..., T], duration: Callable[..., int]) -> Callable[..., T]:
    """``work`` under ``spaces.GPU(duration=duration)`` on ZeroGPU (``duration`` gets the same arguments);
    ``work`` itself everywhere else."""
    if not zerogpu():
        return work
    return spaces.GPU(duration=duration)(work)
