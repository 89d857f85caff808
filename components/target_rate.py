"""The target alone's decode rate on a run's own prompt and settings: measured once, or a labelled prediction.

The Live tab's headline ratio divides a run's decode rate by the target alone's.  A hardware profile's
predicted rate (one forward of one token) leaves out the step overhead and the prompt's length, so on a
CPU it was far from what the target alone really does on the same prompt; the page measures instead.
A short greedy target-alone run (:data:`PROBE_TOKENS` tokens) on the same prompt ids and sampling
settings, on the same pair (exact mode measures the float32 target), gives the rate; it is kept in a
small cache in the app state (:class:`TargetRates`), so a repeated prompt costs nothing.  A run of the
target alone is its own measurement (and fills the cache for the next method on that prompt).

Both rates are :attr:`sequoia.core.stats.RunStats.tokens_per_s`: tokens after the prompt's forward over
the time after it, so the prompt's forward (alike for every method) weighs on neither.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from sequoia.core.cost import baseline_ms
from sequoia.core.stats import summarize
from sequoia.core.trace import StepRecord
from sequoia.core.words import counted

#: Tokens of the measuring run: enough steps after the prompt's forward for a steady per-token rate, few
#: enough to cost a few seconds on a CPU (one target forward a token).
PROBE_TOKENS = 24
#: Rates remembered per server (each entry is a key and a float).
CACHE_SIZE = 32


@dataclass(frozen=True)
class TargetRate:
    """The target alone's tokens/s and where the number comes from."""

    tokens_per_s: float
    measured: bool
    source: str          # e.g. "measured on this prompt, 24 tokens" or "predicted (profile: shipped ...)"


class TargetRates:
    """A small thread-safe LRU of measured target-alone rates by (pair, prompt ids, sampling settings)."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key) -> TargetRate | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return None

    def put(self, key, rate: TargetRate) -> None:
        with self._lock:
            self._items[key] = rate
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def rate_key(pair, prompt_ids: Sequence[int], config) -> tuple:
    """What the target alone's rate depends on: the pair's target (exact mode has its own), the prompt,
    and the sampling settings (the length is the probe's, whatever the run's)."""
    return (id(pair.target), tuple(int(t) for t in prompt_ids), config.sampling.temperature, config.sampling.top_p)


def measured_rate(records: Sequence[StepRecord], what: str) -> TargetRate | None:
    """A run's decode rate as a measurement of the target alone (None: too short to have a rate)."""
    rate = summarize(records).tokens_per_s if len(records) > 1 else 0.0
    return TargetRate(rate, True, what) if rate > 0 else None


def probe(run: Callable[[object], Iterable[StepRecord]], config) -> TargetRate | None:
    """Measure the target alone with ``run(config)`` (a target-alone decode of the run's prompt) over
    :data:`PROBE_TOKENS` tokens, or the run's own length if shorter."""
    n = min(PROBE_TOKENS, config.max_new_tokens)
    records = list(run(replace(config, max_new_tokens=max(n, 2))))
    return measured_rate(records, f"measured on this prompt ({counted(len(records), 'target call')})")


def predicted(choice) -> TargetRate | None:
    """The profile's prediction, labelled with its source (None without a profile)."""
    prof = choice.profile
    if prof is None:
        return None
    return TargetRate(1000.0 / baseline_ms(prof), False, f"predicted (profile: {choice.source}, {prof.device})")
