"""The history of complete runs (issue 41, the store): each run added as one entry of a series per machine, subject
and suite, so that later tools find where a case's time moved (change points) and which build moved it.

Layout, in the manner of asv (results keyed by machine, environment and commit):
``history/<gpu-model>-x<count>/<kind>/<suite>.json`` (the machine's slug as ``ci.core.baselines`` writes it), a
versioned JSON file (:data:`KIND`, :data:`SCHEMA_VERSION`) written atomically. An entry holds what identifies the
run (its results file's sha256, time, the project's commit and command), the builds of both sides as their
subject says (``identity``: the release or commit under test, the change), and per case the median time of each
side, the A/B ratio with its interval over captures, and the captures. Only a run with complete evidence
(``ci.core.evidence``) is added; a results file already in the history is refused (exit 2), so a re-run of the
nightly job adds nothing twice. Nothing is ever removed by this module.

CLI: ``python -m ci.core.history add RESULTS [--dir history]`` and ``python -m ci.core.history show --machine M
--kind K --suite S [--case GLOB] [--dir history]`` (``nox -s history -- ...``).
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections.abc import Sequence
from pathlib import Path

from ci.core import baselines, evidence, stats, subjects
from ci.core.cli import run_main
from ci.core.errors import DataError, IncompleteEvidenceError, UsageError
from ci.core.jsonio import read_json, sha256_file, write_json
from ci.core.results import BenchResults, load_results

KIND = "gate-history"
SCHEMA_VERSION = 1
DEFAULT_DIR = Path("history")
SIDES = ("base", "candidate")


def history_path(results: BenchResults, root: Path = DEFAULT_DIR) -> Path:
    """Where the series of ``results``' machine, subject and suite lives."""
    model, count = results.gpu_key()
    baselines.baseline_path(results, root)  # the same check of the suite's name as a baseline's
    return root / baselines.slug(model, count) / results.kind / f"{results.suite}.json"


def load_history(path: Path) -> dict:
    """A history file (its schema checked), or a new empty one when there is none yet."""
    if not path.exists():
        return {"kind": KIND, "schema_version": SCHEMA_VERSION, "entries": []}
    payload = read_json(path, kind=KIND, versions=(SCHEMA_VERSION,))
    entries = payload.get("entries")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("run"), dict) for e in entries
    ):
        raise DataError(f"{path}: 'entries' must be a list of run entries; restore it from git (nothing was changed)")
    return payload


def case_summary(case) -> dict:
    """One case of a run: each side's median, the A/B ratio with its interval over captures, the captures."""
    caps = {side: subjects.capture_ids(case, side) for side in SIDES}
    if caps["base"] is not None and caps["candidate"] is not None:
        base = stats.capture_medians(case.samples["base"], caps["base"])
        cand = stats.capture_medians(case.samples["candidate"], caps["candidate"])
        effect = stats.capture_effect(base, cand)
        captures = len(base)
    else:
        effect = stats.paired_effect(case.samples["base"], case.samples["candidate"])
        captures = 1
    return {
        "base": stats.median(case.samples["base"]),
        "candidate": stats.median(case.samples["candidate"]),
        "unit": case.unit,
        "ratio": effect.ratio,
        "ci": [effect.ci_low, effect.ci_high],
        "captures": captures,
    }


def entry_of(results: BenchResults, results_path: Path) -> dict:
    subject = subjects.subject_of(results.kind)
    prov = results.provenance
    return {
        "run": {
            "sha256": sha256_file(results_path),
            "time": prov.get("time", ""),
            "project_commit": prov.get("project_commit", ""),
            "command": prov.get("command", ""),
        },
        "builds": {side: subject.identity(results, side) for side in SIDES},
        "cases": {case.id: case_summary(case) for case in results.cases},
    }


def add(results_path: Path, root: Path = DEFAULT_DIR) -> Path:
    """Add a complete run to its series; refuse an incomplete one, and one already added."""
    results = load_results(results_path)
    problems = evidence.record_problems(results)
    if problems:
        raise IncompleteEvidenceError(
            f"{results_path}: not added to the history: its evidence is incomplete ({'; '.join(problems[:3])}); "
            "re-run the stage"
        )
    path = history_path(results, root)
    history = load_history(path)
    entry = entry_of(results, results_path)
    if any(e["run"].get("sha256") == entry["run"]["sha256"] for e in history["entries"]):
        raise UsageError(f"{results_path}: already in {path} (the same results file); nothing was changed")
    history["entries"].append(entry)
    history["entries"].sort(key=lambda e: str(e["run"].get("time", "")))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, history)
    return path


def series(history: dict, case_id: str, side: str = "base") -> list[tuple[str, float]]:
    """(run time, median) of ``side`` of ``case_id`` over the history's entries, in time order."""
    return [(e["run"].get("time", ""), e["cases"][case_id][side]) for e in history["entries"] if case_id in e["cases"]]


def show(history: dict, pattern: str = "*") -> str:
    """A markdown table: per case, each entry's base median and A/B ratio with its interval."""
    ids = sorted({cid for e in history["entries"] for cid in e["cases"] if fnmatch.fnmatch(cid, pattern)})
    if not ids:
        return "no case of the history matches " + repr(pattern)
    lines = ["| case | run | build (base) | base | ratio [95%] |", "|---|---|---|---:|---|"]
    for cid in ids:
        for e in history["entries"]:
            c = e["cases"].get(cid)
            if c is None:
                continue
            build = ", ".join(f"{k} {v}" for k, v in sorted(e["builds"].get("base", {}).items()))
            lines.append(
                f"| {cid} | {e['run'].get('time', '')} | {build} | {c['base']:.2f} {c['unit']} | "
                f"{c['ratio']:.4f} [{c['ci'][0]:.4f}, {c['ci'][1]:.4f}] |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.core.history", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_p = sub.add_parser("add", help="add a complete results file to its series")
    add_p.add_argument("results", type=Path)
    add_p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    show_p = sub.add_parser("show", help="a series as a table")
    show_p.add_argument("--machine", required=True, help="e.g. nvidia-h200-x1")
    show_p.add_argument("--kind", required=True, help="the results kind, e.g. kernel-bench")
    show_p.add_argument("--suite", default="default")
    show_p.add_argument("--case", default="*", help="a glob over case ids")
    show_p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    if args.command == "add":
        print(f"history: added {args.results} to {add(args.results, args.dir)}")
        return 0
    path = args.dir / args.machine / args.kind / f"{args.suite}.json"
    if not path.exists():
        raise UsageError(f"{path}: no history there yet; add a run first: python -m ci.core.history add RESULTS")
    print(show(load_history(path), args.case))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
