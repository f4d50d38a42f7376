"""End-to-end serving (``ci.serving.tpot``: ``vllm serve`` + ``vllm bench serve``) as a subject of the gate core
(``ci.core.subjects``): its baselines are ``tpot-<suite>.json``, and under the verdict table the report lists
every launch pair (start order, start-up, settling, the pair's ratio) and every round in the order run,
with the server's own inter-token latency and the machine's state where recorded.

A complete run is the one case its suite names (model, DP size, profile: ``ci.serving.config``) with the
profile's rounds of each build in each of its launch pairs; the launch pair of each round is its capture
(``extra.captures``), so the interval is over launch pairs."""

from __future__ import annotations

from ci.core import stats
from ci.core.errors import DataError, UsageError
from ci.core.schema import BOOLEAN, INTEGER, NUMBER, POSITIVE, STRING, ListOf, MapOf, OneOf, Opt
from ci.core.subjects import Subject, register
from ci.host import outputs
from ci.serving import config as serving_config
from ci.trees.provenance import published_side, side_identity

KIND = "tpot-bench"


def _launch_lines(case) -> list[str]:
    """One row per launch pair: who started first, start-up and settling, the pair's medians and ratio."""
    launches = (case.extra.get("timeline") or {}).get("launches") or []
    rounds = case.extra.get("rounds") or []
    if not launches:
        return []
    settling_off = ((case.info or {}).get("profile") or {}).get("settle_max_s") == 0  # the profile runs none
    lines = [
        "",
        f"Launch pairs of {case.id} (the interval is over these):",
        "",
        "| pair | started first | start-up s (base / candidate) | settling runs (s, settled) | "
        "base median TPOT | candidate median TPOT | candidate / base | server ITL ratio |",
        "|---:|---|---|---|---:|---:|---:|---:|",
    ]

    def med(xs):
        xs = [x for x in xs if x is not None]
        return stats.median(xs) if xs else None

    for rec in launches:
        n = rec.get("launch")
        mine = [r for r in rounds if r.get("launch") == n]
        tpot = {b: med([r["median_tpot_ms"] for r in mine if r["build"] == b]) for b in serving_config.BUILDS}
        itl = {b: med([r.get("server_itl_ms") for r in mine if r["build"] == b]) for b in serving_config.BUILDS}
        start = rec.get("startup_s") or {}
        settles = rec.get("settle") or []
        settle = (
            "off"
            if settling_off
            else ", ".join(f"{s['runs']} ({s['seconds']:.0f} s, {'yes' if s['settled'] else 'no'})" for s in settles)
        )

        def ratio(d):
            return f"{d['candidate'] / d['base']:.4f}" if d["base"] and d["candidate"] else "-"

        def ms(x):
            return "-" if x is None else f"{x:.3f}"

        group = rec.get("started_with") or [n]
        first = (rec.get("order") or ["-"])[0]
        if len(group) > 1:
            first += f" (pairs {', '.join(map(str, group))} at once)"
        lines.append(
            f"| {n} | {first} | {start.get('base', '-')} / "
            f"{start.get('candidate', '-')} | {settle or '-'} | {ms(tpot['base'])} | "
            f"{ms(tpot['candidate'])} | {ratio(tpot)} | {ratio(itl)} |"
        )
    return lines


def details(results) -> list[str]:
    lines: list[str] = []
    for case in results.cases:
        rounds = case.extra.get("rounds") or []
        if not rounds:
            continue
        lines += _launch_lines(case)
        lines += [
            "",
            f"Rounds of {case.id} (in the order run):",
            "",
            "| # | pair | build | median TPOT (ms) | server ITL (ms) | mean TPOT (ms) | median TTFT (ms) "
            "| output tok/s | SM clock (MHz) | power (W) | host load |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for i, r in enumerate(rounds, 1):
            m = r.get("machine") or {}

            def first(key, m=m):
                values = [v for v in m.get(key) or [] if v is not None]
                return f"{values[0]:.0f}" if values else "-"

            load = m.get("load_1min")
            itl = r.get("server_itl_ms")
            lines.append(
                f"| {i} | {r.get('launch', 0)} | {r['build']} | {r['median_tpot_ms']:.3f} | "
                f"{'-' if itl is None else f'{itl:.3f}'} | {r['mean_tpot_ms']:.3f} | "
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
            raise DataError(
                f"case {case.id}: each of extra.rounds should be an object with integer 'failed' and "
                f"'completed', found {r!r}"
            )
    bad = [r for r in rounds if r["failed"] or r["completed"] == 0]
    return [f"{len(bad)} round(s) with failed requests; see the server logs and re-run"] if bad else []


def _parse(results) -> tuple[str, str, int]:
    try:
        return serving_config.parse_suite(results.suite)
    except UsageError as exc:
        raise DataError(f"{exc}: these results were not written by this gate's TPOT stage; re-run it") from exc


def expected_cases(results) -> list[str]:
    return [serving_config.case_id(*_parse(results))]


def _profile(results) -> serving_config.Profile:
    """The profile the gate defines for the suite: a run with fewer launch pairs or rounds than it
    (``--launches``, ``--rounds-per-launch``) is not a complete run of the suite."""
    return serving_config.PROFILES[_parse(results)[1]]


def min_samples(results) -> int:
    """The rounds of each build the profile of the suite runs (over all its launch pairs)."""
    return _profile(results).rounds_per_build


def min_captures(results) -> int:
    """The launch pairs the profile of the suite runs: each is one capture of both builds."""
    return _profile(results).launches


# the fields of a case this subject's code reads (ci.core.schema: checked when a results file is read)
ROUND = {
    "build": STRING,
    "median_tpot_ms": POSITIVE,
    "failed": INTEGER,
    "completed": INTEGER,
    "launch": Opt(INTEGER),
    "server_itl_ms": Opt(NUMBER),
    "mean_tpot_ms": NUMBER,
    "median_ttft_ms": NUMBER,
    "output_throughput": NUMBER,
    "machine": Opt(
        {"sm_clock_mhz": Opt(ListOf(Opt(NUMBER))), "power_draw_w": Opt(ListOf(Opt(NUMBER))), "load_1min": Opt(NUMBER)}
    ),
}
LAUNCH = {
    "launch": Opt(INTEGER),
    "startup_s": Opt(MapOf(Opt(OneOf((NUMBER, STRING))))),
    "settle": Opt(ListOf({"runs": INTEGER, "seconds": NUMBER, "settled": BOOLEAN})),
    "started_with": Opt(ListOf(INTEGER)),
    "order": Opt(ListOf(STRING)),
}
SCHEMA = {
    "info": {"profile": {"settle_max_s": Opt(NUMBER)}},
    "extra": {"rounds": ListOf(ROUND), "timeline": {"launches": Opt(ListOf(LAUNCH))}},
}

SUBJECT = register(
    Subject(
        kind=KIND,
        identity=side_identity,
        published_side=published_side,
        schema=SCHEMA,
        expected_cases=expected_cases,
        min_samples=min_samples,
        min_captures=min_captures,
        case_problems=case_problems,
        baseline_prefix="tpot-",
        details=details,
        captures_match_across_runs=False,  # launch pair b of two runs: independent launches
        results_file=outputs.TPOT_RESULTS,
        writer=outputs.WRITERS[outputs.TPOT_RESULTS],
    )
)
