"""Change points over a nightly history (issue 41): the rules that say "a night made this case slower", and their
error rates on simulated histories whose noise is the run-to-run noise measured on the GPU.

A nightly job times each case once a night on a new build; the series of one case is its time night after night
(``ci.core.history``). Three kinds of rule are compared on the same simulated series:

* ``threshold``: a fixed-threshold perf CI's rule, one run against the run before (alert when a night is more than 3%
  slower than the night before);
* ``otava`` and ``otava-orig``: Apache Otava's change-point detection with its defaults (windowed E-Divisive of
  Hunter, window 50, p 0.001; and the original E-Divisive with its permutation test), run after every night on
  the series so far; an alert is a new change point where the time goes up;
* ``confirmed``: Otava's windowed change points as *candidates*, each confirmed by a paired A/B of the builds on
  either side (the build two nights before the change point against the one a night after it, both in one run,
  judged by the gate's own sequential statistics, ``ci.core.sequential``): only a FAIL alerts. An A/B has no
  between-run error (both builds in one process), so a noisy night that Otava takes for a step is dismissed.

A simulated history is ``nights`` values of ``log(time)``: the level steps up by ``log(1 + size)`` at each known
night, and every night adds a draw from the measured run-to-run deviations (``run_to_run``: the same build's
per-case median on several machines and days, each case's deviations from its own mean). The rates:

* false alarms per 100 nights: alerts on nights not within ``LATE`` nights after a step;
* detection within 2 nights: the share of steps of a size alerted on the night of the step or the 2 after it.

Usage: ``python -m ci.core.changepoints --runs A.json B.json ... --out DIR [--nights 200] [--steps
40:0.01,80:0.03,120:0.05,160:0.10] [--histories 50] [--rules threshold,otava,otava-orig,confirmed] [--seed 0]``
(``nox -s changepoint_rates``; Otava comes from requirements/changepoints.txt); writes ``DIR/changepoint-rates.json``
and ``DIR/changepoint-rates.md``.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ci.core import sequential, stats
from ci.core.cli import run_main
from ci.core.errors import DataError, UsageError
from ci.core.jsonio import check_own_report, write_report
from ci.core.results import load_results

KIND = "changepoint-rates"
VERSION = 1
OUTPUT_JSON, OUTPUT_MD = "changepoint-rates.json", "changepoint-rates.md"
THRESHOLD = 0.03  # the single-run rule's limit, and the A/B's
WITHIN = 2  # a step is detected in time when alerted on its night or the WITHIN nights after it
LATE = 7  # an alert up to LATE nights after a step is about that step (late, not false)
RULES = ("threshold", "otava", "otava-orig", "confirmed")
DEFAULT_STEPS = {40: 0.01, 80: 0.03, 120: 0.05, 160: 0.10}
AB_PLAN = sequential.Plan(first=30, group=10, max_extra=3)  # the kernel bench's sequential design


def run_to_run(runs: Sequence, side: str = "base") -> list[float]:
    """The measured run-to-run noise: for every case all ``runs`` hold, the log deviation of each run's median of
    ``side`` from the case's mean over the runs, scaled by sqrt(n / (n - 1)) (a deviation from the sample mean is
    that much narrower than one from the true mean). Needs two runs at least."""
    if len(runs) < 2:
        raise UsageError(f"--runs: {len(runs)} run(s); the run-to-run noise needs two runs of the build at least")
    medians = [{c.id: stats.median(c.samples[side]) for c in r.cases if side in c.samples} for r in runs]
    common = sorted(set.intersection(*(set(m) for m in medians)))
    if not common:
        raise DataError(f"--runs: no case has {side!r} samples in every run; give runs of one suite")
    n = len(runs)
    out = []
    for cid in common:
        logs = [math.log(m[cid]) for m in medians]
        mean = sum(logs) / n
        out += [(x - mean) * math.sqrt(n / (n - 1)) for x in logs]
    return out


def simulate_series(nights: int, steps: dict[int, float], noise: Sequence[float], rng: random.Random) -> list[float]:
    """``log(time)`` of one case over ``nights``: the level steps up at the nights of ``steps``, and each night
    draws its run-to-run error from ``noise``."""
    level, series = 0.0, []
    for night in range(nights):
        level += math.log1p(steps.get(night, 0.0))
        series.append(level + rng.choice(noise))
    return series


def levels(nights: int, steps: dict[int, float]) -> list[float]:
    """The true ``log(time)`` of each night's build (the series without its noise)."""
    return simulate_series(nights, steps, [0.0], random.Random(0))


def threshold_alerts(series: Sequence[float], threshold: float = THRESHOLD) -> list[tuple[int, int]]:
    """(night, change at) of the single-run rule: a night more than ``threshold`` slower than the night before."""
    limit = math.log1p(threshold)
    return [(t, t) for t in range(1, len(series)) if series[t] - series[t - 1] > limit]


