"""Exact tests of the rounds' statistics on hand-made numbers (sequoia.core.statistics.rounds)."""

import pytest

from sequoia.core.statistics import rounds


def test_spread_is_median_and_range():
    s = rounds.spread([18.0, 12.6, 12.3])
    assert (s.median, s.lo, s.hi, s.n) == (12.6, 12.3, 18.0, 3)
    assert s.holds(15.0) and not s.holds(18.1)
    assert s.half_width == pytest.approx((18.0 - 12.3) / 2 / 12.6)
    with pytest.raises(ValueError):
        rounds.spread([])


def test_ratios_pair_round_by_round():
    # The machine slowed down in round 2 for both: paired ratios stay at 1, unpaired medians would not.
    target = [18.0, 12.0, 15.0]
    method = [18.0, 12.0, 15.0]
    assert rounds.paired_ratios(method, target) == (1.0, 1.0, 1.0)
    band = rounds.ratio_band([20.0, 12.0, 16.5], target)
    assert band.median == pytest.approx(1.1) and band.lo == pytest.approx(1.0) and band.hi == pytest.approx(1.1111, 1e-3)
    assert rounds.paired_ratios([1.0, 2.0], [0.0, 1.0]) == (2.0,)   # a round with no reference rate is left out
    assert rounds.ratio_band([1.0], [0.0]) is None


def test_band_holding_one_is_same_within_noise():
    band = rounds.ratio_band([12.0, 14.0, 13.0], [13.0, 13.0, 13.0])   # 0.92 .. 1.08
    assert band.holds(1.0)
    assert rounds.verdict(band) == rounds.SAME


def test_band_above_or_below_one():
    assert rounds.verdict(rounds.ratio_band([26.0, 27.0, 30.0], [13.0, 13.0, 14.0])) == rounds.FASTER
    assert rounds.verdict(rounds.ratio_band([4.0, 4.2, 4.1], [13.0, 13.0, 14.0])) == rounds.SLOWER


def test_one_round_says_nothing_about_noise():
    assert rounds.verdict(rounds.ratio_band([20.0], [10.0])) == rounds.ONE_ROUND
    assert rounds.verdict(None) == rounds.ONE_ROUND


def test_reference_work_is_named_whatever_its_band():
    # The case: 32 tokens in 32 target calls read 1.42x the target alone in a single run.
    assert rounds.did_reference_work(32, 32)
    assert not rounds.did_reference_work(32, 12)
    assert not rounds.did_reference_work(0, 0) and not rounds.did_reference_work(5, None)
    fast_looking = rounds.ratio_band([17.5, 17.0, 18.0], [12.3, 12.6, 12.4])   # 1.37 .. 1.45: not holding 1
    assert rounds.verdict(fast_looking, reference_work=True) == rounds.REFERENCE_WORK
    assert rounds.verdict(fast_looking, is_reference=True) == rounds.REFERENCE


def test_outliers_hyperfine_rule():
    assert rounds.outliers([12.3, 12.6, 18.0]) == (2,)          # the three runs of the target alone
    assert rounds.outliers([12.3, 12.6, 12.9, 12.4]) == ()       # ordinary jitter
    assert rounds.outliers([10.0, 10.0, 10.5]) == ()             # a zero MAD and 5% off: not worth a warning
    assert rounds.outliers([10.0, 10.0, 13.0]) == (2,)           # a zero MAD and 30% off
    assert rounds.outliers([10.0, 20.0]) == ()                   # two rounds: neither is the odd one


def test_a_verdict_never_contradicts_its_band():
    """Issue 51: "same within noise" only where the band holds 1 and the median is within the reference's own
    noise (never at 0.9x or 1.1x); a wide band across 1 cannot tell; a band off 1 is faster or slower."""
    from sequoia.core.statistics.rounds import FASTER, SAME, SLOWER, TOO_NOISY, Spread, verdict

    assert verdict(Spread(0.70, 0.53, 1.15, 3), noise=0.04) == TOO_NOISY       # the page's 0.70x "same within noise"
    assert verdict(Spread(1.03, 0.97, 1.10, 3), noise=0.04) == SAME
    assert verdict(Spread(1.03, 0.97, 1.10, 3), noise=0.01) == TOO_NOISY       # beyond the reference's own noise
    assert verdict(Spread(0.91, 0.85, 1.02, 3), noise=0.50) == SAME            # the cap: 0.09 at most
    assert verdict(Spread(0.90, 0.85, 1.02, 3), noise=0.50) == TOO_NOISY
    assert verdict(Spread(1.10, 1.01, 1.14, 3)) == FASTER and verdict(Spread(0.93, 0.84, 0.98, 3)) == SLOWER
    for median in (0.5, 0.8, 0.9, 1.1, 1.2, 1.5):
        for lo, hi in ((median * 0.7, max(median * 1.3, 1.01)), (min(median * 0.7, 0.99), median * 1.3)):
            v = verdict(Spread(median, lo, hi, 3), noise=1.0)
            assert v != SAME   # never "the same" at or beyond 0.9x / 1.1x, whatever the noise
