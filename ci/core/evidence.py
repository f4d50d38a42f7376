"""What a verdict needs: the evidence rules, in one place, as pure functions.

A gate that passes an empty or partial run is worse than none, so every judgement (``ci.core.compare``)
and every baseline (``ci.core.baselines record``) first asks this module what is missing. Each
problem is one line naming the case or setting and what to do; any problem makes the run
INCOMPLETE (exit 10), whatever its intervals say. What a complete run is comes from the gate's own
definitions, which the results' subject gives (``ci.core.subjects``), never from what the file says of
itself (a ``complete: true`` proves nothing). The rules:

* at least one case, and exactly the cases the subject defines for the file's suite (and the run's
  case filter): none missing, none more;
* ``settings.complete`` is not false (an interrupted run says so);
* every case has at least :data:`MIN_SAMPLES` samples of each build it is judged on (or the subject's
  own minimum, e.g. the rounds of a serving profile), in at least the subject's number of fresh captures;
* no problem the subject finds in a case (failed requests, outputs that disagree);
* against a baseline: every case of the baseline is in the run, the case identity the stage
  declared (``settings.identity_keys``: model, config hash, profile, ...) is the same in both, and
  the baseline itself is complete by the same rules;
* a baseline: all of the above, no failed case, and the whole suite (no ``case_filter``).

Cases the stage could not measure because the candidate failed (``settings.failed_cases``) are not
"missing": ``ci.core.compare`` turns them into FAIL verdicts.
"""

from __future__ import annotations

from collections.abc import Iterable

from ci.core import sequential, subjects
from ci.core.errors import GateError
from ci.core.results import BenchResults

# A 95% Wilcoxon signed-rank interval cannot be bounded with fewer than 6 pairs, nor a
# Mann-Whitney one with fewer than 4 + 4; 6 a build is the floor (ci.kernel.bench refuses fewer repeats).
MIN_SAMPLES = 6
SHOWN = 5  # ids listed in a message before "and N more"


def shown(ids: Iterable[str]) -> str:
    """The first :data:`SHOWN` ids, then "and N more"."""
    ids = list(ids)
    head = ", ".join(ids[:SHOWN])
    return head + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "")


def failed_cases(results: BenchResults) -> dict[str, str]:
    """Cases the stage recorded as failed (the candidate crashed or computed wrong numbers): id -> why."""
    return dict(results.settings.get("failed_cases") or {})


def _case_set_problems(results: BenchResults, subject: subjects.Subject) -> list[str]:
    try:
        expected = subject.expected_cases(results)
    except GateError as exc:
        return [str(exc)]
    have = {c.id for c in results.cases} | set(failed_cases(results))
    wanted = set(expected)
    problems = []
    missing = [i for i in expected if i not in have]
    if missing:
        problems.append(
            f"{len(missing)} of the {len(expected)} cases of suite {results.suite!r} are missing: {shown(missing)}"
        )
    unexpected = [c.id for c in results.cases if c.id not in wanted]
    if unexpected:
        problems.append(
            f"{len(unexpected)} cases are not in suite {results.suite!r} as the gate defines it: {shown(unexpected)}"
        )
    return problems


def run_problems(
    results: BenchResults,
    *,
    sides: tuple[str, ...] = ("base", "candidate"),
    design_floors: bool = True,
    case_set: bool = True,
) -> list[str]:
    """What is missing from one run, judged on ``sides``. ``design_floors=False`` leaves out the subject's
    floors of samples and captures (its suite's design today, e.g. a profile's launch pairs), keeping the
    core's: for pooling finished runs of an earlier design (ci.core.resample), never for a verdict.
    ``case_set=False`` leaves out the check that the run holds exactly the cases its suite has today (a run of
    an earlier version of the suite: the history keys its series by the suite's version), never for a verdict."""
    problems: list[str] = []
    subject = subjects.subject_of(results.kind)
    if not results.cases and not failed_cases(results):
        problems.append("the results hold no case: nothing was measured")
    settings = results.settings
    if settings.get("complete") is False:
        done = settings.get("rounds_done")
        problems.append(
            "the run did not finish (complete: false"
            + (f", {done} rounds done" if done is not None else "")
            + "): re-run it, or rebuild it from its folder only to look at it"
        )
    if case_set:
        problems += _case_set_problems(results, subject)
    floor, least_captures = MIN_SAMPLES, 1
    try:
        if design_floors:
            floor, least_captures = max(MIN_SAMPLES, subject.min_samples(results)), subject.min_captures(results)
    except GateError:
        pass  # the suite is not one the subject defines: said above
    plan = sequential.plan_of(settings, "the results")
    if plan is not None and design_floors:  # the plan's first look judges that many: fewer is an unfinished run
        least_captures = max(least_captures, plan.first)
    for case in results.cases:
        for side in sides:
            n = len(case.samples.get(side, []))
            if side not in case.samples:
                problems.append(f"case {case.id}: no samples of build {side!r}")
            elif n < floor:
                problems.append(f"case {case.id}: {n} sample(s) of {side!r}, at least {floor} are needed")
            elif (k := subjects.captures(case, side)) < least_captures:
                problems.append(
                    f"case {case.id}: {k} capture(s) of {side!r}, at least {least_captures} are "
                    "needed (the interval is over captures)"
                )
        problems += [f"case {case.id}: {p}" for p in subject.case_problems(case)]
    return problems


def baseline_problems(results: BenchResults, baseline: BenchResults, side: str) -> list[str]:
    """What is missing for judging ``side`` of ``results`` against a stored ``baseline``."""
    problems = run_problems(results, sides=(side,))
    problems += [f"the baseline: {p}" for p in record_problems(baseline)]
    ids = {c.id for c in results.cases} | set(failed_cases(results))
    missing = [c.id for c in baseline.cases if c.id not in ids]
    if missing:
        problems.append(
            f"{len(missing)} of the baseline's {len(baseline.cases)} cases are not in this run: {shown(missing)}; "
            "run the whole suite (a subset cannot pass for it)"
        )
    keys = results.settings.get("identity_keys") or []
    stored_cases = baseline.by_id()
    for case in results.cases:
        stored = stored_cases.get(case.id)
        if stored is None:
            continue
        differ = [k for k in keys if k in case.info and k in stored.info and case.info[k] != stored.info[k]]
        if differ:
            problems.append(
                f"case {case.id}: {', '.join(differ)} differ from the baseline's: it measured something else; "
                "compare like with like, or re-record the baseline"
            )
    return problems


def record_problems(results: BenchResults, *, case_set: bool = True) -> list[str]:
    """What keeps a run from becoming a baseline (or a history entry): the rules of a verdict, and none of its
    cases failed. ``case_set=False``: as ``run_problems``, for the history only."""
    problems = run_problems(results, case_set=case_set)
    failed = failed_cases(results)
    if failed:
        problems.append(f"{len(failed)} case(s) failed in the run: {shown(failed)}")
    subset = results.settings.get("case_filter")
    if subset:
        problems.append(f"the run measured only the cases matching {subset!r}: a subset cannot stand for its suite")
    return problems
