"""The verdict. Candidate vs base from one run (A/B), or a run vs its stored baseline.

Per case the statistics of :mod:`ci.core.stats` give a ratio with a confidence interval and a
verdict (PASS / FAIL / INCONCLUSIVE / NO_BASELINE); the overall verdict is the worst. Before
any of that, :mod:`ci.core.evidence` says what is missing; a run with missing evidence is
INCOMPLETE, never PASS. The report (Markdown on stdout and in ``$GITHUB_STEP_SUMMARY``, JSON,
PNG) comes from :mod:`ci.core.report`, written into ``--out`` (or ``--out-dir``): an earlier verdict there is
removed first, and the new files replace it only once all of them are written. Exit code: PASS 0, FAIL 1,
INCONCLUSIVE 3, NO_BASELINE 4, INCOMPLETE 10 (errors: README).

Usage: ``python -m ci.core.compare --results FILE [--mode ab|baseline] [--threshold 0.03] [--confidence 0.95]``
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ci.core import baselines, evidence, report, sequential, stats, subjects
from ci.core.cli import run_main
from ci.core.errors import DataError, ExitCode, NoBaselineError, UsageError
from ci.core.jsonio import sha256_file, write_json
from ci.core.results import BenchResults, CaseResult, load_results

VERDICT_KIND = "gate-verdict"
VERDICT_VERSION = 3  # 2: a subject's data under "annotations", its cells under "cells"; 3: "looks", "between_runs"
NOISY_IQR_FRACTION = 0.05  # IQR over 5% of the median: the machine was noisy
EXIT_CODES = {
    stats.Verdict.PASS: ExitCode.OK,
    stats.Verdict.FAIL: ExitCode.FAILED,
    stats.Verdict.INCONCLUSIVE: ExitCode.INCONCLUSIVE,
    stats.Verdict.NO_BASELINE: ExitCode.NO_BASELINE,
    stats.Verdict.INCOMPLETE: ExitCode.INCOMPLETE,
}
OUTPUT_FILES = ("verdict.json", "report.md", "plot.png")  # in the --out folder (ci.host.outputs.VERDICT)
OUTPUTS_MARKER = ".gate-verdict"  # in --out: the files this stage wrote there, and their sha256


@dataclass(kw_only=True)
class CaseVerdict:
    id: str
    unit: str
    reference_median: float | None
    measured_median: float
    verdict: stats.Verdict
    effect: stats.Effect | None = None
    annotations: dict = field(default_factory=dict)  # the subject's data (ci.core.subjects), e.g. block-size picks
    cells: dict[str, str] = field(default_factory=dict)  # the subject's report columns
    notes: list[str] = field(default_factory=list)
    looks: list[dict] = field(default_factory=list)  # a sequential run's looks (ci.core.sequential), in order
    between_runs: dict | None = None  # baseline mode: the unchanged build's shift the effect was taken over


@dataclass(kw_only=True)
class GateReport:
    mode: str
    reference: str  # what the measurement is compared with
    threshold: float
    confidence: float
    overall: stats.Verdict
    cases: list[CaseVerdict]
    suite: str
    kind: str
    provenance: dict
    problems: list[str] = field(default_factory=list)  # missing evidence (ci.core.evidence): INCOMPLETE
    sequential: str | None = None  # the run's plan of looks (ci.core.sequential), as the report says it

    def to_json(self) -> dict:
        payload = asdict(self)
        payload.update(kind=VERDICT_KIND, schema_version=VERDICT_VERSION, results_kind=self.kind)
        return payload


def _annotate(
    verdict: CaseVerdict, case: CaseResult, stored: CaseResult | None = None, side: str | None = None, *, kind: str
) -> CaseVerdict:
    """Add what the case's subject (``ci.core.subjects``) says about it: report cells, verdict data, notes."""
    subject = subjects.subject_of(kind)
    if subject.annotate is not None:
        found = subject.annotate(case, stored, side)
        verdict.cells, verdict.annotations = found.cells, found.data
        verdict.notes.extend(found.notes)
    return verdict


