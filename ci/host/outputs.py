"""The names of the files the stages write, in one place (standard library only: the noxfile imports it).

A stage writes under the folder it is given (``--out``, default ``.gate/out/<session>``); the sessions that
read a stage's output (``gate``, ``update_baselines``) and the workflows take these names from here, not
from a copy of their own (``tests/unit/test_outputs.py`` checks the workflows).
"""

from __future__ import annotations

import json
from pathlib import Path

OUT_DIR = ".gate/out"
KERNEL_RESULTS = "kernel-results.json"  # ci.kernel.bench
TPOT_RESULTS = "tpot-results.json"  # ci.serving.tpot
TRITON_RESULTS = "triton-moe-results.json"  # ci.triton_moe.bench
ERROR_RATES = "error-rates"  # ci.kernel.error_rates: a folder (its runs and error-rates.{json,md})
SUITE_JUNIT = "junit.xml"  # the GPU suite (pytest)
SUITE_SUMMARY = "summary.json"  # the GPU suite's summary (tests/conftest.py, --gate-summary)
VERDICT = ("verdict.json", "report.md", "plot.png")  # ci.core.compare.OUTPUT_FILES, in its --out folder
NIGHTLY = ("nightly.json", "nightly.md")  # ci.runner.nightly: the night's record and the issue text
WRITERS = {
    KERNEL_RESULTS: "nox -s bench",
    TPOT_RESULTS: "nox -s tpot",
    TRITON_RESULTS: "nox -s triton_bench",
}  # the session that writes each


def results_file(out_dir: Path, name: str) -> Path:
    """The results file a stage writes in its ``--out`` folder. A path ending in ``.json`` (a file, as the
    stages once took) and a file of that name the gate did not write (not a results file of a kind) are
    refused before anything is measured, so no stage overwrites what is not its own."""
    from ci.core.errors import UsageError

    if out_dir.suffix == ".json":
        raise UsageError(
            f"--out {out_dir}: --out is the folder the stage writes {name} into; pass a folder, "
            f"e.g. --out {out_dir.with_suffix('')}"
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: exists and is not a folder; pass a new or existing folder")
    path = out_dir / name
    if path.is_symlink() or (path.exists() and not _is_results(path)):
        raise UsageError(
            f"--out {out_dir}: {name} there is not a results file of this gate; the stage replaces "
            "only its own; pick another --out folder (nothing was changed)"
        )
    return path


def _is_results(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and isinstance(data.get("kind"), str) and "cases" in data


def save_and_check(results, out: Path, stage: str) -> int:
    """Write a bench's results, then the error for the cases it could not time (the builds disagreed or
    crashed; the others are in the file): what every bench stage ends with."""
    from ci.core.errors import UndeclaredChangeError, WrongResultsError

    results.save(out)
    print(f"{stage}: {len(results.cases)} cases written to {out}")
    failed = results.settings["failed_cases"]
    undeclared = set(results.settings.get("undeclared_cases") or ())
    if failed and set(failed) <= undeclared:
        raise UndeclaredChangeError(
            f"{len(failed)} case(s) not timed because the candidate changes the non-EP path, which its contract "
            "does not declare: " + "; ".join(failed.values()) + f" (results, with the other cases, in {out})"
        )
    if failed:
        raise WrongResultsError(
            f"{len(failed)} case(s) not timed because the builds disagree or crashed: "
            + "; ".join(failed.values())
            + f" (results, with the other cases, in {out})"
        )
    return 0
