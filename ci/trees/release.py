"""Where the vLLM under test comes from, and the base tree made of it.

A release from the package index (its wheel downloaded once into the cache, unpacked, the wheel removed), or
``installed`` (the vLLM importable in this interpreter: offline GPU hosts). A tree holds a copy of vLLM's
Python files and links to everything else (the compiled kernels are reused from the release), so it costs
seconds and little disk; ``--vllm-src PATH`` overlays the Python files of a local checkout on it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.core.errors import DataError, MissingDependencyError, UsageError
from ci.core.jsonio import sha256_file

DEFAULT_VLLM = "0.25.1"
VERSION_RE = re.compile(r"^\d+\.\d+\.\d+([.+\-\w]*)$")
_VERSION_FILE_RE = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""")


@dataclass(frozen=True, kw_only=True)
class Release:
    """A vLLM release on disk: ``root/vllm`` is its package."""

    version: str
    root: Path
    source: str


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
    if VERSION_RE.match(spec):
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


def materialize(tree: Path, rel_paths: Sequence[str]) -> None:
    """Replace links by copies for the files a patch touches, so patching never writes into the release."""
    for rel in rel_paths:
        p = tree / rel
        if p.is_symlink():
            target = p.resolve()
            p.unlink()
            shutil.copy2(target, p)
