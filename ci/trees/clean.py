"""What the gate keeps in ``.gate/``, with sizes, and removing what you name (``nox -s clean``).

``.gate/`` holds, per release, its unpacked wheel (``cache/vllm-X``); per session or build, the base and
candidate trees (``trees/NAME``); per branch pair of ``--vllm-src ... --head-ref``, the exported merge-base
(``refs/MERGEBASE-HEAD``); the stages' outputs (``out/SESSION``) and the releases' dependency lists
(``deps``). Each is listed with its size; ``clean NAME...`` removes those (``trees/tests``,
``cache/vllm-0.33.0``, ...) and ``clean --all`` all of them. Only what the gate made is removed: an entry
it does not recognise is listed as foreign and kept.

nox's environments of the sessions (``.nox/SESSION``, a virtual environment each: 2.8 GB after a day of
sessions) are listed too, as ``nox/SESSION``; ``clean nox/NAME`` removes one and ``clean --nox`` every one (an
entry is nox's when it holds a ``pyvenv.cfg``). ``--all`` leaves them: the next session would reinstall.

Usage: ``python -m ci.trees.clean [NAME ... | --all] [--nox] [--root .gate] [--nox-root .nox]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.core.cli import run_main
from ci.core.errors import UsageError

GATE_DIR = Path(".gate")
NOX_DIR = Path(".nox")
NOX = "nox"  # the kind of nox's session environments (in NOX_DIR, not in GATE_DIR)
# kind folder -> (what each entry is, the marker an entry the gate made holds; None: any entry is the gate's)
KINDS = {
    "cache": ("an unpacked vLLM release (its wheel's files)", ".unpacked"),
    "trees": ("base and candidate trees", ".gate-trees"),
    "refs": ("a branch pair's exported merge-base and its patch", None),
    "out": ("a session's outputs", None),
    "deps": ("a release's CPU-tier requirements", None),
}


@dataclass(frozen=True)
class Entry:
    name: str  # e.g. trees/tests
    path: Path
    what: str
    size: int
    ours: bool


def _size(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    total = 0
    for folder, _, files in os.walk(path):
        for f in files:
            p = Path(folder) / f
            total += p.lstat().st_size
    return total


def nox_entries(nox_root: Path = NOX_DIR) -> list[Entry]:
    """nox's session environments: a folder of ``nox_root`` holding a ``pyvenv.cfg`` is one."""
    if not nox_root.is_dir():
        return []
    return [
        Entry(
            name=f"{NOX}/{p.name}",
            path=p,
            what="a nox session's virtual environment",
            size=_size(p),
            ours=(p / "pyvenv.cfg").is_file(),
        )
        for p in sorted(nox_root.iterdir())
        if p.is_dir() and not p.is_symlink()
    ]


def entries(root: Path = GATE_DIR, nox_root: Path | None = None) -> list[Entry]:
    """What ``root`` holds (and, with ``nox_root``, nox's environments there), each with its size."""
    found = nox_entries(nox_root) if nox_root is not None else []
    for kind, (what, marker) in KINDS.items():
        folder = root / kind
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.name.startswith("."):  # a build in progress or one being replaced
                continue
            ours = marker is None or (path / marker).is_file() or (kind == "cache" and path.name == "wheels")
            label = "downloaded wheels" if kind == "cache" and path.name == "wheels" else what
            found.append(Entry(name=f"{kind}/{path.name}", path=path, what=label, size=_size(path), ours=ours))
    return found


def _mib(size: int) -> str:
    return f"{size / 2**20:,.0f} MiB" if size >= 2**20 else f"{size / 2**10:,.0f} KiB"


def listing(found: Sequence[Entry]) -> str:
    lines = [
        f"{e.name:<48} {_mib(e.size):>12}  {e.what}{'' if e.ours else ' (not made by the gate: kept)'}" for e in found
    ]
    lines.append(f"{'total':<48} {_mib(sum(e.size for e in found)):>12}")
    return "\n".join(lines)


def remove(
    names: Sequence[str], *, everything: bool, root: Path = GATE_DIR, nox: bool = False, nox_root: Path | None = None
) -> list[Entry]:
    """Remove the named entries (``nox/NAME`` too, with ``nox_root``), every entry of ``root`` the gate made
    (``everything``), and/or every nox environment of ``nox_root`` (``nox``)."""
    if nox and nox_root is None:
        raise UsageError("--nox needs the folder of nox's environments (--nox-root)")
    found = {e.name: e for e in entries(root, nox_root)}
    if everything or nox:
        chosen = [e for e in found.values() if e.ours and (nox if e.name.startswith(f"{NOX}/") else everything)]
        names = [n for n in names if found.get(n.rstrip("/")) not in chosen]
    else:
        chosen = []
    if names:
        unknown = [n for n in names if n.rstrip("/") not in found]
        if unknown:
            raise UsageError(f"{', '.join(unknown)}: not in {root} (run `nox -s clean` to list what is)")
        chosen += [found[n.rstrip("/")] for n in names]
        foreign = [e.name for e in chosen if not e.ours]
        if foreign:
            raise UsageError(f"{', '.join(foreign)}: not made by the gate (no marker), so not removed")
    for e in chosen:
        shutil.rmtree(e.path) if e.path.is_dir() and not e.path.is_symlink() else e.path.unlink()
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.trees.clean", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("names", nargs="*", help="entries to remove, as listed (e.g. trees/tests)")
    parser.add_argument("--all", action="store_true", help="remove every entry the gate made in --root")
    parser.add_argument("--nox", action="store_true", help="remove every nox session environment (--nox-root)")
    parser.add_argument("--root", type=Path, default=GATE_DIR)
    parser.add_argument("--nox-root", type=Path, default=NOX_DIR)
    args = parser.parse_args(argv)
    if args.all and args.names:
        raise UsageError("give names or --all, not both")
    if not (args.all or args.nox or args.names):
        found = entries(args.root, args.nox_root)
        print(listing(found) if found else f"{args.root}: nothing kept yet")
        print("remove some with: nox -s clean -- NAME ... (or -- --all for .gate, -- --nox for nox's environments)")
        return 0
    gone = remove(args.names, everything=args.all, root=args.root, nox=args.nox, nox_root=args.nox_root)
    print(f"clean: removed {len(gone)} entries, {_mib(sum(e.size for e in gone))}: {', '.join(e.name for e in gone)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
