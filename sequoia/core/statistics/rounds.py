"""Statistics of interleaved timing rounds: a rate with its spread, a ratio with its band, and what they say.

A comparison that times each method once, one after another, prints noise: on a shared 2-core machine the
same target alone read 18.0, 12.6 and 12.3 tokens/s in three runs.  So a comparison runs a warm-up round
(untimed), then R rounds in which every method runs once in turn (A B C A B C ...), and reads its numbers
from those rounds (pyperf's warm-ups and spread, hyperfine's outlier warning):

* **rate**: a method's median tokens/s over the rounds, with its spread min..max (:func:`spread`);
* **ratio**: a method's tokens/s over the reference's (the target alone), paired round by round, since two
  runs of one round ran seconds apart under the same load; the band is the min..max of those per-round
  ratios and the ratio their median (:func:`ratio_band`);
* **verdict** (:func:`verdict`): "same as the reference within noise" where the band holds 1; a method
  whose every target call made one token did the reference's own work (:func:`did_reference_work`) and
  is named so, never read as a speedup, whatever its band;
* **outliers** (:func:`outliers`): rounds far from the median (hyperfine's modified z-score above 3.5 and
  more than :data:`OUTLIER_FRACTION` off), worth a warning that the machine was busy.

Pure Python on floats: the Compare tab, the ``/compare`` API, the bench and the target-rate probe share it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: hyperfine's threshold on the modified z-score 0.6745 |x - median| / MAD (Iglewicz and Hoaglin).
OUTLIER_Z = 3.5
#: ...and a round must also be this far from the median, relatively: a few percent is a CPU's ordinary jitter,
#: and with three rounds the MAD can be tiny.
OUTLIER_FRACTION = 0.10

#: The verdicts of :func:`verdict`.
REFERENCE, REFERENCE_WORK, SAME, FASTER, SLOWER, ONE_ROUND, TOO_NOISY = (
    "reference", "reference's work", "same within noise", "faster", "slower", "one round", "too noisy to tell")
#: "Same within noise" needs the median this close to 1 at least (a CPU's ordinary jitter)...
SAME_FLOOR = 0.02
#: ...and at most this close, whatever the reference's own rounds show: a median at 0.9x or 1.1x is never
#: "the same".
SAME_CAP = 0.09


@dataclass(frozen=True)
class Spread:
    """A median with the range of the values it came from (one value per round)."""

    median: float
    lo: float            # the smallest value
    hi: float            # the largest value
    n: int               # how many values (rounds)

    def holds(self, x: float) -> bool:
        return self.lo <= x <= self.hi

    @property
    def half_width(self) -> float:
        """Half the range relative to the median (0.05: +-5%); 0 for a zero median."""
        return (self.hi - self.lo) / 2 / self.median if self.median else 0.0


def spread(values: Sequence[float]) -> Spread:
    """Median and min..max of ``values``; ValueError when there are none."""
    if not values:
        raise ValueError("spread: no values")
    xs = [float(v) for v in values]
    return Spread(statistics.median(xs), min(xs), max(xs), len(xs))


def paired_ratios(rates: Sequence[float], reference: Sequence[float]) -> tuple[float, ...]:
    """``rates[r] / reference[r]`` for each round both ran (the shorter length); rounds where the reference
    read 0 are left out."""
    return tuple(float(a) / float(b) for a, b in zip(rates, reference) if b > 0)


def ratio_band(rates: Sequence[float], reference: Sequence[float]) -> Spread | None:
    """The ratio of a method to the reference, median and min..max of its per-round paired ratios (None: no
    round with both)."""
    ratios = paired_ratios(rates, reference)
    return spread(ratios) if ratios else None


def did_reference_work(tokens: int, target_calls: int | None) -> bool:
    """Every target call made exactly one token: the target alone's work, whatever the method drafted (every
    tree declined, or every draft rejected)."""
    return bool(target_calls) and tokens == target_calls


def verdict(band: Spread | None, reference_work: bool = False, is_reference: bool = False,
            noise: float | None = None) -> str:
    """What a row's ratio says (one of the module's verdict constants); it never contradicts the band.

    A method that did the reference's work is named so before anything else: its ratio can only be noise.
    One round has no band, so it says nothing about noise yet.  A band above 1 is faster, below 1 slower.  A band
    that holds 1 is "same within noise" only where its median is within the noise the reference's own rounds
    show (``noise``: their half-width relative to their median; SAME_FLOOR at least, SAME_CAP at most);
    otherwise the rounds cannot tell (more rounds, or a quieter machine, would).
    """
    if is_reference:
        return REFERENCE
    if reference_work:
        return REFERENCE_WORK
    if band is None or band.n < 2:
        return ONE_ROUND
    if band.lo > 1.0:
        return FASTER
    if band.hi < 1.0:
        return SLOWER
    allowed = min(max(noise or 0.0, SAME_FLOOR), SAME_CAP)
    return SAME if abs(band.median - 1.0) <= allowed else TOO_NOISY


def outliers(values: Sequence[float], z: float = OUTLIER_Z, fraction: float = OUTLIER_FRACTION) -> tuple[int, ...]:
    """Indices of the values far from the median: modified z-score above ``z`` and more than ``fraction`` of
    the median away.  Fewer than three values have no outliers (two disagree; neither is the odd one)."""
    if len(values) < 3:
        return ()
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    # A zero MAD (two rounds equal) would make every other round infinitely far: floor it at 1% of the median.
    mad = max(mad, 0.01 * abs(med), 1e-12)
    return tuple(i for i, v in enumerate(values)
                 if 0.6745 * abs(v - med) / mad > z and abs(v - med) > fraction * abs(med))
