"""The vLLM under test, as two trees (base and candidate) and a manifest: the build stage and its CLI.

Where vLLM comes from is ``ci.trees.release`` (``--vllm``: a release, default 0.25.1, or ``installed``;
``--vllm-src PATH`` overlays a checkout's Python files); the branch mode (``--head-ref``, ``--base-ref``:
the base is the release overlaid with ``vllm/`` at the merge-base of the two refs, the candidate adds ``git
diff base...head -- vllm/``, the patch recorded in the manifest) is ``ci.trees.branch`` and
``ci.trees.refpatch``; the manifest is ``ci.trees.manifest``. The candidate is the base with the patch
applied strictly (``git apply``: all hunks or nothing); ``--reverse`` instead builds the base by removing
the patch from a release that already contains it (e.g. 0.26.0), so the same A/B works on newer releases.
The source options are defined once here (``add_source_arguments``) for every stage and nox session.

Usage::

    python -m ci.trees.build [--vllm 0.25.1|installed] [--vllm-src PATH [--base-ref REF] [--head-ref REF]]
                       [--patch FILE | --change NAME] [--reverse]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from ci.core.cli import run_main
from ci.core.errors import PatchError, UsageError
from ci.core.jsonio import sha256_file, write_json
from ci.trees import patching, treediff
from ci.trees.branch import default_base_ref, export_vllm
from ci.trees.manifest import TreeManifest, Trees, load_trees
from ci.trees.release import DEFAULT_VLLM, Release, make_base_tree, materialize, overlay_checkout, resolve_release
from ci.trees.treediff import FileChange

CHANGES_DIR = Path(__file__).resolve().parents[1] / "changes"  # <name>/change.patch and, optionally, contract.py
DEFAULT_CHANGE = "marlin-ep-m-estimate"
DEFAULT_PATCH = CHANGES_DIR / DEFAULT_CHANGE / "change.patch"
GATE_DIR = Path(".gate")
CHANGE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # a folder of ci/changes/, never a path
TREES_MARKER = ".gate-trees"  # in every --out folder the builder made: the only kind it will ever replace


def _tool_versions() -> dict[str, str]:
    tools = {"python": platform.python_version()}
    for dist in ("torch", "pip"):
        try:
            tools[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            tools[dist] = "absent"
    git = shutil.which("git")
    if git:
        out = subprocess.run([git, "--version"], capture_output=True, text=True, check=False).stdout
        tools["git"] = out.strip().removeprefix("git version ")
    return tools


def command_line() -> str:
    """This process's command line, as a user would type it (for provenance)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    head = f"python -m {spec.name.removesuffix('.__main__')}" if spec is not None else Path(sys.argv[0]).name
    return " ".join([head, *sys.argv[1:]])


def _display_path(path: Path) -> str:
    """``path`` relative to the working directory when inside it (no machine paths in results)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def tree_slug(version: str, patch: Path, *, reverse: bool, src: bool) -> str:
    name = patch.parent.name if patch.name == "change.patch" else patch.stem  # ci/changes/<name>/change.patch
    parts = [f"vllm-{version}", "src" if src else "", name, "reverse" if reverse else ""]
    return "-".join(p for p in parts if p)


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    vllm: str = DEFAULT_VLLM
    vllm_src: Path | None = None
    patch: Path = DEFAULT_PATCH
    reverse: bool = False
    out: Path | None = None
    cache: Path = GATE_DIR / "cache"
    base_ref: str | None = None
    head_ref: str | None = None
    refs: dict | None = None  # filled in by the builder from base_ref/head_ref
    contract: str = "auto"  # "auto": contract.py beside the patch, if any; "none"; or a contract file


def resolve_refs(opts: BuildOptions) -> BuildOptions:
    """``--base-ref``/``--head-ref``: the branch's diff becomes the patch, its merge-base the overlay."""
    if opts.base_ref is None and opts.head_ref is None:
        return opts
    if opts.vllm_src is None:
        raise UsageError("--base-ref/--head-ref name commits of a vLLM checkout: give it with --vllm-src PATH")
    if opts.patch != DEFAULT_PATCH or opts.reverse:
        raise UsageError("--head-ref makes the patch from the branch: leave out --patch and --reverse")
    from ci.trees import refpatch

    base, head = opts.base_ref or default_base_ref(opts.vllm_src, opts.vllm), opts.head_ref or "HEAD"
    text, info = refpatch.make_patch(opts.vllm_src, base, head)
    where = GATE_DIR / "refs" / f"{info['merge_base'][:12]}-{info['head_sha'][:12]}"
    export_vllm(opts.vllm_src, info["merge_base"], where / "base-src")
    patch = where / "change.patch"
    patch.write_text(text)
    print(
        f"build: {base}...{head}: base = vllm/ at merge-base {info['merge_base'][:12]}, candidate = base + "
        f"{len(info['files'])} changed file(s) of {head} ({info['head_sha'][:12]}); patch: {patch}"
    )
    return replace(opts, patch=patch, vllm_src=where / "base-src", refs={**info, "repo": str(opts.vllm_src)})


