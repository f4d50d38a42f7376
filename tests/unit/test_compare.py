"""ci.core.compare: verdicts end to end (synthetic and H200 results), exit codes, reports, and the verdict logic
piece by piece: exact values and messages, each boundary, the interval over captures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ci.core import baselines, compare, evidence, report, stats
from ci.core.errors import DataError, ExitCode, UsageError
from ci.core.results import BenchResults, CaseResult, load_results
from ci.kernel import subject as kernel_subject
from tests.unit.factories import GPU, kernel_results, make_results, saved
from tests.unit.factories import captured_results as _captured_results

V = stats.Verdict


@pytest.fixture
def results_file(tmp_path):
    def write(ratios, **kw):
        path = tmp_path / "results.json"
        make_results(ratios, **kw).save(path)
        return path

    return write


def test_ab_pass_and_report(results_file, tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    path = results_file({"a/ep8/tpr8": 0.8, "b/ep1/tpr8": 1.0})
    assert compare.main(["--results", str(path), "--out-dir", str(tmp_path / "o")]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "| a/ep8/tpr8 |" in out and "PASS" in out and "64 -> 16" in out and "best 16" in out
    verdict = json.loads((tmp_path / "o" / "verdict.json").read_text())
    assert verdict["kind"] == "gate-verdict" and verdict["overall"] == "PASS"
    assert (tmp_path / "o" / "plot.png").stat().st_size > 1000
    assert "EP-Marlin gate" in summary.read_text()


def test_ab_fail_on_real_slowdown(results_file, tmp_path):
    path = results_file({"a": 1.0, "b": 1.06})
    assert compare.main(["--results", str(path), "--out-dir", str(tmp_path / "o")]) == ExitCode.FAILED
    verdict = json.loads((tmp_path / "o" / "verdict.json").read_text())
    assert [c["verdict"] for c in verdict["cases"]] == ["PASS", "FAIL"]


def test_threshold_and_confidence_are_options(results_file, tmp_path):
    path = results_file({"a": 1.06})
    args = ["--results", str(path), "--out-dir", str(tmp_path / "o"), "--threshold", "0.10"]
    assert compare.main(args) == ExitCode.OK
    with pytest.raises(SystemExit):
        compare.main(["--results", str(path), "--threshold", "3"])


def test_baseline_missing_then_recorded_then_compared(results_file, tmp_path, capsys):
    path = results_file({"a": 1.0})
    bdir = tmp_path / "baselines"
    args = ["--results", str(path), "--mode", "baseline", "--baseline-dir", str(bdir), "--out-dir", str(tmp_path / "o")]
    assert compare.main(args) == ExitCode.NO_BASELINE
    assert "update_baselines" in capsys.readouterr().out
    stored = baselines.record(path, bdir)
    assert stored == bdir / "nvidia-h200-x1" / "unit.json"
    with pytest.raises(UsageError, match="--force"):
        baselines.record(path, bdir)
    assert compare.main(args) == ExitCode.OK
    slower = results_file({"a": 1.08}, seed=5)
    assert compare.main([*args[:1], str(slower), *args[2:]]) == ExitCode.FAILED


def test_an_aa_run_is_not_recorded_as_a_baseline(tmp_path):
    results = make_results({"a": 1.0})
    path = tmp_path / "aa.json"
    BenchResults(**{**results.__dict__, "settings": {**results.settings, "aa": True}}).save(path)
    with pytest.raises(UsageError, match="A/A run"):
        baselines.record(path, tmp_path / "baselines")
    assert not (tmp_path / "baselines").exists()


def test_case_missing_from_baseline_is_no_baseline(results_file, tmp_path):
    bdir = tmp_path / "b"
    baselines.record(results_file({"a": 1.0}), bdir)
    path = results_file({"a": 1.0, "new": 1.0}, seed=2)
    args = ["--results", str(path), "--mode", "baseline", "--baseline-dir", str(bdir), "--out-dir", str(tmp_path / "o")]
    assert compare.main(args) == ExitCode.NO_BASELINE


def test_corrupt_or_foreign_baseline_is_an_error(results_file, tmp_path, capsys):
    from ci.core.cli import run_main

    bdir = tmp_path / "b"
    stored = baselines.record(results_file({"a": 1.0}), bdir)
    path = results_file({"a": 1.0})
    args = ["--results", str(path), "--mode", "baseline", "--baseline-dir", str(bdir)]
    stored.write_text("{")
    assert run_main(compare.main, args) == ExitCode.DATA
    payload = make_results({"a": 1.0}).to_json()
    payload["schema_version"] = 7
    stored.write_text(json.dumps(payload))
    assert run_main(compare.main, args) == ExitCode.DATA
    assert "schema_version=7" in capsys.readouterr().err


def test_results_with_bad_samples_are_refused(tmp_path):
    from ci.core.errors import DataError

    payload = make_results({"a": 1.0}).to_json()
    payload["cases"][0]["samples"]["base"][3] = -1
    path = tmp_path / "r.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError, match="positive finite"):
        load_results(path)


def test_interrupted_run_uses_complete_pairs(tmp_path):
    results = make_results({"a": 1.0}, n=7)
    results.cases[0].samples["base"] = results.cases[0].samples["base"][:3]
    results.cases[0].samples["candidate"] = results.cases[0].samples["candidate"][:4]
    gate = compare.compare_ab(results, 0.03, 0.95)
    (case,) = gate.cases
    assert case.effect.n_base == 3 and "1 unpaired round" in case.notes[0]
    assert case.verdict == compare.stats.Verdict.INCONCLUSIVE  # 3 pairs cannot bound a 95% interval


def test_regret_uses_the_sweep():
    case = make_results({"a": 1.0}).cases[0]
    r = kernel_subject.regret(case)
    assert r["best_block_size_m"] == 16 and r["candidate"] == 0 and r["base"] == pytest.approx(0.48)


REPORTS = Path(__file__).resolve().parents[2] / "reports" / "nvidia-h200-x1"


def test_h200_tpot_ab_of_nine_launch_pairs_passes_with_its_interval_over_the_pairs(tmp_path):
    """The committed H200 TPOT A/B of pr as it is now (9 launch pairs of one round, three pairs at once; N = 1,
    so no EP: the patch changes nothing the server runs, equal builds must PASS), its report's launch pairs and
    rounds; a run of the design before (6 pairs of 2 rounds) is INCOMPLETE for pr now, its rounds still shown."""
    ab = REPORTS / "tpot-9-pairs" / "pr-ab.json"
    assert compare.main(["--results", str(ab), "--out", str(tmp_path / "ab")]) == ExitCode.OK
    verdict = json.loads((tmp_path / "ab" / "verdict.json").read_text())
    (case,) = verdict["cases"]
    effect = case["effect"]
    assert (round(effect["ci_low"], 3), round(effect["ratio"], 3), round(effect["ci_high"], 3)) == (0.997, 1.001, 1.003)
    assert effect["method"] == stats.METHOD_CAPTURES and effect["n_base"] == 9
    text = (tmp_path / "ab" / "report.md").read_text()
    assert "| 0 | base (pairs 0, 1, 2 at once) | 67.1 / 67.1 | off | 7.210 | 7.212 | 1.0003 | 1.0001 |" in text
    assert "| 18 | 8 | candidate | 7.210 | 7.230 |" in text and text.count("| candidate | 7.") == 9
    before = REPORTS / "tpot-launch-pairs" / "pr-ab.json"
    assert compare.main(["--results", str(before), "--out", str(tmp_path / "before")]) == ExitCode.INCOMPLETE
    text = (tmp_path / "before" / "report.md").read_text()
    assert "6 capture(s) of 'base', at least 9 are needed" in text
    assert "| 0 | base | 63.1 / 63.0 | 0 (0 s, no) | 7.186 | 7.195 | 1.0012 | 1.0027 |" in text
    assert "| 24 | 5 | candidate | 7.191 | 7.206 |" in text and text.count("| candidate | 7.") == 12


def test_h200_tpot_runs_of_nine_pairs_and_the_baseline_recorded_from_them(tmp_path):
    """The committed H200 runs of pr as it is now (three launch pairs started at once): the A/B (DP = 1: PASS) is
    the x1 baseline; the A/A runs' base and candidate pass against it, in its machine start and on another board
    hours later, candidates slowed by +2% pass and ones slowed by +3.6%, +3.7% and +5.0% (measured) fail, on three
    boards, each with the two runs' launch pairs compared unpaired (independent launches). Since issue 44 the
    candidate side is taken over the base side's shift between the two runs, with that shift's interval: every
    candidate-side verdict is then its run's A/B verdict, the estimates within 0.11%."""
    runs = REPORTS / "tpot-9-pairs"
    ab = load_results(runs / "pr-ab.json")
    (case,) = compare.compare_ab(ab, 0.03, 0.95).cases
    assert case.verdict == V.PASS and (round(case.effect.ci_low, 3), round(case.effect.ci_high, 3)) == (0.997, 1.003)
    assert ab.cases[0].info["profile"]["pairs_at_once"] == 3 and ab.cases[0].info["start"] == "parallel"
    stored = Path(__file__).parents[2] / "baselines" / "nvidia-h200-x1" / "tpot-qwen3-30b-a3b-like-dp1-pr.json"
    assert stored.read_bytes() == (runs / "pr-ab.json").read_bytes()
    baseline = load_results(stored)
    expected = {  # the candidate side over the base side's shift between the two runs (issue 44)
        ("pr-aa-1", "base"): (V.PASS, 0.999, 1.006),
        ("pr-aa-1", "candidate"): (V.PASS, 0.994, 1.004),
        ("pr-inject-3.5pct-1", "base"): (V.PASS, 0.997, 1.004),
        ("pr-inject-3.5pct-1", "candidate"): (V.FAIL, 1.031, 1.042),
        ("pr-aa-2", "base"): (V.PASS, 0.997, 1.003),
        ("pr-aa-2", "candidate"): (V.PASS, 0.996, 1.004),
        ("pr-aa-3", "base"): (V.PASS, 0.997, 1.004),
        ("pr-aa-3", "candidate"): (V.PASS, 0.993, 1.003),
        ("pr-inject-2pct-1", "base"): (V.PASS, 0.997, 1.004),
        ("pr-inject-2pct-1", "candidate"): (V.PASS, 1.016, 1.026),
        ("pr-inject-5pct-1", "base"): (V.PASS, 0.997, 1.005),
        ("pr-inject-5pct-1", "candidate"): (V.FAIL, 1.043, 1.057),
        ("pr-inject-3.5pct-2", "base"): (V.PASS, 0.996, 1.003),
        ("pr-inject-3.5pct-2", "candidate"): (V.FAIL, 1.03, 1.043),
        ("pr-inject-2pct-2", "base"): (V.PASS, 0.996, 1.003),
        ("pr-inject-2pct-2", "candidate"): (V.PASS, 1.014, 1.026),
    }
    for (name, side), (verdict, low, high) in expected.items():
        run = load_results(runs / f"{name}.json")
        (case,) = compare.compare_baseline(run, baseline, side, 0.03, 0.95, "B").cases
        assert case.effect.method.startswith(stats.METHOD_CAPTURES_UNPAIRED), (name, side)
        assert (case.verdict, round(case.effect.ci_low, 3), round(case.effect.ci_high, 3)) == (verdict, low, high)
        if side == "candidate":  # over the base side's shift, whose interval is the base row's: the A/B's verdict
            (ab,) = compare.compare_ab(run, 0.03, 0.95).cases
            assert ab.verdict is verdict and abs(math.log(case.effect.ratio / ab.effect.ratio)) < 0.0011, name
            (drift,) = compare.compare_baseline(run, baseline, "base", 0.03, 0.95, "B").cases
            assert case.between_runs == {k: getattr(drift.effect, k) for k in ("ratio", "ci_low", "ci_high")}
            assert case.effect.method.endswith(stats.METHOD_BETWEEN_RUNS)
        else:
            assert case.between_runs is None and case.effect.method == stats.METHOD_CAPTURES_UNPAIRED


