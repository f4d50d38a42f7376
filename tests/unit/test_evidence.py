"""ci.core.evidence: what a verdict needs, rule by rule, with exact messages and each boundary (the mutation
testing of ``nox -s mutation`` found these gaps)."""

from __future__ import annotations

import pytest

from ci.core import evidence, stats
from ci.core.errors import DataError
from ci.core.results import load_results
from tests.unit.factories import make_results, saved

V = stats.Verdict


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
    # a run of an earlier version of its suite: the history takes it (its series are per case), a verdict never
    assert evidence.run_problems(r, case_set=False) == []
    assert evidence.record_problems(r, case_set=False) == [] and len(evidence.record_problems(r)) == 2
    r.settings["case_filter"] = "a*"
    assert evidence.record_problems(r, case_set=False) == [
        "the run measured only the cases matching 'a*': a subset cannot stand for its suite"
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
            load_results(saved(r, tmp_path / "f.json"))


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
