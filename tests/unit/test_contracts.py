"""ci.trees.contracts: loading a change's contract, what it may change, and its record in the manifest."""

from __future__ import annotations

import re
import sys

import pytest

from ci.core.errors import UsageError
from ci.trees import contracts
from ci.trees.build import CHANGES_DIR

GOOD = """
NAME = "x"
UPSTREAM = "PR 1"
SUMMARY = "s"
CHANGES_NON_EP = False
CHANGES_EP = True
CHANGES_BATCHED = False
SETTINGS = {"default": {}, "on": {"V": "1"}}
def fused_block_size_m(**kw):
    return 8
"""


def _write(tmp_path, text):
    path = tmp_path / "contract.py"
    path.write_text(text)
    return path


def test_a_good_contract_loads_with_its_rules_paths_and_settings(tmp_path):
    c = contracts.load_contract(_write(tmp_path, GOOD))
    assert (c.name, c.upstream, c.summary) == ("x", "PR 1", "s")
    assert c.rules == ["fused_block_size_m"] and c.batched_block_size_m is None
    assert c.settings == {"default": {}, "on": {"V": "1"}}
    assert [contracts.may_change(c, p) for p in contracts.PATHS] == [False, True, False]
    assert c.describe() == "contract x (PR 1): rules fused_block_size_m; may change EP fused; settings default, on"
    record = c.to_json()
    assert record["rules"] == ["fused_block_size_m"] and len(record["sha256"]) == 64 and record["name"] == "x"


def test_without_a_contract_only_the_non_ep_path_is_held():
    assert [contracts.may_change(None, p) for p in contracts.PATHS] == [False, True, True]
    with pytest.raises(ValueError, match="unknown path 'fused'"):
        contracts.may_change(None, "fused")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.replace('NAME = "x"\n', ""), "does not define NAME"),
        (lambda s: s.replace("CHANGES_EP = True", "CHANGES_EP = 1"), "CHANGES_EP must be True or False"),
        (lambda s: s.replace('"default": {}, ', ""), "with a 'default' one"),
        (lambda s: s.replace('"default": {}', '"default": {"V": "0"}'), "must be empty"),
        (lambda s: s.replace('{"V": "1"}', '{"V": 1}'), "SETTINGS must map names"),
        (lambda s: s + "batched_block_size_m = 3\n", "batched_block_size_m must be a function"),
        (lambda s: s + "BAD = int('boom')\n", "line 11: the contract failed to load: ValueError: invalid literal"),
        (lambda s: s + "raise RuntimeError('boom')\n", "line 11: a Raise statement at the top level"),
    ],
)
def test_a_bad_contract_is_one_error_naming_the_file(tmp_path, edit, message):
    path = _write(tmp_path, edit(GOOD))
    with pytest.raises(UsageError, match=message) as err:
        contracts.load_contract(path)
    assert str(path) in str(err.value)


def test_settings_default_to_the_default_one(tmp_path):
    c = contracts.load_contract(_write(tmp_path, GOOD.replace('SETTINGS = {"default": {}, "on": {"V": "1"}}\n', "")))
    assert c.settings == {"default": {}}


def test_a_missing_contract_file_says_how_to_test_without_one(tmp_path):
    with pytest.raises(UsageError, match="'none' to test without one"):
        contracts.load_contract(tmp_path / "nope.py")


def test_beside_finds_the_contract_next_to_a_patch(tmp_path):
    patch = tmp_path / "change.patch"
    patch.write_text("")
    assert contracts.beside(patch) is None
    _write(tmp_path, GOOD)
    assert contracts.beside(patch) == tmp_path / "contract.py"


def test_the_manifest_record_is_checked_against_the_file(tmp_path):
    path = _write(tmp_path, GOOD)
    record = contracts.load_contract(path).to_json()
    assert contracts.from_manifest(None) is None
    assert contracts.from_manifest(record).name == "x"
    path.write_text(GOOD.replace('SUMMARY = "s"', 'SUMMARY = "t"'))
    with pytest.raises(UsageError, match=r"the contract changed since m\.json was built"):
        contracts.from_manifest(record, "m.json")


