"""The error-rates stage without a GPU: its table from judged runs, and its refusals."""

from __future__ import annotations

import pytest

from ci.core import rates, stats
from ci.core.compare import compare_ab
from ci.core.errors import UsageError
from ci.core.jsonio import read_json
from ci.kernel import error_rates
from tests.unit.factories import make_results


def _gate(ratios):
    return compare_ab(make_results(ratios, n=60), stats.DEFAULT_THRESHOLD, stats.DEFAULT_CONFIDENCE)


def test_a_run_row_counts_verdicts_and_finds_the_farthest_ratio():
    row = rates.summarize("aa-1", 0.0, _gate({"a": 1.0, "b": 1.012, "c": 0.99, "d": 1.2}), 12.34)
    assert row["verdicts"]["PASS"] == 3 and row["verdicts"]["FAIL"] == 1 and row["cases"] == 4
    assert row["farthest_ratio"] == pytest.approx(1.2, rel=0.01) and row["overall"] == "FAIL"
    assert row["not_pass"] == ["d"] and row["wall_time_s"] == 12.3
    assert 0 < row["median_ci_width"] < 0.01


def test_levels_pool_their_runs_and_give_shares():
    rows = [rates.summarize(f"aa-{i}", 0.0, _gate({"a": 1.0, "b": 1.0}), 1) for i in (1, 2)]
    rows.append(rates.summarize("inject-5pct", 0.05, _gate({"a": 1.05, "b": 1.05, "c": 1.0, "d": 1.05}), 1))
    levels = rates.pooled(rows)
    assert levels["aa"]["runs"] == 2 and levels["aa"]["cases"] == 4 and levels["aa"]["share"]["PASS"] == 1.0
    assert levels["0.05"]["cases"] == 4 and levels["0.05"]["share"]["FAIL"] == 0.75
    assert levels["0.05"]["share"]["PASS"] == 0.25


def test_the_table_puts_the_simulation_beside_the_measurement():
    rows = [rates.summarize("inject-3.5pct", 0.035, _gate({"a": 1.035, "b": 1.0}), 3)]
    payload = {
        "gpu": "NVIDIA H200",
        "runs": rows,
        "pooled": rates.pooled(rows),
        "settings": {"suite": "default", "captures": 30, "repeats": 90, "threshold": 0.03},
        "simulated": {"0.035": {"PASS": 0.0, "INCONCLUSIVE": 0.07, "FAIL": 0.93}},
    }
    text = error_rates.markdown(payload)
    assert "| +3.5% injected | 1 | 2 | 50.0% |" in text and "FAIL in at least 90%" in text
    assert "0.0% / 7.0% / 93.0%" in text and "| inject-3.5pct | 2 |" in text


def test_run_names():
    assert rates.run_name(0.0, 2) == "aa-2" and rates.run_name(0.035, 1) == "inject-3.5pct"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--inject", "0.02,x"], "fractions separated by commas"),
        (["--inject", "0.02,0.7"], r"each slowdown is a fraction in \(0, 0.5\]"),
        (["--aa-runs", "-1"], "--aa-runs -1"),
        (["--captures", "3"], "at least 6 captures"),
        (["--cases", "nothing/*"], "matches no case"),
    ],
)
def test_bad_options_are_usage_errors_before_anything_runs(tmp_path, argv, message):
    with pytest.raises(UsageError, match=message):
        error_rates.main(["--manifest", str(tmp_path / "m.json"), "--out", str(tmp_path / "o"), *argv])


def test_a_folder_of_other_files_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    with pytest.raises(UsageError, match="not an error-rates folder"):
        error_rates.main(["--manifest", str(tmp_path / "m.json"), "--out", str(out)])
    assert (out / "notes.txt").read_text() == "keep"
    (out / "notes.txt").unlink()
    rates.check_out(out)  # empty: fine
    (out / rates.SUMMARY_JSON).write_text("{}")
    (out / "aa-1.json").write_text("{}")
    rates.check_out(out)  # an earlier error-rates folder: fine


