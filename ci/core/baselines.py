"""Stored baselines: ``baselines/<gpu-model>-x<count>/<suite>.json``.

A baseline is a results file recorded on purpose (``nox -s update_baselines``): only a run
with complete evidence (``ci.core.evidence``: every case, every round, no failure, not an A/A
run), under a plain suite name, created exclusively (two records at once: one wins, the
other is refused), never overwritten without ``--force``, schema-checked on every load. Lookup
matches the GPU model and count of the run, and the suite; a missing file is
NO_BASELINE with the command that records one, a corrupt one an error.

Only a run whose own A/B verdict is PASS is recorded, unless ``--reason`` says why another should be (the
reason is stored in the baseline). Baseline mode compares like with like (:func:`check_comparable`): the
same unit and the same build (its subject's identity: the release under test and, for the candidate side, the
change); else an error naming both.

CLI: ``python -m ci.core.baselines record RESULTS|--results RESULTS [--dir baselines] [--force] [--reason WHY]``
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ci.core import evidence, subjects
from ci.core.cli import run_main
from ci.core.errors import DataError, IncompleteEvidenceError, NoBaselineError, UsageError
from ci.core.jsonio import dumps
from ci.core.results import BenchResults, load_results

DEFAULT_DIR = Path("baselines")
SUITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # fullmatch: "default\n" is no suite name


def slug(name: str, count: int) -> str:
    """``NVIDIA H200``, 1 -> ``nvidia-h200-x1`` (the baselines folder of that machine)."""
    clean = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    while "--" in clean:
        clean = clean.replace("--", "-")
    return f"{clean}-x{count}"


def baseline_path(results: BenchResults, root: Path = DEFAULT_DIR) -> Path:
    if not SUITE_NAME.fullmatch(results.suite) or ".." in results.suite:
        raise DataError(
            f"suite {results.suite!r} is not a plain name (letters, digits, '.', '_', '-'): "
            "a baseline's file name comes from it; re-create the results with a stage of this gate"
        )
    model, count = results.gpu_key()
    prefix = subjects.subject_of(results.kind).baseline_prefix
    return root / slug(model, count) / f"{prefix}{results.suite}.json"


def record_hint(results_path: Path | str) -> str:
    return f"nox -s update_baselines -- --results {results_path}"


def load_baseline(results: BenchResults, root: Path = DEFAULT_DIR, *, results_path: str = "RESULTS") -> BenchResults:
    """The stored baseline matching ``results`` (GPU model and count, kind, suite)."""
    path = baseline_path(results, root)
    if not path.exists():
        model, count = results.gpu_key()
        raise NoBaselineError(
            f"no baseline for suite {results.suite!r} on {count}x {model} ({path} does not exist); "
            f"record one with: {record_hint(results_path)}"
        )
    baseline = load_results(path, kind=results.kind)
    if baseline.gpu_key() != results.gpu_key() or baseline.suite != results.suite:
        raise DataError(
            f"{path}: recorded on {baseline.gpu_key()} for suite {baseline.suite!r}, but it sits where the "
            f"baseline of {results.gpu_key()} / {results.suite!r} belongs; re-record it"
        )
    return baseline


def comparable_problems(results: BenchResults, stored: BenchResults, side: str) -> list[str]:
    """Why ``side`` of this run and of the stored baseline are not like with like: a case in another unit (a
    unit names its metric too), or another identity of the build (its subject's ``identity``: the release under
    test and, for a candidate, the change)."""
    problems = []
    stored_cases = stored.by_id()
    for case in results.cases:
        other = stored_cases.get(case.id)
        if other is not None and other.unit != case.unit:
            problems.append(f"case {case.id} is in {case.unit!r} in this run and in {other.unit!r} in the baseline")
            break
    identity = subjects.subject_of(results.kind).identity
    mine, theirs = identity(results, side), identity(stored, side)
    for key in sorted(mine.keys() | theirs.keys()):
        if mine.get(key) != theirs.get(key):
            problems.append(
                f"the {side} side's {key} is {mine.get(key, 'not recorded')!r} in this run and "
                f"{theirs.get(key, 'not recorded')!r} in the baseline"
            )
    return problems


def check_comparable(
    results: BenchResults, stored: BenchResults, side: str, path: Path | str, results_path: Path | str
) -> None:
    """A :class:`DataError` (exit 7) naming both values when the baseline is not the same thing measured."""
    problems = comparable_problems(results, stored, side)
    if problems:
        other = "base" if side == "candidate" else "candidate"
        raise DataError(
            f"{results_path} against {path}: not like with like: " + "; ".join(problems) + ". Compare a run of the "
            f"same release and change (or the other side, --side {other}, where that one matches), or record a "
            f"baseline of this one: {record_hint(results_path)}"
        )


def record(results_path: Path, root: Path = DEFAULT_DIR, *, force: bool = False, reason: str | None = None) -> Path:
    """Store ``results_path`` as the baseline of its GPU and suite: only a run whose A/B verdict is PASS,
    unless ``reason`` says why another is (stored in the baseline, ``settings.recorded_despite``)."""
    results = load_results(results_path)
    if results.gpu_key()[1] == 0:
        raise UsageError(f"{results_path} names no GPU in its provenance; only GPU runs can be baselines")
    if results.settings.get("aa"):
        raise UsageError(
            f"{results_path} is an A/A run (the base build against itself): it measures noise, "
            "not a build; record the results of an A/B run instead"
        )
    problems = evidence.record_problems(results)
    if problems:
        raise IncompleteEvidenceError(
            f"{results_path} cannot be a baseline: " + "; ".join(problems) + ". Record a complete, clean A/B run"
        )
    verdict = _ab_verdict(results)
    if verdict != "PASS" and not (reason and reason.strip()):
        raise UsageError(
            f"{results_path}: its A/B verdict is {verdict}, not PASS: a baseline is what later runs must not be "
            "slower than, and this candidate is no such build. Record a run that PASSes, or give the reason this "
            "one should be the baseline anyway: --reason '...' (it is stored in the baseline)"
        )
    if verdict != "PASS":
        results.settings["recorded_despite"] = {"verdict": verdict, "reason": reason.strip()}
    path = baseline_path(results, root)
    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to replace it (the old one is kept in git history)")
    if path.exists():
        dropped = sorted({c.id for c in load_results(path, kind=results.kind).cases} - {c.id for c in results.cases})
        if dropped:
            raise UsageError(
                f"{path}: {results_path} lacks {len(dropped)} of the stored baseline's cases "
                f"({evidence.shown(dropped)}): --force replaces a baseline, it never shrinks one. If the suite "
                "dropped those cases on purpose, remove the old file (git rm) and record again"
            )
    _write_exclusive(path, dumps(results.to_json()) + "\n", replace=force)
    return path


def _ab_verdict(results: BenchResults) -> str:
    """The run's own A/B verdict (candidate vs base), as ``nox -s gate`` gives it."""
    from ci.core import compare, stats

    return compare.compare_ab(results, stats.DEFAULT_THRESHOLD, stats.DEFAULT_CONFIDENCE).overall.value


