"""Stage 5: reports people read. A Markdown table (fit for ``$GITHUB_STEP_SUMMARY``) and a PNG.

Kept apart from the statistics (``ci.stats``) and the lookup (``ci.compare``), so each can
be tested on committed example results without a GPU.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ci.stats import Verdict, median

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


def _picks(c) -> str:
    bm = c.block_size_m or {}
    if not bm:
        return "-"
    if len(bm) == 1:
        return str(next(iter(bm.values())))
    keys = ("base", "candidate") if "base" in bm or "candidate" in bm else tuple(bm)
    return " -> ".join("?" if bm.get(k) is None else str(bm[k]) for k in keys)


def _regret(c) -> str:
    r = c.regret
    if not r:
        return "-"
    parts = [f"{side} {r[side]:+.0%}" for side in ("base", "candidate") if r.get(side) is not None]
    return f"best {r['best_block_size_m']}: " + ", ".join(parts)


def markdown(gate) -> str:
    """The verdict table: one row a case, then the method and units."""
    pct = f"{gate.threshold:.0%}"
    picks = "base -> candidate" if gate.mode == "ab" else "baseline -> this run"
    lines = [
        f"### EP-Marlin gate ({gate.kind}, suite `{gate.suite}`): {gate.overall.value}",
        "",
        f"Compared with the {gate.reference}; FAIL when the whole {gate.confidence:.0%} interval of the ratio "
        f"lies above 1 + {pct}, INCONCLUSIVE when it straddles it.",
        "",
        f"| case | reference | measured | ratio | CI | verdict | block_size_m ({picks}) | regret vs best block size |",
        "|---|---:|---:|---:|---|---|---|---|",
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
            _picks(c),
            _regret(c),
        ]
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
                if "blocks" in method
                else ")."
            )
        )
    notes = [f"- {c.id}: {n}" for c in gate.cases for n in c.notes]
    if notes:
        lines += ["", "Notes:", *notes]
    if gate.problems:
        lines += ["", "**Incomplete evidence** (no PASS without it; re-run what is missing):",
                  *[f"- {p}" for p in gate.problems]]  # fmt: skip
    return "\n".join(lines) + "\n"


def details_markdown(results) -> str:
    """What the verdict table leaves out: that a run is an A/A run, and for TPOT runs one row a
    round, in the order run, with the machine's state where recorded."""
    lines = []
    if results.settings.get("aa"):
        lines += ["", "A/A run: both sides are the base build, so any difference above is the noise and bias of "
                  "the method on this machine (its resolution), not a change in vLLM."]  # fmt: skip
    for case in results.cases:
        rounds = case.extra.get("rounds") or []
        if not rounds:
            continue
        lines += ["", f"Rounds of {case.id} (in the order run):", "",
                  "| # | build | median TPOT (ms) | mean TPOT (ms) | median TTFT (ms) | output tok/s | SM clock (MHz) "
                  "| power (W) | host load |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for i, r in enumerate(rounds, 1):
            m = r.get("machine") or {}

            def first(key, m=m):
                values = [v for v in m.get(key) or [] if v is not None]
                return f"{values[0]:.0f}" if values else "-"

            load = m.get("load_1min")
            lines.append(
                f"| {i} | {r['build']} | {r['median_tpot_ms']:.3f} | {r['mean_tpot_ms']:.3f} | "
                f"{r['median_ttft_ms']:.1f} | {r['output_throughput']:.0f} | {first('sm_clock_mhz')} | "
                f"{first('power_draw_w')} | {'-' if load is None else f'{load:.2f}'} |"
            )
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
    sweeps = [c for c in results.cases if c.extra.get("block_sizes_us")]
    ncols = 2 if sweeps else 1
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
    if sweeps:
        _plot_sweeps(axes[0][1], sweeps)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_sweeps(ax, sweeps) -> None:
    from ci.spec import BLOCK_SIZES_M

    grid = []
    for c in sweeps:
        med = {int(k): median(v) for k, v in c.extra["block_sizes_us"].items()}
        best = min(med.values())
        grid.append([med.get(bm, math.nan) / best for bm in BLOCK_SIZES_M])
    im = ax.imshow(grid, aspect="auto", cmap="viridis_r", vmin=1.0, vmax=2.0)
    ax.set_xticks(range(len(BLOCK_SIZES_M)), [str(b) for b in BLOCK_SIZES_M])
    ax.set_yticks(range(len(sweeps)), [c.id for c in sweeps], fontsize=6)
    for row, c in enumerate(sweeps):
        for side, marker in (("base", "o"), ("candidate", "x")):
            bm = c.info.get("block_size_m", {}).get(side)
            if bm in BLOCK_SIZES_M:
                ax.scatter(BLOCK_SIZES_M.index(bm), row, marker=marker, c="red", s=14)
    ax.set_xlabel("block_size_m (time / best; o base pick, x candidate pick)")
    ax.figure.colorbar(im, ax=ax)