RELEASE_PATCHES = "releases"  # ci/changes/<name>/releases/vllm-<version>.patch: the change on that release's code


def patch_for_release(patch: Path, version: str) -> Path:
    """The patch to apply to vLLM ``version``: a change's ``releases/vllm-<version>.patch`` when it has one
    (the change as that release holds it, or rebased onto it: the release's code around the change moved),
    else ``patch``. The change's contract stays the one beside its change.patch."""
    rebased = patch.parent / RELEASE_PATCHES / f"vllm-{version}.patch"
    if patch.name != "change.patch" or not rebased.is_file():
        return patch
    print(
        f"build: vLLM {version} has its own version of {_display_path(patch)}: {_display_path(rebased)} is "
        "applied instead (its preamble says why)",
        flush=True,
    )
    return rebased


def _check_out_dir(out: Path) -> None:
    """``out`` may be replaced only if it is missing, empty, or trees this builder made (its marker)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"--out {out}: exists and is not a folder; pick a new folder (nothing was changed)")
    if out.is_dir() and any(out.iterdir()) and not (out / TREES_MARKER).is_file():
        raise UsageError(
            f"--out {out}: the folder holds files the gate did not make (no {TREES_MARKER} in it); the builder "
            "replaces its --out folder, so pick a new or empty one (nothing was changed or deleted)"
        )


def build_trees(opts: BuildOptions, *, release: Release | None = None) -> Trees:
    """Build base and candidate trees and write their manifest; return where they are.

    Every check comes first (patch, --vllm-src, --out); the trees are built in a fresh folder
    beside ``out`` and moved into place only when the patch applied and changed something, so
    a failed build leaves the previous trees, and anything else, as they were."""
    opts = resolve_refs(opts)
    if not opts.patch.is_file():
        raise UsageError(f"--patch {opts.patch}: no such file (the shipped one is {DEFAULT_PATCH})")
    if opts.vllm_src is not None and not (opts.vllm_src / "vllm").is_dir():
        raise UsageError(f"--vllm-src {opts.vllm_src}: no vllm/ package in it; point it at a vLLM source checkout")
    contract = resolve_contract(opts)
    patching.check_touched_paths(opts.patch)
    release = release or resolve_release(opts.vllm, opts.cache)
    slug = tree_slug(release.version, opts.patch, reverse=opts.reverse, src=opts.vllm_src is not None)
    opts = replace(opts, patch=patch_for_release(opts.patch, release.version))
    taken, ignored = patching.check_touched_paths(opts.patch)
    out = (opts.out or GATE_DIR / "trees" / slug).absolute()
    _check_out_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        _build_into(work, opts, release, taken, ignored, contract)
        (work / TREES_MARKER).write_text("trees made by python -m ci.trees.build; replaced by the next build\n")
        _check_out_dir(out)  # again: nothing may have appeared there meanwhile
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            work.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return load_trees(out / "manifest.json")


def _overlay_label(opts: BuildOptions) -> str:
    if opts.refs:
        return f" + Python overlay of {opts.refs['repo']} at {opts.refs['merge_base'][:12]} (merge-base)"
    return f" + Python overlay of {opts.vllm_src}" if opts.vllm_src else ""


def resolve_contract(opts: BuildOptions) -> dict | None:
    """The change's contract (``ci.trees.contracts``): beside the patch, given, or none; checked before building."""
    from ci.trees import contracts

    if opts.contract == "none":
        return None
    path = contracts.beside(opts.patch) if opts.contract == "auto" else Path(opts.contract)
    return None if path is None else contracts.load_contract(path).to_json()


