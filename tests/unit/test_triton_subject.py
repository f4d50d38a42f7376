"""The Triton fused-MoE bench as a subject of the core: its cases, the regret table, its evidence rules and
its verdicts through ``ci.core.compare`` (no GPU: results files as the bench writes them)."""

from __future__ import annotations

import json

import pytest

from ci.core import compare, subjects
from ci.core.errors import DataError, ExitCode, UsageError
from ci.core.results import load_results
from ci.triton_moe import bench, suites
from ci.triton_moe import subject as triton_subject
from tests.unit.factories import saved, triton_results


def test_cases_rows_and_the_non_ep_caller():
    cases = suites.suite_cases("default")
    assert len(cases) == 2 * 3 * 4 and len({c.id for c in cases}) == len(cases)
    case = suites.TritonCase("deepseek-v3", 8, 64)
    assert (case.id, case.rows, case.global_num_experts) == ("deepseek-v3/ep8/tpr64/bf16", 512, 256)
    assert suites.TritonCase("qwen3-30b-a3b", 1, 8).global_num_experts == -1
    assert [c.id for c in suites.suite_cases("default", "*/ep8/tpr128/*,qwen3*/ep1/tpr8/*")] == [
        "qwen3-30b-a3b/ep1/tpr8/bf16",
        "qwen3-30b-a3b/ep8/tpr128/bf16",
        "deepseek-v3/ep8/tpr128/bf16",
    ]
    with pytest.raises(UsageError, match="matches no case of the suite 'quick'"):
        suites.suite_cases("quick", "nothing/*")
    with pytest.raises(UsageError, match="has the suites default, quick"):
        suites.suite_cases("nightly")


def test_the_sweep_and_config_labels():
    configs = suites.sweep_configs()
    assert len(configs) == 12 and len({suites.config_label(c) for c in configs}) == 12
    assert (
        suites.config_label(
            {
                "BLOCK_SIZE_M": 16,
                "BLOCK_SIZE_N": 64,
                "BLOCK_SIZE_K": 128,
                "num_warps": 4,
                "num_stages": 2,
                "GROUP_SIZE_M": 16,
            }
        )
        == "m16-n64-k128-w4-s2-g16"
    )
    assert suites.config_label({"BLOCK_SIZE_M": 16, "SPLIT_K": 1}) == "m16-nNone-kNone-wNone-sNone"


def test_regret_is_each_choice_against_the_best_config_timed():
    (case, *_) = triton_results().cases
    found = triton_subject.regret(case)
    assert found["best_config"] == "m32-n64-k64-w4-s3"
    assert found["base"] == pytest.approx(100.5 / 90 - 1) and found["candidate"] == pytest.approx(120.5 / 90 - 1)
    assert triton_subject.regret_text(found) == "best m32-n64-k64-w4-s3: base +12%, candidate +34%"
    case.info["config_label"]["candidate"] = "not-timed"
    assert triton_subject.regret(case)["candidate"] is None
    case.extra["configs_us"]["m32-n64-k64-w4-s3"] = [0.0]
    with pytest.raises(DataError, match="should be a non-empty list of positive times"):
        triton_subject.regret(case)
    case.extra["configs_us"] = {}
    assert triton_subject.regret(case) is None and triton_subject.regret_text(None) == "-"


def test_ab_verdicts_through_the_core(tmp_path):
    assert bench.KIND in subjects.kinds()
    path = saved(triton_results(), tmp_path / "same" / "triton-moe-results.json")
    assert compare.main(["--results", str(path), "--out", str(tmp_path / "v1")]) == ExitCode.OK
    verdict = json.loads((tmp_path / "v1" / "verdict.json").read_text())
    first = verdict["cases"][0]
    assert first["annotations"]["config"] == {"base": "m64-n128-k64-w8-s3", "candidate": "m16-n64-k128-w4-s4"}
    report = (tmp_path / "v1" / "report.md").read_text()
    assert "config (base -> candidate)" in report and "m64-n128-k64-w8-s3 -> m16-n64-k128-w4-s4" in report
    slow = triton_results(ratio_of=lambda cid: 1.10 if cid == "deepseek-v3/ep8/tpr64/bf16" else 1.0)
    path = saved(slow, tmp_path / "slow" / "triton-moe-results.json")
    assert compare.main(["--results", str(path), "--out", str(tmp_path / "v2")]) == ExitCode.FAILED
    failed = [
        c["id"] for c in json.loads((tmp_path / "v2" / "verdict.json").read_text())["cases"] if c["verdict"] == "FAIL"
    ]
    assert failed == ["deepseek-v3/ep8/tpr64/bf16"]


