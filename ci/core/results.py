"""The results files: one schema for every subject's stage (``ci.core.subjects``).

A file holds raw samples per case and per build ("base", "candidate"), in one unit; every
statistic is computed from them later (torch.utils.benchmark keeps ``raw_times`` likewise).
Files carry a kind and a schema version and are refused when either is unknown.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ci.core.errors import DataError
from ci.core.jsonio import read_json, require, write_json

RESULTS_VERSION = 2
# what this gate reads: version 1 called a sample's capture its "block" (``extra.blocks``, settings ``blocks``
# and ``rounds_per_block``), version 2 ``captures``; a version-1 file is read as version 2 (``_upgrade``)
READ_VERSIONS = (1, 2)
V1_RENAMES = {"blocks": "captures", "rounds_per_block": "rounds_per_capture"}
# Bounds on what a results file may hold, far above what a stage writes (the kernel bench: 118 cases of 90
# samples a build), so a file made to exhaust the gate is refused at once with the reason.
MAX_CASES = 10_000
MAX_SAMPLES = 20_000  # per case and build
# settings the verdict reads, and their types (None: the key may be absent)
SETTING_TYPES = {
    "complete": bool,
    "aa": bool,
    "case_filter": (str, type(None)),
    "rounds_done": int,
    "inject_slowdown": (int, float),
}


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
        return self.by_id().get(case_id)

    def by_id(self) -> dict[str, CaseResult]:
        """The cases by id (one pass: look-ups over a whole run stay linear)."""
        return {c.id: c for c in self.cases}

    def gpu_key(self) -> tuple[str, int]:
        """(GPU model, count) this was measured on: the baseline key."""
        gpus = self.provenance.get("gpu", {}).get("gpus", [])
        return (gpus[0]["name"] if gpus else "unknown", len(gpus))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: Path) -> None:
        write_json(path, self.to_json())


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_samples(where: str, case_id: str, samples: Any) -> dict[str, list[float]]:
    if not isinstance(samples, dict) or not samples:
        raise DataError(f"{where}: case {case_id!r} has no samples")
    for side, xs in samples.items():
        if not isinstance(xs, list) or not xs:
            raise DataError(f"{where}: case {case_id!r}, build {side!r}: samples must be a non-empty list")
        if len(xs) > MAX_SAMPLES:
            raise DataError(
                f"{where}: case {case_id!r}, build {side!r}: {len(xs)} samples, more than the "
                f"{MAX_SAMPLES} the gate reads; no stage of it writes so many: re-run it"
            )
        if not all(_is_number(x) and x > 0 for x in xs):
            raise DataError(f"{where}: case {case_id!r}, build {side!r}: samples must be positive finite numbers")
    return samples


def _check_provenance(where: str, provenance: dict[str, Any]) -> None:
    """The part of the provenance the gate keys on: ``gpu`` with a list of GPUs, each named."""
    gpu = provenance.get("gpu", {})
    if not isinstance(gpu, dict):
        raise DataError(f"{where}: provenance.gpu should be an object, found {gpu!r}")
    gpus = gpu.get("gpus", [])
    if not isinstance(gpus, list) or not all(isinstance(g, dict) and isinstance(g.get("name"), str) for g in gpus):
        raise DataError(f"{where}: provenance.gpu.gpus should be a list of objects with a 'name', found {gpus!r}")


def load_results(path: Path | str, *, kind: str | None = None) -> BenchResults:
    """Read and validate a results (or baseline) file; a :class:`DataError` names what is wrong."""
    payload = read_json(path, kind=kind, versions=READ_VERSIONS) if kind else _read_any(path)
    where = str(path)
    _upgrade(payload)
    cases = []
    raw_cases = require(payload, "cases", list, where)
    if len(raw_cases) > MAX_CASES:
        raise DataError(
            f"{where}: {len(raw_cases)} cases, more than the {MAX_CASES} the gate reads; no stage of "
            "this gate writes so many: re-run it"
        )
    for raw in raw_cases:
        if not isinstance(raw, dict):
            raise DataError(f"{where}: each case must be an object, found {raw!r}")
        case_id = require(raw, "id", str, where)
        cases.append(
            CaseResult(
                id=case_id,
                unit=require(raw, "unit", str, where),
                samples=_check_samples(where, case_id, raw.get("samples")),
                info=_object(raw, "info", where, case_id),
                extra=_object(raw, "extra", where, case_id),
            )
        )
    from ci.core import schema, subjects

    case_schema = subjects.subject_of(payload["kind"]).schema
    for case in cases:
        schema.check_case(where, case.id, {"info": case.info, "extra": case.extra}, case_schema)
    duplicates = sorted(i for i, n in Counter(c.id for c in cases).items() if n > 1)
    if duplicates:
        raise DataError(f"{where}: duplicate case ids {duplicates[:5]}")
    provenance = require(payload, "provenance", dict, where)
    _check_provenance(where, provenance)
    settings = require(payload, "settings", dict, where)
    _check_settings(where, settings)
    return BenchResults(
        kind=payload["kind"],
        suite=require(payload, "suite", str, where),
        provenance=provenance,
        settings=settings,
        cases=cases,
    )


def _check_settings(where: str, settings: dict[str, Any]) -> None:
    """The settings the verdict reads must have their types: a boolean is a boolean (``"false"`` is not)."""
    for key, typ in SETTING_TYPES.items():
        if key not in settings:
            continue
        allowed = typ if isinstance(typ, tuple) else (typ,)
        value = settings[key]  # isinstance(True, int) holds: a boolean only where a boolean is meant
        if not isinstance(value, allowed) or isinstance(value, bool) != (bool in allowed):
            raise DataError(f"{where}: settings.{key} should be {_type_name(typ)}, found {value!r}")
    for key in ("expected_cases", "identity_keys"):
        value = settings.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(i, str) for i in value)):
            raise DataError(f"{where}: settings.{key} should be a list of strings, found {value!r}")
    failed = settings.get("failed_cases")
    if failed is not None and not (
        isinstance(failed, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in failed.items())
    ):
        raise DataError(f"{where}: settings.failed_cases should map case ids to reasons, found {failed!r}")


def _type_name(typ) -> str:
    names = [t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)) if t is not type(None)]
    return " or ".join(
        {"bool": "true or false", "str": "a string", "int": "an integer", "float": "a number"}[n] for n in names
    )


def _object(raw: dict[str, Any], key: str, where: str, case_id: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise DataError(f"{where}: case {case_id!r}: field {key!r} should be an object, found {value!r}")
    return value


def _upgrade(payload: dict[str, Any]) -> None:
    """A version-1 payload in place as version 2: its ``blocks`` keys (of each case's extra, and of the
    settings) under their version-2 names. Nothing else differs between the two versions (the results read
    back are version 2, as every ``BenchResults`` is)."""
    if payload.get("schema_version") != 1:
        return
    places = [payload.get("settings")] + [c.get("extra") for c in payload.get("cases") or [] if isinstance(c, dict)]
    for place in places:
        if isinstance(place, dict):
            for old, new in V1_RENAMES.items():
                if old in place and new not in place:
                    place[new] = place.pop(old)


def _read_any(path: Path | str) -> dict[str, Any]:
    """A results file of any kind a subject registered: the kind is read from the file, then checked."""
    from ci.core import subjects

    probe = read_json(path, kind=None, versions=READ_VERSIONS)
    if probe.get("kind") not in subjects.kinds():
        raise DataError(f"{path}: not a results file (kind {probe.get('kind')!r}, should be one of {subjects.kinds()})")
    return probe
