"""The JSON summary of a test run: outcomes, the largest error per check, wall time, provenance."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ci.core.jsonio import write_json

SUMMARY_KIND = "gpu-test-summary"
SUMMARY_VERSION = 1


@dataclass
class CheckStats:
    largest: float
    bound: float | None
    samples: int
    worst_test: str


@dataclass
class SuiteSummary:
    started: float = field(default_factory=time.time)
    outcomes: dict[str, int] = field(default_factory=dict)
    checks: dict[str, CheckStats] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    changed_lines: object = None  # ci.trees.changed_lines.LineReport of the run (None: not measured)
    not_in_release: dict[str, list[str]] | None = None  # formats the release's entry lacks arguments for (None: unread)

    def add_outcome(self, nodeid: str, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if outcome in ("failed", "error"):
            self.failures.append(nodeid)

    def add_metric(self, nodeid: str, check: str, value: float, bound: float | None) -> None:
        cur = self.checks.get(check)
        if cur is None:
            self.checks[check] = CheckStats(largest=value, bound=bound, samples=1, worst_test=nodeid)
            return
        cur.samples += 1
        if value > cur.largest:
            cur.largest, cur.worst_test = value, nodeid

    def to_json(self, provenance: dict, exit_status: int) -> dict:
        return {
            "kind": SUMMARY_KIND,
            "schema_version": SUMMARY_VERSION,
            "wall_time_s": round(time.time() - self.started, 1),
            "exit_status": exit_status,
            "outcomes": self.outcomes,
            "failures": self.failures,
            "checks": {k: asdict(v) for k, v in sorted(self.checks.items())},
            "changed_lines": None if self.changed_lines is None else self.changed_lines.to_json(),
            "formats_not_in_release": self.not_in_release,
            "provenance": provenance,
        }

    def write(self, path: Path, provenance: dict, exit_status: int) -> None:
        write_json(path, self.to_json(provenance, exit_status))