def noise_notes(*samples: Sequence[float]) -> list[str]:
    notes = []
    for xs in samples:
        m = stats.median(xs)
        if m > 0 and stats.iqr(xs) / m > NOISY_IQR_FRACTION:
            notes.append(f"IQR is {stats.iqr(xs) / m:.0%} of the median: the machine was noisy")
    return notes


def capture_medians(case: CaseResult, side: str) -> list[float] | None:
    """The median of each capture of ``side`` (``extra.captures``: the capture of every sample), or None for
    results timed in one capture (a single capture, or none recorded)."""
    ids = subjects.capture_ids(case, side)
    return stats.capture_medians(case.samples[side], ids) if ids is not None and len(set(ids)) > 1 else None


def capture_jitter(case: CaseResult, side: str) -> list[float]:
    """What the noise note looks at: the samples, or for per-capture results their spread within a capture (the
    captures differ by design: fresh inputs, addresses and captures)."""
    samples, ids = case.samples[side], subjects.capture_ids(case, side)
    return stats.within_captures(samples, ids) if ids is not None and len(set(ids)) > 1 else samples


def _judge(
    case: CaseResult,
    ref: list[float],
    got: list[float],
    effect: stats.Effect,
    threshold: float,
    jitter: Sequence[Sequence[float]] | None = None,
) -> CaseVerdict:
    return CaseVerdict(
        id=case.id,
        unit=case.unit,
        reference_median=stats.median(ref),
        measured_median=stats.median(got),
        verdict=stats.decide(effect, threshold),
        effect=effect,
        notes=noise_notes(*(jitter if jitter is not None else (ref, got))),
    )


def compare_ab(results: BenchResults, threshold: float, confidence: float) -> GateReport:
    """Candidate vs base of the same run, paired round by round; a sequential run (``settings.sequential``) is
    judged look by look (``ci.core.sequential``), each look at the confidence the plan spends on it."""
    verdicts = _failed(results)
    plan = sequential.plan_of(results.settings, "the results")
    for case in results.cases:
        if not {"base", "candidate"} <= set(case.samples):
            continue  # a problem of the evidence (ci.core.evidence), reported as INCOMPLETE
        base, cand = case.samples["base"], case.samples["candidate"]
        mb, mc = capture_medians(case, "base"), capture_medians(case, "candidate")
        if (mb is None) != (mc is None) or (mb is not None and len(mb) != len(mc)):
            raise DataError(f"case {case.id}: the builds were timed in different captures; re-run the stage")
        if mb is not None:  # one number per pair of captures
            jitter = (capture_jitter(case, "base"), capture_jitter(case, "candidate"))
            if plan is None:
                effect = stats.capture_effect(mb, mc, confidence, n_base=len(base), n_cand=len(cand))
                verdict = _judge(case, base, cand, effect, threshold, jitter)
            else:
                verdict = _judge_looks(case, mb, mc, plan, confidence, threshold, jitter)
            verdicts.append(_annotate(verdict, case, kind=results.kind))
            continue
        n = min(len(base), len(cand))  # an interrupted run can end between the two rounds of a pair
        verdict = _judge(case, base[:n], cand[:n], stats.paired_effect(base[:n], cand[:n], confidence), threshold)
        if n < max(len(base), len(cand)):
            verdict.notes.append(f"{max(len(base), len(cand)) - n} unpaired round(s) left out of the paired test")
        verdicts.append(_annotate(verdict, case, kind=results.kind))
    problems = evidence.run_problems(results)
    described = None if plan is None else replace(plan, confidence=confidence).describe()
    return _report("ab", "base build of the same run", results, verdicts, threshold, confidence, problems, described)


