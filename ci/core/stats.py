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

A run whose evidence is incomplete (``ci.core.evidence``: cases, rounds or samples missing) is
INCOMPLETE whatever its intervals say; only a proven FAIL outranks it.

The README states the false-alarm and detection rates measured with :func:`simulate`.
"""

from __future__ import annotations

import enum
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

DEFAULT_THRESHOLD = 0.03
DEFAULT_CONFIDENCE = 0.95
METHOD_PAIRED = "hodges-lehmann paired log-ratio, wilcoxon signed-rank CI"
METHOD_UNPAIRED = "hodges-lehmann log shift, mann-whitney CI"
METHOD_CAPTURES = "hodges-lehmann over captures (log ratio of capture medians), wilcoxon signed-rank CI over captures"
METHOD_CAPTURES_UNPAIRED = "hodges-lehmann log shift of capture medians, mann-whitney CI over captures"
METHOD_CAPTURES_BASELINE = (
    "hodges-lehmann over captures paired by index with the baseline's (the same inputs), "
    "wilcoxon signed-rank CI over captures"
)
METHOD_BETWEEN_RUNS = "over the base side's shift between the two runs (the between-run error), with its interval"
# The noise model of the simulation, measured on an H200 (the kernel bench's CUDA graphs of 20 calls):
# per-sample CV 0.2-0.7% and rare +7% outliers.
SIM_CV_RANGE = (0.002, 0.007)
SIM_OUTLIER_PROB = 0.03
SIM_OUTLIER_SIZE = 0.07
# Per-capture systematic error, measured on two H200s (the kernel bench's default suite): over the 63 cases
# where both builds run the same kernels, the A/B log ratio had SD 0.42% (one H200) and 0.45% (the other):
# about 0.3% a capture. One case of the 63 (qwen3-30b-a3b/ep4/tpr1) sat at +3.1% and +2.5% on the two.
SIM_CAPTURE_SD = 0.003
SIM_CAPTURE_OUTLIER_PROB = 1 / 63
SIM_CAPTURE_OUTLIER_SIZE = 0.028


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


def positive_times(xs) -> bool:
    """``xs`` is a non-empty list of finite positive numbers (booleans are not numbers here)."""
    return (
        isinstance(xs, list)
        and bool(xs)
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in xs)
    )


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def iqr(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[2] - q[0]


def z_score(confidence: float) -> float:
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


# Order statistics of the pairwise values (Walsh averages, cross differences): up to EXACT_PAIRS of them are
# listed and sorted; beyond, each one asked for is found by halving a window of values that holds it, each
# step counting the pairs at or below a value in one linear pass, until the window holds at most WINDOW
# pairs, which are listed: O(n) memory, the same number as the sorted list's.
EXACT_PAIRS = 20_000
WINDOW = 4_096
HALVINGS = 2_200  # halvings of a window of floats until none lies inside: 2 x 1,024 exponents + 53 bits is enough


class _Pairs:
    """The multiset of ``(x[i] + x[j]) / 2`` (i <= j: the Walsh averages) or ``y[j] - x[i]`` (all i, j: the
    cross differences) of sorted inputs, asked for its order statistics without listing it when it is
    large. Halving a float is exact and keeps the order, so a Walsh average is found as a sum, halved."""

    def __init__(self, x: list[float], y: list[float] | None = None) -> None:
        self.x, self.y = x, y
        n = len(x)
        self.size = n * (n + 1) // 2 if y is None else n * len(y)
        self._sorted = sorted(self._all()) if self.size <= EXACT_PAIRS else None

    def _all(self):
        x, y = self.x, self.y
        if y is None:
            return ((x[i] + x[j]) / 2 for i in range(len(x)) for j in range(i, len(x)))
        return (c - b for b in x for c in y)

    def _last_at_most(self, t: float) -> list[int]:
        """Per row i (an x value), how many of its pairs are at or below ``t`` (one linear pass)."""
        x, y, counts = self.x, self.y, []
        if y is None:  # row i: x[i] + x[j] for j >= i; for rising i the last j at or below t does not rise
            j = len(x) - 1
            for i in range(len(x)):
                while j >= i and x[i] + x[j] > t:
                    j -= 1
                counts.append(max(j - i + 1, 0))
            return counts
        j = 0  # row i: y[j] - x[i] for all j; for rising x[i] the count at or below t does not fall
        for b in x:
            while j < len(y) and y[j] - b <= t:
                j += 1
            counts.append(j)
        return counts

    def _count_at_most(self, t: float) -> int:
        """How many pairs are at or below ``t``: :meth:`_last_at_most` summed, without the list."""
        x, y, count = self.x, self.y, 0
        if y is None:
            j = len(x) - 1
            for i in range(len(x)):
                while j >= i and x[i] + x[j] > t:
                    j -= 1
                if j < i:
                    break
                count += j - i + 1
            return count
        j = 0
        for b in x:
            while j < len(y) and y[j] - b <= t:
                j += 1
            count += j
        return count

    def _between(self, lo: float, hi: float) -> list[float]:
        """The pairs in (lo, hi], listed."""
        x, y, values = self.x, self.y, []
        for i, (a, b) in enumerate(zip(self._last_at_most(lo), self._last_at_most(hi), strict=True)):
            if y is None:
                values += [x[i] + x[j] for j in range(i + a, i + b)]
            else:
                values += [y[j] - x[i] for j in range(a, b)]
        return values

    def kth(self, k: int) -> float:
        """The ``k``-th smallest (0-based)."""
        if self._sorted is not None:
            return self._sorted[k]
        x, y = self.x, self.y
        lo, hi = (x[0] + x[0], x[-1] + x[-1]) if y is None else (y[0] - x[-1], y[-1] - x[0])
        lo, below, above = math.nextafter(lo, -math.inf), 0, self.size
        for _ in range(HALVINGS):  # the k-th lies in (lo, hi]: ``below`` pairs are at or below lo, ``above`` at hi
            if above - below <= WINDOW:
                found = sorted(self._between(lo, hi))[k - below]
                break
            mid = lo / 2 + hi / 2
            if not lo < mid < hi:  # no float between them: every pair in the window equals hi
                found = hi
                break
            at_most = self._count_at_most(mid)
            if at_most > k:
                hi, above = mid, at_most
            else:
                lo, below = mid, at_most
        else:  # HALVINGS halve any window of floats down to none inside: not reached with a correct count
            found = hi
        return found / 2 if y is None else found

    def median(self) -> float:
        """As ``statistics.median`` of the sorted values: the middle one, or the mean of the middle two."""
        half = self.size // 2
        return self.kth(half) if self.size % 2 else (self.kth(half - 1) + self.kth(half)) / 2


def order_stat_interval(pairs: _Pairs, k: int) -> tuple[float, float]:
    """[x_(k+1), x_(N-k)] (1-based), or (-inf, inf) when there are too few values."""
    if k < 0 or k >= pairs.size - k:
        return -math.inf, math.inf
    return pairs.kth(k), pairs.kth(pairs.size - 1 - k)


def _effect(pairs: _Pairs, k: int, confidence: float, method: str, n_base: int, n_cand: int) -> Effect:
    """The median of the pairwise log values and its order-statistic interval, as ratios."""
    lo, hi = order_stat_interval(pairs, k)
    return Effect(
        ratio=_exp(pairs.median()),
        ci_low=_exp(lo) if lo > -math.inf else 0.0,
        ci_high=_exp(hi) if hi < math.inf else math.inf,
        confidence=confidence,
        method=method,
        n_base=n_base,
        n_candidate=n_cand,
    )


def _exp(x: float) -> float:
    """exp, with a log ratio past what a float holds as inf (or 0): no OverflowError for extreme timings."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def signed_rank_k(n: int, confidence: float) -> int:
    """How many Walsh averages the Wilcoxon signed-rank interval of ``n`` values leaves out at each end (normal
    approximation); below 0 the interval is unbounded: ``n`` is too few for ``confidence``."""
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    return math.floor(n * (n + 1) / 4 - z_score(confidence) * sd)


