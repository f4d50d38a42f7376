"""The gate's statistics: exact small cases, robustness, and the error rates the README states."""

from __future__ import annotations

import math

import pytest

from ci import stats
from ci.stats import Verdict


def test_identical_runs_pass_with_ratio_one():
    xs = [100.0 + i % 3 for i in range(20)]
    e = stats.paired_effect(xs, xs)
    assert e.ratio == 1.0 and e.ci_low == 1.0 and e.ci_high == 1.0
    assert stats.decide(e) == Verdict.PASS


def test_uniform_ten_percent_slowdown_fails():
    base = [100.0 + i for i in range(20)]
    e = stats.paired_effect(base, [b * 1.10 for b in base])
    assert e.ratio == pytest.approx(1.10) and e.ci_low == pytest.approx(1.10)
    assert stats.decide(e) == Verdict.FAIL


def test_straddling_interval_is_inconclusive():
    base = [100.0] * 12
    cand = [103.0 * (1 + d / 100) for d in (-2, -1.5, -1, -0.5, -0.2, 0, 0.1, 0.4, 0.8, 1.2, 1.6, 2)]
    e = stats.paired_effect(base, cand)
    assert e.ci_low < 1.03 < e.ci_high
    assert stats.decide(e) == Verdict.INCONCLUSIVE


def test_too_few_samples_cannot_decide():
    e = stats.paired_effect([1.0, 1.0, 1.0], [1.2, 1.2, 1.2])
    assert e.ci_high == math.inf and stats.decide(e) == Verdict.INCONCLUSIVE


def test_one_large_outlier_barely_moves_the_estimate():
    base = [100.0] * 30
    cand = [100.0] * 29 + [150.0]
    assert stats.paired_effect(base, cand).ratio < 1.001
    assert stats.unpaired_effect(base, cand).ratio < 1.001


def test_unpaired_shift_recovers_ratio():
    base = [100.0 + i for i in range(15)]
    e = stats.unpaired_effect(base, [x * 0.9 for x in base])
    assert e.ratio == pytest.approx(0.9, rel=0.02) and e.ci_high < 1.0
    assert stats.decide(e) == Verdict.PASS


def test_bad_samples_are_refused():
    with pytest.raises(ValueError, match="equal"):
        stats.paired_effect([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        stats.unpaired_effect([1.0, -1.0], [1.0])


def test_overall_is_the_worst():
    V = Verdict
    assert stats.overall([V.PASS, V.INCONCLUSIVE, V.FAIL]) == V.FAIL
    assert stats.overall([V.PASS, V.NO_BASELINE, V.INCONCLUSIVE]) == V.INCONCLUSIVE
    assert stats.overall([V.PASS, V.NO_BASELINE]) == V.NO_BASELINE
    assert stats.overall([V.PASS, V.PASS]) == V.PASS


def test_error_rates_at_default_repeats():
    """Simulated with design.md's noise (CV 0.2-0.7%, 3% of samples +7%): the README's numbers."""
    from ci.bench import DEFAULT_REPEATS

    aa = stats.simulate(1.0, DEFAULT_REPEATS, trials=300, seed=11)
    slow35 = stats.simulate(1.035, DEFAULT_REPEATS, trials=300, seed=12)
    slow5 = stats.simulate(1.05, DEFAULT_REPEATS, trials=300, seed=13)
    assert aa[Verdict.FAIL] <= 0.01
    assert slow35[Verdict.FAIL] >= 0.90  # 0.96 over 2000 trials (README); 300 trials wobble
    assert slow5[Verdict.FAIL] >= 0.99
