"""ci.core.baselines: recording, finding and refusing baselines, with exact messages and each boundary."""

from __future__ import annotations

import json
import math
import os
import stat

import pytest

from ci.core import baselines, compare, evidence, stats
from ci.core.errors import DataError, ExitCode, UsageError
from ci.core.results import load_results
from tests.unit.factories import make_results, saved

V = stats.Verdict


# ci.core.baselines ----------------------------------------------------------------------------------


def test_record_force_replaces_and_without_it_refuses(tmp_path):
    bdir = tmp_path / "b"
    first = baselines.record(saved(make_results({"a": 1.0}), tmp_path / "1.json"), bdir)
    assert stat.S_IMODE(os.stat(first).st_mode) == 0o644
    second = saved(make_results({"a": 1.0}, seed=8), tmp_path / "2.json")
    with pytest.raises(UsageError, match=r"exists; pass --force to replace it \(the old one is kept in git history\)"):
        baselines.record(second, bdir)
    assert baselines.record(second, bdir, force=True) == first
    assert json.loads(first.read_text()) == json.loads(second.read_text())
    assert sorted(p.name for p in first.parent.iterdir()) == ["unit.json"], "a temporary file was left behind"


def test_record_messages_and_refusals(tmp_path):
    r = make_results({"a": 1.0})
    r.provenance = {"gpu": {"gpus": []}}
    with pytest.raises(UsageError, match="names no GPU in its provenance; only GPU runs can be baselines"):
        baselines.record(saved(r, tmp_path / "nogpu.json"), tmp_path / "b")
    aa = make_results({"a": 1.0})
    aa.settings["aa"] = True
    with pytest.raises(UsageError, match=r"it measures noise, not a build; record the results of an A/B run instead$"):
        baselines.record(saved(aa, tmp_path / "aa.json"), tmp_path / "b")
    few = saved(make_results({"a": 1.0}, n=2), tmp_path / "few.json")
    with pytest.raises(Exception) as err:
        baselines.record(few, tmp_path / "b")
    assert str(err.value) == (
        f"{few} cannot be a baseline: case a: 2 sample(s) of 'base', at least 6 are needed; case a: 2 sample(s) of "
        "'candidate', at least 6 are needed. Record a complete, clean A/B run"
    )


@pytest.mark.parametrize("suite", ["a..b", "../x", "a/b", ".hidden", "", "x" * 129])
def test_suite_names_that_are_not_plain_are_refused(suite):
    r = make_results({"a": 1.0}, suite=suite)
    with pytest.raises(DataError, match="is not a plain name"):
        baselines.baseline_path(r)


def test_a_baseline_in_the_wrong_place_or_of_the_wrong_kind_is_an_error(tmp_path):
    bdir = tmp_path / "b"
    run = make_results({"a": 1.0})
    path = baselines.baseline_path(run, bdir)
    path.parent.mkdir(parents=True)
    moved = make_results({"a": 1.0})
    moved.suite = "other"  # same GPU, another suite, at this suite's path
    moved.save(path)
    with pytest.raises(DataError, match="re-record it"):
        baselines.load_baseline(run, bdir)
    payload = make_results({"a": 1.0}).to_json()
    payload["kind"] = "tpot-bench"
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError, match="expected a 'synthetic-bench' file"):
        baselines.load_baseline(run, bdir)
    path.unlink()
    with pytest.raises(Exception, match=r"record one with: nox -s update_baselines -- --results R\.json$"):
        baselines.load_baseline(run, bdir, results_path="R.json")
    assert load_results(saved(make_results({"a": 1.0}), tmp_path / "k.json")).kind == "synthetic-bench"


def test_baseline_mode_rows_for_cases_the_baseline_lacks_do_not_stop_the_rest():
    stored = make_results({"b": 1.0, "c": 1.0})
    run = make_results({"a": 1.0, "b": 1.10, "c": 1.0}, seed=4)  # a: new, first in the run
    gate = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B")
    new = gate.cases[0]
    assert (new.id, new.unit, new.verdict, new.reference_median, new.effect) == (
        "a",
        "us/call",
        V.NO_BASELINE,
        None,
        None,
    )
    assert new.measured_median == stats.median(run.cases[0].samples["candidate"])
    assert new.notes == ["not in the baseline: re-record it to include this case"]
    assert [c.verdict for c in gate.cases[1:]] == [V.FAIL, V.PASS] and gate.overall == V.FAIL
    run.settings["identity_keys"] = ["model"]
    run.cases[2].info["model"], stored.cases[1].info["model"] = "m1", "m2"
    assert evidence.baseline_problems(run, stored, "candidate") == [
        "case c: model differ from the baseline's: it measured something else; compare like with like, or "
        "re-record the baseline"
    ]


def test_notes_come_from_the_candidate_too_and_failed_rows_have_no_median():
    results = make_results({"a": 1.0})
    results.cases[0].samples["candidate"] = [90.0, 95.0, 100.0, 105.0, 110.0] * 10
    (case,) = compare.compare_ab(results, 0.03, 0.95).cases
    assert case.notes == ["IQR is 10% of the median: the machine was noisy"]
    results.settings["failed_cases"] = {"z": "z: crashed"}
    failed = compare.compare_ab(results, 0.03, 0.95).cases[0]
    assert failed.id == "z" and math.isnan(failed.measured_median)


