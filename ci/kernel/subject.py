"""The Marlin MoE kernel bench as a subject of the gate core (``ci.core.subjects``): each case records the
``block_size_m`` each build's heuristic picked and, from the sweep over every block size, how much
slower each pick is than the best one (its regret). In baseline mode the judged build's pick in the
baseline is shown beside its pick now, with a note when they differ (different kernels were timed).

A complete run holds every case of its suite as ``ci.kernel.bench`` defines it (less the run's ``--cases``
filter), each timed in at least ``ci.kernel.bench.MIN_CAPTURES`` fresh captures (``extra.captures``).
"""

from __future__ import annotations

import math

from ci.core import stats
from ci.core.errors import DataError, UsageError
from ci.core.results import CaseResult
from ci.core.schema import BOOLEAN, INTEGER, POSITIVE, ListOf, MapOf, Opt
from ci.core.subjects import Annotation, Subject, register
from ci.host import outputs
from ci.kernel.bench import MIN_CAPTURES
from ci.trees.provenance import published_side, side_identity
from ci.trees.variants import ENTRY_MODULE, SUBJECT_TESTS

KIND = "kernel-bench"
PICKS, REGRET = "block_size_m", "regret vs best block size"


def regret(case: CaseResult) -> dict | None:
    """How much slower each heuristic's pick is than the best block size (from the sweep)."""
    per_bm = case.extra.get("block_sizes_us")
    picks = case.info.get("block_size_m")
    if not per_bm or not picks:
        return None
    if not isinstance(per_bm, dict) or not isinstance(picks, dict):
        raise DataError(f"case {case.id}: block_sizes_us and block_size_m should be objects")
    for bm, xs in per_bm.items():
        if not str(bm).isdigit() or not stats.positive_times(xs):
            raise DataError(f"case {case.id}: block_sizes_us[{bm!r}] should be a non-empty list of positive times")
    medians = {int(bm): stats.median(xs) for bm, xs in per_bm.items()}
    best = min(medians, key=medians.get)
    out = {"best_block_size_m": best}
    for side, bm in picks.items():
        out[side] = medians[bm] / medians[best] - 1 if bm in medians else None
    return out


def expected_cases(results) -> list[str]:
    """The ids of the cases of ``results.suite`` as the bench defines it, less the run's case filter."""
    from ci.kernel import suites

    if results.suite not in suites.SUITES:
        known = ", ".join(sorted(suites.SUITES))
        raise DataError(
            f"suite {results.suite!r} is not one the kernel bench defines ({known}): these results were "
            "not written by this gate's bench; re-run it"
        )
    try:
        return [c.id for c in suites.suite_cases(results.suite, results.settings.get("case_filter"))]
    except UsageError as exc:
        raise DataError(f"settings.case_filter: {exc}") from exc


def case_problems(case: CaseResult) -> list[str]:
    """A case whose builds' outputs disagreed is no timing evidence (the bench records the check it ran)."""
    correctness = case.extra.get("correctness")
    if correctness is None:
        return ["no correctness check recorded: the bench times a case only after both builds agree; re-run it"]
    if not isinstance(correctness, dict) or type(correctness.get("ok")) is not bool:
        raise DataError(
            f"case {case.id}: extra.correctness should be an object with a boolean 'ok', found {correctness!r}"
        )
    return [] if correctness["ok"] else [f"the builds' outputs disagree ({correctness.get('error', 'no detail')})"]


def _side_pick(case: CaseResult, side: str):
    picks = case.info.get("block_size_m")
    return picks.get(side) if isinstance(picks, dict) else None


def annotate(case: CaseResult, stored: CaseResult | None, side: str | None) -> Annotation:
    """A/B (``stored`` None): this run's two picks. Baseline mode: ``side``'s pick then and now, and only
    ``side``'s regret (this run's base and candidate were not compared)."""
    found = regret(case)
    if stored is None:
        picks = case.info.get("block_size_m")
    else:
        then, now = _side_pick(stored, side), _side_pick(case, side)
        picks = None if then is None and now is None else {"baseline": then, "this run": now}
        if found:
            found = {k: v for k, v in found.items() if k in ("best_block_size_m", side)}
    notes = []
    if stored is not None and picks and None not in picks.values() and picks["baseline"] != picks["this run"]:
        notes.append(
            f"the {side} build picked block_size_m {picks['baseline']} in the baseline and "
            f"{picks['this run']} now: different kernels were timed"
        )
    picks_header, regret_header = columns("ab" if stored is None else "baseline")
    return Annotation(
        cells={picks_header: picks_text(picks), regret_header: regret_text(found)},
        data={"block_size_m": picks, "regret": found},
        notes=notes,
    )


def picks_text(picks: dict | None) -> str:
    """``64 -> 16`` (A/B: base -> candidate; baseline mode: baseline -> this run), ``?`` where unknown."""
    if not picks:
        return "-"
    if len(picks) == 1:
        return str(next(iter(picks.values())))
    keys = ("base", "candidate") if "base" in picks or "candidate" in picks else tuple(picks)
    return " -> ".join("?" if picks.get(k) is None else str(picks[k]) for k in keys)


def regret_text(found: dict | None) -> str:
    if not found:
        return "-"
    parts = [f"{side} {found[side]:+.0%}" for side in ("base", "candidate") if found.get(side) is not None]
    return f"best {found['best_block_size_m']}: " + ", ".join(parts)


def columns(mode: str) -> tuple[str, ...]:
    """The two columns: A/B shows base -> candidate picks, baseline mode the judged build's then -> now."""
    return (f"{PICKS} ({ {'ab': 'base -> candidate', 'baseline': 'baseline -> this run'}[mode] })", REGRET)


# A picture; what it draws (the sweep, the picks) is tested through the report, so mutation testing leaves
# the drawing out.
# pragma: no mutate start
def panel(results):
    """Time per block size per case (when the sweep exists), the picks marked: a drawer, or None."""
    sweeps = [c for c in results.cases if c.extra.get("block_sizes_us")]
    if not sweeps:
        return None

    def draw(ax) -> None:
        from ci.moe.spec import BLOCK_SIZES_M

        grid = []
        for c in sweeps:
            med = {int(k): stats.median(v) for k, v in c.extra["block_sizes_us"].items()}
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

    return draw
    # pragma: no mutate end


# the fields of a case this subject's code reads (ci.core.schema: checked when a results file is read)
SCHEMA = {
    "info": {"block_size_m": MapOf(Opt(INTEGER))},
    "extra": {"block_sizes_us": MapOf(ListOf(POSITIVE), digits=True), "correctness": {"ok": BOOLEAN}},
}

SUBJECT = register(
    Subject(
        kind=KIND,
        identity=side_identity,
        published_side=published_side,
        schema=SCHEMA,
        expected_cases=expected_cases,
        min_captures=lambda results: MIN_CAPTURES,
        case_problems=case_problems,
        columns=columns,
        annotate=annotate,
        panel=panel,
        results_file=outputs.KERNEL_RESULTS,
        writer=outputs.WRITERS[outputs.KERNEL_RESULTS],
        entry_module=ENTRY_MODULE,
        test_folder=SUBJECT_TESTS[ENTRY_MODULE],
        bench="ci.kernel.bench",
    )
)
