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

from ci.core.errors import MissingDependencyError, PatchError

# git as the gate runs it, whatever the user's configuration says: no user or system config file, paths
# unquoted (patch paths are compared as written), no colour, no external diff or text conversion.
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_PAGER": "cat", "LC_ALL": "C"}
GIT_OPTIONS = (
    "-c",
    "core.quotepath=false",
    "-c",
    "color.ui=never",
    "-c",
    "diff.noprefix=false",
    "-c",
    "diff.mnemonicPrefix=false",
    "-c",
    "core.pager=cat",
)

# Paths a Python-only tree can take; anything compiled needs a full vLLM build.
PATCHED_PREFIX = "vllm/"
COMPILED_PREFIXES = ("csrc/", "cmake/", "setup.py")
COMPILED_NAMES = ("CMakeLists.txt",)  # at any depth
COMPILED_SUFFIXES = (
    ".cu",
    ".cuh",
    ".cpp",
    ".cxx",
    ".cc",
    ".c",
    ".h",
    ".hh",
    ".hpp",
    ".hxx",
    ".inl",
    ".hip",
    ".cubin",
    ".ptx",
    ".fatbin",
    ".cmake",
    ".so",
    ".pyd",
    ".dylib",
    ".dll",
)
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_FAILED_RE = re.compile(r"error: patch failed: (?P<file>.+):(?P<line>\d+)")
_MISSING_RE = re.compile(r"error: (?P<file>.+): (No such file or directory|does not exist in index)")
_PLUS_RE = re.compile(r"^\+\+\+ (?:b/)?(?P<path>[^\t]+)")


def is_compiled(path: str) -> bool:
    """A path of vLLM's compiled sources or build (a Python-only tree cannot test a change to it)."""
    return (
        path.startswith(COMPILED_PREFIXES)
        or path.endswith(COMPILED_SUFFIXES)
        or (path.rsplit("/", 1)[-1] in COMPILED_NAMES)
    )


@dataclass(frozen=True, kw_only=True)
class Hunk:
    old_start: int
    new_start: int
    header: str


@dataclass(frozen=True, kw_only=True)
class FilePatch:
    path: str
    hunks: tuple[Hunk, ...]


def parse_patch(text: str) -> tuple[FilePatch, ...]:
    """The files and hunks of a patch as its ``+++`` headers name them: for messages about a hunk only.
    Which files a patch touches is git's reading (:func:`touched_paths`), and what it changed the trees'
    (``ci.trees.treediff``)."""
    files: list[FilePatch] = []
    path: str | None = None
    hunks: list[Hunk] = []
    for line in text.splitlines():
        if m := _PLUS_RE.match(line):
            if path is not None:
                files.append(FilePatch(path=path, hunks=tuple(hunks)))
            path, hunks = m["path"], []
        elif path is not None and (m := _HUNK_RE.match(line)):
            hunks.append(Hunk(old_start=int(m[1]), new_start=int(m[3]), header=line))
    if path is not None:
        files.append(FilePatch(path=path, hunks=tuple(hunks)))
    return tuple(files)


_MOVE_RE = re.compile(r"^ (?:rename|copy) (?P<what>.+) \(\d+%\)$")
_BRACES_RE = re.compile(r"^(?P<pre>.*)\{(?P<old>.*) => (?P<new>.*)\}(?P<post>.*)$")


