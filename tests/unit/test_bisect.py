"""The bisect (issue 41): the rule over judged pairs, and the runner over a real git history whose steps are
timed by a stand-in bench and judged by the real ``ci.core.compare``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ci.core import bisect as core
from ci.core import compare
from ci.core.errors import DataError, ExitCode, UsageError
from ci.runner import bisect as runner
from tests.unit.factories import kernel_results, saved


def judge_by_levels(levels: dict[str, float], threshold: float = 0.03, calls: list | None = None):
    """A judge over known slowdowns: FAIL above the threshold, PASS below a third of it, else INCONCLUSIVE."""

    def judge(earlier: str, later: str) -> core.Step:
        if calls is not None:
            calls.append((earlier, later))
        ratio = levels[later] / levels[earlier]
        verdict = core.FAIL if ratio > 1 + threshold else core.PASS if ratio < 1 + threshold / 3 else core.INCONCLUSIVE
        return core.Step(
            earlier=earlier,
            later=later,
            verdict=verdict,
            worst=f"case {ratio:.4f}",
            seconds=10.0,
            failed=("case",) if verdict == core.FAIL else (),
        )

    return judge


def builds(n: int) -> list[str]:
    return [f"c{i}" for i in range(n)]


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 40), data=st.data())
def test_a_single_step_is_found_at_its_commit_within_the_planned_steps(n, data):
    bad = data.draw(st.integers(1, n - 1))
    size = data.draw(st.sampled_from([1.04, 1.05, 1.10, 1.5]))
    names = builds(n)
    calls: list = []
    outcome = core.bisect(
        names, judge_by_levels({b: 1.0 if i < bad else size for i, b in enumerate(names)}, calls=calls)
    )
    assert outcome.status == core.FOUND and outcome.first_bad == names[bad] and outcome.last_good == names[bad - 1]
    assert len(outcome.steps) <= core.planned_steps(n) and len(set(calls)) == len(calls)  # no pair judged twice
    assert (outcome.steps[0].earlier, outcome.steps[0].later) == (names[0], names[-1])  # confirmed first
    assert f"first slow build: c{bad} (after c{bad - 1})" in core.headline(outcome)


def test_planned_steps_is_confirm_plus_halvings_plus_the_pin():
    assert [core.planned_steps(n) for n in (2, 3, 5, 9, 17)] == [1, 3, 4, 5, 6]
    with pytest.raises(UsageError, match="at least two builds"):
        core.planned_steps(1)


def test_ends_that_are_not_apart_stop_after_one_step():
    outcome = core.bisect(builds(9), judge_by_levels({b: 1.0 + 0.001 * i for i, b in enumerate(builds(9))}))
    assert outcome.status == core.NOT_CONFIRMED and len(outcome.steps) == 1
    assert core.headline(outcome).startswith("not confirmed: c8 against c0 is PASS")
    at_threshold = core.bisect(builds(5), judge_by_levels({"c0": 1, "c1": 1, "c2": 1.02, "c3": 1.02, "c4": 1.02}))
    assert at_threshold.status == core.NOT_CONFIRMED and at_threshold.steps[0].verdict == core.INCONCLUSIVE


def test_an_inconclusive_half_asks_the_other_half():
    # c0..c2 fast, c3 +2% (INCONCLUSIVE against c0), c4 +6%: the slowdown that matters is c4
    levels = {"c0": 1.0, "c1": 1.0, "c2": 1.02, "c3": 1.02, "c4": 1.06}
    calls: list = []
    outcome = core.bisect(builds(5), judge_by_levels(levels, calls=calls))
    assert calls[:3] == [("c0", "c4"), ("c0", "c2"), ("c2", "c4")]
    assert outcome.status == core.FOUND and (outcome.last_good, outcome.first_bad) == ("c3", "c4")


def test_a_slowdown_spread_over_builds_is_undecided_with_its_range():
    # four 1.2% steps: the ends FAIL (+4.9%), but neither half decides (+2.4% each)
    levels = {f"c{i}": 1.012**i for i in range(5)}
    outcome = core.bisect(builds(5), judge_by_levels(levels))
    assert outcome.status == core.UNDECIDED and (outcome.last_good, outcome.first_bad) == ("c0", "c4")
    assert [s.verdict for s in outcome.steps] == [core.FAIL, core.INCONCLUSIVE, core.INCONCLUSIVE]
    assert core.headline(outcome) == (
        "undecided: the slowdown lies between c0 (fast) and c4 (slow), and no single build between them is slower "
        "than the one before it by more than the threshold"
    )


def test_a_neighbour_pair_that_does_not_fail_leaves_it_undecided():
    # c1 +2.5% and c2 +5% against c0: c1-c2 is +2.4%, INCONCLUSIVE at the pin
    levels = {"c0": 1.0, "c1": 1.025, "c2": 1.05}
    outcome = core.bisect(builds(3), judge_by_levels(levels))
    assert outcome.status == core.UNDECIDED and len(outcome.steps) == 3


def test_same_counts_as_fast_and_the_rule_refuses_what_it_cannot_bisect():
    def judge(earlier, later):
        if (earlier, later) == ("c0", "c1"):
            return core.Step(earlier=earlier, later=later, verdict=core.SAME)
        return judge_by_levels({"c0": 1, "c1": 1, "c2": 1.1})(earlier, later)

    outcome = core.bisect(builds(3), judge)
    assert outcome.first_bad == "c2" and outcome.status == core.FOUND
    with pytest.raises(UsageError, match="two or more distinct builds"):
        core.bisect(["c0", "c0"], judge)
    with pytest.raises(UsageError, match="two or more distinct builds"):
        core.bisect(["c0"], judge)
    with pytest.raises(UsageError, match="verdict must be one of"):
        core.Step(earlier="a", later="b", verdict="MAYBE")


def test_the_report_lists_every_step_with_its_evidence():
    outcome = core.bisect(builds(9), judge_by_levels({b: 1.0 if i < 6 else 1.05 for i, b in enumerate(builds(9))}))
    text = core.markdown(outcome)
    assert text.startswith("### Bisect: first slow build: c6 (after c5): case 1.0500")
    assert (
        f"9 builds, {len(outcome.steps)} steps (at most 5 when none is INCONCLUSIVE), {10 * len(outcome.steps)} s"
        in text
    )
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == len(outcome.steps) and rows[0].startswith("| 1 | c0 | c8 | FAIL | 1 | case 1.0500")


def test_past_compiled_changes_only_the_part_sharing_the_last_builds_kernels_is_judged():
    names = builds(8)  # c3 and c5 change compiled code: only c5..c7 share c7's kernels
    calls: list = []
    late = core.bisect_past_compiled(
        names, [5, 3], judge_by_levels({**dict.fromkeys(names, 1.0), "c7": 1.1}, calls=calls)
    )
    assert late.status == core.FOUND and (late.last_good, late.first_bad) == ("c6", "c7")
    assert all(a in names[5:] and b in names[5:] for a, b in calls)
    assert late.builds == tuple(names[5:]) and late.earlier == tuple(names[:5]) and late.compiled == ("c3", "c5")
    calls.clear()
    levels = {b: 1.0 if i < 2 else 1.1 for i, b in enumerate(names)}  # c2 is the slow one, before c5
    early = core.bisect_past_compiled(names, [3, 5], judge_by_levels(levels, calls=calls))
    assert calls == [("c5", "c7")] and early.status == core.BEFORE_COMPILED
    assert (early.last_good, early.first_bad) == ("c0", "c5")
    assert core.headline(early) == (
        "not after the compiled changes: c7 against c5 is PASS (case 1.0000); any slowdown since c0 lies at or before "
        "c5, across 2 build(s) that change compiled code (c3, c5): judge each pair there with builds from source"
    )
    assert (
        " s.\n\nNot timed: the 5 build(s) from c0 to c4, whose compiled code is not c7's (compiled changes: c3, "
        "c5).\n\n| step |" in core.markdown(early)
    )
    same = core.bisect_past_compiled(names, [6], lambda a, b: core.Step(earlier=a, later=b, verdict=core.SAME))
    assert "c7 against c6 is SAME (no case slower); any slowdown since c0" in core.headline(same)
    plain = core.bisect_past_compiled(names, [], judge_by_levels(levels))
    assert plain.status == core.FOUND and plain.first_bad == "c2" and plain.earlier == plain.compiled == ()
    assert "Not timed" not in core.markdown(plain) and "Not timed" in core.markdown(late)
    undecided = core.bisect_past_compiled(builds(5), [1], judge_by_levels({f"c{i}": 1.012**i for i in range(5)}))
    assert undecided.status == core.UNDECIDED and (undecided.last_good, undecided.first_bad) == ("c1", "c4")


@pytest.mark.parametrize(
    "compiled, match",
    [
        (
            [7],
            "^the last build c7 itself changes compiled code, so no build before it shares its kernels: give a "
            "later --bad, or judge the two ends with builds from source$",
        ),
        ([0], r"compiled changes at \[0\]"),
        ([8, 2], r"at \[2, 8\]"),
    ],
)
def test_past_compiled_refuses_what_no_kernels_can_hold(compiled, match):
    calls: list = []
    with pytest.raises(UsageError, match=match):
        core.bisect_past_compiled(builds(8), compiled, judge_by_levels(dict.fromkeys(builds(8), 1.0), calls=calls))
    assert not calls


# --- the runner over a real git history ---------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_AUTHOR_DATE": "2026-12-01T00:00:00",
        "GIT_COMMITTER_DATE": "2026-12-01T00:00:00",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def history(
    tmp_path: Path,
    speeds: list[float],
    *,
    docs_at: int | None = None,
    compiled_at: int | None = None,
    comment_at: int | None = None,
):
    """A vLLM-like repository, one commit per speed (vllm/speed.py holds it); ``docs_at`` makes that commit touch
    docs only, ``comment_at`` comments and a docstring of vllm/speed.py only, ``compiled_at`` a CUDA source."""
    repo = tmp_path / "vllm"
    (repo / "vllm").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    shas = []
    for i, speed in enumerate(speeds):
        if i == docs_at:
            (repo / "README.md").write_text(f"docs {i}\n")
        elif i == comment_at:
            speed_py = repo / "vllm" / "speed.py"
            speed_py.write_text(f'"""Speeds, commit {i}."""\n# reworded\n' + speed_py.read_text())
        else:
            (repo / "vllm" / "speed.py").write_text(f"COMMIT = {i}\nSLOWDOWN = {speed}\n")
        if i == compiled_at:
            (repo / "csrc").mkdir(exist_ok=True)
            (repo / "csrc" / "moe.cu").write_text(f"// {i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(git(repo, "rev-parse", "HEAD").strip())
    return repo, shas


def standin_stages(repo: Path, tmp_path: Path, seen: list):
    """The stage commands as a GPU host would run them, with the build and the bench stood in for (a kernel-bench
    file whose candidate is the two commits' slowdown ratio apart), and the verdict the real ``ci.core.compare``."""

    def speed(sha: str) -> float:
        return float(git(repo, "show", f"{sha}:vllm/speed.py").split("SLOWDOWN =")[1])

    def run(argv: list[str]) -> int:
        seen.append(argv)
        module = argv[2]
        if module == "ci.trees.build":
            return 0
        if module == "ci.kernel.bench":
            out = Path(argv[argv.index("--out") + 1])
            earlier, later = out.parent.name.split("-")
            full = {s[:12]: s for s in git(repo, "rev-list", "--all").split()}
            ratio = speed(full[later]) / speed(full[earlier])
            saved(kernel_results("quick", ratio=ratio, captures=30, rounds=3), out / "kernel-results.json")
            return 0
        return compare.main(argv[3:])

    return run


def test_the_runner_finds_the_commit_that_made_the_bench_slower(tmp_path):
    speeds = [1.0, 1.0, 1.0, 1.0, 1.0, 1.06, 1.06, 1.06, 1.06]
    repo, shas = history(tmp_path, speeds, docs_at=2)
    seen: list = []
    out = tmp_path / "out"
    argv = ["--vllm-src", str(repo), "--good", shas[0], "--bad", "main", "--suite", "quick", "--out", str(out)]
    code = runner.main(argv, run=standin_stages(repo, tmp_path, seen))
    assert code == ExitCode.FAILED
    payload = json.loads((out / runner.JSON_NAME).read_text())
    assert payload["status"] == core.FOUND and payload["first_bad"] == shas[5] and payload["last_good"] == shas[4]
    assert payload["commits"] == shas and len(payload["steps"]) <= core.planned_steps(9)
    first = payload["steps"][0]
    assert (first["earlier"], first["later"], first["verdict"]) == (shas[0], shas[8], "FAIL") and first["failed"]
    assert all(Path(s["evidence"], "verdict.json").is_file() for s in payload["steps"] if s["verdict"] != "SAME")
    benches = [a for a in seen if a[2] == "ci.kernel.bench"]
    assert "--cases" not in benches[0] and benches[1][benches[1].index("--cases") + 1] == ",".join(first["failed"])
    builds = [a for a in seen if a[2] == "ci.trees.build"]
    assert builds[0][builds[0].index("--base-ref") + 1 :][:3] == [shas[0], "--head-ref", shas[8]]
    assert "--contract" in builds[0] and builds[0][builds[0].index("--contract") + 1] == str(runner.STEP_CONTRACT)
    report = (out / runner.MD_NAME).read_text()
    assert report.startswith(f"### Bisect: first slow build: {shas[5][:12]} commit 5 (after {shas[4][:12]} commit 4)")


def kernel_stages(repo: Path, tmp_path: Path, seen: list) -> runner.Stages:
    """The kernel bench's stages on the quick suite over ``repo``, run by :func:`standin_stages`."""
    return runner.Stages(
        repo=repo,
        vllm="0.25.1",
        out=tmp_path / "o",
        kind="kernel-bench",
        suite="quick",
        cases=None,
        threshold=0.03,
        run=standin_stages(repo, tmp_path, seen),
    )


def test_a_pair_with_the_same_vllm_is_not_timed(tmp_path):
    repo, shas = history(tmp_path, [1.0, 1.0, 1.1], docs_at=1)
    seen: list = []
    stages = kernel_stages(repo, tmp_path, seen)
    step = stages.judge(shas[0], shas[1])
    assert step.verdict == core.SAME and step.note == "no file under vllm/ differs" and not seen


def test_a_pair_that_differs_in_comments_and_docstrings_only_is_not_timed(tmp_path):
    repo, shas = history(tmp_path, [1.0, 1.0, 1.1], comment_at=1)
    seen: list = []
    stages = kernel_stages(repo, tmp_path, seen)
    step = stages.judge(shas[0], shas[1])
    assert step.verdict == core.SAME and not seen
    assert step.note == "no code under vllm/ differs (vllm/speed.py: comments or docstrings)"
    assert runner.code_changed(repo, shas[0], shas[1]) == ([], ["vllm/speed.py"])
    assert runner.code_changed(repo, shas[1], shas[2]) == (["vllm/speed.py"], [])
    assert stages.judge(shas[1], shas[2]).verdict == core.FAIL and seen


def test_ends_not_apart_exit_0_and_a_compiled_commit_as_bad_stops_the_run_before_any_step(tmp_path):
    repo, shas = history(tmp_path, [1.0, 1.0, 1.005])
    out = tmp_path / "out"
    seen: list = []
    base = ["--vllm-src", str(repo), "--good", shas[0], "--bad", shas[-1], "--suite", "quick"]
    assert runner.main([*base, "--out", str(out)], run=standin_stages(repo, tmp_path, seen)) == 0
    assert json.loads((out / runner.JSON_NAME).read_text())["status"] == core.NOT_CONFIRMED
    repo2, shas2 = history(tmp_path / "b", [1.0, 1.0, 1.1], compiled_at=2)
    seen.clear()
    with pytest.raises(UsageError, match=rf"--bad {shas2[2]} itself changes compiled sources \({shas2[2][:12]}: csrc"):
        runner.main(
            ["--vllm-src", str(repo2), "--good", shas2[0], "--bad", shas2[-1], "--out", str(tmp_path / "o2")],
            run=standin_stages(repo2, tmp_path, seen),
        )
    assert not seen and not (tmp_path / "o2").exists()


FROM_SOURCE_TEXT = (
    "Builds from source: build vLLM from source at the commits between the two the headline names (at least at "
    "each compiled change and the commit before it) and judge each pair with `nox -s gpu_gate -- --vllm installed`."
)


def test_a_range_with_a_compiled_change_times_only_the_commits_after_it(tmp_path):
    # c2 changes csrc/: c2..c4 share --bad's kernels. A slowdown at c3 is found; one at c1 is named as before c2.
    repo, shas = history(tmp_path, [1.0, 1.0, 1.0, 1.1, 1.1], compiled_at=2)
    seen: list = []
    out = tmp_path / "late"
    argv = ["--vllm-src", str(repo), "--good", shas[0], "--bad", shas[-1], "--suite", "quick", "--out", str(out)]
    assert runner.main(argv, run=standin_stages(repo, tmp_path, seen)) == int(ExitCode.FAILED)
    report = json.loads((out / runner.JSON_NAME).read_text())
    assert report["first_bad"] == shas[3] and report["commits"] == shas[2:]
    assert report["not_timed"] == shas[:2] and report["compiled"] == [shas[2]]
    refs = {(a[a.index("--base-ref") + 1], a[a.index("--head-ref") + 1]) for a in seen if "--base-ref" in a}
    assert refs and all(b in shas[2:] and h in shas[2:] for b, h in refs)
    repo2, shas2 = history(tmp_path / "b", [1.0, 1.1, 1.1, 1.1, 1.1], compiled_at=2)
    out2 = tmp_path / "early"
    argv2 = ["--vllm-src", str(repo2), "--good", shas2[0], "--bad", shas2[-1], "--suite", "quick", "--out", str(out2)]
    assert runner.main(argv2, run=standin_stages(repo2, tmp_path, [])) == int(ExitCode.ENVIRONMENT)
    report2 = json.loads((out2 / runner.JSON_NAME).read_text())
    assert report2["status"] == core.BEFORE_COMPILED and report2["first_bad"] == shas2[2]
    assert report2["last_good"] == shas2[0] and report2["compiled"] == [shas2[2]]
    text = (out2 / runner.MD_NAME).read_text()
    assert f"lies at or before {shas2[2][:12]} commit 2, across 1 build(s) that change compiled code" in text
    assert f"Not timed: the 2 build(s) from {shas2[0][:12]} commit 0 to {shas2[1][:12]} commit 1" in text
    assert text.endswith(f"\n\n{runner.FROM_SOURCE}\n")
    assert FROM_SOURCE_TEXT == runner.FROM_SOURCE and runner.FROM_SOURCE not in (out / runner.MD_NAME).read_text()


def test_bad_refs_and_a_foreign_folder_are_refused_with_the_fix(tmp_path):
    repo, shas = history(tmp_path, [1.0, 1.1])
    run = standin_stages(repo, tmp_path, [])
    with pytest.raises(UsageError, match="--good nope: not a commit"):
        runner.main(
            ["--vllm-src", str(repo), "--good", "nope", "--bad", shas[1], "--out", str(tmp_path / "o")], run=run
        )
    with pytest.raises(UsageError, match="is not an ancestor of --bad"):
        runner.main(
            ["--vllm-src", str(repo), "--good", shas[1], "--bad", shas[0], "--out", str(tmp_path / "o")], run=run
        )
    with pytest.raises(UsageError, match="the same commit: nothing to bisect"):
        runner.main(
            ["--vllm-src", str(repo), "--good", shas[1], "--bad", shas[1], "--out", str(tmp_path / "o")], run=run
        )
    with pytest.raises(UsageError, match="not a git checkout"):
        runner.main(["--vllm-src", str(tmp_path), "--good", "a", "--bad", "b", "--out", str(tmp_path / "o")], run=run)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / runner.MD_NAME).write_text("my notes\n")
    with pytest.raises(UsageError, match="not written by this stage"):
        runner.main(["--vllm-src", str(repo), "--good", shas[0], "--bad", shas[1], "--out", str(foreign)], run=run)
    assert (foreign / runner.MD_NAME).read_text() == "my notes\n"


