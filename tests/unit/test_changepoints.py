"""Change-point rules on simulated histories (issue 41): the noise measured from runs, the rules, their scores."""

from __future__ import annotations

import math
import random

import pytest

from ci.core import changepoints as cp
from ci.core import stats
from ci.core.errors import DataError, UsageError
from ci.core.jsonio import read_json
from tests.unit.factories import make_results

V = stats.Verdict


def test_run_to_run_noise_is_each_cases_deviation_from_its_own_mean():
    runs = [make_results({"a": 1.0, "b": 1.0}, seed=s) for s in range(3)]
    for k, r in enumerate(runs):
        r.cases[0].samples["base"] = [100.0 * (1 + 0.01 * k)] * 5  # case a: 100, 101, 102
        r.cases[1].samples["base"] = [50.0] * 5  # case b: no noise at all
    noise = cp.run_to_run(runs)
    logs = [math.log(100 * (1 + 0.01 * k)) for k in range(3)]
    mean = sum(logs) / 3
    assert noise[:3] == pytest.approx([(x - mean) * math.sqrt(3 / 2) for x in logs])
    assert noise[3:] == [0.0, 0.0, 0.0] and len(noise) == 6
    with pytest.raises(UsageError, match="two runs of the build at least"):
        cp.run_to_run(runs[:1])
    other = make_results({"z": 1.0})
    with pytest.raises(DataError, match="no case has 'base' samples in every run"):
        cp.run_to_run([runs[0], other])


def test_a_simulated_history_steps_at_its_nights_and_adds_the_measured_noise():
    truth = cp.levels(10, {3: 0.05, 7: 0.10})
    assert truth[:3] == [0.0] * 3 and truth[3] == pytest.approx(math.log(1.05))
    assert truth[7] == pytest.approx(math.log(1.05) + math.log(1.10)) and truth[6] == truth[3]
    series = cp.simulate_series(10, {3: 0.05}, [0.01, -0.01], random.Random(1))
    assert all(abs(x - t) == pytest.approx(0.01) for x, t in zip(series, cp.levels(10, {3: 0.05}), strict=True))


def test_the_threshold_rule_compares_a_night_with_the_night_before():
    series = [0.0, 0.0, math.log(1.031), math.log(1.031), math.log(1.031 * 1.029), 0.0]
    assert cp.threshold_alerts(series) == [(2, 2)]
    assert cp.threshold_alerts(series, threshold=0.02) == [(2, 2), (4, 4)]


def test_an_online_detector_alerts_a_change_point_once_on_the_night_it_is_found():
    series = [0.0] * 10 + [0.1] * 10
    calls = []

    def detect(xs):
        calls.append(len(xs))
        return [10] if len(xs) >= 13 else ([11] if len(xs) == 12 else [])

    alerts = cp.online_alerts(series, detect)
    assert alerts == [(11, 11)]  # found at index 11 on night 11; index 10 later is the same change
    assert calls == list(range(9, 21)) and detect([1.0] * 13) == [10]
    assert cp.going_up([1.0] * 5 + [2.0] * 5, [5, 0, 10]) == [5]
    assert cp.going_up([2.0] * 5 + [1.0] * 5, [5]) == []


def test_a_candidate_alerts_only_when_the_ab_of_the_builds_around_it_fails():
    truth = cp.levels(20, {10: 0.05})
    asked = []

    def ab(ratio):
        asked.append(round(ratio, 4))
        return V.FAIL if ratio > 1.03 else V.PASS

    kept = cp.confirmed_alerts([(12, 10), (15, 14), (11, 11)], truth, ab)
    assert kept == [(12, 10), (11, 11)] and asked == [1.05, 1.0, 1.05]  # builds 8 vs 11, 12 vs 15, 9 vs 11
    assert cp.confirmed_alerts([(11, 10)], truth, lambda r: V.INCONCLUSIVE) == []  # an open A/B alerts nothing


def test_the_gates_ab_fails_a_real_step_and_passes_none():
    ab = cp.gate_ab(random.Random(0))
    assert [ab(1.10) for _ in range(5)] == [V.FAIL] * 5
    assert [ab(1.0) for _ in range(5)] == [V.PASS] * 5


