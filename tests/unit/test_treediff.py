"""ci.trees.treediff: what differs between two trees, with the hashes the manifest records."""

from __future__ import annotations

import hashlib
import os

from ci.trees import treediff


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _trees(tmp_path):
    base, cand = tmp_path / "b", tmp_path / "c"
    for tree in (base, cand):
        (tree / "vllm").mkdir(parents=True)
    return base, cand


def test_each_kind_of_difference_carries_the_right_hashes(tmp_path):
    base, cand = _trees(tmp_path)
    release = tmp_path / "release.json"
    release.write_bytes(b"{}")
    (base / "vllm" / "gone.py").write_bytes(b"gone")
    (cand / "vllm" / "new.py").write_bytes(b"new")
    (base / "vllm" / "edit.py").write_bytes(b"aa")
    (cand / "vllm" / "edit.py").write_bytes(b"bb")
    (base / "vllm" / "data.json").symlink_to(release)  # a release link, copied out and patched
    (cand / "vllm" / "data.json").write_bytes(b"{1}")
    (base / "vllm" / "kept.json").symlink_to(release)  # removed by the change
    (base / "vllm" / "moved.py").symlink_to(release)
    (cand / "vllm" / "moved.py").symlink_to(tmp_path / "elsewhere")  # a link to another target
    (cand / "vllm" / "leak.py").symlink_to("/etc/hostname")
    found = {c.path: c for c in treediff.differences(base, cand)}
    kinds = {
        "vllm/data.json": "modified",
        "vllm/edit.py": "modified",
        "vllm/gone.py": "removed",
        "vllm/kept.json": "removed",
        "vllm/leak.py": "link",
        "vllm/moved.py": "link",
        "vllm/new.py": "added",
    }
    assert {p: c.what for p, c in found.items()} == kinds
    assert (found["vllm/gone.py"].sha256_before, found["vllm/gone.py"].sha256_after) == (_sha(b"gone"), None)
    assert (found["vllm/new.py"].sha256_before, found["vllm/new.py"].sha256_after) == (None, _sha(b"new"))
    assert found["vllm/edit.py"].sha256_after == _sha(b"bb") and found["vllm/edit.py"].sha256_before == _sha(b"aa")
    assert found["vllm/data.json"].sha256_before == _sha(b"{}"), "a link is hashed by what it points at"
    assert found["vllm/kept.json"].sha256_before == _sha(b"{}")
    assert found["vllm/leak.py"].sha256_after == _sha(b"symlink -> /etc/hostname"), "never the host's file"
    assert found["vllm/moved.py"].sha256_after == _sha(f"symlink -> {tmp_path / 'elsewhere'}".encode())


def test_same_size_and_time_but_other_bytes_is_a_change(tmp_path):
    base, cand = _trees(tmp_path)
    for tree, text in ((base, b"x = 1\n"), (cand, b"x = 2\n")):
        (tree / "vllm" / "m.py").write_bytes(text)
        os.utime(tree / "vllm" / "m.py", (1_700_000_000, 1_700_000_000))
    assert [c.what for c in treediff.differences(base, cand)] == ["modified"]


def test_bytecode_and_caches_are_differences_like_any_file(tmp_path):
    """Issue 39, item 1: a ``.pyc`` (the candidate's loader would run it instead of the source) and anything
    in ``__pycache__`` count; the gate never writes bytecode into a tree, so one that differs came with the patch."""
    base, cand = _trees(tmp_path)
    for name in ("a.py", "b.py", "c.py", "d.py"):
        (base / "vllm" / name).write_text("same\n")
        (cand / "vllm" / name).write_text("same\n")
    (cand / "vllm" / "b.cpython-311.pyc").write_bytes(b"cache")
    (cand / "vllm" / "d.py").write_text("changed\n")
    (cand / "vllm" / "__pycache__").mkdir()
    (cand / "vllm" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"cache")
    (cand / "vllm" / "__pycache__" / "notes.txt").write_text("not compiled, but in a cache folder")
    (cand / "vllm" / "x.pth").write_text("import os\n")
    found = {c.path: c.what for c in treediff.differences(base, cand)}
    assert found == {
        "vllm/__pycache__/a.cpython-311.pyc": "added",
        "vllm/__pycache__/notes.txt": "added",
        "vllm/b.cpython-311.pyc": "added",
        "vllm/d.py": "modified",
        "vllm/x.pth": "added",
    }
    (base / "vllm" / "__pycache__").mkdir()
    (base / "vllm" / "__pycache__" / "c.cpython-311.pyc").write_bytes(b"base only")
    assert treediff.differences(base, cand)[0].path == "vllm/__pycache__/a.cpython-311.pyc"
    assert {c.path: c.what for c in treediff.differences(base, cand)}["vllm/__pycache__/c.cpython-311.pyc"] == (
        "removed"
    )


def test_the_executable_bit_alone_is_a_mode_change(tmp_path):
    base, cand = _trees(tmp_path)
    for tree in (base, cand):
        (tree / "vllm" / "run.py").write_text("x\n")
    (cand / "vllm" / "run.py").chmod(0o755)
    (base / "vllm" / "run.py").chmod(0o644)
    assert [(c.path, c.what) for c in treediff.differences(base, cand)] == [("vllm/run.py", "mode")]
    (base / "vllm" / "run.py").chmod(0o755)
    assert treediff.differences(base, cand) == []


def test_same_code_is_blind_to_comments_docstrings_and_layout_only():
    base = (
        b'"""Module."""\nimport os\n\n\ndef f(x):\n    """Doc."""\n    return x + 1  # one\n\n\n'
        b'class C:\n    "Doc."\n    y = "kept"\n'
    )
    same = (
        b'"""Module, reworded."""\nimport os\n# a comment\ndef f(x):\n    return (x +\n            1)\n\n\n'
        b'class C:\n    """Other doc."""\n    y = "kept"\n'
    )
    assert treediff.same_code(base, same) and treediff.same_code(base, base)
    for other in (
        base.replace(b"x + 1", b"x + 2"),  # a constant
        base.replace(b'"kept"', b'"moved"'),  # a string that is not a docstring
        base.replace(b"import os", b"import sys"),
        base.replace(b'    """Doc."""\n', b'    """Doc."""\n    pass\n'),  # a statement added after the docstring
        b"def f(x:\n",  # not Python
    ):
        assert not treediff.same_code(base, other), other
    assert not treediff.same_code(b"def f(x:\n", b"def f(x:\n")  # invalid on both sides is never the same code


def test_code_unchanged_takes_modified_python_files_only(tmp_path):
    base, cand = tmp_path / "b", tmp_path / "c"
    for tree, text in ((base, b"X = 1\n"), (cand, b"X = 1  # why\n")):
        (tree / "vllm").mkdir(parents=True)
        (tree / "vllm" / "a.py").write_bytes(text)
        (tree / "vllm" / "a.txt").write_bytes(text)
    changes = {c.path: c for c in treediff.differences(base, cand)}
    assert treediff.code_unchanged(base, cand, changes["vllm/a.py"])
    assert not treediff.code_unchanged(base, cand, changes["vllm/a.txt"])
    added = treediff.FileChange(path="vllm/a.py", sha256_before=None, sha256_after="x", what=treediff.ADDED)
    assert not treediff.code_unchanged(base, cand, added)
