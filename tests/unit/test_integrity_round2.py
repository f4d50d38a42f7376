"""Issue 39, items 4-9 beyond the trees: the verdict line's INCOMPLETE, how vLLM calls the experts without EP, the
bench's non-EP check, baselines of like with like, messages instead of tracebacks, and the CLI. Each test failed
on the gate of commit 4369f3a (the closing note's table)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ci.core import baselines, compare
from ci.core.cli import run_main
from ci.core.errors import DataError, ExitCode, UndeclaredChangeError, UsageError, WrongResultsError
from ci.core.results import load_results
from ci.kernel import callers
from ci.trees.changed_lines import LineReport
from tests.unit.factories import kernel_results, make_results, saved
from tests.verdict_line import _subject_checks, evidence_gaps, first_case, verdict_line

ROOT = Path(__file__).resolve().parents[2]
X1 = ROOT / "reports" / "nvidia-h200-x1"


# Item 4: a PASS says what it did not run -----------------------------------------------------------------


def test_a_pass_with_changed_lines_never_run_is_incomplete_and_names_them():
    lines = LineReport(measured=True, statements=6, executed=5, unexecuted=["vllm/x.py:332"])
    gap = evidence_gaps("CPU tier", 300, 1, "", lines, on_gpu=False)
    assert gap == (
        "gate: CPU tier INCOMPLETE: the tests passed, but 1 of the change's 6 statements never ran on the "
        "CPU: vllm/x.py:332; only the GPU suite can vouch for them: run nox -s gpu_gate on a GPU host"
    )
    on_gpu = evidence_gaps("GPU suite", 90, 0, "", lines, on_gpu=True)
    assert "never ran in the GPU suite: vllm/x.py:332; add a GPU test that runs them" in on_gpu
    assert evidence_gaps("CPU tier", 300, 1, "", LineReport(measured=True, statements=6, executed=6), False) is None
    assert evidence_gaps("CPU tier", 300, 1, "", None, False) is None  # a change of no Python statement
    unmeasured = LineReport(measured=False, statements=2, why_not_measured="coverage.py is not installed")
    assert evidence_gaps("CPU tier", 3, 0, "", unmeasured, False).endswith("not measured: coverage.py is not installed")


def test_a_tier_that_runs_none_or_few_of_the_changes_checks_is_incomplete():
    """Item 2: a contract's other ENTRY_MODULE gave 'PASS' with 342 skipped."""
    none = evidence_gaps("CPU tier", 0, 342, "the change enters vLLM through x", None, False)
    assert none.startswith("gate: CPU tier INCOMPLETE: none of the change's checks of its subject ran (342 skipped")
    assert "first reason: the change enters vLLM through x" in none
    few = evidence_gaps("CPU tier", 10, 11, "", None, False)
    assert "11 of the change's 21 checks of its subject were skipped" in few
    assert evidence_gaps("CPU tier", 11, 11, "", None, False) is None


def _report(nodeid: str, *, gpu: bool = False, skip_reason: str | None = None):
    longrepr = ("f", 1, f"Skipped: {skip_reason}") if skip_reason else None
    return SimpleNamespace(nodeid=nodeid, keywords={"gpu": 1} if gpu else {}, longrepr=longrepr)


def test_only_the_subjects_own_tests_of_the_runs_kind_are_counted(tmp_path):
    trees = SimpleNamespace(manifest=SimpleNamespace(entry_module="", contract=None))
    stats = {
        "passed": [
            _report("tests/ep_marlin/test_block_size_selection.py::a"),
            _report("tests/unit/test_x.py::b"),
            _report("tests/ep_marlin/test_mutants.py::c"),
            _report("tests/triton_moe/test_y.py::d"),
        ],
        "skipped": [
            _report("tests/ep_marlin/test_gpu_equivalence.py::e", gpu=True, skip_reason="needs a GPU"),
            _report("tests/ep_marlin/test_block_size_selection.py::f", skip_reason="no pin"),
        ],
    }
    assert _subject_checks(stats, trees, on_gpu=False) == (1, 1, "no pin")
    assert _subject_checks(stats, trees, on_gpu=True) == (0, 1, "needs a GPU")


