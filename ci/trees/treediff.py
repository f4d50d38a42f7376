"""What differs between the base and candidate trees: the one source of truth for what a change changed.

A patch's headers are not trusted to say which files it touches (``git apply`` also takes sections without
a ``diff --git`` line, and paths a header parser splits wrongly): after the patch is applied, the two trees
are compared file by file (content, the executable bit, symbolic links, added and removed files), and that
list is what the manifest records, what ``ci.trees.variants`` loads from the candidate and what the reports name.

Every file counts, whatever its kind: bytecode (``.pyc``, ``__pycache__`` folders), compiled libraries,
``.pth`` and data files alike. Nothing of the gate writes bytecode into a tree (``ci.trees.variants`` imports
the trees from source, its cache outside them), so a cache that differs is one a patch brought, and the
build refuses it with its path (``ci.trees.variants.candidate_modules``).

A tree holds copies of vLLM's Python files and links (made by the builder) to the release's other files.
A link is the same as a file when both name the same target, or when the file holds the bytes the link
points at (a file the builder copied out before patching it and the patch left as it was).
"""

from __future__ import annotations

import ast
import filecmp
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

ADDED, REMOVED, MODIFIED, MODE, LINK = "added", "removed", "modified", "mode", "link"


@dataclass(frozen=True, kw_only=True)
class FileChange:
    """One path that differs: ``what`` is added, removed, modified (content), mode (only the executable bit)
    or link (the candidate holds a symbolic link there that the base does not)."""

    path: str
    sha256_before: str | None
    sha256_after: str | None
    what: str = MODIFIED


def _entries(tree: Path) -> dict[str, os.stat_result]:
    """Every file and link under ``tree`` (not followed), by path relative to it: bytecode and caches too."""
    found = {}
    for folder, dirs, files in os.walk(tree):
        rel = Path(folder).relative_to(tree)
        for name in files + [d for d in dirs if (Path(folder) / d).is_symlink()]:
            found[(rel / name).as_posix()] = (Path(folder) / name).lstat()
        dirs[:] = [d for d in dirs if not (Path(folder) / d).is_symlink()]
    return found


def _sha256(path: Path, *, follow: bool = True) -> str | None:
    """The content's sha256; a link that is not followed (one the builder did not make: it may point at
    any file of the host) by its target's name, never by what it points at."""
    if path.is_symlink() and not follow:
        return hashlib.sha256(f"symlink -> {os.readlink(path)}".encode()).hexdigest()
    if path.is_symlink() and not path.exists():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_link(st: os.stat_result) -> bool:
    return (st.st_mode & 0o170000) == 0o120000


def _executable(path: Path) -> bool:
    return os.access(path, os.X_OK)  # of what a link points at; False for what does not exist


def _same(base: Path, cand: Path, sb: os.stat_result, sc: os.stat_result) -> str | None:
    """None when the two entries are the same file; else what differs."""
    if _is_link(sc):  # both trees are made from one release, so the builder's links name the same targets
        return None if _is_link(sb) and os.readlink(base) == os.readlink(cand) else LINK
    if not (base.exists() and filecmp.cmp(base, cand, False)):  # not shallow: the bytes, whatever the times say
        return MODIFIED
    return MODE if _executable(base) != _executable(cand) else None


def differences(base: Path, candidate: Path) -> list[FileChange]:
    """What differs from ``base`` to ``candidate``, sorted by path. A link in the candidate is hashed by its
    target's name (a link that differs is never the builder's); one in the base by what it points at (the
    builder's link to the release, which the patch replaced by a file)."""
    before, after = _entries(base), _entries(candidate)
    changes = []
    for rel in sorted(before.keys() | after.keys()):
        b, c = base / rel, candidate / rel
        if rel not in after:
            changes.append(FileChange(path=rel, sha256_before=_sha256(b), sha256_after=None, what=REMOVED))
        elif rel not in before:
            what = LINK if _is_link(after[rel]) else ADDED
            changes.append(FileChange(path=rel, sha256_before=None, sha256_after=_sha256(c, follow=False), what=what))
        elif (what := _same(b, c, before[rel], after[rel])) is not None:
            changes.append(
                FileChange(path=rel, sha256_before=_sha256(b), sha256_after=_sha256(c, follow=False), what=what)
            )
    return changes


def _code_of(source: bytes) -> str | None:
    """The module's code as Python runs it: its syntax tree with docstrings dropped and no line numbers
    (comments and layout are not in it). None when the file is not valid Python."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)  # without line numbers: include_attributes is False by default


def same_code(before: bytes, after: bytes) -> bool:
    """Whether two versions of a Python module differ only in comments, docstrings and layout, which change
    nothing vLLM runs (it runs under ``python -OO`` too, which drops docstrings). A file that is not valid
    Python on either side is never the same code."""
    code = _code_of(before)
    return code is not None and code == _code_of(after)


def code_unchanged(base: Path, candidate: Path, change: FileChange) -> bool:
    """Whether ``change`` is a modified Python file of the same code in both trees (:func:`same_code`)."""
    if change.what != MODIFIED or not change.path.endswith(".py"):
        return False
    return same_code((base / change.path).read_bytes(), (candidate / change.path).read_bytes())
