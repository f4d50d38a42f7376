"""The nightly job (ci.runner.nightly): a night timed, added to the history, its new change points bisected, and
the issue text written; the build, the bench and the bisect stood in for, the history and its rules real."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ci.core import bisect as bisect_core
from ci.core import history
from ci.core.errors import DataError, ExitCode, UsageError
from ci.runner import nightly
from tests.unit.factories import kernel_results, saved
from tests.unit.test_bisect import git


def step_detector(xs):
    """Sees a step where a night is 3% slower than the one before (Otava's job in the real run)."""
    return [i for i in range(1, len(xs)) if xs[i] > 1.03 * xs[i - 1]]


def chain(tmp_path: Path, n: int) -> tuple[Path, list[str]]:
    repo = tmp_path / "vllm-main"
    (repo / "vllm").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    shas = []
    for i in range(n):
        (repo / "vllm" / "speed.py").write_text(f"COMMIT = {i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(git(repo, "rev-parse", "HEAD").strip())
    return repo, shas


def night_run(tmp_path: Path, repo: Path, night: int, level: float) -> Path:
    """The bench's results of one night: the checkout's current commit, its base side ``level`` times slower."""
    sha = git(repo, "rev-parse", "HEAD").strip()
    results = kernel_results("quick", seed=night, captures=30)
    for case in results.cases:
        case.samples["base"] = [x * level for x in case.samples["base"]]
    results.provenance["time"] = f"2026-11-{night + 1:02d}T00:00:00+00:00"
    overlay = {"repo": str(repo), "commit": sha, "subject": f"commit {night}", "status": "clean"}
    results.provenance["vllm"] = {"version": "0.25.1", "overlay": overlay, "reverse": False}
    return saved(results, tmp_path / f"night-{night}.json")


class Bisect:
    """The bisect stage stood in for: a report and the exit code it is given."""

    def __init__(self, code: int = 1):
        self.code = code
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> int:
        self.calls.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "bisect.md").write_text("### Bisect: first slow build: the stand-in's\n")
        payload = {"kind": "gate-bisect", "schema_version": 1}
        if self.code == 1:
            payload["first_bad"] = argv[argv.index("--bad") + 1] + "0" * 28
        if self.code in (0, 1, 3):  # a bisect that ran writes its report; one that could not, none
            (out / "bisect.json").write_text(json.dumps(payload))
        return self.code


def run_nights(tmp_path: Path, levels: list[float], code: int = 1) -> tuple[list, list[str], Path]:
    repo, shas = chain(tmp_path, len(levels))
    nights = []
    for i, level in enumerate(levels):
        git(repo, "checkout", "-q", shas[i])
        run, bisect = night_run(tmp_path, repo, i, level), Bisect(code)
        argv = ["--results", str(run), "--vllm-src", str(repo), "--history", str(tmp_path / "history")]
        bisect.exit = nightly.main([*argv, "--out", str(tmp_path / f"n{i}")], run=bisect, detector=step_detector)
        nights.append(bisect)
    return nights, shas, tmp_path / "history"


def test_a_step_is_bisected_between_the_commits_either_side_and_alerts(tmp_path):
    nights, shas, _ = run_nights(tmp_path, [1.0] * 6 + [1.06] * 2)
    assert [n.exit for n in nights[:6]] == [0] * 6 and not any(n.calls for n in nights[:6])
    alert = nights[6]
    assert alert.exit == ExitCode.FAILED
    (bisect,) = alert.calls
    assert bisect[2] == "ci.runner.bisect" and bisect[bisect.index("--suite") + 1] == "quick"
    assert bisect[bisect.index("--good") + 1] == shas[5][:12] and bisect[bisect.index("--bad") + 1] == shas[6][:12]
    cases = bisect[bisect.index("--cases") + 1].split(",")
    assert len(cases) == len(kernel_results("quick").cases)  # every case moved
    text = (tmp_path / "n6" / nightly.MD_NAME).read_text()
    machine = json.loads((tmp_path / "n6" / nightly.JSON_NAME).read_text())["night"]["machine"]
    title = f"{nightly.TITLE} on {machine}: vLLM commit {shas[6][:12]} ({len(cases)} case(s))"
    assert text.startswith(title + "\n\n") and "the stand-in's" in text and "commit 6" in text
    payload = json.loads((tmp_path / "n6" / nightly.JSON_NAME).read_text())
    assert payload["bisects"][0]["status"] == bisect_core.FOUND and payload["night"]["runs"] == 7
    # the next night still sees the step among the last 3 runs and bisects it again; a later one does not
    assert nights[7].exit == ExitCode.FAILED
    quiet, _, _ = run_nights(tmp_path / "later", [1.0] * 6 + [1.06] * 5)
    assert quiet[-1].exit == 0 and not quiet[-1].calls


def test_an_undecided_or_unconfirmed_bisect_is_not_an_alert(tmp_path):
    nights, _, _ = run_nights(tmp_path, [1.0] * 6 + [1.06], code=int(ExitCode.INCONCLUSIVE))
    assert nights[-1].exit == ExitCode.INCONCLUSIVE
    assert json.loads((tmp_path / "n6" / nightly.JSON_NAME).read_text())["bisects"][0]["first_bad"] == ""
    text = (tmp_path / "n6" / nightly.MD_NAME).read_text()
    assert text.startswith("Nightly GPU history: no confirmed slowdown") and "undecided" in text
    calm, _, _ = run_nights(tmp_path / "calm", [1.0] * 6 + [1.06], code=0)
    assert calm[-1].exit == 0


def test_a_bisect_that_cannot_run_is_reported_and_its_code_kept(tmp_path, capsys):
    nights, _, root = run_nights(tmp_path, [1.0] * 6 + [1.06], code=int(ExitCode.NO_GPU))
    assert nights[-1].exit == ExitCode.NO_GPU
    assert "ended with exit 6" in capsys.readouterr().err
    assert json.loads((tmp_path / "n6" / nightly.JSON_NAME).read_text())["bisects"][0]["first_bad"] == ""
    assert "stopped (exit 6)" in (tmp_path / "n6" / nightly.MD_NAME).read_text()
    assert len(history.load_history(next(root.rglob("*.json")))["entries"]) == 7  # the night is in the history


def test_a_quiet_history_alerts_nothing(tmp_path):
    nights, _, _ = run_nights(tmp_path, [1.0] * 7)
    assert [n.exit for n in nights] == [0] * 7 and not any(n.calls for n in nights)
    assert "No new candidate" in (tmp_path / "n6" / nightly.MD_NAME).read_text()


def test_releases_are_listed_not_bisected_and_a_finished_run_can_be_added(tmp_path):
    root = tmp_path / "history"
    for i in range(7):
        results = kernel_results("quick", seed=i, captures=30)
        for case in results.cases:
            case.samples["base"] = [x * (1.06 if i == 6 else 1.0) for x in case.samples["base"]]
        results.provenance["time"] = f"2026-11-{i + 1:02d}T00:00:00+00:00"
        results.provenance["vllm"] = {"version": f"0.{20 + i}.0"}
        run = saved(results, tmp_path / f"r{i}.json")
        stages: list = []
        argv = ["--results", str(run), "--history", str(root), "--out", str(tmp_path / f"o{i}")]
        code = nightly.main(argv, run=stages.append, detector=step_detector)
        assert code == 0 and stages == []  # nothing timed, nothing bisected
    text = (tmp_path / "o6" / nightly.MD_NAME).read_text()
    assert "between vLLM 0.25.0 and vLLM 0.26.0 the compiled code may differ" in text
    assert "nox -s gpu_gate -- --vllm installed" in text


def test_bad_input_is_refused_with_the_fix(tmp_path):
    run = saved(kernel_results("quick"), tmp_path / "r.json")
    with pytest.raises(UsageError, match="a 'kernel-bench' run, not 'triton-moe-bench'"):
        nightly.main(["--results", str(run), "--subject", "triton-moe-bench", "--out", str(tmp_path / "o")])
    with pytest.raises(UsageError, match="--recent 0"):
        nightly.main(["--results", str(run), "--recent", "0", "--out", str(tmp_path / "o")])
    with pytest.raises(UsageError, match="not a git checkout"):
        nightly.main(["--results", str(run), "--vllm-src", str(tmp_path), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_only_candidates_between_two_commits_of_one_release_are_bisected():
    def cand(case, good, bad):
        return {"case": case, "good": {"build": good}, "bad": {"build": bad}}

    a = {"vLLM": "0.25.1", "commit": "aaaaaaaaaaaa [Perf] one"}
    b = {"vLLM": "0.25.1", "commit": "bbbbbbbbbbbb two"}
    found = [
        cand("x", a, b),
        cand("y", a, b),
        cand("release-to-commit", {"vLLM": "0.25.1"}, b),
        cand("commit-to-release", a, {"vLLM": "0.25.1"}),
        cand("two-releases", {"vLLM": "0.25.1", "commit": "c" * 12}, {"vLLM": "0.26.0", "commit": "d" * 12}),
    ]
    assert nightly.bisect_pairs(found) == {("aaaaaaaaaaaa", "bbbbbbbbbbbb"): ["x", "y"]}
    assert nightly.commit_of({"commit": "abc def ghi"}) == "abc" and nightly.commit_of({"vLLM": "0.25.1"}) == ""


def test_the_issue_text_exactly(tmp_path):
    night = {"results": "r.json", "machine": "m-x1", "kind": "kernel-bench", "suite": "quick", "history": "h.json"}
    night.update(runs=9, build={"vLLM": "0.25.1"})
    a = {"vLLM": "0.25.1", "commit": "aaaaaaaaaaaa one"}
    b = {"vLLM": "0.25.1", "commit": "bbbbbbbbbbbb two"}
    found = [
        {"case": "x", "index": 8, "good": {"time": "t7", "build": a}, "bad": {"time": "t8", "build": b}, "size": 0.1},
        {
            "case": "y",
            "index": 8,
            "good": {"time": "t7", "build": {"vLLM": "0.25.1"}},
            "bad": {"time": "t8", "build": {"vLLM": "0.26.0"}},
            "size": 0.2,
        },
    ]
    (tmp_path / "b1").mkdir()
    (tmp_path / "b1" / "bisect.md").write_text("### Bisect: found\n\n")
    bisects = [
        {
            "first_bad": "b" * 40,
            "good": "a" * 12,
            "bad": "b" * 12,
            "cases": ["x", "z"],
            "code": 1,
            "status": "found",
            "out": str(tmp_path / "b1"),
        },
        {"good": "c" * 12, "bad": "d" * 12, "cases": ["w"], "code": 1, "status": "found", "out": str(tmp_path / "b2")},
        {"good": "e" * 12, "bad": "f" * 12, "cases": ["v"], "code": 6, "status": "stopped (exit 6)", "out": "o3"},
    ]
    assert nightly.markdown(night, found, bisects) == (
        f"{nightly.TITLE} on m-x1: vLLM commit {'b' * 12} (2 case(s)), ? (1 case(s))\n"
        "\n"
        "Night: r.json (m-x1, kernel-bench, suite quick); the build: vLLM 0.25.1; history: h.json (9 runs).\n"
        "\n" + history.detect_markdown(found).rstrip() + "\n"
        "\n"
        f"#### Bisect {'a' * 12}..{'b' * 12}: found (exit 1)\n"
        "\n"
        "### Bisect: found\n"
        "\n"
        f"#### Bisect {'c' * 12}..{'d' * 12}: found (exit 1)\n"
        "\n"
        f"no report: see {tmp_path / 'b2'}\n"
        "\n"
        f"#### Bisect {'e' * 12}..{'f' * 12}: stopped (exit 6) (exit 6)\n"
        "\n"
        "no report: see o3\n"
        "\n"
        "y: between vLLM 0.25.1 and vLLM 0.26.0 the compiled code may differ, so no bisect was run; judge the two "
        "builds with `nox -s gpu_gate -- --vllm installed` on each.\n"
    )
    quiet = nightly.markdown(night, [], [])
    assert quiet == (
        "Nightly GPU history: no confirmed slowdown\n\nNight: r.json (m-x1, kernel-bench, suite quick); the build: "
        "vLLM 0.25.1; history: h.json (9 runs).\n\nNo new candidate change point: no case's time went up in the last "
        "runs.\n"
    )


def test_the_bisect_is_asked_exactly_and_the_report_records_the_night(tmp_path):
    nights, shas, root = run_nights(tmp_path, [1.0] * 6 + [1.06])
    (argv,) = nights[-1].calls
    cases = sorted(c.id for c in kernel_results("quick").cases)
    out = tmp_path / "n6" / "bisect" / f"{shas[5][:12]}-{shas[6][:12]}"
    assert argv[3:] == [
        "--vllm",
        "installed",
        "--vllm-src",
        str(tmp_path / "vllm-main"),
        "--good",
        shas[5][:12],
        "--bad",
        shas[6][:12],
        "--subject",
        "kernel-bench",
        "--suite",
        "quick",
        "--cases",
        ",".join(cases),
        "--out",
        str(out),
    ]
    payload = json.loads((tmp_path / "n6" / nightly.JSON_NAME).read_text())
    assert (payload["kind"], payload["schema_version"]) == (nightly.KIND, nightly.SCHEMA_VERSION)
    assert len(payload["candidates"]) == len(cases)
    night = payload["night"]
    assert night["results"] == str(tmp_path / "night-6.json") and night["history"] == str(next(root.rglob("*.json")))
    (bisect,) = payload["bisects"]
    assert bisect == {
        "first_bad": shas[6][:12] + "0" * 28,
        "good": shas[5][:12],
        "bad": shas[6][:12],
        "cases": cases,
        "code": 1,
        "status": bisect_core.FOUND,
        "out": str(out),
    }


def test_a_step_among_the_last_recent_runs_is_new_and_no_bisect_lists_it_only(tmp_path):
    nights, _, _ = run_nights(tmp_path / "edge", [1.0] * 6 + [1.06] * 3)  # the step is the 3rd-last run: new
    assert nights[-1].exit == ExitCode.FAILED and nights[-1].calls
    out = tmp_path / "edge" / "n8"  # a rerun into the same folder replaces the stage's own report there
    rerun = ["--results", str(tmp_path / "edge" / "night-8.json"), "--history", str(tmp_path / "edge" / "h2")]
    assert nightly.main([*rerun, "--out", str(out)], run=lambda a: 0, detector=step_detector) == 0
    repo, _ = chain(tmp_path / "listed", 1)
    root = tmp_path / "listed" / "history"
    for i, level in enumerate([1.0] * 6 + [1.06]):
        run = night_run(tmp_path / "listed", repo, i, level)
        argv = ["--results", str(run), "--vllm-src", str(repo), "--history", str(root), "--recent", "1"]
        stages: list = []
        code = nightly.main(
            [*argv, "--no-bisect", "--out", str(tmp_path / "listed" / f"o{i}")],
            run=stages.append,
            detector=step_detector,
        )
        assert code == 0 and stages == []
    assert "13 candidate change point(s)" in (tmp_path / "listed" / "o6" / nightly.MD_NAME).read_text()
    (tmp_path / "foreign").mkdir()
    for other in ({"kind": "gate-bisect", "schema_version": 1}, {"kind": nightly.KIND, "schema_version": 2}):
        (tmp_path / "foreign" / nightly.JSON_NAME).write_text(json.dumps(other))
        with pytest.raises(UsageError, match="was not written by this stage"):
            nightly.main(["--results", str(run), "--history", str(root), "--out", str(tmp_path / "foreign")])


def test_without_a_stand_in_the_bisect_command_runs_as_a_stage(tmp_path, monkeypatch):
    """The default stage: ``--bisect-command`` started as a process (here a script that writes a report and exits
    1, as a bisect that found the commit does), its exit code read back."""
    script = tmp_path / "fake_bisect.py"
    script.write_text(
        "import json, pathlib, sys\n"
        "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1]); out.mkdir(parents=True)\n"
        "bad = sys.argv[sys.argv.index('--bad') + 1]\n"
        "(out / 'bisect.json').write_text(json.dumps({'kind': 'gate-bisect', 'schema_version': 1, 'first_bad': bad}))\n"
        "import os; (out / 'bisect.md').write_text('### from the script, in ' + os.getcwd())\n"
        "sys.exit(1)\n"
    )
    repo, shas = chain(tmp_path, 7)
    root = tmp_path / "history"
    monkeypatch.chdir(tmp_path)  # the stage runs in the project's root wherever nightly is started
    for i, level in enumerate([1.0] * 6 + [1.06]):
        git(repo, "checkout", "-q", shas[i])
        argv = ["--results", str(night_run(tmp_path, repo, i, level)), "--vllm-src", str(repo), "--history", str(root)]
        argv += ["--bisect-command", f"{sys.executable} {script}", "--out", str(tmp_path / f"o{i}")]
        code = nightly.main(argv, detector=step_detector)
    assert code == ExitCode.FAILED
    payload = json.loads((tmp_path / "o6" / nightly.JSON_NAME).read_text())
    assert payload["bisects"][0]["first_bad"] == shas[6][:12]
    assert f"### from the script, in {nightly.ROOT}" in (tmp_path / "o6" / nightly.MD_NAME).read_text()
    script.write_text(script.read_text().replace("'gate-bisect'", "'gate-baseline'"))  # a report of another kind
    git(repo, "checkout", "-q", shas[6])
    argv = ["--results", str(night_run(tmp_path, repo, 7, 1.06)), "--vllm-src", str(repo), "--history", str(root)]
    argv += ["--bisect-command", f"{sys.executable} {script}", "--out", str(tmp_path / "o7")]
    with pytest.raises(DataError, match="gate-baseline"):
        nightly.main(argv, detector=step_detector)


def test_a_night_placed_by_at_is_tonights_build_wherever_it_sits(tmp_path):
    """A back-filled night (``--at``, the date of its code) may sit before the last run; the report names its build,
    not the last run's (on the H100 it named vLLM 0.25.0, timed after the chain, as the chain's last night)."""
    repo, shas = chain(tmp_path, 3)
    root = tmp_path / "history"
    for i in (0, 2):
        git(repo, "checkout", "-q", shas[i])
        nightly.main(
            [
                "--results",
                str(night_run(tmp_path, repo, i, 1.0)),
                "--history",
                str(root),
                "--out",
                str(tmp_path / f"o{i}"),
            ],
            run=lambda a: 0,
            detector=step_detector,
        )
    git(repo, "checkout", "-q", shas[1])
    late = night_run(tmp_path, repo, 1, 1.0)  # its run time is 2026-11-02; placed at 11-01 12:00, between 0 and 2
    argv = ["--results", str(late), "--history", str(root), "--at", "2026-11-01T12:00:00+00:00"]
    assert nightly.main([*argv, "--out", str(tmp_path / "o1")], run=lambda a: 0, detector=step_detector) == 0
    night = json.loads((tmp_path / "o1" / nightly.JSON_NAME).read_text())["night"]
    assert night["build"]["commit"].startswith(shas[1][:12]) and night["runs"] == 3
    data = json.loads(next(root.rglob("*.json")).read_text())
    assert [e["run"].get("at") for e in data["entries"]] == [None, "2026-11-01T12:00:00+00:00", None]
    assert data["entries"][2]["builds"]["base"]["commit"].startswith(shas[2][:12])
