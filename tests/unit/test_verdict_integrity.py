"""No PASS without complete evidence, exit codes that mean one thing each, nothing destroyed.

Each test here reproduces a way the gate could be made to pass on evidence that proves nothing,
to report a crash with the FAIL code, or to delete what it did not make (issue: verdicts that
can be trusted); each failed on the gate before these rules.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ci.core import baselines, compare, evidence, stats
from ci.core.cli import run_main
from ci.core.errors import DataError, ExitCode, IncompleteEvidenceError, PatchError, ServerError, UsageError
from ci.core.jsonio import sha256_file
from ci.core.results import CaseResult, load_results
from ci.trees import build, manifest, patching
from tests.unit.factories import BEFORE, MOD, diff, kernel_results, make_release, make_results, saved

ROOT = Path(__file__).resolve().parents[2]
X1 = ROOT / "reports" / "nvidia-h200-x1"


def _edit(path: Path, fn) -> Path:
    payload = json.loads(path.read_text())
    fn(payload)
    path.write_text(json.dumps(payload))
    return path


def _gate(*args: str) -> int:
    return run_main(compare.main, list(args))


# 1. PASS on missing evidence -------------------------------------------------------------------


def test_zero_cases_is_incomplete_not_pass(tmp_path):
    path = saved(make_results({}), tmp_path / "r.json", expected_cases=[])
    assert _gate("--results", str(path), "--out-dir", str(tmp_path / "o")) == ExitCode.INCOMPLETE
    verdict = json.loads((tmp_path / "o" / "verdict.json").read_text())
    assert verdict["overall"] == "INCOMPLETE" and "no case" in verdict["problems"][0]


def test_one_case_of_the_suite_against_its_baseline_is_incomplete(tmp_path, capsys):
    full = {f"c{i}": 1.0 for i in range(5)}
    bdir = tmp_path / "b"
    baselines.record(saved(make_results(full), tmp_path / "full.json"), bdir)
    one = saved(make_results({"c0": 1.0}, seed=3), tmp_path / "one.json")  # a --cases subset of the same suite
    args = ["--results", str(one), "--mode", "baseline", "--baseline-dir", str(bdir), "--out-dir", str(tmp_path / "o")]
    assert _gate(*args) == ExitCode.INCOMPLETE
    assert "4 of the baseline's 5 cases are not in this run: c1, c2, c3, c4" in capsys.readouterr().out


def test_interrupted_tpot_run_against_the_stored_baseline_is_incomplete(tmp_path, capsys):
    """The committed H200 run stopped after 7 rounds (complete: false), measured before the model
    config changed: its ratio against the A/B of then as the stored baseline is 0.30, and that is no PASS."""
    stored = tmp_path / "baselines" / "nvidia-h200-x1" / "tpot-qwen3-30b-a3b-like-dp1-pr.json"
    stored.parent.mkdir(parents=True)
    stored.write_bytes((X1 / "tpot-pr-ab.json").read_bytes())
    args = [
        "--results",
        str(X1 / "tpot-pr-interrupted.json"),
        "--mode",
        "baseline",
        "--baseline-dir",
        str(tmp_path / "baselines"),
        "--out-dir",
        str(tmp_path / "o"),
    ]
    assert _gate(*args) == ExitCode.INCOMPLETE
    out = capsys.readouterr().out
    assert "did not finish (complete: false" in out and "INCOMPLETE" in out


def test_identity_mismatch_against_a_baseline_is_incomplete(tmp_path):
    stored = make_results({"a": 1.0})
    stored.cases[0].info.update(model="m", model_config_sha256="aaa")
    bdir = tmp_path / "b"
    baselines.record(saved(stored, tmp_path / "s.json", identity_keys=["model", "model_config_sha256"]), bdir)
    run = make_results({"a": 1.0}, seed=4)
    run.cases[0].info.update(model="m", model_config_sha256="bbb")  # same name, another config
    path = saved(run, tmp_path / "r.json", identity_keys=["model", "model_config_sha256"])
    gate = compare.compare_baseline(run, baselines.load_baseline(run, bdir), "candidate", 0.03, 0.95, "b")
    assert gate.overall == stats.Verdict.INCOMPLETE and "model_config_sha256 differ" in gate.problems[0]
    assert _gate("--results", str(path), "--mode", "baseline", "--baseline-dir", str(bdir)) == ExitCode.INCOMPLETE


def test_too_few_samples_and_failed_requests_are_incomplete(tmp_path):
    few = make_results({"a": 1.0}, n=3)
    assert any("3 sample(s)" in p for p in evidence.run_problems(few))
    failed = make_results({"a": 1.0})
    failed.cases[0].extra["rounds"] = [{"build": "base", "completed": 254, "failed": 2}]
    assert any("failed requests" in p for p in evidence.run_problems(failed))
    assert compare.compare_ab(failed, 0.03, 0.95).overall == stats.Verdict.INCOMPLETE


def test_a_proven_fail_outranks_missing_evidence():
    results = make_results({"a": 1.10, "b": 1.0})
    results.settings["expected_cases"] = ["a", "b", "c"]
    gate = compare.compare_ab(results, 0.03, 0.95)
    assert gate.overall == stats.Verdict.FAIL and gate.problems
    assert stats.overall([]) == stats.Verdict.INCOMPLETE


def test_a_case_the_candidate_failed_is_a_fail_not_a_gap():
    results = make_results({"a": 1.0})
    results.settings.update(expected_cases=["a", "b"], failed_cases={"b": "b: candidate differs from base"})
    gate = compare.compare_ab(results, 0.03, 0.95)
    assert gate.overall == stats.Verdict.FAIL and not gate.problems
    (failed,) = [c for c in gate.cases if c.id == "b"]
    assert failed.verdict == stats.Verdict.FAIL and "candidate differs" in failed.notes[0]


# 2. bad runs do not become baselines -----------------------------------------------------------


def _bad_runs(tmp_path: Path) -> dict[str, Path]:
    def variant(name, fn=None, ratios=None, **kw):
        results = make_results(ratios or {"a": 1.0, "b": 1.0}, **kw)
        if fn:
            fn(results)
        return name, saved(results, tmp_path / f"{name}.json")

    def correctness(r):
        r.cases[0].extra["correctness"] = {"ok": False, "error": "rel L2 0.7"}

    def failed_requests(r):
        r.cases[0].extra["rounds"] = [{"build": "base", "completed": 0, "failed": 256}]

    def incomplete(r):
        r.settings.update(complete=False, rounds_done=4)

    def zero(r):
        r.cases.clear()

    def subset(r):
        r.settings.update(case_filter="a*", expected_cases=["a"])
        r.cases[:] = r.cases[:1]

    def failed_case(r):
        r.settings["failed_cases"] = {"c": "illegal memory access"}

    return dict(
        [
            variant("correctness", correctness),
            variant("failed-requests", failed_requests),
            variant("incomplete", incomplete),
            variant("zero-cases", zero),
            variant("one-case", subset),
            variant("one-sample", n=1),
            variant("failed-case", failed_case),
        ]
    )


def test_record_refuses_every_run_without_complete_evidence(tmp_path):
    bdir = tmp_path / "b"
    for name, path in _bad_runs(tmp_path).items():
        code = run_main(baselines.main, ["record", str(path), "--dir", str(bdir)])
        assert code == ExitCode.INCOMPLETE, name
    assert not bdir.exists() or not any(bdir.rglob("*.json"))


def test_record_refuses_a_suite_that_is_a_path(tmp_path):
    outside = tmp_path / "outside"
    path = saved(make_results({"a": 1.0}, suite=f"../../../../{outside}"), tmp_path / "r.json")
    assert run_main(baselines.main, ["record", str(path), "--dir", str(tmp_path / "b")]) == ExitCode.DATA
    assert not list(tmp_path.rglob("outside*"))


def test_two_records_at_once_one_wins_the_other_is_refused(tmp_path, monkeypatch):
    bdir = tmp_path / "b"
    first, second = (saved(make_results({"a": 1.0}, seed=s), tmp_path / f"{s}.json") for s in (1, 2))
    barrier = threading.Barrier(2)
    real_link = os.link

    def link_together(src, dst):  # both writers reach the create step at the same moment
        barrier.wait(timeout=10)
        return real_link(src, dst)

    monkeypatch.setattr(baselines.os, "link", link_together)
    outcome = {}

    def record(path):
        try:
            outcome[path.name] = baselines.record(path, bdir)
        except UsageError as exc:
            outcome[path.name] = exc

    threads = [threading.Thread(target=record, args=(p,)) for p in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [v for v in outcome.values() if isinstance(v, UsageError)]
    assert len(errors) == 1 and "recorded by someone else meanwhile" in str(errors[0])
    (stored,) = (bdir / "nvidia-h200-x1").glob("*.json")
    winner = next(k for k, v in outcome.items() if not isinstance(v, UsageError))
    assert json.loads(stored.read_text()) == json.loads((tmp_path / winner).read_text())


# 3. crashes and misuse have their own codes ---------------------------------------------------


@pytest.mark.parametrize(
    ("name", "edit"),
    [
        ("empty sample list", lambda p: p["cases"][0]["samples"].update(base=[])),
        ("info of the wrong type", lambda p: p["cases"][0].update(info=[1, 2])),
        ("empty block-size sweep", lambda p: p["cases"][0]["extra"].update(block_sizes_us={"8": []})),
        ("provenance.gpu a string", lambda p: p["provenance"].update(gpu="H200")),
        ("true as a sample", lambda p: p["cases"][0]["samples"]["base"].__setitem__(0, True)),
        ("expected_cases not a list", lambda p: p["settings"].update(expected_cases="a")),
    ],
)
def test_malformed_results_are_a_data_error_not_a_fail(tmp_path, name, edit, capsys):
    path = _edit(saved(make_results({"a": 1.0}), tmp_path / "r.json"), edit)
    assert _gate("--results", str(path), "--out-dir", str(tmp_path / "o")) == ExitCode.DATA, name
    err = capsys.readouterr().err
    assert str(path) in err or "case 'a'" in err or "case a" in err
    assert "Traceback" not in err


def test_missing_build_is_incomplete_not_usage(tmp_path):
    path = _edit(
        saved(make_results({"a": 1.0}), tmp_path / "r.json"), lambda p: p["cases"][0]["samples"].pop("candidate")
    )
    assert _gate("--results", str(path), "--out-dir", str(tmp_path / "o")) == ExitCode.INCOMPLETE


def test_a_bug_of_the_gate_is_an_internal_error_never_fail(tmp_path, monkeypatch, capsys):
    path = saved(make_results({"a": 1.0}), tmp_path / "r.json")
    monkeypatch.setattr(compare, "compare_ab", lambda *a: 1 / 0)
    assert _gate("--results", str(path)) == ExitCode.INTERNAL == 70
    assert "ZeroDivisionError" in capsys.readouterr().err


def test_exit_codes_are_distinct():
    codes = [int(c) for c in ExitCode]
    assert len(codes) == len(set(codes))
    assert set(compare.EXIT_CODES) == set(stats.Verdict)


# 4. nox keeps the codes ------------------------------------------------------------------------


def _nox_gate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    cmd = [
        sys.executable,
        "-m",
        "nox",
        "--no-venv",
        "-f",
        str(ROOT / "noxfile.py"),
        "-s",
        "gate",
        "--",
        *args,
        "--out-dir",
        str(tmp_path / "o"),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)


def test_nox_passes_the_stages_exit_code_through(tmp_path):
    fail = saved(kernel_results(ratio=1.10), tmp_path / "fail.json")
    nobase = saved(kernel_results(), tmp_path / "nobase.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    incomplete = saved(kernel_results(), tmp_path / "inc.json", complete=False)
    cases = {
        ExitCode.FAILED: ["--results", str(fail)],
        ExitCode.NO_BASELINE: ["--results", str(nobase), "--mode", "baseline", "--baseline-dir", str(tmp_path)],
        ExitCode.DATA: ["--results", str(bad)],
        ExitCode.INCOMPLETE: ["--results", str(incomplete)],
        ExitCode.OK: ["--results", str(saved(kernel_results(), tmp_path / "ok.json"))],
    }
    for code, args in cases.items():
        done = _nox_gate(tmp_path, *args)
        assert done.returncode == code, (code, done.stdout[-2000:], done.stderr[-2000:])


# 6. the builder destroys nothing it did not make ------------------------------------------------


@pytest.fixture
def patch_file(tmp_path: Path) -> Path:
    p = tmp_path / "change.patch"
    p.write_text(diff(MOD, BEFORE, BEFORE.replace("m = m\n", "m = m // 2\n")))
    return p


def test_out_dir_with_foreign_files_is_refused_and_kept(tmp_path, patch_file):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(UsageError, match="did not make"):
        build.build_trees(build.BuildOptions(patch=patch_file, out=out), release=make_release(tmp_path / "rel"))
    assert (out / "thesis.tex").read_text() == "years of work"


def test_failed_patch_keeps_the_previous_trees(tmp_path, patch_file):
    release = make_release(tmp_path / "rel")
    out = tmp_path / "out"
    good = build.build_trees(build.BuildOptions(patch=patch_file, out=out), release=release)
    broken = tmp_path / "broken.patch"
    broken.write_text(diff(MOD, BEFORE.replace("LIMIT = 3", "LIMIT = 4"), BEFORE.replace("LIMIT = 3", "LIMIT = 5")))
    with pytest.raises(PatchError):
        build.build_trees(build.BuildOptions(patch=broken, out=out), release=release)
    assert manifest.load_trees(good.manifest_path).manifest == good.manifest
    assert not [p for p in tmp_path.iterdir() if ".building-" in p.name], "a half-built folder was left behind"
    again = build.build_trees(build.BuildOptions(patch=patch_file, out=out), release=release)  # replaces its own
    assert again.manifest.created_at >= good.manifest.created_at


def test_missing_vllm_src_is_refused_before_anything_is_touched(tmp_path, patch_file):
    out = tmp_path / "out"
    good = build.build_trees(build.BuildOptions(patch=patch_file, out=out), release=make_release(tmp_path / "rel"))
    opts = build.BuildOptions(patch=patch_file, out=out, vllm_src=tmp_path / "no-such-checkout")
    with pytest.raises(UsageError, match="no vllm/ package"):
        build.build_trees(opts, release=make_release(tmp_path / "rel2"))
    assert manifest.load_trees(good.manifest_path).manifest == good.manifest


def test_rename_into_csrc_and_mode_only_patches_are_refused(tmp_path):
    rename = tmp_path / "rename.patch"
    rename.write_text(
        f"diff --git a/{MOD} b/csrc/mod.py\nsimilarity index 100%\nrename from {MOD}\nrename to csrc/mod.py\n"
    )
    assert ("vllm/layers/mod.py", "csrc/mod.py") in patching.touched_paths(rename)
    with pytest.raises(PatchError, match="CUDA/C"):
        build.build_trees(build.BuildOptions(patch=rename, out=tmp_path / "o1"), release=make_release(tmp_path / "r"))
    out_of_vllm = tmp_path / "move-out.patch"
    out_of_vllm.write_text(
        f"diff --git a/{MOD} b/docs/mod.py\nsimilarity index 100%\nrename from {MOD}\nrename to docs/mod.py\n"
    )
    with pytest.raises(PatchError, match="across the vllm/ package"):
        build.build_trees(
            build.BuildOptions(patch=out_of_vllm, out=tmp_path / "o2"), release=make_release(tmp_path / "s")
        )
    mode = tmp_path / "mode.patch"
    mode.write_text(f"diff --git a/{MOD} b/{MOD}\nold mode 100644\nnew mode 100755\n")
    with pytest.raises(PatchError, match="changes the content of no file"):
        build.build_trees(build.BuildOptions(patch=mode, out=tmp_path / "o3"), release=make_release(tmp_path / "t"))
    assert not (tmp_path / "o3").exists()


# 7. processes and ports -------------------------------------------------------------------------


def test_a_server_of_another_run_on_the_port_is_not_measured(tmp_path, monkeypatch):
    """The race: another run's server binds the port between our check and our server's start."""
    from ci.serving import config as serving_config
    from ci.serving import server as srv
    from tests.unit.factories import fake_tree

    tree = fake_tree(tmp_path / "t")
    monkeypatch.setenv("STANDIN_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    port = srv.free_port(21500 + os.getpid() % 400)
    profile = serving_config.PROFILES["smoke"]
    argv = serving_config.serve_argv(
        tree,
        serving_config.model_dir("qwen3-30b-a3b-like"),
        port=port,
        profile=profile,
        dp=1,
        seed=0,
        name="gate-other-run-base",
    )
    env = serving_config.server_env(tree)
    with srv.Server("other run", argv, port=port, log=tmp_path / "other.log", env=env) as other:
        other.wait_healthy(30)
        monkeypatch.setattr(srv, "port_in_use", lambda port: False)  # our check ran before the other bound
        sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]  # our server, still loading
        mine = srv.Server("mine", sleeper, port=port, log=tmp_path / "mine.log", env=env, served_name="gate-me-base")
        with mine, pytest.raises(ServerError, match="another server holds the port"):
            mine.wait_healthy(30)


def test_a_killed_gate_takes_its_servers_with_it(tmp_path):
    """SIGKILL of the process that started a server (no clean-up ran) still ends the server."""
    script = (
        "import sys, time\nfrom pathlib import Path\nfrom ci.serving.server import Server, free_port\n"
        "s = Server('x', [sys.executable, '-c', 'import time; time.sleep(120)'], port=free_port(23000),\n"
        "           log=Path(sys.argv[1]), env={}).start()\n"
        "print(s.proc.pid, flush=True)\ntime.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "l.log")], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as fh:
            if fh.read().split()[2] == "Z":
                break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the server outlived the gate process that was killed")


# 8. stale outputs -------------------------------------------------------------------------------


def test_an_error_removes_the_earlier_verdict_and_keeps_other_files(tmp_path):
    out = tmp_path / "o"
    ok = saved(make_results({"a": 1.0}), tmp_path / "ok.json")
    assert _gate("--results", str(ok), "--out-dir", str(out)) == ExitCode.OK
    assert (out / "verdict.json").is_file() and (out / "plot.png").is_file()
    (out / "notes.txt").write_text("mine")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert _gate("--results", str(bad), "--out-dir", str(out)) == ExitCode.DATA
    assert not (out / "verdict.json").exists() and not (out / "plot.png").exists()
    assert (out / "notes.txt").read_text() == "mine"
    nobase = saved(make_results({"a": 1.0}, suite="nothing"), tmp_path / "nb.json")
    assert _gate("--results", str(ok), "--out-dir", str(out)) == ExitCode.OK
    args = ["--results", str(nobase), "--mode", "baseline", "--baseline-dir", str(tmp_path / "none"), "--out-dir"]
    assert _gate(*args, str(out)) == ExitCode.NO_BASELINE
    assert not (out / "verdict.json").exists(), "a PASS verdict outlived a NO_BASELINE run"


def test_the_gate_never_removes_a_verdict_file_it_did_not_write(tmp_path, capsys):
    """Issue 21, item 4: a report.md or verdict.json of someone else's in --out was deleted, even by a run
    that then failed. Only the files of the stage's own marker (with their sha256) are replaced now."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "report.md").write_text("my notes")
    ok = saved(make_results({"a": 1.0}), tmp_path / "ok.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    for results in (bad, ok):
        assert _gate("--results", str(results), "--out", str(out)) == ExitCode.USAGE
        assert (out / "report.md").read_text() == "my notes" and not (out / "verdict.json").exists()
    assert "report.md there was not written by ci.core.compare (or changed since)" in capsys.readouterr().err
    (out / "report.md").unlink()
    assert _gate("--results", str(ok), "--out", str(out)) == ExitCode.OK
    (out / "verdict.json").write_text("{}")  # its own file, changed since: no longer its own
    assert _gate("--results", str(ok), "--out", str(out)) == ExitCode.USAGE
    assert (out / "verdict.json").read_text() == "{}"


# 5. one crashing candidate fails alone ----------------------------------------------------------

CRASHING_SUITE = """
import os
import pytest

BROKEN = []  # this process's "CUDA context": broken for good once a test crashed the kernel


def _gpu_call():
    if BROKEN:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize("i", range(3))
def test_base_before(i):
    _gpu_call()


def test_candidate_crashes_the_kernel():
    BROKEN.append(os.getpid())
    _gpu_call()


@pytest.mark.parametrize("i", range(6))
def test_base_after(i):
    _gpu_call()
"""


def _run_with_isolation(pytester, monkeypatch, suite: str, *args: str, conftest: str = ""):
    """Run ``suite`` in a subprocess under one xdist worker with the crash-isolation plugin loaded."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("GATE_CUDA_ISOLATION_DIR", raising=False)
    pytester.makepyfile(test_suite=suite)
    pytester.makeconftest("pytest_plugins = ['tests.cuda_isolation']\n" + conftest)
    return pytester.runpytest_subprocess("-n", "1", "-p", "xdist", *args)


def test_a_test_that_breaks_the_cuda_context_fails_alone(pytester, monkeypatch):
    """One worker (-n 1, so every test after the crash would share its process): the crashing test
    fails, every other test passes in a fresh worker, none is reported as crashed."""
    result = _run_with_isolation(pytester, monkeypatch, CRASHING_SUITE, "-rA")
    result.assert_outcomes(passed=9, failed=1)
    out = result.stdout.str()
    assert "FAILED test_suite.py::test_candidate_crashes_the_kernel" in out
    assert "hit a fatal CUDA error (CUDA error: an illegal memory access)" in out
    assert "replacing crashed worker" in out and "crashed while running" not in out.replace("left after", "")
    assert result.ret == 1


MANY_CRASHES_SUITE = """
import os
import pytest

BROKEN = []


@pytest.mark.parametrize("i", range(6))
def test_candidate_crashes_the_kernel(i):
    BROKEN.append(os.getpid())
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize("i", range(4))
def test_base_after(i):
    if BROKEN:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
"""


def test_more_crashes_than_xdists_restart_limit_still_run_every_test(pytester, monkeypatch):
    """xdist replaces at most 4 crashed workers per worker by default; on the H200, 17 isolations (-n 4,
    limit 16) left one test never run and never reported. Isolations do not count against the limit."""
    result = _run_with_isolation(pytester, monkeypatch, MANY_CRASHES_SUITE, "-rA")
    result.assert_outcomes(passed=4, failed=6)
    out = result.stdout.str()
    assert "maximum crashed workers reached" not in out and "never ran" not in out


def test_a_collected_test_without_a_result_fails_the_run_with_its_name(pytester, monkeypatch):
    """Whatever loses a test (here xdist's restart limit, set to 0), the run fails and names it."""
    no_compensation = (
        "def pytest_configure(config):\n    config.pluginmanager.getplugin('tests.cuda_isolation')._config = None\n"
    )
    result = _run_with_isolation(
        pytester,
        monkeypatch,
        MANY_CRASHES_SUITE.replace("range(6)", "range(1)"),
        "--max-worker-restart",
        "0",
        conftest=no_compensation,
    )
    out = result.stdout.str()
    assert "collected test(s) never ran" in out and "never ran: test_suite.py::test_base_after[0]" in out
    assert result.ret == 1


def test_never_ran_keeps_collection_order_and_fails_an_otherwise_green_run(monkeypatch):
    from types import SimpleNamespace

    from tests import cuda_isolation

    assert cuda_isolation.never_ran(["a", "b", "c", "d"], {"b", "x"}) == ["a", "c", "d"]
    config = SimpleNamespace(pluginmanager=SimpleNamespace(getplugin=lambda name: None))
    session = SimpleNamespace(config=config, exitstatus=pytest.ExitCode.OK)
    monkeypatch.setattr(cuda_isolation, "_collected", ["a", "b"])
    monkeypatch.setattr(cuda_isolation, "_reported", {"a", "b"})
    cuda_isolation.pytest_sessionfinish(session, 0)
    assert session.exitstatus == pytest.ExitCode.OK, "every collected test reported: the run stands"
    monkeypatch.setattr(cuda_isolation, "_reported", {"a"})
    cuda_isolation.pytest_sessionfinish(session, 0)
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED


NOXFILE_WITH_A_SLOW_STAGE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("gate_noxfile", {noxfile!r})
gate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gate)
import nox

@nox.session(python=False)
def slow(session):
    gate._stage(session, sys.executable, {child!r})
"""
SLOW_STAGE = """
import signal, sys, time
def stop(*_):
    print("stage: SIGINT, stopping its servers", flush=True)
    time.sleep(0.5)
    print("stage: servers stopped", flush=True)
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
print("stage: running", flush=True)
time.sleep(60)
"""


def test_sigterm_to_nox_lets_the_stage_stop_its_servers(tmp_path):
    """A cancelled job sends nox SIGTERM: the stage must get the interrupt and time to clean up (before,
    nox died at once, or waited out the stage without telling it, and its servers stayed up)."""
    child = tmp_path / "stage.py"
    child.write_text(SLOW_STAGE)
    noxfile = tmp_path / "noxfile.py"
    noxfile.write_text(NOXFILE_WITH_A_SLOW_STAGE.format(noxfile=str(ROOT / "noxfile.py"), child=str(child)))
    cmd = [sys.executable, "-m", "nox", "-f", str(noxfile), "-s", "slow"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 30
    lines = []
    while time.time() < deadline:
        lines.append(proc.stdout.readline())
        if "stage: running" in lines[-1]:
            break
    proc.send_signal(signal.SIGTERM)
    out = "".join(lines) + proc.communicate(timeout=30)[0]
    assert "stage: SIGINT, stopping its servers" in out and "stage: servers stopped" in out
    assert proc.returncode == 130


def test_a_busy_gpu_has_its_own_exit_code_not_no_gpu(tmp_path, monkeypatch, capsys):
    from ci.host import gpu
    from ci.kernel import bench

    busy = gpu.GpuInfo(index=0, name="NVIDIA H200", uuid="u", memory_total_mib=143771, memory_used_mib=120000)
    monkeypatch.setattr(bench, "load_trees", lambda manifest: None)
    monkeypatch.setattr(gpu, "query", lambda: ("580", [busy]))
    args = ["--manifest", str(tmp_path / "m.json"), "--out", str(tmp_path / "r"), "--suite", "quick"]
    assert run_main(bench.main, args) == ExitCode.GPU_BUSY == 11
    assert "the GPU is busy: GPU 0 (NVIDIA H200): 120000 of 143771 MiB in use" in capsys.readouterr().err
    assert run_main(bench.main, [*args, "--captures", "3"]) == ExitCode.USAGE  # fewer than 6 captures
    from ci.serving import tpot

    monkeypatch.setattr(tpot, "load_trees", lambda manifest: None)
    assert run_main(tpot.main, ["--manifest", "m.json", "--out", str(tmp_path / "t")]) == ExitCode.GPU_BUSY
    assert "the GPU is busy: GPU 0 (NVIDIA H200)" in capsys.readouterr().err
    from ci.triton_moe import bench as triton_bench

    monkeypatch.setattr(triton_bench, "load_trees", lambda manifest: None)
    assert run_main(triton_bench.main, ["--manifest", "m.json", "--out", str(tmp_path / "x")]) == ExitCode.GPU_BUSY
    assert "the GPU is busy: GPU 0 (NVIDIA H200)" in capsys.readouterr().err


def test_every_measuring_stage_takes_a_folder_and_replaces_only_its_own_file(tmp_path, capsys):
    """bench and tpot write kernel-results.json / tpot-results.json into --out DIR (ci/host/outputs.py); a
    .json --out (a file) and a file of that name the gate did not write are refused before anything runs."""
    from ci.host import outputs
    from ci.kernel import bench
    from ci.serving import tpot

    for main, name in ((bench.main, outputs.KERNEL_RESULTS), (tpot.main, outputs.TPOT_RESULTS)):
        argv = ["--manifest", str(tmp_path / "m.json"), "--out"]
        assert run_main(main, [*argv, str(tmp_path / "r.json")]) == ExitCode.USAGE
        assert (
            f"--out {tmp_path / 'r.json'}: --out is the folder the stage writes {name} into; pass a folder, "
            f"e.g. --out {tmp_path / 'r'}" in capsys.readouterr().err
        )
        mine = tmp_path / "mine" / name
        mine.parent.mkdir(exist_ok=True)
        mine.write_text("my notes\n")
        assert run_main(main, [*argv, str(mine.parent)]) == ExitCode.USAGE
        assert f"{name} there is not a results file of this gate" in capsys.readouterr().err
        assert mine.read_text() == "my notes\n"
    ours = tmp_path / "ours"
    ours.mkdir()
    kernel_results().save(ours / outputs.KERNEL_RESULTS)  # an earlier run's file: the stage may replace it
    assert outputs.results_file(ours, outputs.KERNEL_RESULTS) == ours / outputs.KERNEL_RESULTS


def test_a_folder_with_a_copied_manifest_but_no_marker_is_not_the_builders(tmp_path, patch_file):
    """A manifest of kind vllm-trees copied into a folder of one's own files once made the builder take the
    folder for its own and delete it; only its marker counts now."""
    release = make_release(tmp_path / "rel")
    built = build.build_trees(build.BuildOptions(patch=patch_file, out=tmp_path / "trees"), release=release)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    (mine / "manifest.json").write_text(built.manifest_path.read_text())
    with pytest.raises(UsageError, match="holds files the gate did not make"):
        build.build_trees(build.BuildOptions(patch=patch_file, out=mine), release=release)
    assert (mine / "thesis.tex").read_text() == "years of work"


# Completeness is the gate's definition, never the file's word (issue 21, item 2) --------------------------


def _one_of_the_default_suite(tmp_path: Path) -> Path:
    """A kernel results file of suite default holding 1 of its 153 cases, saying complete: true and listing
    no expected cases: it PASSed A/B and became the default baseline."""
    full = kernel_results("default", case_filter="deepseek-v3/ep1/tpr1/gptq*")
    full.settings = {"complete": True, "aa": False}
    return saved(full, tmp_path / "one.json")


def test_a_file_that_says_complete_but_holds_one_case_of_its_suite_is_incomplete(tmp_path, capsys):
    one = _one_of_the_default_suite(tmp_path)
    assert _gate("--results", str(one), "--out", str(tmp_path / "o")) == ExitCode.INCOMPLETE
    assert "164 of the 165 cases of suite 'default' are missing: deepseek-v3/ep1/tpr4/" in capsys.readouterr().out
    with pytest.raises(IncompleteEvidenceError, match="164 of the 165 cases of suite 'default' are missing"):
        baselines.record(one, tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_a_suite_or_profile_the_gate_does_not_define_is_incomplete(tmp_path):
    made_up = kernel_results("quick")
    made_up.suite = "mine"
    assert evidence.run_problems(made_up)[0] == (
        "suite 'mine' is not one the kernel bench defines (default, high_load, quick): "
        "these results were not written by this gate's bench; re-run it"
    )
    tpot = load_results(X1 / "tpot-pr-aa.json")  # one launch pair of 8 rounds: the pr profile runs 9 pairs of 1
    assert evidence.run_problems(tpot) == [
        f"case {tpot.cases[0].id}: 8 sample(s) of '{b}', at least 9 are needed" for b in ("base", "candidate")
    ]
    for b in ("base", "candidate"):
        tpot.cases[0].samples[b] *= 2
    tpot.cases[0].extra["captures"] = {b: [i // 2 for i in range(16)] for b in ("base", "candidate")}
    assert evidence.run_problems(tpot) == [  # 8 launch pairs of 2 rounds: enough rounds, one pair too few
        f"case {tpot.cases[0].id}: 8 capture(s) of '{b}', at least 9 are needed (the interval is over captures)"
        for b in ("base", "candidate")
    ]
    assert evidence.run_problems(tpot, design_floors=False) == []  # a finished run of an earlier design: poolable
    tpot.cases[0].extra["captures"] = {b: [min(i, 8) for i in range(16)] for b in ("base", "candidate")}
    assert evidence.run_problems(tpot) == []  # 9 launch pairs
    tpot.settings["complete"] = False
    assert evidence.run_problems(tpot, design_floors=False)[0].startswith("the run did not finish")
    del tpot.settings["complete"]
    tpot.suite = "qwen3-30b-a3b-like-dp1-fast"
    del tpot.cases[0].extra["captures"]  # one capture: the floor of an undefined suite asks for no more
    (problem,) = evidence.run_problems(tpot)
    assert problem.startswith("suite 'qwen3-30b-a3b-like-dp1-fast' is not one the TPOT stage defines")


def test_force_never_shrinks_a_baseline(tmp_path):
    bdir = tmp_path / "b"
    baselines.record(saved(kernel_results("quick"), tmp_path / "full.json"), bdir)
    subset = kernel_results("quick", case_filter="deepseek-v3/*")  # a subset: refused as a record anyway
    subset.settings["case_filter"] = None
    subset.cases = subset.cases[:3]
    stored = bdir / "nvidia-h200-x1" / "quick.json"
    before = stored.read_bytes()
    with pytest.raises(IncompleteEvidenceError):
        baselines.record(saved(subset, tmp_path / "sub.json"), bdir, force=True)
    assert stored.read_bytes() == before


def test_force_that_would_drop_cases_of_the_stored_baseline_is_refused(tmp_path, monkeypatch):
    """The suite lost cases (here: the stored baseline holds one more than the suite now defines)."""
    bdir = tmp_path / "b"
    path = baselines.record(saved(kernel_results("quick"), tmp_path / "full.json"), bdir)
    payload = json.loads(path.read_text())
    extra = dict(payload["cases"][0], id="gone/ep1/tpr1/gptq-int4-g128/bf16")
    payload["cases"].append(extra)
    path.write_text(json.dumps(payload))
    with pytest.raises(
        UsageError,
        match=r"lacks 1 of the stored baseline's cases \(gone/ep1/tpr1/gptq-int4-g128/bf16"
        r"\): --force replaces a baseline, it never shrinks one. If the suite dropped those cases on purpose, "
        r"remove the old file \(git rm\) and record again$",
    ):
        baselines.record(saved(kernel_results("quick", seed=2), tmp_path / "new.json"), bdir, force=True)
    assert json.loads(path.read_text()) == payload


def test_a_baseline_that_is_not_complete_by_the_gates_definition_is_no_reference(tmp_path, capsys):
    bdir = tmp_path / "b"
    path = baselines.record(saved(kernel_results("quick"), tmp_path / "full.json"), bdir)
    payload = json.loads(path.read_text())
    payload["cases"] = payload["cases"][:1]  # edited by hand after the record
    path.write_text(json.dumps(payload))
    run = saved(kernel_results("quick", seed=3), tmp_path / "run.json")
    args = ["--results", str(run), "--mode", "baseline", "--baseline-dir", str(bdir), "--out", str(tmp_path / "o")]
    assert _gate(*args) == ExitCode.INCOMPLETE
    assert "the baseline: 12 of the 13 cases of suite 'quick' are missing" in capsys.readouterr().out


def test_the_committed_baselines_are_complete_by_the_gates_definition():
    for path in sorted((ROOT / "baselines").rglob("*.json")):
        assert evidence.record_problems(load_results(path)) == [], path


# Strict types for what the verdict reads (issue 21, item 8) --------------------------------------------


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.update(schema_version=True), "schema_version=True is not one this gate reads"),
        (lambda p: p["settings"].update(complete="false"), "settings.complete should be true or false, found 'false'"),
        (lambda p: p["settings"].update(aa=0), "settings.aa should be true or false, found 0"),
        (lambda p: p["settings"].update(rounds_done=True), "settings.rounds_done should be an integer, found True"),
        (lambda p: p["settings"].update(case_filter=["a"]), "settings.case_filter should be a string, found ['a']"),
    ],
)
def test_a_field_the_verdict_reads_must_have_its_type(tmp_path, edit, message):
    path = saved(make_results({"a": 1.0}), tmp_path / "r.json")
    payload = json.loads(path.read_text())
    edit(payload)
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError) as err:
        load_results(path)
    assert message in str(err.value)


def test_a_suite_name_with_a_line_break_makes_no_file(tmp_path):
    results = kernel_results()
    results.suite = "default\n"
    with pytest.raises(DataError, match="is not a plain name"):
        baselines.baseline_path(results, tmp_path)


def test_case_and_sample_counts_are_bounded_and_checked_in_linear_time(tmp_path):
    """100,000 cases: the duplicate check (list.count) gave no answer in 90 s; now a clear refusal."""
    from ci.core import results as results_module

    big = make_results({})
    big.cases = [CaseResult(id=f"c{i}", unit="us", samples={"base": [1.0]}) for i in range(100_000)]
    path = saved(big, tmp_path / "big.json")
    with pytest.raises(DataError, match=r"100000 cases, more than the 10000 the gate reads"):
        load_results(path)
    many = make_results({"a": 1.0}, n=results_module.MAX_SAMPLES + 1)
    with pytest.raises(DataError, match=r"20001 samples, more than the 20000 the gate reads"):
        load_results(saved(many, tmp_path / "many.json"))
    ids = {f"c{i}": 1.0 for i in range(10_000)}
    wide = make_results(ids, n=6)
    wide.settings["expected_cases"] = list(reversed(ids))
    assert evidence.run_problems(wide) == []


def test_a_release_that_requires_a_url_is_refused():
    from ci.trees import release_deps

    metadata = "Metadata-Version: 2.1\nName: vllm\nRequires-Dist: torch==2.11.0\nRequires-Dist: {}\n"
    for req in (
        "evil @ https://example.com/evil-1.0.tar.gz",
        "kern @ git+https://example.com/k.git",
        "local @ file:///tmp/x.whl",
    ):
        with pytest.raises(ValueError, match="refusing a URL requirement"):
            release_deps.cpu_tier_requirements(metadata.format(req))
    lines, _ = release_deps.cpu_tier_requirements(metadata.format("numpy<2.4"))
    assert lines == ["torch==2.11.*", "numpy<2.4"]


def test_the_marker_lists_what_the_stage_wrote_and_only_that_is_replaced(tmp_path, capsys):
    out = tmp_path / "o"
    ok = saved(make_results({"a": 1.0}), tmp_path / "ok.json")
    assert _gate("--results", str(ok), "--out", str(out)) == ExitCode.OK
    marker = json.loads((out / compare.OUTPUTS_MARKER).read_text())
    assert marker == {
        "kind": "gate-outputs",
        "schema_version": 1,
        "files": {n: sha256_file(out / n) for n in ("plot.png", "report.md", "verdict.json")},
    }
    (out / "plot.png").unlink()  # one of its own files gone since: no reason to stop
    (out / "notes.txt").write_text("mine")
    payload = {**marker, "files": {**marker["files"], "notes.txt": sha256_file(out / "notes.txt")}}
    (out / compare.OUTPUTS_MARKER).write_text(json.dumps(payload))  # a marker that names a file of mine
    assert _gate("--results", str(ok), "--out", str(out)) == ExitCode.OK
    assert (out / "notes.txt").read_text() == "mine", "only the stage's own output names are ever removed"
    (out / compare.OUTPUTS_MARKER).write_text("[]")  # a marker that is no marker: its files are not its own
    assert _gate("--results", str(ok), "--out", str(out)) == ExitCode.USAGE
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            f"--out {out}: verdict.json, report.md, plot.png there were not written by ci.core.compare "
            "(or changed since): the stage replaces only its own files; pick another --out folder (nothing was removed)"
        )
    )


def test_the_bounds_are_inclusive_and_the_messages_exact(tmp_path):
    from ci.core import results as results_module

    at_most = make_results({"a": 1.0}, n=results_module.MAX_SAMPLES)
    assert len(load_results(saved(at_most, tmp_path / "max.json")).cases[0].samples["base"]) == 20_000
    edge = make_results({})
    edge.cases = [CaseResult(id=f"c{i}", unit="us", samples={"base": [1.0]}) for i in range(results_module.MAX_CASES)]
    assert len(load_results(saved(edge, tmp_path / "edge.json")).cases) == 10_000
    edge.cases.append(CaseResult(id="one-more", unit="us", samples={"base": [1.0]}))
    path = saved(edge, tmp_path / "over.json")
    with pytest.raises(DataError) as err:
        load_results(path)
    assert str(err.value) == (
        f"{path}: 10001 cases, more than the 10000 the gate reads; no stage of this gate writes so many: re-run it"
    )
    dup = make_results({})
    dup.cases = [CaseResult(id=f"d{i % 7}", unit="us", samples={"base": [1.0]}) for i in range(14)]
    with pytest.raises(DataError) as err:
        load_results(saved(dup, tmp_path / "dup.json"))
    assert str(err.value).endswith("duplicate case ids ['d0', 'd1', 'd2', 'd3', 'd4']")
    bad = make_results({"a": 1.0})
    for settings, message in (
        ({"identity_keys": "model"}, "settings.identity_keys should be a list of strings"),
        ({"inject_slowdown": "3%"}, "settings.inject_slowdown should be an integer or a number"),
        ({"case_filter": 3}, "settings.case_filter should be a string, found 3"),
    ):
        bad.settings = {"expected_cases": ["a"], **settings}
        with pytest.raises(DataError, match=re.escape(message)):
            load_results(saved(bad, tmp_path / "bad.json"))
