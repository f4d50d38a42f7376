"""The change's lines, and which of them a test run executed (coverage.py): what a PASS can vouch for.

A tier's PASS says something only about code it ran. The CPU tier replaces the CUDA kernels with spies, so a
change inside the spied ``_fused_marlin_moe``, behind ``.is_cuda``, an environment variable or a
``torch.distributed`` branch is never run there; a PASS must say so. This module:

* finds the change's lines: every line the candidate adds or modifies in a changed Python file (``difflib``
  over the two trees' files, the candidate's line numbers), mapped to the statements they belong to with
  coverage.py's own parser (a line inside a multi-line statement counts as that statement; comments, blank
  lines and docstrings are no statements), with no exclusion pragma honoured (a ``# pragma: no cover`` in a
  patch hides nothing);
* measures them: each test process runs coverage.py on the candidate's changed files only (``start`` /
  ``stop``), its data in a folder of its own beside the trees; the run's controller combines the processes'
  data (``summarize``) and names every changed statement no test executed, as ``path:line``.

How it is encoded: the run's summary JSON (``--gate-summary``, ``changed_lines``) holds the counts and the
lines never run; the verdict line names them, and a run whose tests all passed but left changed lines
unexecuted exits INCOMPLETE (10), never PASS: on the CPU, "only the GPU suite can vouch for them"; in the GPU
suite (``nox -s gpu_gate``), the run is INCOMPLETE unless every changed line ran in one of the two.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ci.trees.manifest import Trees
from ci.trees.treediff import ADDED, MODIFIED, code_unchanged

DATA_DIR = "changed-lines"  # in the trees' folder, beside base/ and candidate/: one sub-folder a test run
DIR_ENV = "GATE_CHANGED_LINES_DIR"  # the run's folder, set by the controller, read by its xdist workers
COVERAGE_PIN = "coverage==7.17.5"  # the version requirements/test.txt pins (the message when it is missing)


@dataclass(frozen=True, kw_only=True)
class LineReport:
    """What a run executed of the change's statements (``path`` relative to the tree, ``path:line``)."""

    measured: bool  # False: coverage.py was not there, or no data came back
    statements: int = 0  # the change's executable statements
    executed: int = 0
    unexecuted: list[str] = field(default_factory=list)
    why_not_measured: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def complete(self) -> bool:
        return self.measured and not self.unexecuted


def changed_python_files(trees: Trees) -> list[str]:
    """The candidate's added or modified Python files (relative paths): the only code it loads of its own. A file
    whose code did not change (comments, docstrings or layout: ``treediff.same_code``) is not one: the candidate
    runs the base's copy of it, and none of its lines is a changed statement."""
    return [
        c.path
        for c in trees.manifest.changed_files
        if c.what in (ADDED, MODIFIED) and c.path.endswith(".py") and not code_unchanged(trees.base, trees.candidate, c)
    ]


def changed_line_numbers(base: str, candidate: str) -> list[int]:
    """The 1-based line numbers of ``candidate`` that it adds or replaces relative to ``base``."""
    old, new = base.splitlines(), candidate.splitlines()
    lines: list[int] = []
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            lines.extend(range(j1 + 1, j2 + 1))
    return lines


def _parser(text: str, filename: str):
    from coverage.parser import PythonParser

    parser = PythonParser(text=text, filename=filename, exclude=None)  # no pragma excludes a changed line
    parser.parse_source()
    return parser


def changed_statements(trees: Trees) -> dict[str, list[int]]:
    """Per changed Python file (relative path): the first lines of the statements the change adds or edits."""
    found = {}
    for rel in changed_python_files(trees):
        cand = (trees.candidate / rel).read_text(errors="replace")
        base_file = trees.base / rel
        base = base_file.read_text(errors="replace") if base_file.is_file() else ""
        try:
            parser = _parser(cand, str(trees.candidate / rel))
        except Exception:  # a file Python cannot parse: its import fails, and every test with it
            continue
        firsts = {parser.first_line(n) for n in changed_line_numbers(base, cand)}
        lines = sorted(n for n in firsts if n in parser.statements)
        if lines:
            found[rel] = lines
    return found


def measured_files(trees: Trees) -> list[str]:
    """The absolute, real paths of the candidate files to measure (what coverage.py's ``include`` gets)."""
    return [os.path.realpath(trees.candidate / rel) for rel in changed_python_files(trees)]


def start(trees: Trees, folder: Path):
    """Start coverage.py on the candidate's changed files in this process; None when it is not installed or
    there is nothing to measure. Call before the candidate is loaded."""
    files = measured_files(trees)
    if not files:
        return None
    try:
        import coverage
    except ImportError:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    cov = coverage.Coverage(
        data_file=str(folder / ".coverage"), data_suffix=True, include=files, branch=False, config_file=False
    )
    cov.set_option("run:disable_warnings", ["no-data-collected"])  # a process that ran none of them: no noise
    if sys.version_info >= (3, 12):  # sys.monitoring: the code outside the changed files runs at full speed
        with contextlib.suppress(Exception):  # a coverage.py older than 7.4 has no such option: its tracer, slower
            cov.set_option("run:core", "sysmon")
    cov.start()
    return cov


def stop(cov) -> None:
    if cov is not None:
        cov.stop()
        cov.save()


def summarize(trees: Trees, folder: Path) -> LineReport:
    """Combine the data of every process of a run (``folder``) and name the change's statements none ran."""
    wanted = changed_statements(trees)
    total = sum(len(v) for v in wanted.values())
    if total == 0:
        return LineReport(measured=True)
    try:
        from coverage import CoverageData
    except ImportError:
        return LineReport(
            measured=False,
            statements=total,
            why_not_measured=(
                f"coverage.py is not installed, so no changed line was measured: install it ({COVERAGE_PIN}, "
                "requirements/test.txt), or run the tier through its nox session"
            ),
        )
    data_files = sorted(folder.glob(".coverage*"))  # none where the folder is not there
    if not data_files:
        return LineReport(
            measured=False,
            statements=total,
            why_not_measured="no test process recorded coverage data (did any test run?)",
        )
    ran: dict[str, set[int]] = {}
    for data_file in data_files:
        data = CoverageData(basename=str(data_file))
        data.read()
        for measured in data.measured_files():
            ran.setdefault(os.path.realpath(measured), set()).update(data.lines(measured) or ())
    unexecuted = []
    for rel, lines in wanted.items():
        path = os.path.realpath(trees.candidate / rel)
        parser = _parser((trees.candidate / rel).read_text(errors="replace"), path)
        executed = {parser.first_line(n) for n in ran.get(path, ())}
        unexecuted += [f"{rel}:{n}" for n in lines if n not in executed]
    return LineReport(measured=True, statements=total, executed=total - len(unexecuted), unexecuted=unexecuted)


def shown(lines: list[str], limit: int = 8) -> str:
    """``a.py:1, a.py:7, ...`` with the count of the rest."""
    head = ", ".join(lines[:limit])
    return head + (f" and {len(lines) - limit} more" if len(lines) > limit else "")


def write(report: LineReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_json(), indent=1) + "\n")