def test_the_shipped_changes_have_loadable_contracts():
    """Every folder of ci/changes holds a change.patch and a contract that loads, with at least one rule."""
    folders = sorted(p.parent for p in CHANGES_DIR.glob("*/change.patch"))
    assert [f.name for f in folders] == [
        "batched-large-tile",
        "batched-tile-from-load",
        "block-size-override",
        "marlin-ep-m-estimate",
        "tile-oracle",
        "triton-ep-m-estimate",
        "triton-ep-m-tile",
        "triton-ep-m-tile-keep64",
    ]
    loaded = {f.name: contracts.load_contract(f / "contract.py") for f in folders}
    assert all(c.rules for c in loaded.values())
    assert loaded["block-size-override"].settings["override-8"] == {"VLLM_MARLIN_MOE_BLOCK_SIZE_M": "8"}
    assert not any(contracts.may_change(loaded["block-size-override"], p) for p in contracts.PATHS)
    of_m, of_seen = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128}, {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64}
    assert loaded["triton-ep-m-estimate"].triton_config(config_of_m=of_m, config_of_estimate=of_seen) == of_seen
    assert loaded["triton-ep-m-tile"].triton_config(config_of_m=of_m, config_of_estimate=of_seen) == {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 128,
    }
    triton = "vllm.model_executor.layers.fused_moe.fused_moe"
    assert {c.entry_module for n, c in loaded.items() if n.startswith("triton")} == {triton}
    assert {c.entry_module for n, c in loaded.items() if not n.startswith("triton")} == {contracts.ENTRY_MODULE}
    assert loaded["triton-ep-m-tile"].to_json()["entry_module"] == triton


@pytest.mark.parametrize(
    "entry", ["os.path", "vllm.", "vllm.a-b", 3, "vllm..x", "vllm.a.b", "vllm.model_executor.layers.fused_moe.layer"]
)
def test_an_entry_module_must_be_one_of_the_subjects_entries(tmp_path, entry):
    """Issue 39, item 2: another vLLM module as ENTRY_MODULE ended in a KeyError (exit 1, the FAIL code) or in a
    PASS with every test skipped; it is a usage error naming the entries the gate has tests for."""
    with pytest.raises(UsageError, match="ENTRY_MODULE must be the entry module of one of the gate's subjects") as e:
        contracts.load_contract(_write(tmp_path, GOOD + f"ENTRY_MODULE = {entry!r}\n"))
    assert e.value.exit_code == 2 and str(e.value) == (
        f"{tmp_path / 'contract.py'}: ENTRY_MODULE must be the entry module of one of the gate's subjects "
        f"(vllm.model_executor.layers.fused_moe.experts.marlin_moe, vllm.model_executor.layers.fused_moe.fused_moe), "
        f"or None for the one that reaches every changed module, found {entry!r}: the gate has tests for those only"
    )
    for known in (*contracts.ENTRY_MODULES, None):
        assert contracts.load_contract(_write(tmp_path, GOOD + f"ENTRY_MODULE = {known!r}\n")).entry_module == known
    assert contracts.load_contract(_write(tmp_path, GOOD)).entry_module == contracts.ENTRY_MODULE


def test_describe_names_every_path_and_rule_or_says_none(tmp_path):
    text = GOOD.replace("CHANGES_NON_EP = False", "CHANGES_NON_EP = True")
    text = (
        text.replace("CHANGES_BATCHED = False", "CHANGES_BATCHED = True")
        + "def batched_block_size_m(**kw):\n    return 8\n"
    )
    c = contracts.load_contract(_write(tmp_path, text))
    assert c.describe() == (
        "contract x (PR 1): rules fused_block_size_m, batched_block_size_m; may change "
        "non-EP fused, EP fused, batched; settings default, on"
    )
    rules = ["fused_block_size_m", "batched_block_size_m"]
    assert c.to_json() == {
        "name": "x",
        "path": str(tmp_path / "contract.py"),
        "sha256": c.sha256,
        "rules": rules,
        "describe": c.describe(),
        "entry_module": contracts.ENTRY_MODULE,
    }
    bare = GOOD.replace("CHANGES_EP = True", "CHANGES_EP = False").split("def fused_block_size_m")[0]
    assert contracts.load_contract(_write(tmp_path, bare)).describe() == (
        "contract x (PR 1): rules none; may change nothing by default; settings default, on"
    )