def least_decisive(confidence: float) -> int:
    """The fewest values whose signed-rank interval at ``confidence`` is bounded (5 at 95%, 7 at 97.5%, 9 at 99.17%)."""
    n = 1
    while signed_rank_k(n, confidence) < 0:
        n += 1
    return n


def _signed_rank(d: Sequence[float], confidence: float, method: str, n_base: int, n_cand: int) -> Effect:
    """Hodges-Lehmann estimate of the centre of ``d`` with the Wilcoxon signed-rank interval."""
    return _effect(_Pairs(sorted(d)), signed_rank_k(len(d), confidence), confidence, method, n_base, n_cand)


def paired_effect(base: Sequence[float], cand: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> Effect:
    """Hodges-Lehmann paired log-ratio with the Wilcoxon signed-rank interval (normal approximation)."""
    if len(base) != len(cand) or not base:
        raise ValueError(f"paired samples need equal, non-zero lengths (got {len(base)} and {len(cand)})")
    if min(*base, *cand) <= 0:
        raise ValueError("timings must be positive")
    d = [math.log(c) - math.log(b) for b, c in zip(base, cand, strict=True)]  # c / b may leave the floats
    return _signed_rank(d, confidence, METHOD_PAIRED, len(d), len(d))


def within_captures(samples: Sequence[float], captures: Sequence[int]) -> list[float]:
    """Each sample over its capture's median: the jitter within a capture, without the differences between
    captures (fresh inputs and addresses each, by design)."""
    meds = dict(zip(sorted(set(captures)), capture_medians(samples, captures), strict=True))
    return [x / meds[b] for x, b in zip(samples, captures, strict=True)]


def capture_medians(samples: Sequence[float], captures: Sequence[int]) -> list[float]:
    """The median of each capture's samples, in capture order (``captures[i]`` is the capture of ``samples[i]``)."""
    if len(samples) != len(captures) or not samples:
        raise ValueError(f"each sample needs its capture (got {len(samples)} samples, {len(captures)} capture ids)")
    grouped: dict[int, list[float]] = {}
    for x, b in zip(samples, captures, strict=True):
        grouped.setdefault(b, []).append(x)
    return [median(grouped[b]) for b in sorted(grouped)]


def capture_effect(
    base_captures: Sequence[float],
    cand_captures: Sequence[float],
    confidence: float = DEFAULT_CONFIDENCE,
    *,
    n_base: int | None = None,
    n_cand: int | None = None,
) -> Effect:
    """The effect over captures: capture ``b`` of each build is one fresh capture (fresh inputs, fresh
    addresses, its own order of builds) timed for a few rounds, and contributes one number, the log
    ratio of the two capture medians. The Hodges-Lehmann estimate and the Wilcoxon signed-rank interval
    are taken over those capture numbers, so a capture's systematic error (the same kernels timed 1-3%
    apart in two captures) is part of the spread the interval describes, not hidden under it."""
    if len(base_captures) != len(cand_captures) or not base_captures:
        raise ValueError(f"captures must pair up (got {len(base_captures)} and {len(cand_captures)})")
    if min(*base_captures, *cand_captures) <= 0:
        raise ValueError("timings must be positive")
    d = [math.log(c) - math.log(b) for b, c in zip(base_captures, cand_captures, strict=True)]
    return _signed_rank(d, confidence, METHOD_CAPTURES, n_base or len(d), n_cand or len(d))


def unpaired_effect(base: Sequence[float], cand: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> Effect:
    """Hodges-Lehmann shift of log times with the Mann-Whitney interval (normal approximation)."""
    if not base or not cand:
        raise ValueError("both samples must be non-empty")
    if min(*base, *cand) <= 0:
        raise ValueError("timings must be positive")
    lb, lc = sorted(math.log(x) for x in base), sorted(math.log(x) for x in cand)
    n, m = len(lb), len(lc)
    k = math.floor(n * m / 2 - z_score(confidence) * math.sqrt(n * m * (n + m + 1) / 12))
    return _effect(_Pairs(lb, lc), k, confidence, METHOD_UNPAIRED, n, m)


def between_runs(effect: Effect, drift: Effect) -> Effect:
    """``effect`` (a build of this run against the same build of a stored run) with the error between the two
    runs taken out and its uncertainty put in: ``drift`` is a build that did not change, measured the same way
    (this run's base against the stored base), and whatever moved it (a board, a machine start, a process:
    code-free) moved the judged build too. So the estimate is divided by the drift's, and the interval is the
    quotient of the two intervals at their far ends (``effect.ci_low / drift.ci_high``, ``effect.ci_high /
    drift.ci_low``): a run-to-run shift the captures of one run cannot see is in it, measured, with the
    uncertainty of its measurement. A drift interval that is not bounded bounds nothing."""
    lo, hi = drift.ci_low, drift.ci_high
    method = f"{effect.method}; {METHOD_BETWEEN_RUNS}"
    if not (lo > 0 and math.isfinite(hi)):
        return replace(effect, ci_low=0.0, ci_high=math.inf, method=method)
    return replace(
        effect, ratio=effect.ratio / drift.ratio, ci_low=effect.ci_low / hi, ci_high=effect.ci_high / lo, method=method
    )


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


def _capture(rng: random.Random, capture_sd: float) -> float:
    """The multiplicative error one graph capture adds to every sample timed from it."""
    if capture_sd <= 0:
        return 1.0
    shift = rng.choice((-1, 1)) * SIM_CAPTURE_OUTLIER_SIZE if rng.random() < SIM_CAPTURE_OUTLIER_PROB else 0.0
    return math.exp(rng.gauss(0.0, capture_sd) + shift)


def simulate(
    true_ratio: float,
    repeats: int,
    *,
    trials: int = 2000,
    paired: bool = True,
    threshold: float = DEFAULT_THRESHOLD,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    capture_sd: float = 0.0,
    captures: int = 0,
) -> dict[Verdict, float]:
    """Share of each verdict over ``trials`` simulated comparisons with our noise model.

    ``capture_sd`` adds the per-capture systematic error (with its rare large shift); ``captures`` > 0
    times each build in that many captures (``repeats // captures`` rounds each) and judges with the
    per-capture method (paired) or the Mann-Whitney interval over capture medians (unpaired); 0 is one
    capture per build and the per-sample method, as before."""
    rng = random.Random(seed)
    counts = dict.fromkeys(Verdict, 0)
    n_captures = captures or 1
    rounds = repeats // n_captures
    for _ in range(trials):
        cv = rng.uniform(*SIM_CV_RANGE)
        base_b, cand_b = [], []
        for _ in range(n_captures):
            cb, cc = _capture(rng, capture_sd), _capture(rng, capture_sd)
            base_b.append([_noisy(cb, cv, rng) for _ in range(rounds)])
            cand_b.append([_noisy(true_ratio * cc, cv, rng) for _ in range(rounds)])
        if captures:
            mb, mc = [median(x) for x in base_b], [median(x) for x in cand_b]
            effect = capture_effect(mb, mc, confidence) if paired else unpaired_effect(mb, mc, confidence)
        else:
            base, cand = base_b[0], cand_b[0]
            effect = paired_effect(base, cand, confidence) if paired else unpaired_effect(base, cand, confidence)
        counts[decide(effect, threshold)] += 1
    return {v: c / trials for v, c in counts.items()}
    # pragma: no mutate end