def test_h200_tpot_error_rate_table_is_the_committed_runs_judged_again():
    """The committed TPOT error-rates table of pr as it is now says what its runs' committed results files say
    when judged again: the same verdict and ratio for every run, and its A/A runs are the files resampled."""
    runs = REPORTS / "tpot-9-pairs"
    table = json.loads((runs / "error-rates" / "error-rates.json").read_text())
    assert table["settings"]["launches"] == 9 and table["settings"]["rounds"] == 1
    assert {r["inject"] for r in table["runs"]} == {0.0, 0.02, 0.035, 0.05}  # every level of the targets was run
    for run in table["runs"]:
        (case,) = compare.compare_ab(load_results(runs / f"pr-{run['run']}.json"), 0.03, 0.95).cases
        assert (case.verdict.value, round(case.effect.ratio, 6)) == (run["overall"], round(run["median_ratio"], 6))
    resampled = (runs / "resampled" / "resampled-rates.md").read_text()
    for run in (r["run"] for r in table["runs"] if r["inject"] == 0):
        assert f"tpot-9-pairs/pr-{run}.json` (captures: 9)" in resampled, run


def test_h200_tpot_runs_of_one_launch_pair_are_incomplete_and_still_reported(tmp_path):
    """The H200 TPOT A/B and A/A recorded before launch pairs (8 rounds a build in one pair): INCOMPLETE now,
    with every round still in the report."""
    ab = REPORTS / "tpot-pr-ab.json"
    assert compare.main(["--results", str(ab), "--out-dir", str(tmp_path / "ab")]) == ExitCode.INCOMPLETE
    text = (tmp_path / "ab" / "report.md").read_text()
    assert "| 1 | 0 | base | 7.595 |" in text and text.count("| candidate |") == 8
    assert "8 sample(s) of 'base', at least 9 are needed" in text and "A/A run" not in text
    aa = REPORTS / "tpot-pr-aa.json"
    assert compare.main(["--results", str(aa), "--out-dir", str(tmp_path / "aa")]) == ExitCode.INCOMPLETE
    text = (tmp_path / "aa" / "report.md").read_text()
    assert "A/A run" in text and "| 1980 |" in text  # the A/A run recorded the SM clock of each round