def test_errors_list_every_offender(tmp_path):
    with pytest.raises(UsageError, match="does not define NAME, UPSTREAM"):
        contracts.load_contract(_write(tmp_path, GOOD.replace('NAME = "x"\n', "").replace('UPSTREAM = "PR 1"\n', "")))
    two = GOOD.replace("CHANGES_EP = True", "CHANGES_EP = 1").replace("CHANGES_BATCHED = False", "CHANGES_BATCHED = 0")
    with pytest.raises(UsageError, match="CHANGES_EP, CHANGES_BATCHED must be True or False"):
        contracts.load_contract(_write(tmp_path, two))
    with pytest.raises(UsageError, match="fused_block_size_m, batched_block_size_m must be a function"):
        contracts.load_contract(_write(tmp_path, GOOD + "fused_block_size_m = 1\nbatched_block_size_m = 2\n"))


def test_contracts_of_two_folders_load_side_by_side(tmp_path):
    """Each contract runs as its own module (named after its folder), so two never share state."""
    a, b = tmp_path / "my-change", tmp_path / "other"
    a.mkdir(), b.mkdir()
    (a / "contract.py").write_text(GOOD)
    (b / "contract.py").write_text(GOOD.replace('NAME = "x"', 'NAME = "y"'))
    assert [contracts.load_contract(d / "contract.py").name for d in (a, b)] == ["x", "y"]


def test_a_recorded_relative_path_is_found_from_here_or_from_the_repository(tmp_path, monkeypatch):
    shipped = contracts.load_contract(CHANGES_DIR / "block-size-override" / "contract.py").to_json()
    monkeypatch.chdir(tmp_path)
    relative = {**shipped, "path": "ci/changes/block-size-override/contract.py"}
    assert contracts.from_manifest(relative).name == "block-size-override"  # not here: from the repository
    _write(tmp_path, GOOD)
    here = {**contracts.load_contract(tmp_path / "contract.py").to_json(), "path": "contract.py"}
    assert contracts.from_manifest(here).name == "x"  # here: this one, not the repository's
    absolute = {**shipped, "path": str(CHANGES_DIR / "block-size-override" / "contract.py")}
    assert contracts.from_manifest(absolute).name == "block-size-override"
    changed = {**here, "sha256": "0" * 64}
    with pytest.raises(UsageError, match=rf"the manifest was built \(sha256 000000000000 -> {here['sha256'][:12]}\)"):
        contracts.from_manifest(changed)


# A contract is data, not a way out (issue 21, item 3) ---------------------------------------------------