def test_the_verdict_quotes_the_first_failing_case_and_words_the_advice_by_the_contract():
    """Item 9: the line said 'read the first case below' where only case ids followed, and spoke of the
    contract's rule when there was no contract."""
    failed = [
        "tests/ep_marlin/test_block_size_selection.py::test_candidate_keeps_the_invariants_and_its_contract"
        "[E8-ep4-topk2-default]"
    ]
    message = "AssertionError: 3 of 111 cases break the invariants:\nM=1 topk=2 E=8 G=32: block_size_m 7 is not one"
    with_contract = verdict_line(failed, 10, "CPU tier", first_message=message, has_contract=True)
    assert "first case: M=1 topk=2 E=8 G=32: block_size_m 7 is not one)" in with_contract
    assert with_contract.endswith("fix the change, or the rule in its contract.py if the rule is wrong")
    bare = verdict_line(failed, 10, "CPU tier", first_message=message, has_contract=False)
    assert "contract.py if the rule" not in bare and "it has no contract" in bare
    assert first_case("AssertionError: x\n" + "y" * 300).endswith("...") and first_case(None) == ""


# Item 8: non-EP as vLLM calls it ---------------------------------------------------------------------------

CALLERS = """
def fused_marlin_moe(hidden, w1, global_num_experts=-1, expert_map=None):
    pass

class Experts:
    def apply(self, w1, global_num_experts, expert_map):
        return fused_marlin_moe(None, w1, global_num_experts=global_num_experts, expert_map=expert_map)

def direct(w1):
    return fused_marlin_moe(None, w1)

def local(w1):
    return fused_marlin_moe(None, w1, global_num_experts=w1.size(0))

def odd(w1, n):
    return fused_marlin_moe(None, w1, global_num_experts=n * 2)
"""
MODULAR = "def forward(global_num_experts=-1):\n    if global_num_experts == -1:\n        global_num_experts = 8\n"


def _tree(tmp_path: Path, callers_text: str = CALLERS, modular: str = MODULAR) -> Path:
    folder = tmp_path / "vllm" / "model_executor" / "layers" / "fused_moe"
    folder.mkdir(parents=True)
    (folder / "experts.py").write_text(callers_text)
    (folder / "modular_kernel.py").write_text(modular)
    return tmp_path


def test_the_releases_call_sites_are_read_with_the_global_expert_count_they_pass(tmp_path):
    sites = {s.line: s for s in callers.call_sites(_tree(tmp_path))}
    assert {s.g_form for s in sites.values()} == {"passed through", "-1", "E", "unknown"}
    assert sites[7].g_expression == "global_num_experts" and sites[7].expert_map == "expert_map"
    assert sites[10].g_expression == "(default)" and sites[16].g_expression == "n * 2"
    forms = callers.non_ep_forms(_tree(tmp_path / "t2"))
    assert set(forms) == {"-1", "E", "unknown"}
    assert any("from the modular kernel, which turns -1 into E" in s for s in forms["E"])
    assert forms["unknown"] == [
        "vllm/model_executor/layers/fused_moe/experts.py:16 fused_marlin_moe(global_num_experts=n * 2)"
    ]


def test_without_the_modular_kernels_conversion_a_passed_through_count_is_minus_one_only(tmp_path):
    tree = _tree(tmp_path, CALLERS.split("def direct")[0], modular="def forward(g):\n    return g\n")
    assert not callers.modular_kernel_makes_g_local(tree)
    assert set(callers.non_ep_forms(tree)) == {"-1"}


class _Runner:
    """What check_outputs_agree reads of a case runner, on the CPU: the builds' outputs are given."""

    def __init__(self, outputs: dict, *, non_ep: bool = True):
        import torch  # its one test has skipped already where torch is absent

        self.torch = torch
        self.inputs = [None]
        self.outputs = outputs
        self.case = SimpleNamespace(id="qwen3/ep1-g128/tpr8/x/bf16", non_ep=non_ep, global_num_experts=128)

    def call(self, module, inputs):
        out = self.outputs[module]
        if isinstance(out, list):  # a build that does not repeat its bits: one output after another, cycled
            self.outputs[module] = out[1:] + out[:1]
            return out[0]
        return out

    def valid_output(self, out, inputs):
        return out