def _judge_looks(
    case: CaseResult,
    mb: list[float],
    mc: list[float],
    plan: sequential.Plan,
    confidence: float,
    threshold: float,
    jitter: Sequence[Sequence[float]],
) -> CaseVerdict:
    """A case of a sequential run: the looks of ``plan`` (at ``confidence`` spent over them) up to the first
    that decides, or the last its captures reach; the verdict and the interval are that look's. Fewer captures
    than the first look (an evidence problem: INCOMPLETE) are judged once, at the first look's confidence."""
    plan = replace(plan, confidence=confidence)
    if len(mb) < plan.first:
        plan = sequential.Plan.single(len(mb), plan.confidence_at(0))
    looks = sequential.judge(mb, mc, plan, threshold)
    last = looks[-1]
    judged = set(sorted(set(subjects.capture_ids(case, "base")))[: last.captures])
    kept = {side: [x for x, b in _with_ids(case, side) if b in judged] for side in ("base", "candidate")}
    effect = replace(last.effect, n_base=len(kept["base"]), n_candidate=len(kept["candidate"]))
    verdict = _judge(case, kept["base"], kept["candidate"], effect, threshold, jitter)
    verdict.looks = [sequential.look_json(look) for look in looks]
    if last.captures < len(mb):
        verdict.notes.append(
            f"judged at look {len(looks)} ({last.captures} captures); the {len(mb) - last.captures} later "
            "capture(s) are no look of the plan's and were left out"
        )
    return verdict


def _medians_in(case: CaseResult, side: str, keep: set[int]) -> list[float]:
    """The capture medians of ``side`` over the captures in ``keep`` only, in capture order."""
    kept = [(x, b) for x, b in _with_ids(case, side) if b in keep]
    return stats.capture_medians([x for x, _ in kept], [b for _, b in kept])


def _with_ids(case: CaseResult, side: str) -> list[tuple[float, int]]:
    return list(zip(case.samples[side], subjects.capture_ids(case, side) or [], strict=True))


def compare_baseline(
    results: BenchResults, baseline: BenchResults, side: str, threshold: float, confidence: float, where: str
) -> GateReport:
    """This run's ``side`` build vs the same build in the stored baseline. Two runs differ by more than their
    captures show (a board, a machine start, a process), so the candidate side is taken over the base build's
    shift between the two runs, measured the same way, with its interval (``stats.between_runs``)."""
    verdicts = _failed(results)
    stored_cases = baseline.by_id()
    matched = subjects.subject_of(results.kind).captures_match_across_runs
    for case in results.cases:
        if side not in case.samples:
            continue  # a problem of the evidence (ci.core.evidence), reported as INCOMPLETE
        stored = stored_cases.get(case.id)
        if stored is None or side not in stored.samples:
            verdicts.append(
                CaseVerdict(
                    id=case.id,
                    unit=case.unit,
                    reference_median=None,
                    measured_median=stats.median(case.samples[side]),
                    verdict=stats.Verdict.NO_BASELINE,
                    notes=["not in the baseline: re-record it to include this case"],
                )
            )
            continue
        effect, notes, jitter = _across_runs(stored, case, side, confidence, matched)
        ref, got = stored.samples[side], case.samples[side]
        shift = None
        if side != "base":
            shift = _between_runs(stored, case, confidence, matched)
            if shift is None:
                notes.append("the base build is not in both runs: the between-run error is not in the interval")
            else:
                effect = stats.between_runs(effect, shift)
        verdict = _judge(case, ref, got, effect, threshold, jitter)
        verdict.notes += notes
        if shift is not None:
            verdict.between_runs = {"ratio": shift.ratio, "ci_low": shift.ci_low, "ci_high": shift.ci_high}
        verdicts.append(_annotate(verdict, case, stored, side, kind=results.kind))
    problems = evidence.baseline_problems(results, baseline, side)
    return _report("baseline", f"{side} build in {where}", results, verdicts, threshold, confidence, problems)


