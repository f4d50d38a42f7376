"""Error rates resampled from measured A/A runs (``ci.core.resample``), on the TPOT A/A runs of one H200
committed under ``reports/`` and on made-up cases: the numbers drawn are the ones the gate judges, a design's
shares move the way its captures say, and what is not a complete no-change run is refused."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from ci.core import resample, stats
from ci.core.cli import run_main
from ci.core.compare import compare_ab
from ci.core.errors import DataError, ExitCode, UsageError
from ci.core.results import CaseResult, load_results

RUNS = Path(__file__).resolve().parents[2] / "reports" / "nvidia-h200-x1" / "tpot-pairs-at-once"
AA = [RUNS / f"pr-{name}.json" for name in ("aa", "aa-2", "aa-3")]  # three A/A runs, two machines, 6 pairs x 2 rounds
AA9 = RUNS.parent / "tpot-9-pairs" / "pr-aa-1.json"  # an A/A of pr as it is now: 9 pairs x 1 round


def _case(base, cand, base_ids, cand_ids=None) -> CaseResult:
    return CaseResult(
        id="c",
        unit="ms",
        samples={"base": base, "candidate": cand},
        extra={"captures": {"base": base_ids, "candidate": cand_ids or base_ids}},
    )


def test_the_numbers_resampled_are_the_ones_the_gate_judges():
    for path, pairs in [(a, 6) for a in AA] + [(AA9, 9)]:
        results = load_results(path)
        drawn = resample.null_log_ratios(results.cases[0])
        judged = compare_ab(results, stats.DEFAULT_THRESHOLD, stats.DEFAULT_CONFIDENCE).cases[0].effect
        again = stats.capture_effect([1.0] * len(drawn), [math.exp(d) for d in drawn])
        assert len(drawn) == pairs and again.ratio == pytest.approx(judged.ratio, rel=1e-12)
        assert (again.ci_low, again.ci_high) == pytest.approx((judged.ci_low, judged.ci_high), rel=1e-12)


def test_fewer_rounds_take_the_first_samples_of_each_build_in_each_capture():
    case = _case([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 3.0, 3.0], [0, 0, 1, 1])
    assert resample.null_log_ratios(case) == pytest.approx([math.log(3 / 1.5), math.log(3 / 3.5)])
    assert resample.null_log_ratios(case, rounds=1) == pytest.approx([math.log(2.0), 0.0])
    with pytest.raises(UsageError, match="--rounds 3: case c has a capture with only 2 sample"):
        resample.null_log_ratios(case, rounds=3)


def test_a_case_without_captures_or_with_unequal_ones_is_refused():
    with pytest.raises(DataError, match="no captures recorded"):
        resample.null_log_ratios(CaseResult(id="c", unit="ms", samples={"base": [1.0], "candidate": [1.0]}))
    with pytest.raises(DataError, match="different captures"):
        resample.null_log_ratios(_case([1.0, 1.0], [1.0, 1.0], [0, 1], [0, 0]))


def test_shares_follow_the_truth_and_the_spread():
    quiet = [0.0] * 5
    assert resample.resampled_shares(quiet, 1.05, 6, trials=200)["FAIL"] == 1.0
    assert resample.resampled_shares(quiet, 1.0, 6, trials=200)["PASS"] == 1.0
    wide = [-0.03, 0.0, 0.03]  # +-3% a capture: 6 captures cannot clear a run that does nothing
    assert resample.resampled_shares(wide, 1.0, 6, trials=500)["INCONCLUSIVE"] > 0.5


def test_more_captures_catch_a_slowdown_more_often_and_never_fail_a_no_op():
    null = [d for path in AA for d in resample.null_log_ratios(load_results(path).cases[0])]
    six = resample.resampled_shares(null, 1.035, 6, trials=2000, seed=1)
    twelve = resample.resampled_shares(null, 1.035, 12, trials=2000, seed=1)
    assert 0.5 < six["FAIL"] < 0.9 < twelve["FAIL"]  # measured: 6 pairs miss the 90% target, 12 meet it
    for k in (6, 12):
        assert resample.resampled_shares(null, 1.0, k, trials=500)["PASS"] == 1.0
        assert resample.resampled_shares(null, 1.02, k, trials=500)["FAIL"] == 0.0


def test_the_same_seed_gives_the_same_shares_and_bad_arguments_raise():
    wide = [-0.02, 0.0, 0.01, 0.02]
    first = resample.resampled_shares(wide, 1.03, 6, trials=300, seed="s")
    assert first == resample.resampled_shares(wide, 1.03, 6, trials=300, seed="s")
    assert sum(first.values()) == pytest.approx(1.0)
    for args in (([], 1.0, 6), (wide, 0.0, 6), (wide, 1.0, 0)):
        with pytest.raises(ValueError):
            resample.resampled_shares(*args, trials=10)


def test_the_stage_writes_its_table_and_replaces_only_its_own(tmp_path, capsys):
    out = tmp_path / "rs"
    argv = [
        "--results",
        *map(str, AA),
        str(AA9),
        "--out",
        str(out),
        "--captures",
        "6,12",
        "--trials",
        "200",
        "--rounds",
        "1",
        "--earlier-designs",
    ]
    assert run_main(resample.main, argv) == 0
    payload = json.loads((out / resample.OUTPUT_JSON).read_text())
    assert payload["kind"] == resample.KIND and payload["gpu"] == "NVIDIA H200 x1"
    assert payload["settings"]["earlier_designs"] is True
    case = payload["cases"]["qwen3-30b-a3b-like/dp1-ep1/pr"]
    assert case["null"]["n"] == 27 and set(case["shares"]) == {"6", "12"}
    assert set(case["shares"]["6"]) == {"aa", "0.02", "0.035", "0.05"}
    text = (out / resample.OUTPUT_MD).read_text()
    assert "pr-aa-3.json` (captures: 6)" in text and "pr-aa-1.json` (captures: 9)" in text
    assert "Pooled with `--earlier-designs`" in text
    assert "27 measured captures" in text and "| 12 | 0.0% / 0.0% / 100.0% |" in text
    assert "| target | no FAIL and no INCONCLUSIVE | never FAIL | FAIL in at least 90% | FAIL in 100% |" in text
    assert "the first 1 round(s)" in text and text in capsys.readouterr().out
    assert run_main(resample.main, argv) == 0  # its own files: replaced


@pytest.mark.parametrize("mine", [resample.OUTPUT_JSON, resample.OUTPUT_MD])
def test_a_file_it_did_not_write_is_kept(tmp_path, mine, capsys):
    (tmp_path / mine).write_text('{"kind": "someone-else"}')
    argv = ["--results", str(AA[0]), "--out", str(tmp_path), "--trials", "100"]
    assert run_main(resample.main, argv) == ExitCode.USAGE
    assert "not written by this stage" in capsys.readouterr().err
    assert (tmp_path / mine).read_text() == '{"kind": "someone-else"}'


@pytest.mark.parametrize(
    ("name", "message"),
    [("pr-ab.json", "not an A/A run"), ("pr-inject-2pct.json", r"slowed on purpose \(inject_sleep_us\)")],
)
def test_a_run_that_is_not_a_no_change_run_is_refused(tmp_path, name, message, capsys):
    argv = ["--results", str(AA9), str(RUNS / name), "--out", str(tmp_path / "rs"), "--trials", "100"]
    assert run_main(resample.main, argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert name in err and re.search(message, err)
    assert not (tmp_path / "rs").exists()


def _edited(tmp_path: Path, edit) -> Path:
    raw = json.loads(AA[1].read_text())
    edit(raw)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(raw))
    return path


def test_an_incomplete_run_is_incomplete_and_runs_of_different_gpus_do_not_mix(tmp_path, capsys):
    def stop(raw):
        raw["settings"]["complete"] = False

    argv = ["--results", str(_edited(tmp_path, stop)), "--out", str(tmp_path / "rs"), "--trials", "100"]
    assert run_main(resample.main, argv) == ExitCode.INCOMPLETE
    assert "did not finish" in capsys.readouterr().err
    assert run_main(resample.main, [*argv, "--earlier-designs"]) == ExitCode.INCOMPLETE  # stopped: still refused
    err = capsys.readouterr().err
    assert "did not finish" in err and "at least 9" not in err and "(a finished run" not in err
    # a finished run of pr's earlier design (6 pairs): incomplete for pr today, poolable when asked for
    argv = ["--results", str(AA[1]), "--out", str(tmp_path / "rs"), "--trials", "100"]
    assert run_main(resample.main, argv) == ExitCode.INCOMPLETE
    err = capsys.readouterr().err
    assert "6 capture(s) of 'base', at least 9 are needed" in err and "earlier design: --earlier-designs)" in err
    assert not (tmp_path / "rs").exists()
    assert run_main(resample.main, [*argv, "--earlier-designs"]) == 0
    assert "6 measured captures" in capsys.readouterr().out

    def other_gpu(raw):
        raw["provenance"]["gpu"]["gpus"][0]["name"] = "NVIDIA H100"

    argv = [
        "--results",
        str(AA[0]),
        str(_edited(tmp_path, other_gpu)),
        "--out",
        str(tmp_path / "rs"),
        "--trials",
        "100",
        "--earlier-designs",
    ]
    assert run_main(resample.main, argv) == ExitCode.USAGE
    assert "measured different things" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--captures", "5"], "at least 6 captures"),
        (["--captures", "6,x"], "whole numbers"),
        (["--levels", "0.7"], r"true slowdowns in \[0, 0.5\]"),
        (["--levels", "a"], r"true slowdowns in \[0, 0.5\]"),
        (["--trials", "10"], "at least 100"),
        (["--rounds", "0"], "at least 1 sample"),
        (["--rounds", "3"], "has a capture with only 2 sample"),
        (["--results", str(AA[1]), str(AA[1])], "given more than once"),
    ],
)
def test_bad_options_say_what_to_give(tmp_path, extra, message, capsys):
    argv = ["--results", str(AA[0]), "--out", str(tmp_path / "rs"), "--trials", "100", "--earlier-designs", *extra]
    assert run_main(resample.main, argv) == ExitCode.USAGE
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "rs").exists()