ESCAPES = [
    ("import sys\nsys.exit(0)\n", "line 1: an import other than `import math`"),
    ("from ci.core import evidence\n", "line 1: an import other than `from ci.moe import spec`"),
    (
        "from ci.moe import spec\nspec.pick_block_size_m = lambda *a: 8\n",
        "an assignment to the attribute pick_block_size_m",
    ),
    ("from ci.moe import spec\nX = spec.Fraction\nY = spec.__dict__\n", "line 3: the attribute __dict__"),
    ("X = ().__class__.__bases__\n", "the attribute __bases__"),
    ("X = __import__('os')\n", "the name __import__"),
    ("def fused_block_size_m(**kw):\n    import os\n    return 8\n", "an import inside a function"),
    ("def fused_block_size_m(**kw):\n    while True:\n        pass\n", "a While construct"),
    ("def fused_block_size_m(**kw):\n    global NAME\n    return 8\n", "a Global construct"),
    ("from ci.moe import spec\nX = spec.math\n", "line 2: spec.math, which is not one of its rules or constants"),
    ("def f(g):\n    return g.gi_frame\n", "the attribute gi_frame (only count, endswith"),
    ("try:\n    X = 1\nexcept Exception:\n    pass\n", "a Try statement at the top level"),
    ("X = exit(0)\n", "failed to load: NameError: name 'exit' is not defined"),
    ("X = open('/etc/hostname')\n", "failed to load: NameError: name 'open' is not defined"),
    # issue 39, item 7: class patterns read attributes (case object(__globals__=g) reached __import__)
    ("def f(x):\n    match x:\n        case object(__globals__=g):\n            return g\n", "a Match construct"),
    ("def f(x):\n    match x:\n        case {'a': y}:\n            return y\n", "a Match construct"),
    ("def f(**__kw):\n    return 1\n", "the name __kw"),
    ("def f(__x):\n    return 1\n", "the name __x"),
    ("def f(x):\n    return dict(__class__=1)\n", "the name __class__"),
    ("def __init__():\n    return 1\n", "the name __init__"),
    ("X = [y := 1]\n", "a NamedExpr construct"),
    ("X = 1\nclass C:\n    pass\n", "a ClassDef statement at the top level"),
    ("def f():\n    class C:\n        pass\n", "a ClassDef construct"),
    ("def f():\n    async def g():\n        pass\n", "a AsyncFunctionDef construct"),
]


@pytest.mark.parametrize(("text", "message"), ESCAPES)
def test_a_contract_cannot_reach_the_process_the_gate_or_the_host(tmp_path, text, message):
    path = _write(tmp_path, GOOD + text if not text.startswith(("import", "from")) else text + GOOD)
    with pytest.raises(contracts.ContractError, match=re.escape(message)) as err:
        contracts.load_contract(path)
    assert str(err.value).startswith(str(path))


def test_sys_exit_in_a_contract_is_a_usage_error_and_the_build_writes_nothing(tmp_path, monkeypatch, capsys):
    """It made ci.trees.build exit 0 with the previous manifest in place (sys.exit(0)), or 4, read as NO_BASELINE."""
    from ci.core.cli import run_main
    from ci.trees import build
    from tests.unit.factories import AFTER, BEFORE, MOD, diff, make_release

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "change.patch").write_text(diff(MOD, BEFORE, AFTER))
    (folder / "contract.py").write_text("import sys\nsys.exit(0)\n")
    release = make_release(tmp_path / "rel")
    monkeypatch.setattr(build, "resolve_release", lambda spec, cache: release)
    args = ["--patch", str(folder / "change.patch"), "--out", str(tmp_path / "out")]
    assert run_main(build.main, args) == 2
    assert "contract.py, line 1: an import other than `import math`" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    (folder / "contract.txt").write_text(GOOD)
    assert run_main(build.main, [*args, "--contract", str(folder / "contract.txt")]) == 2
    assert "a contract is a .py file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["/tmp/mine", "../../tmp/mine", "marlin-ep-m-estimate/../block-size-override", "Marlin", "x\n", ""]
)
def test_change_takes_a_name_under_ci_changes_only(name):
    from ci.trees import build

    with pytest.raises(UsageError) as err:
        build.patch_of(name or " ", None)
    assert "a change is named by its folder in ci/changes/" in str(err.value) or "no " in str(err.value)


