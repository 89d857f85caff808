"""The target alone's decode rate on a run's own prompt and settings: measured once, or a labelled prediction.

The Live tab's headline ratio divides a run's decode rate by the target alone's.  A hardware profile's
predicted rate (one forward of one token) leaves out the step overhead and the prompt's length, so on a
CPU it was far from what the target alone really does on the same prompt; the page measures instead.
Short greedy target-alone runs on the same prompt ids and sampling settings, on the same pair (exact mode
measures the float32 target), give the rate the way every comparison on the page is measured
(:mod:`sequoia.core.statistics.rounds`): :data:`PROBE_ROUNDS` runs of :data:`PROBE_TOKENS` tokens, their median with its
range; one run alone swung by a third on a shared 2-core machine.  It is kept in a small cache in the app
state (:class:`TargetRates`), so a repeated prompt costs nothing.  A run of the target alone is its own
measurement (one round), and Compare's rounds of the target alone are another (their decode rates).

The Hardware tab shows the profile's prediction beside the latest measurement (:func:`reconcile_markdown`):
the prediction is one forward of one token, what the decode rate would be with no step overhead at all.

Both rates are :attr:`sequoia.core.statistics.stats.RunStats.tokens_per_s`: tokens after the prompt's forward over
the time after it, so the prompt's forward (alike for every method) weighs on neither.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from sequoia.core.profiles.cost import baseline_ms
from sequoia.core.statistics import rounds
from sequoia.core.statistics.stats import summarize
from sequoia.core.statistics.trace import StepRecord

#: Tokens of each measuring run: enough steps after the prompt's forward for a per-token rate, few enough that
#: the rounds together cost a few seconds on a CPU (one target forward a token).
PROBE_TOKENS = 10
#: Measuring runs: a median and a range whose ends are real runs.
PROBE_ROUNDS = 3
#: Rates remembered per server (each entry is a key and a float).
CACHE_SIZE = 32


@dataclass(frozen=True)
class TargetRate:
    """The target alone's tokens/s and where the number comes from."""

    tokens_per_s: float  # the median of the rounds where measured in several
    measured: bool
    source: str          # e.g. "measured on this prompt (3 runs of 10 tokens)" or "predicted (profile: shipped ...)"
    lo: float | None = None   # the slowest and fastest round (None: one round, or a prediction)
    hi: float | None = None

    def band_text(self) -> str:
        """"13.1 tokens/s (12.3–14.0)", or without brackets for one round or a prediction."""
        band = f" ({self.lo:.1f}–{self.hi:.1f})" if self.lo is not None and self.hi is not None else ""
        return f"{self.tokens_per_s:.1f} tokens/s{band}"


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

    def latest(self) -> TargetRate | None:
        """The rate measured last, whatever its prompt (None before any)."""
        with self._lock:
            return next(reversed(self._items.values()), None)


def rate_key(pair, prompt_ids: Sequence[int], config) -> tuple:
    """What the target alone's rate depends on: the pair's target (exact mode has its own), the prompt,
    and the sampling settings (the length is the probe's, whatever the run's)."""
    return (id(pair.target), tuple(int(t) for t in prompt_ids), config.sampling.temperature, config.sampling.top_p)


def decode_rate(records: Sequence[StepRecord]) -> float:
    """A run's tokens/s after the prompt's forward (0: a run of one step has none)."""
    return summarize(records).tokens_per_s if len(records) > 1 else 0.0


def measured_rate(records: Sequence[StepRecord], what: str) -> TargetRate | None:
    """A run's decode rate as a measurement of the target alone (None: too short to have a rate)."""
    rate = decode_rate(records)
    return TargetRate(rate, True, what) if rate > 0 else None


def from_rounds(rates: Sequence[float], what: str) -> TargetRate | None:
    """The median of measured decode rates with their range (None: no positive rate)."""
    rates = [r for r in rates if r > 0]
    if not rates:
        return None
    s = rounds.spread(rates)
    return TargetRate(s.median, True, what, *((s.lo, s.hi) if s.n > 1 else (None, None)))


def probe(run: Callable[[object], Iterable[StepRecord]], config, rounds_: int = PROBE_ROUNDS) -> TargetRate | None:
    """Measure the target alone with ``run(config)`` (a target-alone decode of the run's prompt), ``rounds_``
    times over :data:`PROBE_TOKENS` tokens (or the run's own length if shorter): the median with its range."""
    n = max(min(PROBE_TOKENS, config.max_new_tokens), 2)
    rates = [decode_rate(list(run(replace(config, max_new_tokens=n)))) for _ in range(rounds_)]
    return from_rounds(rates, f"measured on this prompt ({rounds_} runs of {n} tokens)")


def reconcile_markdown(predicted_: TargetRate | None, measured: TargetRate | None) -> str:
    """The profile's predicted rate of the target alone beside the page's latest measurement, and why they
    differ ("" when there is neither)."""
    if predicted_ is None and measured is None:
        return ""
    parts = []
    if predicted_ is not None:
        parts.append(f"predicted **{predicted_.tokens_per_s:.1f} tokens/s** ({predicted_.source}: one forward of one "
                     "token, no step overhead)")
    if measured is not None:
        parts.append(f"measured **{measured.band_text()}** ({measured.source}; decode after the prompt's forward)")
    else:
        parts.append("measured: not yet (a Live run or a Compare run measures it)")
    gap = (f" The measurement is {measured.tokens_per_s / predicted_.tokens_per_s:.2f}× the prediction: the step's "
           "own overhead and a busy machine show there, not in the profile." if predicted_ and measured else "")
    return "**The target alone here**: " + "; ".join(parts) + "." + gap


def predicted(choice) -> TargetRate | None:
    """The profile's prediction, labelled with its source (None without a profile)."""
    prof = choice.profile
    if prof is None:
        return None
    return TargetRate(1000.0 / baseline_ms(prof), False, f"predicted (profile: {choice.source}, {prof.device})")
