"""The history store: complete runs added once each to the series of their machine, subject and suite."""

from __future__ import annotations

import json

import pytest

from ci.core import history
from ci.core.errors import DataError, IncompleteEvidenceError, UsageError
from tests.unit.factories import kernel_results, saved


def _run(tmp_path, name, *, ratio=1.0, seed=0, time="2026-12-01T00:00:00+00:00", **settings):
    results = kernel_results("quick", ratio=ratio, seed=seed)
    results.provenance["time"] = time
    return saved(results, tmp_path / f"{name}.json", **settings)


def test_runs_are_added_in_time_order_each_once(tmp_path):
    root = tmp_path / "history"
    late = _run(tmp_path, "late", ratio=1.05, seed=1, time="2026-12-03T00:00:00+00:00")
    early = _run(tmp_path, "early", time="2026-12-01T00:00:00+00:00")
    path = history.add(late, root)
    assert history.add(early, root) == path
    assert path.relative_to(root).parts[-2:] == ("kernel-bench", "quick.json")
    data = history.load_history(path)
    assert [e["run"]["time"][:10] for e in data["entries"]] == ["2026-12-01", "2026-12-03"]
    case_id = next(iter(data["entries"][0]["cases"]))
    first, second = (e["cases"][case_id] for e in data["entries"])
    assert abs(first["ratio"] - 1.0) < 0.01 and abs(second["ratio"] - 1.05) < 0.01
    assert first["ci"][0] <= first["ratio"] <= first["ci"][1] and first["captures"] == 6
    assert [t[:10] for t, _ in history.series(data, case_id)] == ["2026-12-01", "2026-12-03"]
    with pytest.raises(UsageError, match="already in"):
        history.add(early, root)
    assert len(history.load_history(path)["entries"]) == 2  # nothing changed


def test_an_incomplete_run_is_not_added_and_nothing_is_written(tmp_path):
    root = tmp_path / "history"
    with pytest.raises(IncompleteEvidenceError, match="not added to the history"):
        history.add(_run(tmp_path, "cut", complete=False), root)
    with pytest.raises(IncompleteEvidenceError):
        history.add(_run(tmp_path, "subset", case_filter="*ep8*"), root)
    assert not root.exists()


def test_a_history_file_that_is_not_one_is_refused_and_kept(tmp_path):
    run = _run(tmp_path, "a")
    root = tmp_path / "history"
    path = history.add(run, root)
    path.write_text(json.dumps({"kind": history.KIND, "schema_version": 1, "entries": "oops"}))
    with pytest.raises(DataError, match="'entries' must be a list"):
        history.add(_run(tmp_path, "b", seed=2), root)
    assert json.loads(path.read_text())["entries"] == "oops"


def test_show_and_the_cli(tmp_path, capsys):
    root = tmp_path / "history"
    assert history.main(["add", str(_run(tmp_path, "a")), "--dir", str(root)]) == 0
    machine = next(root.iterdir()).name
    assert (
        history.main(
            [
                "show",
                "--machine",
                machine,
                "--kind",
                "kernel-bench",
                "--suite",
                "quick",
                "--case",
                "deepseek-v3/ep8/*",
                "--dir",
                str(root),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| deepseek-v3/ep8/" in out and "qwen3" not in out and "[" in out
    with pytest.raises(UsageError, match="no history there yet"):
        history.main(["show", "--machine", "nowhere-x1", "--kind", "kernel-bench", "--dir", str(root)])
    assert "no case" in history.show(history.load_history(next(root.rglob("*.json"))), "nothing*")
