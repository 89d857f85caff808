"""Guards for a shared server: per-request caps, cancellable API calls, ZeroGPU.

What one request may ask is derived once, with the app state
(:func:`components.app_state.context.server_limits`); the checks before the queue live
in :mod:`components.app_state.validation`.

**Cancellation.**  Gradio runs a plain (non-generator) handler in a worker thread.  Cancelling the request
(``gradio_client``'s ``job.cancel()``) cancels the asyncio task awaiting it and frees the queue slot, but the thread
computes on.  :func:`run_cancellable` runs the work in a thread with a stop flag the work checks after every step
(:func:`drain`); on cancellation it sets the flag and keeps the slot until the work has stopped, so submitting and
cancelling cannot run many decodes at once.

Model-free work runs in the app's lanes (:mod:`components.app_state.lanes`).

**ZeroGPU.**  Where the ``spaces`` package reports ZeroGPU, :func:`on_gpu`
wraps the model work in ``spaces.GPU(duration=...)`` sized from the request and
the card's hardware profile (:func:`gpu_seconds`); elsewhere it returns the work
unchanged (the ``spaces`` package's own decorator also passes through outside Spaces).
ZeroGPU runs each call in a worker process forked from the server for it (reused
only while alive and idle): what the call leaves behind in memory (caches, captured
graphs, a session's records) is gone with that process.  So a call gets its inputs
pickled, gives back only what it yields or returns, and a session's run flags live
in shared memory (:mod:`components.app_state.run_flags`); once a call ends however
it ended, the server settles the sessions it was given.

**The stand-in.**  :class:`ZeroGPUStandIn` behaves as ZeroGPU does on a machine without it: every call in a
process forked for it, its inputs and outputs pickled, the call killed at its duration ("GPU task aborted"), the
models usable inside calls only (:meth:`ZeroGPUStandIn.guard`).  ``SEQUOIA_ZEROGPU_STANDIN=1 python app.py``
serves the page under it; the tests drive a decode, a comparison and the distribution check through it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import functools
import inspect
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, suppress
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import TypeVar

from components.app_state import pair_room
from components.app_state.run_flags import StopFlag, sessions_in

from sequoia.core.profiles.profile import HardwareProfile
from sequoia.runtime.measuring.finder import DEFAULT_ENTRY
from sequoia.runtime.forking import start_from_a_fresh_thread
from sequoia.runtime.measuring.gpu_call import CallPlan, eager_of, plan_call, proxy_profile, replays

try:  # only on Hugging Face Spaces; nothing else here needs it
    import spaces  # type: ignore[import-not-found]
except ImportError:
    spaces = None

#: The environment variable that serves the page under :class:`ZeroGPUStandIn` (``python app.py``).
STANDIN_ENV = "SEQUOIA_ZEROGPU_STANDIN"

T = TypeVar("T")

#: The vector a call's duration is priced with when the request gives none (the page's default: code, T=0).
DEFAULT_ACCEPTANCE = DEFAULT_ENTRY.values


# ------------------------------------------------------------------ cancellation
def drain(steps: Iterator[T], stop: threading.Event | StopFlag) -> list[T]:
    """Every item of ``steps`` until it ends or ``stop`` is set; the generator is closed either way
    (an engine generator then frees its KV caches at once)."""
    out: list[T] = []
    with closing(steps):
        for item in steps:
            out.append(item)
            if stop.is_set():
                break
    return out


async def run_cancellable(work: Callable[[StopFlag], T]) -> T:
    """``work(stop)`` in a worker thread; if this request is cancelled, set ``stop`` and wait for the work
    to return before letting the cancellation through (the queue slot stays held until the model is free).
    ``stop`` is a shared flag with an Event's face (the work may run in a process forked for it: ZeroGPU)."""
    stop = StopFlag(running=True)
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


class PlannedSeconds(int):
    """The seconds a call asks ZeroGPU for (an int, as ``spaces.GPU(duration=...)`` wants), carrying the
    :class:`~sequoia.runtime.measuring.gpu_call.CallPlan` they came from (whether the call captures graphs)."""

    plan: CallPlan

    def __new__(cls, plan: CallPlan) -> "PlannedSeconds":
        out = super().__new__(cls, plan.duration_s)
        out.plan = plan
        return out