def test_a_non_ep_output_that_differs_with_another_tile_is_a_non_ep_change_not_wrong_numbers():
    """Item 'exit 12 says what happened': with the tiles apart, the outputs differ by rounding: a non-EP change,
    a FAIL unless the contract declares it (then timed); with the same tile, different numbers are wrong."""
    torch = pytest.importorskip("torch")  # the bench's tensors; the mutation environment has none

    from ci.kernel import bench

    a = torch.ones(4, 8)
    b = a + 1e-4
    runner = _Runner({"base": a, "candidate": b})
    with pytest.raises(UndeclaredChangeError) as err:
        bench.check_outputs_agree(runner, "base", "candidate", {"base": 8, "candidate": 16})
    assert err.value.exit_code == ExitCode.FAILED
    assert "a non-EP change: the candidate picks block_size_m 16 where the base picks 8" in str(err.value)
    assert bench.check_outputs_agree(runner, "base", "candidate", {"base": 8, "candidate": 16}, non_ep_declared=True)[
        "ok"
    ]
    with pytest.raises(WrongResultsError, match="with the same tile"):
        bench.check_outputs_agree(runner, "base", "candidate", {"base": 8, "candidate": 8}, non_ep_declared=True)
    same = _Runner({"base": a, "candidate": a.clone()})
    assert bench.check_outputs_agree(same, "base", "candidate", {"base": 8, "candidate": 16})["identical"]
    far = _Runner({"base": a, "candidate": a * 2})
    with pytest.raises(WrongResultsError, match="candidate differs from base"):
        bench.check_outputs_agree(far, "base", "candidate", {"base": 8, "candidate": 16}, non_ep_declared=True)


def test_with_the_same_tile_a_candidate_is_held_to_the_bases_own_call_to_call_spread():
    """Issue 43's H100 run: at Mixtral, 1,024 tokens, int4, the base itself does not repeat its bits (rel L2 up to
    5.5e-5 call to call), and a bit-for-bit check failed even an A/A run. Where the base repeats its bits the
    candidate must too; where it does not, the candidate may differ by at most 4x the base's own spread."""
    torch = pytest.importorskip("torch")

    from ci.kernel import bench

    a = torch.ones(4, 8, dtype=torch.float64)  # exact ratios below
    tile = {"base": 64, "candidate": 64}
    wobbly = [a, a * (1 + 5e-5), a * (1 - 3e-5), a, a * (1 + 1e-5)]  # base: a first, then within 5e-5 of it
    found = bench.check_outputs_agree(
        _Runner({"base": list(wobbly), "candidate": a * (1 + 4.7e-5)}), "base", "candidate", tile
    )
    assert found["ok"] and not found["identical"]
    assert found["base_spread"] == pytest.approx(5e-5, rel=1e-3)
    assert found["rel_l2"] == pytest.approx(4.7e-5, rel=1e-3)
    # just inside and just outside 4x the spread
    assert bench.check_outputs_agree(
        _Runner({"base": list(wobbly), "candidate": a * (1 + 1.99e-4)}), "base", "candidate", tile
    )["ok"]
    with pytest.raises(WrongResultsError, match=r"more than 4x the base's own call-to-call spread .*5\.00e-05"):
        bench.check_outputs_agree(
            _Runner({"base": list(wobbly), "candidate": a * (1 + 2.01e-4)}), "base", "candidate", tile
        )
    # a base that repeats its bits: any difference with the same tile is wrong numbers
    with pytest.raises(WrongResultsError, match="the base repeats its own output bit for bit"):
        bench.check_outputs_agree(_Runner({"base": a, "candidate": a * (1 + 1e-7)}), "base", "candidate", tile)
    # under EP the bound stays the EP one; the base's spread is not asked for
    ep = bench.check_outputs_agree(
        _Runner({"base": [a, a * 2], "candidate": a * (1 + 1e-3)}, non_ep=False), "base", "candidate", tile
    )
    assert ep["ok"] and "base_spread" not in ep
    # with other tiles, the base's spread does not excuse an undeclared non-EP change
    with pytest.raises(UndeclaredChangeError):
        bench.check_outputs_agree(
            _Runner({"base": list(wobbly), "candidate": a * (1 + 1e-5)}),
            "base",
            "candidate",
            {"base": 64, "candidate": 48},
        )


