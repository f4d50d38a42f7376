"""Nothing of a patch runs unseen (issue 39, items 1-4): bytecode, entry hijacks, TYPE_CHECKING imports, and changed
lines a tier never executes. Each test failed on the gate of commit 4369f3a (the closing note's table).

The toy release of ``tests.unit.factories`` stands in for vLLM; the same refusals on vLLM 0.25.1 itself, with the
crafted patches of ``tests/data/crafted``, are ``tests/ep_marlin/test_changed_lines.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import py_compile
import subprocess
import sys
import uuid
import warnings
from pathlib import Path

import pytest

from ci.core.errors import DataError, PatchError
from ci.trees import build, changed_lines, treediff, variants
from ci.trees.manifest import TreeManifest, Trees
from tests.unit.factories import AFTER, BEFORE, ENTRY, MOD, diff, make_release

TRITON_ENTRY = variants.ENTRY_MODULES[1].replace(".", "/") + ".py"


def _git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "HOME": str(cwd),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout


def _bytecode_patch(tmp_path: Path, source: str, compiled_from: str) -> Path:
    """A git patch (``GIT binary patch`` section) that edits mod.py to ``source`` and adds an unchecked-hash
    ``__pycache__`` file compiled from ``compiled_from``: Python runs that bytecode, not the source."""
    repo = tmp_path / "repo"
    (repo / "vllm" / "layers").mkdir(parents=True)
    (repo / MOD).write_text(BEFORE)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    (repo / MOD).write_text(compiled_from)
    cache = Path(importlib.util.cache_from_source(str(repo / MOD)))
    cache.parent.mkdir()
    py_compile.compile(
        str(repo / MOD), cfile=str(cache), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    (repo / MOD).write_text(source)
    _git(repo, "add", "-A")
    patch = tmp_path / "bytecode.patch"
    patch.write_text(_git(repo, "diff", "--cached", "--binary"))
    return patch


def test_a_patch_that_brings_bytecode_is_refused_naming_the_file(tmp_path):
    """Item 1: the .pyc applied with the patch, was left out of the manifest (treediff skipped caches), and the
    candidate's loader ran it: a mutant in bytecode PASSed. Now every file that differs counts."""
    release = make_release(tmp_path / "rel")
    patch = _bytecode_patch(tmp_path, AFTER, compiled_from=AFTER.replace("m // 2", "m // 3"))
    assert "GIT binary patch" in patch.read_text()
    with pytest.raises(PatchError) as err:
        build.build_trees(build.BuildOptions(patch=patch, out=tmp_path / "t", contract="none"), release=release)
    assert err.value.exit_code == 5
    cache = Path(importlib.util.cache_from_source(MOD)).as_posix()
    assert f"{cache} is bytecode" in str(err.value) and "imports them from source only" in str(err.value)
    assert not (tmp_path / "t").exists()


