"""Error rates of a gate, measured: each run (an A/A, or an A/A with an injected slowdown) judged as the gate
judges a change, and the share of each verdict per level over the runs. The subjects' error-rate stages
(``ci.kernel.error_rates``, ``ci.serving.error_rates``) measure; these functions count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from ci.core import stats
from ci.core.compare import GateReport, compare_ab
from ci.core.errors import UsageError
from ci.core.jsonio import read_json, write_json

SUMMARY_JSON, SUMMARY_MD = "error-rates.json", "error-rates.md"
DEFAULT_INJECT = (0.02, 0.035, 0.05)
TARGETS = {  # what the gate must achieve per case and level (docs/statistics.md)
    "aa": "no FAIL and no INCONCLUSIVE",
    0.02: "never FAIL",
    0.035: "FAIL in at least 90%",
    0.05: "FAIL in 100%",
}


def run_name(inject: float, index: int) -> str:
    return f"aa-{index}" if not inject else f"inject-{inject * 100:g}pct"


def level_key(inject: float) -> str:
    """A level's key in the tables: ``aa`` for no change, else the injected fraction (``0.035``)."""
    return "aa" if not inject else f"{inject:g}"


def summarize(name: str, inject: float, gate: GateReport, wall_time_s: float) -> dict:
    """One run's row: the verdicts of its cases, its largest A/A deviation, its interval widths."""
    counts = {v.value: sum(c.verdict == v for c in gate.cases) for v in stats.Verdict}
    timed = [c.effect for c in gate.cases if c.effect is not None]
    ratios = [e.ratio for e in timed]
    widths = [e.ci_high - e.ci_low for e in timed if math.isfinite(e.ci_high)]
    farthest = max(ratios, key=lambda r: abs(math.log(r)), default=None)
    return {
        "run": name,
        "inject": inject,
        "cases": len(gate.cases),
        "verdicts": counts,
        "overall": gate.overall.value,
        "median_ratio": stats.median(ratios) if ratios else None,
        "farthest_ratio": farthest,
        "median_ci_width": stats.median(widths) if widths else None,
        "largest_ci_width": max(widths, default=None),
        "wall_time_s": round(wall_time_s, 1),
        "not_pass": sorted(c.id for c in gate.cases if c.verdict != stats.Verdict.PASS),
        # a sequential run (ci.core.sequential): the cases judged after more than one look, and their looks
        "looked_again": {c.id: len(c.looks) for c in gate.cases if len(c.looks) > 1},
    }


def pooled(rows: Sequence[dict]) -> dict[str, dict]:
    """Per level (``aa`` or the injected fraction): cases and the share of each verdict, over its runs."""
    levels: dict[str, dict] = {}
    for row in rows:
        key = level_key(row["inject"])
        level = levels.setdefault(key, {"runs": 0, "cases": 0, "counts": dict.fromkeys(row["verdicts"], 0)})
        level["runs"] += 1
        level["cases"] += row["cases"]
        for verdict, n in row["verdicts"].items():
            level["counts"][verdict] = level["counts"].get(verdict, 0) + n
    for level in levels.values():
        level["share"] = {v: (n / level["cases"] if level["cases"] else None) for v, n in level["counts"].items()}
    return levels


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def parse_levels(text: str) -> tuple[float, ...]:
    try:
        levels = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--inject {text!r}: give fractions separated by commas, e.g. 0.02,0.035,0.05") from None
    if not all(0 < x <= 0.5 for x in levels):
        raise UsageError(f"--inject {text!r}: each slowdown is a fraction in (0, 0.5], e.g. 0.035 for +3.5%")
    return levels


def check_out(out: Path) -> None:
    """The out dir is new, empty, or an earlier error-rates folder (never someone else's files; runs are added
    to an earlier table, ``continued``)."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / SUMMARY_JSON).exists())):
        raise UsageError(
            f"--out {out}: exists and is not an error-rates folder (no {SUMMARY_JSON}); choose a new or empty folder"
        )


def continued(out: Path, payload: dict, keep: Sequence[str] = ()) -> dict:
    """The payload to add runs to: ``payload`` for a new folder, or the error-rates table already in ``out``
    (an earlier session's: its runs are kept, and the next runs count on from them) when it measured the same
    thing on the same GPU: the same kind, GPU and settings, but for the ``keep`` settings, which only the
    earlier table has (e.g. the pilot's figure that sized the injected sleep). A :class:`UsageError`
    naming what differs otherwise."""
    path = out / SUMMARY_JSON
    if not path.exists():
        return payload
    earlier = read_json(path, kind=payload["kind"], versions=(payload["schema_version"],))
    ours = {k: v for k, v in payload["settings"].items() if k not in keep}
    theirs = {k: v for k, v in (earlier.get("settings") or {}).items() if k not in keep}
    differ = [
        f"{k}: {theirs.get(k)!r} there, {ours.get(k)!r} now"
        for k in sorted(ours.keys() | theirs.keys())
        if ours.get(k) != theirs.get(k)
    ]
    if earlier.get("gpu") != payload["gpu"]:
        differ.append(f"gpu: {earlier.get('gpu')!r} there, {payload['gpu']!r} now")
    if differ:
        raise UsageError(
            f"{path}: these runs measured something else ({'; '.join(differ)}); add runs with the same "
            "settings, or choose a new --out folder"
        )
    return earlier


def next_index(payload: dict, inject: float) -> int:
    """The number of the next run of this level (1 in a new table)."""
    return 1 + sum(1 for row in payload["runs"] if row["inject"] == inject)


def record_run(
    out: Path, payload: dict, name: str, inject: float, results, wall_time_s: float, markdown, **extra
) -> dict:
    """Judge one run as the gate judges a change (A/B), add its row (with ``extra``) and the pooled shares to
    ``payload``, and write the table so far (``SUMMARY_JSON``, ``SUMMARY_MD`` by ``markdown``) into ``out``."""
    settings = payload.get("settings") or {}
    gate = compare_ab(results, settings.get("threshold", stats.DEFAULT_THRESHOLD), stats.DEFAULT_CONFIDENCE)
    payload["provenance"] = results.provenance
    row = {**summarize(name, inject, gate, wall_time_s), **extra}
    payload["runs"].append(row)
    payload["pooled"] = pooled(payload["runs"])
    write_json(out / SUMMARY_JSON, payload)
    (out / SUMMARY_MD).write_text(markdown(payload))
    print(markdown(payload), flush=True)
    return row
