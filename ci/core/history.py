"""The history of complete runs (issue 41, the store): each run added as one entry of a series per machine, subject
and suite, so that later tools find where a case's time moved (change points) and which build moved it.

Layout, in the manner of asv (results keyed by machine, environment and commit):
``history/<gpu-model>-x<count>/<kind>/<suite>.json`` (the machine's slug as ``ci.core.baselines`` writes it), a
versioned JSON file (:data:`KIND`, :data:`SCHEMA_VERSION`) written atomically. An entry holds what identifies the
run (its results file's sha256, time, the project's commit and command), the builds of both sides as their
subject says (``identity``: the release or commit under test, the change), and per case the median time of each
side, the A/B ratio with its interval over captures, and the captures; which side is the software as published
(the series follows it), and the version of the suite the run held (its case ids' digest, and whether they are
the suite's cases today). Only a run with complete evidence (``ci.core.evidence``) is added, complete for the
version of its suite it ran (a run of a suite that has grown since is added; a run of a subset, one that did
not finish, or one with a failed case is not); a results file already in the history is refused (exit 2), so a
re-run of the nightly job adds nothing twice. Nothing is ever removed by this module.

A series is in the order of its entries' *position*: the time the run was made, or, for a run added with
``--at TIME``, that time: the date of the code it timed (as asv places a result at its commit's date). A run of an
older release timed today (a back-fill) so sits before the runs of the code that came after it.

CLI (``nox -s history -- ...``): ``add RESULTS [--at TIME] [--dir history]``; ``show``, ``detect`` and ``plot``,
each with ``--machine M --kind K --suite S [--case GLOB] [--dir history]``. ``detect`` lists the *candidate* change
points of each case's series (Apache Otava's windowed E-Divisive with its defaults, where the time goes up): the two
runs either side, the step's size, and the bisect that confirms it (``nox -s bisect``: its first step is the
paired A/B of the two builds, and only its FAIL is an alert; docs/history.md); exit 0 with none, 1 with some.
``plot --out FILE.png`` draws each case's series with its candidates marked.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import hashlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ci.core import baselines, evidence, stats, subjects
from ci.core.cli import run_main
from ci.core.errors import DataError, ExitCode, GateError, IncompleteEvidenceError, UsageError
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
    if not isinstance(entries, list):
        raise DataError(f"{path}: 'entries' must be a list of run entries; restore it from git (nothing was changed)")
    for i, entry in enumerate(entries):
        if not _is_entry(entry):
            raise DataError(
                f"{path}: entry {i} is not a run entry (a 'run' with its 'time' and 'sha256', 'builds' of both "
                "sides, 'cases'); restore the file from git (nothing was changed)"
            )
    return payload


def _is_entry(entry) -> bool:
    """Whether ``entry`` holds what every reader of the history takes from it (as :func:`entry_of` writes it)."""
    if not isinstance(entry, dict):
        return False
    run, builds = entry.get("run"), entry.get("builds")
    return (
        isinstance(run, dict)
        and all(isinstance(run.get(k), str) for k in ("time", "sha256"))
        and isinstance(run.get("at", ""), str)
        and isinstance(builds, dict)
        and all(isinstance(builds.get(side), dict) for side in SIDES)
        and isinstance(entry.get("cases"), dict)
    )


def case_summary(case) -> dict:
    """One case of a run: each side's median, the A/B ratio with its interval over captures, the captures."""
    caps = {side: subjects.capture_ids(case, side) for side in SIDES}
    if None not in caps.values():  # capture_ids gives both sides' or neither
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


def suite_version(results: BenchResults, results_path: Path) -> dict:
    """The version of the suite a run holds: its case ids (a digest of them), and whether they are the suite's
    cases today. A run of an earlier version (a suite that has grown since) is complete for the suite it ran, and
    each case's series takes it (a case id names the same case in every version)."""
    ids = sorted(c.id for c in results.cases)
    try:
        now = sorted(subjects.subject_of(results.kind).expected_cases(results))
    except GateError as exc:
        raise IncompleteEvidenceError(f"{results_path}: not added to the history: {exc}") from None
    digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:12]
    return {"cases": len(ids), "version": digest, "as_now": ids == now}


