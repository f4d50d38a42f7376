"""A contributor's branch as the gate's patch: ``git diff BASE...HEAD -- vllm/`` of a vLLM checkout.

The gate's trees take the Python files of a vLLM release and reuse its compiled kernels, so a
branch is tested as the change between the merge-base of BASE and HEAD and HEAD, restricted to
``vllm/``. A branch that changes compiled sources (``csrc/``, ``CMakeLists.txt``, ``cmake/``,
``setup.py``, ``*.cu`` ...) cannot be tested this way and is refused with the files named; other
paths (tests, docs) are left out and listed. The patch starts with a header naming the
repository, both refs and their commits (``git apply`` skips it); the manifest records its sha256.

CLI: ``python -m ci.trees.refpatch --repo CHECKOUT --base REF --head REF --out FILE``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ci.core.cli import run_main
from ci.core.errors import MissingDependencyError, PatchError, UsageError
from ci.trees.patching import GIT_ENV, GIT_OPTIONS, PATCHED_PREFIX, is_compiled

# The diff as git apply reads it, whatever the user's or the repository's configuration says.
DIFF_OPTIONS = (
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    "--no-relative",
    "--unified=3",
    "--binary",
    "--no-renames",
)
LINK_MODE = "120000"


def git_bytes(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    """git's output, as bytes, run with the gate's fixed options (no user or system configuration)."""
    git = shutil.which("git")
    if git is None:
        raise MissingDependencyError("git is not on PATH: install git")
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(
        [git, *GIT_OPTIONS, "-C", str(repo), *args], input=stdin, capture_output=True, env=env, check=False
    )
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip() or "failed"
        raise UsageError(f"git {' '.join(args)} in {repo}: {detail}")
    return done.stdout


def git_text(repo: Path, *args: str) -> str:
    """git's output as UTF-8 text (``git_bytes``); output that is not UTF-8 is a :class:`PatchError`."""
    out = git_bytes(repo, *args)
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchError(f"git {' '.join(args)} in {repo}: its output is not UTF-8 ({exc})") from None


def _check_branch_files(repo: Path, merge_base: str, head: str, taken: list[str]) -> None:
    """Refuse what a tree of files cannot hold as such: a symbolic link at either end (it can name any file
    of the host) and a file that is not UTF-8 text (a patch of it would not be the file)."""
    for ref in (merge_base, head):
        listing = git_bytes(repo, "ls-tree", "-r", "-z", ref, "--", PATCHED_PREFIX).split(b"\0")
        links = [e.split(b"\t", 1)[1].decode(errors="replace") for e in listing if e.startswith(LINK_MODE.encode())]
        if links:
            raise PatchError(
                f"{ref[:12]} holds symbolic links under vllm/ ({', '.join(sorted(links)[:8])}): the gate "
                "tests files only; replace each by the file it points at"
            )
    for path in taken:
        for ref in (merge_base, head):
            try:
                git_bytes(repo, "cat-file", "blob", f"{ref}:{path}").decode("utf-8")
            except UsageError:
                continue  # not in that commit (added or removed)
            except UnicodeDecodeError:
                raise PatchError(
                    f"{path} at {ref[:12]} is not UTF-8 text: the gate tests vLLM's Python files, "
                    "which are; leave it out of the branch or convert it"
                ) from None


def has_commit(repo: Path, ref: str) -> bool:
    try:
        git_bytes(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except UsageError:
        return False
    return True


def _resolve(repo: Path, ref: str, flag: str) -> str:
    if not has_commit(repo, ref):
        raise UsageError(
            f"{flag} {ref}: not a commit of {repo} (a fork clone may call vLLM's repository 'upstream': "
            f"try upstream/main, or a release tag such as v0.25.1; `git -C {repo} fetch` first if it is "
            "a branch you have not fetched)"
        )
    return git_text(repo, "rev-parse", "--verify", f"{ref}^{{commit}}").strip()


def make_patch(repo: Path, base: str, head: str) -> tuple[str, dict]:
    """The patch text of ``base...head`` under ``vllm/``, and what it was made from."""
    if not (repo / ".git").exists():
        raise UsageError(f"--repo {repo}: not a git checkout (no .git); clone the vLLM fork with its history")
    head_sha = _resolve(repo, head, "--head-ref")
    base_sha = _resolve(repo, base, "--base-ref")
    merge_base = git_text(repo, "merge-base", base_sha, head_sha).strip()
    names = git_text(repo, "diff", "--name-only", "-z", "--no-renames", "--no-relative", merge_base, head_sha)
    changed = [p for p in names.split("\0") if p]
    compiled = [p for p in changed if is_compiled(p)]
    if compiled:
        raise PatchError(
            f"{head} changes compiled sources ({', '.join(compiled[:8])}): this mode reuses a release's kernels "
            "and cannot test them; build vLLM from that branch and run the gate with --vllm installed"
        )
    taken = [p for p in changed if p.startswith(PATCHED_PREFIX)]
    if not taken:
        raise PatchError(f"{base}...{head} changes nothing under vllm/ ({len(changed)} other files): nothing to test")
    _check_branch_files(repo, merge_base, head_sha, taken)
    body = git_text(repo, "diff", *DIFF_OPTIONS, merge_base, head_sha, "--", PATCHED_PREFIX)
    info = {
        "base": base,
        "base_sha": base_sha,
        "merge_base": merge_base,
        "head": head,
        "head_sha": head_sha,
        "files": taken,
        "left_out": [p for p in changed if p not in taken],
    }
    header = (
        f"Patch of {repo.name}: git diff {base}...{head} -- vllm/\nbase {base} = {base_sha}\n"
        f"merge-base {merge_base}\nhead {head} = {head_sha}\n\n"
    )
    return header + body, info


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.trees.refpatch", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repo", type=Path, required=True, help="a vLLM checkout with the history of both refs")
    parser.add_argument("--base", required=True, help="the ref the branch is compared with (e.g. origin/main)")
    parser.add_argument("--head", required=True, help="the branch or commit under test")
    parser.add_argument("--out", type=Path, required=True, help="the patch file to write")
    args = parser.parse_args(argv)
    text, info = make_patch(args.repo, args.base, args.head)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(
        f"refpatch: {info['base']}...{info['head']} ({info['merge_base'][:12]}..{info['head_sha'][:12]}): "
        f"{len(info['files'])} file(s) under vllm/ in {args.out}"
    )
    for path in info["left_out"]:
        print(f"refpatch: left out (not under vllm/): {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