def touched_paths(patch: Path) -> list[tuple[str, str]]:
    """(old path, new path) of every file the patch touches, as ``git apply`` reads it (every section, with
    or without a ``diff --git`` line): ``--numstat -z`` for the paths, unquoted; ``--summary`` for the old
    end of a rename or copy (``vllm/{a.py => b.py}`` expanded). Any other file names the same path twice."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        numstat = _git(Path(scratch), "apply", "--numstat", "-z", str(patch.resolve()))
        summary = _git(Path(scratch), "apply", "--summary", str(patch.resolve()))
    if "No valid patches in input" in numstat.stderr:
        return []  # no file section at all: check_touched_paths says so
    for done in (numstat, summary):
        if done.returncode != 0:
            raise PatchError(f"{patch}: git apply cannot read it: {done.stderr.strip() or 'no detail'}")
    new_paths = [f.split("\t", 2)[2] for f in numstat.stdout.split("\0") if f.count("\t") >= 2 and f.split("\t")[2]]
    old_of = {}
    for line in summary.stdout.splitlines():
        if m := _MOVE_RE.match(line):
            if b := _BRACES_RE.match(m["what"]):
                old, new = b["pre"] + b["old"] + b["post"], b["pre"] + b["new"] + b["post"]
            else:
                old, _, new = m["what"].partition(" => ")
            old_of[new.replace("//", "/")] = old.replace("//", "/")
    return [(old_of.get(p, p), p) for p in new_paths]


def check_touched_paths(patch: Path) -> tuple[list[str], list[str]]:
    """(paths under ``vllm/``, other paths) the patch touches. Refused: no file at all, nothing under
    ``vllm/``, any end of a change in compiled sources, a file moved into or out of ``vllm/``."""
    pairs = touched_paths(patch)
    if not pairs:
        raise PatchError(f"{patch}: git apply finds no file in it; is this a patch (git diff, or diff -u)?")
    for old, new in pairs:
        what = f"changes {new}" if old == new else f"moves {old} to {new}"
        if is_compiled(old) or is_compiled(new):
            raise PatchError(
                f"{patch} {what}: a patch touching CUDA/C++ sources or vLLM's build needs a full build of vLLM, "
                "which this gate does not do (its trees reuse the release's compiled kernels); test it on a "
                "vLLM built from source, installed, with --vllm installed"
            )
        if old.startswith(PATCHED_PREFIX) != new.startswith(PATCHED_PREFIX):
            raise PatchError(
                f"{patch} moves {old} to {new}, across the vllm/ package: the trees take only vllm/, so half of "
                "that move would be tested; split the patch or keep the file inside vllm/"
            )
    taken = sorted({p for pair in pairs for p in pair if p.startswith(PATCHED_PREFIX)})
    ignored = sorted({p for pair in pairs for p in pair if not p.startswith(PATCHED_PREFIX)})
    if not taken:
        raise PatchError(f"{patch} changes no file under vllm/: nothing to test ({', '.join(ignored)})")
    return taken, ignored


def _git(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    git = shutil.which("git")
    if git is None:
        raise MissingDependencyError("git is not on PATH: the gate applies patches with `git apply`; install git")
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.resolve().parent), **GIT_ENV)
    return subprocess.run(
        [git, *GIT_OPTIONS, *args], cwd=tree, env=env, capture_output=True, text=True, errors="replace", check=False
    )


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


def split_hunks(text: str) -> list[tuple[str, str, str]]:
    """(path, hunk header, a patch of that hunk alone) for each hunk of ``text``: its file's header lines and
    the hunk, whose end is found by counting its lines (a removed line may start with ``---``)."""
    lines = text.splitlines(keepends=True)
    hunks, header, path, i = [], [], None, 0
    while i < len(lines):
        line = lines[i]
        m = _HUNK_RE.match(line.rstrip("\n"))
        if m and path is not None:
            old_n, new_n = (1 if n is None else int(n) for n in (m[2], m[4]))  # "@@ -5 +5 @@": one line
            body, i = [line], i + 1
            while i < len(lines) and (old_n > 0 or new_n > 0 or lines[i].startswith("\\")):
                kind = lines[i][:1]
                old_n -= kind in (" ", "-", "\n", "")
                new_n -= kind in (" ", "+", "\n", "")
                body.append(lines[i])
                i += 1
            hunks.append((path, line.strip(), "".join(header + body)))
            continue
        git_header_open = bool(header) and header[0].startswith("diff --git ") and path is None
        if line.startswith("diff --git ") or (line.startswith("--- ") and not git_header_open):
            header, path = [line], None
        elif header and path is None:
            header.append(line)
            if m := _PLUS_RE.match(line):
                path = m["path"].strip()
        i += 1
    return hunks


def hunk_report(patch: Path, tree: Path, include: list[str]) -> str:
    """Each hunk of ``patch`` against ``tree``, alone: already in this vLLM (it reverse-applies), applies, or
    differs (neither): what a patch written for another release has in common with this one."""
    import tempfile

    parts = []
    with tempfile.TemporaryDirectory() as scratch:
        one = Path(scratch) / "hunk.patch"
        for n, (path, header, text) in enumerate(split_hunks(patch.read_text(errors="replace")), 1):
            one.write_text(text)
            includes = [f"--include={p}" for p in include]
            if _git(tree, "apply", "--check", "-R", *includes, str(one)).returncode == 0:
                state = "already in this vLLM"
            elif _git(tree, "apply", "--check", *includes, str(one)).returncode == 0:
                state = "applies"
            else:
                state = "differs (neither applies nor reverse-applies)"
            parts.append(f"{n} {header!r} of {path}: {state}")
    return "; ".join(parts)


def apply_patch(
    patch: Path, tree: Path, *, reverse: bool, include: list[str], where: str, auto_reverse: bool = False
) -> bool:
    """Check the whole patch against ``tree``, then apply it; on any mismatch change nothing. With
    ``auto_reverse``, a patch that does not apply forward but reverse-applies (the release already holds
    it) is removed instead, with a line saying so. Returns whether it was reverse-applied."""
    files = parse_patch(patch.read_text(errors="replace"))
    direction = ["-R"] if reverse else []
    includes = [f"--include={p}" for p in include]
    check = _git(tree, "apply", "--check", *direction, *includes, str(patch.resolve()))
    if check.returncode != 0:
        what = _explain(check.stderr, files, reverse=reverse)
        other = _git(tree, "apply", "--check", *([] if reverse else ["-R"]), *includes, str(patch.resolve()))
        if other.returncode == 0 and auto_reverse and not reverse:
            print(
                f"build: {patch} does not apply to {where} but reverse-applies: this vLLM already contains it, "
                "so the base is built by removing it (as --reverse)",
                flush=True,
            )
            return apply_patch(patch, tree, reverse=True, include=include, where=where)
        if other.returncode == 0:
            hint = (
                "it is not in this vLLM: drop --reverse"
                if reverse
                else "this vLLM already contains it: use --reverse to build the base by removing it"
            )
        else:
            hint = (
                f"it was written for another vLLM version; hunk by hunk: {hunk_report(patch, tree, include)}. "
                "Pick the matching --vllm, rebase the patch, or for a change of ci/changes/ add its version for "
                "this release as releases/vllm-<version>.patch beside its change.patch"
            )
        action = "reverse-apply" if reverse else "apply"
        raise PatchError(f"{patch} does not {action} to {where}: {what}; {hint}. Nothing was changed.")
    done = _git(tree, "apply", *direction, *includes, str(patch.resolve()))
    if done.returncode != 0:  # pragma: no cover - git checked it a moment ago
        raise PatchError(f"{patch}: git apply failed after a clean check: {done.stderr.strip()}")
    return reverse
