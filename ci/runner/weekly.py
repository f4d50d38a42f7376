"""The weekly follow-up of vLLM (``.github/workflows/vllm-weekly.yml``): the text of the one issue it opens or
updates when a check failed, written from each check's exit code and the end of its log.

The checks are the CPU tier on vLLM's newest release (``nox -s tests_release -- --release newest``) and on
vLLM's main branch (its Python over the newest release's compiled kernels, ``--vllm-src``). Each is named
with the verdict its exit code means (``ci.runner.jobsummary.MEANING``: RELEASE_AHEAD, PATCH, FAIL, ...), so
the issue says what broke, not only that something did; its first line is the issue's title, the same
every week, so the workflow finds the open issue and updates it rather than opening another.

CLI: ``python -m ci.runner.weekly --check NAME=CODE:LOG [--check ...] --out FILE`` writes the issue text
and exits 0 when every check passed, 1 when one failed (the workflow then files the text), 2 on bad input.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.core.cli import run_main
from ci.core.errors import ExitCode, UsageError
from ci.runner.jobsummary import MEANING

TITLE = "Weekly vLLM follow-up: the gate fails on vLLM's newest release or main"
TAIL_LINES = 40
HOW_TO = {
    "newest": "nox -s tests_release -- --release newest",
    "main": "git clone --depth 1 https://github.com/vllm-project/vllm vllm-main && "
    "nox -s tests_release -- --release newest --vllm-src vllm-main",
}
_CHECK = re.compile(r"^(?P<name>[a-z][a-z0-9-]*)=(?P<code>-?\d+):(?P<log>.+)$")


@dataclass(frozen=True)
class Check:
    name: str
    code: int
    log: Path

    @property
    def meaning(self) -> tuple[str, str]:
        """(verdict, what it means) of the check's exit code; an unknown code is named by its number."""
        try:
            return MEANING[ExitCode(self.code)]
        except (ValueError, KeyError):
            return f"exit {self.code}", ""


def parse_check(text: str) -> Check:
    """``NAME=CODE:LOG`` (e.g. ``newest=14:logs/newest.log``)."""
    m = _CHECK.match(text)
    if m is None:
        raise UsageError(f"--check {text!r}: expected NAME=CODE:LOG, e.g. newest=14:logs/newest.log")
    return Check(m["name"], int(m["code"]), Path(m["log"]))


def tail(log: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``log``, or a line saying it is missing (a check that never started)."""
    if not log.is_file():
        return f"(no log: {log} was not written; the check did not start)"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def issue_text(checks: Sequence[Check], run_url: str = "") -> str:
    """The issue: its title line, a table of the checks, and for each failed one its log's end and the
    command that reproduces it."""
    failed = [c for c in checks if c.code != 0]
    out = [TITLE, "", f"{len(failed)} of {len(checks)} checks failed" + (f" in {run_url}" if run_url else "") + ".", ""]
    out += ["| check | verdict | exit code | reproduce |", "|---|---|---|---|"]
    out += [f"| {c.name} | {c.meaning[0]} | {c.code} | `{HOW_TO.get(c.name, '')}` |" for c in checks]
    for c in failed:
        verdict, meaning = c.meaning
        out += ["", f"## {c.name}: {verdict}" + (f" ({meaning})" if meaning else ""), "", "```", tail(c.log), "```"]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.runner.weekly", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("--check", action="append", required=True, help="NAME=CODE:LOG, one per check")
    parser.add_argument("--out", type=Path, required=True, help="where the issue text is written")
    parser.add_argument("--run-url", default="", help="the workflow run, linked from the issue")
    args = parser.parse_args(argv)
    checks = [parse_check(c) for c in args.check]
    args.out.write_text(issue_text(checks, args.run_url))
    print(f"weekly: {sum(c.code != 0 for c in checks)} of {len(checks)} checks failed; issue text: {args.out}")
    return int(ExitCode.FAILED) if any(c.code for c in checks) else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