def test_each_refusal_names_the_line_and_what_a_contract_holds(tmp_path):
    path = _write(tmp_path, GOOD + "@staticmethod\ndef f():\n    return 1\n")  # the def is line 12
    with pytest.raises(contracts.ContractError) as err:
        contracts.load_contract(path)
    assert str(err.value) == (
        f"{path}, line 12: a decorator. A contract holds only NAME = value lines, `from ci.moe import spec`, "
        "`import math` and rule functions of spec's rules and the env mapping they get (ci/trees/contracts.py)"
    )
    cases = {
        "def f(d):\n    d.x['a'] = 1\n": "line 12: an assignment into something other than a local name",
        "def f():\n    spec = {}\n    spec.x = 1\n": "line 13: an assignment to the attribute x",
        "def f(g):\n    return g.gi_code\n": "line 12: the attribute gi_code",
        "import math\ndef f():\n    return math.__spec__\n": "line 13: the attribute __spec__",
        "def f():\n    import os\n": "line 12: an import inside a function",
        "def f():\n    return __builtins__\n": "line 12: the name __builtins__",
        "def f():\n    while 1:\n        pass\n": "line 12: a While construct",
    }
    for text, message in cases.items():
        with pytest.raises(contracts.ContractError, match=re.escape(f"{path}, {message}")):
            contracts.load_contract(_write(tmp_path, GOOD + text))
    first = _write(tmp_path, "int('1')\n" + GOOD)  # a call as the first line is no docstring
    with pytest.raises(contracts.ContractError, match=re.escape("line 1: a Expr statement at the top level")):
        contracts.load_contract(first)


def test_the_allowed_parts_work(tmp_path):
    text = '"""A contract with what it may use."""\nimport math\nfrom ci.moe import spec\n' + GOOD.replace(
        "    return 8\n",
        "    d = {}\n    d['m'] = kw.get('m', 1)\n    return max(spec.BLOCK_SIZES_M[0], math.ceil(d['m']))\n",
    )
    c = contracts.load_contract(_write(tmp_path, text))
    assert c.fused_block_size_m(m=3.5) == 8 and c.fused_block_size_m(m=9) == 9


@pytest.mark.parametrize(
    "text",
    [
        "X = " + "-" * 60000 + "1\n",
        "X = " + "(" * 300 + "1" + ")" * 300 + "\n",
        "X = " + "not " * 15000 + "1\n",
        "X = 1" + " + 1" * 20000 + "\n",
        "X = 1  # " + "x" * 70000 + "\n",
    ],
)
def test_a_contract_nested_too_deep_or_too_large_is_a_contract_error(tmp_path, text):
    """Issue 39, item 6: a deep unary expression ended in MemoryError (exit 70, a traceback)."""
    with pytest.raises(contracts.ContractError) as err:
        contracts.load_contract(_write(tmp_path, GOOD + text))
    assert str(err.value).startswith(str(tmp_path / "contract.py"))
    assert any(
        w in str(err.value)
        for w in ("nested too deeply", "not valid Python", "bytes; a contract is at most", "RecursionError")
    )


def test_a_contract_that_is_not_python_or_not_utf8_is_named(tmp_path):
    path = _write(tmp_path, "NAME = (\n")
    with pytest.raises(contracts.ContractError) as err:
        contracts.load_contract(path)
    assert str(err.value).startswith(f"{path}: not valid Python (") and "(contract.py, line 1)" in str(err.value)
    path.write_bytes(b"NAME = '\xe9'\n")
    with pytest.raises(contracts.ContractError) as err:
        contracts.load_contract(path)
    assert str(err.value).startswith(f"{path}: not UTF-8 text (")


def test_a_contract_of_the_largest_size_is_read_and_one_byte_more_is_refused(tmp_path):
    limit = contracts.MAX_SOURCE_BYTES
    top = GOOD + "# " + "x" * (limit - len(GOOD.encode()) - 3) + "\n"
    assert len(top.encode()) == limit
    contracts.check_source(top, tmp_path / "c.py")
    with pytest.raises(UsageError) as err:
        contracts.check_source(top + "\n", tmp_path / "c.py")
    assert str(err.value) == (
        f"{tmp_path / 'c.py'}: 65,537 bytes; a contract is at most 65,536 (NAME = value lines and a few rule functions)"
    )


@pytest.mark.skipif(sys.version_info < (3, 12), reason="type parameters (`def f[T]()`) parse from Python 3.12 on")
def test_a_rule_with_type_parameters_is_refused(tmp_path):
    with pytest.raises(UsageError) as err:
        contracts.check_source("def rule[T](x):\n    return x\n", tmp_path / "c.py")
    assert f"{tmp_path / 'c.py'}, line 1: type parameters. A contract holds only NAME = value lines" in str(err.value)