@dataclass(frozen=True)
class CallOrder:
    """What a call is sent with, beside its arguments: its duration and whether it captures graphs (why)."""

    duration_s: int
    capture: bool
    reason: str
    emulate: bool = False     # off CUDA, capture anyway with emulated replays (SEQUOIA_CALL_GRAPHS=1: tests, checks)


def gpu_seconds(max_new_tokens, n_methods: int = 1, profile: HardwareProfile | None = None,
                acceptance=None, tree: tuple[int, int] | None = None) -> PlannedSeconds:
    """GPU seconds to ask ZeroGPU for: the request's expected time under this card's hardware profile (the
    tree it chooses, eager or with graphs captured in the call, :func:`sequoia.runtime.measuring.gpu_call.plan_call`),
    priced with the H100's costs where the card has no profile yet (:func:`~sequoia.runtime.measuring.gpu_call.proxy_profile`);
    the plan rides along (:class:`PlannedSeconds`)."""
    try:
        n = max(int(max_new_tokens), 0)
    except (TypeError, ValueError):
        n = 0
    try:
        tree = (int(tree[0]), int(tree[1])) if tree else None
    except (TypeError, ValueError):
        tree = None
    proxy = zerogpu() and (profile is None or replays(profile))
    # On ZeroGPU a card not profiled is priced by the H100's graph replays (the stand-in the trees are chosen
    # on, gpu_call.replays), eager as those times the H100's eager/graph ratio.
    priced = (proxy_profile() if profile is None else eager_of(profile)) if proxy else profile
    plan = plan_call(n, priced,
                     DEFAULT_ACCEPTANCE if acceptance is None else acceptance, n_runs=max(int(n_methods), 1),
                     tree=tree, graphs_ok=pair_room.call_graphs_mode() != "0")
    if proxy:
        plan = replace(plan, reason=f"{plan.reason}; priced as {priced.device} (no profile of this card yet)")
    return PlannedSeconds(plan)


