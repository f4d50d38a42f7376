"""End-to-end serving (``ci.serving.tpot``: ``vllm serve`` + ``vllm bench serve``) as a subject of the gate core
(``ci.core.subjects``): its baselines are ``tpot-<suite>.json``, and under the verdict table the report lists
every round in the order run, with the machine's state where recorded.

A complete run is the one case its suite names (model, DP size, profile: ``ci.serving.config``) with the
profile's rounds of each build, from one pair of server launches."""

from __future__ import annotations

from ci.core.errors import DataError, UsageError
from ci.core.subjects import Subject, register
from ci.runner import outputs
from ci.serving import config as serving_config

KIND = "tpot-bench"


def details(results) -> list[str]:
    lines: list[str] = []
    for case in results.cases:
        rounds = case.extra.get("rounds") or []
        if not rounds:
            continue
        lines += ["", f"Rounds of {case.id} (in the order run):", "",
                  "| # | build | median TPOT (ms) | mean TPOT (ms) | median TTFT (ms) | output tok/s | SM clock (MHz) "
                  "| power (W) | host load |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for i, r in enumerate(rounds, 1):
            m = r.get("machine") or {}

            def first(key, m=m):
                values = [v for v in m.get(key) or [] if v is not None]
                return f"{values[0]:.0f}" if values else "-"

            load = m.get("load_1min")
            lines.append(
                f"| {i} | {r['build']} | {r['median_tpot_ms']:.3f} | {r['mean_tpot_ms']:.3f} | "
                f"{r['median_ttft_ms']:.1f} | {r['output_throughput']:.0f} | {first('sm_clock_mhz')} | "
                f"{first('power_draw_w')} | {'-' if load is None else f'{load:.2f}'} |"
            )
    return lines


def case_problems(case) -> list[str]:
    """Rounds with failed requests (or none completed) are no evidence of the server's speed."""
    rounds = case.extra.get("rounds")
    if rounds is None or rounds == []:
        return ["no rounds recorded: re-run the TPOT stage"]
    if not isinstance(rounds, list):
        raise DataError(f"case {case.id}: extra.rounds should be a list of rounds, found {rounds!r}")
    for r in rounds:
        if not isinstance(r, dict) or not all(type(r.get(k)) is int for k in ("failed", "completed")):
            raise DataError(f"case {case.id}: each of extra.rounds should be an object with integer 'failed' and "
                            f"'completed', found {r!r}")  # fmt: skip
    bad = [r for r in rounds if r["failed"] or r["completed"] == 0]
    return [f"{len(bad)} round(s) with failed requests; see the server logs and re-run"] if bad else []


def _parse(results) -> tuple[str, str, int]:
    try:
        return serving_config.parse_suite(results.suite)
    except UsageError as exc:
        raise DataError(f"{exc}: these results were not written by this gate's TPOT stage; re-run it") from exc


def expected_cases(results) -> list[str]:
    return [serving_config.case_id(*_parse(results))]


def min_samples(results) -> int:
    """The rounds of each build the profile of the suite runs."""
    return serving_config.PROFILES[_parse(results)[1]].rounds


SUBJECT = register(Subject(kind=KIND, expected_cases=expected_cases, min_samples=min_samples,
                           case_problems=case_problems, baseline_prefix="tpot-", details=details,
                           results_file=outputs.TPOT_RESULTS,
                           writer=outputs.WRITERS[outputs.TPOT_RESULTS]))  # fmt: skip