def test_a_failing_stage_stops_the_bisect_with_its_code_and_a_bad_verdict_file_is_named(tmp_path):
    repo, shas = history(tmp_path, [1.0, 1.1])

    def run(argv):
        return int(ExitCode.NO_GPU) if argv[2] == "ci.kernel.bench" else 0

    out = tmp_path / "o"
    code = runner.main(["--vllm-src", str(repo), "--good", shas[0], "--bad", shas[1], "--out", str(out)], run=run)
    assert code == ExitCode.NO_GPU and not (out / runner.JSON_NAME).exists()
    broken = tmp_path / "verdict.json"
    broken.write_text(json.dumps({"kind": "gate-verdict", "schema_version": 3, "overall": "PASS", "cases": []}))
    with pytest.raises(DataError, match="no cases or no PASS/FAIL/INCONCLUSIVE"):
        runner.step_of(broken, "a", "b", 1.0)
    broken.write_text(
        json.dumps(
            {"kind": "gate-verdict", "schema_version": 3, "overall": "PASS", "cases": [{"id": "x", "verdict": "PASS"}]}
        )
    )
    with pytest.raises(DataError, match="a case lacks 'effect'"):
        runner.step_of(broken, "a", "b", 1.0)
    with pytest.raises(UsageError, match="no bench registered"):
        runner.Stages(repo=repo, vllm="x", out=out, kind="nothing", suite="q", cases=None, threshold=0.03)