def test_the_triton_bench_holds_a_non_ep_candidate_to_the_bases_own_spread_too():
    torch = pytest.importorskip("torch")

    from ci.triton_moe import bench as triton_bench
    from ci.triton_moe.spec import NON_EP

    a = torch.ones(4, 8, dtype=torch.float64)
    sides = {"base": "base", "candidate": "candidate"}

    def runner(outputs, g=NON_EP):
        r = _Runner(outputs)
        r.case = SimpleNamespace(id="qwen3/ep1/m1024/bf16", global_num_experts=g)
        return r

    wobbly = [a, a * (1 + 5e-5), a * (1 - 3e-5), a, a * (1 + 1e-5)]
    found = triton_bench.check_outputs_agree(runner({"base": wobbly, "candidate": a * (1 + 4e-5)}), sides)
    assert found["ok"] and found["base_spread"] == pytest.approx(5e-5, rel=1e-3)
    with pytest.raises(WrongResultsError, match="more than 4x"):
        triton_bench.check_outputs_agree(runner({"base": list(wobbly), "candidate": a * (1 + 3e-4)}), sides)
    with pytest.raises(WrongResultsError, match="bit for bit"):
        triton_bench.check_outputs_agree(runner({"base": a, "candidate": a * (1 + 1e-7)}), sides)
    assert triton_bench.check_outputs_agree(runner({"base": a, "candidate": a.clone()}), sides)["identical"]


def test_a_bench_whose_only_failures_are_undeclared_non_ep_changes_exits_fail(tmp_path):
    from ci.host import outputs

    results = kernel_results()
    results.settings.update(failed_cases={"a": "a non-EP change"}, undeclared_cases=["a"])
    with pytest.raises(UndeclaredChangeError, match="changes the non-EP path, which its contract does not declare"):
        outputs.save_and_check(results, tmp_path / "k.json", "bench")
    results.settings.update(failed_cases={"a": "x", "b": "NaN"}, undeclared_cases=["a"])
    with pytest.raises(WrongResultsError):
        outputs.save_and_check(results, tmp_path / "k.json", "bench")


# Item 5: baselines compare like with like -----------------------------------------------------------------

KERNEL = X1 / "gpu-gate-5414fc0" / "real" / "kernel-results.json"


def _stored(tmp_path: Path, edit) -> Path:
    payload = json.loads((ROOT / "baselines" / "nvidia-h200-x1" / "default.json").read_text())
    edit(payload)
    folder = tmp_path / "b" / "nvidia-h200-x1"
    folder.mkdir(parents=True)
    (folder / "default.json").write_text(json.dumps(payload))
    return tmp_path / "b"


@pytest.mark.parametrize(
    ("edit", "side", "says"),
    [
        (
            lambda p: [c.update(unit="ms/call") for c in p["cases"]],
            "base",
            "is in 'us/call' in this run and in 'ms/call'",
        ),
        (
            lambda p: p["provenance"]["vllm"].update(version="0.26.0"),
            "base",
            "vLLM is '0.25.1' in this run and '0.26.0'",
        ),
        (
            lambda p: p["provenance"]["vllm"].update(patch_sha256="0" * 64),
            "candidate",
            "the candidate side's change is",
        ),
    ],
)
def test_a_baseline_of_another_unit_release_or_change_is_a_data_error_naming_both(tmp_path, capsys, edit, side, says):
    """Item 5: a baseline in ms against results in us PASSed; the vLLM version and the change were not compared."""
    stored = _stored(tmp_path, edit)
    args = [
        "--results",
        str(KERNEL),
        "--mode",
        "baseline",
        "--side",
        side,
        "--baseline-dir",
        str(stored),
        "--out",
        str(tmp_path / "o"),
    ]
    assert run_main(compare.main, args) == ExitCode.DATA == 7
    err = capsys.readouterr().err
    assert "not like with like" in err and says in err and err.count("\n") == 1
    other = {"base": "candidate", "candidate": "base"}[side]
    assert f"(or the other side, --side {other}, where that one matches)" in err


