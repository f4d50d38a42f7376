"""Error rates of a design, resampled from measured no-change runs.

A measured error rate needs many runs of the design it rates: on one GPU a session buys only a few. This
stage answers the design question from the runs that exist: given the capture-to-capture error that A/A
runs showed on the GPU, how often would the gate FAIL, PASS or be INCONCLUSIVE on a run of N captures
when the candidate is truly F slower? Each complete A/A run (the base build against itself, nothing
injected) gives one number per capture, the log ratio of the two builds' capture medians, which is what
``ci.core.compare`` judges. Those numbers, pooled per case over the runs given, are the measured null
distribution; a resampled run draws N of them with replacement, adds log(1 + F) and is judged by the
gate's own per-capture method (``stats.capture_effect``, ``stats.decide``). ``--rounds R`` builds each
capture's medians from its first R samples of each build only, so a design with fewer rounds a capture
is rated from the same measurements. A run must be complete for its suite as defined today, or, with
``--earlier-designs``, finished (not stopped) under an earlier design of it (fewer captures or rounds), so
the runs of a design that was replaced still count as measurements of the launch-to-launch error.

It decides no verdict: it says which designs would meet the targets, beside the rates measured by the
error-rate stages, and it is only as good as the runs it draws from (a bootstrap never draws outside the
spread those runs showed, and a few runs can miss a rare large error).

``--sequential 9+3x3`` rates a sequential design (``ci.core.sequential``: a first look after 9 captures, then up
to 3 groups of 3 while INCONCLUSIVE, the error spent over the looks) from the same numbers, with the captures
it used.

Usage: ``python -m ci.core.resample --results A.json [B.json ...] --out DIR [--captures 6,8,10,12]
[--sequential 9+3x3] [--rounds R] [--levels 0,0.02,0.035,0.05] [--trials 20000] [--seed 0] [--earlier-designs]``; writes
``DIR/resampled-rates.json`` and ``DIR/resampled-rates.md`` (and replaces only those, when it wrote them).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ci.core import evidence, rates, sequential, stats, subjects
from ci.core.cli import run_main
from ci.core.errors import DataError, IncompleteEvidenceError, UsageError
from ci.core.jsonio import check_own_report, write_report
from ci.core.results import BenchResults, CaseResult, load_results

KIND = "resampled-error-rates"
VERSION = 1
OUTPUT_JSON, OUTPUT_MD = "resampled-rates.json", "resampled-rates.md"
DEFAULT_CAPTURES = (6, 8, 10, 12)
DEFAULT_LEVELS = (0.0, 0.02, 0.035, 0.05)
DEFAULT_TRIALS = 20_000
SIDES = ("base", "candidate")


def not_an_aa_run(results: BenchResults) -> list[str]:
    """Why a results file is not a run of the base build against itself with nothing injected."""
    problems = []
    if results.settings.get("aa") is not True:
        problems.append("it is not an A/A run (settings.aa is not true): an A/B run measures a change, not the noise")
    injected = sorted(k for k, v in results.settings.items() if k.startswith("inject") and v)
    if injected:
        problems.append(f"its candidate was slowed on purpose ({', '.join(injected)}): it is not a no-change run")
    return problems


def _capture_samples(case: CaseResult, side: str) -> list[list[float]]:
    """The samples of each capture of ``side``, in capture order and, within one, in the order recorded."""
    ids = subjects.capture_ids(case, side)
    if ids is None:
        raise DataError(
            f"case {case.id}: no captures recorded (extra.captures): a run timed in one capture has no "
            "capture-to-capture error to resample; use results of a stage that times captures"
        )
    grouped: dict[int, list[float]] = {}
    for x, b in zip(case.samples[side], ids, strict=True):
        grouped.setdefault(b, []).append(x)
    return [grouped[b] for b in sorted(grouped)]


def null_log_ratios(case: CaseResult, rounds: int | None = None) -> list[float]:
    """One number per capture of a no-change case: log(candidate capture median / base capture median), the
    number the gate judges; from the first ``rounds`` samples of each build in each capture (all: None)."""
    base, cand = (_capture_samples(case, side) for side in SIDES)
    if len(base) != len(cand):
        raise DataError(f"case {case.id}: the builds were timed in different captures ({len(base)} and {len(cand)})")
    if rounds is not None:
        short = min(len(xs) for xs in base + cand)
        if short < rounds:
            raise UsageError(
                f"--rounds {rounds}: case {case.id} has a capture with only {short} sample(s) of a "
                f"build; give at most {short}"
            )
        base, cand = [xs[:rounds] for xs in base], [xs[:rounds] for xs in cand]
    return [math.log(stats.median(c)) - math.log(stats.median(b)) for b, c in zip(base, cand, strict=True)]


# The resampling documents a design's error rates; it decides no verdict (its cells are tested coarsely).
def resampled_shares(
    null: Sequence[float],
    true_ratio: float,
    captures: int,
    *,
    trials: int = DEFAULT_TRIALS,
    seed: str | int = 0,
    threshold: float = stats.DEFAULT_THRESHOLD,
    confidence: float = stats.DEFAULT_CONFIDENCE,
) -> dict[str, float]:
    """The share of each verdict over ``trials`` runs of ``captures`` captures, each drawn with replacement from
    the measured ``null`` log ratios and shifted by log(``true_ratio``), judged as the gate judges a run."""
    if not null or captures < 1 or trials < 1 or true_ratio <= 0:
        raise ValueError(
            f"resampling needs measured numbers, captures, trials and a ratio > 0 (got {len(null)}, "
            f"{captures}, {trials}, {true_ratio})"
        )
    rng = random.Random(seed)
    shift = math.log(true_ratio)
    ones = [1.0] * captures
    counts = dict.fromkeys((v.value for v in stats.Verdict), 0)
    for _ in range(trials):
        cand = [math.exp(rng.choice(null) + shift) for _ in range(captures)]
        counts[stats.decide(stats.capture_effect(ones, cand, confidence), threshold).value] += 1
    return {v: n / trials for v, n in counts.items()}


def resampled_sequential(
    null: Sequence[float],
    true_ratio: float,
    plan: sequential.Plan,
    *,
    trials: int = DEFAULT_TRIALS,
    seed: str | int = 0,
    threshold: float = stats.DEFAULT_THRESHOLD,
) -> dict[str, float]:
    """``resampled_shares`` for a sequential design (``ci.core.sequential``): each resampled run draws the plan's
    most captures and is judged look by look as the gate judges one, stopping at the first decided look; with
    the captures it used, on the mean and at most."""
    if not null or trials < 1 or true_ratio <= 0:
        raise ValueError(f"resampling needs measured numbers, trials and a ratio > 0 (got {len(null)}, {trials})")
    rng = random.Random(seed)
    shift = math.log(true_ratio)
    ones = [1.0] * plan.most_captures
    counts = dict.fromkeys((v.value for v in stats.Verdict), 0)
    used = []
    for _ in range(trials):
        cand = [math.exp(rng.choice(null) + shift) for _ in range(plan.most_captures)]
        looks = sequential.judge(ones, cand, plan, threshold)
        counts[sequential.verdict(looks).value] += 1
        used.append(looks[-1].captures)
    shares: dict[str, float] = {v: n / trials for v, n in counts.items()}
    return {**shares, "mean_captures": sum(used) / trials, "most_captures": max(used)}


def parse_design(text: str) -> sequential.Plan:
    """``FIRST+GROUPxMAX`` (e.g. ``9+3x3``: 9 captures, then up to 3 groups of 3), a sequential plan that can
    decide at every look; a :class:`UsageError` naming the form otherwise."""
    try:
        first, rest = text.split("+")
        group, most = rest.lower().split("x")
        plan = sequential.Plan(first=int(first), group=int(group), max_extra=int(most))
    except ValueError:
        raise UsageError(
            f"--sequential {text!r}: give FIRST+GROUPxMAX, e.g. 9+3x3 (9 captures, then up to 3 groups of 3)"
        ) from None
    why = plan.undecidable()
    if why:
        raise UsageError(f"--sequential {text!r}: {why}")
    return plan


def design_key(plan: sequential.Plan) -> str:
    return f"{plan.first}+{plan.group}x{plan.max_extra}"


def _label(level: float) -> str:
    return "A/A (no change)" if level == 0 else f"+{level:.1%}"


def _spread(xs: Sequence[float]) -> dict[str, float]:
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return {"n": len(xs), "mean": mean, "sd": sd, "min": min(xs), "max": max(xs)}


def _run_row(path: Path, results) -> dict:
    captures = {c.id: subjects.captures(c, SIDES[0]) for c in results.cases}
    return {"file": str(path), "time": results.provenance.get("time"), "suite": results.suite, "captures": captures}


def _captures(run: dict) -> str:
    counts = sorted(set((run.get("captures") or {}).values()))
    return "captures: " + (", ".join(map(str, counts)) or "-")


def markdown(payload: dict) -> str:
    s = payload["settings"]
    rounds = "every round" if s["rounds"] is None else f"the first {s['rounds']} round(s) of each build"
    runs = ", ".join(f"`{r['file']}` ({_captures(r)})" for r in payload["runs"])
    lines = [
        f"### Error rates resampled from {len(payload['runs'])} measured A/A runs ({payload['gpu']})",
        "",
        f"Runs: {runs}; a capture's median from {rounds} in it. Each cell is FAIL / INCONCLUSIVE / PASS over "
        f"{s['trials']:,} resampled runs judged as the gate judges one (threshold {s['threshold']:.0%}, "
        f"{s['confidence']:.0%} interval over captures); it decides nothing and draws only from what "
        "these runs showed.",
    ]
    if s.get("earlier_designs"):
        lines += [
            "",
            "Pooled with `--earlier-designs`: finished runs of their suite's earlier designs count too, each "
            "capture one draw.",
        ]
    for case_id, case in payload["cases"].items():
        n = case["null"]
        lines += [
            "",
            f"**{case_id}**: {n['n']} measured captures, log ratio mean {n['mean']:+.3%}, SD {n['sd']:.3%}, "
            f"range {n['min']:+.3%} to {n['max']:+.3%}",
            "",
            "| captures a run | " + " | ".join(_label(f) for f in s["levels"]) + " |",
            "|---:|" + "---|" * len(s["levels"]),
        ]
        for k, cells in case["shares"].items():
            lines.append(f"| {k} | " + " | ".join(_cell(cells[rates.level_key(f)]) for f in s["levels"]) + " |")
        for k, cells in (case.get("sequential") or {}).items():
            label = f"{k} (sequential: a first look, then groups while INCONCLUSIVE)"
            lines.append(f"| {label} | " + " | ".join(_cell(cells[rates.level_key(f)]) for f in s["levels"]) + " |")
        targets = [rates.TARGETS.get("aa" if f == 0 else f, "-") for f in s["levels"]]
        lines.append("| target | " + " | ".join(targets) + " |")
    return "\n".join(lines) + "\n"


def _cell(cell: dict) -> str:
    shares = " / ".join(rates.pct(cell[v]) for v in ("FAIL", "INCONCLUSIVE", "PASS"))
    if "mean_captures" not in cell:
        return shares
    return f"{shares} ({cell['mean_captures']:.1f} captures on the mean, at most {cell['most_captures']})"


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--captures {text!r}: give whole numbers separated by commas, e.g. 6,8,10") from None
    if not values or min(values) < evidence.MIN_SAMPLES:
        raise UsageError(
            f"--captures {text!r}: at least {evidence.MIN_SAMPLES} captures a run (the gate's floor: "
            "fewer cannot bound its 95% interval)"
        )
    return values


def _levels(text: str) -> tuple[float, ...]:
    try:
        levels = {float(x) for x in text.split(",") if x.strip()}
    except ValueError:
        levels = set()
    if not levels or not all(0 <= x <= 0.5 for x in levels):
        raise UsageError(
            f"--levels {text!r}: true slowdowns in [0, 0.5] separated by commas, e.g. 0,0.02,0.035 (0: no change)"
        )
    return tuple(sorted(levels))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.core.resample", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--results", type=Path, nargs="+", required=True, help="complete A/A results files")
    parser.add_argument("--out", type=Path, required=True, help=f"folder for {OUTPUT_JSON} and {OUTPUT_MD}")
    parser.add_argument("--captures", type=_ints, default=DEFAULT_CAPTURES, help="captures a run, e.g. 6,8,10")
    parser.add_argument(
        "--sequential",
        type=lambda text: tuple(parse_design(x) for x in text.split(",") if x.strip()),
        default=(),
        help="sequential designs too, FIRST+GROUPxMAX, e.g. 9+3x3 (ci.core.sequential)",
    )
    parser.add_argument("--rounds", type=int, help="use the first R samples of each build in each capture")
    parser.add_argument("--levels", type=_levels, default=DEFAULT_LEVELS, help="true slowdowns, e.g. 0,0.02,0.05")
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help="resampled runs a cell (%(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="of the resampling (%(default)s)")
    parser.add_argument(
        "--earlier-designs",
        action="store_true",
        help="also pool finished runs of an earlier "
        "design of their suite (fewer captures or rounds than it asks today); a stopped run is "
        "still refused",
    )
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        raise UsageError(f"--rounds {args.rounds}: at least 1 sample of each build a capture")
    if args.trials < 100:
        raise UsageError(f"--trials {args.trials}: at least 100 resampled runs a cell (a share of fewer says little)")
    check_own_report(args.out, OUTPUT_JSON, OUTPUT_MD, kind=KIND, version=VERSION)
    twice = sorted(str(p) for p, n in Counter(p.resolve() for p in args.results).items() if n > 1)
    if twice:
        raise UsageError(f"--results: {', '.join(twice)} given more than once; each run counts once")
    loaded, kinds, gpus = [], set(), set()
    for path in args.results:
        results = load_results(path)
        wrong = not_an_aa_run(results)
        if wrong:
            raise UsageError(f"{path}: not a run to resample: {'; '.join(wrong)}. Give A/A runs without an injection")
        missing = evidence.run_problems(results, design_floors=not args.earlier_designs)
        if missing:
            hint = "" if args.earlier_designs else " (a finished run of an earlier design: --earlier-designs)"
            raise IncompleteEvidenceError(
                f"{path}: the run is not complete: {'; '.join(missing)}. Resample complete runs only{hint}"
            )
        loaded.append((path, results))
        kinds.add(results.kind)
        gpus.add(results.gpu_key())
    if len(kinds) > 1 or len(gpus) > 1:
        raise UsageError(
            f"--results: the runs measured different things ({sorted(kinds)} on {sorted(gpus)}); "
            "resample runs of one kind on one GPU model and count"
        )
    null: dict[str, list[float]] = {}
    for _, results in loaded:
        for case in results.cases:
            null.setdefault(case.id, []).extend(null_log_ratios(case, args.rounds))
    settings = {
        "captures": list(args.captures),
        "sequential": [design_key(p) for p in args.sequential],
        "rounds": args.rounds,
        "levels": list(args.levels),
        "trials": args.trials,
        "seed": args.seed,
        "threshold": stats.DEFAULT_THRESHOLD,
        "confidence": stats.DEFAULT_CONFIDENCE,
        "results_kind": kinds.pop(),
        "earlier_designs": args.earlier_designs,
    }
    payload = {
        "kind": KIND,
        "schema_version": VERSION,
        "gpu": "{} x{}".format(*gpus.pop()),
        "runs": [_run_row(p, r) for p, r in loaded],
        "settings": settings,
        "cases": {},
    }
    for case_id, numbers in null.items():
        shares = {
            str(k): {
                rates.level_key(f): resampled_shares(
                    numbers, 1 + f, k, trials=args.trials, seed=f"{args.seed}/{case_id}/{k}/{f}"
                )
                for f in args.levels
            }
            for k in args.captures
        }
        designs = {
            design_key(plan): {
                rates.level_key(f): resampled_sequential(
                    numbers, 1 + f, plan, trials=args.trials, seed=f"{args.seed}/{case_id}/{design_key(plan)}/{f}"
                )
                for f in args.levels
            }
            for plan in args.sequential
        }
        payload["cases"][case_id] = {
            "null": _spread(numbers),
            "log_ratios": numbers,
            "shares": shares,
            "sequential": designs,
        }
    write_report(args.out, OUTPUT_JSON, OUTPUT_MD, payload, markdown(payload))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
