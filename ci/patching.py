"""Strict patch application with ``git apply``: check the whole patch first, apply all or nothing.

``git apply`` is atomic and refuses any hunk whose context does not match (no fuzz), which
is the rule we want. It runs with the tree as its working directory and discovery of an
enclosing repository switched off, so it patches plain files. Its terse failures are turned
into messages naming the patch, the file and the hunk, and the likely fix.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ci.errors import MissingDependencyError, PatchError

# Paths a Python-only tree can take; anything compiled needs a full vLLM build.
PATCHED_PREFIX = "vllm/"
COMPILED_PREFIXES = ("csrc/", "cmake/", "CMakeLists.txt", "setup.py")
COMPILED_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp", ".cmake", ".so")
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_FAILED_RE = re.compile(r"error: patch failed: (?P<file>.+):(?P<line>\d+)")
_MISSING_RE = re.compile(r"error: (?P<file>.+): (No such file or directory|does not exist in index)")


@dataclass(frozen=True, kw_only=True)
class Hunk:
    old_start: int
    new_start: int
    header: str


@dataclass(frozen=True, kw_only=True)
class FilePatch:
    path: str
    hunks: tuple[Hunk, ...]


def parse_patch(text: str, *, source: str) -> tuple[FilePatch, ...]:
    """The files and hunks of a unified git diff (for messages and path checks)."""
    files: list[FilePatch] = []
    path: str | None = None
    hunks: list[Hunk] = []
    for line in text.splitlines():
        if line.startswith("diff --git "):
            if path is not None:
                files.append(FilePatch(path=path, hunks=tuple(hunks)))
            path, hunks = line.split(" b/", 1)[-1], []
        elif path is not None and (m := _HUNK_RE.match(line)):
            hunks.append(Hunk(old_start=int(m[1]), new_start=int(m[3]), header=line))
    if path is not None:
        files.append(FilePatch(path=path, hunks=tuple(hunks)))
    if not files:
        raise PatchError(f"{source}: no 'diff --git' section found; is this a git-format patch?")
    return tuple(files)


def python_paths(files: tuple[FilePatch, ...], *, source: str) -> tuple[list[str], list[str]]:
    """Split patched paths into those the tree takes (under vllm/) and those it ignores.

    A patch that touches compiled sources cannot be tested on a tree that reuses the
    release's kernels: that is a clear error, not a silent partial test.
    """
    taken, ignored = [], []
    for f in files:
        if f.path.startswith(COMPILED_PREFIXES) or f.path.endswith(COMPILED_SUFFIXES):
            raise PatchError(
                f"{source} changes {f.path}: a patch touching CUDA/C++ sources needs a full build of vLLM, "
                "which this gate does not do (its trees reuse the release's compiled kernels). "
                "Test such a change on a vLLM built from source, installed, with --vllm installed."
            )
        (taken if f.path.startswith(PATCHED_PREFIX) else ignored).append(f.path)
    if not taken:
        raise PatchError(f"{source} changes no file under vllm/: nothing to test ({', '.join(ignored)})")
    return taken, ignored


_MOVE_RE = re.compile(r"^ (?:rename|copy) (?P<what>.+) \(\d+%\)$")
_BRACES_RE = re.compile(r"^(?P<pre>.*)\{(?P<old>.*) => (?P<new>.*)\}(?P<post>.*)$")


def touched_paths(patch: Path) -> list[tuple[str, str]]:
    """(old path, new path) of every file the patch touches, as ``git apply --numstat --summary``
    reads it: a rename or copy names both ends (``vllm/{a.py => b.py}`` expanded), any other
    file the same path twice."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        done = _git(Path(scratch), "apply", "--numstat", "--summary", str(patch.resolve()))
    if done.returncode != 0:
        raise PatchError(f"{patch}: git apply cannot read it: {done.stderr.strip() or 'no detail'}")
    pairs = []
    for line in done.stdout.splitlines():
        if m := _MOVE_RE.match(line):
            if b := _BRACES_RE.match(m["what"]):
                old, new = b["pre"] + b["old"] + b["post"], b["pre"] + b["new"] + b["post"]
            else:
                old, _, new = m["what"].partition(" => ")
            pairs.append((old.replace("//", "/"), new.replace("//", "/")))
        elif line.count("\t") == 2:  # numstat: added, deleted, path (a rename's path is its new one)
            path = line.split("\t")[2]
            if " => " not in path:
                pairs.append((path, path))
    return pairs


