"""The benchmark result files: one schema for the kernel and the TPOT benchmarks.

A file holds raw samples per case and per build ("base", "candidate"), in one unit; every
statistic is computed from them later (torch.utils.benchmark keeps ``raw_times`` likewise).
Files carry a kind and a schema version and are refused when either is unknown.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ci.errors import DataError
from ci.jsonio import read_json, require, write_json

RESULTS_VERSION = 1
KINDS = ("kernel-bench", "tpot-bench")
SIDES = ("base", "candidate")


@dataclass(kw_only=True)
class CaseResult:
    id: str
    unit: str
    samples: dict[str, list[float]]  # build -> raw samples (interleaved rounds: index i pairs up)
    info: dict[str, Any] = field(default_factory=dict)  # shape, EP layout, block sizes, ...
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. per-block-size samples, correctness


@dataclass(kw_only=True)
class BenchResults:
    kind: str
    suite: str
    provenance: dict[str, Any]
    settings: dict[str, Any]
    cases: list[CaseResult]
    schema_version: int = RESULTS_VERSION

    def case(self, case_id: str) -> CaseResult | None:
        return next((c for c in self.cases if c.id == case_id), None)

    def gpu_key(self) -> tuple[str, int]:
        """(GPU model, count) this was measured on: the baseline key."""
        gpus = self.provenance.get("gpu", {}).get("gpus", [])
        return (gpus[0]["name"] if gpus else "unknown", len(gpus))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: Path) -> None:
        write_json(path, self.to_json())


def _check_samples(where: str, case_id: str, samples: Any) -> dict[str, list[float]]:
    if not isinstance(samples, dict) or not samples:
        raise DataError(f"{where}: case {case_id!r} has no samples")
    for side, xs in samples.items():
        ok = isinstance(xs, list) and all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in xs)
        if not ok:
            raise DataError(f"{where}: case {case_id!r}, build {side!r}: samples must be positive finite numbers")
    return samples


def load_results(path: Path | str, *, kind: str | None = None) -> BenchResults:
    """Read and validate a results (or baseline) file; a :class:`DataError` names what is wrong."""
    payload = read_json(path, kind=kind, versions=(RESULTS_VERSION,)) if kind else _read_any(path)
    where = str(path)
    cases = []
    for raw in require(payload, "cases", list, where):
        if not isinstance(raw, dict):
            raise DataError(f"{where}: each case must be an object, found {raw!r}")
        case_id = require(raw, "id", str, where)
        cases.append(
            CaseResult(
                id=case_id,
                unit=require(raw, "unit", str, where),
                samples=_check_samples(where, case_id, raw.get("samples")),
                info=raw.get("info", {}),
                extra=raw.get("extra", {}),
            )
        )
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise DataError(f"{where}: duplicate case ids")
    return BenchResults(
        kind=payload["kind"],
        suite=require(payload, "suite", str, where),
        provenance=require(payload, "provenance", dict, where),
        settings=require(payload, "settings", dict, where),
        cases=cases,
    )


def _read_any(path: Path) -> dict[str, Any]:
    for kind in KINDS:
        try:
            return read_json(path, kind=kind, versions=(RESULTS_VERSION,))
        except DataError as exc:
            if "expected a" not in str(exc):
                raise
    raise DataError(f"{path}: not a results file (kind should be one of {KINDS})")