def _write_exclusive(path: Path, text: str, *, replace: bool) -> None:
    """Write ``path`` whole: a temporary file, then a hard link that fails if ``path`` appeared
    meanwhile (two records at once: exactly one wins), or a rename over it with ``replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    try:
        os.chmod(tmp, 0o644)
        if replace:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)
        except FileExistsError as exc:
            raise UsageError(f"{path} was recorded by someone else meanwhile; pass --force to replace it") from exc
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.core.baselines", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", allow_abbrev=False, help="store a results file as the baseline of its GPU and suite")
    rec.add_argument("results", type=Path, nargs="?", help="the results file (or --results FILE)")
    rec.add_argument(
        "--results", type=Path, dest="results_option", help="the results file, as ci.core.compare takes it"
    )
    rec.add_argument("--baseline-dir", "--dir", dest="dir", type=Path, default=DEFAULT_DIR, help="as ci.core.compare")
    rec.add_argument("--force", action="store_true", help="replace an existing baseline")
    rec.add_argument("--reason", help="why a run whose A/B verdict is not PASS should be the baseline (stored in it)")
    args = parser.parse_args(argv)
    if (args.results is None) == (args.results_option is None):
        raise UsageError("record takes one results file: RESULTS or --results RESULTS")
    path = record(args.results or args.results_option, args.dir, force=args.force, reason=args.reason)
    print(f"baselines: recorded {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