def zerogpu_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a ZeroGPU Space serves with: the Hugging Face runtime (the GPU's; llama.cpp's worker
    threads do not survive the fork each GPU call runs in, so a call on it would hang until aborted), a clear
    ValueError for another one named; no CUDA graphs at load (no card outside a call: each call captures its own,
    components.app_state.pair_room); no streaming of the target unless SEQUOIA_OFFLOAD=1 says so."""
    named = (env.get("SEQUOIA_BACKEND") or "").strip().lower()
    if named and named != "hf":
        raise ValueError(f"SEQUOIA_BACKEND={named!r} cannot serve on ZeroGPU: each GPU call runs in a process forked "
                         "for it, where llama.cpp's worker threads are gone (a call would hang); use hf or unset it")
    # No offload decision from the card's free memory either: outside a call CUDA is emulated (no device to ask).
    return {"SEQUOIA_OFFLOAD": "0", **env, "SEQUOIA_BACKEND": "hf", "SEQUOIA_GRAPHS": "0"}


def call_order(seconds) -> CallOrder:
    """The order a call is sent with: ``seconds`` as asked, capture as its plan says (SEQUOIA_CALL_GRAPHS=0 or
    1 overrides it; a bare number of seconds: no plan, no capture)."""
    mode = pair_room.call_graphs_mode()
    plan = getattr(seconds, "plan", None)
    if mode == "0":
        return CallOrder(int(seconds), False, "SEQUOIA_CALL_GRAPHS=0 keeps every call eager")
    if mode == "1":
        return CallOrder(int(seconds), True, "SEQUOIA_CALL_GRAPHS=1: every call captures", emulate=True)
    if plan is None:
        return CallOrder(int(seconds), False, "this call's work is not priced in steps")
    verdict = "captures pay" if plan.capture else "capturing would not pay"
    why = (f"{verdict} for {plan.steps} expected steps (eager {plan.eager_s:.1f} s; with {plan.graphs} graphs "
           f"captured {plan.graphs_s:.1f} s, capture time a guess until measured on this card)")
    return CallOrder(int(seconds), plan.capture, why)


def on_gpu(work: Callable[..., T], duration: Callable[..., int]) -> Callable[..., T]:
    """``work`` under ``spaces.GPU(duration=duration)`` on ZeroGPU (``duration`` gets the same arguments),
    the run flags of every session among its arguments settled once the call ends (the call's process had
    only copies of them); ``work`` itself everywhere else.  Inside the call the work runs in a
    :func:`components.app_state.pair_room.entered` scope: the pair it gets captures the call's graphs when
    the call's plan (``duration``'s :class:`PlannedSeconds`) says capturing pays, and drops them at its end."""
    if not zerogpu():
        return work
    gpu_work = spaces.GPU(duration=lambda order, *a, **k: order.duration_s)(_in_call(work))
    if inspect.isgeneratorfunction(work):
        @functools.wraps(work)
        def stream(*args, **kwargs):
            try:
                yield from gpu_work(call_order(duration(*args, **kwargs)), *args, **kwargs)
            finally:
                _settle(args, kwargs)
        return stream

    @functools.wraps(work)
    def call(*args, **kwargs):
        try:
            return gpu_work(call_order(duration(*args, **kwargs)), *args, **kwargs)
        finally:
            _settle(args, kwargs)
    return call


def _in_call(work: Callable[..., T]) -> Callable[..., T]:
    """``work`` taking a :class:`CallOrder` first, run inside the call's scope (in the call's process)."""
    if inspect.isgeneratorfunction(work):
        def stream(order: CallOrder, *args, **kwargs):
            with pair_room.entered(order.capture, order.reason, order.emulate):
                yield from work(*args, **kwargs)
        stream.__name__ = getattr(work, "__name__", "call")
        return stream

    def call(order: CallOrder, *args, **kwargs):
        with pair_room.entered(order.capture, order.reason, order.emulate):
            return work(*args, **kwargs)
    call.__name__ = getattr(work, "__name__", "call")
    return call


def _settle(args, kwargs) -> None:
    for session in sessions_in(*args, *kwargs.values()):
        session.settle()


# ------------------------------------------------------------------ the ZeroGPU stand-in
class GPUTaskAborted(RuntimeError):
    """A stand-in call ran past its duration and was killed, as ZeroGPU aborts one."""


@dataclass
class GPUCall:
    """One stand-in call, as the tests and the console read it."""

    name: str
    duration_s: int            # what the call asked for
    seconds: float = 0.0       # what it took, the fork and the transfers included
    outcome: str = "running"   # "returned" | "raised <type>" | "aborted" | "closed"
    pid: int = 0               # the process it ran in


#: Set in a stand-in call's process only (a forked process's own environment: no module state).
INSIDE_ENV = "SEQUOIA_IN_GPU_CALL"


def in_gpu_call() -> bool:
    """True in a stand-in call's process (where ZeroGPU attaches the GPU)."""
    return os.environ.get(INSIDE_ENV) == "1"


