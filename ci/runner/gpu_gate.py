"""The whole GPU verdict in one command: the GPU suite, the bench's A/B, and the verdict against the stored
baseline, one summary table and one exit code (``nox -s gpu_gate``; the GPU workflow runs the same), for the
subject the change enters (``ci.core.subjects.by_entry_module``: the Marlin kernels, or Triton's fused MoE).

Stages, each a process of its own, in this order; a stage runs only if the ones before it passed:

1. the subject's GPU equivalence suite (pytest over its test folder, ``-m gpu``: ``tests/ep_marlin``,
   ``tests/triton_moe``): the candidate computes the same numbers; any failure ends the run with FAIL (1),
   nothing is timed. It measures which of the change's lines it ran (``ci.trees.changed_lines``): a changed line
   the GPU suite never ran makes the run INCOMPLETE (10) whatever the timings say (they still run and are
   shown), and the table names the line;
2. the subject's bench (``ci.kernel.bench``, ``ci.triton_moe.bench``): base and candidate timed on this GPU;
3. the A/B verdict (``ci.core.compare``, at ``--threshold``): the verdict on the change;
4. the same results against the stored baseline of this GPU (``ci.core.compare --mode baseline``): the
   candidate side when the run tests the baseline's own change, else the base side (is this machine
   measuring what the baseline's did?). Shown, and counted only with ``--count-baseline``: between two
   processes the same build sits 2-5% apart on a few cases, which captures within one run cannot see
   (docs/statistics.md: of the A/A runs against the stored baseline, 6 of 336 cases INCONCLUSIVE and, in
   another, 1 of 118 FAIL), so the verdict on a change is the A/B's, where both builds share a process.

The exit code is the first stage's that did not pass, in the gate's codes (README); PASS is 0. The table
goes to stdout, ``OUT/summary.md`` and ``$GITHUB_STEP_SUMMARY``.

Usage: ``python -m ci.runner.gpu_gate --manifest M --out DIR [--suite default] [--threshold 0.03] [--workers N]
[--baseline-dir D] [--count-baseline]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.core import baselines, compare, report, subjects
from ci.core.cli import run_main
from ci.core.errors import PYTEST_CODES, DataError, ExitCode, GateError, UsageError
from ci.core.stats import DEFAULT_THRESHOLD
from ci.host import outputs
from ci.runner.jobsummary import describe
from ci.runner.stages import run_stage
from ci.trees.manifest import load_trees

ROOT = Path(__file__).resolve().parents[2]


@dataclass(kw_only=True)
class Step:
    name: str
    code: int | None = None  # None: not run
    seconds: float = 0.0
    output: str = ""
    counts: bool = True

    @property
    def verdict(self) -> str:
        return "not run" if self.code is None else describe(self.code)[0]


def _run(step: Step, argv: list[str], codes: dict[int, int] | None = None) -> Step:
    print(f"gpu_gate: {step.name}: {' '.join(argv)}", flush=True)
    started = time.time()
    code = run_stage(argv, ROOT)
    step.code, step.seconds = (codes or {}).get(code, code), time.time() - started
    return step


def baseline_side(manifest_patch_sha: str, baseline_path: Path) -> str:
    """``candidate`` when the stored baseline measured this very change, else ``base``."""
    try:
        stored = json.loads(baseline_path.read_text())
        recorded = ((stored.get("provenance") or {}).get("vllm") or {}).get("patch_sha256")
    except (OSError, ValueError, AttributeError, RecursionError):
        return "base"
    return "candidate" if recorded == manifest_patch_sha else "base"


def table(steps: Sequence[Step], code: int) -> str:
    lines = [
        f"### GPU gate: {describe(code)[0]} (exit {code})",
        "",
        "| stage | verdict | exit code | time (s) | output |",
        "|---|---|---:|---:|---|",
    ]
    for s in steps:
        shown = "-" if s.code is None else str(s.code)
        mark = "" if s.counts else " (shown, not counted)"
        lines.append(f"| {s.name} | {s.verdict}{mark} | {shown} | {s.seconds:.0f} | {s.output or '-'} |")
    return "\n".join(lines) + "\n"


def gate_subject(trees) -> subjects.Subject:
    """The subject whose GPU stages this change gets: the one its build's entry module belongs to."""
    from ci.trees.variants import entry_module

    entry = entry_module(trees)
    subject = subjects.by_entry_module(entry)
    if subject is None or not (subject.test_folder and subject.bench and subject.results_file):
        known = ", ".join(
            f"{s.entry_module} ({s.kind})" for s in map(subjects.subject_of, subjects.kinds()) if s.entry_module
        )
        raise UsageError(
            f"{trees.manifest_path}: the change enters through {entry}, which no subject with GPU "
            f"stages registered (those that do: {known}); test it with nox -s gpu_tests"
        )
    return subject


