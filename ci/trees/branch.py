"""The branch mode (``--vllm-src PATH --head-ref REF [--base-ref REF]``): ``vllm/`` of a checkout at a commit,
exported as git stores it, and the ref a branch most likely starts from."""

from __future__ import annotations

import shutil
from pathlib import Path

from ci.core.errors import PatchError, UsageError
from ci.trees import patching
from ci.trees.release import VERSION_RE

DEFAULT_BASE_REF = "origin/main"
REFS_MARKER = ".gate-refs"  # in every folder the builder exported a ref into


def export_vllm(repo: Path, commit: str, dest: Path) -> None:
    """``vllm/`` of ``repo`` at ``commit`` into ``dest``, a folder only the builder writes: the blobs as git
    stores them (no ``.gitattributes`` export-ignore, export-subst or filters), files only."""
    from ci.trees import refpatch

    listing = refpatch.git_bytes(repo, "ls-tree", "-r", "-z", "--full-tree", commit, "--", patching.PATCHED_PREFIX)
    entries = []
    for entry in filter(None, listing.split(b"\0")):
        meta, _, raw_path = entry.partition(b"\t")
        mode, kind, sha = meta.decode().split()
        path = raw_path.decode("utf-8", errors="replace")
        if kind != "blob" or mode not in ("100644", "100755"):
            raise PatchError(
                f"{path} at {commit[:12]} of {repo} is not a file (mode {mode}: a link or a submodule): "
                "the gate tests files only; replace it by the file it names"
            )
        entries.append((raw_path.decode("utf-8", errors="surrogateescape"), sha, mode))
    if dest.exists():
        if not (dest / REFS_MARKER).is_file():
            raise UsageError(f"{dest}: exists and was not made by the builder (no {REFS_MARKER}); move it away")
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    (dest / REFS_MARKER).write_text(f"vllm/ of {repo} at {commit}, exported by python -m ci.trees.build\n")
    # the blobs as stored: no .gitattributes (export-ignore, export-subst, filters) changes what is tested
    wanted = b"".join(f"{sha}\n".encode() for _, sha, _ in entries)
    blobs = refpatch.git_bytes(repo, "cat-file", "--batch", stdin=wanted)
    at = 0
    for rel, _, mode in entries:
        target = dest / rel
        header_end = blobs.index(b"\n", at)
        size = int(blobs[at:header_end].split()[2])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blobs[header_end + 1 : header_end + 1 + size])
        target.chmod(0o755 if mode == "100755" else 0o644)
        at = header_end + 1 + size + 1


def base_ref_candidates(vllm: str) -> list[str]:
    """Where a branch most likely starts, in order: the release's tag (the overlay runs on that release's
    kernels), vLLM's main as a plain clone names it, and as a fork clone usually does."""
    return [*([f"v{vllm}"] if VERSION_RE.match(vllm) else []), DEFAULT_BASE_REF, "upstream/main"]


def default_base_ref(repo: Path, vllm: str) -> str:
    """The first of :func:`base_ref_candidates` that ``repo`` has, or a usage error naming them all."""
    from ci.trees import refpatch

    candidates = base_ref_candidates(vllm)
    for ref in candidates:
        if refpatch.has_commit(repo, ref):
            print(f"build: --base-ref not given: {ref}", flush=True)
            return ref
    raise UsageError(
        f"--vllm-src {repo}: none of {', '.join(candidates)} is a commit there, so the branch's base is "
        "unknown; pass --base-ref REF (the commit your branch started from, e.g. a vLLM release tag)"
    )
