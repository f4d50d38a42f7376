"""The gate's statistics: pure functions, no GPU, no numpy.

The test (one place, one set of parameters):

* A/B in one run: base and candidate are timed in interleaved rounds, so sample ``i`` of each
  forms a pair. The effect is the **Hodges-Lehmann estimate of the paired log-ratio**
  ``log(cand_i / base_i)`` (the median of the Walsh averages), with the distribution-free
  confidence interval of the **Wilcoxon signed-rank** test. Robust to the rare +7% outliers
  of GPU timing (a single outlier moves it by little), and ~95% as efficient as a mean on
  clean normal noise (a median of ratios is ~64%).
* Against a stored baseline (two runs, no pairing): the **Hodges-Lehmann shift** of log times
  (median of all cross differences) with the **Mann-Whitney** confidence interval.

Verdict, with ratio = candidate / base (or run / baseline) and threshold ``t`` (3%):

* FAIL when the whole confidence interval lies above ``1 + t``: a slowdown over ``t`` that
  is statistically significant;
* PASS when the whole interval lies at or below ``1 + t``;
* INCONCLUSIVE when the interval straddles ``1 + t``: re-run with more repeats.

A run whose evidence is incomplete (``ci.evidence``: cases, rounds or samples missing) is
INCOMPLETE whatever its intervals say; only a proven FAIL outranks it.

The README states the false-alarm and detection rates measured with :func:`simulate`.
"""

from __future__ import annotations

import enum
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_THRESHOLD = 0.03
DEFAULT_CONFIDENCE = 0.95
METHOD_PAIRED = "hodges-lehmann paired log-ratio, wilcoxon signed-rank CI"
METHOD_UNPAIRED = "hodges-lehmann log shift, mann-whitney CI"
# The noise model of the simulation: design.md §3 measured per-sample CV 0.2-0.7% and rare +7% outliers.
SIM_CV_RANGE = (0.002, 0.007)
SIM_OUTLIER_PROB = 0.03
SIM_OUTLIER_SIZE = 0.07


class Verdict(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    NO_BASELINE = "NO_BASELINE"
    INCOMPLETE = "INCOMPLETE"


@dataclass(frozen=True, kw_only=True)
class Effect:
    """candidate / base as a ratio with its confidence interval (inf bounds: too few samples)."""

    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    method: str
    n_base: int
    n_candidate: int


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def iqr(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[2] - q[0]


def _z(confidence: float) -> float:
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


def _order_stat_interval(sorted_values: list[float], k: int) -> tuple[float, float]:
    """[x_(k+1), x_(N-k)] (1-based), or (-inf, inf) when there are too few values."""
    if k < 0 or k >= len(sorted_values) - k:
        return -math.inf, math.inf
    return sorted_values[k], sorted_values[len(sorted_values) - 1 - k]


def _effect(sorted_logs: list[float], k: int, confidence: float, method: str, n_base: int, n_cand: int) -> Effect:
    """The median of ``sorted_logs`` and its order-statistic interval, as ratios."""
    lo, hi = _order_stat_interval(sorted_logs, k)
    return Effect(
        ratio=math.exp(statistics.median(sorted_logs)),
        ci_low=math.exp(lo) if lo > -math.inf else 0.0,
        ci_high=math.exp(hi) if hi < math.inf else math.inf,
        confidence=confidence,
        method=method,
        n_base=n_base,
        n_candidate=n_cand,
    )


def paired_effect(base: Sequence[float], cand: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> Effect:
    """Hodges-Lehmann paired log-ratio with the Wilcoxon signed-rank interval (normal approximation)."""
    if len(base) != len(cand) or not base:
        raise ValueError(f"paired samples need equal, non-zero lengths (got {len(base)} and {len(cand)})")
    if min(*base, *cand) <= 0:
        raise ValueError("timings must be positive")
    d = [math.log(c / b) for b, c in zip(base, cand, strict=True)]
    n = len(d)
    walsh = sorted((d[i] + d[j]) / 2 for i in range(n) for j in range(i, n))
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    k = math.floor(n * (n + 1) / 4 - _z(confidence) * sd)
    return _effect(walsh, k, confidence, METHOD_PAIRED, n, n)


def unpaired_effect(base: Sequence[float], cand: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> Effect:
    """Hodges-Lehmann shift of log times with the Mann-Whitney interval (normal approximation)."""
    if not base or not cand:
        raise ValueError("both samples must be non-empty")
    if min(*base, *cand) <= 0:
        raise ValueError("timings must be positive")
    lb, lc = [math.log(x) for x in base], [math.log(x) for x in cand]
    diffs = sorted(c - b for b in lb for c in lc)
    n, m = len(lb), len(lc)
    k = math.floor(n * m / 2 - _z(confidence) * math.sqrt(n * m * (n + m + 1) / 12))
    return _effect(diffs, k, confidence, METHOD_UNPAIRED, n, m)


def decide(effect: Effect, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    """FAIL above, PASS at or below, INCONCLUSIVE straddling ``1 + threshold``."""
    limit = 1 + threshold
    if effect.ci_low > limit:
        return Verdict.FAIL
    if effect.ci_high <= limit:
        return Verdict.PASS
    return Verdict.INCONCLUSIVE


OVERALL_ORDER = (Verdict.FAIL, Verdict.INCOMPLETE, Verdict.INCONCLUSIVE, Verdict.NO_BASELINE)


def overall(verdicts: Sequence[Verdict]) -> Verdict:
    """The worst: FAIL, then INCOMPLETE, INCONCLUSIVE, NO_BASELINE; PASS only when every case passed.

    No verdicts at all is INCOMPLETE: a PASS needs evidence."""
    if not verdicts:
        return Verdict.INCOMPLETE
    for v in OVERALL_ORDER:
        if v in verdicts:
            return v
    return Verdict.PASS


def interleaved_order(rounds: int, sides: Sequence[str] = ("base", "candidate")) -> list[str]:
    """The order builds are measured in, balanced against drift: A B | B A | A B ... (``rounds`` pairs).

    Pairs are what the paired test compares; alternating which build goes first within a pair
    cancels a steady drift (warming, clocks) instead of charging it to one build."""
    order: list[str] = []
    for r in range(rounds):
        order += list(sides) if r % 2 == 0 else list(reversed(sides))
    return order


# The simulation documents error rates (README); it decides no verdict, and its output is pinned only
# coarsely (test_error_rates_at_default_repeats), so mutation testing leaves it out.
# pragma: no mutate start
def _noisy(true_time: float, cv: float, rng: random.Random) -> float:
    t = true_time * math.exp(rng.gauss(0.0, cv))
    return t * (1 + SIM_OUTLIER_SIZE) if rng.random() < SIM_OUTLIER_PROB else t


def simulate(
    true_ratio: float,
    repeats: int,
    *,
    trials: int = 2000,
    paired: bool = True,
    threshold: float = DEFAULT_THRESHOLD,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> dict[Verdict, float]:
    """Share of each verdict over ``trials`` simulated comparisons with our noise model."""
    rng = random.Random(seed)
    counts = dict.fromkeys(Verdict, 0)
    for _ in range(trials):
        cv = rng.uniform(*SIM_CV_RANGE)
        base = [_noisy(1.0, cv, rng) for _ in range(repeats)]
        cand = [_noisy(true_ratio, cv, rng) for _ in range(repeats)]
        effect = paired_effect(base, cand, confidence) if paired else unpaired_effect(base, cand, confidence)
        counts[decide(effect, threshold)] += 1
    return {v: c / trials for v, c in counts.items()}
    # pragma: no mutate end
