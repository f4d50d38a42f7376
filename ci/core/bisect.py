"""Bisect a slowdown over an ordered list of builds (issue 41): each step a paired A/B of two builds, judged by the
gate's own statistics, until the first build that is slower is found, with every step's evidence.

The subject does not matter here: a step is whatever ``judge(earlier, later)`` returns (``ci.runner.bisect``
builds the two trees, times them with a subject's bench and reads ``ci.core.compare``'s verdict). The rule:

1. **Confirm** (step 1): the first build against the last. Only a FAIL goes on; a PASS or an INCONCLUSIVE (after
   the bench's own sequential looks) ends the bisect as *not confirmed*: no slowdown above the threshold between
   the two ends, so nothing to look for (a single noisy night never starts a hunt).
2. **Halve**: with ``lo`` known as fast as the first build and ``hi`` known slower, judge ``lo`` against the
   middle ``mid``: FAIL puts the slowdown in ``(lo, mid]`` (``hi = mid``); PASS (or ``SAME``: no file under test
   differs) in ``(mid, hi]`` (``lo = mid``). An INCONCLUSIVE ``lo``-``mid`` asks the other half: ``mid`` against
   ``hi``; FAIL there makes ``mid`` fast, PASS makes it slow, and a second INCONCLUSIVE ends the bisect as
   *undecided* between ``lo`` and ``hi``: the slowdown is spread over several builds or sits at the threshold,
   and the table shows where.
3. **Pin**: when ``lo`` and ``hi`` are neighbours, the pair itself is judged (unless a step already did):
   its FAIL is the evidence that ``hi`` is the first slow build; anything else ends *undecided*.

Steps: 1 + ceil(log2(n - 1)) + 1 at most without INCONCLUSIVE steps, for n builds; a pair is never judged
twice (``judge`` is asked once per pair).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ci.core.errors import UsageError

FAIL, PASS, INCONCLUSIVE, SAME = "FAIL", "PASS", "INCONCLUSIVE", "SAME"  # SAME: no file under test differs
VERDICTS = (FAIL, PASS, INCONCLUSIVE, SAME)
FOUND, NOT_CONFIRMED, UNDECIDED = "found", "not confirmed", "undecided"
BEFORE_COMPILED = "before compiled changes"  # the part sharing the last build's compiled code holds no slowdown


@dataclass(frozen=True, kw_only=True)
class Step:
    """One A/B of the bisect: ``earlier`` is the base side, ``later`` the candidate."""

    earlier: str
    later: str
    verdict: str
    failed: tuple[str, ...] = ()  # the cases that FAILed
    worst: str = ""  # the slowest case as "id ratio [low, high]"
    seconds: float = 0.0
    evidence: str = ""  # where the step's verdict and report are
    note: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise UsageError(f"a bisect step's verdict must be one of {', '.join(VERDICTS)}, not {self.verdict!r}")


@dataclass(kw_only=True)
class Outcome:
    status: str
    builds: tuple[str, ...]
    last_good: str
    first_bad: str
    steps: list[Step] = field(default_factory=list)
    earlier: tuple[str, ...] = ()  # builds before ``builds`` that a compiled change keeps out of the in-process A/B
    compiled: tuple[str, ...] = ()  # the builds among ``earlier`` and ``builds[0]`` that change compiled code

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)


def planned_steps(n: int) -> int:
    """The most steps a bisect of ``n`` builds takes when no step is INCONCLUSIVE."""
    if n < 2:
        raise UsageError(f"a bisect needs at least two builds (got {n})")
    return 1 + math.ceil(math.log2(n - 1)) + (1 if n > 2 else 0)


def bisect(builds: Sequence[str], judge: Callable[[str, str], Step]) -> Outcome:
    """The first build of ``builds`` (oldest first) that is slower than the first one, by the rule above."""
    builds = tuple(builds)
    if len(builds) < 2 or len(set(builds)) != len(builds):
        raise UsageError(f"a bisect needs two or more distinct builds, oldest first (got {list(builds)})")
    done: dict[tuple[int, int], Step] = {}
    outcome = Outcome(status=UNDECIDED, builds=builds, last_good=builds[0], first_bad=builds[-1])

    def ask(i: int, j: int) -> str:
        if (i, j) not in done:
            step = judge(builds[i], builds[j])
            done[(i, j)] = step
            outcome.steps.append(step)
        return done[(i, j)].verdict

    lo, hi = 0, len(builds) - 1
    if ask(lo, hi) != FAIL:
        outcome.status = NOT_CONFIRMED
        return outcome
    while hi - lo > 1:
        mid = (lo + hi) // 2
        first = ask(lo, mid)
        if first == FAIL:
            hi = mid
        elif first in (PASS, SAME):
            lo = mid
        else:
            second = ask(mid, hi)
            if second == INCONCLUSIVE:
                outcome.last_good, outcome.first_bad = builds[lo], builds[hi]
                return outcome
            lo, hi = (mid, hi) if second == FAIL else (lo, mid)
    outcome.last_good, outcome.first_bad = builds[lo], builds[hi]
    outcome.status = FOUND if ask(lo, hi) == FAIL else UNDECIDED
    return outcome


def bisect_past_compiled(builds: Sequence[str], compiled: Sequence[int], judge: Callable[[str, str], Step]) -> Outcome:
    """The bisect of ``builds`` when those at the indices ``compiled`` change compiled code (a release's kernels).

    Only builds that share compiled code can be an in-process A/B, and the trees hold the last build's kernels,
    so the part from the last compiled change to the last build (``builds[k:]``) is bisected by the rule above.
    A slowdown found there is the answer. When that part's ends are not apart, any slowdown from the first build
    on lies at or before ``builds[k]``, across the compiled changes: the outcome is ``BEFORE_COMPILED`` and names
    them, for builds from source. Without compiled changes this is :func:`bisect`."""
    builds = tuple(builds)
    if not compiled:
        return bisect(builds, judge)
    if any(not 0 < i < len(builds) for i in compiled):
        raise UsageError(
            f"compiled changes at {sorted(compiled)}: each must be a build after the first of {len(builds)}"
        )
    k = max(compiled)
    if k == len(builds) - 1:
        raise UsageError(
            f"the last build {builds[-1]} itself changes compiled code, so no build before it shares its kernels: "
            "give a later --bad, or judge the two ends with builds from source"
        )
    outcome = bisect(builds[k:], judge)
    outcome.earlier, outcome.compiled = builds[:k], tuple(builds[i] for i in sorted(compiled))
    if outcome.status == NOT_CONFIRMED:
        outcome.status, outcome.last_good, outcome.first_bad = BEFORE_COMPILED, builds[0], builds[k]
    return outcome


def headline(outcome: Outcome) -> str:
    """One sentence: what the bisect found."""
    if outcome.status == NOT_CONFIRMED:
        first = outcome.steps[0]
        return (
            f"not confirmed: {outcome.builds[-1]} against {outcome.builds[0]} is {first.verdict} "
            f"({first.worst or 'no case slower'}); nothing to bisect"
        )
    if outcome.status == BEFORE_COMPILED:
        first = outcome.steps[0]
        return (
            f"not after the compiled changes: {outcome.builds[-1]} against {outcome.builds[0]} is {first.verdict} "
            f"({first.worst or 'no case slower'}); any slowdown since {outcome.earlier[0]} lies at or before "
            f"{outcome.first_bad}, across {len(outcome.compiled)} build(s) that change compiled code "
            f"({', '.join(outcome.compiled)}): judge each pair there with builds from source"
        )
    if outcome.status == UNDECIDED:
        return (
            f"undecided: the slowdown lies between {outcome.last_good} (fast) and {outcome.first_bad} (slow), "
            "and no single build between them is slower than the one before it by more than the threshold"
        )
    pinned = next(s for s in outcome.steps if (s.earlier, s.later) == (outcome.last_good, outcome.first_bad))
    return (
        f"first slow build: {outcome.first_bad} (after {outcome.last_good}): {pinned.worst}, "
        f"confirmed by its own A/B ({len(pinned.failed)} case(s) FAIL)"
    )


def markdown(outcome: Outcome) -> str:
    """The bisect's report: the headline, then every step with its verdict and evidence."""
    lines = [
        f"### Bisect: {headline(outcome)}",
        "",
        f"{len(outcome.builds)} builds, {len(outcome.steps)} steps (at most {planned_steps(len(outcome.builds))} "
        f"when none is INCONCLUSIVE), {outcome.seconds:.0f} s.",
        *(
            [
                "",
                f"Not timed: the {len(outcome.earlier)} build(s) from {outcome.earlier[0]} to {outcome.earlier[-1]}, "
                f"whose compiled code is not {outcome.builds[-1]}'s (compiled changes: {', '.join(outcome.compiled)}).",
            ]
            if outcome.earlier
            else []
        ),
        "",
        "| step | base (earlier) | candidate (later) | verdict | cases FAIL | slowest case, ratio [95%] | s | "
        "evidence |",
        "|---:|---|---|---|---:|---|---:|---|",
    ]
    for n, s in enumerate(outcome.steps, 1):
        note = f" ({s.note})" if s.note else ""
        lines.append(
            f"| {n} | {s.earlier} | {s.later} | {s.verdict}{note} | {len(s.failed)} | {s.worst or '-'} | "
            f"{s.seconds:.0f} | {s.evidence or '-'} |"
        )
    return "\n".join(lines) + "\n"
