"""The Triton fused-MoE bench as a subject of the gate core (``ci.core.subjects``): each case records the
config each build launched with and, from the regret sweep, how much slower each choice is than the best
config timed. A complete run holds every case of its suite (less the run's ``--cases`` filter), each in at
least ``ci.triton_moe.bench.MIN_CAPTURES`` captures, and a case counts only if the builds' outputs agreed.
"""

from __future__ import annotations

from ci.core import stats
from ci.core.errors import DataError, UsageError
from ci.core.schema import BOOLEAN, POSITIVE, STRING, ListOf, MapOf, Opt
from ci.core.subjects import Annotation, Subject, register
from ci.host import outputs
from ci.trees.provenance import published_side, side_identity
from ci.trees.variants import SUBJECT_TESTS
from ci.triton_moe.bench import ENTRY, KIND, MIN_CAPTURES

CONFIG, REGRET = "config", "regret vs best config timed"


def regret(case) -> dict | None:
    """The best config of the sweep and how much slower each build's chosen config is (None: no sweep)."""
    timed = case.extra.get("configs_us")
    labels = case.info.get("config_label")
    if not timed or not labels:
        return None
    if not isinstance(timed, dict) or not isinstance(labels, dict):
        raise DataError(f"case {case.id}: extra.configs_us and info.config_label should be objects")
    for label, xs in timed.items():
        if not stats.positive_times(xs):
            raise DataError(f"case {case.id}: configs_us[{label!r}] should be a non-empty list of positive times")
    medians = {label: stats.median(xs) for label, xs in timed.items()}
    best = min(medians, key=medians.get)
    out: dict = {"best_config": best}
    for side, label in labels.items():
        out[side] = medians[label] / medians[best] - 1 if label in medians else None
    return out


def expected_cases(results) -> list[str]:
    from ci.triton_moe import suites

    if results.suite not in suites.SUITES:
        raise DataError(
            f"suite {results.suite!r} is not one the Triton fused-MoE bench defines "
            f"({', '.join(sorted(suites.SUITES))}): these results were not written by this gate's "
            "bench; re-run it"
        )
    try:
        return [c.id for c in suites.suite_cases(results.suite, results.settings.get("case_filter"))]
    except UsageError as exc:
        raise DataError(f"settings.case_filter: {exc}") from exc


def case_problems(case) -> list[str]:
    correctness = case.extra.get("correctness")
    if correctness is None:
        return ["no correctness check recorded: the bench times a case only after both builds agree; re-run it"]
    if not isinstance(correctness, dict) or type(correctness.get("ok")) is not bool:
        raise DataError(
            f"case {case.id}: extra.correctness should be an object with a boolean 'ok', found {correctness!r}"
        )
    return [] if correctness["ok"] else [f"the builds' outputs disagree ({correctness.get('error', 'no detail')})"]


def columns(mode: str) -> tuple[str, ...]:
    return (f"{CONFIG} ({ {'ab': 'base -> candidate', 'baseline': 'baseline -> this run'}[mode] })", REGRET)


def _label(case, side: str):
    labels = case.info.get("config_label")
    return labels.get(side) if isinstance(labels, dict) else None


def annotate(case, stored, side: str | None) -> Annotation:
    """A/B: the two builds' configs; baseline mode: the judged build's then and now, with a note if they differ."""
    found = regret(case)
    if stored is None:
        picks = {k: _label(case, k) for k in ("base", "candidate")}
    else:
        picks = {"baseline": _label(stored, side), "this run": _label(case, side)}
        if found:
            found = {k: v for k, v in found.items() if k in ("best_config", side)}
    notes = []
    if stored is not None and None not in picks.values() and picks["baseline"] != picks["this run"]:
        notes.append(
            f"the {side} build chose {picks['baseline']} in the baseline and {picks['this run']} now: "
            "different kernels were timed"
        )
    config_header, regret_header = columns("ab" if stored is None else "baseline")
    shown = " -> ".join("?" if v is None else v for v in picks.values())
    return Annotation(
        cells={config_header: shown, regret_header: regret_text(found)},
        data={"config": picks, "regret": found},
        notes=notes,
    )


def regret_text(found: dict | None) -> str:
    if not found:
        return "-"
    parts = [f"{side} {found[side]:+.0%}" for side in ("base", "candidate") if found.get(side) is not None]
    return f"best {found['best_config']}: " + ", ".join(parts)


# the fields of a case this subject's code reads (ci.core.schema: checked when a results file is read)
SCHEMA = {
    "info": {"config_label": MapOf(Opt(STRING))},
    "extra": {"configs_us": MapOf(ListOf(POSITIVE)), "correctness": {"ok": BOOLEAN}},
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
        baseline_prefix="triton-moe-",
        results_file=outputs.TRITON_RESULTS,
        writer=outputs.WRITERS[outputs.TRITON_RESULTS],
        entry_module=ENTRY,
        test_folder=SUBJECT_TESTS[ENTRY],
        bench="ci.triton_moe.bench",
    )
)