def test_not_like_with_like_names_both_files_both_values_the_other_side_and_the_record_command(tmp_path, capsys):
    def edit(payload):
        [payload["provenance"]["vllm"].pop(k) for k in ("patch_sha256", "patch")]
        [c.update(unit="ms/call") for c in payload["cases"]]

    stored = _stored(tmp_path, edit)
    args = [
        "--results",
        str(KERNEL),
        "--mode",
        "baseline",
        "--side",
        "candidate",
        "--baseline-dir",
        str(stored),
        "--out",
        str(tmp_path / "o"),
    ]
    assert run_main(compare.main, args) == ExitCode.DATA
    change = "ci/changes/marlin-ep-m-estimate/change.patch (sha256 dff18ea26166)"
    assert capsys.readouterr().err.strip() == (
        f"error: {KERNEL} against {stored / 'nvidia-h200-x1' / 'default.json'}: not like with like: case "
        f"{load_results(KERNEL).cases[0].id} is in 'us/call' in this run and in 'ms/call' in the baseline; the "
        f"candidate side's change is {change!r} in this run and 'not recorded' in the baseline. Compare a run of "
        "the same release and change (or the other side, --side base, where that one matches), or record a "
        f"baseline of this one: nox -s update_baselines -- --results {KERNEL}"
    )
    # the other way round: the value this run lacks
    mine = load_results(stored / "nvidia-h200-x1" / "default.json")
    assert baselines.comparable_problems(mine, load_results(KERNEL), "candidate") == [
        f"case {mine.cases[0].id} is in 'ms/call' in this run and in 'us/call' in the baseline",
        f"the candidate side's change is 'not recorded' in this run and {change!r} in the baseline",
    ]


def test_the_identity_of_an_aa_runs_candidate_is_the_base_build():
    from ci.trees.provenance import side_identity

    run = kernel_results()
    run.provenance["vllm"] = {"version": "0.25.1", "patch_sha256": "ab" * 32, "patch": "p.patch"}
    assert side_identity(run, "candidate") == {"vLLM": "0.25.1", "change": "p.patch (sha256 abababababab)"}
    assert side_identity(run, "base") == {"vLLM": "0.25.1"}
    run.settings.update(aa=True, inject_slowdown=0.035)
    assert side_identity(run, "candidate")["change"] == "none: the base build (A/A run, slowed by 0.035)"


def test_a_side_names_the_vllm_commit_it_timed():
    """Branch mode: the base is the merge-base, the candidate the head; an overlay: the checkout's commit."""
    from ci.trees.provenance import published_side, side_identity

    run = kernel_results()
    run.provenance["vllm"] = {"version": "0.25.1", "refs": {"merge_base": "a" * 40, "head_sha": "b" * 40}}
    assert side_identity(run, "base") == {"vLLM": "0.25.1", "commit": "a" * 12}
    assert side_identity(run, "candidate") == {"vLLM": "0.25.1", "commit": "b" * 12}
    overlay = {"repo": "r", "commit": "c" * 40, "subject": "[Perf] tile", "status": "clean"}
    run.provenance["vllm"] = {"version": "0.25.1", "overlay": overlay, "reverse": False}
    assert side_identity(run, "base")["commit"] == "c" * 12 + " [Perf] tile"
    run.provenance["vllm"]["overlay"] = {**overlay, "status": "uncommitted changes"}
    assert side_identity(run, "base")["commit"].endswith("[Perf] tile + uncommitted changes")
    assert published_side(run) == "base"
    run.provenance["vllm"]["reverse"] = True
    assert published_side(run) == "candidate"
    run.provenance["vllm"] = "not a record"
    assert published_side(run) == "base" and side_identity(run, "base") == {}


