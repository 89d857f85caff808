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


# ------------------------------------------------------------------ a generation owns the runners (issue 49)
class _OneCacheRunner:
    """A runner with one KV cache, as llama.cpp's: a new session clears it and every older session refuses its
    next call with the llama.cpp runner's words."""

    def __init__(self, runner) -> None:
        self._runner, self.generation = runner, 0

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def session(self):
        self.generation += 1
        return _OneCacheSession(self._runner.session(), self, self.generation)


class _OneCacheSession:
    def __init__(self, session, runner: _OneCacheRunner, generation: int) -> None:
        self._session, self._runner, self._generation = session, runner, generation

    def __getattr__(self, name):
        value = getattr(self._session, name)
        if name not in ("forward", "keep", "crop"):
            return value

        def call(*a, **k):
            if self._runner.generation != self._generation:
                raise RuntimeError("this session is stale: runner.session() was called again and cleared the "
                                   "runner's single KV cache; use the newest session")
            return value(*a, **k)
        return call

    def __len__(self) -> int:
        return len(self._session)


def _one_cache_pair():
    from sequoia.runtime.lease import ModelLease
    pair = make_pair(tiny_model(1), tiny_model(0), 48)
    return SimpleNamespace(**{**vars(pair), "draft": _OneCacheRunner(pair.draft),
                              "target": _OneCacheRunner(pair.target), "lock": ModelLease()})


def _resumed_on_new_threads(steps) -> list:
    """Every step of a generation on a fresh thread, as a server resumes a streamed request."""
    out, box = [], {}
    while True:
        t = threading.Thread(target=lambda: box.__setitem__("r", next(steps, None)))
        t.start()
        t.join(timeout=300)
        if box["r"] is None:
            return out
        out.append(box["r"])
        time.sleep(0.002)   # a gap between steps, where other model work would start


def test_a_generation_owns_a_one_cache_runner_while_the_profiler_measures_in_the_background():
    """The fresh-cache failure, in small: the background profiler beside two decodes resumed on other threads, on
    runners with one KV cache each.  No decode fails, each T=0 output equals its run alone, and the profile
    completes and says it was measured while requests ran."""
    pair = _one_cache_pair()
    config = GenerationConfig(max_new_tokens=24, stop_at_eos=False)
    prompts = ([1, 5, 3], [2, 7, 7, 4])

    def decode(prompt):
        steps = SpeculativeEngine(pair).generate(prompt, make_method("sequoia", budget=8, depth=3), config)
        return [t for r in _resumed_on_new_threads(steps) for t in r.new_tokens]

    alone = [decode(p) for p in prompts]
    errors, outputs, profiles = [], {}, []

    def run(name, job):
        try:
            outputs[name] = job()
        except Exception as exc:   # noqa: BLE001 - reported by the test
            errors.append(f"{name}: {type(exc).__name__}: {exc}")

    jobs = [("profile", lambda: profiles.append(measure_profile(
        pair, context_len=16, target_grid=(1, 2, 4, 8), draft_grid=(1, 2), repeats=3, point_s=0.3,
        overhead_steps=2, background=True)))]
    jobs += [(f"decode {i}", (lambda p=p: decode(p))) for i, p in enumerate(prompts * 2)]
    threads = [threading.Thread(target=run, args=job) for job in jobs]
    threads[0].start()
    # The profiler first, as on a fresh cache: the decodes start once it holds the models (waited on, not slept
    # for: on a loaded machine a fixed 50 ms let the decodes start first and finish before it measured at all).
    deadline, held = time.monotonic() + 60, False
    while not held and threads[0].is_alive() and time.monotonic() < deadline:
        held = pair.lock.owned
        time.sleep(0 if held else 0.001)
    assert held, "the profiler never took the models"
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert errors == [] and not any(t.is_alive() for t in threads)
    for i, p in enumerate(prompts * 2):
        assert outputs[f"decode {i}"] == alone[i % 2]
    assert profiles and "measured while requests ran" in profiles[0].note
    assert not pair.lock.owned


def test_without_the_lease_the_one_cache_runner_breaks_the_decode():
    """The check has power: the same work with the old per-step lock fails as the page did."""
    pair = _one_cache_pair()
    pair.lock = threading.RLock()
    config = GenerationConfig(max_new_tokens=48, stop_at_eos=False)
    errors = []

    def profile():
        try:
            measure_profile(pair, context_len=16, target_grid=(1, 2, 4, 8), draft_grid=(1, 2), repeats=3,
                            point_s=0.3, overhead_steps=0)
        except Exception as exc:   # noqa: BLE001
            errors.append(exc)

    steps = SpeculativeEngine(pair).generate([1, 5, 3], make_method("sequoia", budget=8, depth=3), config)
    first = next(steps)
    t = threading.Thread(target=profile)
    t.start()
    t.join(timeout=300)
    # the profile itself ran cleanly between two steps (nothing held the lock there): its session is what broke
    assert errors == [] and not t.is_alive()
    try:
        list(steps)
    except RuntimeError as exc:
        assert "stale" in str(exc)
    else:
        raise AssertionError("the decode survived a session started between its steps")
    assert first is not None


def test_stop_in_a_long_prompts_forward_frees_the_models_within_a_chunk(monkeypatch):
    """Stop while the prompt is read: the forward goes in chunks with Stop read between two, the generation ends
    with nothing generated, and the lease is free for the next request at once."""
    from sequoia.runtime import drafter as drafter_module
    monkeypatch.setattr(drafter_module, "FIRST_CHUNK", 8)
    monkeypatch.setattr(drafter_module, "CHUNK_S", 0.05)    # each chunk below takes ~0.05 s: 8 tokens a chunk
    pair = _one_cache_pair()
    calls, stop = [], threading.Event()
    real = pair.target.session

    def session():
        s = real()
        forward = s.forward

        def slow(tokens, *a, **k):
            calls.append(len(tokens))
            if len(calls) == 3:
                stop.set()          # Stop pressed while the third chunk is read
            time.sleep(0.05)
            return forward(tokens, *a, **k)
        s.forward = slow
        return s

    pair.target.session = session
    config = GenerationConfig(max_new_tokens=8, stop_at_eos=False)
    prompt = [1 + (i % 40) for i in range(80)]
    records = list(SpeculativeEngine(pair).generate(prompt, make_method("ar"), config, should_stop=stop.is_set))
    assert records == [] and len(calls) == 3 and not pair.lock.owned
    # the next request runs at once, and a prompt read in chunks gives the same output as one read whole
    whole = list(SpeculativeEngine(pair).generate(prompt, make_method("ar"), config))
    chunked = list(SpeculativeEngine(pair).generate(prompt, make_method("ar"), config, should_stop=lambda: False))
    assert [r.new_tokens for r in chunked] == [r.new_tokens for r in whole]
