"""What each subject says a complete run is, and the cases it refuses as evidence (ci.core.subjects and the two
subjects of the gate), with the messages they give; the TPOT report's rounds table against a golden file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci.core import evidence, subjects
from ci.core.errors import DataError
from ci.core.results import CaseResult, load_results
from ci.kernel import subject as kernel_subject
from ci.serving import subject as serving_subject
from tests.unit.factories import kernel_results

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def test_the_kernel_suite_less_its_filter_is_what_a_complete_run_holds():
    subset = kernel_results("default", case_filter="deepseek-v3/ep8/*")
    assert len(subset.cases) == 16 and evidence.run_problems(subset) == []
    assert kernel_subject.expected_cases(subset) == [c.id for c in subset.cases]
    subset.settings["case_filter"] = "nothing/*"
    with pytest.raises(DataError) as err:
        kernel_subject.expected_cases(subset)
    assert str(err.value) == "settings.case_filter: --cases 'nothing/*' matches no case of suite 'default'"


def test_captures_come_from_the_captures_of_each_sample():
    case = kernel_results().cases[0]
    assert subjects.captures(case, "base") == 6
    del case.extra["captures"]
    assert subjects.captures(case, "base") == 1 and subjects.capture_ids(case, "base") is None
    for captures in ("junk", {"base": "0"}, {"base": [0] * 17}, {"base": [0.0] * 18}, {"base": [True] * 18}):
        case.extra["captures"] = captures
        with pytest.raises(DataError) as err:
            subjects.capture_ids(case, "base")
        expected = f"case {case.id}: extra.captures['base'] should give the capture of each of its samples"
        assert str(err.value) == expected
    case.extra["captures"] = {"other": [0]}
    with pytest.raises(DataError, match="should give the capture"):
        subjects.capture_ids(case, "other")  # captures for a build without samples


def test_a_kernel_case_without_its_correctness_check_is_no_evidence():
    case = kernel_results().cases[0]
    del case.extra["correctness"]
    assert kernel_subject.case_problems(case) == [
        "no correctness check recorded: the bench times a case only after both builds agree; re-run it"
    ]


def test_tpot_rounds_must_be_a_list_with_their_counts():
    case = CaseResult(id="t", unit="ms", samples={"base": [1.0]})
    assert serving_subject.case_problems(case) == ["no rounds recorded: re-run the TPOT stage"]
    case.extra["rounds"] = []
    assert serving_subject.case_problems(case) == ["no rounds recorded: re-run the TPOT stage"]
    case.extra["rounds"] = "junk"
    with pytest.raises(DataError, match=r"case t: extra.rounds should be a list of rounds, found 'junk'"):
        serving_subject.case_problems(case)


def _launch_pairs_run():
    """The committed H200 A/B of six launch pairs, with the gaps a record can have: pair 2 without its start-up
    and settling, pair 3's base rounds without the server's figure, pair 4 without its start order and its
    candidate without rounds."""
    results = load_results(ROOT / "reports" / "nvidia-h200-x1" / "tpot-launch-pairs" / "pr-ab.json")
    case = results.cases[0]
    pairs = case.extra["timeline"]["launches"]
    pairs[2].pop("startup_s")
    pairs[2]["settle"] = []
    pairs[4].pop("order")
    pairs[5]["settle"].append({"builds": ["base"], "runs": 6, "seconds": 13.6, "settled": True})
    for r in case.extra["rounds"]:
        if r["launch"] == 3 and r["build"] == "base":
            r["server_itl_ms"] = None
    case.extra["rounds"] = [r for r in case.extra["rounds"] if not (r["launch"] == 4 and r["build"] == "candidate")]
    return results


def test_the_tpot_launch_pairs_table_matches_its_golden_file():
    text = "\n".join(serving_subject.details(_launch_pairs_run())) + "\n"
    assert text == (DATA / "tpot-launch-pairs-details.md").read_text()


def test_the_tpot_launch_pairs_table_says_which_pairs_started_at_once():
    """The committed H200 A/B of three pairs at once: each row names its group; a pair started alone does not."""
    results = load_results(ROOT / "reports" / "nvidia-h200-x1" / "tpot-pairs-at-once" / "pr-ab.json")
    lines = serving_subject.details(results)
    first = "| 0 | base (pairs 0, 1, 2 at once) | 69.1 / 69.1 | 10 (23 s, no) | 7.213 | 7.218 | 1.0007 | 1.0016 |"
    last = "| 5 | candidate (pairs 3, 4, 5 at once) | 73.1 / 73.1 | 9 (21 s, no) | 7.183 | 7.202 | 1.0027 | 1.0014 |"
    assert first in lines and last in lines
    records = results.cases[0].extra["timeline"]["launches"]
    records[0]["started_with"] = records[1]["started_with"] = [0, 1]  # two pairs at once
    assert "| 0 | base (pairs 0, 1 at once) | 69.1 / 69.1 |" in "\n".join(serving_subject.details(results))
    for rec in records:
        rec["started_with"] = [rec["launch"]]
    alone = "| 0 | base | 69.1 / 69.1 | 10 (23 s, no) | 7.213 | 7.218 | 1.0007 | 1.0016 |"
    assert alone in serving_subject.details(results)


def test_the_tpot_launch_pairs_table_says_when_the_profile_settles_not_at_all():
    """The committed H200 A/B of pr as it is now (no settling): "off", not "0 runs, not settled"."""
    results = load_results(ROOT / "reports" / "nvidia-h200-x1" / "tpot-9-pairs" / "pr-ab.json")
    row = "| 0 | base (pairs 0, 1, 2 at once) | 67.1 / 67.1 | {} | 7.210 | 7.212 | 1.0003 | 1.0001 |"
    assert row.format("off") in serving_subject.details(results)
    results.cases[0].info["profile"]["settle_max_s"] = 120.0  # settling on, cut before its first run
    assert row.format("0 (0 s, no)") in serving_subject.details(results)


def test_the_tpot_rounds_table_matches_its_golden_file():
    """The rounds of the committed A/A run, one round without readings ("-"), a case without rounds first and
    a second case after it."""
    results = load_results(ROOT / "reports" / "nvidia-h200-x1" / "tpot-pr-aa.json")
    results.cases[0].extra["rounds"][1]["machine"] = {"sm_clock_mhz": [None], "power_draw_w": []}
    results.cases.insert(0, CaseResult(id="no-rounds", unit="ms", samples={"base": [1.0]}))
    second = results.cases[1]
    results.cases.append(
        CaseResult(id="second", unit="ms", samples=second.samples, extra={"rounds": second.extra["rounds"][:2]})
    )
    assert "\n".join(serving_subject.details(results)) + "\n" == (DATA / "tpot-pr-aa-details.md").read_text()


def test_a_kind_no_subject_defines_has_no_complete_run():
    plain = subjects.subject_of("nobody-registered-this")
    results = kernel_results()
    results.kind = "nobody-registered-this"
    with pytest.raises(DataError) as err:
        plain.expected_cases(results)
    assert str(err.value) == (
        "the gate defines no cases for results of kind 'nobody-registered-this': no complete run of it exists"
    )
    assert evidence.run_problems(results)[0] == str(err.value)


def test_a_results_file_finds_its_cases_by_id(tmp_path):
    results = kernel_results()
    first = results.cases[0]
    assert results.case(first.id) is first and results.case("absent") is None


def test_the_stored_baseline_must_be_of_the_runs_kind_to_be_replaced(tmp_path):
    from ci.core import baselines

    bdir = tmp_path / "b"
    path = baselines.record(_saved(kernel_results(), tmp_path / "k.json"), bdir)
    payload = json.loads(path.read_text())
    payload["kind"] = "tpot-bench"
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError, match="expected a 'kernel-bench' file, found kind='tpot-bench'"):
        baselines.record(_saved(kernel_results(seed=4), tmp_path / "k2.json"), bdir, force=True)


def _saved(results, path):
    results.save(path)
    return path


def test_the_change_line_comes_from_the_trees_and_the_report_shows_it(tmp_path):
    from ci.core import report
    from ci.trees import build, contracts, provenance
    from tests.unit.factories import AFTER, BEFORE, MOD, diff, make_release

    patch = tmp_path / "change.patch"
    patch.write_text(diff(MOD, BEFORE, AFTER))
    trees = build.build_trees(build.BuildOptions(patch=patch, out=tmp_path / "t"), release=make_release(tmp_path / "r"))
    line = provenance.change_line(trees)
    assert line == f"Change under test: `{trees.manifest.patch_path}` on vLLM 9.9.9; {contracts.NO_CONTRACT}."
    results = kernel_results()
    results.provenance["change"] = line
    assert report.details_markdown(results) == f"\n{line}\n"
    results.provenance["change"] = 3  # not a line: nothing shown
    assert report.details_markdown(results) == ""
    assert report.title({"gate": "EP-Marlin gate"}) == "EP-Marlin gate" and report.title({}) == "gate"