def test_record_refuses_a_run_that_did_not_pass_unless_told_why(tmp_path, capsys):
    """Item 5: `baselines record` stored the candidate of a FAIL run."""
    failing = saved(make_results({"a": 1.10, "b": 1.0}), tmp_path / "fail.json")
    with pytest.raises(UsageError, match="its A/B verdict is FAIL, not PASS") as err:
        baselines.record(failing, tmp_path / "b")
    assert str(err.value) == (
        f"{failing}: its A/B verdict is FAIL, not PASS: a baseline is what later runs must not be slower than, and "
        "this candidate is no such build. Record a run that PASSes, or give the reason this one should be the "
        "baseline anyway: --reason '...' (it is stored in the baseline)"
    )
    assert not (tmp_path / "b").exists()
    path = baselines.record(failing, tmp_path / "b", reason="the new speed of the hardware we ship")
    stored = json.loads(path.read_text())["settings"]["recorded_despite"]
    assert stored == {"verdict": "FAIL", "reason": "the new speed of the hardware we ship"}
    args = ["record", "--results", str(failing), "--dir", str(tmp_path / "c"), "--reason", "  "]
    assert run_main(baselines.main, args) == ExitCode.USAGE
    assert run_main(baselines.main, [*args[:-1], "told"]) == ExitCode.OK  # the command line's reason, stored
    told = json.loads((tmp_path / "c" / "nvidia-h200-x1" / "unit.json").read_text())["settings"]
    assert told["recorded_despite"] == {"verdict": "FAIL", "reason": "told"}
    with pytest.raises(SystemExit) as usage:  # no abbreviation taken for --reason: argparse's exit 2, nothing stored
        baselines.main(["record", "--results", str(failing), "--dir", str(tmp_path / "e"), "--reaso", "told"])
    assert usage.value.code == ExitCode.USAGE and not (tmp_path / "e").exists()
    passing = saved(make_results({"a": 1.0}), tmp_path / "pass.json")
    assert "recorded_despite" not in json.loads(baselines.record(passing, tmp_path / "d").read_text())["settings"]


# Item 6: messages, not tracebacks ------------------------------------------------------------------------


def test_a_missing_package_is_named_with_its_fix_not_blamed_on_the_gate(capsys):
    """Item 6: a module this environment lacks ended in 'internal error: the gate itself failed' (exit 70)."""

    def needs_it(argv):
        import gate_absent_package_xyz  # noqa: F401

    assert run_main(needs_it, []) == ExitCode.ENVIRONMENT == 9
    err = capsys.readouterr().err
    assert err.startswith("error: this environment has no module 'gate_absent_package_xyz'") and "nox -s" in err

    def gate_bug(argv):
        import ci.no_such_module  # noqa: F401

    assert run_main(gate_bug, []) == ExitCode.INTERNAL  # a module of the gate itself: a bug, with its traceback
    assert "Traceback" in capsys.readouterr().err


def test_results_are_judged_and_rendered_before_anything_is_printed(tmp_path, capsys, monkeypatch):
    """Item 6: the report printed PASS, then the plot crashed on a field of the wrong type."""
    from ci.core import report

    path = saved(make_results({"a": 1.0}), tmp_path / "r.json")
    monkeypatch.setattr(report, "plot", lambda *a: 1 / 0)
    assert run_main(compare.main, ["--results", str(path), "--out", str(tmp_path / "o")]) == ExitCode.INTERNAL
    assert "PASS" not in capsys.readouterr().out


def test_a_subjects_field_of_the_wrong_type_is_refused_when_the_file_is_read(tmp_path):
    from ci.core.results import load_results

    payload = json.loads(KERNEL.read_text())
    payload["cases"][0]["info"]["block_size_m"] = [8, 16]  # the panel called .get on it
    path = tmp_path / "kernel-results.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError, match=r"info.block_size_m should be an object with string keys, found \[8, 16\]"):
        load_results(path)


# Item 9: the CLI --------------------------------------------------------------------------------------------


def test_no_option_is_taken_by_an_abbreviation():
    from ci.trees.sessionargs import SOURCE_OPTIONS, parse_session_args

    args = parse_session_args(["--contrac", "none", "--vllm-sr", "x"])
    assert args.build_argv == ("--vllm", "0.25.1") and args.rest == ("--contrac", "none", "--vllm-sr", "x")
    assert {"--patch", "--change", "--contract", "--out", "--vllm-src"} <= set(SOURCE_OPTIONS)
    from ci.core import compare as compare_cli

    with pytest.raises(SystemExit):
        compare_cli.main(["--result", "x.json"])


