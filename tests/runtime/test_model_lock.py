"""One lock around model work on a pair (ModelPair.lock): requests and the background profiler never overlap.

On a GPU the runners share one slot cache and the captured graphs' static inputs, so two threads' forwards
interleaved would corrupt each other (or break a capture in progress).  Here a runner that fails on any
overlapping call stands in for that: two request threads and the profiler run at once on one pair, and every
call runs alone.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from conftest import make_pair, tiny_model

from sequoia.core.config import GenerationConfig, SamplingConfig
from sequoia.runtime.engine import SpeculativeEngine, model_lock
from sequoia.runtime.measuring.profiling import measure_profile
from sequoia.runtime.methods import make_method


class _Guard:
    """Counts calls in progress across every wrapped runner; a second one at once is an overlap."""

    def __init__(self) -> None:
        self.inside, self.calls, self.overlaps = 0, 0, 0
        self._count = threading.Lock()

    def run(self, call, *args, **kwargs):
        with self._count:
            self.inside += 1
            self.calls += 1
            self.overlaps += self.inside > 1
        try:
            time.sleep(0.001)   # widen the window another thread's call would land in
            return call(*args, **kwargs)
        finally:
            with self._count:
                self.inside -= 1


class _Session:
    def __init__(self, session, guard: _Guard) -> None:
        self._session, self._guard = session, guard

    def __getattr__(self, name):
        value = getattr(self._session, name)
        return (lambda *a, **k: self._guard.run(value, *a, **k)) if name in ("forward", "keep", "crop") else value

    def __len__(self) -> int:
        return len(self._session)


class _Runner:
    """A runner whose sessions' forward, keep and crop go through the guard."""

    def __init__(self, runner, guard: _Guard) -> None:
        self._runner, self._guard = runner, guard

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def session(self):
        return _Session(self._guard.run(self._runner.session), self._guard)


def _guarded_pair(guard: _Guard, lock):
    pair = make_pair(tiny_model(1), tiny_model(0), 48)
    return SimpleNamespace(**{**vars(pair), "draft": _Runner(pair.draft, guard), "target": _Runner(pair.target, guard),
                              "lock": lock})


def _work(pair, errors: list) -> list:
    config = GenerationConfig(max_new_tokens=24, sampling=SamplingConfig(temperature=1.0), stop_at_eos=False)

    def request() -> None:
        list(SpeculativeEngine(pair).generate([1, 5, 3], make_method("sequoia", budget=8, depth=3), config))

    def profile() -> None:
        measure_profile(pair, context_len=16, target_grid=(1, 4), draft_grid=(1, 2), repeats=2, point_s=0.5,
                        overhead_steps=2)

    def run(job) -> None:
        try:
            job()
        except Exception as exc:   # noqa: BLE001 - reported by the test
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(job,)) for job in (request, profile, request)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return threads


def test_requests_and_the_profiler_take_turns_through_the_pairs_lock():
    guard, errors = _Guard(), []
    threads = _work(_guarded_pair(guard, threading.RLock()), errors)
    assert not any(t.is_alive() for t in threads) and errors == []
    assert guard.calls > 50 and guard.overlaps == 0


def test_without_the_lock_the_guard_sees_the_overlap():
    """The check has power: the same work on a pair with no lock overlaps."""
    guard, errors = _Guard(), []
    pair = _guarded_pair(guard, None)
    assert model_lock(pair).__class__.__name__ == "nullcontext"
    _work(pair, errors)
    assert guard.overlaps > 0


def test_a_hugging_face_baseline_runs_under_the_pairs_lock(monkeypatch):
    """Hugging Face generate runs the target's module outside the engine (Compare's HF rows, the bench): it takes
    the same lock, so the background profiler or a graph capture never runs on those weights at once."""
    from sequoia.runtime.measuring import timing
    from sequoia.runtime.checks.baselines import BaselineRun

    lock, held = threading.RLock(), []

    def generate(pair, ids, gen, **kwargs):
        held.append(lock._is_owned())   # the RLock's own test: held by this thread
        return BaselineRun("hf-assisted", tokens=(7, 8), seconds=0.1, target_calls=2, first_token_s=0.05, first_tokens=1)

    monkeypatch.setattr(timing, "hf_generate", generate)
    pair = SimpleNamespace(**{**vars(make_pair(tiny_model(1), tiny_model(0), 48)), "lock": lock})
    config = GenerationConfig(max_new_tokens=2, stop_at_eos=False)
    timing.run_method(SpeculativeEngine(pair), pair, "hf-assisted", [1, 5, 3], config)
    assert held == [True] and not lock._is_owned()
