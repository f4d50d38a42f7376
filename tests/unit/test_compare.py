"""The gate end to end on synthetic results: verdicts, exit codes, baselines, reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci.core import baselines, compare, report, stats
from ci.core.errors import ExitCode, UsageError
from ci.core.results import BenchResults, load_results
from ci.kernel import subject as kernel_subject
from tests.unit.factories import make_results


@pytest.fixture(autouse=True)
def no_job_summary(monkeypatch):
    """Keep these runs out of a real GitHub job summary (act and Actions set the variable)."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


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


def test_h200_tpot_ab_of_six_launch_pairs_passes_with_its_interval_over_the_pairs(tmp_path):
    """The committed H200 TPOT A/B of launch pairs (N = 1, so no EP: the patch changes nothing the server runs,
    equal builds must PASS), its report's launch pairs and rounds, and the x1 baseline recorded from it."""
    ab = REPORTS / "tpot-launch-pairs" / "pr-ab.json"
    assert compare.main(["--results", str(ab), "--out", str(tmp_path / "ab")]) == ExitCode.OK
    verdict = json.loads((tmp_path / "ab" / "verdict.json").read_text())
    (case,) = verdict["cases"]
    assert (round(case["effect"]["ci_low"], 3), round(case["effect"]["ratio"], 3)) == (0.997, 1.0)
    assert case["effect"]["method"] == stats.METHOD_BLOCKED and case["effect"]["n_base"] == 12
    text = (tmp_path / "ab" / "report.md").read_text()
    assert "| 0 | base | 63.1 / 63.0 | 0 (0 s, no) | 7.186 | 7.195 | 1.0012 | 1.0027 |" in text
    assert "| 24 | 5 | candidate | 7.191 | 7.206 |" in text and text.count("| candidate | 7.") == 12
    stored = Path(__file__).parents[2] / "baselines" / "nvidia-h200-x1" / "tpot-qwen3-30b-a3b-like-dp1-pr.json"
    assert stored.read_bytes() == ab.read_bytes()


def test_h200_tpot_runs_of_one_launch_pair_are_incomplete_and_still_reported(tmp_path):
    """The H200 TPOT A/B and A/A recorded before launch pairs (8 rounds a build in one pair): INCOMPLETE now,
    with every round still in the report."""
    ab = REPORTS / "tpot-pr-ab.json"
    assert compare.main(["--results", str(ab), "--out-dir", str(tmp_path / "ab")]) == ExitCode.INCOMPLETE
    text = (tmp_path / "ab" / "report.md").read_text()
    assert "| 1 | 0 | base | 7.595 |" in text and text.count("| candidate |") == 8
    assert "8 sample(s) of 'base', at least 12 are needed" in text and "A/A run" not in text
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
        .endswith("(nox -s bench writes kernel-results.json; nox -s tpot writes tpot-results.json)")
    )
