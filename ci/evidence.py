"""What a verdict needs: the evidence rules, in one place, as pure functions.

A gate that passes an empty or partial run is worse than none, so every judgement (``ci.compare``)
and every baseline (``ci.baselines record``) first asks this module what is missing. Each
problem is one line naming the case or setting and what to do; any problem makes the run
INCOMPLETE (exit 10), whatever its intervals say. The rules:

* at least one case, and no case of ``settings.expected_cases`` (the cases the stage set out to
  measure) missing; a file that lists none must say ``complete: true``;
* ``settings.complete`` is not false (an interrupted run);
* every case has at least :data:`MIN_SAMPLES` samples of each build it is judged on, and, when it
  was timed in blocks (fresh captures), at least :data:`MIN_BLOCKS` blocks;
* no failed requests in a round and no correctness failure recorded in a case;
* against a baseline: every case of the baseline is in the run, and the case identity the stage
  declared (``settings.identity_keys``: model, config hash, profile, ...) is the same in both;
* a baseline: all of the above, no failed case, and the whole suite (no ``case_filter``).

Cases the stage could not measure because the candidate failed (``settings.failed_cases``) are not
"missing": ``ci.compare`` turns them into FAIL verdicts.
"""

from __future__ import annotations

from collections.abc import Iterable

from ci.results import BenchResults

# A 95% Wilcoxon signed-rank interval cannot be bounded with fewer than 6 pairs, nor a
# Mann-Whitney one with fewer than 4 + 4; 6 a build is the floor (ci.bench refuses fewer repeats).
MIN_SAMPLES = 6
MIN_BLOCKS = 6  # the same floor for results timed in blocks (the interval is over blocks)
SHOWN = 5  # ids listed in a message before "and N more"


def _ids(ids: Iterable[str]) -> str:
    ids = list(ids)
    head = ", ".join(ids[:SHOWN])
    return head + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "")


def failed_cases(results: BenchResults) -> dict[str, str]:
    """Cases the stage recorded as failed (the candidate crashed or computed wrong numbers): id -> why."""
    failed = results.settings.get("failed_cases") or {}
    return {str(k): str(v) for k, v in failed.items()} if isinstance(failed, dict) else {}


def _blocks(case, side: str) -> set:
    """The blocks (fresh captures) ``side`` of ``case`` was timed in; empty for results timed in one capture."""
    blocks = case.extra.get("blocks")
    ids = blocks.get(side) if isinstance(blocks, dict) else None
    return set(ids) if isinstance(ids, list) else set()


def run_problems(results: BenchResults, *, sides: tuple[str, ...] = ("base", "candidate")) -> list[str]:
    """What is missing from one run, judged on ``sides``."""
    problems: list[str] = []
    ids = [c.id for c in results.cases]
    failed = failed_cases(results)
    if not ids and not failed:
        problems.append("the results hold no case: nothing was measured")
    settings = results.settings
    if settings.get("complete") is False:
        done = settings.get("rounds_done")
        problems.append(
            "the run did not finish (complete: false"
            + (f", {done} rounds done" if done is not None else "")
            + "): re-run it, or rebuild it from its folder only to look at it"
        )
    expected = settings.get("expected_cases")
    if expected is None:
        if settings.get("complete") is not True:
            problems.append(
                "the results do not list the cases the run set out to measure (settings.expected_cases) nor say "
                "it completed: they come from an older gate or were edited; re-run the stage"
            )
    else:
        missing = [i for i in expected if i not in ids and i not in failed]
        if missing:
            problems.append(f"{len(missing)} of the {len(expected)} expected cases are missing: {_ids(missing)}")
        unexpected = [i for i in ids if i not in expected]
        if unexpected:
            problems.append(f"{len(unexpected)} cases were not expected by the run: {_ids(unexpected)}")
    for case in results.cases:
        for side in sides:
            n = len(case.samples.get(side, []))
            if side not in case.samples:
                problems.append(f"case {case.id}: no samples of build {side!r}")
            elif n < MIN_SAMPLES:
                problems.append(f"case {case.id}: {n} sample(s) of {side!r}, at least {MIN_SAMPLES} are needed")
            elif 1 < len(blocks := _blocks(case, side)) < MIN_BLOCKS:  # one block is one capture, as before
                problems.append(f"case {case.id}: {len(blocks)} block(s) of {side!r}, at least {MIN_BLOCKS} are "
                                "needed (the interval is over blocks)")  # fmt: skip
        rounds = case.extra.get("rounds") or []
        bad = [r for r in rounds if isinstance(r, dict) and (r.get("failed") or r.get("completed") == 0)]
        if bad:
            problems.append(f"case {case.id}: {len(bad)} round(s) with failed requests; see the server logs and re-run")
        correctness = case.extra.get("correctness")
        if isinstance(correctness, dict) and correctness.get("ok") is False:
            problems.append(f"case {case.id}: the builds' outputs disagree ({correctness.get('error', 'no detail')})")
    return problems


def baseline_problems(results: BenchResults, baseline: BenchResults, side: str) -> list[str]:
    """What is missing for judging ``side`` of ``results`` against a stored ``baseline``."""
    problems = run_problems(results, sides=(side,))
    ids = {c.id for c in results.cases} | set(failed_cases(results))
    missing = [c.id for c in baseline.cases if c.id not in ids]
    if missing:
        problems.append(
            f"{len(missing)} of the baseline's {len(baseline.cases)} cases are not in this run: {_ids(missing)}; "
            "run the whole suite (a subset cannot pass for it)"
        )
    keys = [k for k in results.settings.get("identity_keys") or [] if isinstance(k, str)]
    for case in results.cases:
        stored = baseline.case(case.id)
        if stored is None:
            continue
        differ = [k for k in keys if k in case.info and k in stored.info and case.info[k] != stored.info[k]]
        if differ:
            problems.append(
                f"case {case.id}: {', '.join(differ)} differ from the baseline's: it measured something else; "
                "compare like with like, or re-record the baseline"
            )
    return problems


def record_problems(results: BenchResults) -> list[str]:
    """What keeps a run from becoming a baseline: the rules of a verdict, and none of its cases failed."""
    problems = run_problems(results)
    failed = failed_cases(results)
    if failed:
        problems.append(f"{len(failed)} case(s) failed in the run: {_ids(failed)}")
    subset = results.settings.get("case_filter")
    if subset:
        problems.append(f"the run measured only the cases matching {subset!r}: a subset cannot stand for its suite")
    return problems
