"""The vLLM under test, as two trees (base and candidate) and a manifest.

Where vLLM comes from (``--vllm``): a release from the package index (the default,
0.25.1: its wheel is downloaded once into the cache and unpacked), or ``installed`` (the
vLLM importable in this interpreter: offline GPU hosts). ``--vllm-src PATH`` overlays the
Python files of a local vLLM checkout on that release; a change to CUDA sources needs a
full build and is out of scope for that mode. With ``--head-ref`` (and ``--base-ref``, default
``origin/main``) that checkout is a git repository and the change under test is its branch: the base
tree is the release overlaid with ``vllm/`` at the merge-base of the two refs, and the candidate adds
``git diff base...head -- vllm/`` (``ci.trees.refpatch``), which is the patch recorded in the manifest.

A tree holds a copy of vLLM's Python files and links to everything else (the compiled
kernels are reused from the release), so it costs seconds and little disk. The candidate
is the base with the patch applied strictly (``git apply``: all hunks or nothing);
``--reverse`` instead builds the base by removing the patch from a release that already
contains it (e.g. 0.26.0), so the same A/B works on newer releases.

Usage::

    python -m ci.trees.build [--vllm 0.25.1|installed] [--vllm-src PATH [--base-ref REF] [--head-ref REF]]
                       [--patch FILE] [--reverse]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from ci.core.cli import run_main
from ci.core.errors import DataError, MissingDependencyError, PatchError, UsageError
from ci.core.jsonio import read_json, sha256_file, write_json
from ci.trees import patching, treediff
from ci.trees.treediff import FileChange

DEFAULT_VLLM = "0.25.1"
CHANGES_DIR = Path(__file__).resolve().parents[1] / "changes"  # <name>/change.patch and, optionally, contract.py
DEFAULT_CHANGE = "marlin-ep-m-estimate"
DEFAULT_PATCH = CHANGES_DIR / DEFAULT_CHANGE / "change.patch"
GATE_DIR = Path(".gate")
DEFAULT_BASE_REF = "origin/main"
CHANGE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # a folder of ci/changes/, never a path
REFS_MARKER = ".gate-refs"  # in every folder the builder exported a ref into
TREES_MARKER = ".gate-trees"  # in every --out folder the builder made: the only kind it will ever replace
MANIFEST_KIND = "vllm-trees"
MANIFEST_VERSION = 2  # 2: changed_files is what differs between the trees (ci.trees.treediff), each with its kind
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+([.+\-\w]*)$")
_VERSION_FILE_RE = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""")


@dataclass(frozen=True, kw_only=True)
class Release:
    """A vLLM release on disk: ``root/vllm`` is its package."""

    version: str
    root: Path
    source: str


@dataclass(frozen=True, kw_only=True)
class TreeManifest:
    """What was built: read by the test, bench and TPOT stages (paths relative to the manifest)."""

    vllm_version: str
    vllm_source: str
    patch_path: str
    patch_sha256: str
    reverse: bool
    base: str
    candidate: str
    changed_files: tuple[FileChange, ...]  # what differs between the two trees (ci.trees.treediff)
    ignored_patch_paths: tuple[str, ...] = ()
    overlaid_files: tuple[str, ...] = ()
    refs: dict | None = None  # --head-ref: the refs, their commits and the files the branch changes
    contract: dict | None = None  # ci.trees.contracts.Contract.to_json(), or None: no rule of the change is checked
    tools: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    command: str = ""
    kind: str = MANIFEST_KIND
    schema_version: int = MANIFEST_VERSION

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Trees:
    """A manifest read back, with absolute paths to the two trees."""

    manifest_path: Path
    manifest: TreeManifest
    base: Path
    candidate: Path


def _version_from_tree(pkg: Path) -> str | None:
    version_file = pkg / "_version.py"
    if version_file.is_file() and (m := _VERSION_FILE_RE.search(version_file.read_text())):
        return m[1]
    return None


