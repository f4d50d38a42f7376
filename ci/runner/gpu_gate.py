"""The whole GPU verdict in one command: the GPU suite, the kernel A/B, and the verdict against the stored
baseline, one summary table and one exit code (``nox -s gpu_gate``; the GPU workflow runs the same).

Stages, each a process of its own, in this order; a stage runs only if the ones before it passed:

1. the GPU equivalence suite (pytest over ``tests/ep_marlin -m gpu``): the candidate computes the same
   numbers; any failure ends the run with FAIL (1), nothing is timed. It measures which of the change's lines
   it ran (``ci.trees.changed_lines``): a changed line the GPU suite never ran makes the run INCOMPLETE (10)
   whatever the timings say (they still run and are shown), and the table names the line;
2. the kernel bench (``ci.kernel.bench``): base and candidate timed on this GPU;
3. the A/B verdict (``ci.core.compare``): the verdict on the change;
4. the same results against the stored baseline of this GPU (``ci.core.compare --mode baseline``): the
   candidate side when the run tests the baseline's own change, else the base side (is this machine
   measuring what the baseline's did?). Shown, and counted only with ``--count-baseline``: between two
   processes the same build sits 2-5% apart on a few cases, which captures within one run cannot see
   (docs/statistics.md: of the A/A runs against the stored baseline, 6 of 336 cases INCONCLUSIVE and, in
   another, 1 of 118 FAIL), so the verdict on a change is the A/B's, where both builds share a process.

The exit code is the first stage's that did not pass, in the gate's codes (README); PASS is 0. The table
goes to stdout, ``OUT/summary.md`` and ``$GITHUB_STEP_SUMMARY``.

Usage: ``python -m ci.runner.gpu_gate --manifest M --out DIR [--suite default] [--workers N] [--baseline-dir D]
[--count-baseline]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.core import baselines, report
from ci.core.cli import run_main
from ci.core.errors import DataError, ExitCode, GateError, UsageError
from ci.runner import outputs
from ci.runner.jobsummary import describe
from ci.trees.manifest import load_trees

ROOT = Path(__file__).resolve().parents[2]
# pytest's codes as the gate's (the noxfile maps them the same way)
PYTEST_CODES = {1: int(ExitCode.FAILED), 2: 130, 3: int(ExitCode.INTERNAL), 4: int(ExitCode.USAGE),
                5: int(ExitCode.USAGE)}  # fmt: skip


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
    done = subprocess.run(argv, cwd=ROOT, check=False)
    code = 128 - done.returncode if done.returncode < 0 else done.returncode
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
    lines = [f"### GPU gate: {describe(code)[0]} (exit {code})", "",
             "| stage | verdict | exit code | time (s) | output |", "|---|---|---:|---:|---|"]  # fmt: skip
    for s in steps:
        shown = "-" if s.code is None else str(s.code)
        mark = "" if s.counts else " (shown, not counted)"
        lines.append(f"| {s.name} | {s.verdict}{mark} | {shown} | {s.seconds:.0f} | {s.output or '-'} |")
    return "\n".join(lines) + "\n"


def run_gate(manifest: Path, out: Path, *, suite: str, workers: int, baseline_dir: Path,
             count_baseline: bool = False) -> tuple[list[Step], int]:  # fmt: skip
    trees = load_trees(manifest)
    from ci.trees.variants import ENTRY_MODULE, entry_module

    if entry_module(trees) != ENTRY_MODULE:
        raise UsageError(f"{manifest}: the change enters vLLM through {entry_module(trees)}, and gpu_gate runs the "
                         "Marlin subject; for a Triton fused-MoE change run nox -s gpu_tests and nox -s "
                         "triton_bench, then nox -s gate -- --results <its triton-moe-results.json>")  # fmt: skip
    py = sys.executable
    results = out / "bench" / outputs.KERNEL_RESULTS
    steps = [
        Step(name="GPU equivalence suite", output=str(out / "gpu_tests" / outputs.SUITE_SUMMARY)),
        Step(name="kernel bench", output=str(results)),
        Step(name="kernel verdict (A/B)", output=str(out / "ab" / "report.md")),
        Step(name="kernel verdict (baseline)", output=str(out / "baseline" / "report.md")),
    ]
    suite_argv = [py, "-m", "pytest", "--gate-manifest", str(manifest), "tests/ep_marlin", "-m", "gpu", "--require-gpu",
                  "-n", str(workers), f"--junitxml={out / 'gpu_tests' / outputs.SUITE_JUNIT}",
                  f"--gate-summary={steps[0].output}"]  # fmt: skip
    plan = [
        (steps[0], suite_argv, PYTEST_CODES),
        (
            steps[1],
            [py, "-m", "ci.kernel.bench", "--manifest", str(manifest), "--suite", suite, "--out", str(results.parent)],
            None,
        ),
        (steps[2], [py, "-m", "ci.core.compare", "--results", str(results), "--out", str(out / "ab")], None),
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
    compare = [py, "-m", "ci.core.compare", "--results", str(results), "--mode", "baseline", "--side", side,
               "--baseline-dir", str(baseline_dir), "--out", str(out / "baseline")]  # fmt: skip
    steps[3].name = f"kernel verdict (baseline, {side} side)"
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
    parser.add_argument("--suite", default="default", help="the kernel bench's suite (default %(default)s)")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers of the GPU suite (%(default)s)")
    parser.add_argument("--baseline-dir", type=Path, default=baselines.DEFAULT_DIR)
    parser.add_argument("--count-baseline", action="store_true",
                        help="the baseline verdict counts in the exit code too (default: shown only)")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.manifest.is_file():
        raise DataError(f"--manifest {args.manifest}: no such file; build the trees first (nox -s build)")
    steps, code = run_gate(args.manifest, args.out, suite=args.suite, workers=args.workers,
                           baseline_dir=args.baseline_dir, count_baseline=args.count_baseline)  # fmt: skip
    text = table(steps, code)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.md").write_text(text)
    print(text)
    report.to_step_summary(text)
    return code


if __name__ == "__main__":
    sys.exit(run_main(main))
