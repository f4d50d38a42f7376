"""ci.trees.newest: the newest vLLM on a package index (pip's own answer, from an index made here), and what a
newer release changed in the entry points the gate calls (read from release trees laid out in the cache)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ci.core.cli import run_main
from ci.core.errors import ExitCode, MissingDependencyError, ReleaseAheadError
from ci.trees import newest

MARLIN = newest.ENTRY_POINTS["fused_marlin_moe"]
TRITON = newest.ENTRY_POINTS["fused_experts"]


def _index(tmp_path: Path, versions: list[str]) -> list[str]:
    """A PEP 503 index of sdists only (pip lists them whatever the platform); pip's arguments to use only it."""
    folder = tmp_path / "simple" / "vllm"
    folder.mkdir(parents=True)
    links = "".join(f'<a href="vllm-{v}.tar.gz">vllm-{v}.tar.gz</a>\n' for v in versions)
    (folder / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return ["--isolated", "--index-url", (tmp_path / "simple").as_uri()]


def test_the_newest_final_release_is_what_the_index_lists_first(tmp_path):
    args = _index(tmp_path, ["0.25.1", "0.34.0", "0.9.2", "0.35.0rc1", "0.33.0"])
    assert newest.newest_on_index(sys.executable, args) == "0.34.0"


def test_an_index_that_does_not_answer_is_named_with_the_fix(tmp_path):
    with pytest.raises(MissingDependencyError) as err:
        newest.newest_on_index(sys.executable, ["--isolated", "--index-url", (tmp_path / "none").as_uri()])
    assert "the package index did not list vLLM's releases" in str(err.value) and "PIP_INDEX_URL" in str(err.value)
    assert err.value.exit_code == ExitCode.ENVIRONMENT


def _release(cache: Path, version: str, marlin: str, triton: str | None = "def fused_experts(x, w1):\n    pass\n"):
    root = cache / f"vllm-{version}"  # laid out as fetch_release leaves a release it unpacked
    (root / MARLIN).parent.mkdir(parents=True, exist_ok=True)
    (root / MARLIN).write_text(marlin)
    if triton is not None:
        (root / TRITON).write_text(triton)
    (root / ".unpacked").write_text(f"vllm-{version}-made-here.whl {'0' * 64}\n")


OLD = (
    "def fused_marlin_moe(hidden_states, w1, global_num_experts=-1, input_dtype=None, g_idx1=None):\n    pass\n\n"
    "def batched_fused_marlin_moe(hidden_states, w1):\n    pass\n"
)
NEW = (
    "def fused_marlin_moe(hidden_states, w1, global_num_experts=-1, *, activation_config=None):\n    pass\n\n"
    "def batched_fused_marlin_moe(hidden_states, w1):\n    pass\n"
)


def test_the_signatures_are_read_from_the_release_and_a_missing_one_is_none(tmp_path):
    _release(tmp_path, "0.33.0", OLD, triton=None)
    sigs = newest.signatures(tmp_path / "vllm-0.33.0")
    assert sigs["fused_marlin_moe"].parameters == ("hidden_states", "w1", "global_num_experts", "input_dtype", "g_idx1")
    assert sigs["batched_fused_marlin_moe"].parameters == ("hidden_states", "w1")
    assert sigs["fused_experts"].parameters is None


def test_a_followed_or_older_newest_release_is_a_line_and_exit_0(tmp_path, capsys):
    assert newest.check("0.33.0", ["0.25.1", "0.33.0"], tmp_path) == (
        "releases: the newest vLLM on the package index is 0.33.0; the gate follows 0.25.1, 0.33.0"
    )
    args = ["--followed", "0.25.1", "0.33.0", "--newest", "0.30.0", "--cache", str(tmp_path)]
    assert run_main(newest.main, args) == ExitCode.OK
    assert "the newest vLLM on the package index is 0.30.0" in capsys.readouterr().out


def test_a_newer_release_is_exit_14_naming_it_and_what_its_entry_points_changed(tmp_path, capsys):
    _release(tmp_path, "0.33.0", OLD)
    _release(tmp_path, "0.34.0", NEW, triton=None)
    with pytest.raises(ReleaseAheadError) as err:
        newest.check("0.34.0", ["0.25.1", "0.33.0"], tmp_path)
    assert str(err.value) == (
        "vLLM 0.34.0 is on the package index and the gate follows only 0.25.1, 0.33.0. Against 0.33.0: "
        "fused_marlin_moe adds activation_config and removes input_dtype, g_idx1; fused_experts is gone. Try it "
        "with nox -s tests_release -- --release 0.34.0; once the gate supports it, add it to FOLLOWED_RELEASES in "
        "noxfile.py and to docs/releases.md"
    )
    args = ["--followed", "0.25.1", "0.33.0", "--newest", "0.34.0", "--cache", str(tmp_path)]
    assert run_main(newest.main, args) == ExitCode.RELEASE_AHEAD == 14
    assert capsys.readouterr().err.startswith("error: vLLM 0.34.0 is on the package index")


def test_a_newer_release_with_the_same_entry_points_says_so(tmp_path):
    _release(tmp_path, "0.33.0", OLD)
    _release(tmp_path, "0.33.1", OLD)
    with pytest.raises(ReleaseAheadError, match=r"Against 0\.33\.0: the entry points the gate calls take the same"):
        newest.check("0.33.1", ["0.33.0"], tmp_path)


def test_differences_name_a_new_function_and_a_reordering():
    sig = newest.Signature
    old = {n: sig(n, ("a", "b")) for n in newest.ENTRY_POINTS} | {"fused_experts": sig("fused_experts", None)}
    new = {n: sig(n, ("b", "a")) for n in newest.ENTRY_POINTS}
    assert newest.differences(old, new) == [
        "fused_marlin_moe takes its parameters in another order",
        "batched_fused_marlin_moe takes its parameters in another order",
        "fused_experts is new",
    ]


def test_the_module_runs_as_a_command(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ci.trees.newest",
            "--followed",
            "0.33.0",
            "--newest",
            "0.33.0",
            "--cache",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0 and "the gate follows 0.33.0" in done.stdout