def online_alerts(
    series: Sequence[float], detect: Callable[[list[float]], list[int]], start: int = 8
) -> list[tuple[int, int]]:
    """(night, change at) of a change-point detector run after every night from ``start`` on the series so far
    (``detect`` returns where the time steps up); a change point is alerted once, on the first night it is found
    (one found within a night of an earlier one is the same change)."""
    alerts: list[tuple[int, int]] = []
    for t in range(start, len(series)):
        for at in detect([math.exp(x) for x in series[: t + 1]]):
            if all(abs(at - known) > 1 for _, known in alerts):
                alerts.append((t, at))
    return alerts


def confirmed_alerts(
    candidates: Sequence[tuple[int, int]], truth: Sequence[float], ab: Callable[[float], stats.Verdict]
) -> list[tuple[int, int]]:
    """The candidates a paired A/B confirms: the build two nights before the change point against the one a night
    after it (``truth``: each night's true ``log(time)``), judged by ``ab``; only a FAIL alerts."""
    kept = []
    for night, at in candidates:
        before, after = max(at - 2, 0), min(at + 1, night)
        if ab(math.exp(truth[after] - truth[before])) is stats.Verdict.FAIL:
            kept.append((night, at))
    return kept


def gate_ab(rng: random.Random, plan: sequential.Plan = AB_PLAN) -> Callable[[float], stats.Verdict]:
    """The gate's A/B of two builds in one run, with the kernel bench's sequential design and the noise model
    measured on the H200 (``ci.core.sequential.simulate``, one trial a call)."""

    def ab(true_ratio: float) -> stats.Verdict:
        shares = sequential.simulate(true_ratio, plan, trials=1, seed=rng.randrange(2**31))["shares"]
        (verdict,) = shares
        return stats.Verdict(verdict)

    return ab


def score(alerts: Sequence[tuple[int, int]], steps: dict[int, float], nights: int) -> dict:
    """False alarms (alert nights not within ``LATE`` after a step) and, per step, whether it was alerted in time
    (on its night or the ``WITHIN`` after it)."""
    late = {n for s in steps for n in range(s, s + LATE + 1)}
    false = sum(1 for night, _ in alerts if night not in late)
    quiet = nights - len(late & set(range(nights)))
    caught = {str(s): any(s <= night <= s + WITHIN for night, _ in alerts) for s in steps}
    return {"false": false, "quiet_nights": quiet, "caught": caught}


def otava_detectors() -> dict[str, Callable[[list[float]], list[int]]]:
    """Otava's two detectors with their defaults, as ``online_alerts`` takes them (change points up only)."""
    try:
        from otava.analysis import compute_change_points, compute_change_points_orig
    except ImportError as exc:
        raise UsageError(
            "apache-otava is not installed: run `nox -s changepoint_rates` (requirements/changepoints.txt)"
        ) from exc

    return {
        "otava": lambda xs: going_up(xs, [int(cp.index) for cp in compute_change_points(xs)[0]]),
        "otava-orig": lambda xs: going_up(xs, [int(cp.index) for cp in compute_change_points_orig(xs, seed=0)[0]]),
    }


def going_up(xs: Sequence[float], found: Sequence[int], span: int = 5) -> list[int]:
    """The change points of ``found`` where the time goes up: the ``span`` values after it average more than the
    ``span`` before it (a regression; a speed-up is no alert)."""
    return [
        at
        for at in found
        if 0 < at < len(xs) and statistics.fmean(xs[at : at + span]) > statistics.fmean(xs[max(0, at - span) : at])
    ]


def rates(
    noise: Sequence[float],
    *,
    nights: int,
    steps: dict[int, float],
    histories: int,
    rules: Sequence[str],
    seed: int = 0,
    detectors: dict[str, Callable[[list[float]], list[int]]] | None = None,
) -> dict[str, dict]:
    """Each rule over the same ``histories`` simulated series: false alarms per 100 quiet nights, and the share of
    each step size caught within ``WITHIN`` nights."""
    if detectors is None:  # Otava only where a rule uses it (the threshold rule needs nothing installed)
        detectors = otava_detectors() if set(rules) - {"threshold"} else {}
    truth = levels(nights, steps)
    tallies = {r: {"false": 0, "quiet_nights": 0, "caught": {str(s): 0 for s in steps}} for r in rules}
    rng = random.Random(seed)
    ab = gate_ab(random.Random(f"{seed}/ab"))
    for _ in range(histories):
        series = simulate_series(nights, steps, noise, rng)
        found: dict[str, list[tuple[int, int]]] = {}
        for rule in rules:
            if rule == "threshold":
                found[rule] = threshold_alerts(series)
            elif rule == "confirmed":
                candidates = found.get("otava") or online_alerts(series, detectors["otava"])
                found[rule] = confirmed_alerts(candidates, truth, ab)
            else:
                found[rule] = online_alerts(series, detectors[rule])
            one = score(found[rule], steps, nights)
            tally = tallies[rule]
            tally["false"] += one["false"]
            tally["quiet_nights"] += one["quiet_nights"]
            for s, hit in one["caught"].items():
                tally["caught"][s] += hit
    return {
        rule: {
            "false_per_100_nights": 100 * t["false"] / t["quiet_nights"],
            "caught_within": {f"{steps[int(s)]:g}": n / histories for s, n in t["caught"].items()},
            "histories": histories,
        }
        for rule, t in tallies.items()
    }