def test_a_second_call_adds_its_runs_to_the_table_and_numbers_them_on(tmp_path, monkeypatch):
    """A device session splits its runs over calls: the second call into the same folder keeps the first one's
    runs and files (it once replaced the table with its own runs alone) and numbers its runs on from them."""
    from types import SimpleNamespace

    from ci.host import gpu
    from ci.trees import manifest
    from tests.unit.factories import kernel_results

    monkeypatch.setattr(gpu, "require_idle_gpus", lambda *a, **k: [SimpleNamespace(name="NVIDIA H100 80GB HBM3")])
    monkeypatch.setattr(manifest, "load_trees", lambda path: None)
    seen = []

    def run_suite(trees, cases, repeats, suite, **kw):
        seen.append((kw["inject"], kw["plan"]))
        r = kernel_results("quick", captures=30, ratio=1 + kw["inject"])
        r.settings["aa"] = True
        return r

    monkeypatch.setattr(error_rates.bench, "run_suite", run_suite)
    out = tmp_path / "rates"
    argv = ["--manifest", str(tmp_path / "m.json"), "--out", str(out), "--suite", "quick"]
    assert error_rates.main([*argv, "--aa-runs", "1", "--inject", "0.035"]) == 0
    assert error_rates.main([*argv, "--aa-runs", "1", "--inject", "0.035,0.02"]) == 0
    files = sorted(p.name for p in out.glob("*.json"))
    assert files == [
        "aa-1.json",
        "aa-2.json",
        "error-rates.json",
        "inject-2pct.json",
        "inject-3.5pct-2.json",
        "inject-3.5pct.json",
    ]
    payload = read_json(out / rates.SUMMARY_JSON, kind=error_rates.KIND, versions=(error_rates.VERSION,))
    assert [r["run"] for r in payload["runs"]] == ["aa-1", "inject-3.5pct", "aa-2", "inject-3.5pct-2", "inject-2pct"]
    assert payload["pooled"]["aa"]["runs"] == 2 and set(payload["simulated"]) == {"aa", "0.035", "0.02"}
    assert payload["settings"]["sequential"] == {
        "first": 30,
        "group": 10,
        "max_extra": 3,
        "confidence": 0.95,
        "threshold": 0.03,
    }
    assert all(plan.max_extra == 3 for _, plan in seen)
    with pytest.raises(UsageError, match=r"these runs measured something else \(captures: 30 there, 60 now"):
        error_rates.main([*argv, "--aa-runs", "1", "--inject", "", "--captures", "60", "--repeats", "180"])
    assert sorted(p.name for p in out.glob("*.json")) == files, "a refused call writes nothing"


def test_the_committed_h100_table_is_its_runs_judged_again():
    """The sequential kernel gate's runs on the H100 (issue 44): the committed table says what its results files say
    judged again, and what the issue asked: A/A no FAIL, +2% no FAIL, +3.5% FAIL in at least 90%."""
    from pathlib import Path

    from ci.core.results import load_results

    folder = Path(__file__).parents[2] / "reports" / "nvidia-h100-x1" / "sequential-kernel-error-rates"
    payload = read_json(folder / rates.SUMMARY_JSON, kind=error_rates.KIND, versions=(error_rates.VERSION,))
    for row in payload["runs"]:
        again = rates.summarize(
            row["run"],
            row["inject"],
            compare_ab(load_results(folder / f"{row['run']}.json"), 0.03, 0.95),
            row["wall_time_s"],
        )
        assert again == row
    share = {k: v["share"] for k, v in payload["pooled"].items()}
    assert share["aa"]["FAIL"] == 0 and share["aa"]["INCONCLUSIVE"] == 0 and payload["pooled"]["aa"]["cases"] == 165
    assert share["0.02"]["FAIL"] == 0 and share["0.035"]["FAIL"] >= 0.9
    assert {r["run"]: len(r["looked_again"]) for r in payload["runs"]} == {
        "aa-1": 0,
        "inject-3.5pct": 3,
        "inject-2pct": 1,
        "inject-3pct": 66,
    }
    assert (folder / rates.SUMMARY_MD).read_text() == error_rates.markdown(payload)
