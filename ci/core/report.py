"""Reports people read. A Markdown table (fit for ``$GITHUB_STEP_SUMMARY``) and a PNG.

Kept apart from the statistics (``ci.core.stats``) and the lookup (``ci.core.compare``), so each can
be tested on committed example results without a GPU.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ci.core import subjects
from ci.core.stats import Verdict, median

MARKS = {
    Verdict.PASS: "PASS",
    Verdict.FAIL: "**FAIL**",
    Verdict.INCONCLUSIVE: "~INCONCLUSIVE",
    Verdict.NO_BASELINE: "NO_BASELINE",
    Verdict.INCOMPLETE: "**INCOMPLETE**",
}


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _ratio(gate_case) -> tuple[str, str]:
    e = gate_case.effect
    if e is None:
        return "-", "-"
    hi = "inf" if not math.isfinite(e.ci_high) else f"{e.ci_high:.3f}"
    return f"{e.ratio:.3f}", f"[{e.ci_low:.3f}, {hi}]"


def looks_cell(looks: list[dict]) -> str:
    """A sequential case's looks, in order: captures judged, verdict and ratio at each (``-``: one look)."""
    if len(looks) < 2:
        return "-"
    return " → ".join(f"{k['captures']}: {k['verdict']} {k['ratio']:.3f}" for k in looks)


def title(provenance: dict | None) -> str:
    """The gate's name as the stage that wrote the results recorded it (``provenance.gate``)."""
    name = (provenance or {}).get("gate")
    return name if isinstance(name, str) and name else "gate"


def markdown(gate) -> str:
    """The verdict table: one row a case, then the method and units."""
    pct = f"{gate.threshold:.0%}"
    extra = list(subjects.subject_of(gate.kind).columns(gate.mode))
    looked = any(len(c.looks) > 1 for c in gate.cases)
    lines = [
        f"### {title(gate.provenance)} ({gate.kind}, suite `{gate.suite}`): {gate.overall.value}",
        "",
        f"Compared with the {gate.reference}; FAIL when the whole {gate.confidence:.0%} interval of the ratio "
        f"lies above 1 + {pct}, INCONCLUSIVE when it straddles it."
        + (f" Sequential: {gate.sequential}; each look's interval at its own confidence." if gate.sequential else ""),
        "",
        "| "
        + " | ".join(["case", "reference", "measured", "ratio", "CI", "verdict", *extra])
        + (" | looks |" if looked else " |"),
        "|---|---:|---:|---:|---|---|" + "---|" * (len(extra) + looked),
    ]
    for c in gate.cases:
        ratio, ci = _ratio(c)
        row = [
            c.id,
            _num(c.reference_median),
            _num(c.measured_median),
            ratio,
            ci,
            MARKS[c.verdict],
            *(c.cells.get(column, "-") for column in extra),
        ]
        if looked:
            row.append(looks_cell(c.looks))
        lines.append("| " + " | ".join(row) + " |")
    counts = {v: sum(c.verdict == v for c in gate.cases) for v in Verdict}
    timed = [c for c in gate.cases if c.effect is not None]
    unit = timed[0].unit if timed else ""
    method = timed[0].effect.method if timed else ""
    widths = [c.effect.ci_high - c.effect.ci_low for c in gate.cases if c.effect and math.isfinite(c.effect.ci_high)]
    lines += [
        "",
        "Counts: " + ", ".join(f"{v.value} {n}" for v, n in counts.items() if n),
        f"Units: medians in {unit}; ratio = measured / reference (< 1 is faster); method: {method}.",
    ]
    if widths:
        lines.append(
            f"Resolution: median CI width {median(widths):.2%} of the reference "
            f"(a change much smaller than that cannot be told from noise"
            + (
                "; the interval is over independent captures, so it holds their systematic error)."
                if "captures" in method
                else ")."
            )
        )
    notes = [f"- {c.id}: {n}" for c in gate.cases for n in c.notes]
    if notes:
        lines += ["", "Notes:", *notes]
    if gate.problems:
        lines += [
            "",
            "**Incomplete evidence** (no PASS without it; re-run what is missing):",
            *[f"- {p}" for p in gate.problems],
        ]
    return "\n".join(lines) + "\n"


def details_markdown(results) -> str:
    """What the verdict table leaves out: the change under test (``provenance.change``), that a run is an
    A/A run, and what the subject adds (``ci.core.subjects``: its ``details``)."""
    lines = []
    change = (getattr(results, "provenance", None) or {}).get("change")
    if isinstance(change, str) and change:
        lines += ["", change]
    if results.settings.get("aa"):
        lines += [
            "",
            "A/A run: both sides are the base build, so any difference above is the noise and bias of "
            "the method on this machine (its resolution), not a change.",
        ]
    lines += subjects.subject_of(results.kind).details(results)
    return "\n".join(lines) + ("\n" if lines else "")


def to_step_summary(text: str) -> None:
    """Append to the GitHub Actions job summary when running there."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a") as fh:
            fh.write(text + "\n")


def plot(gate, results, path: Path) -> Path | None:
    """Ratio with CI per case, and time per block size per case (when the sweep exists)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cases = [c for c in gate.cases if c.effect is not None]
    second = subjects.subject_of(results.kind).panel(results)  # the subject's own panel, if it has one
    ncols = 2 if second else 1
    height = max(3.0, 0.22 * max(len(cases), 1) + 1.5)
    fig, axes = plt.subplots(1, ncols, figsize=(7 * ncols, height), squeeze=False)
    ax = axes[0][0]
    y = list(range(len(cases)))
    ratios = [c.effect.ratio for c in cases]
    lo = [c.effect.ratio - c.effect.ci_low for c in cases]
    hi = [min(c.effect.ci_high, 10) - c.effect.ratio for c in cases]
    colors = [
        "tab:red" if c.verdict == Verdict.FAIL else "tab:orange" if c.verdict == Verdict.INCONCLUSIVE else "tab:blue"
        for c in cases
    ]
    ax.errorbar(ratios, y, xerr=[lo, hi], fmt="none", ecolor=colors)
    ax.scatter(ratios, y, c=colors, s=12)
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.axvline(1 + gate.threshold, color="tab:red", lw=0.8, ls="--", label=f"1 + {gate.threshold:.0%}")
    ax.set_yticks(y, [c.id for c in cases], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel(f"ratio measured / reference, {gate.confidence:.0%} CI")
    ax.legend(fontsize=7)
    if second:
        second(axes[0][1])
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