def test_unpaired_effect_takes_times_below_one():
    e = stats.unpaired_effect([0.5, 0.51, 0.52, 0.49, 0.5, 0.5], [0.5, 0.5, 0.51, 0.5, 0.49, 0.5])
    assert e.ratio == pytest.approx(1.0, abs=0.02)


def test_ids_list_five_then_count():
    assert evidence.shown(["a", "b", "c", "d", "e"]) == "a, b, c, d, e"
    assert evidence.shown(list("abcdefg")) == "a, b, c, d, e and 2 more"


def test_suite_name_message():
    with pytest.raises(DataError) as err:
        baselines.baseline_path(make_results({"a": 1.0}, suite="../x"))
    assert str(err.value) == (
        "suite '../x' is not a plain name (letters, digits, '.', '_', '-'): a baseline's file name comes from it; "
        "re-create the results with a stage of this gate"
    )
    with pytest.raises(Exception, match=r"record one with: nox -s update_baselines -- --results RESULTS$"):
        baselines.load_baseline(make_results({"a": 1.0}), __import__("pathlib").Path("/nonexistent-dir"))


def test_baselines_cli_records_where_told_and_replaces_only_with_force(tmp_path, capsys):
    from ci.core.cli import run_main

    path = saved(make_results({"a": 1.0}), tmp_path / "r.json")
    bdir = tmp_path / "here"
    assert run_main(baselines.main, ["record", str(path), "--dir", str(bdir)]) == 0
    assert (bdir / "nvidia-h200-x1" / "unit.json").is_file()
    assert f"baselines: recorded {bdir / 'nvidia-h200-x1' / 'unit.json'}" in capsys.readouterr().out
    assert run_main(baselines.main, ["record", str(path), "--dir", str(bdir)]) == ExitCode.USAGE
    assert run_main(baselines.main, ["record", str(path), "--dir", str(bdir), "--force"]) == 0
    assert run_main(baselines.main, ["record", "--results", str(path), "--dir", str(bdir), "--force"]) == 0
    assert run_main(baselines.main, ["record", "--results", str(path), "--baseline-dir", str(bdir), "--force"]) == 0
    assert run_main(baselines.main, ["record", "--dir", str(bdir)]) == ExitCode.USAGE, "no results file"
    for argv in (["record"], ["record", str(path), "--results", str(path)]):  # none, or two
        with pytest.raises(UsageError, match=r"^record takes one results file: RESULTS or --results RESULTS$"):
            baselines.main([*argv, "--dir", str(bdir)])
    with pytest.raises(SystemExit) as exit_:
        baselines.main([])  # no subcommand: argparse's usage error
    assert exit_.value.code == 2


def test_gate_cli_in_baseline_mode_names_the_baseline_and_the_record_command(tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    path = saved(make_results({"a": 1.0}), tmp_path / "r.json")
    bdir = tmp_path / "b"
    args = ["--results", str(path), "--mode", "baseline", "--baseline-dir", str(bdir), "--out-dir", str(tmp_path / "o")]
    assert compare.main(args) == ExitCode.NO_BASELINE
    assert f"record one with: nox -s update_baselines -- --results {path}" in capsys.readouterr().out
    assert summary.read_text().startswith("### EP-Marlin gate: NO_BASELINE\n\nno baseline for suite 'unit'")
    baselines.record(path, bdir)
    assert compare.main(args) == ExitCode.OK
    verdict = json.loads((tmp_path / "o" / "verdict.json").read_text())
    assert verdict["reference"] == f"candidate build in {bdir / 'nvidia-h200-x1' / 'unit.json'}"


def test_duplicate_case_ids_are_refused(tmp_path):
    payload = make_results({"a": 1.0, "b": 1.0}).to_json()
    payload["cases"][1]["id"] = "a"
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError, match=r"duplicate case ids \['a'\]"):
        load_results(path)


def test_report_marks_each_verdict():
    from ci.core import report

    results = make_results({"fast": 1.0, "slow": 1.10})
    results.settings["expected_cases"] = ["fast", "slow", "gone"]
    text = report.markdown(compare.compare_ab(results, 0.03, 0.95))
    assert text.startswith("### EP-Marlin gate (synthetic-bench, suite `unit`): FAIL\n")
    assert "| slow |" in text and "| **FAIL** |" in text.split("| slow |")[1].split("\n")[0]
    assert "| PASS |" in text.split("| fast |")[1].split("\n")[0]
    assert "**Incomplete evidence**" in text and "- 1 of the 3 cases of suite 'unit' are missing: gone" in text
    assert report.MARKS == {
        V.PASS: "PASS",
        V.FAIL: "**FAIL**",
        V.INCONCLUSIVE: "~INCONCLUSIVE",
        V.NO_BASELINE: "NO_BASELINE",
        V.INCOMPLETE: "**INCOMPLETE**",
    }