class ZeroGPUStandIn:
    """The ``spaces`` package's ZeroGPU surface (``config.Config.zero_gpu``, ``GPU(duration=...)``) for a machine
    without ZeroGPU: each call in a process forked from this one for it, its arguments pickled as ZeroGPU
    sends them (what does not pickle fails here as it would there), what it yields or returns pickled back,
    killed at ``grace`` times its duration (ZeroGPU: 1; a hang guard where tests share a CPU: the duration is
    priced for a card, or this CPU quiet).  ``calls`` records each call."""

    def __init__(self, verbose: bool = False, grace: float = 1.0) -> None:
        self.config = SimpleNamespace(Config=SimpleNamespace(zero_gpu=True))
        self.calls: list[GPUCall] = []
        self.verbose = verbose            # a line on the console per call
        self.grace = grace

    def GPU(self, fn=None, *, duration=60):  # noqa: N802 - the name spaces gives it
        if fn is None:
            return functools.partial(self.GPU, duration=duration)
        seconds = duration if callable(duration) else (lambda *a, **k: duration)
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def stream(*args, **kwargs):
                yield from self._run(fn, args, kwargs, int(seconds(*args, **kwargs)), streaming=True)
            return stream

        @functools.wraps(fn)
        def call(*args, **kwargs):
            run = self._run(fn, args, kwargs, int(seconds(*args, **kwargs)), streaming=False)
            while True:
                try:
                    next(run)
                except StopIteration as done:
                    return done.value
        return call

    def dump_running(self) -> list[int]:
        """Ask every running call's process to print its Python stacks to its stderr (a stalled call says where
        it waits); the pids asked."""
        asked = [call.pid for call in self.calls if call.outcome == "running" and call.pid]
        for pid in asked:
            with suppress(ProcessLookupError):   # ended meanwhile
                os.kill(pid, signal.SIGUSR1)
        return asked

    def guard(self, runner) -> None:
        """Make ``runner`` refuse work outside a call (ZeroGPU: no CUDA outside ``@spaces.GPU``)."""
        session = runner.session

        def guarded():
            if not in_gpu_call():
                raise RuntimeError(f"{runner.name}: model work outside a @spaces.GPU call (no CUDA there on ZeroGPU)")
            return session()
        runner.session = guarded

    def _run(self, fn, args, kwargs, duration: int, streaming: bool):
        record = GPUCall(getattr(fn, "__name__", "call"), duration)
        self.calls.append(record)
        payload = pickle.dumps((args, kwargs))      # ZeroGPU sends the arguments to its worker pickled
        ctx = multiprocessing.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        start = time.monotonic()
        child = ctx.Process(target=_child, args=(fn, payload, send, streaming), daemon=True)
        start_from_a_fresh_thread(child)          # no OpenMP pool of a server thread in it
        record.pid = child.pid
        send.close()
        limit = duration * self.grace
        try:
            while True:
                left = limit - (time.monotonic() - start)
                if left <= 0 or not receive.poll(left):
                    record.outcome = "aborted"
                    raise GPUTaskAborted(f"GPU task aborted: the call ran past {self.grace:g}x its {duration} s"
                                         if self.grace != 1 else f"GPU task aborted: the call ran past its {duration} s")
                try:
                    kind, value = pickle.loads(receive.recv_bytes())
                except EOFError:
                    record.outcome = "raised EOFError"
                    raise RuntimeError(f"the GPU call's process ended with exit code {child.exitcode}") from None
                if kind == "yield":
                    yield value
                    continue
                if kind == "error":
                    record.outcome = f"raised {type(value).__name__}"
                    raise value
                record.outcome = "returned"
                return value
        except GeneratorExit:
            record.outcome = "closed"
            raise
        finally:
            record.seconds = time.monotonic() - start
            if child.is_alive():
                child.kill()
            child.join(5)
            receive.close()
            if self.verbose:
                print(f"ZeroGPU stand-in: {record.name} asked {duration} s, took {record.seconds:.1f} s in process "
                      f"{record.pid}: {record.outcome}", flush=True)


def _child(fn, payload: bytes, send, streaming: bool) -> None:
    """A stand-in call's process: run ``fn`` on the unpickled arguments, send back what it yields, returns or
    raises (an exception that does not pickle goes back as a RuntimeError with its text)."""
    os.environ[INSIDE_ENV] = "1"
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # ZeroGPUStandIn.dump_running: where a call stalls

    def put(kind, value) -> None:
        try:
            data = pickle.dumps((kind, value))
        except Exception as exc:   # noqa: BLE001 - said to the server instead
            if kind != "error":
                raise TypeError(f"a GPU call's {kind}ed value does not pickle: {exc}") from exc
            data = pickle.dumps((kind, RuntimeError(f"{type(value).__name__}: {value}")))
        send.send_bytes(data)

    try:
        args, kwargs = pickle.loads(payload)
        if streaming:
            for item in fn(*args, **kwargs):
                put("yield", item)
            put("return", None)
        else:
            put("return", fn(*args, **kwargs))
    except BaseException as exc:   # noqa: BLE001 - every failure goes back to the server
        put("error", exc)
    finally:
        send.close()
        os._exit(0)                # nothing of the server's (its threads, its atexit) runs here


def install_standin(env=os.environ) -> ZeroGPUStandIn | None:
    """Serve under the stand-in where ``SEQUOIA_ZEROGPU_STANDIN=1`` (before the page is built); the stand-in,
    or None."""
    global spaces
    if (env.get(STANDIN_ENV) or "").strip() not in ("1", "true", "yes", "on"):
        return None
    spaces = ZeroGPUStandIn(verbose=True)
    return spaces
