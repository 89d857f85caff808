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

**One rate per condition.**  A Live run is drawn on the page as it runs; where the browser shares the server's
cores (a class's laptop), that drawing slows it, and a rate measured without drawing (the probe, Compare's
rounds) is then not the same condition.  Each rate says whether it was measured drawn (:attr:`TargetRate.drawn`),
the cache keeps one of each per prompt and settings, and the Live tab divides by the drawn one where there is one,
else says it divides by one measured without drawing.  :func:`drawing_words` says how long the server's
threads waited for a core another program held during a run (the kernel's per-thread accounting), the browser
drawing the page among them, measured.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

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
    drawn: bool = False       # measured in a run drawn on the page as it ran (a Live run), not in the server alone

    def band_text(self) -> str:
        """"13.1 tokens/s (12.3–14.0)", or without brackets for one round or a prediction."""
        band = f" ({self.lo:.1f}–{self.hi:.1f})" if self.lo is not None and self.hi is not None else ""
        return f"{self.tokens_per_s:.1f} tokens/s{band}"


class TargetRates:
    """A small thread-safe LRU of measured target-alone rates by (pair, prompt ids, sampling settings), one
    measured drawn on the page and one not (:attr:`TargetRate.drawn`) per key."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict = OrderedDict()   # (key, drawn) -> (put number, rate), least recently used first
        self._puts = 0
        self._lock = threading.Lock()

    def get(self, key, drawn: bool | None = None) -> TargetRate | None:
        """The rate of ``key`` measured drawn or not (None: whichever of the two was measured last)."""
        with self._lock:
            found = [(key, d) for d in ((drawn,) if drawn is not None else (False, True)) if (key, d) in self._items]
            if not found:
                return None
            last = max(found, key=lambda k: self._items[k][0])
            self._items.move_to_end(last)
            return self._items[last][1]

    def put(self, key, rate: TargetRate) -> None:
        with self._lock:
            self._puts += 1
            self._items[(key, rate.drawn)] = (self._puts, rate)
            self._items.move_to_end((key, rate.drawn))
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)

    def latest(self) -> TargetRate | None:
        """The rate measured last, whatever its prompt (None before any)."""
        with self._lock:
            return max(self._items.values(), key=lambda item: item[0], default=(0, None))[1]


def rate_key(pair, prompt_ids: Sequence[int], config) -> tuple:
    """What the target alone's rate depends on: the pair's target (exact mode has its own), the prompt,
    and the sampling settings (the length is the probe's, whatever the run's)."""
    return (id(pair.target), tuple(int(t) for t in prompt_ids), config.sampling.temperature, config.sampling.top_p)


def decode_rate(records: Sequence[StepRecord]) -> float:
    """A run's tokens/s after the prompt's forward (0: a run of one step has none)."""
    return summarize(records).tokens_per_s if len(records) > 1 else 0.0


def measured_rate(records: Sequence[StepRecord], what: str, drawn: bool = False) -> TargetRate | None:
    """A run's decode rate as a measurement of the target alone (None: too short to have a rate)."""
    rate = decode_rate(records)
    return TargetRate(rate, True, what, drawn=drawn) if rate > 0 else None


def live_rate(records: Sequence[StepRecord]) -> TargetRate | None:
    """A Live run of the target alone as the measurement of the drawn condition, named so that a later run
    dividing by it says which run measured it."""
    return measured_rate(records, f"measured by a Live run of the target alone on this prompt ({len(records)} "
                                  "target calls, drawn on the page as it ran)", drawn=True)


def pick(rates: TargetRates, key, drawn: bool) -> TargetRate | None:
    """The rate a run measured ``drawn`` (or not) divides by: the same condition's, else the other's (its
    source says which it is)."""
    return rates.get(key, drawn) or rates.get(key, not drawn)


@dataclass(frozen=True)
class CoreWait:
    """How this server's threads spent one run, from the kernel's per-thread accounting: computing on a core,
    or ready to compute but waiting for one that another program held (Linux's ``/proc/self/task/*/schedstat``).
    Idle waits (a step's Python between forwards, the page's round trips) are in neither, so unlike CPU time
    against the run's time this is not fooled by a run that leaves a core idle.  Threads that end within the run
    are lost (llama.cpp's workers may be made per forward): the sums are of the threads that lasted it, the
    handler's among them, and their waited part is the figure to read."""

    run_s: float      # summed over the threads: time on a core
    wait_s: float     # summed over the threads: runnable, waiting for a core
    wall_s: float     # the run's time

    @property
    def waited(self) -> float:
        """The part of the threads' busy time spent waiting for a core."""
        busy = self.run_s + self.wait_s
        return self.wait_s / busy if busy > 0 else 0.0


#: A run whose threads waited for a core more than this part of their busy time is said to have shared them.
SHARED_ABOVE = 0.10


def thread_times() -> dict[int, tuple[int, int]]:
    """thread id -> (ns on a core, ns waiting for one) of this process's threads now ({}: not Linux)."""
    out = {}
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            run, wait, _ = (int(x) for x in (task / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue   # a thread that ended meanwhile, or a kernel without schedstat
        out[int(task.name)] = (run, wait)
    return out


def core_wait(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], wall_s: float) -> CoreWait | None:
    """What the threads did between two :func:`thread_times` readings (None: nothing read).  A thread started
    in between counts from zero; one that ended is lost."""
    if not after:
        return None
    run = sum(r - before.get(t, (0, 0))[0] for t, (r, _) in after.items())
    wait = sum(w - before.get(t, (0, 0))[1] for t, (_, w) in after.items())
    return CoreWait(max(run, 0) / 1e9, max(wait, 0) / 1e9, wall_s)


def drawing_words(cores: CoreWait | None, rate: TargetRate | None, drawn: bool = True, what: str = "this run") -> str:
    """What the cores' sharing cost a run (``what``: "this run", "this comparison's timed rounds"), measured (""
    below :data:`SHARED_ABOVE`, or nothing measured): how long its threads waited for a core another program held
    (a browser drawing the page on this machine among them), and that a rate it is divided by measured without
    drawing is then another condition (``drawn``: the run was drawn on the page as it ran)."""
    if cores is None or cores.wall_s <= 0 or cores.waited <= SHARED_ABOVE:
        return ""
    apart = (" The target alone's rate it is divided by was measured without drawing, so part of the ratio's gap "
             "is this." if drawn and rate is not None and rate.measured and not rate.drawn else "")
    return (f"**Cores shared during {what}**: the server's threads, ready to compute, waited for a core another "
            f"program held {100 * cores.waited:.0f}% of their busy time ({cores.wait_s:.1f} s waiting against "
            f"{cores.run_s:.1f} s on a core over {cores.wall_s:.1f} s, the kernel's accounting of the threads that "
            "lasted it); the browser drawing this page counts, where it runs on this machine. So it took roughly "
            f"{1 / (1 - cores.waited):.2f}× its time with the cores to itself.{apart}")


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
    return from_rounds(rates, f"measured on this prompt ({rounds_} runs of {n} tokens, in the server, not drawn)")


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
    return "**The target alone here**: " + "; ".join(parts) + "." + _gap_words(predicted_, measured)


def _gap_words(predicted_: TargetRate | None, measured: TargetRate | None) -> str:
    """Why a measurement is off its prediction, by which side it falls ("" within 10%, or without both): slower,
    the step's own overhead and a busy machine, which the profile leaves out; faster, a profile measured while the
    machine was busier (its note on the Hardware tab says how it was measured)."""
    if predicted_ is None or measured is None:
        return ""
    ratio = measured.tokens_per_s / predicted_.tokens_per_s
    if abs(ratio - 1) <= 0.10:
        return f" The measurement is {ratio:.2f}× the prediction: within 10%."
    if ratio < 1:
        return (f" The measurement is {ratio:.2f}× the prediction: the step's own overhead and a busy machine show "
                "there, not in the profile.")
    return (f" The measurement is {ratio:.2f}× the prediction, faster than it: the profile was measured under other "
            "conditions (a busier machine, other threads; its note says how).")


def predicted(choice) -> TargetRate | None:
    """The profile's prediction, labelled with its source (None without a profile)."""
    prof = choice.profile
    if prof is None:
        return None
    return TargetRate(1000.0 / baseline_ms(prof), False, f"predicted (profile: {choice.source}, {prof.device})")
