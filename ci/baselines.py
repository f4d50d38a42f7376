"""Stored baselines: ``baselines/<gpu-model>-x<count>/<suite>.json``.

A baseline is a results file recorded on purpose (``nox -s update_baselines``): written
atomically, never overwritten without ``--force``, schema-checked on every load. Lookup
matches the GPU model and count of the run, and the suite; a missing file is
NO_BASELINE with the command that records one, a corrupt one an error.

CLI: ``python -m ci.baselines record RESULTS [--dir baselines] [--force]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ci.cli import run_main
from ci.errors import DataError, NoBaselineError, UsageError
from ci.gpu import slug
from ci.results import BenchResults, load_results

DEFAULT_DIR = Path("baselines")


def baseline_path(results: BenchResults, root: Path = DEFAULT_DIR) -> Path:
    model, count = results.gpu_key()
    prefix = "" if results.kind == "kernel-bench" else "tpot-"
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


def record(results_path: Path, root: Path = DEFAULT_DIR, *, force: bool = False) -> Path:
    """Store ``results_path`` as the baseline of its GPU and suite."""
    results = load_results(results_path)
    if results.gpu_key()[1] == 0:
        raise UsageError(f"{results_path} names no GPU in its provenance; only GPU runs can be baselines")
    if results.settings.get("aa"):
        raise UsageError(f"{results_path} is an A/A run (the base build against itself): it measures noise, "
                         "not a build; record the results of an A/B run instead")  # fmt: skip
    path = baseline_path(results, root)
    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to replace it (the old one is kept in git history)")
    results.save(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.baselines", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="store a results file as the baseline of its GPU and suite")
    rec.add_argument("results", type=Path)
    rec.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    rec.add_argument("--force", action="store_true", help="replace an existing baseline")
    args = parser.parse_args(argv)
    path = record(args.results, args.dir, force=args.force)
    print(f"baselines: recorded {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
