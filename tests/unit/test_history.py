"""The history store: complete runs added once each to the series of their machine, subject and suite."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from ci.core import history
from ci.core.errors import DataError, IncompleteEvidenceError, UsageError
from ci.core.results import load_results
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
    assert path.relative_to(root).parts[0].endswith("-x1")  # the machine: its GPU model and how many
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


@pytest.fixture
def host_in_tokyo():
    """The host's local zone is not UTC (``--at`` is stored in UTC whatever the zone); restored afterwards."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_a_run_added_at_the_date_of_its_code_sits_there_and_shows_when_it_ran(tmp_path, host_in_tokyo):
    """Issue 41, the H100 history: vLLM 0.25.0 timed after the chain of 0.25.1 commits sat after them, so the
    release looked like a speed-up after the chain and the nightly named 0.25.0 as tonight's build. ``--at``
    places a back-filled run at the date of its code (asv's commit-date order); the time it ran is kept."""
    root = tmp_path / "history"
    chain = _run(tmp_path, "chain", ratio=1.05, seed=1, time="2026-12-06T04:50:00+00:00")
    release = _run(tmp_path, "release", seed=2, time="2026-12-06T04:56:00+00:00")
    path = history.add(chain, root, at="2026-11-20T12:00:00Z")
    assert history.add(release, root, at="2026-11-01T09:00:00+01:00") == path
    data = history.load_history(path)
    assert [e["run"]["at"] for e in data["entries"]] == ["2026-11-01T08:00:00+00:00", "2026-11-20T12:00:00+00:00"]
    assert [e["run"]["time"][11:16] for e in data["entries"]] == ["04:56", "04:50"]
    case_id = next(iter(data["entries"][0]["cases"]))
    assert [t for t, _ in history.series(data, case_id)] == ["2026-11-01T08:00:00+00:00", "2026-11-20T12:00:00+00:00"]
    plain = _run(tmp_path, "plain", seed=3, time="2026-11-10T00:00:00+00:00")
    history.add(plain, root)  # no --at: at its run time, between the two
    data = history.load_history(path)
    assert [history.position(e)[:10] for e in data["entries"]] == ["2026-11-01", "2026-11-10", "2026-11-20"]
    assert "at" not in data["entries"][1]["run"]
    assert history.run_text(data["entries"][0]) == "2026-11-01T08:00:00+00:00 (ran 2026-12-06T04:56:00+00:00)"
    assert history.run_text(data["entries"][1]) == "2026-11-10T00:00:00+00:00"
    assert f"| {case_id} | 2026-11-20T12:00:00+00:00 (ran 2026-12-06T04:50:00+00:00) |" in history.show(data, "*")
    placed = [_entry(f"t{i}", {"a": 1.0 + (i > 2)}) for i in range(6)]
    for i, e in enumerate(placed):
        e["run"]["at"] = f"2026-11-0{i + 1}"
    [found] = history.candidates({"entries": placed}, lambda xs: [3])
    assert (found["good"]["time"], found["bad"]["time"]) == ("2026-11-03", "2026-11-04")
    before = path.read_bytes()
    for bad in ("2026-11-01", "yesterday", "2026-13-01T00:00:00+00:00"):
        with pytest.raises(UsageError) as err:
            history.add(_run(tmp_path, "late", seed=4), root, at=bad)
        assert err.value.exit_code == 2 and str(err.value) == (
            f"--at {bad!r}: not an ISO 8601 time with its zone; give e.g. 2026-12-01T09:00:00+00:00 (the date of "
            "the code the run timed); nothing was changed"
        )
    assert path.read_bytes() == before
    later = _run(tmp_path, "later", seed=5, time="2026-12-07T00:00:00+00:00")
    assert history.main(["add", str(later), "--dir", str(root), "--at", "2026-11-15T00:00:00+00:00"]) == 0
    assert history.position(history.load_history(path)["entries"][2]) == "2026-11-15T00:00:00+00:00"