def _build_into(
    out: Path, opts: BuildOptions, release: Release, taken: list[str], ignored: list[str], contract: dict | None = None
) -> Trees:
    release_tree, patched_tree = out / "release", out / "patched"
    make_base_tree(release, release_tree)
    overlaid = overlay_checkout(opts.vllm_src, release_tree) if opts.vllm_src else []
    shutil.copytree(release_tree, patched_tree, symlinks=True)
    materialize(patched_tree, taken)
    where = f"vLLM {release.version} ({release.source})"
    reverse = patching.apply_patch(
        opts.patch, patched_tree, reverse=opts.reverse, include=["vllm/*"], where=where, auto_reverse=True
    )
    # Forward: base = release, candidate = patched. Reverse: the release holds the patch already.
    base, candidate = (patched_tree, release_tree) if reverse else (release_tree, patched_tree)
    base = base.rename(out / "base")
    candidate = candidate.rename(out / "candidate")
    changes = tuple(treediff.differences(base, candidate))
    entry = check_changes(changes, opts.patch, candidate, (contract or {}).get("entry_module"), base=base)
    manifest = TreeManifest(
        vllm_version=release.version,
        vllm_source=release.source + _overlay_label(opts),
        patch_path=_display_path(opts.patch),
        patch_sha256=sha256_file(opts.patch),
        reverse=reverse,
        base="base",
        candidate="candidate",
        changed_files=changes,
        ignored_patch_paths=tuple(ignored),
        overlaid_files=tuple(overlaid),
        refs=opts.refs,
        overlay=None if opts.refs or not opts.vllm_src else overlay_of(opts.vllm_src),
        contract=None if contract is None else {**contract, "path": _display_path(Path(contract["path"]))},
        entry_module=entry,
        tools=_tool_versions(),
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=command_line(),
    )
    manifest_path = out / "manifest.json"
    write_json(manifest_path, manifest.to_json())
    return Trees(manifest_path=manifest_path, manifest=manifest, base=base, candidate=candidate)


def overlay_of(checkout: Path) -> dict | None:
    """The commit a ``--vllm-src`` checkout's overlay came from (``status``: ``clean`` or ``uncommitted changes``
    under vllm/), so that a run names the vLLM commit it timed; None when the folder is not a git checkout."""
    from ci.trees import refpatch

    if not (checkout / ".git").exists() or not refpatch.has_commit(checkout, "HEAD"):
        return None
    sha = refpatch.git_text(checkout, "rev-parse", "HEAD").strip()
    dirty = refpatch.git_text(checkout, "status", "--porcelain", "--", "vllm").strip()
    return {
        "repo": str(checkout),
        "commit": sha,
        "subject": refpatch.git_text(checkout, "log", "-1", "--format=%s", sha).strip(),
        "status": "uncommitted changes" if dirty else "clean",
    }


def check_changes(
    changes: Sequence[FileChange], patch: Path, candidate: Path, entry: str | None = None, *, base: Path | None = None
) -> str:
    """Refuse what the trees cannot test: a symbolic link the change puts into vLLM (it could name any file
    of the host), a change of no file's content, and a module the in-process tiers would never load from
    the candidate (``ci.trees.variants.choose_entry``: through the contract's ``ENTRY_MODULE``, or without
    one the subject entry that reaches every changed module; a refusal names each file and why). Returns the
    entry module."""
    links = [c.path for c in changes if c.what == treediff.LINK]
    if links:
        targets = ", ".join(f"{p} -> {os.readlink(candidate / p)}" for p in links)
        raise PatchError(
            f"{patch} puts symbolic links into vLLM ({targets}): the trees hold only files; "
            "commit the file itself. Nothing was changed."
        )
    if all(c.what == treediff.MODE for c in changes):
        what = ", ".join(c.path for c in changes) or "no file"
        raise PatchError(
            f"{patch} applied but changes the content of no file under vllm/ ({what}): the candidate would "
            "equal the base (a mode-only change?); nothing to test. Nothing was changed."
        )
    from ci.trees import variants

    return variants.choose_entry(changes, candidate, source=str(patch), declared=entry, base=base)