def test_a_score_counts_false_alarms_on_quiet_nights_and_steps_caught_in_time():
    steps = {10: 0.05, 30: 0.10}
    got = cp.score([(3, 3), (12, 10), (17, 17), (40, 40), (33, 30)], steps, 50)
    assert got["quiet_nights"] == 50 - 16 and got["false"] == 2  # nights 3 and 40; 17 is late, not false
    assert got["caught"] == {"10": True, "30": False}  # 33 is 3 nights after 30: late


def test_rates_run_every_rule_on_the_same_histories():
    def fake_otava(xs):  # a detector that sees every step (and nothing else)
        return [i for i in range(1, len(xs)) if xs[i] / xs[i - 1] > 1.02]

    steps = {20: 0.05, 40: 0.10}
    got = cp.rates(
        [0.0, 0.001, -0.001],
        nights=60,
        steps=steps,
        histories=3,
        rules=["threshold", "otava", "confirmed"],
        detectors={"otava": fake_otava},
    )
    for rule in ("threshold", "otava", "confirmed"):
        assert got[rule]["false_per_100_nights"] == 0 and got[rule]["caught_within"] == {"0.05": 1.0, "0.1": 1.0}
    noisy = cp.rates(
        [0.0, 0.05],
        nights=60,
        steps={20: 0.05},
        histories=5,
        rules=["threshold", "confirmed"],
        detectors={"otava": fake_otava},
    )
    assert noisy["threshold"]["false_per_100_nights"] > 5, "a 5% noise trips the single-run rule"
    assert noisy["confirmed"]["false_per_100_nights"] == 0, "the A/B has no between-run error"
    payload = {
        "runs": ["a.json", "b.json"],
        "noise": {"n": 3, "sd": 0.001, "p99": 0.002, "max": 0.002},
        "settings": {"nights": 60, "histories": 3, "steps": {"20": 0.05, "40": 0.1}},
        "rates": got,
    }
    text = cp.markdown(payload)
    assert "| confirmed | 0.00 | 100% | 100% |" in text and "nights 20 (+5%), 40 (+10%)" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "40:x"], "NIGHT:SIZE pairs"),
        (["--steps", "40:1.5"], r"a fraction in \(0, 1\]"),
        (["--rules", "otava,magic"], "pick from threshold"),
        (["--nights", "45"], "every step needs 7 nights after it"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(tmp_path, argv, message):
    with pytest.raises(UsageError, match=message):
        cp.main(["--runs", str(tmp_path / "a.json"), "--out", str(tmp_path / "o"), *argv])


def test_a_folder_holding_another_file_of_that_name_is_left_alone(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / cp.OUTPUT_JSON).write_text('{"kind": "other"}')
    with pytest.raises(UsageError, match="was not written by this stage"):
        cp.main(["--runs", str(tmp_path / "a.json"), "--out", str(out), "--rules", "threshold"])
    assert (out / cp.OUTPUT_JSON).read_text() == '{"kind": "other"}'


def test_the_stage_writes_its_table_from_measured_runs(tmp_path, capsys):
    paths = []
    for k in range(3):
        r = make_results({"a": 1.0, "b": 1.0}, seed=k)
        r.cases[0].samples["base"] = [100.0 * (1 + 0.002 * k)] * 5
        paths.append(tmp_path / f"run-{k}.json")
        r.save(paths[-1])
    out = tmp_path / "o"
    argv = ["--runs", *map(str, paths), "--out", str(out), "--rules", "threshold", "--histories", "4", "--nights", "60"]
    assert cp.main([*argv, "--steps", "20:0.05,40:0.10"]) == 0
    payload = read_json(out / cp.OUTPUT_JSON, kind=cp.KIND, versions=(cp.VERSION,))
    assert payload["noise"]["n"] == 6 and payload["settings"]["steps"] == {"20": 0.05, "40": 0.1}
    assert payload["rates"]["threshold"] == {
        "false_per_100_nights": 0.0,
        "caught_within": {"0.05": 1.0, "0.1": 1.0},
        "histories": 4,
    }
    assert (out / cp.OUTPUT_MD).read_text() == cp.markdown(payload) == capsys.readouterr().out
    assert cp.main([*argv, "--steps", "20:0.05,40:0.10"]) == 0  # its own files: replaced
