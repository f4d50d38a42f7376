"""The verdict logic piece by piece (``ci.core.compare``, ``ci.core.evidence``, ``ci.core.baselines``): exact values,
exact messages, and each boundary, so that a changed operator or constant fails a test (the
mutation testing of ``nox -s mutation`` found these gaps)."""

from __future__ import annotations

import json
import math
import os
import stat

import pytest

from ci.core import baselines, compare, evidence, stats
from ci.core.errors import DataError, ExitCode, UsageError
from ci.core.results import BenchResults, CaseResult, load_results
from ci.kernel import subject as kernel_subject
from tests.unit.factories import GPU, kernel_results, make_results
from tests.unit.factories import blocked_results as _blocked_results

V = stats.Verdict


@pytest.fixture(autouse=True)
def no_job_summary(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def _save(results: BenchResults, path) -> str:
    results.save(path)
    return str(path)


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
    assert payload["kind"] == "gate-verdict" and payload["schema_version"] == compare.VERDICT_VERSION == 2
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
    path = _save(make_results({"a": 1.0}), tmp_path / "r.json")
    out = tmp_path / "deep" / "er" / "out"
    assert compare.main(["--results", path, "--out-dir", str(out)]) == ExitCode.OK
    assert sorted(p.name for p in out.iterdir()) == [".gate-verdict", "plot.png", "report.md", "verdict.json"]
    assert f"gate: PASS; wrote {out / 'verdict.json'}, report.md, plot.png" in capsys.readouterr().out


# ci.core.evidence -----------------------------------------------------------------------------------


def test_evidence_messages(tmp_path):
    r = make_results({})
    r.settings.update(expected_cases=[], complete=True)
    assert evidence.run_problems(r) == ["the results hold no case: nothing was measured"]
    r = make_results({"a": 1.0})
    r.settings.update(complete=False, rounds_done=4)
    assert evidence.run_problems(r) == [
        "the run did not finish (complete: false, 4 rounds done): re-run it, or rebuild it from its folder only "
        "to look at it"
    ]
    del r.settings["rounds_done"]
    assert evidence.run_problems(r)[0].startswith("the run did not finish (complete: false): re-run it")
    r = make_results({"a": 1.0, "z": 1.0})
    r.settings["expected_cases"] = ["a", "b", "c", "d", "e", "f", "g", "h"]  # the synthetic subject's suite
    assert evidence.run_problems(r) == [
        "7 of the 8 cases of suite 'unit' are missing: b, c, d, e, f and 2 more",
        "1 cases are not in suite 'unit' as the gate defines it: z",
    ]


def test_sample_floor_is_exactly_min_samples():
    assert evidence.MIN_SAMPLES == 6
    assert evidence.run_problems(make_results({"a": 1.0}, n=6)) == []
    assert evidence.run_problems(make_results({"a": 1.0}, n=5)) == [
        "case a: 5 sample(s) of 'base', at least 6 are needed",
        "case a: 5 sample(s) of 'candidate', at least 6 are needed",
    ]
    assert evidence.run_problems(make_results({"a": 1.0}, n=5), sides=("candidate",)) == [
        "case a: 5 sample(s) of 'candidate', at least 6 are needed"
    ]


def test_rounds_and_correctness_problems():
    r = make_results({"a": 1.0})
    r.cases[0].extra["rounds"] = [{"completed": 256, "failed": 0}, {"completed": 1, "failed": 0}]
    assert evidence.run_problems(r) == []
    r.cases[0].extra["rounds"].append("junk")
    with pytest.raises(DataError, match=r"each of extra\.rounds should be an object with integer 'failed' and"):
        evidence.run_problems(r)
    r.cases[0].extra["rounds"] = [{"completed": 256, "failed": False}]  # a boolean is no count
    with pytest.raises(DataError, match=r"found \{'completed': 256, 'failed': False\}"):
        evidence.run_problems(r)
    r.cases[0].extra["rounds"] = [{"completed": 0, "failed": 0}, {"completed": 250, "failed": 6}]
    assert evidence.run_problems(r) == ["case a: 2 round(s) with failed requests; see the server logs and re-run"]
    r.cases[0].extra = {"correctness": {"ok": False, "error": "rel L2 0.7"}}
    assert evidence.run_problems(r) == ["case a: the builds' outputs disagree (rel L2 0.7)"]
    r.cases[0].extra = {"correctness": {"ok": False}}
    assert evidence.run_problems(r) == ["case a: the builds' outputs disagree (no detail)"]
    for bad in ({"identical": True, "rel_l2": 0.0}, {"ok": "false"}, "ok"):  # no "ok", a string, no object
        r.cases[0].extra = {"correctness": bad}
        with pytest.raises(DataError, match=r"extra\.correctness should be an object with a boolean 'ok'"):
            evidence.run_problems(r)


def test_failed_cases_must_be_a_mapping_of_reasons(tmp_path):
    r = make_results({"a": 1.0})
    r.settings["failed_cases"] = {"b": "b: candidate differs"}
    assert evidence.failed_cases(r) == {"b": "b: candidate differs"}
    for bad in (["b"], {"b": 3}):
        r.settings["failed_cases"] = bad
        with pytest.raises(DataError, match=r"settings.failed_cases should map case ids to reasons"):
            load_results(_p(r, tmp_path / "f.json"))


def test_baseline_problems_check_only_the_compared_side_and_declared_identity():
    stored = make_results({"a": 1.0, "b": 1.0})
    run = make_results({"a": 1.0, "b": 1.0}, seed=2)
    del run.cases[0].samples["base"]  # judged on the candidate: the base side is not needed
    assert evidence.baseline_problems(run, stored, "candidate") == []
    run.settings["identity_keys"] = ["model", "dp"]
    run.cases[0].info.update(model="m", dp=2, extra="x")
    stored.cases[0].info.update(model="m", extra="y")  # dp only in the run: not comparable, not a problem
    assert evidence.baseline_problems(run, stored, "candidate") == []
    stored.cases[0].info["dp"] = 1
    stored.cases[1].info["model"] = "other"  # only in the baseline: nothing to compare with
    assert evidence.baseline_problems(run, stored, "candidate") == [
        "case a: dp differ from the baseline's: it measured something else; compare like with like, or "
        "re-record the baseline"
    ]
    run.cases[0].info["model"] = "n"
    assert "case a: model, dp differ" in evidence.baseline_problems(run, stored, "candidate")[0]
    short = make_results({"a": 1.0}, seed=5)
    assert evidence.baseline_problems(short, stored, "candidate") == [
        "1 of the baseline's 2 cases are not in this run: b; run the whole suite (a subset cannot pass for it)"
    ]


# ci.core.baselines ----------------------------------------------------------------------------------


def test_record_force_replaces_and_without_it_refuses(tmp_path):
    bdir = tmp_path / "b"
    first = baselines.record(_p(make_results({"a": 1.0}), tmp_path / "1.json"), bdir)
    assert stat.S_IMODE(os.stat(first).st_mode) == 0o644
    second = _p(make_results({"a": 1.0}, seed=8), tmp_path / "2.json")
    with pytest.raises(UsageError, match=r"exists; pass --force to replace it \(the old one is kept in git history\)"):
        baselines.record(second, bdir)
    assert baselines.record(second, bdir, force=True) == first
    assert json.loads(first.read_text()) == json.loads(second.read_text())
    assert sorted(p.name for p in first.parent.iterdir()) == ["unit.json"], "a temporary file was left behind"


def _p(results, path):
    results.save(path)
    return path


def test_record_messages_and_refusals(tmp_path):
    r = make_results({"a": 1.0})
    r.provenance = {"gpu": {"gpus": []}}
    with pytest.raises(UsageError, match="names no GPU in its provenance; only GPU runs can be baselines"):
        baselines.record(_p(r, tmp_path / "nogpu.json"), tmp_path / "b")
    aa = make_results({"a": 1.0})
    aa.settings["aa"] = True
    with pytest.raises(UsageError, match=r"it measures noise, not a build; record the results of an A/B run instead$"):
        baselines.record(_p(aa, tmp_path / "aa.json"), tmp_path / "b")
    few = _p(make_results({"a": 1.0}, n=2), tmp_path / "few.json")
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
    assert load_results(_p(make_results({"a": 1.0}), tmp_path / "k.json")).kind == "synthetic-bench"


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

    path = _p(make_results({"a": 1.0}), tmp_path / "r.json")
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
    path = _p(make_results({"a": 1.0}), tmp_path / "r.json")
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
    assert report.MARKS == {V.PASS: "PASS", V.FAIL: "**FAIL**", V.INCONCLUSIVE: "~INCONCLUSIVE",
                            V.NO_BASELINE: "NO_BASELINE", V.INCOMPLETE: "**INCOMPLETE**"}  # fmt: skip


# ci.core.results: what a results file must hold, and the file named in every refusal --------------


def _payload(**changes):
    payload = make_results({"a": 1.0}).to_json()
    payload.update(changes)
    return payload


def _load(tmp_path, payload):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(payload))
    return path, load_results(path)