def _toy_package(root: Path, name: str, source: str, compiled_from: str) -> Path:
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(compiled_from)
    cache = Path(importlib.util.cache_from_source(str(pkg / "mod.py")))
    cache.parent.mkdir()
    py_compile.compile(
        str(pkg / "mod.py"), cfile=str(cache), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    (pkg / "mod.py").write_text(source)
    return pkg


def test_the_candidate_is_compiled_from_its_source_whatever_bytecode_lies_beside_it(tmp_path, monkeypatch):
    """A cache beside a candidate module (a patch's, or one dropped there after the build) is never what runs."""
    name = f"gatetoy_{uuid.uuid4().hex}"  # unique per call: mutmut runs the tests in one process more than once
    pkg = _toy_package(tmp_path, name, "WHO = 'source'\n", compiled_from="WHO = 'bytecode'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)
    plain = importlib.util.spec_from_file_location(f"{name}.mod", pkg / "mod.py")
    module = importlib.util.module_from_spec(plain)
    plain.loader.exec_module(module)
    assert module.WHO == "bytecode", "Python's own loader runs the unchecked cache: the test would prove nothing"
    assert variants.load_modules(tmp_path, [f"{name}.mod"])[f"{name}.mod"].WHO == "source"


def test_the_base_tree_is_imported_from_source_and_caches_outside_it(tmp_path, monkeypatch):
    """The base tree's path hook: a foreign cache in the tree is ignored, and nothing is written into the tree
    (its bytecode goes to the gate's folder beside the trees), so the trees stay as the build left them."""
    name = f"gatebase_{uuid.uuid4().hex}"
    tree = tmp_path / "base"
    _toy_package(tree, name, "WHO = 'source'\n", compiled_from="WHO = 'bytecode'\n")
    (tree / name / "other.py").write_text("X = 1\n")
    monkeypatch.setattr(sys, "path_hooks", list(sys.path_hooks))
    monkeypatch.setattr(sys, "path_importer_cache", dict(sys.path_importer_cache))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.syspath_prepend(str(tree))
    variants.import_tree_from_source(tree, tmp_path / "bytecode")
    variants.import_tree_from_source(tree, tmp_path / "bytecode")  # once is enough: a second call adds nothing
    assert sum(getattr(h, "gate_tree", None) is not None for h in sys.path_hooks) >= 1
    assert importlib.import_module(f"{name}.mod").WHO == "source"
    assert importlib.import_module(f"{name}.other").X == 1
    caches = sorted(p.name for p in (tree / name / "__pycache__").iterdir())
    assert caches == [Path(importlib.util.cache_from_source("mod.py")).name], "the tree got new bytecode"
    assert len(list((tmp_path / "bytecode").glob("*.pyc"))) == 3  # the package, mod and other, beside the tree
    for n in (name, f"{name}.mod", f"{name}.other"):
        sys.modules.pop(n, None)
    (tree / name / "other.py").write_text("X = 2\n")  # a cache is checked against its source's hash
    assert importlib.import_module(f"{name}.other").X == 2


def test_bytecode_written_into_a_tree_after_the_build_stops_the_candidate(tmp_path):
    """The candidate loads only if the trees still differ as the manifest says: a cache that appears later is a
    difference the build did not record."""
    release = make_release(tmp_path / "rel")
    (tmp_path / "p.patch").write_text(diff(MOD, BEFORE, AFTER))
    trees = build.build_trees(
        build.BuildOptions(patch=tmp_path / "p.patch", out=tmp_path / "t", contract="none"), release=release
    )
    (trees.candidate / "vllm" / "layers" / "__pycache__").mkdir()
    (trees.candidate / "vllm" / "layers" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\x00" * 16)
    with pytest.raises(DataError, match="no longer differ as the manifest records"):
        variants.load_candidate(trees)


# Items 2 and 3: only imports that run count ---------------------------------------------------------------

TYPE_CHECKING_IMPORT = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from vllm.layers import other\n"


def _release_with(tmp_path: Path, files: dict[str, str]):
    release = make_release(tmp_path / "rel")
    for rel, text in files.items():
        path = release.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return release


def test_imports_inside_type_checking_blocks_do_not_count(tmp_path):
    (tmp_path / "vllm" / "a").mkdir(parents=True)
    for mod in ("x", "y", "z", "w"):
        (tmp_path / "vllm" / "a" / f"{mod}.py").write_text("")
    (tmp_path / "vllm" / "a" / "m.py").write_text(
        "import typing\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vllm.a import x\n"
        "else:\n    from vllm.a import y\nif typing.TYPE_CHECKING:\n    import vllm.a.z\n"
        "def f():\n    if not TYPE_CHECKING:\n        from vllm.a import w\n"
    )
    runtime = variants.direct_imports(tmp_path, "vllm.a.m")
    assert {"vllm.a.y", "vllm.a.w"} <= runtime and not {"vllm.a.x", "vllm.a.z"} & runtime
    assert {"vllm.a.x", "vllm.a.z"} <= variants.direct_imports(tmp_path, "vllm.a.m", type_checking=True)


def test_a_changed_module_reached_only_under_type_checking_is_refused(tmp_path):
    """Item 3: the entry gained a TYPE_CHECKING import of a changed module, which never runs: the module counted
    as reached, and its off-by-one PASSed."""
    release = _release_with(tmp_path, {"vllm/layers/other.py": "def n(x):\n    return x\n"})
    entry = (release.root / ENTRY).read_text()
    patch = tmp_path / "p.patch"
    off_by_one = diff("vllm/layers/other.py", "def n(x):\n    return x\n", "def n(x):\n    return x + 1\n")
    patch.write_text(diff(ENTRY, entry, entry + TYPE_CHECKING_IMPORT) + off_by_one)
    with pytest.raises(PatchError) as err:
        build.build_trees(build.BuildOptions(patch=patch, out=tmp_path / "t", contract="none"), release=release)
    assert "vllm/layers/other.py is imported only inside `if TYPE_CHECKING:` blocks" in str(err.value)
    assert "which never run, so the candidate would never run it" in str(err.value)


def test_a_type_checking_import_cannot_take_the_entry_of_another_subject(tmp_path):
    """Item 2: Triton's entry gained a TYPE_CHECKING import of marlin_moe, so it seemed to reach both changed
    modules; the gate took it, skipped the Marlin tier, and a broken non-EP promise PASSed."""
    fused = "import os\n\n\ndef config():\n    return 1\n"
    release = _release_with(tmp_path, {TRITON_ENTRY: fused})
    entry = (release.root / ENTRY).read_text()
    hijack = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import " + variants.ENTRY_MODULE + "\n"
    patch = tmp_path / "p.patch"
    patch.write_text(diff(TRITON_ENTRY, fused, fused + hijack) + diff(ENTRY, entry, entry + "LIMIT = 4\n"))
    with pytest.raises(PatchError) as err:
        build.build_trees(build.BuildOptions(patch=patch, out=tmp_path / "t", contract="none"), release=release)
    assert f"{TRITON_ENTRY} is not imported by {variants.ENTRY_MODULE}" in str(err.value)


def test_the_entry_a_contract_names_must_be_a_subjects(tmp_path):
    with pytest.raises(Exception, match="is not one of the gate's subjects"):
        variants.choose_entry([], tmp_path, source="x.patch", declared="vllm.model_executor.layers.fused_moe.layer")


# Item 4: the change's lines, measured ----------------------------------------------------------------------


def test_changed_lines_are_the_candidates_added_and_replaced_ones():
    base = "a\nb\nc\nd\n"
    assert changed_lines.changed_line_numbers(base, "a\nB\nc\nd\n") == [2]
    assert changed_lines.changed_line_numbers(base, "a\nb\nx\ny\nc\nd\n") == [3, 4]
    assert changed_lines.changed_line_numbers(base, "a\nd\n") == []  # a removal adds no line to run
    assert changed_lines.changed_line_numbers("", "x\n") == [1]


def _measured_trees(tmp_path: Path, new: str, old: str = BEFORE):
    release = make_release(tmp_path / "rel", text=old)
    (tmp_path / "p.patch").write_text(diff(MOD, old, new))
    return build.build_trees(
        build.BuildOptions(patch=tmp_path / "p.patch", out=tmp_path / "t", contract="none"), release=release
    )


def _record(trees, folder: Path, lines: list[int]) -> None:
    _record_lines(trees, folder, {MOD: lines})


NEW = (
    "import os\n\n\ndef pick(m):\n    m = (m //\n         2)\n    # a comment\n    if m > 100:  # pragma: no cover\n"
    "        m = 100\n    return m\n\n\nLIMIT = 3\n"
)


def test_the_changed_statements_are_mapped_through_coverages_parser(tmp_path):
    """A line inside a multi-line statement is that statement; a comment is none; a pragma excludes nothing."""
    trees = _measured_trees(tmp_path, NEW)
    assert changed_lines.changed_statements(trees) == {MOD: [5, 8, 9]}


def test_a_run_names_every_changed_statement_it_did_not_execute(tmp_path):
    trees = _measured_trees(tmp_path, NEW)
    _record(trees, tmp_path / "run", [4, 5, 6, 8, 10])  # the continuation line 6 counts as its statement, 5
    report = changed_lines.summarize(trees, tmp_path / "run")
    assert report.measured and (report.statements, report.executed) == (3, 2)
    assert report.unexecuted == [f"{MOD}:9"] and not report.complete
    _record(trees, tmp_path / "all", [5, 8, 9])
    assert changed_lines.summarize(trees, tmp_path / "all").complete


def test_no_data_or_no_coverage_is_not_measured_never_complete(tmp_path, monkeypatch):
    trees = _measured_trees(tmp_path, NEW)
    report = changed_lines.summarize(trees, tmp_path / "nothing")
    assert not report.measured and not report.complete and "no test process recorded" in report.why_not_measured
    monkeypatch.setitem(sys.modules, "coverage", None)
    report = changed_lines.summarize(trees, tmp_path / "nothing")
    assert not report.measured and changed_lines.COVERAGE_PIN in report.why_not_measured
    assert changed_lines.start(trees, tmp_path / "x") is None


def test_a_change_of_no_python_statement_needs_no_measuring(tmp_path):
    """A comment, even on a statement's line, or a statement laid out again changes no code (``same_code``): the
    candidate runs the base's copy of the file, and no line of it is a changed statement left unrun."""
    for i, text in enumerate(
        (
            BEFORE.replace("import os\n", "import os  # a comment\n"),
            BEFORE + "# the end\n",
            BEFORE.replace("    m = m\n", "    m = (\n        m\n    )\n"),
        )
    ):
        trees = _measured_trees(tmp_path / str(i), text)
        assert changed_lines.changed_python_files(trees) == [] and changed_lines.changed_statements(trees) == {}
        assert changed_lines.summarize(trees, tmp_path / str(i) / "none").complete
    code = _measured_trees(tmp_path / "code", BEFORE.replace("import os\n", "import os  # a comment\nX = 1\n"))
    assert changed_lines.changed_statements(code) == {MOD: [1, 2]}  # in a file of changed code, every changed line


def test_coverage_started_by_the_gate_measures_the_candidates_changed_file(tmp_path):
    """start/stop/summarize as the test processes use them, on the toy candidate (one process)."""
    trees = _measured_trees(tmp_path, AFTER)
    cov = changed_lines.start(trees, tmp_path / "run")
    try:
        spec = importlib.util.spec_from_file_location("toy_mod", trees.candidate / MOD)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.pick(8) == 4
    finally:
        changed_lines.stop(cov)
    report = changed_lines.summarize(trees, tmp_path / "run")
    assert report.complete and report.statements == 1


# The change's lines on trees made here: what each part of ci.trees.changed_lines must do -----------------------


def _toy_trees(tmp_path: Path, files: dict[str, tuple[bytes | None, bytes | None]], others=()) -> Trees:
    """Two trees holding ``files`` (relative path: (base bytes, candidate bytes); None: not in that tree), and a
    manifest that lists them as changed (``others``: more changed paths, FileChange(path, what))."""
    changes = []
    for rel, (old, new) in files.items():
        for side, data in (("base", old), ("candidate", new)):
            if data is not None:
                (tmp_path / side / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / side / rel).write_bytes(data)
        what = treediff.ADDED if old is None else treediff.REMOVED if new is None else treediff.MODIFIED
        changes.append(treediff.FileChange(path=rel, sha256_before=None, sha256_after=None, what=what))
    changes += [treediff.FileChange(path=p, sha256_before=None, sha256_after=None, what=w) for p, w in others]
    m = TreeManifest(
        vllm_version="0.0.0",
        vllm_source="toy",
        patch_path="p",
        patch_sha256="0",
        reverse=False,
        base="base",
        candidate="candidate",
        changed_files=tuple(changes),
    )
    base, candidate = tmp_path / "base", tmp_path / "candidate"
    return Trees(manifest_path=tmp_path / "m.json", manifest=m, base=base, candidate=candidate)


def test_only_added_and_modified_python_files_are_the_changes_code(tmp_path):
    trees = _toy_trees(
        tmp_path,
        {"a.py": (b"x = 1\n", b"x = 2\n"), "gone.py": (b"y = 1\n", None), "new.py": (None, b"z = 1\n")},
        others=[("README.md", treediff.MODIFIED), ("tool.py", treediff.MODE)],
    )
    assert changed_lines.changed_python_files(trees) == ["a.py", "new.py"]
    assert changed_lines.changed_statements(trees) == {"a.py": [1], "new.py": [1]}  # an added file: every line


def test_a_long_file_of_repeated_lines_has_only_its_edited_line_changed():
    """difflib's autojunk would call the 300 lines after a one-line edit in a file of repeats changed."""
    base = ["x = 1"] * 300 + ["y = 2"] + ["x = 1"] * 300
    new = [*base[:300], "y = 3", *base[301:]]
    assert changed_lines.changed_line_numbers("\n".join(base), "\n".join(new)) == [301]


def test_a_file_that_does_not_parse_is_skipped_and_the_next_one_still_read(tmp_path):
    trees = _toy_trees(tmp_path, {"a.py": (b"x = 1\n", b"x = (\n"), "b.py": (b"x = 1\n", b"x = 3\n")})
    assert changed_lines.changed_statements(trees) == {"b.py": [1]}


LATIN = b"# caf\xe9, not UTF-8\nx = 1\n"  # an undecodable byte in a comment


def test_an_undecodable_byte_in_either_tree_is_read_as_a_replacement(tmp_path):
    trees = _toy_trees(tmp_path, {"a.py": (LATIN, LATIN + b"y = 2\n")})
    assert changed_lines.changed_statements(trees) == {"a.py": [3]}
    _record_lines(trees, tmp_path / "run", {"a.py": [2]})
    report = changed_lines.summarize(trees, tmp_path / "run")
    assert report.unexecuted == ["a.py:3"]


def _record_lines(trees, folder: Path, lines: dict[str, list[int]]) -> None:
    from coverage import CoverageData

    folder.mkdir(parents=True, exist_ok=True)
    data = CoverageData(basename=str(folder / ".coverage.one"))
    data.add_lines({str((trees.candidate / rel).resolve()): n for rel, n in lines.items()})
    data.write()


def test_every_file_a_run_never_entered_has_all_its_changed_statements_named(tmp_path):
    trees = _toy_trees(
        tmp_path, {"a.py": (b"x = 1\n", b"x = 2\ny = 3\n"), "b.py": (b"", b"z = 1\nw = 2\n"), "c.py": (b"", b"v = 1\n")}
    )
    _record_lines(trees, tmp_path / "run", {"a.py": [1], "c.py": [1]})  # b.py never ran
    report = changed_lines.summarize(trees, tmp_path / "run")
    assert report == changed_lines.LineReport(
        measured=True, statements=5, executed=2, unexecuted=["a.py:2", "b.py:1", "b.py:2"]
    )


def test_an_unmeasured_run_keeps_the_count_and_says_why(tmp_path, monkeypatch):
    trees = _toy_trees(tmp_path, {"a.py": (b"x = 1\n", b"x = 2\ny = 3\n")})
    assert changed_lines.summarize(trees, tmp_path / "absent") == changed_lines.LineReport(
        measured=False, statements=2, why_not_measured="no test process recorded coverage data (did any test run?)"
    )
    monkeypatch.setitem(sys.modules, "coverage", None)
    assert changed_lines.summarize(trees, tmp_path / "absent") == changed_lines.LineReport(
        measured=False,
        statements=2,
        why_not_measured=(
            "coverage.py is not installed, so no changed line was measured: install it (coverage==7.17.5, "
            "requirements/test.txt), or run the tier through its nox session"
        ),
    )


def _run_toy(trees, folder: Path, rel: str = "a.py"):
    cov = changed_lines.start(trees, folder)
    try:
        spec = importlib.util.spec_from_file_location(f"toy_{uuid.uuid4().hex}", trees.candidate / rel)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        exec(compile("sum(range(3))", str(folder / "other.py"), "exec"), {})  # code outside the changed files
    finally:
        changed_lines.stop(cov)


def test_each_process_keeps_its_own_line_data_of_the_changed_files_only(tmp_path, monkeypatch):
    """Each xdist worker writes a data file of its own (a suffix), of the changed files only, lines not arcs; a
    .coveragerc where the tests run changes nothing; the folder and its parents are made, or reused."""
    from coverage import CoverageData

    trees = _toy_trees(tmp_path, {"a.py": (b"x = 1\n", b"x = 2\nif x:\n    y = 3\n")})
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".coveragerc").write_text("[run]\nomit = */a.py\nbranch = True\n")
    folder = tmp_path / "deep" / "run"
    _run_toy(trees, folder)
    _run_toy(trees, folder)  # a second process, the same folder
    files = sorted(folder.glob(".coverage*"))
    assert len(files) == 2 and all(f.name.startswith(".coverage.") for f in files)
    data = CoverageData(basename=str(files[0]))
    data.read()
    assert data.measured_files() == {os.path.realpath(trees.candidate / "a.py")} and not data.has_arcs()
    assert changed_lines.summarize(trees, folder).complete


def test_a_process_that_ran_none_of_the_changed_files_warns_nothing(tmp_path):
    trees = _toy_trees(tmp_path, {"a.py": (b"x = 1\n", b"x = 2\n")})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        changed_lines.stop(changed_lines.start(trees, tmp_path / "run"))
    assert [str(w.message) for w in caught] == []


def test_the_unrun_lines_are_shown_eight_at_most_and_the_report_is_written_as_json(tmp_path):
    lines = [f"a.py:{n}" for n in range(1, 11)]
    assert changed_lines.shown(lines) == ", ".join(lines[:8]) + " and 2 more"
    assert changed_lines.shown(lines[:8]) == ", ".join(lines[:8])
    assert changed_lines.shown(lines[:9], limit=9) == ", ".join(lines[:9])
    report = changed_lines.LineReport(measured=True, statements=3, executed=2, unexecuted=["a.py:3"])
    assert report.to_json() == {
        "measured": True,
        "statements": 3,
        "executed": 2,
        "unexecuted": ["a.py:3"],
        "why_not_measured": "",
    }
    changed_lines.write(report, tmp_path / "lines.json")
    assert (tmp_path / "lines.json").read_text() == (
        '{\n "measured": true,\n "statements": 3,\n "executed": 2,\n "unexecuted": [\n  "a.py:3"\n ],\n'
        ' "why_not_measured": ""\n}\n'
    )