def markdown(payload: dict) -> str:
    s = payload["settings"]
    sizes = [f"{v:g}" for v in s["steps"].values()]
    noise = payload["noise"]
    lines = [
        f"### Change-point rules on simulated nightly histories ({s['histories']} histories of {s['nights']} nights)",
        "",
        f"Noise: {noise['n']} measured run-to-run deviations of one build (SD {noise['sd']:.3%}, 99th percentile "
        f"{noise['p99']:.3%}, largest {noise['max']:.3%}) from {len(payload['runs'])} runs; steps up at nights "
        + ", ".join(f"{n} (+{v:.0%})" for n, v in s["steps"].items())
        + f". A step is caught in time when alerted on its night or the {WITHIN} after it; an alert more than {LATE} "
        "nights after every step is false.",
        "",
        "| rule | false alarms per 100 nights | " + " | ".join(f"+{float(x):.0%} caught in time" for x in sizes) + " |",
        "|---|---:|" + "---:|" * len(sizes),
    ]
    for rule, r in payload["rates"].items():
        cells = " | ".join(f"{r['caught_within'][x]:.0%}" for x in sizes)
        lines.append(f"| {rule} | {r['false_per_100_nights']:.2f} | {cells} |")
    lines += [
        "",
        "Targets (issue 41): at most 1 false alarm per 100 nights; a step of 5% or more caught within 2 nights in 95%.",
    ]
    return "\n".join(lines) + "\n"


def _steps(text: str) -> dict[int, float]:
    try:
        found = {int(n): float(v) for n, v in (part.split(":") for part in text.split(",") if part.strip())}
    except ValueError:
        raise UsageError(f"--steps {text!r}: give NIGHT:SIZE pairs, e.g. 40:0.01,80:0.05") from None
    if not found or not all(0 < v <= 1 for v in found.values()):
        raise UsageError(f"--steps {text!r}: each size a fraction in (0, 1], e.g. 0.05 for +5%")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.core.changepoints", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="results files of one build, several runs")
    parser.add_argument("--out", type=Path, required=True, help=f"folder for {OUTPUT_JSON} and {OUTPUT_MD}")
    parser.add_argument("--nights", type=int, default=200, help="nights a history (%(default)s)")
    parser.add_argument("--steps", type=_steps, default=DEFAULT_STEPS, help="NIGHT:SIZE,... (40:0.01,...)")
    parser.add_argument("--histories", type=int, default=50, help="simulated histories (%(default)s)")
    parser.add_argument("--rules", default=",".join(RULES), help=f"of {', '.join(RULES)}")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rules = [r for r in args.rules.split(",") if r]
    unknown = sorted(set(rules) - set(RULES))
    if unknown or not rules:
        raise UsageError(f"--rules {args.rules!r}: pick from {', '.join(RULES)}")
    if max(args.steps) + LATE >= args.nights or args.histories < 1:
        raise UsageError(
            f"--nights {args.nights} --histories {args.histories}: every step needs {LATE} nights after it, and a "
            "history at least"
        )
    check_own_report(args.out, OUTPUT_JSON, OUTPUT_MD, kind=KIND, version=VERSION)
    noise = run_to_run([load_results(p) for p in args.runs])
    q = sorted(abs(x) for x in noise)
    payload = {
        "kind": KIND,
        "schema_version": VERSION,
        "runs": [str(p) for p in args.runs],
        "noise": {
            "n": len(noise),
            "sd": statistics.pstdev(noise),
            "p99": q[min(len(q) - 1, int(0.99 * len(q)))],
            "max": q[-1],
        },
        "settings": {
            "nights": args.nights,
            "steps": {str(k): v for k, v in args.steps.items()},
            "histories": args.histories,
            "seed": args.seed,
            "within": WITHIN,
            "late": LATE,
            "threshold": THRESHOLD,
            "ab_plan": AB_PLAN.to_settings(THRESHOLD),
        },
        "rates": rates(
            noise, nights=args.nights, steps=args.steps, histories=args.histories, rules=rules, seed=args.seed
        ),
    }
    write_report(args.out, OUTPUT_JSON, OUTPUT_MD, payload, markdown(payload))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