def test_baseline_mode_shows_the_baselines_pick_beside_this_runs(results_file, tmp_path):
    bdir = tmp_path / "baselines"
    baselines.record(results_file({"a": 1.0, "b": 1.0}), bdir)
    now = make_results({"a": 1.0, "b": 1.0}, seed=3)
    now.cases[1].info["block_size_m"] = {"base": 64, "candidate": 8}  # b: the candidate now picks 8
    stored = baselines.load_baseline(now, bdir)
    gate = compare.compare_baseline(now, stored, "candidate", 0.03, 0.95, "stored")
    a, b = gate.cases
    assert a.annotations["block_size_m"] == {"baseline": 16, "this run": 16}
    assert set(a.annotations["regret"]) == {"best_block_size_m", "candidate"}
    assert b.annotations["block_size_m"] == {"baseline": 16, "this run": 8}
    assert (
        "the candidate build picked block_size_m 16 in the baseline and 8 now: different kernels were timed" in b.notes
    )
    text = report.markdown(gate)
    assert "block_size_m (baseline -> this run)" in text and "| 16 -> 8 |" in text and "base +" not in text
    ab = report.markdown(compare.compare_ab(now, 0.03, 0.95))
    assert "block_size_m (base -> candidate)" in ab and "| 64 -> 8 |" in ab


