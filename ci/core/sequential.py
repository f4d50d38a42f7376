"""Sequential verdicts (issue 44): an INCONCLUSIVE case is a question, so its stage adds captures in groups and
judges again, with the error rates held over every look.

The plan is fixed before the run starts (``Plan``): a first look after ``first`` captures of each build, then up
to ``max_extra`` looks, each after ``group`` more. Look ``k`` judges the captures so far with the gate's own
interval (``ci.core.stats.capture_effect``) at the confidence the plan gives it; the first look that decides
(PASS or FAIL) is the verdict, and a case still INCONCLUSIVE at the last look stays so.

The looks share their data, so judging each at the single-look confidence would raise both error rates
(a true +3% case gets several chances to FAIL by luck). The plan therefore spends the error: the two-sided
``alpha = 1 - confidence`` is split over the looks (Bonferroni: ``alpha_1 = alpha * FIRST_SHARE``, the rest
equally over the extra looks), and by the union bound the chance that *any* look errs is at most ``alpha``
whatever the looks' correlation: an always-valid plan, conservative by construction. The price is a first look
slightly wider than the single-look design's (97.5% instead of 95% with the defaults); the gain is that the
captures a case needs are spent only where the question is open. ``simulate`` measures what the plan does with
the noise model of ``ci.core.stats`` (per-sample and per-capture errors measured on the H200).

``Plan.single(confidence)`` is the design without looks (``--sequential off``): one look at the full confidence.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ci.core import stats
from ci.core.errors import DataError

FIRST_SHARE = 0.5  # of alpha, spent at the first look; the rest is shared by the extra looks


@dataclass(frozen=True)
class Plan:
    """When to look and at what confidence: ``first`` captures, then ``max_extra`` groups of ``group``."""

    first: int
    group: int
    max_extra: int
    confidence: float = stats.DEFAULT_CONFIDENCE

    def __post_init__(self) -> None:
        if self.first < 1 or self.group < 1 or self.max_extra < 0 or not 0 < self.confidence < 1:
            raise ValueError(f"a plan needs first >= 1, group >= 1, max_extra >= 0, 0 < confidence < 1 (got {self})")

    @classmethod
    def single(cls, captures: int, confidence: float = stats.DEFAULT_CONFIDENCE) -> Plan:
        return cls(first=captures, group=1, max_extra=0, confidence=confidence)

    @property
    def looks(self) -> list[int]:
        """The captures of each build judged at each look."""
        return [self.first + k * self.group for k in range(self.max_extra + 1)]

    def confidence_at(self, look: int) -> float:
        """The interval's confidence at look ``look`` (0 = the first)."""
        alpha = 1 - self.confidence
        if self.max_extra == 0:
            return self.confidence
        share = FIRST_SHARE if look == 0 else (1 - FIRST_SHARE) / self.max_extra
        return 1 - alpha * share

    @property
    def most_captures(self) -> int:
        return self.looks[-1]

    def undecidable(self) -> str | None:
        """Why a look of the plan could never decide (too few captures for its interval to be bounded), or None."""
        for k, n in enumerate(self.looks[:2]):  # the first look, and the first extra one (the others have more)
            need = stats.least_decisive(self.confidence_at(k))
            if n < need:
                return (
                    f"its look {k + 1} judges {n} captures at {self.confidence_at(k):.2%}, which needs at least {need}"
                )
        return None

    def to_settings(self, threshold: float) -> dict:
        """What a results file records (``settings.sequential``): the plan, and the threshold the stage judged
        each look at to decide whether to go on."""
        return {
            "first": self.first,
            "group": self.group,
            "max_extra": self.max_extra,
            "confidence": self.confidence,
            "threshold": threshold,
        }

    def describe(self) -> str:
        """One line for the budget a stage prints before it starts."""
        if self.max_extra == 0:
            return f"one look after {self.first} captures ({self.confidence:.1%}; sequential off)"
        return (
            f"a first look after {self.first} captures ({self.confidence_at(0):.2%}), then, while INCONCLUSIVE, up "
            f"to {self.max_extra} x {self.group} more ({self.confidence_at(1):.2%} each): at most {self.most_captures}"
        )


def plan_of(settings: dict, where: str = "results") -> Plan | None:
    """The plan a results file records (``settings.sequential``), or None (a run of one look)."""
    recorded = settings.get("sequential")
    if recorded is None:
        return None
    keys = ("first", "group", "max_extra", "confidence")
    if not isinstance(recorded, dict) or any(k not in recorded for k in keys):
        raise DataError(
            f"{where}: settings.sequential should hold {', '.join(keys)} (got {recorded!r}); re-run the stage"
        )
    try:
        return Plan(**{k: recorded[k] for k in keys})
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: settings.sequential: {exc}; re-run the stage") from exc