def locate_installed() -> Release:
    """The vLLM importable in this interpreter, found without importing it (no torch needed)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise MissingDependencyError(
            f"vLLM is not importable by {sys.executable}: with --vllm installed the gate tests the vLLM "
            f"already installed here. Install one (pip install vllm=={DEFAULT_VLLM}), put it on PYTHONPATH, "
            f"or pass --vllm {DEFAULT_VLLM} to fetch that release from the package index."
        )
    pkg = Path(spec.origin).resolve().parent
    version = _version_from_tree(pkg)
    if version is None:
        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    return Release(version=version, root=pkg.parent, source=f"installed:{pkg}")


def _pip_download(version: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest)]
    print(f"build: downloading vllm=={version} from the package index (cached in {dest})", flush=True)
    done = subprocess.run([*cmd, f"vllm=={version}"], capture_output=True, text=True, check=False)
    found = sorted(dest.glob(f"vllm-{version}-*.whl"))
    if done.returncode != 0 or not found:
        raise MissingDependencyError(
            f"could not download vllm=={version}: {done.stderr.strip()[-400:]}\n"
            "Check the version exists on the index, or on an offline host use --vllm installed."
        )
    return found[0]


def fetch_release(version: str, cache: Path) -> Release:
    """A release from the package index: its wheel, downloaded and unpacked once into ``cache``; the wheel
    is removed once unpacked (the trees use the unpacked files; both would double the disk)."""
    root = cache / f"vllm-{version}"
    marker = root / ".unpacked"
    if not marker.is_file():
        wheel = _pip_download(version, cache / "wheels")
        shutil.rmtree(root, ignore_errors=True)
        print(f"build: unpacking {wheel.name}", flush=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(root)
        for so in root.rglob("*.so"):  # zipfile drops the permission bits
            so.chmod(0o755)
        marker.write_text(f"{wheel.name} {sha256_file(wheel)}\n")
        wheel.unlink()
    name, _, sha = marker.read_text().strip().rpartition(" ")
    return Release(version=version, root=root, source=f"pypi:vllm=={version} ({name or 'wheel'}, sha256 {sha})")


def resolve_release(spec: str, cache: Path) -> Release:
    if spec == "installed":
        return locate_installed()
    if _VERSION_RE.match(spec):
        return fetch_release(spec, cache)
    raise UsageError(f"--vllm expects a release such as {DEFAULT_VLLM!r} or 'installed', got {spec!r}")


def _package_files(root: Path) -> list[Path]:
    """Files of the vllm package (and its dist-info), relative to ``root``."""
    pkg = root / "vllm"
    if not pkg.is_dir():
        raise DataError(f"{root}: no vllm/ package here")
    paths = [p for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for info in root.glob("vllm-*.dist-info"):
        paths.extend(p for p in info.rglob("*") if p.is_file())
    return sorted(p.relative_to(root) for p in paths)


def make_base_tree(release: Release, dest: Path) -> None:
    """Copy the Python files of ``release`` into ``dest``; link everything else (kernels, data)."""
    for rel in _package_files(release.root):
        src, dst = release.root / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel.suffix == ".py":
            shutil.copy2(src, dst)
        else:
            dst.symlink_to(src.resolve())


def overlay_checkout(checkout: Path, tree: Path) -> list[str]:
    """Copy the Python files of a vLLM checkout that differ from the tree's; return their paths."""
    pkg = checkout / "vllm"
    if not pkg.is_dir():
        raise UsageError(f"--vllm-src {checkout}: no vllm/ package in it; point it at a vLLM source checkout")
    print(
        "build: --vllm-src overlays Python files only; the release's compiled kernels are reused, "
        "so changes to csrc/ (CUDA/C++) are not tested in this mode: they need a full build.",
        flush=True,
    )
    changed = []
    for src in sorted(pkg.rglob("*.py")):
        rel = src.relative_to(checkout)
        dst = tree / rel
        if dst.is_file() and dst.read_bytes() == src.read_bytes():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.unlink(missing_ok=True)
        shutil.copy2(src, dst)
        changed.append(str(rel))
    return changed


def _materialize(tree: Path, rel_paths: Sequence[str]) -> None:
    """Replace links by copies for the files a patch touches, so patching never writes into the release."""
    for rel in rel_paths:
        p = tree / rel
        if p.is_symlink():
            target = p.resolve()
            p.unlink()
            shutil.copy2(target, p)


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
            raise PatchError(f"{path} at {commit[:12]} of {repo} is not a file (mode {mode}: a link or a submodule): "
                             "the gate tests files only; replace it by the file it names")  # fmt: skip
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
    return [*([f"v{vllm}"] if _VERSION_RE.match(vllm) else []), DEFAULT_BASE_REF, "upstream/main"]


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
    print(f"build: {base}...{head}: base = vllm/ at merge-base {info['merge_base'][:12]}, candidate = base + "
          f"{len(info['files'])} changed file(s) of {head} ({info['head_sha'][:12]}); patch: {patch}")  # fmt: skip
    return replace(opts, patch=patch, vllm_src=where / "base-src", refs={**info, "repo": str(opts.vllm_src)})


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
    taken, ignored = patching.check_touched_paths(opts.patch)
    release = release or resolve_release(opts.vllm, opts.cache)
    slug = tree_slug(release.version, opts.patch, reverse=opts.reverse, src=opts.vllm_src is not None)
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


def _build_into(out: Path, opts: BuildOptions, release: Release, taken: list[str], ignored: list[str],
                contract: dict | None = None) -> Trees:  # fmt: skip
    release_tree, patched_tree = out / "release", out / "patched"
    make_base_tree(release, release_tree)
    overlaid = overlay_checkout(opts.vllm_src, release_tree) if opts.vllm_src else []
    shutil.copytree(release_tree, patched_tree, symlinks=True)
    _materialize(patched_tree, taken)
    where = f"vLLM {release.version} ({release.source})"
    reverse = patching.apply_patch(opts.patch, patched_tree, reverse=opts.reverse, include=["vllm/*"], where=where,
                                   auto_reverse=True)  # fmt: skip
    # Forward: base = release, candidate = patched. Reverse: the release holds the patch already.
    base, candidate = (patched_tree, release_tree) if reverse else (release_tree, patched_tree)
    base = base.rename(out / "base")
    candidate = candidate.rename(out / "candidate")
    changes = tuple(treediff.differences(base, candidate))
    check_changes(changes, opts.patch, candidate)
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
        contract=None if contract is None else {**contract, "path": _display_path(Path(contract["path"]))},
        tools=_tool_versions(),
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=command_line(),
    )
    manifest_path = out / "manifest.json"
    write_json(manifest_path, manifest.to_json())
    return Trees(manifest_path=manifest_path, manifest=manifest, base=base, candidate=candidate)