def test_the_core_knows_no_subject():
    """compare, report and baselines judge and show samples; block sizes, regret and TPOT rounds come from
    the subjects (ci.kernel.subject, ci.serving.subject) through ci.core.subjects."""
    import re

    from ci.core import subjects

    root = Path(compare.__file__).parent
    for name in ("compare.py", "report.py", "baselines.py", "stats.py", "subjects.py"):
        code = "\n".join(line for line in (root / name).read_text().splitlines() if not line.lstrip().startswith("#"))
        code = re.sub(r'"""[\s\S]*?"""', "", code)  # docstrings may say what the subjects are
        assert not re.search(
            r"block_size|regret|\"rounds\"|ci\.kernel|ci\.serving|kernel-bench|tpot-bench", code, re.I
        ), name
    plain = subjects.subject_of("some-other-kind")
    assert plain.annotate is None and plain.baseline_prefix == "" and tuple(plain.columns("ab")) == ()
    assert subjects.subject_of("tpot-bench").baseline_prefix == "tpot-"
    assert subjects.subject_of("kernel-bench").columns("baseline")[0] == "block_size_m (baseline -> this run)"


def test_a_tpot_table_has_no_kernel_columns():
    results = load_results(Path(__file__).parents[2] / "reports/nvidia-h200-x1/tpot-pr-ab.json")
    text = report.markdown(compare.compare_ab(results, 0.03, 0.95))
    assert "| case | reference | measured | ratio | CI | verdict |\n|---|---:|---:|---:|---|---|\n" in text
    assert "block_size_m" not in text and "Rounds of" in report.details_markdown(results)


def test_out_is_the_folder_like_every_stage_and_out_dir_still_works(results_file, tmp_path):
    path = results_file({"a": 1.0})
    assert compare.main(["--results", str(path), "--out", str(tmp_path / "new")]) == ExitCode.OK
    assert compare.main(["--results", str(path), "--out-dir", str(tmp_path / "old")]) == ExitCode.OK
    assert (tmp_path / "new" / "verdict.json").is_file() and (tmp_path / "old" / "verdict.json").is_file()


def test_judging_before_the_bench_ran_says_which_session_writes_the_results(tmp_path, capsys):
    from ci.core.cli import run_main

    assert run_main(compare.main, ["--results", str(tmp_path / "kernel-results.json")]) == ExitCode.DATA
    assert capsys.readouterr().err.strip() == (
        f"error: --results {tmp_path / 'kernel-results.json'}: no such file; run the stage that writes it first "
        "(nox -s bench writes kernel-results.json)"
    )
    assert run_main(compare.main, ["--results", str(tmp_path / "mine.json")]) == ExitCode.DATA
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "(nox -s bench writes kernel-results.json; nox -s tpot writes tpot-results.json; "
            "nox -s triton_bench writes triton-moe-results.json)"
        )
    )


# ci.core.compare ------------------------------------------------------------------------------------


