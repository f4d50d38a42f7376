"""ci.runner.weekly: the text of the weekly follow-up's issue, from each check's exit code and log."""

from __future__ import annotations

import pytest

from ci.core.errors import ExitCode, UsageError
from ci.runner import weekly


def test_the_issue_names_each_failed_check_its_verdict_log_and_reproduction(tmp_path):
    log = tmp_path / "newest.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)) + "error: vLLM 0.35.0 is on the package index\n")
    out = tmp_path / "issue.md"
    code = weekly.main(
        [
            "--check",
            f"newest=14:{log}",
            "--check",
            f"main=0:{tmp_path / 'main.log'}",
            "--out",
            str(out),
            "--run-url",
            "https://example.invalid/run/7",
        ]
    )
    text = out.read_text()
    assert code == ExitCode.FAILED and text.splitlines()[0] == weekly.TITLE
    assert "1 of 2 checks failed in https://example.invalid/run/7." in text
    assert "| newest | RELEASE_AHEAD | 14 | `nox -s tests_release -- --release newest` |" in text
    assert "| main | PASS | 0 |" in text and "## main" not in text  # a passing check gets no section
    section = text.split("## newest: RELEASE_AHEAD (the package index has a newer vLLM release", 1)[1]
    assert "error: vLLM 0.35.0 is on the package index" in section
    assert "line 61\n" in section and "line 60\n" not in section  # the last TAIL_LINES lines only


def test_a_missing_log_and_an_unknown_code_are_said_plainly(tmp_path):
    text = weekly.issue_text([weekly.Check("main", 77, tmp_path / "none.log")])
    assert "| main | exit 77 | 77 |" in text and "## main: exit 77\n" in text
    assert f"(no log: {tmp_path / 'none.log'} was not written; the check did not start)" in text


def test_all_passing_exits_0_and_bad_input_is_refused(tmp_path):
    assert weekly.main(["--check", f"newest=0:{tmp_path / 'x'}", "--out", str(tmp_path / "o.md")]) == 0
    assert "0 of 1 checks failed." in (tmp_path / "o.md").read_text()
    for bad in ("newest", "newest=x:log", "Newest=1:log", "newest=1:"):
        with pytest.raises(UsageError, match="expected NAME=CODE:LOG"):
            weekly.parse_check(bad)