def more_captures(medians: dict[str, Sequence[float]], plan: Plan, threshold: float) -> int:
    """How many captures a stage adds now, given the capture medians of each side so far (``base`` and
    ``candidate``, at a look of ``plan``): the next group while the looks so far are INCONCLUSIVE and the plan
    has a look left, else 0."""
    looks = judge(medians["base"], medians["candidate"], plan, threshold)
    if verdict(looks) is not stats.Verdict.INCONCLUSIVE or len(looks) >= len(plan.looks):
        return 0
    return plan.looks[len(looks)] - len(medians["base"])


@dataclass(frozen=True)
class Look:
    captures: int
    confidence: float
    effect: stats.Effect
    verdict: stats.Verdict


def judge(
    base: Sequence[float], cand: Sequence[float], plan: Plan, threshold: float = stats.DEFAULT_THRESHOLD
) -> list[Look]:
    """The looks of ``plan`` over capture medians ``base[i]``, ``cand[i]`` (capture ``i`` of each build: the
    same fresh capture), up to the first that decides or the last the data reaches. At least one look."""
    if len(base) != len(cand):
        raise ValueError(f"captures must pair up (got {len(base)} and {len(cand)})")
    looks: list[Look] = []
    for k, n in enumerate(plan.looks):
        if n > len(base):
            break
        confidence = plan.confidence_at(k)
        effect = stats.capture_effect(base[:n], cand[:n], confidence)
        looks.append(Look(n, confidence, effect, stats.decide(effect, threshold)))
        if looks[-1].verdict is not stats.Verdict.INCONCLUSIVE:
            break
    if not looks:
        raise ValueError(f"the plan's first look needs {plan.first} captures; {len(base)} given")
    return looks


def verdict(looks: Sequence[Look]) -> stats.Verdict:
    return looks[-1].verdict


def look_json(look: Look) -> dict:
    """A look as the verdict file records it."""
    e = look.effect
    return {
        "captures": look.captures,
        "confidence": look.confidence,
        "ratio": e.ratio,
        "ci_low": e.ci_low,
        "ci_high": e.ci_high,
        "verdict": look.verdict.value,
    }


# pragma: no mutate start
def simulate(
    true_ratio: float,
    plan: Plan,
    *,
    rounds: int = 3,
    trials: int = 2000,
    seed: int = 0,
    capture_sd: float = stats.SIM_CAPTURE_SD,
    threshold: float = stats.DEFAULT_THRESHOLD,
) -> dict:
    """Verdict shares, and the captures used (mean and most), of ``plan`` over ``trials`` simulated cases whose
    candidate is ``true_ratio`` times the base, with the noise model of ``ci.core.stats`` (per-sample noise,
    outliers, the per-capture error and its rare shift)."""
    rng = random.Random(seed)
    counts = dict.fromkeys(stats.Verdict, 0)
    used = []
    for _ in range(trials):
        cv = rng.uniform(*stats.SIM_CV_RANGE)
        base, cand = [], []
        for _ in range(plan.most_captures):
            cb, cc = stats._capture(rng, capture_sd), stats._capture(rng, capture_sd)
            base.append(stats.median([stats._noisy(cb, cv, rng) for _ in range(rounds)]))
            cand.append(stats.median([stats._noisy(true_ratio * cc, cv, rng) for _ in range(rounds)]))
        looks = judge(base, cand, plan, threshold)
        counts[verdict(looks)] += 1
        used.append(looks[-1].captures)
    shares = {v.value: c / trials for v, c in counts.items() if c}
    return {
        "true_ratio": true_ratio,
        "shares": shares,
        "mean_captures": sum(used) / trials,
        "most_captures": max(used),
        "first": plan.first,
    }


def table(ratios: Sequence[float], plans: dict[str, Plan], **kw) -> list[dict]:
    """``simulate`` for each plan and true ratio: the rows of the error-rate table (docs/statistics.md)."""
    return [{"plan": name, **simulate(r, plan, **kw)} for name, plan in plans.items() for r in ratios]


# pragma: no mutate end


def extra_share(row: dict) -> float:
    """The captures used beyond the first look, as a share of the first look's (the extra GPU time)."""
    return row["mean_captures"] / row["first"] - 1


if __name__ == "__main__":
    plans = {"single (95%)": Plan.single(30), "sequential 30 + 3 x 10": Plan(first=30, group=10, max_extra=3)}
    for row in table((1.0, 1.02, 1.03, 1.035, 1.05), plans, trials=2000):
        print(row["plan"], row["true_ratio"], row["shares"], f"+{extra_share(row):.1%}", row["most_captures"])