def test_a_case_without_a_build_does_not_stop_the_others_from_being_judged():
    results = make_results({"a": 1.0, "b": 1.10})
    del results.cases[0].samples["candidate"]
    ab = compare.compare_ab(results, 0.03, 0.95)
    assert [c.id for c in ab.cases] == ["b"] and ab.overall == V.FAIL
    assert "case a: no samples of build 'candidate'" in ab.problems
    stored = make_results({"a": 1.0, "b": 1.0}, seed=9)
    results = make_results({"a": 1.0, "b": 1.10})
    del results.cases[0].samples["candidate"]
    bl = compare.compare_baseline(results, stored, "candidate", 0.03, 0.95, "here")
    assert [c.id for c in bl.cases] == ["b"] and bl.overall == V.FAIL


def test_confidence_and_threshold_reach_every_case():
    results = make_results({"a": 1.0, "b": 1.0})
    ab = compare.compare_ab(results, 0.05, 0.99)
    assert {c.effect.confidence for c in ab.cases} == {0.99} and (ab.threshold, ab.confidence) == (0.05, 0.99)
    bl = compare.compare_baseline(results, make_results({"a": 1.0, "b": 1.0}, seed=3), "base", 0.05, 0.99, "x")
    assert {c.effect.confidence for c in bl.cases} == {0.99}


def test_report_fields_name_what_was_compared(tmp_path):
    results = make_results({"a": 1.0})
    gate = compare.compare_ab(results, 0.03, 0.95)
    payload = gate.to_json()
    assert payload["kind"] == "gate-verdict" and payload["schema_version"] == compare.VERDICT_VERSION == 3
    assert payload["results_kind"] == "synthetic-bench" and payload["mode"] == "ab"
    assert payload["reference"] == "base build of the same run" and payload["suite"] == "unit"
    assert payload["provenance"] == {"gpu": GPU, "gate": "EP-Marlin gate"} and payload["problems"] == []
    (case,) = gate.cases
    assert case.unit == "us/call" and case.reference_median == stats.median(results.cases[0].samples["base"])
    assert case.measured_median == stats.median(results.cases[0].samples["candidate"])
    assert case.notes == []  # equal pair counts: no "unpaired" note
    bl = compare.compare_baseline(results, make_results({"a": 1.0}, seed=2), "base", 0.03, 0.95, "B/x.json")
    assert bl.mode == "baseline" and bl.reference == "base build in B/x.json"


def test_noisy_note_at_the_five_percent_boundary():
    assert compare.noise_notes([100.0, 100.0, 100.0, 100.0, 100.0]) == []
    noisy = [90.0, 95.0, 100.0, 105.0, 110.0]  # IQR 10 of median 100
    assert compare.noise_notes(noisy) == ["IQR is 10% of the median: the machine was noisy"]
    assert compare.noise_notes([100.0] * 5, noisy) == ["IQR is 10% of the median: the machine was noisy"]
    at_limit = [97.5, 97.5, 100.0, 102.5, 102.5]  # IQR exactly 5%: not noted
    assert stats.iqr(at_limit) == pytest.approx(5.0) and compare.noise_notes(at_limit) == []
    assert compare.noise_notes([0.5, 0.5, 1.0, 1.5, 1.5]) == ["IQR is 100% of the median: the machine was noisy"]


def test_case_notes_come_from_both_builds():
    results = make_results({"a": 1.0})
    results.cases[0].samples["base"] = [90.0, 95.0, 100.0, 105.0, 110.0] * 10
    (case,) = compare.compare_ab(results, 0.03, 0.95).cases
    assert case.notes == ["IQR is 10% of the median: the machine was noisy"]


def test_unpaired_note_only_when_rounds_are_missing():
    results = make_results({"a": 1.0}, n=8)
    results.cases[0].samples["candidate"].pop()
    (case,) = compare.compare_ab(results, 0.03, 0.95).cases
    assert case.notes == ["1 unpaired round(s) left out of the paired test"] and case.effect.n_base == 7


def test_regret_validates_the_sweep():
    case = make_results({"a": 1.0}).cases[0]
    for bad in ({"8": [1.0, True]}, {"8": [1.0, 0.0]}, {"x": [1.0]}, {"8": "1"}, {"8": [math.inf]}):
        case.extra["block_sizes_us"] = bad
        with pytest.raises(DataError, match=r"^case a: block_sizes_us\["):
            kernel_subject.regret(case)
    case.extra["block_sizes_us"] = [1.0]
    with pytest.raises(DataError, match=r"^case a: block_sizes_us and block_size_m should be objects$"):
        kernel_subject.regret(case)
    case.extra["block_sizes_us"] = {"8": [1.0]}
    case.info["block_size_m"] = [8]
    with pytest.raises(DataError, match="should be objects"):
        kernel_subject.regret(case)
    case.info["block_size_m"] = {}
    assert kernel_subject.regret(case) is None  # no picks recorded: no regret, whatever the sweep
    case.info["block_size_m"] = {"base": 8, "candidate": 64}  # 64 was not swept
    assert kernel_subject.regret(case) == {"best_block_size_m": 8, "base": 0.0, "candidate": None}