def _across_runs(
    stored: CaseResult, case: CaseResult, side: str, confidence: float, matched: bool
) -> tuple[stats.Effect, list[str], tuple | None]:
    """``side`` of ``case`` against ``side`` of ``stored``: captures paired by index where the subject's capture b
    does the same work in every run (``matched``) and the runs share their captures (a sequential run's extra
    captures are left out of the pairs), else unpaired over the capture medians; the samples unpaired for
    results of one capture. Returns the effect, its notes and what the noise note looks at."""
    ref, got = stored.samples[side], case.samples[side]
    ref_captures, got_captures = capture_medians(stored, side), capture_medians(case, side)
    if ref_captures is None or got_captures is None:
        notes = []
        if (ref_captures is None) != (got_captures is None):
            notes.append("one side was timed in one capture: the interval leaves the capture error out")
        return stats.unpaired_effect(ref, got, confidence), notes, None
    jitter = (capture_jitter(stored, side), capture_jitter(case, side))
    shared = _shared_captures(stored, case, side) if matched else None
    if shared is None:
        unpaired = stats.unpaired_effect(ref_captures, got_captures, confidence)
        effect = replace(unpaired, method=stats.METHOD_CAPTURES_UNPAIRED, n_base=len(ref), n_candidate=len(got))
        return effect, [], jitter
    paired = stats.capture_effect(
        _medians_in(stored, side, shared), _medians_in(case, side, shared), confidence, n_base=len(ref), n_cand=len(got)
    )
    notes = []
    left = len(set(subjects.capture_ids(stored, side))) + len(set(subjects.capture_ids(case, side))) - 2 * len(shared)
    if left:
        notes.append(f"{left} capture(s) of one run only (a sequential run's extra captures) left out of the pairs")
    return replace(paired, method=stats.METHOD_CAPTURES_BASELINE), notes, jitter


def _between_runs(stored: CaseResult, case: CaseResult, confidence: float, matched: bool) -> stats.Effect | None:
    """The base build's shift from the stored run to this one (the same method as the judged side), or None
    where either run lacks the base build."""
    if "base" not in stored.samples or "base" not in case.samples:
        return None
    return _across_runs(stored, case, "base", confidence, matched)[0]


def _shared_captures(stored: CaseResult, case: CaseResult, side: str) -> set[int] | None:
    """The captures both runs timed ``side`` in, where one run's are all among the other's (a stage that seeds
    capture b's inputs, order and pad by case id and b, as the kernel bench does, gives capture b of two runs
    the same work; a sequential run may add captures b = n, n + 1, ...); None where they are not so nested."""
    mine, theirs = (set(subjects.capture_ids(c, side) or ()) for c in (stored, case))
    shared = mine & theirs
    return shared if shared in (mine, theirs) else None


def _failed(results: BenchResults) -> list[CaseVerdict]:
    """Cases the stage could not time because a build failed there (wrong numbers, a crash): FAIL."""
    return [
        CaseVerdict(
            id=cid,
            unit="-",
            reference_median=None,
            measured_median=math.nan,
            verdict=stats.Verdict.FAIL,
            notes=[f"not timed: {why}"],
        )
        for cid, why in evidence.failed_cases(results).items()
    ]


def _report(mode, reference, results, verdicts, threshold, confidence, problems, plan=None) -> GateReport:
    found = [v.verdict for v in verdicts] + ([stats.Verdict.INCOMPLETE] if problems else [])
    return GateReport(
        sequential=plan,
        mode=mode,
        reference=reference,
        threshold=threshold,
        confidence=confidence,
        overall=stats.overall(found),
        problems=problems,
        cases=verdicts,
        suite=results.suite,
        kind=results.kind,
        provenance=results.provenance,
    )