def add_source_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags that choose the vLLM under test, defined once: every stage that builds trees and the nox
    sessions (``ci.trees.sessionargs``) take them from here. Returns their actions."""
    return [
        parser.add_argument("--vllm", default=DEFAULT_VLLM, help="a release (default %(default)s) or 'installed'"),
        parser.add_argument("--vllm-src", type=Path, help="a vLLM checkout whose Python files overlay the release"),
        parser.add_argument("--patch", type=Path, help=f"the patch under test (default: --change {DEFAULT_CHANGE})"),
        parser.add_argument("--change", help="a change of ci/changes/ by name: its change.patch and contract.py"),
        parser.add_argument(
            "--contract",
            default="auto",
            help="the change's contract.py; 'none' to test without one (default: the one beside the patch)",
        ),
        parser.add_argument(
            "--reverse", action="store_true", help="the release contains the patch: remove it for base"
        ),
        parser.add_argument(
            "--base-ref",
            help="with --vllm-src: the ref a branch is compared with (default: the "
            "first of the release's tag vX.Y.Z, origin/main, upstream/main that the checkout has)",
        ),
        parser.add_argument("--head-ref", help="with --vllm-src: the branch or commit under test (HEAD)"),
    ]


def patch_of(change: str | None, patch: Path | None) -> Path:
    """``--change NAME`` or ``--patch FILE`` (not both); neither: the shipped change."""
    if change and patch:
        raise UsageError(f"--change {change} and --patch {patch}: give one (a change is its folder's change.patch)")
    if not change:
        return patch or DEFAULT_PATCH
    known = sorted(p.parent.name for p in CHANGES_DIR.glob("*/change.patch"))
    folder = CHANGES_DIR / change
    if not CHANGE_NAME.fullmatch(change) or folder.resolve().parent != CHANGES_DIR:
        raise UsageError(
            f"--change {change!r}: a change is named by its folder in ci/changes/ ({', '.join(known)}); "
            "for a patch file of your own use --patch FILE"
        )
    if not (folder / "change.patch").is_file():
        raise UsageError(f"--change {change}: no {folder}/change.patch; the changes are {', '.join(known)}")
    return folder / "change.patch"


def options_from(args: argparse.Namespace, **extra: object) -> BuildOptions:
    return BuildOptions(
        vllm=args.vllm,
        vllm_src=args.vllm_src,
        patch=patch_of(args.change, args.patch),
        contract=args.contract,
        reverse=args.reverse,
        base_ref=args.base_ref,
        head_ref=args.head_ref,
        **extra,  # type: ignore[arg-type]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.trees.build", description=__doc__.split("\n\n")[0]
    )
    add_source_arguments(parser)
    parser.add_argument("--out", type=Path, help="where to put the trees (default .gate/trees/<slug>)")
    parser.add_argument("--cache", type=Path, default=GATE_DIR / "cache", help="wheel cache (default %(default)s)")
    args = parser.parse_args(argv)
    trees = build_trees(options_from(args, out=args.out, cache=args.cache))
    m = trees.manifest
    print(f"build: vLLM {m.vllm_version} from {m.vllm_source}")
    for c in m.changed_files:
        print(f"build: {c.path}: {str(c.sha256_before)[:12]} -> {str(c.sha256_after)[:12]}")
    print(f"build: base      {trees.base}")
    print(f"build: candidate {trees.candidate}")
    print(f"build: manifest  {trees.manifest_path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