def test_failed_cases_are_fail_rows_without_timings():
    results = make_results({"a": 1.0})
    results.settings["failed_cases"] = {"b": "b: NaN in the output"}
    results.settings["expected_cases"] = ["a", "b"]
    from ci.core.jsonio import dumps

    rows = json.loads(dumps(compare.compare_ab(results, 0.03, 0.95).to_json()))["cases"]
    failed = next(r for r in rows if r["id"] == "b")
    assert failed["unit"] == "-" and failed["measured_median"] is None and failed["verdict"] == "FAIL"
    assert failed["effect"] is None and failed["notes"] == ["not timed: b: NaN in the output"]


def test_fraction_options_are_strictly_between_0_and_1():
    assert compare.fraction("0.999") == 0.999 and compare.fraction("0.001") == 0.001
    for bad in ("0", "1", "1.5", "-0.1"):
        with pytest.raises(compare.argparse.ArgumentTypeError, match="must lie strictly between 0 and 1"):
            compare.fraction(bad)
    with pytest.raises(compare.argparse.ArgumentTypeError, match=r"^malformed fraction 'x'$"):
        compare.fraction("x")


def test_outputs_land_in_a_new_nested_folder_with_nothing_left_behind(tmp_path, capsys):
    path = saved(make_results({"a": 1.0}), tmp_path / "r.json")
    out = tmp_path / "deep" / "er" / "out"
    assert compare.main(["--results", str(path), "--out-dir", str(out)]) == ExitCode.OK
    assert sorted(p.name for p in out.iterdir()) == [".gate-verdict", "plot.png", "report.md", "verdict.json"]
    assert f"gate: PASS; wrote {out / 'verdict.json'}, report.md, plot.png" in capsys.readouterr().out


# captures: the interval over fresh captures ---------------------------------------------------------


def test_a_capture_bias_widens_the_captured_interval_instead_of_failing():
    """Half the captures +3.5%, half -3.5% (a layout effect that follows the capture, not the build):
    per sample the interval is narrow and would sit wherever the one capture fell; over captures it is wide."""
    biased = _captured_results([1.035, 0.965] * 10)
    (case,) = compare.compare_ab(biased, 0.03, 0.95).cases
    assert case.effect.method == stats.METHOD_CAPTURES and case.effect.n_base == 60
    assert case.effect.ci_low < 1.0 < case.effect.ci_high and case.verdict == V.INCONCLUSIVE
    steady = _captured_results([1.06] * 20)
    (case,) = compare.compare_ab(steady, 0.03, 0.95).cases
    assert case.verdict == V.FAIL and case.effect.ratio == pytest.approx(1.06, rel=0.01)


