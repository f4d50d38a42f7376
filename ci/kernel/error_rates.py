"""The kernel gate's error rates, measured on this GPU: false alarms and detection.

A/A runs (the base build against itself) show how often the gate fails, or cannot clear, a change
that does nothing; runs with an injected slowdown (the base build plus a GPU sleep calibrated per
case, ``ci.kernel.bench --inject-slowdown``) show how often it catches a real one. Each run is a full
bench run judged by ``ci.core.compare`` exactly as the gate judges a change, and the table puts the
simulation of the same design (``ci.core.stats.simulate``, with the capture error measured on an H200)
beside what the GPU gave. This stage measures; it decides nothing (exit 0 once every run is in).

Usage: ``python -m ci.kernel.error_rates --manifest M --out DIR [--aa-runs 3] [--inject 0.02,0.035,0.05]
[--inject-cases GLOB] [--suite default] [--captures 30] [--repeats 90] [--sequential on|off] [--max-extra 3]``:
each run is sequential as the bench is (``ci.core.sequential``) unless ``--sequential off``

Writes, as each run ends (a stopped job keeps what it measured): ``DIR/<run>.json`` (the bench
results of the run) and ``DIR/error-rates.json`` / ``DIR/error-rates.md`` (the table so far).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ci.core import rates, sequential, stats
from ci.core.cli import run_main
from ci.core.errors import UsageError
from ci.kernel import bench, suites
from ci.timing.captures import add_plan_arguments, plan_for

KIND = "ep-marlin-error-rates"
VERSION = 1
SIM_TRIALS = 2000


def simulated(
    captures: int, repeats: int, levels: Sequence[float], plan: sequential.Plan | None = None
) -> dict[str, dict[str, float]]:
    """The simulation of the same design (a sequential ``plan``'s looks where it has extra ones), with the capture
    error measured on an H200, per level."""
    out = {}
    for inject in (0.0, *levels):
        if plan is not None and plan.max_extra:
            shares = sequential.simulate(1 + inject, plan, rounds=max(1, repeats // captures), trials=SIM_TRIALS)
            found = shares["shares"]
        else:
            one = stats.simulate(
                1 + inject, repeats, trials=SIM_TRIALS, capture_sd=stats.SIM_CAPTURE_SD, captures=captures
            )
            found = {v.value: x for v, x in one.items()}
        out["aa" if not inject else f"{inject:g}"] = {v: found.get(v, 0.0) for v in ("PASS", "INCONCLUSIVE", "FAIL")}
    return out


def _looked(row: dict) -> str:
    """How many cases of a sequential run were judged after more than one look (``-``: a run without looks)."""
    looked = row.get("looked_again")
    return "-" if looked is None else str(len(looked))


def markdown(payload: dict) -> str:
    s = payload["settings"]
    lines = [
        f"### Kernel gate error rates on {payload['gpu']} (suite `{s['suite']}`, {s['captures']} captures x "
        f"{s['repeats'] // s['captures']} rounds, threshold {s['threshold']:.0%})",
        "",
        "Per case: a run's cases are each judged as the gate judges a change (`ci.core.compare`, A/B).",
        "",
        "| level | runs | cases | PASS | INCONCLUSIVE | FAIL | target | simulated PASS / INCONCLUSIVE / FAIL |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for key, level in sorted(payload["pooled"].items(), key=lambda kv: -1.0 if kv[0] == "aa" else float(kv[0])):
        sim = payload["simulated"].get(key, {})
        target = rates.TARGETS.get("aa" if key == "aa" else float(key), "")
        label = "A/A (no change)" if key == "aa" else f"+{float(key):.1%} injected"
        share = level["share"]
        lines.append(
            f"| {label} | {level['runs']} | {level['cases']} | {rates.pct(share.get('PASS'))} | "
            f"{rates.pct(share.get('INCONCLUSIVE'))} | {rates.pct(share.get('FAIL'))} | {target} | "
            f"{rates.pct(sim.get('PASS'))} / {rates.pct(sim.get('INCONCLUSIVE'))} / {rates.pct(sim.get('FAIL'))} |"
        )
    lines += [
        "",
        "| run | cases | PASS | INCONCLUSIVE | FAIL | median ratio | farthest ratio | median CI width | "
        "cases looked again | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in payload["runs"]:
        v = r["verdicts"]
        med = "-" if r["median_ratio"] is None else f"{r['median_ratio']:.4f}"
        far = "-" if r["farthest_ratio"] is None else f"{r['farthest_ratio']:.4f}"
        width = "-" if r["median_ci_width"] is None else f"{r['median_ci_width']:.4f}"
        lines.append(
            f"| {r['run']} | {r['cases']} | {v.get('PASS', 0)} | {v.get('INCONCLUSIVE', 0)} | "
            f"{v.get('FAIL', 0)} | {med} | {far} | {width} | {_looked(r)} | {r['wall_time_s']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.kernel.error_rates", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--manifest", type=Path, required=True, help="manifest.json of the trees (ci.trees.build)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs and the table")
    parser.add_argument("--suite", default="default", help=f"one of {sorted(suites.SUITES)} (default %(default)s)")
    parser.add_argument("--cases", help="A/A runs: only case ids matching this glob")
    parser.add_argument("--inject-cases", help="injected runs: only case ids matching this glob (default: --cases)")
    parser.add_argument("--aa-runs", type=int, default=3, help="A/A runs (%(default)s)")
    parser.add_argument(
        "--inject", type=rates.parse_levels, default=rates.DEFAULT_INJECT, help="slowdowns, e.g. 0.02,0.035,0.05"
    )
    parser.add_argument("--repeats", type=int, default=bench.DEFAULT_REPEATS, help="rounds per build (%(default)s)")
    parser.add_argument("--captures", type=int, default=bench.DEFAULT_CAPTURES, help="captures per build (%(default)s)")
    parser.add_argument("--allow-busy", action="store_true", help="measure even if another process uses the GPU")
    add_plan_arguments(parser)
    args = parser.parse_args(argv)
    if args.aa_runs < 0 or (args.aa_runs == 0 and not args.inject):
        raise UsageError(f"--aa-runs {args.aa_runs}: 0 or more, and with --inject at least one run in all")
    bench.check_plan(args.captures, args.repeats, 0, max(args.inject, default=0.0), aa=True)
    looks = plan_for(args.captures, args.sequential == "on", args.max_extra)
    aa_cases = suites.suite_cases(args.suite, args.cases)
    inject_filter = args.inject_cases or args.cases
    inject_cases = suites.suite_cases(args.suite, inject_filter)
    rates.check_out(args.out)

    from ci.host import gpu
    from ci.trees.manifest import load_trees

    trees = load_trees(args.manifest)
    gpus = gpu.require_idle_gpus(1, allow_busy=args.allow_busy, what="rates will be wrong")
    payload = {
        "kind": KIND,
        "schema_version": VERSION,
        "gpu": gpus[0].name,
        "settings": {
            "suite": args.suite,
            "captures": args.captures,
            "repeats": args.repeats,
            "threshold": args.threshold,
            "confidence": stats.DEFAULT_CONFIDENCE,
            "sequential": looks.to_settings(args.threshold),
            "aa_cases": args.cases,
            "inject_cases": inject_filter,
        },
        "targets": {str(k): v for k, v in rates.TARGETS.items()},
        "simulated": simulated(args.captures, args.repeats, args.inject, looks),
        "runs": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    # an earlier table in --out of the same settings on the same GPU is added to, its runs kept (a device session's
    # runs split over several calls); the next run of a level is numbered on from its runs there
    fresh = payload
    payload = rates.continued(args.out, fresh)
    payload["simulated"] = {**(payload.get("simulated") or {}), **fresh["simulated"]}  # this run's levels too
    plan = [(0.0, rates.next_index(payload, 0.0) + i, aa_cases, args.cases) for i in range(args.aa_runs)]
    plan += [(f, rates.next_index(payload, f), inject_cases, inject_filter) for f in args.inject]
    for inject, index, cases, case_filter in plan:
        name = rates.run_name(inject, index) + (f"-{index}" if inject and index > 1 else "")
        started = time.time()
        print(f"error_rates: run {name} ({len(cases)} cases)", flush=True)
        results = bench.run_suite(
            trees,
            cases,
            args.repeats,
            args.suite,
            aa=True,
            case_filter=case_filter,
            captures=args.captures,
            block_size_repeats=0,
            inject=inject,
            plan=looks,
            threshold=args.threshold,
        )
        results.save(args.out / f"{name}.json")
        rates.record_run(args.out, payload, name, inject, results, time.time() - started, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
