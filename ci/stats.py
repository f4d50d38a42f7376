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
METHOD_BLOCKED = "hodges-lehmann over blocks (log ratio of block medians), wilcoxon signed-rank CI over blocks"
METHOD_BLOCKED_UNPAIRED = "hodges-lehmann log shift of block medians, mann-whitney CI over blocks"
METHOD_BLOCKED_BASELINE = ("hodges-lehmann over blocks paired by index with the baseline's (the same inputs), "
                           "wilcoxon signed-rank CI over blocks")  # fmt: skip
# The noise model of the simulation, measured on an H200 (vLLM 0.26.0, CUDA graphs of 20 calls):
# per-sample CV 0.2-0.7% and rare +7% outliers.
SIM_CV_RANGE = (0.002, 0.007)
SIM_OUTLIER_PROB = 0.03
SIM_OUTLIER_SIZE = 0.07
# Per-capture systematic error, measured on two H200s (default suite, vLLM 0.25.1): over the 63 cases
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


def _signed_rank(d: Sequence[float], confidence: float, method: str, n_base: int, n_cand: int) -> Effect:
    """Hodges-Lehmann estimate of the centre of ``d`` with the Wilcoxon signed-rank interval."""
    n = len(d)
    walsh = sorted((d[i] + d[j]) / 2 for i in range(n) for j in range(i, n))
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    k = math.floor(n * (n + 1) / 4 - _z(confidence) * sd)
    return _effect(walsh, k, confidence, method, n_base, n_cand)


def paired_effect(base: Sequence[float], cand: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> Effect:
    """Hodges-Lehmann paired log-ratio with the Wilcoxon signed-rank interval (normal approximation)."""
    if len(base) != len(cand) or not base:
        raise ValueError(f"paired samples need equal, non-zero lengths (got {len(base)} and {len(cand)})")
    if min(*base, *cand) <= 0:
        raise ValueError("timings must be positive")
    d = [math.log(c / b) for b, c in zip(base, cand, strict=True)]
    return _signed_rank(d, confidence, METHOD_PAIRED, len(d), len(d))


def within_blocks(samples: Sequence[float], blocks: Sequence[int]) -> list[float]:
    """Each sample over its block's median: the jitter within a capture, without the differences between
    blocks (fresh inputs and addresses each, by design)."""
    meds = dict(zip(sorted(set(blocks)), block_medians(samples, blocks), strict=True))
    return [x / meds[b] for x, b in zip(samples, blocks, strict=True)]


def block_medians(samples: Sequence[float], blocks: Sequence[int]) -> list[float]:
    """The median of each block's samples, in block order (``blocks[i]`` is the block of ``samples[i]``)."""
    if len(samples) != len(blocks) or not samples:
        raise ValueError(f"each sample needs its block (got {len(samples)} samples, {len(blocks)} block ids)")
    grouped: dict[int, list[float]] = {}
    for x, b in zip(samples, blocks, strict=True):
        grouped.setdefault(b, []).append(x)
    return [median(grouped[b]) for b in sorted(grouped)]


def blocked_effect(base_blocks: Sequence[float], cand_blocks: Sequence[float], confidence: float = DEFAULT_CONFIDENCE,
                   *, n_base: int | None = None, n_cand: int | None = None) -> Effect:  # fmt: skip
    """The effect over blocks: block ``b`` of each build is one fresh capture (fresh inputs, fresh
    addresses, its own order of builds) timed for a few rounds, and contributes one number, the log
    ratio of the two block medians. The Hodges-Lehmann estimate and the Wilcoxon signed-rank interval
    are taken over those block numbers, so a capture's systematic error (the same kernels timed 1-3%
    apart in two captures) is part of the spread the interval describes, not hidden under it."""
    if len(base_blocks) != len(cand_blocks) or not base_blocks:
        raise ValueError(f"blocks must pair up (got {len(base_blocks)} and {len(cand_blocks)})")
    if min(*base_blocks, *cand_blocks) <= 0:
        raise ValueError("timings must be positive")
    d = [math.log(c / b) for b, c in zip(base_blocks, cand_blocks, strict=True)]
    return _signed_rank(d, confidence, METHOD_BLOCKED, n_base or len(d), n_cand or len(d))


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
    blocks: int = 0,
) -> dict[Verdict, float]:
    """Share of each verdict over ``trials`` simulated comparisons with our noise model.

    ``capture_sd`` adds the per-capture systematic error (with its rare large shift); ``blocks`` > 0
    times each build in that many captures (``repeats // blocks`` rounds each) and judges with the
    blocked method (paired) or the Mann-Whitney interval over block medians (unpaired); 0 is one
    capture per build and the per-sample method, as before."""
    rng = random.Random(seed)
    counts = dict.fromkeys(Verdict, 0)
    n_blocks = blocks or 1
    rounds = repeats // n_blocks
    for _ in range(trials):
        cv = rng.uniform(*SIM_CV_RANGE)
        base_b, cand_b = [], []
        for _ in range(n_blocks):
            cb, cc = _capture(rng, capture_sd), _capture(rng, capture_sd)
            base_b.append([_noisy(cb, cv, rng) for _ in range(rounds)])
            cand_b.append([_noisy(true_ratio * cc, cv, rng) for _ in range(rounds)])
        if blocks:
            mb, mc = [median(x) for x in base_b], [median(x) for x in cand_b]
            effect = blocked_effect(mb, mc, confidence) if paired else unpaired_effect(mb, mc, confidence)
        else:
            base, cand = base_b[0], cand_b[0]
            effect = paired_effect(base, cand, confidence) if paired else unpaired_effect(base, cand, confidence)
        counts[decide(effect, threshold)] += 1
    return {v: c / trials for v, c in counts.items()}
    # pragma: no mutate end