def test_capture_medians_and_their_validation():
    assert stats.capture_medians([1.0, 3.0, 2.0, 10.0], [1, 1, 0, 0]) == [6.0, 2.0]
    with pytest.raises(ValueError, match="each sample needs its capture"):
        stats.capture_medians([1.0], [0, 1])
    r = _captured_results([1.0] * 8)
    r.cases[0].extra["captures"]["base"].pop()
    with pytest.raises(DataError, match=r"extra.captures\['base'\] should give the capture of each of its samples"):
        compare.compare_ab(r, 0.03, 0.95)
    one = _captured_results([1.0] * 1, rounds=10)  # a single capture: judged per sample, as one capture
    assert compare.compare_ab(one, 0.03, 0.95).cases[0].effect.method == stats.METHOD_PAIRED
    e = stats.capture_effect([1.0] * 8, [1.1] * 8)
    assert e.ratio == pytest.approx(1.1) and (e.n_base, e.n_candidate) == (8, 8)
    with pytest.raises(ValueError, match="captures must pair up"):
        stats.capture_effect([1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="timings must be positive"):
        stats.capture_effect([1.0, 0.0], [1.0, 1.0])


def test_too_few_captures_is_incomplete():
    """The kernel bench times every case in at least ci.kernel.bench.MIN_CAPTURES fresh captures: fewer, or results
    with none recorded, are not its evidence (the synthetic subject of the other tests asks one)."""
    assert evidence.run_problems(kernel_results(captures=6)) == []
    five = kernel_results(captures=5, rounds=3)
    assert evidence.run_problems(five)[:2] == [
        "case deepseek-v3/ep1/tpr8/gptq-int4-g128/bf16: 5 capture(s) of 'base', at least 6 are needed (the interval "
        "is over captures)",
        "case deepseek-v3/ep1/tpr8/gptq-int4-g128/bf16: 5 capture(s) of 'candidate', at least 6 are needed (the "
        "interval is over captures)",
    ]
    one = kernel_results(captures=1, rounds=10)
    for case in one.cases:
        del case.extra["captures"]  # one capture, as the bench timed before captures
    assert len(evidence.run_problems(one)) == 2 * len(one.cases)
    assert evidence.run_problems(_captured_results([1.0] * 2, rounds=5)) == []  # synthetic: one capture is enough


def test_baseline_mode_compares_captures_with_captures():
    stored, run = _captured_results([1.0] * 10), _captured_results([1.0] * 10)
    (case,) = compare.compare_baseline(run, stored, "base", 0.03, 0.95, "B").cases
    assert case.effect.method == stats.METHOD_CAPTURES_BASELINE and case.effect.n_base == 30 and not case.notes
    run.cases[0].extra["captures"]["base"] = [b + 10 for b in run.cases[0].extra["captures"]["base"]]
    (case,) = compare.compare_baseline(run, stored, "base", 0.03, 0.95, "B").cases
    assert case.effect.method == stats.METHOD_CAPTURES_UNPAIRED and case.effect.n_base == 30, "other captures: unpaired"
    legacy = make_results({"a": 1.0})
    (case,) = compare.compare_baseline(run, legacy, "base", 0.03, 0.95, "B").cases
    assert case.effect.method == stats.METHOD_UNPAIRED
    assert case.notes == ["one side was timed in one capture: the interval leaves the capture error out"]


def test_baseline_mode_pairs_capture_b_with_the_baselines_capture_b():
    """Capture b draws the same inputs in every run (seeded by case and b): a capture-to-capture spread of the work
    (here 0.8x-1.2x) cancels in the pairs, so an unchanged build passes with a narrow interval, and a +5% FAILs."""
    spread = [0.8 + 0.4 * b / 9 for b in range(10)]
    stored = _captured_results([1.0] * 10)
    for side in ("base", "candidate"):
        ids = stored.cases[0].extra["captures"][side]
        stored.cases[0].samples[side] = [x * spread[b] for x, b in zip(stored.cases[0].samples[side], ids, strict=True)]
    same, slower = _captured_results([1.0] * 10), _captured_results([1.05] * 10)
    for run in (same, slower):
        run.cases[0].samples = {
            k: [x * spread[b] for x, b in zip(v, run.cases[0].extra["captures"][k], strict=True)]
            for k, v in run.cases[0].samples.items()
        }
    (ok,) = compare.compare_baseline(same, stored, "base", 0.03, 0.95, "B").cases
    assert ok.verdict == V.PASS and ok.effect.ci_high - ok.effect.ci_low < 0.01
    (bad,) = compare.compare_baseline(slower, stored, "candidate", 0.03, 0.95, "B").cases
    assert bad.verdict == V.FAIL and bad.effect.ratio == pytest.approx(1.05, abs=0.005)
    medians = [
        stats.capture_medians(r.cases[0].samples["base"], r.cases[0].extra["captures"]["base"]) for r in (stored, same)
    ]
    unpaired = stats.unpaired_effect(*medians)
    assert unpaired.ci_high - unpaired.ci_low > 0.1, "without the pairing the spread of the work hides everything"


def test_captured_verdicts_carry_their_options_and_judge_every_case():
    first, second = _captured_results([1.0] * 10), _captured_results([1.10] * 10)
    first.cases.append(second.cases[0])
    first.cases[1].id = "b"
    first.settings["expected_cases"] = ["a", "b"]
    gate = compare.compare_ab(first, 0.03, 0.99)
    assert [c.verdict for c in gate.cases] == [V.PASS, V.FAIL] and gate.overall == V.FAIL
    assert all((c.effect.confidence, c.effect.n_base, c.effect.n_candidate) == (0.99, 30, 30) for c in gate.cases)
    stored = _captured_results([1.0] * 10)
    stored.cases.append(_captured_results([1.0] * 10).cases[0])
    stored.cases[1].id = "b"
    bl = compare.compare_baseline(first, stored, "candidate", 0.03, 0.99, "B")
    assert [c.verdict for c in bl.cases] == [V.PASS, V.FAIL]
    assert all((c.effect.confidence, c.effect.n_base, c.effect.n_candidate) == (0.99, 30, 30) for c in bl.cases)


def test_captures_that_do_not_match_are_a_data_error():
    two = _captured_results([1.0, 1.0], rounds=6)  # two captures: timed in captures (and too few of them)
    assert compare.compare_ab(two, 0.03, 0.95).cases[0].effect.method == stats.METHOD_CAPTURES
    r = _captured_results([1.0] * 8)
    r.cases[0].extra["captures"] = [0, 1]
    with pytest.raises(DataError, match=r"extra.captures\['base'\]"):
        compare.compare_ab(r, 0.03, 0.95)
    r = _captured_results([1.0] * 8)
    r.cases[0].extra["captures"]["candidate"] = [0] * 24  # the candidate in one capture, the base in eight
    with pytest.raises(DataError, match="timed in different captures"):
        compare.compare_ab(r, 0.03, 0.95)
    for base, cand in (([1.0, 0.0], [1.0, 1.0]), ([1.0, 1.0], [1.0, -1.0])):
        with pytest.raises(ValueError, match=r"^timings must be positive$"):
            stats.capture_effect(base, cand)


def test_within_captures_takes_out_the_differences_between_captures():
    samples, captures = [100.0, 102.0, 98.0, 200.0, 204.0, 196.0], [0, 0, 0, 1, 1, 1]
    assert stats.within_captures(samples, captures) == pytest.approx([1.0, 1.02, 0.98, 1.0, 1.02, 0.98])


def test_the_noise_note_of_captured_results_looks_inside_the_captures():
    """Captures differ by design (fresh inputs each): a 2x spread between captures is no noise; within one it is."""
    base = [100.0, 101.0, 99.0, 200.0, 202.0, 198.0] * 2
    ids = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    case = CaseResult(
        id="a",
        unit="us",
        samples={"base": base, "candidate": list(base)},
        extra={"captures": {"base": ids, "candidate": ids}},
    )
    assert compare.noise_notes(base) != [], "over all samples the captures look like noise"
    assert compare.noise_notes(compare.capture_jitter(case, "base")) == []
    noisy = [100.0, 120.0, 80.0, 200.0, 240.0, 160.0] * 2
    case.samples["candidate"] = noisy
    assert compare.noise_notes(compare.capture_jitter(case, "candidate")) == [
        "IQR is 40% of the median: the machine was noisy"
    ]
    gate = compare.compare_ab(
        BenchResults(kind="kernel-bench", suite="s", provenance={}, settings={}, cases=[case]), 0.03, 0.95
    )
    assert gate.cases[0].notes == ["IQR is 40% of the median: the machine was noisy"]


def test_jitter_normalizes_only_well_formed_multi_capture_series():
    case = CaseResult(id="a", unit="us", samples={"base": [1.0, 2.0, 3.0, 4.0]})
    assert compare.capture_jitter(case, "base") == [1.0, 2.0, 3.0, 4.0], "no captures: the samples"
    case.extra["captures"] = {"base": [0, 0, 0, 0]}
    assert compare.capture_jitter(case, "base") == [1.0, 2.0, 3.0, 4.0], "one capture: the samples"
    case.extra["captures"] = {"base": [0, 1, 0]}
    with pytest.raises(DataError, match="should give the capture of each of its samples"):
        compare.capture_jitter(case, "base")  # ids that do not fit the samples: an error, as everywhere
    case.extra["captures"] = {"base": [0, 0, 1, 1]}
    two = compare.capture_jitter(case, "base")
    assert two == pytest.approx([2 / 3, 4 / 3, 6 / 7, 8 / 7]), "two captures: normalized"


def test_baseline_mode_notes_look_inside_captures_and_the_fallback_keeps_its_options():
    stored, run = _captured_results([1.0] * 10), _captured_results([1.0] * 10)
    ids = run.cases[0].extra["captures"]["candidate"]
    run.cases[0].samples["candidate"] = [
        x * (1 + 0.2 * b) for x, b in zip(run.cases[0].samples["candidate"], ids, strict=True)
    ]
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    assert not [n for n in case.notes if "IQR" in n], "a spread between captures is no noise"
    run.cases[0].extra["captures"]["candidate"] = [b + 10 for b in ids]  # other captures: the unpaired fallback
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.8, "B").cases
    assert case.effect.method.startswith(stats.METHOD_CAPTURES_UNPAIRED) and case.effect.confidence == 0.8
    assert (case.effect.n_base, case.effect.n_candidate) == (30, 30)


def test_baseline_picks_when_a_side_recorded_none():
    stored, run = _captured_results([1.0] * 10), _captured_results([1.0] * 10)
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    assert case.annotations["block_size_m"] == {"baseline": 16, "this run": 16}
    del stored.cases[0].info["block_size_m"]
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    assert case.annotations["block_size_m"] == {"baseline": None, "this run": 16} and not case.notes
    run.cases[0].info["block_size_m"] = {}
    stored.cases[0].info["block_size_m"] = {"candidate": 8}
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    assert case.annotations["block_size_m"] == {"baseline": 8, "this run": None}
    del stored.cases[0].info["block_size_m"]
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    assert case.annotations["block_size_m"] is None


def test_slug_names_the_machine():
    assert baselines.slug("NVIDIA H200", 8) == "nvidia-h200-x8"
    assert baselines.slug("NVIDIA GeForce RTX 4090", 1) == "nvidia-geforce-rtx-4090-x1"
    assert baselines.slug("  A--B  ", 2) == "a-b-x2"
