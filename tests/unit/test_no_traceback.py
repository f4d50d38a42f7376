"""No input makes the gate's readers end in a traceback (issue 39, item 6): property-based tests (hypothesis).

Each test takes a real input of the gate (a results file a stage wrote on the H200, a stored baseline, a
tree manifest, a contract, a patch), breaks it the way a hand edit, a truncated copy or an attacker would
(a field replaced by any JSON value, deep nesting, any text), and feeds it to the CLI or loader that reads
it. Whatever it is, the run ends with one of the README's exit codes and a one-line message; exit 70 (a bug
of the gate, with its traceback) or an exception escaping the loader fails the test, with the input that did
it (hypothesis prints the smallest it found).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci.core import baselines, compare
from ci.core.cli import run_main
from ci.core.errors import ExitCode, GateError

ROOT = Path(__file__).resolve().parents[2]
X1 = ROOT / "reports" / "nvidia-h200-x1"
RESULTS = {
    "kernel": X1 / "kernel-quick-b785558" / "kernel-results.json",
    "tpot": X1 / "tpot-9-pairs" / "pr-ab.json",
    "triton": X1 / "triton-moe" / "keep64" / "triton-moe-results.json",
}
# the README's table, without INTERNAL (70): what a run may end with on any input
CODES = {int(c) for c in ExitCode} - {int(ExitCode.INTERNAL)}
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _paths(value, prefix=()):
    """Every place in a JSON value (dict keys and list indices), for the mutations to pick from."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):  # the first items stand for the rest (a case, a sample)
            yield from _paths(v, (*prefix, i))


def _replaced(payload, path, value):
    out = copy.deepcopy(payload)
    if not path:
        return value
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return out


def mutated(payload):
    """A strategy: ``payload`` with one place replaced by any JSON value, or one key removed."""
    places = [p for p in _paths(payload) if p]

    def remove(path):
        out = copy.deepcopy(payload)
        parent = out
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        return out

    return st.sampled_from(places).flatmap(
        lambda path: st.one_of(json_values.map(lambda v, p=path: _replaced(payload, p, v)), st.just(path).map(remove))
    )


def _ends_with_a_code(code: int, err: str) -> None:
    assert code in CODES, f"exit {code}: {err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_a_results_file_broken_anywhere_ends_with_a_code(name, tmp_path, capsys):
    payload = json.loads(RESULTS[name].read_text())

    @SETTINGS
    @given(mutated(payload))
    def check(broken):
        path = tmp_path / RESULTS[name].name
        path.write_text(json.dumps(broken))
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        code = run_main(compare.main, ["--results", str(path), "--out", str(out)])
        _ends_with_a_code(code, capsys.readouterr().err)

    check()


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_a_baseline_broken_anywhere_ends_with_a_code(name, tmp_path, capsys):
    from ci.core.results import load_results

    results = load_results(RESULTS[name])
    stored_path = baselines.baseline_path(results, tmp_path / "b")
    payload = json.loads(RESULTS[name].read_text())

    @SETTINGS
    @given(mutated(payload))
    def check(broken):
        stored_path.parent.mkdir(parents=True, exist_ok=True)
        stored_path.write_text(json.dumps(broken))
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        args = [
            "--results",
            str(RESULTS[name]),
            "--mode",
            "baseline",
            "--baseline-dir",
            str(tmp_path / "b"),
            "--out",
            str(out),
        ]
        _ends_with_a_code(run_main(compare.main, args), capsys.readouterr().err)

    check()


@pytest.mark.parametrize("depth", [10, 1000, 100_000])
def test_json_nested_past_what_python_reads_is_a_data_error(depth, tmp_path, capsys):
    path = tmp_path / "kernel-results.json"
    path.write_text("[" * depth + "]" * depth)
    assert run_main(compare.main, ["--results", str(path), "--out", str(tmp_path / "o")]) == ExitCode.DATA
    assert capsys.readouterr().err.startswith(f"error: {path}")


def test_a_manifest_broken_anywhere_is_a_data_error_or_loads(tmp_path):
    from ci.trees import build, manifest
    from tests.unit.factories import AFTER, BEFORE, MOD, diff, make_release

    release = make_release(tmp_path / "rel")
    (tmp_path / "p.patch").write_text(diff(MOD, BEFORE, AFTER))
    trees = build.build_trees(
        build.BuildOptions(patch=tmp_path / "p.patch", out=tmp_path / "t", contract="none"), release=release
    )
    payload = json.loads(trees.manifest_path.read_text())

    @SETTINGS
    @given(mutated(payload))
    def check(broken):
        trees.manifest_path.write_text(json.dumps(broken))
        try:
            manifest.load_trees(trees.manifest_path)
        except GateError as exc:
            assert int(exc.exit_code) in CODES

    check()


CONTRACT_HEAD = (
    'NAME = "x"\nUPSTREAM = "u"\nSUMMARY = "s"\nCHANGES_NON_EP = False\nCHANGES_EP = True\nCHANGES_BATCHED = False\n'
)
TOKENS = [
    "def f(x):",
    "    return",
    "match x:",
    "    case object(__globals__=g):",
    "class C:",
    "import os",
    "from ci.moe import spec",
    "spec.",
    "__import__",
    "__builtins__",
    "lambda: 0",
    "(",
    ")",
    "[",
    "]",
    "-",
    "not",
    "x.__class__",
    "g",
    "=",
    "1",
    "'s'",
    ":",
    "\n",
    "    ",
    "for i in range(3):",
    "while 1:",
    "yield",
    "global x",
    "try:",
    "except:",
    "with x:",
    "*",
    "**",
    "@f",
    "ENTRY_MODULE = 'vllm.x'",
    "fused_block_size_m = 3",
    "SETTINGS = {}",
    "a if b else c",
    "{**x}",
    "f'{x!r}'",
    ";",
]


@SETTINGS
@given(st.lists(st.sampled_from(TOKENS), max_size=25).map(" ".join) | st.text(max_size=200))
def test_any_contract_text_loads_or_is_a_contract_error(text):
    import tempfile

    from ci.trees import contracts

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "contract.py"
        path.write_text(CONTRACT_HEAD + text + "\n")
        try:
            contracts.load_contract(path)
        except contracts.ContractError as exc:
            assert str(exc).startswith(str(path))


PATCH_LINES = [
    "diff --git a/vllm/layers/mod.py b/vllm/layers/mod.py",
    "--- a/vllm/layers/mod.py",
    "+++ b/vllm/layers/mod.py",
    "@@ -4,3 +4,3 @@",
    "@@ -1 +1 @@",
    " def pick(m):",
    "-    m = m",
    "+    m = m // 2",
    "     return m",
    "GIT binary patch",
    "literal 0",
    "HcmV?d00001",
    "new file mode 100644",
    "rename from vllm/a.py",
    "rename to ../../etc/x",
    "deleted file mode 100644",
    "Binary files differ",
    "--- /dev/null",
    "+++ b/vllm/new.py",
    "+x = 1",
    "\\ No newline at end of file",
]


@SETTINGS
@given(st.lists(st.sampled_from(PATCH_LINES), max_size=12).map("\n".join) | st.text(max_size=120))
def test_any_patch_builds_or_is_refused_with_a_code(text):
    import tempfile

    from ci.trees import build
    from tests.unit.factories import make_release

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        release = make_release(root / "rel")
        patch = root / "x.patch"
        patch.write_text(text + "\n")
        try:
            build.build_trees(build.BuildOptions(patch=patch, out=root / "t", contract="none"), release=release)
        except GateError as exc:
            assert int(exc.exit_code) in CODES