def test_an_incomplete_run_is_not_added_and_nothing_is_written(tmp_path):
    root = tmp_path / "history"
    with pytest.raises(IncompleteEvidenceError, match="not added to the history") as err:
        history.add(_run(tmp_path, "cut", complete=False), root)
    assert str(err.value).endswith(
        "cut.json: not added to the history: its evidence is incomplete (the run did not finish (complete: false): "
        "re-run it, or rebuild it from its folder only to look at it); re-run the stage"
    )
    results = kernel_results("quick")
    for case in results.cases[:3]:  # with the unfinished run, four problems: the message quotes the first three
        case.extra["correctness"] = {"ok": False, "rel_l2": 0.5}
    with pytest.raises(IncompleteEvidenceError) as err:
        history.add(saved(results, tmp_path / "many.json", complete=False), root)
    quoted = str(err.value).split("incomplete (", 1)[1]
    assert quoted.count("the builds' outputs disagree") == 2 and quoted.count("; case ") == 2
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


def _nightly(tmp_path, root, ratios_by_night):
    """One complete run a night added to the history; the base side's time is scaled by the night's level."""
    for night, level in enumerate(ratios_by_night):
        results = kernel_results("quick", seed=night)
        for case in results.cases:
            case.samples["base"] = [x * level for x in case.samples["base"]]
        results.provenance["time"] = f"2026-11-{night + 1:02d}T00:00:00+00:00"
        results.provenance["vllm"] = {"version": f"0.25.{night}"}
        history.add(saved(results, tmp_path / f"night{night}.json"), root)
    return next(root.rglob("*.json"))


def test_detect_names_the_runs_either_side_of_a_step_and_the_bisect_that_confirms_it(tmp_path, capsys):
    root = tmp_path / "history"
    path = _nightly(tmp_path, root, [1.0] * 6 + [1.05] * 6)
    data = history.load_history(path)
    seen = []

    def detector(xs):  # a detector that sees the one step there is (ci.core.changepoints runs Otava's)
        seen.append(len(xs))
        return [i for i in range(1, len(xs)) if xs[i] > 1.03 * xs[i - 1]] + [0, len(xs)]  # out of range: ignored

    found = history.candidates(data, detector, "deepseek-v3/ep8/*")
    assert found and {c["case"][:15] for c in found} == {"deepseek-v3/ep8"} and set(seen) == {12}
    first = found[0]
    assert first["index"] == 6 and first["size"] == pytest.approx(0.05, abs=0.01)
    assert first["good"]["build"]["vLLM"] == "0.25.5" and first["bad"]["build"]["vLLM"] == "0.25.6"
    text = history.detect_markdown(found)
    assert "(vLLM 0.25.5) | 2026-11-07T00:00:00+00:00 (vLLM 0.25.6) |" in text and f"| {first['size']:+.1%} |" in text
    assert history.detect_markdown([]).startswith("no candidate change point")
    assert history.candidates({"entries": data["entries"][:5]}, detector) == []  # too few runs: nothing looked for
    six = history.candidates({"entries": data["entries"][:5] + data["entries"][6:7]}, detector, "deepseek-v3/ep8/*")
    assert six and {c["index"] for c in six} == {5}  # MIN_RUNS runs are enough
    machine = path.relative_to(root).parts[0]
    where = ["--machine", machine, "--kind", "kernel-bench", "--suite", "quick", "--dir", str(root)]
    assert history.main(["detect", *where], detector=detector) == 1
    assert "candidate change point(s)" in capsys.readouterr().out
    assert history.main(["detect", *where], detector=lambda xs: []) == 0
    assert history.main(["detect", *where, "--case", "nothing*"], detector=detector) == 0  # the glob is passed on
    assert (
        history.build_text({"vLLM": "0.25.1", "change": "x"}) == "change x; vLLM 0.25.1"
        and history.build_text({}) == "?"
    )