def _nox(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    cmd = [sys.executable, "-m", "nox", "--no-venv", "-f", str(ROOT / "noxfile.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180, check=False, cwd=cwd)


def test_an_unknown_or_abbreviated_option_is_refused_before_anything_builds(tmp_path):
    """Item 9: `--pach` built the default change before pytest refused it; `--contrac` was taken for --contract."""
    trees = ROOT / ".gate" / "trees" / "check"
    before = trees.stat().st_mtime if trees.exists() else None
    for typo, hint in (("--pach", "did you mean --patch"), ("--contrac", "did you mean --contract")):
        done = _nox("-s", "check", "--", typo, "x")
        assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
        assert f"unknown option {typo} ({hint}" in done.stderr and "nothing was built" in done.stderr
    assert (trees.stat().st_mtime if trees.exists() else None) == before


def test_every_sessions_description_is_a_whole_sentence():
    """Item 9: `nox -l` shows a docstring's first line, and three were cut mid-sentence."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = [
        f
        for f in tree.body
        if isinstance(f, ast.FunctionDef) and any("session" in ast.unparse(d) for d in f.decorator_list)
    ]
    assert len(sessions) >= 20
    for f in sessions:
        first = ast.get_docstring(f).split("\n", 1)[0]
        assert first.endswith((".", ")")) and len(first) <= 120, f"{f.name}: {first!r}"
    listing = _nox("-l").stdout
    assert "mutation -> Mutation testing of the verdict logic (mutmut): fails on a survivor" in listing


def test_clean_lists_and_removes_noxs_environments_only_when_asked(tmp_path, capsys):
    """Item 9: `nox -s clean` left .nox (2.8 GB after a day)."""
    from ci.trees import clean

    nox_root = tmp_path / ".nox"
    (nox_root / "tests" / "bin").mkdir(parents=True)
    (nox_root / "tests" / "pyvenv.cfg").write_text("home = /usr\n")
    (nox_root / "mine").mkdir()  # no pyvenv.cfg: not nox's
    (nox_root / "CACHEDIR.TAG").write_text("x")
    gate = tmp_path / ".gate"
    (gate / "trees" / "t").mkdir(parents=True)
    (gate / "trees" / "t" / ".gate-trees").write_text("")
    args = ["--root", str(gate), "--nox-root", str(nox_root)]
    assert run_main(clean.main, args) == 0
    out = capsys.readouterr().out
    assert "nox/tests" in out and "a nox session's virtual environment" in out and "-- --nox" in out
    assert run_main(clean.main, [*args, "--all"]) == 0
    assert (nox_root / "tests").exists() and not (gate / "trees" / "t").exists()
    assert run_main(clean.main, [*args, "--nox"]) == 0
    assert not (nox_root / "tests").exists() and (nox_root / "mine").exists()
    assert run_main(clean.main, [*args, "nox/mine"]) == ExitCode.USAGE


def test_gpu_gate_reads_the_changed_lines_its_gpu_suite_never_ran(tmp_path):
    from ci.runner import gpu_gate

    summary = tmp_path / "s.json"
    summary.write_text(json.dumps({"outcomes": {"passed": 3}, "changed_lines": {"unexecuted": ["vllm/x.py:3"]}}))
    assert gpu_gate.lines_not_run(summary) == ["vllm/x.py:3"]
    summary.write_text(json.dumps({"outcomes": {"passed": 3, "failed": 1}, "changed_lines": {"unexecuted": ["a"]}}))
    assert gpu_gate.lines_not_run(summary) == []
    summary.write_text("[" * 100000)
    assert gpu_gate.lines_not_run(summary) == []
    assert gpu_gate.lines_not_run(tmp_path / "none.json") == []


MORE_CALLERS = """
import ops

G = 4

def batched(w1):
    return batched_fused_marlin_moe(None, w1, global_num_experts=-1)

def through_a_module(w1, global_num_experts):
    return ops.fused_marlin_moe(None, w1, global_num_experts=global_num_experts)

def from_a_table(w1):
    return table[0](None, w1)

def explicit(w1):
    return fused_marlin_moe(None, w1, global_num_experts=-1)

def minus_two(w1):
    return fused_marlin_moe(None, w1, global_num_experts=-2)

def a_global(w1):
    return fused_marlin_moe(None, w1, global_num_experts=G)

def shape(w1):
    return fused_marlin_moe(None, w1, global_num_experts=w1.shape[0])

def positional(a, w1, E):
    return fused_marlin_moe(a, w1, 2, 3, 4, 5, 6, 7, 8, 9, 10, E)

def eleven_positional(a, w1):
    return fused_marlin_moe(a, w1, 2, 3, 4, 5, 6, 7, 8, 9, 10)

def batched_last(w1):
    return batched_fused_marlin_moe(None, w1)
"""


def test_every_form_of_call_site_is_read_whatever_files_come_before_it(tmp_path):
    """A file without the names and one that does not parse come first (sorted); a batched call, a call through a
    module and a call of something else are in the file; -1 written out, -2, a global, ``.shape[0]`` and the
    count passed by position (its 12th argument) are each read as what they are."""
    tree = _tree(tmp_path, MORE_CALLERS)
    (tree / "vllm" / "a_first.py").write_text("x = 1\n")
    (tree / "vllm" / "b_broken.py").write_text("fused_marlin_moe(\n")
    sites = [(s.line, s.callee, s.g_expression, s.g_form, s.expert_map) for s in callers.call_sites(tree)]
    assert sorted(sites) == [
        (7, "batched_fused_marlin_moe", "-1", "-1", "(default)"),
        (10, "fused_marlin_moe", "global_num_experts", "passed through", "(default)"),
        (16, "fused_marlin_moe", "-1", "-1", "(default)"),
        (19, "fused_marlin_moe", "-2", "unknown", "(default)"),
        (22, "fused_marlin_moe", "G", "unknown", "(default)"),
        (25, "fused_marlin_moe", "w1.shape[0]", "E", "(default)"),
        (28, "fused_marlin_moe", "E", "E", "(default)"),
        (31, "fused_marlin_moe", "(default)", "-1", "(default)"),
        (34, "batched_fused_marlin_moe", "(default)", "-1", "(default)"),
    ]
    forms = callers.non_ep_forms(tree)  # a batched site, the walk's first, is skipped, not the end of it
    where = "vllm/model_executor/layers/fused_moe/experts.py"
    assert sorted(forms["-1"]) == sorted(
        [
            f"{where}:10 fused_marlin_moe(global_num_experts=global_num_experts)",
            f"{where}:16 fused_marlin_moe(global_num_experts=-1)",
            f"{where}:31 fused_marlin_moe(global_num_experts=(default))",
        ]
    )


def test_a_passed_through_count_alone_is_e_through_the_modular_kernel(tmp_path):
    forms = callers.non_ep_forms(_tree(tmp_path, CALLERS.split("def direct")[0]))
    where = "vllm/model_executor/layers/fused_moe/experts.py:7 fused_marlin_moe(global_num_experts=global_num_experts)"
    assert forms == {"-1": [where], "E": [f"{where} from the modular kernel, which turns -1 into E"]}


@pytest.mark.parametrize(
    ("modular", "local"),
    [
        (None, False),  # no modular_kernel.py: no conversion
        ("if x == 2:\n    pass\nif global_num_experts == -1:\n    log()\n    global_num_experts = 8\n", True),
        ("if global_num_experts == -1:\n    other = 8\n", False),  # another name set: no conversion
        ("if global_num_experts == -1 or x:\n    global_num_experts = 8\n", False),
    ],
)
def test_the_modular_kernels_conversion_is_the_if_that_sets_the_count(tmp_path, modular, local):
    tree = _tree(tmp_path, modular=modular or "")
    if modular is None:
        (tree / "vllm" / "model_executor" / "layers" / "fused_moe" / "modular_kernel.py").unlink()
    assert callers.modular_kernel_makes_g_local(tree) is local
