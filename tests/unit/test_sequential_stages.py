"""Sequential verdicts in the stages (issue 44): the verdict judged look by look from what a results file records,
the report's looks, the baseline mode's between-run error, the benches' capture groups, TPOT's extra launch pairs
and the resampled rates of a sequential design."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ci.core import compare, evidence, rates, report, resample, sequential, stats
from ci.core.errors import DataError, UsageError
from ci.serving import config as sc
from ci.serving import tpot
from ci.serving.client import RoundResult
from ci.timing import captures as timing
from tests.unit.factories import captured_results

V = stats.Verdict
PLAN = sequential.Plan(first=8, group=4, max_extra=3)
OPEN = [1.02, 1.045, 1.01, 1.05, 1.025, 1.04, 1.0, 1.06]  # 8 captures straddling 1.03: INCONCLUSIVE at 97.5%


def _sequential(ratios, plan=PLAN, threshold=0.03):
    results = captured_results(ratios)
    results.settings["sequential"] = plan.to_settings(threshold)
    return results


# --- the verdict of a sequential run -------------------------------------------------------------------------------


def test_a_sequential_run_is_judged_look_by_look_and_the_report_shows_each_look():
    results = _sequential(OPEN + [1.0] * 12)
    gate = compare.compare_ab(results, 0.03, 0.95)
    (case,) = gate.cases
    want = sequential.judge(*(compare.capture_medians(results.cases[0], s) for s in ("base", "candidate")), PLAN)
    assert [look["captures"] for look in case.looks] == [look.captures for look in want] and len(want) > 1
    assert case.looks[0]["verdict"] == "INCONCLUSIVE" and case.verdict is V.PASS is want[-1].verdict
    assert case.looks == [sequential.look_json(look) for look in want]
    assert (case.effect.ci_low, case.effect.ci_high, case.effect.confidence) == (
        want[-1].effect.ci_low,
        want[-1].effect.ci_high,
        want[-1].confidence,
    )
    judged = want[-1].captures
    assert (case.effect.n_base, case.effect.n_candidate) == (3 * judged, 3 * judged)  # 3 rounds a capture
    assert case.notes == (
        []
        if judged == 20
        else [
            f"judged at look {len(want)} ({judged} captures); the {20 - judged} later capture(s) are no look of the "
            "plan's and were left out"
        ]
    )
    assert gate.sequential == PLAN.describe() and gate.problems == []
    text = report.markdown(gate)
    assert "Sequential: a first look after 8 captures (97.50%), then, while INCONCLUSIVE, up to 3 x 4 more" in text
    assert "| looks |" in text and "8: INCONCLUSIVE" in text and f"{judged}: PASS" in text
    assert gate.to_json()["cases"][0]["looks"] == case.looks


def test_a_decided_first_look_ends_the_verdict_there_and_the_rest_is_noted():
    results = _sequential([1.10] * 8 + [1.0] * 4)
    (case,) = compare.compare_ab(results, 0.03, 0.95).cases
    assert case.verdict is V.FAIL and [look["captures"] for look in case.looks] == [8]
    assert case.effect.confidence == 0.975 and case.effect.n_base == 24
    assert case.notes == [
        "judged at look 1 (8 captures); the 4 later capture(s) are no look of the plan's and were left out"
    ]
    assert report.looks_cell(case.looks) == "-"  # one look: nothing more to show


def test_the_judges_confidence_is_spent_over_the_recorded_plan():
    results = _sequential(OPEN)
    (case,) = compare.compare_ab(results, 0.03, 0.9).cases
    assert case.looks[0]["confidence"] == pytest.approx(0.95) and case.effect.confidence == pytest.approx(0.95)
    assert compare.compare_ab(results, 0.03, 0.9).sequential == replace(PLAN, confidence=0.9).describe()


def test_a_run_without_a_plan_keeps_the_one_look_and_too_few_captures_is_incomplete():
    plain = captured_results(OPEN)
    (case,) = compare.compare_ab(plain, 0.03, 0.95).cases
    assert case.looks == [] and case.effect.confidence == 0.95
    assert compare.compare_ab(plain, 0.03, 0.95).sequential is None
    short = _sequential(OPEN[:6])
    gate = compare.compare_ab(short, 0.03, 0.95)
    assert gate.overall is V.INCOMPLETE
    assert "case a: 6 capture(s) of 'base', at least 8 are needed (the interval is over captures)" in gate.problems
    (case,) = gate.cases
    assert case.effect.confidence == 0.975 and [look["captures"] for look in case.looks] == [6]
    assert evidence.run_problems(_sequential(OPEN)) == []
    assert evidence.run_problems(short, design_floors=False) == []  # pooling earlier designs ignores the plan


@pytest.mark.parametrize(
    "recorded", [{"first": 8}, "8+4x3", {"first": 0, "group": 1, "max_extra": 1, "confidence": 0.95}]
)
def test_a_malformed_plan_is_a_data_error_naming_the_field(recorded):
    results = captured_results(OPEN)
    results.settings["sequential"] = recorded
    with pytest.raises(DataError, match=r"the results: settings.sequential"):
        compare.compare_ab(results, 0.03, 0.95)


# --- baseline mode: the between-run error ------------------------------------------------------------------------


def _shift(results, side, factor):
    results.cases[0].samples[side] = [x * factor for x in results.cases[0].samples[side]]
    return results


def test_the_candidate_side_against_a_baseline_is_taken_over_the_base_sides_shift():
    """The base build moved +2% between the runs (a board): a candidate +2.5% against its stored self moved with it,
    and is judged on what is left (+0.5%), with the shift's own uncertainty; a candidate +7% there is +5%: FAIL."""
    stored = captured_results([1.0] * 10)
    run = _shift(_shift(captured_results([1.0] * 10), "base", 1.02), "candidate", 1.025)
    (drift,) = compare.compare_baseline(run, stored, "base", 0.03, 0.95, "B").cases
    assert drift.between_runs is None and drift.effect.method == stats.METHOD_CAPTURES_BASELINE
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    d = drift.effect
    assert case.between_runs == {"ratio": d.ratio, "ci_low": d.ci_low, "ci_high": d.ci_high}
    alone = compare._across_runs(stored.cases[0], run.cases[0], "candidate", 0.95, True)[0]
    assert case.effect.ratio == pytest.approx(alone.ratio / d.ratio)
    assert (case.effect.ci_low, case.effect.ci_high) == pytest.approx(
        (alone.ci_low / d.ci_high, alone.ci_high / d.ci_low)
    )
    assert case.effect.ratio == pytest.approx(1.025 / 1.02, abs=0.002) and case.verdict is V.PASS
    assert case.effect.method == f"{stats.METHOD_CAPTURES_BASELINE}; {stats.METHOD_BETWEEN_RUNS}"
    slower = _shift(_shift(captured_results([1.0] * 10), "base", 1.02), "candidate", 1.071)
    (bad,) = compare.compare_baseline(slower, stored, "candidate", 0.03, 0.95, "B").cases
    assert bad.verdict is V.FAIL and bad.effect.ratio == pytest.approx(1.05, abs=0.003)