OUT_HELP = "folder for verdict.json, report.md and plot.png (--out-dir: older name)"


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"malformed fraction {text!r}") from exc
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must lie strictly between 0 and 1 (3% is 0.03)")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.core.compare", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--results", type=Path, required=True, help="a results file of a stage (--out of its session)")
    parser.add_argument("--mode", choices=("ab", "baseline"), default="ab")
    parser.add_argument("--baseline-dir", type=Path, default=baselines.DEFAULT_DIR)
    parser.add_argument(
        "--side", choices=("base", "candidate"), default="candidate", help="build compared in baseline mode"
    )
    parser.add_argument(
        "--threshold", type=fraction, default=stats.DEFAULT_THRESHOLD, help="slowdown that fails (0.03)"
    )
    parser.add_argument("--confidence", type=fraction, default=stats.DEFAULT_CONFIDENCE, help="of the interval (0.95)")
    parser.add_argument("--out", "--out-dir", dest="out_dir", type=Path, help=OUT_HELP)
    args = parser.parse_args(argv)
    out_dir = args.out_dir or args.results.parent / f"{args.results.stem}-{args.mode}"
    _clear_outputs(out_dir)  # an earlier verdict must not outlive a run that ends in an error
    if not args.results.is_file():
        raise DataError(
            f"--results {args.results}: no such file; run the stage that writes it first "
            f"({subjects.written_by(args.results.name)})"
        )
    results = load_results(args.results)
    # judged and rendered in full (the files written too) before anything is printed: a file the subject cannot
    # read is one error, never a verdict on stdout followed by a traceback
    if args.mode == "ab":
        gate = compare_ab(results, args.threshold, args.confidence)
    else:
        try:
            stored = baselines.load_baseline(results, args.baseline_dir, results_path=str(args.results))
        except NoBaselineError as exc:
            print(f"NO_BASELINE: {exc}")
            report.to_step_summary(f"### {report.title(results.provenance)}: NO_BASELINE\n\n{exc}\n")
            return int(ExitCode.NO_BASELINE)
        where = str(baselines.baseline_path(results, args.baseline_dir))
        baselines.check_comparable(results, stored, args.side, where, args.results)
        gate = compare_baseline(results, stored, args.side, args.threshold, args.confidence, where)
    markdown = report.markdown(gate) + report.details_markdown(results)
    plot = _write_outputs(out_dir, gate, results, markdown)
    print(markdown)
    report.to_step_summary(markdown)
    print(f"gate: {gate.overall.value}; wrote {out_dir / 'verdict.json'}, report.md" + (", plot.png" if plot else ""))
    return int(EXIT_CODES[gate.overall])


def _own_outputs(out_dir: Path) -> dict[str, str]:
    """The files of ``out_dir`` this stage wrote in an earlier run (its marker), by name -> sha256."""
    try:
        recorded = json.loads((out_dir / OUTPUTS_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    files = recorded.get("files") if isinstance(recorded, dict) else None
    if not isinstance(files, dict):
        return {}
    return {k: v for k, v in files.items() if k in OUTPUT_FILES and isinstance(v, str)}


def _clear_outputs(out_dir: Path) -> None:
    """Remove this stage's own files of an earlier run (its marker names them, with their sha256); a file of
    that name the stage did not write, or that was changed since, is refused, and nothing is removed."""
    own = _own_outputs(out_dir)
    present = [n for n in OUTPUT_FILES if (out_dir / n).is_symlink() or (out_dir / n).exists()]
    foreign = [n for n in present if (out_dir / n).is_symlink() or own.get(n) != sha256_file(out_dir / n)]
    if foreign:
        raise UsageError(
            f"--out {out_dir}: {', '.join(foreign)} there {'was' if len(foreign) == 1 else 'were'} not written by "
            "ci.core.compare (or changed since): the stage replaces only its own files; pick another --out folder "
            "(nothing was removed)"
        )
    for name in own:
        (out_dir / name).unlink(missing_ok=True)
    (out_dir / OUTPUTS_MARKER).unlink(missing_ok=True)


def _write_outputs(out_dir: Path, gate: GateReport, results: BenchResults, markdown: str) -> bool:
    """Write verdict, report and plot into a fresh folder beside ``out_dir``, then move them in together and
    record them in the stage's marker (what the next run may replace)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".gate-", dir=out_dir))
    try:
        write_json(staging / "verdict.json", gate.to_json())
        (staging / "report.md").write_text(markdown)
        plot = report.plot(gate, results, staging / "plot.png") is not None
        _clear_outputs(out_dir)
        written = {}
        for name in OUTPUT_FILES:
            if (staging / name).exists():
                written[name] = sha256_file(staging / name)
                (staging / name).replace(out_dir / name)
        write_json(out_dir / OUTPUTS_MARKER, {"kind": "gate-outputs", "schema_version": 1, "files": written})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return plot


if __name__ == "__main__":
    sys.exit(run_main(main))
