"""components.widgets.frames: the Live tab's frames are throttled, the last always sent, and built off the decode path."""

from __future__ import annotations

import threading
import time
from fractions import Fraction as F

import pytest

from components.widgets.frames import Ahead, paced


class FakeClock:
    def __init__(self) -> None:
        self.t = F(0)   # exact: a fake wait lands on the due time itself

    def __call__(self) -> float:
        return self.t


class FakeSource:
    """Items arriving at given fake times; ``wait_new`` advances the fake clock as a real wait would."""

    def __init__(self, clock: FakeClock, arrivals: list[float]) -> None:
        self.clock, self.arrivals, self.sent, self.closed = clock, sorted(arrivals), 0, False

    def _arrived(self) -> int:
        return sum(1 for a in self.arrivals if a <= self.clock.t)

    def wait_new(self, timeout):
        end = self.arrivals[-1] if self.arrivals else F(0)
        if timeout is None:   # until the next arrival (or the end)
            pending = [a for a in self.arrivals[self.sent:] if a > self.clock.t]
            if self._arrived() == self.sent and pending:
                self.clock.t = pending[0]
        else:                 # the full timeout, unless the stream ends first
            self.clock.t = min(self.clock.t + timeout, max(end, self.clock.t))
        n = self._arrived()
        items, self.sent = list(range(self.sent, n)), n
        return items, n == len(self.arrivals) and self.clock.t >= end

    def close(self) -> None:
        self.closed = True


def _run(arrivals, period_s=F(1, 5)):
    clock = FakeClock()
    source = FakeSource(clock, arrivals)
    frames = [(clock.t, f) for f in paced(source, period_s, clock)]
    return frames, source


def test_frames_are_throttled_and_carry_every_item_in_order():
    arrivals = [F(k, 100) for k in range(1, 301)]         # 100 steps a second for 3 s
    frames, source = _run(arrivals)
    items = [i for _, f in frames for i in f.items]
    assert items == list(range(300))                      # nothing lost, nothing repeated
    times = [t for t, f in frames if not f.final]
    assert all(b - a >= 0.2 - 1e-9 for a, b in zip(times, times[1:]))   # at most 5 frames a second
    assert len(frames) <= 3 / 0.2 + 2
    assert frames[-1][1].final and frames[-1][1].items[-1] == 299       # the last one always sent
    assert source.closed


def test_the_first_item_is_shown_at_once_and_the_last_without_waiting_a_period():
    frames, _ = _run([F(1), F(105, 100), F(11, 10)])
    assert frames[0][0] == 1 and frames[0][1].items == [0]
    final_t, final = frames[-1]
    assert final.final and final.items == [1, 2] and final_t == pytest.approx(1.1)   # not held until 1.2


def test_slow_steps_each_get_their_frame():
    frames, _ = _run([F(k, 2) for k in range(1, 5)])
    assert [i for _, f in frames for i in f.items] == [0, 1, 2, 3]
    assert sum(1 for _, f in frames if f.items) == 4


def test_ahead_runs_the_producer_ahead_of_a_slow_consumer():
    finished = threading.Event()

    def steps():
        for k in range(50):
            time.sleep(0.001)
            yield k
        finished.set()

    got, ahead = [], []
    for frame in paced(steps(), period_s=0.05):
        got += frame.items
        # A slow page still on its first frame: the producer finishes meanwhile (~0.05 s), asking nothing of it.
        # The 10 s bound only ends a wait for a producer that waits on the consumer, which would never finish.
        ahead.append(finished.wait(timeout=10))
    assert got == list(range(50)) and ahead[0]


def test_closing_the_frames_stops_and_closes_the_producer_in_its_thread():
    closed, produced = threading.Event(), []

    def steps():
        try:
            for k in range(10_000):
                time.sleep(0.002)
                produced.append(k)
                yield k
        finally:
            closed.set()

    frames = paced(steps(), period_s=0.01)
    next(frames)
    frames.close()                                        # Stop: returns once the producer has stopped
    assert closed.is_set()
    n = len(produced)
    time.sleep(0.02)
    assert len(produced) == n < 10_000


def test_a_producer_error_reaches_the_consumer():
    def steps():
        yield 1
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        for _ in paced(steps(), period_s=0.01):
            pass


def test_ahead_wait_new_returns_when_done():
    ahead = Ahead(iter([1, 2, 3]))
    items, done = [], False
    while not done:
        new, done = ahead.wait_new(None)
        items += new
    ahead.close()
    assert items == [1, 2, 3]