def check_touched_paths(patch: Path) -> None:
    """Refuse what a Python-only tree cannot test: a file moved into or out of ``vllm/``, or any
    end of a rename in compiled sources (``python_paths`` reads only each section's new path)."""
    for old, new in touched_paths(patch):
        what = f"changes {new}" if old == new else f"moves {old} to {new}"
        for path in {old, new}:
            if path.startswith(COMPILED_PREFIXES) or path.endswith(COMPILED_SUFFIXES):
                raise PatchError(
                    f"{patch} {what}: a patch touching CUDA/C++ sources needs a full build of vLLM, "
                    "which this gate does not do; test it on a vLLM built from source with --vllm installed"
                )
        if old.startswith(PATCHED_PREFIX) != new.startswith(PATCHED_PREFIX):
            raise PatchError(
                f"{patch} moves {old} to {new}, across the vllm/ package: the trees take only vllm/, so half of "
                "that move would be tested; split the patch or keep the file inside vllm/"
            )


def _git(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    git = shutil.which("git")
    if git is None:
        raise MissingDependencyError("git is not on PATH: the gate applies patches with `git apply`; install git")
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.resolve().parent))
    return subprocess.run([git, *args], cwd=tree, env=env, capture_output=True, text=True, check=False)


def _explain(stderr: str, files: tuple[FilePatch, ...], *, reverse: bool) -> str:
    if m := _FAILED_RE.search(stderr):
        line = int(m["line"])
        for f in files:
            if f.path == m["file"]:
                for h in f.hunks:
                    if (h.new_start if reverse else h.old_start) == line:
                        return f"{f.path}, hunk {h.header.strip()!r}: its context does not match the file"
        return f"{m['file']} near line {line}: the context does not match"
    if m := _MISSING_RE.search(stderr):
        return f"{m['file']}: the file does not exist in this vLLM"
    return stderr.strip() or "git apply refused it"


def apply_patch(patch: Path, tree: Path, *, reverse: bool, include: list[str], where: str,
                auto_reverse: bool = False) -> bool:  # fmt: skip
    """Check the whole patch against ``tree``, then apply it; on any mismatch change nothing. With
    ``auto_reverse``, a patch that does not apply forward but reverse-applies (the release already holds
    it) is removed instead, with a line saying so. Returns whether it was reverse-applied."""
    files = parse_patch(patch.read_text(), source=str(patch))
    direction = ["-R"] if reverse else []
    includes = [f"--include={p}" for p in include]
    check = _git(tree, "apply", "--check", *direction, *includes, str(patch.resolve()))
    if check.returncode != 0:
        what = _explain(check.stderr, files, reverse=reverse)
        other = _git(tree, "apply", "--check", *([] if reverse else ["-R"]), *includes, str(patch.resolve()))
        if other.returncode == 0 and auto_reverse and not reverse:
            print(f"build: {patch} does not apply to {where} but reverse-applies: this vLLM already contains it, "
                  "so the base is built by removing it (as --reverse)", flush=True)  # fmt: skip
            return apply_patch(patch, tree, reverse=True, include=include, where=where)
        if other.returncode == 0:
            hint = (
                "it is not in this vLLM: drop --reverse"
                if reverse
                else "this vLLM already contains it: use --reverse to build the base by removing it"
            )
        else:
            hint = "it was written for another vLLM version: pick the matching --vllm or rebase the patch"
        action = "reverse-apply" if reverse else "apply"
        raise PatchError(f"{patch} does not {action} to {where}: {what}; {hint}. Nothing was changed.")
    done = _git(tree, "apply", *direction, *includes, str(patch.resolve()))
    if done.returncode != 0:  # pragma: no cover - git checked it a moment ago
        raise PatchError(f"{patch}: git apply failed after a clean check: {done.stderr.strip()}")
    return reverse
