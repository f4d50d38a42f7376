"""A stage's exit code as the job sees it: the verdict's name in the job summary, an annotation, and
the job's own exit status.

GitHub gives a job only success or failure, so the mapping is written down here, once: PASS is a
success; NO_BASELINE is a success with a warning (nothing to compare against yet: record a
baseline), unless ``--strict``; every other code is a failure whose name (FAIL, INCONCLUSIVE,
INCOMPLETE, NO_GPU, ...) the summary and the annotation give, so a missing baseline or a broken
machine is never read as a slower candidate.

Every stage exits with the gate's codes (``ci/core/errors.py``; nox maps pytest's own onto them).

CLI: ``python -m ci.runner.jobsummary --stage NAME --exit-code N [--strict]``
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ci.core.errors import ExitCode

MEANING = {
    ExitCode.OK: ("PASS", "no case is slower beyond the threshold, with complete evidence"),
    ExitCode.FAILED: ("FAIL", "a case is slower beyond the threshold (or, for a test stage, tests failed)"),
    ExitCode.USAGE: ("USAGE", "bad arguments"),
    ExitCode.INCONCLUSIVE: ("INCONCLUSIVE", "an interval straddles the threshold: re-run with more repeats"),
    ExitCode.NO_BASELINE: ("NO_BASELINE", "no stored baseline matches this run: record one"),
    ExitCode.PATCH: ("PATCH", "the patch does not apply, or changes nothing this gate can test"),
    ExitCode.NO_GPU: ("NO_GPU", "no usable GPU on the runner"),
    ExitCode.DATA: ("DATA", "a results, baseline or manifest file is missing or malformed"),
    ExitCode.SERVER: ("SERVER", "vllm serve or vllm bench serve failed"),
    ExitCode.ENVIRONMENT: ("ENVIRONMENT", "vLLM or a tool is missing"),
    ExitCode.INCOMPLETE: ("INCOMPLETE", "the evidence is incomplete (cases, rounds or samples missing)"),
    ExitCode.GPU_BUSY: ("GPU_BUSY", "another workload is using the GPU"),
    ExitCode.WRONG_RESULTS: ("WRONG_RESULTS", "the candidate computed wrong numbers in a case"),
    ExitCode.UNTRUSTED: ("UNTRUSTED", "a trust check failed (a moved PR head, another ref)"),
    ExitCode.RELEASE_AHEAD: ("RELEASE_AHEAD", "the package index has a newer vLLM release than the gate follows"),
    ExitCode.INTERNAL: ("INTERNAL", "a bug of the gate itself"),
}
INTERRUPTED = 130
KILLED = 137  # 128 + SIGKILL


def describe(code: int) -> tuple[str, str]:
    if code == INTERRUPTED:
        return "INTERRUPTED", "the stage was interrupted (Ctrl-C, SIGTERM, a cancelled job)"
    if code == KILLED:
        return "KILLED", "the stage was killed (SIGKILL: out of memory, or a timeout); no verdict"
    if 128 < code < 128 + 65:
        return f"SIGNAL_{code - 128}", f"the stage ended on signal {code - 128}; no verdict"
    try:
        return MEANING[ExitCode(code)]
    except ValueError:
        return f"EXIT_{code}", "an exit code this gate does not define"


def exit_code(text: str) -> int:
    """An exit status as a shell holds it (0-255, decimal digits): 256 would read as 0, a success."""
    if not (text.isascii() and text.isdigit()) or int(text) > 255:
        raise argparse.ArgumentTypeError(f"{text!r} is not an exit status (0-255)")
    return int(text)


def job_status(code: int, strict: bool = False) -> int:
    """The job's exit status: 0 for PASS, and for NO_BASELINE unless strict; else the stage's code."""
    name, _ = describe(code)
    return 0 if name == "PASS" or (name == "NO_BASELINE" and not strict) else code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.runner.jobsummary", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--stage", required=True, help="what ran, e.g. 'kernel gate (A/B)'")
    parser.add_argument("--exit-code", type=exit_code, required=True, help="the stage's exit status, 0-255")
    parser.add_argument("--strict", action="store_true", help="NO_BASELINE fails the job too")
    args = parser.parse_args(argv)
    stage = " ".join(args.stage.split())  # one line: a line break would start a workflow command
    name, meaning = describe(args.exit_code)
    status = job_status(args.exit_code, args.strict)
    line = f"{stage}: {name} (exit {args.exit_code}): {meaning}"
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as fh:
            fh.write(f"\n### {stage}: **{name}**\n\nexit code {args.exit_code}: {meaning}\n")
    level = "notice" if name == "PASS" else "warning" if status == 0 else "error"
    print(f"::{level} title={name}::{line}")
    return status


if __name__ == "__main__":
    sys.exit(main())