def test_without_the_base_build_in_both_runs_the_between_run_error_is_said_missing():
    stored, run = captured_results([1.0] * 10), captured_results([1.0] * 10)
    del stored.cases[0].samples["base"]
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    assert case.between_runs is None and case.effect.method == stats.METHOD_CAPTURES_BASELINE
    assert case.notes == ["the base build is not in both runs: the between-run error is not in the interval"]


def test_a_sequential_runs_extra_captures_are_left_out_of_the_pairs_with_the_baseline():
    stored, run = captured_results([1.0] * 10), captured_results([1.05] * 10 + [1.0] * 2)
    (case,) = compare.compare_baseline(run, stored, "base", 0.03, 0.95, "B").cases
    assert case.effect.method == stats.METHOD_CAPTURES_BASELINE  # paired over captures 0-9
    assert case.notes == ["2 capture(s) of one run only (a sequential run's extra captures) left out of the pairs"]
    (cand,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    medians = [compare.capture_medians(r.cases[0], "candidate")[:10] for r in (stored, run)]
    paired = stats.capture_effect(*medians)
    assert (cand.effect.ratio, cand.verdict) == (paired.ratio, V.FAIL)  # the two 1.0 captures left out
    shorter = captured_results([1.0] * 6)
    (case,) = compare.compare_baseline(shorter, stored, "base", 0.03, 0.95, "B").cases
    assert case.effect.method == stats.METHOD_CAPTURES_BASELINE and case.notes[-1].startswith("4 capture(s)")
    assert compare._shared_captures(stored.cases[0], shorter.cases[0], "base") == set(range(6))
    other = captured_results([1.0] * 10)
    other.cases[0].extra["captures"]["base"] = [b + 5 for b in other.cases[0].extra["captures"]["base"]]
    assert compare._shared_captures(stored.cases[0], other.cases[0], "base") is None


def test_between_runs_divides_by_the_shift_at_the_far_ends_and_an_unbounded_shift_bounds_nothing():
    def eff(ratio, lo, hi, method="d"):
        return stats.Effect(
            ratio=ratio, ci_low=lo, ci_high=hi, confidence=0.95, method=method, n_base=30, n_candidate=30
        )

    effect = eff(1.04, 1.035, 1.045, "m")
    up = stats.between_runs(effect, eff(1.01, 1.005, 1.02))
    assert (up.n_base, up.confidence) == (30, 0.95) and up.ratio == pytest.approx(1.04 / 1.01)
    assert up.ci_low == pytest.approx(1.035 / 1.02) and up.ci_high == pytest.approx(1.045 / 1.005)
    down = stats.between_runs(effect, eff(0.99, 0.97, 1.001))
    assert down.ci_low == pytest.approx(1.035 / 1.001) and down.ci_high == pytest.approx(1.045 / 0.97)
    assert down.method == f"m; {stats.METHOD_BETWEEN_RUNS}" and down.ratio == pytest.approx(1.04 / 0.99)
    for lo, hi in ((0.0, 1.1), (0.9, math.inf)):
        wide = stats.between_runs(effect, eff(1.0, lo, hi))
        assert (wide.ci_low, wide.ci_high, wide.ratio) == (0.0, math.inf, 1.04)
        assert stats.decide(wide) is V.INCONCLUSIVE


# --- the plan's pieces ---------------------------------------------------------------------------------------------


def test_a_plan_says_whether_its_looks_can_decide():
    assert [stats.least_decisive(c) for c in (0.95, 0.975, 1 - 0.05 / 6)] == [5, 7, 9]
    assert stats.signed_rank_k(5, 0.95) == 0 and stats.signed_rank_k(4, 0.95) < 0
    assert stats.signed_rank_k(30, 0.95) == 137
    assert sequential.Plan(first=30, group=10, max_extra=3).undecidable() is None
    assert sequential.Plan(first=7, group=2, max_extra=1).undecidable() is None
    assert sequential.Plan(first=6, group=3, max_extra=1).undecidable() == (
        "its look 1 judges 6 captures at 97.50%, which needs at least 7"
    )
    assert sequential.Plan(first=7, group=1, max_extra=3).undecidable() == (
        "its look 2 judges 8 captures at 99.17%, which needs at least 9"
    )
    assert sequential.Plan.single(5).undecidable() is None and sequential.Plan.single(4).undecidable() is not None


def test_a_plan_is_recorded_read_back_and_described():
    plan = sequential.Plan(first=9, group=3, max_extra=3)
    recorded = plan.to_settings(0.05)
    assert recorded == {"first": 9, "group": 3, "max_extra": 3, "confidence": 0.95, "threshold": 0.05}
    assert sequential.plan_of({"sequential": recorded}) == plan and sequential.plan_of({}) is None
    assert plan.describe() == (
        "a first look after 9 captures (97.50%), then, while INCONCLUSIVE, up to 3 x 3 more (99.17% each): at most 18"
    )
    assert sequential.Plan.single(30).describe() == "one look after 30 captures (95.0%; sequential off)"
    with pytest.raises(DataError, match=r"^where: settings.sequential should hold first, group, max_extra, confidence"):
        sequential.plan_of({"sequential": {"first": 9}}, "where")
    with pytest.raises(DataError, match=r"^where: settings.sequential: a plan needs first >= 1"):
        sequential.plan_of({"sequential": {**recorded, "group": 0}}, "where")
    with pytest.raises(DataError, match=r"^where: settings.sequential: .*; re-run the stage$"):
        sequential.plan_of({"sequential": {**recorded, "first": "9"}}, "where")
    with pytest.raises(DataError, match=r"got '9\+3x3'"):
        sequential.plan_of({"sequential": "9+3x3"}, "where")
    with pytest.raises(DataError, match=r"^results: settings.sequential should hold"):
        sequential.plan_of({"sequential": {"first": 9}})  # the default place named


def test_more_captures_asks_for_the_next_group_only_while_the_question_is_open():
    base, cand = [100.0] * 20, [100.0 * r for r in OPEN + [1.0] * 12]
    medians = {"base": base[:8], "candidate": cand[:8]}
    assert sequential.more_captures(medians, PLAN, 0.03) == 4
    assert sequential.more_captures({"base": base[:8], "candidate": [110.0] * 8}, PLAN, 0.03) == 0  # decided
    assert sequential.more_captures({"base": base[:8], "candidate": cand[:8]}, PLAN, 0.10) == 0  # PASS at 10%
    still = [100.0 * (1.03 + (0.02 if i % 2 else -0.02)) for i in range(20)]
    assert sequential.more_captures({"base": base[:12], "candidate": still[:12]}, PLAN, 0.03) == 4
    assert sequential.more_captures({"base": base, "candidate": still}, PLAN, 0.03) == 0  # the last look
    assert sequential.more_captures({"base": base[:8], "candidate": still[:8]}, sequential.Plan.single(8), 0.03) == 0


# --- the benches' capture groups ----------------------------------------------------------------------------------


class _Runner:
    """A bench runner's timing calls: each build's time is its factor times the capture's own (a capture error)."""

    def __init__(self, factor: dict[str, list[float]]):
        self.factor, self.started = factor, []

    def start_capture(self, b, pad_bytes):
        self.started.append(b)
        self.capture = b
        return object()

    def time_us(self, graph):
        name, b = graph
        return 100.0 * self.factor[name][b]


def test_time_sequentially_adds_groups_while_open_and_keeps_the_schedule_of_each_capture():
    factor = {"base": [1.0] * 20, "candidate": OPEN + [1.0] * 12}
    runner = _Runner(factor)
    logged = []
    samples, ids, groups = timing.time_sequentially(
        runner, "case", PLAN, 2, lambda name: (name, runner.capture), 0.03, logged.append
    )
    n = len(ids["base"]) // 2
    assert runner.started == list(range(n)) and n in (12, 16, 20)
    assert [g["captures"] for g in groups] == [[0, 8]] + [[k, k + 4] for k in range(8, n, 4)]
    assert all({"began", "ended", "seconds"} <= set(g) for g in groups)
    assert logged[0] == "case: INCONCLUSIVE after 8 captures, timing 4 more"
    medians = {s: stats.capture_medians(samples[s], ids[s]) for s in samples}
    assert sequential.verdict(sequential.judge(medians["base"], medians["candidate"], PLAN)) is V.PASS
    schedule = timing.capture_plan("case", PLAN.most_captures)
    assert schedule[:n] == timing.capture_plan("case", n)  # capture b: the same order and pad in any plan
    decided = _Runner({"base": [1.0] * 20, "candidate": [1.2] * 20})
    _, ids, groups = timing.time_sequentially(decided, "case", PLAN, 2, lambda name: (name, decided.capture), 0.03)
    assert len(groups) == 1 and len(set(ids["base"])) == 8


def test_a_bench_plan_is_refused_where_it_could_never_decide():
    assert timing.plan_for(30) == sequential.Plan(first=30, group=10, max_extra=3)
    assert timing.plan_for(30, on=False) == sequential.Plan.single(30) == timing.plan_for(30, max_extra=0)
    assert timing.plan_for(9, max_extra=2) == sequential.Plan(first=9, group=3, max_extra=2)
    with pytest.raises(UsageError, match=r"^--captures 6 with the sequential plan: its look 1 judges 6 captures"):
        timing.plan_for(6)
    with pytest.raises(UsageError, match=r"^--max-extra -1: 0 \(no extra look\) or more groups of captures$"):
        timing.plan_for(30, max_extra=-1)


# --- TPOT: launch pairs in groups ---------------------------------------------------------------------------------


def test_a_tpot_plan_adds_the_pairs_started_together_up_to_the_profiles_cap():
    pr = sc.PROFILES["pr"]
    assert tpot.tpot_plan("pr", pr, True, None) == sequential.Plan(first=9, group=3, max_extra=3)
    assert tpot.tpot_plan("pr", pr, False, None) is None and tpot.tpot_plan("pr", pr, True, 0) is None
    assert tpot.tpot_plan("smoke", sc.PROFILES["smoke"], True, None) is None  # its cap is 0
    assert tpot.tpot_plan("nightly", sc.PROFILES["nightly"], True, None) is None  # 6 pairs: 7 needed at 97.5%
    assert tpot.tpot_plan("nightly", sc.PROFILES["nightly"], False, 2) is None
    with pytest.raises(UsageError, match=r"^--launches 6 with the sequential plan: its look 1 judges 6 captures"):
        tpot.tpot_plan("nightly", sc.PROFILES["nightly"], True, 2)
    with pytest.raises(UsageError, match=r"^--launches 2 with the sequential plan: its look 1 judges 2 captures"):
        tpot.tpot_plan("pr", replace(pr, launches=2), True, None)
    with pytest.raises(UsageError, match=r"^--max-extra -2: 0 \(no extra look\) or more groups of launch pairs$"):
        tpot.tpot_plan("pr", pr, True, -2)
    assert sc.sequential_group(replace(pr, pairs_at_once=1)) == 3 and sc.sequential_group(sc.PROFILES["smoke"]) == 1


def _round(build, launch, tpot_ms):
    return RoundResult(
        build=build,
        median_tpot_ms=tpot_ms,
        mean_tpot_ms=tpot_ms,
        median_ttft_ms=1.0,
        output_throughput=1.0,
        completed=1,
        failed=0,
        launch=launch,
    )


def test_tpot_asks_for_more_pairs_from_each_pairs_medians_and_counts_what_it_planned():
    plan = sequential.Plan(first=8, group=4, max_extra=3)
    more = tpot._more_pairs(plan, 0.03)
    rounds = [_round(b, n, 10.0 * (OPEN[n] if b == "candidate" else 1.0)) for n in range(8) for b in sc.BUILDS]
    assert more(rounds) == 4
    assert more([_round(b, n, 10.0 * (1.2 if b == "candidate" else 1.0)) for n in range(8) for b in sc.BUILDS]) == 0
    profile = replace(sc.PROFILES["pr"], launches=8)
    assert tpot.pairs_planned(profile, rounds, {"groups": [{"pairs": [0, 8]}, {"pairs": [8, 12]}]}) == 12
    assert tpot.pairs_planned(profile, rounds, {}) == 8
    assert tpot.pairs_planned(profile, [*rounds, _round("base", 10, 10.0)], {}) == 11


# --- resampled rates of a sequential design -----------------------------------------------------------------------


def test_a_sequential_design_is_resampled_with_the_captures_it_used():
    null = [0.003 * math.sin(i) for i in range(45)]  # a spread like the H200's launch pairs (SD about 0.2%)
    plan = resample.parse_design("9+3x3")
    assert plan == sequential.Plan(first=9, group=3, max_extra=3) and resample.design_key(plan) == "9+3x3"
    aa = resample.resampled_sequential(null, 1.0, plan, trials=300, seed=1)
    assert aa["PASS"] == 1.0 and aa["mean_captures"] == 9 and aa["most_captures"] == 9
    far = resample.resampled_sequential(null, 1.10, plan, trials=300, seed=1)
    assert far["FAIL"] == 1.0 and far["mean_captures"] == 9
    edge = resample.resampled_sequential(null, 1.031, plan, trials=300, seed=1)
    assert edge["mean_captures"] > 9 and edge["most_captures"] <= 18
    assert sum(edge[v.value] for v in V) == pytest.approx(1.0)
    for bad in ("9+3", "9x3+3", "a+3x3"):
        with pytest.raises(UsageError, match=r"give FIRST\+GROUPxMAX, e.g. 9\+3x3"):
            resample.parse_design(bad)
    with pytest.raises(UsageError, match=r"^--sequential '6\+3x3': its look 1 judges 6 captures"):
        resample.parse_design("6+3x3")
    with pytest.raises(ValueError, match="resampling needs"):
        resample.resampled_sequential([], 1.0, plan)


def test_an_error_rate_row_counts_the_cases_judged_after_more_than_one_look():
    results = _sequential(OPEN + [1.0] * 12)
    gate = compare.compare_ab(results, 0.03, 0.95)
    row = rates.summarize("aa-1", 0.0, gate, 1.0)
    assert row["looked_again"] == {"a": len(gate.cases[0].looks)} and len(gate.cases[0].looks) > 1
    assert (
        rates.summarize("aa-1", 0.0, compare.compare_ab(captured_results(OPEN), 0.03, 0.95), 1.0)["looked_again"] == {}
    )


def test_every_committed_h200_tpot_run_decides_at_the_sequential_plans_first_look():
    """docs/statistics.md: the nine committed 9-pair `pr` runs (five H200 boards), judged with `pr`'s plan of looks,
    all decide at the first look (97.5%), so the sequential design would have stopped there: A/A and +2% PASS,
    +3.5% and +5% FAIL, the #48144 A/B PASS."""
    from pathlib import Path

    from ci.core.results import load_results

    runs = Path(__file__).parents[2] / "reports" / "nvidia-h200-x1" / "tpot-9-pairs"
    plan = tpot.tpot_plan("pr", sc.PROFILES["pr"], True, None)
    want = {"aa": V.PASS, "ab": V.PASS, "inject-2pct": V.PASS, "inject-3.5pct": V.FAIL, "inject-5pct": V.FAIL}
    seen = 0
    for path in sorted(runs.glob("pr-*.json")):
        results = load_results(path)
        results.settings["sequential"] = plan.to_settings(0.03)
        gate = compare.compare_ab(results, 0.03, 0.95)
        (case,) = gate.cases
        level = next(k for k in want if path.stem.removeprefix("pr-").startswith(k))
        assert gate.problems == [] and [look["captures"] for look in case.looks] == [9], path.name
        assert case.verdict is want[level] and case.effect.confidence == 0.975, path.name
        seen += 1
    assert seen == 9


def test_the_looks_are_judged_at_the_gates_threshold_and_record_every_field():
    results = _sequential(OPEN + [1.0] * 12)
    (wide,) = compare.compare_ab(results, 0.10, 0.95).cases  # 8 captures at 1.00-1.06 lie under 1.10
    assert wide.verdict is V.PASS and [look["captures"] for look in wide.looks] == [8]
    look = sequential.judge([100.0] * 8, [100.0 * r for r in OPEN], PLAN)[0]
    assert sequential.look_json(look) == {
        "captures": 8,
        "confidence": 0.975,
        "ratio": look.effect.ratio,
        "ci_low": look.effect.ci_low,
        "ci_high": look.effect.ci_high,
        "verdict": "INCONCLUSIVE",
    }


def _spread_between_captures(results, factor=0.5):
    """Captures that differ by design (fresh inputs: here up to 2x apart), each tight inside."""
    case = results.cases[0]
    for side in ("base", "candidate"):
        ids = case.extra["captures"][side]
        case.samples[side] = [x * (1 + factor * b / max(ids)) for x, b in zip(case.samples[side], ids, strict=True)]
    return results


def test_a_sequential_cases_noise_note_looks_inside_its_captures():
    results = _spread_between_captures(_sequential([1.0] * 12))
    (case,) = compare.compare_ab(results, 0.03, 0.95).cases
    assert not [n for n in case.notes if "IQR" in n], "a spread between captures is no noise"
    assert case.verdict is V.PASS


def test_baseline_notes_keep_the_noise_note_beside_the_between_run_note():
    stored, run = captured_results([1.0] * 10), captured_results([1.0] * 10)
    del stored.cases[0].samples["base"]
    ids = run.cases[0].extra["captures"]["candidate"]
    run.cases[0].samples["candidate"] = [
        x * (0.7, 1.0, 1.4)[i % 3] for i, x in enumerate(run.cases[0].samples["candidate"])
    ]
    assert len(ids) == len(run.cases[0].samples["candidate"])
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    assert [n for n in case.notes if "IQR" in n] and case.notes[-1].startswith("the base build is not in both runs")


def test_the_first_look_of_a_plan_with_several_extra_looks_is_named_at_its_own_confidence():
    assert sequential.Plan(first=6, group=3, max_extra=3).undecidable() == (
        "its look 1 judges 6 captures at 97.50%, which needs at least 7"
    )
    assert [stats.least_decisive(c) for c in (0.3, 0.8, 0.9, 0.999)] == [1, 2, 4, 14]
    effect = stats.Effect(ratio=1.0, ci_low=0.99, ci_high=1.01, confidence=0.95, method="m", n_base=6, n_candidate=6)
    unbounded = stats.Effect(
        ratio=1.0, ci_low=0.0, ci_high=math.inf, confidence=0.95, method="d", n_base=3, n_candidate=3
    )
    assert stats.between_runs(effect, unbounded).method == f"m; {stats.METHOD_BETWEEN_RUNS}"


def test_the_evidence_rules_name_a_malformed_plan_as_the_results_field():
    """Every reader of a results file (a verdict, a baseline, the history, the resampling) asks the evidence rules
    first: a plan of looks that is not one is a data error naming the file's field, not a verdict."""
    results = captured_results(OPEN)
    results.settings["sequential"] = {"first": 8}
    with pytest.raises(DataError, match=r"^the results: settings.sequential should hold first, group, max_extra"):
        evidence.run_problems(results)