def test_optional_fields_default_and_gpu_key(tmp_path):
    payload = _payload(provenance={})
    for field in ("info", "extra"):
        del payload["cases"][0][field]
    _, r = _load(tmp_path, payload)
    assert r.cases[0].info == {} and r.cases[0].extra == {} and r.gpu_key() == ("unknown", 0)
    _, r = _load(tmp_path, _payload(provenance={"gpu": {"driver": "1"}}))
    assert r.gpu_key() == ("unknown", 0)
    _, r = _load(tmp_path, _payload(provenance={"gpu": {"gpus": [{"name": "X"}, {"name": "X"}]}}))
    assert r.gpu_key() == ("X", 2)
    _, r = _load(tmp_path, _payload())
    assert r.cases[0].samples["base"][0] > 1 and min(_payload()["cases"][0]["samples"]["base"]) > 0
    small = _payload()
    small["cases"][0]["samples"]["base"] = [0.25] * 50  # times below 1 are times
    assert _load(tmp_path, small)[1].cases[0].samples["base"][0] == 0.25


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda p: p["cases"][0]["samples"]["base"].__setitem__(0, 0.0),
            "case 'a', build 'base': samples must be positive",
        ),
        (lambda p: p["cases"][0].update(samples={}), "case 'a' has no samples"),
        (lambda p: p["cases"][0].update(samples=[1.0]), "case 'a' has no samples"),
        (lambda p: p["cases"][0].update(extra=3), "case 'a': field 'extra' should be an object, found 3"),
        (lambda p: p["cases"][0].update(info="x"), "case 'a': field 'info' should be an object, found 'x'"),
        (lambda p: p["cases"][0].pop("unit"), "missing field 'unit'"),
        (lambda p: p["cases"][0].pop("id"), "missing field 'id'"),
        (lambda p: p["cases"].append(7), "each case must be an object, found 7"),
        (lambda p: p.pop("cases"), "missing field 'cases'"),
        (lambda p: p.pop("suite"), "missing field 'suite'"),
        (lambda p: p.update(settings=[]), "field 'settings' should be"),
        (lambda p: p.update(provenance=1), "field 'provenance' should be"),
        (lambda p: p["provenance"].update(gpu=["H200"]), "provenance.gpu should be an object"),
        (lambda p: p["provenance"]["gpu"].update(gpus={"name": "x"}), "provenance.gpu.gpus should be a list"),
        (lambda p: p["provenance"]["gpu"].update(gpus=[{"index": 0}]), "objects with a 'name'"),
        (lambda p: p["provenance"]["gpu"].update(gpus=["H200"]), "objects with a 'name'"),
    ],
)
def test_each_refusal_names_the_file_and_the_field(tmp_path, edit, message):
    payload = _payload()
    edit(payload)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError) as err:
        load_results(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_a_file_of_another_kind_is_not_results(tmp_path):
    path = tmp_path / "v.json"
    path.write_text(json.dumps({"kind": "gate-verdict", "schema_version": 1}))
    with pytest.raises(DataError) as err:
        load_results(path)
    from ci.core import subjects  # the kinds subjects registered (here also the tests' own)

    assert str(err.value) == f"{path}: not a results file (kind 'gate-verdict', should be one of {subjects.kinds()})"
    assert {"kernel-bench", "tpot-bench"} <= set(subjects.kinds())
    with pytest.raises(DataError, match="expected a 'tpot-bench' file"):
        load_results(_p(make_results({"a": 1.0}), tmp_path / "k.json"), kind="tpot-bench")


# blocks: the interval over fresh captures ---------------------------------------------------------


def test_a_capture_bias_widens_the_blocked_interval_instead_of_failing():
    """Half the captures +3.5%, half -3.5% (a layout effect that follows the capture, not the build):
    per sample the interval is narrow and would sit wherever the one capture fell; over blocks it is wide."""
    biased = _blocked_results([1.035, 0.965] * 10)
    (case,) = compare.compare_ab(biased, 0.03, 0.95).cases
    assert case.effect.method == stats.METHOD_BLOCKED and case.effect.n_base == 60
    assert case.effect.ci_low < 1.0 < case.effect.ci_high and case.verdict == V.INCONCLUSIVE
    steady = _blocked_results([1.06] * 20)
    (case,) = compare.compare_ab(steady, 0.03, 0.95).cases
    assert case.verdict == V.FAIL and case.effect.ratio == pytest.approx(1.06, rel=0.01)


def test_block_medians_and_their_validation():
    assert stats.block_medians([1.0, 3.0, 2.0, 10.0], [1, 1, 0, 0]) == [6.0, 2.0]
    with pytest.raises(ValueError, match="each sample needs its block"):
        stats.block_medians([1.0], [0, 1])
    r = _blocked_results([1.0] * 8)
    r.cases[0].extra["blocks"]["base"].pop()
    with pytest.raises(DataError, match=r"extra.blocks\['base'\] should give the capture of each of its samples"):
        compare.compare_ab(r, 0.03, 0.95)
    one = _blocked_results([1.0] * 1, rounds=10)  # a single block: judged per sample, as one capture
    assert compare.compare_ab(one, 0.03, 0.95).cases[0].effect.method == stats.METHOD_PAIRED
    e = stats.blocked_effect([1.0] * 8, [1.1] * 8)
    assert e.ratio == pytest.approx(1.1) and (e.n_base, e.n_candidate) == (8, 8)
    with pytest.raises(ValueError, match="blocks must pair up"):
        stats.blocked_effect([1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="timings must be positive"):
        stats.blocked_effect([1.0, 0.0], [1.0, 1.0])


def test_too_few_captures_is_incomplete():
    """The kernel bench times every case in at least ci.kernel.bench.MIN_BLOCKS fresh captures: fewer, or results
    with none recorded, are not its evidence (the synthetic subject of the other tests asks one)."""
    assert evidence.run_problems(kernel_results(blocks=6)) == []
    five = kernel_results(blocks=5, rounds=3)
    assert evidence.run_problems(five)[:2] == [
        "case deepseek-v3/ep1/tpr8/gptq-int4-g128/bf16: 5 capture(s) of 'base', at least 6 are needed (the interval "
        "is over captures)",
        "case deepseek-v3/ep1/tpr8/gptq-int4-g128/bf16: 5 capture(s) of 'candidate', at least 6 are needed (the "
        "interval is over captures)",
    ]
    one = kernel_results(blocks=1, rounds=10)
    for case in one.cases:
        del case.extra["blocks"]  # one capture, as the bench timed before blocks
    assert len(evidence.run_problems(one)) == 2 * len(one.cases)
    assert evidence.run_problems(_blocked_results([1.0] * 2, rounds=5)) == []  # synthetic: one capture is enough


def test_baseline_mode_compares_captures_with_captures():
    stored, run = _blocked_results([1.0] * 10), _blocked_results([1.0] * 10)
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    assert case.effect.method == stats.METHOD_BLOCKED_BASELINE and case.effect.n_base == 30 and not case.notes
    run.cases[0].extra["blocks"]["candidate"] = [b + 10 for b in run.cases[0].extra["blocks"]["candidate"]]
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    assert case.effect.method == stats.METHOD_BLOCKED_UNPAIRED and case.effect.n_base == 30, "other blocks: unpaired"
    legacy = make_results({"a": 1.0})
    (case,) = compare.compare_baseline(run, legacy, "candidate", 0.03, 0.95, "B").cases
    assert case.effect.method == stats.METHOD_UNPAIRED
    assert case.notes == ["one side was timed in one capture: the interval leaves the capture error out"]


def test_baseline_mode_pairs_block_b_with_the_baselines_block_b():
    """Block b draws the same inputs in every run (seeded by case and b): a block-to-block spread of the work
    (here 0.8x-1.2x) cancels in the pairs, so an unchanged build passes with a narrow interval, and a +5% FAILs."""
    spread = [0.8 + 0.4 * b / 9 for b in range(10)]
    stored = _blocked_results([1.0] * 10)
    for side in ("base", "candidate"):
        ids = stored.cases[0].extra["blocks"][side]
        stored.cases[0].samples[side] = [x * spread[b] for x, b in zip(stored.cases[0].samples[side], ids, strict=True)]
    same, slower = _blocked_results([1.0] * 10), _blocked_results([1.05] * 10)
    for run in (same, slower):
        run.cases[0].samples = {k: [x * spread[b] for x, b in zip(v, run.cases[0].extra["blocks"][k], strict=True)]
                                for k, v in run.cases[0].samples.items()}  # fmt: skip
    (ok,) = compare.compare_baseline(same, stored, "base", 0.03, 0.95, "B").cases
    assert ok.verdict == V.PASS and ok.effect.ci_high - ok.effect.ci_low < 0.01
    (bad,) = compare.compare_baseline(slower, stored, "candidate", 0.03, 0.95, "B").cases
    assert bad.verdict == V.FAIL and bad.effect.ratio == pytest.approx(1.05, abs=0.005)
    medians = [stats.block_medians(r.cases[0].samples["base"], r.cases[0].extra["blocks"]["base"])
               for r in (stored, same)]  # fmt: skip
    unpaired = stats.unpaired_effect(*medians)
    assert unpaired.ci_high - unpaired.ci_low > 0.1, "without the pairing the spread of the work hides everything"


def test_blocked_verdicts_carry_their_options_and_judge_every_case():
    first, second = _blocked_results([1.0] * 10), _blocked_results([1.10] * 10)
    first.cases.append(second.cases[0])
    first.cases[1].id = "b"
    first.settings["expected_cases"] = ["a", "b"]
    gate = compare.compare_ab(first, 0.03, 0.99)
    assert [c.verdict for c in gate.cases] == [V.PASS, V.FAIL] and gate.overall == V.FAIL
    assert all((c.effect.confidence, c.effect.n_base, c.effect.n_candidate) == (0.99, 30, 30) for c in gate.cases)
    stored = _blocked_results([1.0] * 10)
    stored.cases.append(_blocked_results([1.0] * 10).cases[0])
    stored.cases[1].id = "b"
    bl = compare.compare_baseline(first, stored, "candidate", 0.03, 0.99, "B")
    assert [c.verdict for c in bl.cases] == [V.PASS, V.FAIL]
    assert all((c.effect.confidence, c.effect.n_base, c.effect.n_candidate) == (0.99, 30, 30) for c in bl.cases)


def test_blocks_that_do_not_match_are_a_data_error():
    two = _blocked_results([1.0, 1.0], rounds=6)  # two blocks: timed in blocks (and too few of them)
    assert compare.compare_ab(two, 0.03, 0.95).cases[0].effect.method == stats.METHOD_BLOCKED
    r = _blocked_results([1.0] * 8)
    r.cases[0].extra["blocks"] = [0, 1]
    with pytest.raises(DataError, match=r"extra.blocks\['base'\]"):
        compare.compare_ab(r, 0.03, 0.95)
    r = _blocked_results([1.0] * 8)
    r.cases[0].extra["blocks"]["candidate"] = [0] * 24  # the candidate in one block, the base in eight
    with pytest.raises(DataError, match="timed in different blocks"):
        compare.compare_ab(r, 0.03, 0.95)
    for base, cand in (([1.0, 0.0], [1.0, 1.0]), ([1.0, 1.0], [1.0, -1.0])):
        with pytest.raises(ValueError, match=r"^timings must be positive$"):
            stats.blocked_effect(base, cand)


def test_within_blocks_takes_out_the_differences_between_blocks():
    samples, blocks = [100.0, 102.0, 98.0, 200.0, 204.0, 196.0], [0, 0, 0, 1, 1, 1]
    assert stats.within_blocks(samples, blocks) == pytest.approx([1.0, 1.02, 0.98, 1.0, 1.02, 0.98])


def test_the_noise_note_of_blocked_results_looks_inside_the_blocks():
    """Blocks differ by design (fresh inputs each): a 2x spread between blocks is no noise; within one it is."""
    base = [100.0, 101.0, 99.0, 200.0, 202.0, 198.0] * 2
    ids = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    case = CaseResult(id="a", unit="us", samples={"base": base, "candidate": list(base)},
                      extra={"blocks": {"base": ids, "candidate": ids}})  # fmt: skip
    assert compare.noise_notes(base) != [], "over all samples the blocks look like noise"
    assert compare.noise_notes(compare.capture_jitter(case, "base")) == []
    noisy = [100.0, 120.0, 80.0, 200.0, 240.0, 160.0] * 2
    case.samples["candidate"] = noisy
    assert compare.noise_notes(compare.capture_jitter(case, "candidate")) == [
        "IQR is 40% of the median: the machine was noisy"
    ]
    gate = compare.compare_ab(BenchResults(kind="kernel-bench", suite="s", provenance={}, settings={}, cases=[case]),
                              0.03, 0.95)  # fmt: skip
    assert gate.cases[0].notes == ["IQR is 40% of the median: the machine was noisy"]


def test_jitter_normalizes_only_well_formed_multi_block_series():
    case = CaseResult(id="a", unit="us", samples={"base": [1.0, 2.0, 3.0, 4.0]})
    assert compare.capture_jitter(case, "base") == [1.0, 2.0, 3.0, 4.0], "no blocks: the samples"
    case.extra["blocks"] = {"base": [0, 0, 0, 0]}
    assert compare.capture_jitter(case, "base") == [1.0, 2.0, 3.0, 4.0], "one block: the samples"
    case.extra["blocks"] = {"base": [0, 1, 0]}
    with pytest.raises(DataError, match="should give the capture of each of its samples"):
        compare.capture_jitter(case, "base")  # ids that do not fit the samples: an error, as everywhere
    case.extra["blocks"] = {"base": [0, 0, 1, 1]}
    assert compare.capture_jitter(case, "base") == pytest.approx([2 / 3, 4 / 3, 6 / 7, 8 / 7]), "two blocks: normalized"


def test_baseline_mode_notes_look_inside_blocks_and_the_fallback_keeps_its_options():
    stored, run = _blocked_results([1.0] * 10), _blocked_results([1.0] * 10)
    ids = run.cases[0].extra["blocks"]["candidate"]
    run.cases[0].samples["candidate"] = [x * (1 + 0.2 * b) for x, b in zip(run.cases[0].samples["candidate"], ids,
                                                                         strict=True)]  # fmt: skip
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.95, "B").cases
    assert not [n for n in case.notes if "IQR" in n], "a spread between blocks is no noise"
    run.cases[0].extra["blocks"]["candidate"] = [b + 10 for b in ids]  # other blocks: the unpaired fallback
    (case,) = compare.compare_baseline(run, stored, "candidate", 0.03, 0.8, "B").cases
    assert case.effect.method == stats.METHOD_BLOCKED_UNPAIRED and case.effect.confidence == 0.8
    assert (case.effect.n_base, case.effect.n_candidate) == (30, 30)


def test_baseline_picks_when_a_side_recorded_none():
    stored, run = _blocked_results([1.0] * 10), _blocked_results([1.0] * 10)
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