def test_the_other_half_passing_puts_the_slowdown_in_the_first_half():
    # c0-c2 +2.5% (INCONCLUSIVE), c2-c4 +0.9% (PASS): the slowdown is in c1..c2, where it sits under the threshold
    levels = {"c0": 1.0, "c1": 1.0, "c2": 1.025, "c3": 1.034, "c4": 1.034}
    outcome = core.bisect(builds(5), judge_by_levels(levels))
    assert outcome.status == core.UNDECIDED and (outcome.last_good, outcome.first_bad) == ("c1", "c2")


def test_a_pin_that_does_not_fail_is_undecided_and_ends_not_apart_keep_both_ends():
    levels = {"c0": 1.0, "c1": 1.005, "c2": 1.035, "c3": 1.035, "c4": 1.035}
    outcome = core.bisect(builds(5), judge_by_levels(levels))
    assert outcome.status == core.UNDECIDED and (outcome.last_good, outcome.first_bad) == ("c1", "c2")
    assert outcome.steps[-1].verdict == core.INCONCLUSIVE and len(outcome.steps) == 4
    flat = core.bisect(builds(4), judge_by_levels(dict.fromkeys(builds(4), 1.0)))
    assert (flat.status, flat.last_good, flat.first_bad) == (core.NOT_CONFIRMED, "c0", "c3")