def check_changes(changes: Sequence[FileChange], patch: Path, candidate: Path) -> None:
    """Refuse what the trees cannot test: a symbolic link the change puts into vLLM (it could name any file
    of the host), a change of no file's content, and a module the in-process tiers would never load from
    the candidate (``ci.trees.variants.candidate_modules``: named, with the reason)."""
    links = [c.path for c in changes if c.what == treediff.LINK]
    if links:
        targets = ", ".join(f"{p} -> {os.readlink(candidate / p)}" for p in links)
        raise PatchError(f"{patch} puts symbolic links into vLLM ({targets}): the trees hold only files; "
                         "commit the file itself. Nothing was changed.")  # fmt: skip
    if all(c.what == treediff.MODE for c in changes):
        what = ", ".join(c.path for c in changes) or "no file"
        raise PatchError(
            f"{patch} applied but changes the content of no file under vllm/ ({what}): the candidate would "
            "equal the base (a mode-only change?); nothing to test. Nothing was changed."
        )
    from ci.trees import variants

    variants.candidate_modules(changes, candidate, source=str(patch))


def load_trees(manifest_path: Path) -> Trees:
    """Read a manifest written by :func:`build_trees`; check the trees are still there."""
    payload = read_json(manifest_path, kind=MANIFEST_KIND, versions=(MANIFEST_VERSION,))
    payload = {k: v for k, v in payload.items() if k not in ("kind", "schema_version")}
    try:
        payload["changed_files"] = tuple(FileChange(**c) for c in payload["changed_files"])
        if not all(isinstance(c.path, str) for c in payload["changed_files"]):
            raise TypeError("a changed file's path is not a string")
        for key in ("ignored_patch_paths", "overlaid_files"):
            payload[key] = tuple(payload.get(key, ()))
        manifest = TreeManifest(**payload)
    except (KeyError, TypeError) as exc:
        raise DataError(f"{manifest_path}: malformed tree manifest ({exc}); rebuild with `nox -s build`") from exc
    root = manifest_path.resolve().parent
    trees = Trees(
        manifest_path=manifest_path, manifest=manifest, base=root / manifest.base, candidate=root / manifest.candidate
    )
    for tree in (trees.base, trees.candidate):
        if not (tree / "vllm" / "__init__.py").is_file():
            raise DataError(f"{manifest_path}: tree {tree} is missing or incomplete; rebuild with `nox -s build`")
    return trees


def add_source_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags that choose the vLLM under test, defined once: every stage that builds trees and the nox
    sessions (``ci.trees.sessionargs``) take them from here. Returns their actions."""
    return [
        parser.add_argument("--vllm", default=DEFAULT_VLLM, help="a release (default %(default)s) or 'installed'"),
        parser.add_argument("--vllm-src", type=Path, help="a vLLM checkout whose Python files overlay the release"),
        parser.add_argument("--patch", type=Path, help=f"the patch under test (default: --change {DEFAULT_CHANGE})"),
        parser.add_argument("--change", help="a change of ci/changes/ by name: its change.patch and contract.py"),
        parser.add_argument("--contract", default="auto",
                            help="the change's contract.py; 'none' to test without one (default: the one beside "
                            "the patch)"),
        parser.add_argument("--reverse", action="store_true",
                            help="the release contains the patch: remove it for base"),
        parser.add_argument("--base-ref", help="with --vllm-src: the ref a branch is compared with (default: the "
                            "first of the release's tag vX.Y.Z, origin/main, upstream/main that the checkout has)"),
        parser.add_argument("--head-ref", help="with --vllm-src: the branch or commit under test (HEAD)"),
    ]  # fmt: skip


def patch_of(change: str | None, patch: Path | None) -> Path:
    """``--change NAME`` or ``--patch FILE`` (not both); neither: the shipped change."""
    if change and patch:
        raise UsageError(f"--change {change} and --patch {patch}: give one (a change is its folder's change.patch)")
    if not change:
        return patch or DEFAULT_PATCH
    known = sorted(p.parent.name for p in CHANGES_DIR.glob("*/change.patch"))
    folder = CHANGES_DIR / change
    if not CHANGE_NAME.fullmatch(change) or folder.resolve().parent != CHANGES_DIR:
        raise UsageError(f"--change {change!r}: a change is named by its folder in ci/changes/ ({', '.join(known)}); "
                         "for a patch file of your own use --patch FILE")  # fmt: skip
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
    parser = argparse.ArgumentParser(prog="python -m ci.trees.build", description=__doc__.split("\n\n")[0])
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