def test_plot_draws_the_series_and_never_replaces_a_file(tmp_path):
    root = tmp_path / "history"
    path = _nightly(tmp_path, root, [1.0] * 3 + [1.1] * 3)
    machine = path.relative_to(root).parts[0]
    where = ["--machine", machine, "--kind", "kernel-bench", "--suite", "quick", "--dir", str(root)]
    png = tmp_path / "series.png"
    assert history.main(["plot", *where, "--case", "qwen3*ep8*", "--out", str(png)], detector=lambda xs: [3]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(UsageError, match="an existing file is never replaced"):
        history.main(["plot", *where, "--out", str(png)], detector=lambda xs: [])
    with pytest.raises(UsageError, match="nothing drawn"):
        history.main(["plot", *where, "--case", "nothing*", "--out", str(tmp_path / "b.png")], detector=lambda xs: [])


def test_a_release_that_holds_the_change_is_followed_on_its_published_side(tmp_path):
    """A nightly run of a release that holds the change under test reverse-applies it: its base is the release
    without the change, and the series follows the candidate, the release as published."""
    root = tmp_path / "history"
    for night, (version, reverse) in enumerate((("0.25.0", False), ("0.25.1", False), ("0.26.0", True))):
        results = kernel_results("quick", seed=night, ratio=0.5 if reverse else 1.0)
        results.provenance["time"] = f"2026-11-{night + 1:02d}T00:00:00+00:00"
        results.provenance["vllm"] = {"version": version, "reverse": reverse, "patch_sha256": "ab" * 32}
        history.add(saved(results, tmp_path / f"n{night}.json"), root)
    data = history.load_history(next(root.rglob("*.json")))
    assert [e["published"] for e in data["entries"]] == ["base", "base", "candidate"]
    case_id = next(iter(data["entries"][0]["cases"]))
    values = [v for _, v in history.series(data, case_id)]
    assert values[2] == pytest.approx(0.5 * values[1], rel=0.05)  # the candidate side, half the base's time
    shown = history.show(data, case_id)
    assert "| candidate: change a patch (sha256 abababababab); vLLM 0.26.0 |" in shown
    assert "| base: vLLM 0.25.1 |" in shown
    legacy = {k: v for k, v in data["entries"][0].items() if k != "published"}
    assert history.published(legacy) == "base"  # entries written before the field followed the base
    with pytest.raises(DataError, match="'published' side is 'both'"):
        history.published({**legacy, "published": "both"})


def test_a_run_of_an_earlier_version_of_its_suite_is_added_with_its_version(tmp_path):
    """A run made before the suite grew holds fewer cases than the suite has now: complete for its version."""
    root = tmp_path / "history"
    today = _run(tmp_path, "today", time="2026-12-03T00:00:00+00:00")
    older = kernel_results("quick")
    older.cases = older.cases[:9]  # the quick suite had 9 cases until 2026-12-03
    older.provenance["time"] = "2026-12-01T00:00:00+00:00"
    path = history.add(saved(older, tmp_path / "older.json"), root)
    assert history.add(today, root) == path
    first, second = history.load_history(path)["entries"]
    assert first["suite"]["cases"] == 9 and first["suite"]["as_now"] is False
    assert second["suite"]["cases"] == 13 and second["suite"]["as_now"] is True
    assert first["suite"]["version"] != second["suite"]["version"] and len(first["suite"]["version"]) == 12
    data = history.load_history(path)
    assert len(history.series(data, older.cases[0].id)) == 2  # a case of both versions: both runs
    assert len(history.series(data, kernel_results("quick").cases[12].id)) == 1
    foreign = kernel_results("quick")
    foreign.suite = "nightly-only"
    with pytest.raises(IncompleteEvidenceError, match="not added to the history: suite 'nightly-only'"):
        history.add(saved(foreign, tmp_path / "foreign.json"), root)


def _entry(time: str, cases: dict[str, float], sha: str = "", published: str = "base") -> dict:
    builds = {"base": {"vLLM": f"b{time}"}, "candidate": {"vLLM": f"c{time}"}}
    medians = {cid: {"base": x, "candidate": x * 2} for cid, x in cases.items()}
    return {"run": {"time": time, "sha256": sha or time}, "builds": builds, "published": published, "cases": medians}


def test_candidates_take_each_index_the_detector_gives_inside_the_series_whatever_comes_before():
    xs = [0.5, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0]
    entries = [_entry(f"t{i}", {"b/long": x, **({"a/short": 1.0} if i < 2 else {})}) for i, x in enumerate(xs)]
    entries[-1]["published"] = "candidate"  # a series follows each entry's published side
    asked = []

    def detector(values):
        asked.append(list(values))
        return [0, len(values), -1, 1, 3]  # the first three are outside the series: skipped, not the end

    found = history.candidates({"entries": entries}, detector)
    assert asked == [[*xs[:-1], 4.0]]  # the short series (2 runs < MIN_RUNS) is skipped, the long one still asked
    assert [(c["case"], c["index"]) for c in found] == [("b/long", 1), ("b/long", 3)]
    at3 = found[1]
    assert at3["size"] == pytest.approx(2.0 / 0.5 - 1)  # medians of the 5 after (2, 2, 2, 4) over all 3 before
    assert at3["good"] == {"time": "t2", "build": {"vLLM": "bt2"}} and at3["bad"] == {
        "time": "t3",
        "build": {"vLLM": "bt3"},
    }
    assert history.series({"entries": entries}, "a/short") == [("t0", 1.0), ("t1", 1.0)]


@pytest.mark.parametrize(
    "breaks",
    [
        lambda e: e.clear(),
        lambda e: e.pop("run"),
        lambda e: e["run"].update(time=3),
        lambda e: e["run"].pop("sha256"),
        lambda e: e.pop("builds"),
        lambda e: e["builds"].pop("base"),
        lambda e: e["builds"].update(candidate="0.25.1"),
        lambda e: e.pop("cases"),
        lambda e: e["run"].update(at=20261201),
    ],
)
def test_an_entry_without_what_readers_take_from_it_is_refused_by_its_index(tmp_path, breaks):
    path = tmp_path / "quick.json"
    entries = [_entry("t0", {"a": 1.0}), _entry("t1", {"a": 1.0})]
    breaks(entries[1])
    path.write_text(json.dumps({"kind": history.KIND, "schema_version": history.SCHEMA_VERSION, "entries": entries}))
    with pytest.raises(DataError, match=r"quick\.json: entry 1 is not a run entry") as err:
        history.load_history(path)
    assert str(err.value).endswith(
        "entry 1 is not a run entry (a 'run' with its 'time' and 'sha256', 'builds' of both sides, 'cases'); "
        "restore the file from git (nothing was changed)"
    )
    path.write_text(json.dumps({"kind": "gate-baseline", "schema_version": history.SCHEMA_VERSION, "entries": []}))
    with pytest.raises(DataError, match="gate-baseline"):
        history.load_history(path)
    path.write_text(json.dumps({"kind": history.KIND, "schema_version": history.SCHEMA_VERSION, "entries": [3]}))
    with pytest.raises(DataError, match="entry 0 is not a run entry"):
        history.load_history(path)


def test_an_entry_records_the_run_its_builds_and_each_case_and_one_without_captures_is_one_capture(tmp_path):
    from ci.core import stats
    from ci.core.jsonio import sha256_file
    from ci.core.results import load_results

    path = _run(tmp_path, "a", ratio=1.02)
    results = load_results(path)
    results.provenance.update(project_commit="abc123", command="python -m ci.kernel.bench --suite quick")
    path = saved(results, tmp_path / "b.json")
    results = load_results(path)
    entry = history.entry_of(results, path)
    assert entry["run"] == {
        "sha256": sha256_file(path),
        "time": "2026-12-01T00:00:00+00:00",
        "project_commit": "abc123",
        "command": "python -m ci.kernel.bench --suite quick",
    }
    assert entry["suite"] == history.suite_version(results, path) and entry["published"] == "base"
    for key in ("time", "project_commit", "command"):
        results.provenance.pop(key, None)
    bare = history.entry_of(results, saved(results, tmp_path / "c.json"))["run"]
    assert (bare["time"], bare["project_commit"], bare["command"]) == ("", "", "")
    case = results.cases[0]
    paired = history.case_summary(case)
    assert paired["captures"] == 6 and paired["unit"] == "us/call"
    case.extra.pop("captures")
    one = history.case_summary(case)
    effect = stats.paired_effect(case.samples["base"], case.samples["candidate"])
    assert one["captures"] == 1 and (one["ratio"], one["ci"]) == (effect.ratio, [effect.ci_low, effect.ci_high])
    assert one["base"] == stats.median(case.samples["base"]) and one["candidate"] == stats.median(
        case.samples["candidate"]
    )


def test_the_cli_asks_for_a_command_and_show_and_detect_print_exactly(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        history.main([])
    assert err.value.code == 2
    results = kernel_results("quick")
    results.suite = "nosuch"
    path = saved(results, tmp_path / "other-suite.json")
    with pytest.raises(IncompleteEvidenceError, match=r"other-suite\.json: not added to the history: suite 'nosuch'"):
        history.add(path, tmp_path / "history")
    version = history.suite_version(load_results(saved(kernel_results("quick"), tmp_path / "q.json")), path)
    ids = sorted(c.id for c in kernel_results("quick").cases)
    assert version == {"cases": 13, "version": hashlib.sha256("\n".join(ids).encode()).hexdigest()[:12], "as_now": True}
    entries = [_entry("t0", {"a/x": 1.0}), _entry("t1", {"a/x": 1.5, "a/y": 1.0}, published="candidate")]
    for e, r in zip(entries, (1.0, 2.0), strict=True):
        for c in e["cases"].values():
            c.update(unit="us/call", ratio=r, ci=[r - 0.01, r + 0.01])
    assert history.show({"entries": entries}, "a/*") == (
        "| case | run | build (published side) | median | ratio [95%] |\n"
        "|---|---|---|---:|---|\n"
        "| a/x | t0 | base: vLLM bt0 | 1.00 us/call | 1.0000 [0.9900, 1.0100] |\n"
        "| a/x | t1 | candidate: vLLM ct1 | 3.00 us/call | 2.0000 [1.9900, 2.0100] |\n"
        "| a/y | t1 | candidate: vLLM ct1 | 2.00 us/call | 2.0000 [1.9900, 2.0100] |"  # a case the first run lacks
    )
    assert history.show({"entries": entries}, "b/*") == "no case of the history matches 'b/*'"
    found = [
        {"case": "a/x", "good": {"time": "t0", "build": {"vLLM": "b"}}, "bad": {"time": "t1", "build": {}}, "size": 0.5}
    ]
    assert history.detect_markdown(found) == (
        "1 candidate change point(s). Each is an alert only once the paired A/B of its two builds FAILs: the first "
        "step of `nox -s bisect -- --good BEFORE --bad AFTER --cases CASE` (docs/history.md).\n"
        "\n"
        "| case | last run before (build) | first run after (build) | step |\n"
        "|---|---|---|---:|\n"
        "| a/x | t0 (vLLM b) | t1 (?) | +50.0% |\n"
    )
    assert history.detect_markdown([]) == "no candidate change point: no case's time went up between two runs\n"


def test_otavas_detector_finds_a_clear_step_up_and_nothing_else():
    """The real detector `detect` and the nightly job use (Apache Otava: nox -s tests_changepoints)."""
    pytest.importorskip("otava")
    detect = history.otava_detector()
    level = [1.0 + 0.001 * (i % 3) for i in range(10)]
    assert detect(level + [x + 0.5 for x in level]) == [10]
    assert detect([x + 0.5 for x in level] + level) == []  # a speed-up is no candidate
    assert detect(level + level) == []
