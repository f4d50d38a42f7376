"""What every unit test shares: no run of the gate's CLIs writes into a real GitHub job summary (act and
Actions set the variable; a test that checks the summary sets its own)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_job_summary(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