def test_a_run_is_complete_only_with_every_case_its_captures_and_agreeing_outputs(tmp_path):
    results = triton_results()
    results.cases.pop()
    path = saved(results, tmp_path / "a" / "triton-moe-results.json")
    assert compare.main(["--results", str(path), "--out", str(tmp_path / "va")]) == ExitCode.INCOMPLETE
    few = triton_results(captures=5)
    path = saved(few, tmp_path / "b" / "triton-moe-results.json")
    assert compare.main(["--results", str(path), "--out", str(tmp_path / "vb")]) == ExitCode.INCOMPLETE
    assert triton_subject.case_problems(load_results(path).cases[0]) == []
    bad = triton_results()
    bad.cases[0].extra["correctness"] = {"ok": False, "error": "rel L2 2e-1"}
    assert triton_subject.case_problems(bad.cases[0]) == ["the builds' outputs disagree (rel L2 2e-1)"]
    del bad.cases[1].extra["correctness"]
    assert "no correctness check recorded" in triton_subject.case_problems(bad.cases[1])[0]
    bad.cases[2].extra["correctness"] = {"ok": "yes"}
    with pytest.raises(DataError, match="a boolean 'ok'"):
        triton_subject.case_problems(bad.cases[2])
    path = saved(bad, tmp_path / "c" / "triton-moe-results.json")
    with pytest.raises(DataError, match=r"extra\.correctness\.ok should be true or false, found 'yes'"):  # named
        compare.main(["--results", str(path), "--out", str(tmp_path / "vc")])
    bad.cases[2].extra["correctness"] = {"ok": True}
    path = saved(bad, tmp_path / "d" / "triton-moe-results.json")
    assert compare.main(["--results", str(path), "--out", str(tmp_path / "vd")]) == ExitCode.INCOMPLETE
    other = triton_results()
    other.suite = "nightly"
    with pytest.raises(DataError, match="not one the Triton fused-MoE bench defines"):
        triton_subject.expected_cases(other)


def test_baseline_mode_notes_a_changed_choice():
    (case, *_) = triton_results().cases
    (stored, *_) = triton_results(seed=1).cases
    stored.info["config_label"] = {"base": "m32-n64-k128-w4-s3", "candidate": "m16-n64-k128-w4-s4"}
    note = triton_subject.annotate(case, stored, "base")
    assert note.data["config"] == {"baseline": "m32-n64-k128-w4-s3", "this run": "m64-n128-k64-w8-s3"}
    assert note.notes == [
        "the base build chose m32-n64-k128-w4-s3 in the baseline and m64-n128-k64-w8-s3 now: "
        "different kernels were timed"
    ]
    assert set(note.data["regret"]) == {"best_config", "base"}
    assert triton_subject.annotate(case, stored, "candidate").notes == []


def test_the_bench_refuses_a_plan_without_an_interval():
    with pytest.raises(UsageError, match="at least 6 captures"):
        bench.check_plan(5, 30, 3)
    with pytest.raises(UsageError, match="each capture at least one round"):
        bench.check_plan(10, 5, 3)
    with pytest.raises(UsageError, match="--sweep-repeats -1"):
        bench.check_plan(6, 6, -1)
    bench.check_plan(6, 6, 0)


def test_the_subjects_messages_and_columns_say_what_to_do():
    """The exact words a user reads: the columns of both modes, the evidence problems, the refusals."""
    assert triton_subject.columns("ab") == ("config (base -> candidate)", "regret vs best config timed")
    assert triton_subject.columns("baseline") == ("config (baseline -> this run)", "regret vs best config timed")
    (case, other, *_) = triton_results().cases
    cells = triton_subject.annotate(case, None, None).cells
    assert cells == {
        "config (base -> candidate)": "m64-n128-k64-w8-s3 -> m16-n64-k128-w4-s4",
        "regret vs best config timed": "best m32-n64-k64-w4-s3: base +12%, candidate +34%",
    }
    assert set(triton_subject.annotate(case, other, "base").cells) == set(triton_subject.columns("baseline"))
    labels = other.info.pop("config_label")  # none recorded: no label known
    assert triton_subject.annotate(other, None, None).cells["config (base -> candidate)"] == "? -> ?"
    other.info["config_label"] = str(labels)  # not a mapping
    with pytest.raises(DataError, match=r"^case .*: extra.configs_us and info.config_label should be objects$"):
        triton_subject.regret(other)
    case.extra["correctness"] = {"ok": False}
    assert triton_subject.case_problems(case) == ["the builds' outputs disagree (no detail)"]
    del case.extra["correctness"]
    assert triton_subject.case_problems(case) == [
        "no correctness check recorded: the bench times a case only after both builds agree; re-run it"
    ]
    results = triton_results()
    results.suite = "nightly"
    with pytest.raises(DataError) as err:
        triton_subject.expected_cases(results)
    assert str(err.value) == (
        "suite 'nightly' is not one the Triton fused-MoE bench defines (default, quick): these "
        "results were not written by this gate's bench; re-run it"
    )


def test_a_runs_case_filter_is_its_own_not_the_files_word_for_completeness():
    results = triton_results("default")
    results.settings["case_filter"] = "qwen3*/ep8/*"
    assert triton_subject.expected_cases(results) == [c.id for c in suites.suite_cases("default", "qwen3*/ep8/*")]
    assert len(triton_subject.expected_cases(results)) == 4
    results.settings["case_filter"] = "nothing/*"
    with pytest.raises(DataError, match=r"^settings.case_filter: --cases 'nothing/\*' matches no case"):
        triton_subject.expected_cases(results)