def run_gate(
    manifest: Path,
    out: Path,
    *,
    suite: str,
    workers: int,
    baseline_dir: Path,
    count_baseline: bool = False,
    threshold: float = DEFAULT_THRESHOLD,
) -> tuple[list[Step], int]:
    trees = load_trees(manifest)
    subject = gate_subject(trees)
    label = subject.kind.removesuffix("-bench")
    py = sys.executable
    results = out / "bench" / subject.results_file
    steps = [
        Step(name="GPU equivalence suite", output=str(out / "gpu_tests" / outputs.SUITE_SUMMARY)),
        Step(name=f"{label} bench", output=str(results)),
        Step(name=f"{label} verdict (A/B)", output=str(out / "ab" / "report.md")),
        Step(name=f"{label} verdict (baseline)", output=str(out / "baseline" / "report.md")),
    ]
    suite_argv = [
        py,
        "-m",
        "pytest",
        "--gate-manifest",
        str(manifest),
        subject.test_folder,
        "-m",
        "gpu",
        "--require-gpu",
        "-n",
        str(workers),
        f"--junitxml={out / 'gpu_tests' / outputs.SUITE_JUNIT}",
        f"--gate-summary={steps[0].output}",
    ]
    judge = ["--threshold", repr(threshold)]
    plan = [
        (steps[0], suite_argv, PYTEST_CODES),
        (
            steps[1],
            [
                py,
                "-m",
                subject.bench,
                "--manifest",
                str(manifest),
                "--suite",
                suite,
                *judge,
                "--out",
                str(results.parent),
            ],
            None,
        ),
        (steps[2], [py, "-m", "ci.core.compare", "--results", str(results), *judge, "--out", str(out / "ab")], None),
    ]
    caveat = 0
    for step, argv, codes in plan:
        code = _run(step, argv, codes).code
        if step is steps[0] and code == ExitCode.INCOMPLETE and lines_not_run(Path(steps[0].output)):
            step.output += f" (changed lines never run: {', '.join(lines_not_run(Path(steps[0].output))[:4])})"
            caveat = int(ExitCode.INCOMPLETE)  # the suite passed but did not run every changed line
            continue
        if code != 0:
            return steps, int(step.code)
    side = "base"
    with contextlib.suppress(GateError):  # a results file with no baseline path: the compare stage says why
        side = baseline_side(trees.manifest.patch_sha256, baselines.baseline_path(_results(results), baseline_dir))
    compare = [
        py,
        "-m",
        "ci.core.compare",
        "--results",
        str(results),
        "--mode",
        "baseline",
        "--side",
        side,
        *judge,
        "--baseline-dir",
        str(baseline_dir),
        "--out",
        str(out / "baseline"),
    ]
    steps[3].name = f"{label} verdict (baseline, {side} side)"
    code = _run(steps[3], compare).code
    steps[3].counts = count_baseline and code != ExitCode.NO_BASELINE  # nothing stored yet: nothing to count
    return steps, (code if steps[3].counts and code else caveat)


def lines_not_run(summary: Path) -> list[str]:
    """The changed lines a GPU-suite run whose tests all passed left unexecuted (its summary JSON); [] when
    it failed a test, ran every line, or wrote no summary."""
    try:
        payload = json.loads(summary.read_text())
    except (OSError, ValueError, RecursionError):
        return []
    if not isinstance(payload, dict) or (payload.get("outcomes") or {}).get("failed") or payload.get("failures"):
        return []
    lines = payload.get("changed_lines") or {}
    found = lines.get("unexecuted") if isinstance(lines, dict) else None
    return [str(x) for x in found] if isinstance(found, list) else []


def _results(path: Path):
    from ci.core.results import load_results

    return load_results(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.runner.gpu_gate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--manifest", type=Path, required=True, help="manifest.json of the trees (ci.trees.build)")
    parser.add_argument("--out", type=Path, required=True, help="folder for every stage's output and summary.md")
    parser.add_argument("--suite", default="default", help="the bench's suite (default %(default)s)")
    parser.add_argument(
        "--threshold",
        type=compare.fraction,
        default=DEFAULT_THRESHOLD,
        help="the slowdown that FAILs, as a fraction (default %(default)s: 3%%)",
    )
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers of the GPU suite (%(default)s)")
    parser.add_argument("--baseline-dir", type=Path, default=baselines.DEFAULT_DIR)
    parser.add_argument(
        "--count-baseline",
        action="store_true",
        help="the baseline verdict counts in the exit code too (default: shown only)",
    )
    args = parser.parse_args(argv)
    if not args.manifest.is_file():
        raise DataError(f"--manifest {args.manifest}: no such file; build the trees first (nox -s build)")
    steps, code = run_gate(
        args.manifest,
        args.out,
        suite=args.suite,
        workers=args.workers,
        baseline_dir=args.baseline_dir,
        count_baseline=args.count_baseline,
        threshold=args.threshold,
    )
    text = table(steps, code)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.md").write_text(text)
    print(text)
    report.to_step_summary(text)
    return code


if __name__ == "__main__":
    sys.exit(run_main(main))