def entry_of(results: BenchResults, results_path: Path) -> dict:
    subject = subjects.subject_of(results.kind)
    prov = results.provenance
    return {
        "suite": suite_version(results, results_path),
        "run": {
            "sha256": sha256_file(results_path),
            "time": prov.get("time", ""),
            "project_commit": prov.get("project_commit", ""),
            "command": prov.get("command", ""),
        },
        "builds": {side: subject.identity(results, side) for side in SIDES},
        "published": subject.published_side(results),
        "cases": {case.id: case_summary(case) for case in results.cases},
    }


def position(entry: dict) -> str:
    """Where an entry sits in its series: its ``--at`` time, else the time the run was made."""
    return entry["run"].get("at") or entry["run"]["time"]


def parse_at(text: str) -> str:
    """``--at``: an ISO 8601 time with its zone, as the history stores it (``2026-12-01T09:00:00+00:00``)."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise UsageError(
            f"--at {text!r}: not an ISO 8601 time with its zone; give e.g. 2026-12-01T09:00:00+00:00 (the date of "
            "the code the run timed); nothing was changed"
        )
    return when.astimezone(datetime.UTC).isoformat()


def add(results_path: Path, root: Path = DEFAULT_DIR, at: str | None = None) -> Path:
    """Add a complete run to its series (at its run time, or at ``at``, an ISO 8601 time: :func:`parse_at`);
    refuse an incomplete one, and one already added."""
    at = None if at is None else parse_at(at)
    results = load_results(results_path)
    problems = evidence.record_problems(results, case_set=False)  # the suite's version is the entry's own
    if problems:
        raise IncompleteEvidenceError(
            f"{results_path}: not added to the history: its evidence is incomplete ({'; '.join(problems[:3])}); "
            "re-run the stage"
        )
    path = history_path(results, root)
    history = load_history(path)
    entry = entry_of(results, results_path)
    if at is not None:
        entry["run"]["at"] = at
    if any(e["run"]["sha256"] == entry["run"]["sha256"] for e in history["entries"]):
        raise UsageError(f"{results_path}: already in {path} (the same results file); nothing was changed")
    history["entries"].append(entry)
    history["entries"].sort(key=position)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, history)
    return path


def published(entry: dict) -> str:
    """The side of an entry that is the software as published (its subject's ``published_side``): the side a
    series follows. Entries written before it was recorded followed the base."""
    side = entry.get("published", "base")
    if side not in SIDES:
        raise DataError(f"a history entry's 'published' side is {side!r}, not one of {SIDES}; restore it from git")
    return side


def value(entry: dict, case_id: str) -> float:
    """The median of the published side of ``case_id`` in ``entry``."""
    return entry["cases"][case_id][published(entry)]


def series(history: dict, case_id: str) -> list[tuple[str, float]]:
    """(position, median of the published side) of ``case_id`` over the history's entries, in their order."""
    return [(position(e), value(e, case_id)) for e in history["entries"] if case_id in e["cases"]]


def run_text(entry: dict) -> str:
    """An entry's position, and the time it ran when it was placed elsewhere (``--at``)."""
    at = position(entry)
    return at if at == entry["run"]["time"] else f"{at} (ran {entry['run']['time']})"


def show(history: dict, pattern: str) -> str:
    """A markdown table: per case, each entry's published build and its median, and the A/B ratio with its
    interval."""
    ids = sorted({cid for e in history["entries"] for cid in e["cases"] if fnmatch.fnmatch(cid, pattern)})
    if not ids:
        return "no case of the history matches " + repr(pattern)
    lines = ["| case | run | build (published side) | median | ratio [95%] |", "|---|---|---|---:|---|"]
    for cid in ids:
        for e in history["entries"]:
            c = e["cases"].get(cid)
            if c is None:
                continue
            side = published(e)
            build = f"{side}: {build_text(e['builds'][side])}"
            lines.append(
                f"| {cid} | {run_text(e)} | {build} | {c[side]:.2f} {c['unit']} | "
                f"{c['ratio']:.4f} [{c['ci'][0]:.4f}, {c['ci'][1]:.4f}] |"
            )
    return "\n".join(lines)


MIN_RUNS = 6  # fewer runs than this: no change point is looked for (Otava needs a few on each side)
SPAN = 5  # runs either side whose medians give a step's size


def case_series(history: dict, pattern: str) -> dict[str, list[dict]]:
    """The entries of each case matching ``pattern``, in the history's order."""
    ids = sorted({cid for e in history["entries"] for cid in e["cases"] if fnmatch.fnmatch(cid, pattern)})
    return {cid: [e for e in history["entries"] if cid in e["cases"]] for cid in ids}


def build_text(identity: dict) -> str:
    """A build as its subject's identity names it (``name value; ...``), or ``?`` when the run recorded none."""
    return "; ".join(f"{k} {v}" for k, v in sorted(identity.items())) or "?"


def candidates(history: dict, detector: Callable[[list[float]], list[int]], pattern: str = "*") -> list[dict]:
    """The candidate change points of each case's series of its published side: ``detector`` gives the indices
    where the time goes up (``ci.core.changepoints``); each candidate names the runs either side and the step's size
    (the median of the ``SPAN`` runs after it over the median of the ``SPAN`` before)."""
    found = []
    for cid, entries in case_series(history, pattern).items():
        xs = [value(e, cid) for e in entries]
        if len(xs) < MIN_RUNS:
            continue
        for at in detector(xs):
            if not 0 < at < len(xs):
                continue
            before, after = xs[max(0, at - SPAN) : at], xs[at : at + SPAN]
            good, bad = entries[at - 1], entries[at]
            found.append(
                {
                    "case": cid,
                    "index": at,
                    "good": {"time": position(good), "build": good["builds"][published(good)]},
                    "bad": {"time": position(bad), "build": bad["builds"][published(bad)]},
                    "size": stats.median(after) / stats.median(before) - 1,
                }
            )
    return found


def detect_markdown(found: Sequence[dict]) -> str:
    if not found:
        return "no candidate change point: no case's time went up between two runs\n"
    lines = [
        f"{len(found)} candidate change point(s). Each is an alert only once the paired A/B of its two builds FAILs: "
        "the first step of `nox -s bisect -- --good BEFORE --bad AFTER --cases CASE` (docs/history.md).",
        "",
        "| case | last run before (build) | first run after (build) | step |",
        "|---|---|---|---:|",
    ]
    for c in found:
        before, after = (f"{c[k]['time']} ({build_text(c[k]['build'])})" for k in ("good", "bad"))
        lines.append(f"| {c['case']} | {before} | {after} | {c['size']:+.1%} |")
    return "\n".join(lines) + "\n"


def otava_detector() -> Callable[[list[float]], list[int]]:
    from ci.core.changepoints import otava_detectors

    return otava_detectors()["otava"]


def main(argv: Sequence[str] | None = None, detector: Callable[[list[float]], list[int]] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.core.history", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_p = sub.add_parser("add", help="add a complete results file to its series")
    add_p.add_argument("results", type=Path)
    add_p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    add_p.add_argument("--at", help="place the run at this ISO 8601 time (the date of its code; default: its run time)")
    show_p = sub.add_parser("show", help="a series as a table")
    detect_p = sub.add_parser("detect", help="candidate change points")
    plot_p = sub.add_parser("plot", help="a PNG")
    for p in (show_p, detect_p, plot_p):
        p.add_argument("--machine", required=True, help="e.g. nvidia-h200-x1")
        p.add_argument("--kind", required=True, help="the results kind, e.g. kernel-bench")
        p.add_argument("--suite", default="default")
        p.add_argument("--case", default="*", help="a glob over case ids")
        p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    plot_p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    if args.command == "add":
        print(f"history: added {args.results} to {add(args.results, args.dir, args.at)}")
        return 0
    path = args.dir / args.machine / args.kind / f"{args.suite}.json"
    if not path.exists():
        raise UsageError(f"{path}: no history there yet; add a run first: python -m ci.core.history add RESULTS")
    history = load_history(path)
    if args.command == "show":
        print(show(history, args.case))
        return 0
    found = candidates(history, detector or otava_detector(), args.case)
    if args.command == "plot":
        if args.out.suffix != ".png" or args.out.exists():
            raise UsageError(f"--out {args.out}: give a new .png file (an existing file is never replaced)")
        from ci.core.history_plot import plot  # matplotlib, only for a drawing

        print(f"history: drew {plot(history, args.out, found, args.case)} case(s) into {args.out}")
        return 0
    print(detect_markdown(found), end="")
    return int(ExitCode.FAILED) if found else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