def test_the_report_exactly():
    steps = [
        core.Step(
            earlier="a",
            later="c",
            verdict=core.FAIL,
            failed=("x",),
            worst="x 1.0500 [1.04, 1.06]",
            seconds=12.4,
            evidence="steps/a-c/ab",
        ),
        core.Step(earlier="a", later="b", verdict=core.SAME, note="no file under vllm/ differs"),
        core.Step(earlier="b", later="c", verdict=core.FAIL, failed=("x",), worst="x 1.0490 [1.04, 1.06]", seconds=10),
    ]
    outcome = core.Outcome(status=core.FOUND, builds=("a", "b", "c"), last_good="b", first_bad="c", steps=steps)
    assert core.markdown(outcome) == (
        "### Bisect: first slow build: c (after b): x 1.0490 [1.04, 1.06], confirmed by its own A/B (1 case(s) FAIL)\n"
        "\n"
        "3 builds, 3 steps (at most 3 when none is INCONCLUSIVE), 22 s.\n"
        "\n"
        "| step | base (earlier) | candidate (later) | verdict | cases FAIL | slowest case, ratio [95%] | s | "
        "evidence |\n"
        "|---:|---|---|---|---:|---|---:|---|\n"
        "| 1 | a | c | FAIL | 1 | x 1.0500 [1.04, 1.06] | 12 | steps/a-c/ab |\n"
        "| 2 | a | b | SAME (no file under vllm/ differs) | 0 | - | 0 | - |\n"
        "| 3 | b | c | FAIL | 1 | x 1.0490 [1.04, 1.06] | 10 | - |\n"
    )
    quiet = core.Outcome(
        status=core.NOT_CONFIRMED,
        builds=("a", "b"),
        last_good="a",
        first_bad="b",
        steps=[core.Step(earlier="a", later="b", verdict=core.PASS)],
    )
    assert core.headline(quiet) == "not confirmed: b against a is PASS (no case slower); nothing to bisect"
    with pytest.raises(UsageError, match=r"one of FAIL, PASS, INCONCLUSIVE, SAME, not 'MAYBE'$"):
        core.Step(earlier="a", later="b", verdict="MAYBE")


def test_tpot_steps_run_the_tpot_stage_on_its_profile_and_keep_their_one_case(tmp_path):
    repo, shas = history(tmp_path, [1.0, 1.1])
    stages = runner.Stages(
        repo=repo,
        vllm="installed",
        out=tmp_path / "o",
        kind=runner.TPOT,
        suite="default",
        cases=None,
        threshold=0.05,
        tpot_profile="pr-ep",
    )
    argv = stages.bench_argv(Path("m.json"), Path("b"))
    assert argv[1:] == [
        "-m",
        "ci.serving.tpot",
        "--manifest",
        "m.json",
        "--profile",
        "pr-ep",
        "--threshold",
        "0.05",
        "--out",
        "b",
    ]
    assert stages.results_file == "tpot-results.json"

    def judge(earlier, later):
        return core.Step(earlier=earlier, later=later, verdict=core.FAIL, failed=("qwen3/dp1-ep1/pr",))

    stages.judge = judge
    assert runner.run_bisect(shas, stages).status == core.FOUND and stages.cases is None
