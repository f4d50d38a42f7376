"""Is vLLM past the gate? The newest release on the package index, against the releases the gate follows, and
what differs in the entry points the gate calls: their parameters, read from both releases' code (``ast``).

``nox -s releases`` runs it (``python -m ci.trees.newest --followed 0.25.1 0.26.0 0.33.0``): exit 0 when the
newest release is one the gate follows; exit 14 (``RELEASE_AHEAD``) when it is newer, with the release and, per
entry point, the parameters it added and removed, so a contributor sees at once what the gate must learn. The
index is asked through pip (``pip index versions vllm``), so it honours pip's configuration (``PIP_INDEX_URL``,
``pip.conf``); the newer release's wheel is downloaded once into the gate's cache (as ``--vllm X.Y.Z`` does).
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.core.cli import run_main
from ci.core.errors import MissingDependencyError, ReleaseAheadError
from ci.trees.release import fetch_release

# the functions the gate's harnesses call, and the files they are in (relative to the release's root)
ENTRY_POINTS = {
    "fused_marlin_moe": "vllm/model_executor/layers/fused_moe/experts/marlin_moe.py",
    "batched_fused_marlin_moe": "vllm/model_executor/layers/fused_moe/experts/marlin_moe.py",
    "fused_experts": "vllm/model_executor/layers/fused_moe/fused_moe.py",
}
_LISTED = re.compile(r"^vllm \(([^)]+)\)\s*$", re.M)  # pip index versions: "vllm (0.34.0)" on its first line


def _key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.+\-]", version))


def newest_on_index(python: str = sys.executable, index_args: Sequence[str] = ()) -> str:
    """The newest final release of vLLM the package index lists (pip's own answer)."""
    cmd = [python, "-m", "pip", "index", "versions", "vllm", "--disable-pip-version-check", *index_args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    found = _LISTED.search(done.stdout)
    if done.returncode != 0 or not found:
        raise MissingDependencyError(
            f"the package index did not list vLLM's releases (`{' '.join(cmd[1:])}` exited {done.returncode}: "
            f"{(done.stderr.strip() or done.stdout.strip())[-300:]}); check the network or pip's index settings "
            "(PIP_INDEX_URL), or run where PyPI is reachable"
        )
    return found[1]


@dataclass(frozen=True)
class Signature:
    """An entry point's parameters in one release (None: the release has no such function)."""

    name: str
    parameters: tuple[str, ...] | None


def signatures(root: Path) -> dict[str, Signature]:
    """The parameters of each of :data:`ENTRY_POINTS` in the release at ``root``, read from its source."""
    found = {}
    for name, rel in ENTRY_POINTS.items():
        params = None
        path = root / rel
        if path.is_file():
            for node in ast.walk(ast.parse(path.read_bytes())):
                if isinstance(node, ast.FunctionDef) and node.name == name:
                    a = node.args
                    params = tuple(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs))
                    break
        found[name] = Signature(name, params)
    return found


def differences(old: dict[str, Signature], new: dict[str, Signature]) -> list[str]:
    """Per entry point: gone, new, or the parameters added and removed (in the newer release's order)."""
    lines = []
    for name in ENTRY_POINTS:
        before, after = old[name].parameters, new[name].parameters
        if before == after:
            continue
        if after is None:
            lines.append(f"{name} is gone")
        elif before is None:
            lines.append(f"{name} is new")
        else:
            added = [p for p in after if p not in before]
            removed = [p for p in before if p not in after]
            parts = [f"adds {', '.join(added)}"] if added else []
            parts += [f"removes {', '.join(removed)}"] if removed else []
            lines.append(f"{name} " + (" and ".join(parts) or "takes its parameters in another order"))
    return lines


def check(newest: str, followed: Sequence[str], cache: Path) -> str:
    """The line that says the gate follows the newest release, or a :class:`ReleaseAheadError` naming it and
    what its entry points changed against the newest release followed."""
    if newest in followed or _key(newest) <= max(_key(v) for v in followed):
        return f"releases: the newest vLLM on the package index is {newest}; the gate follows {', '.join(followed)}"
    last = max(followed, key=_key)
    changed = differences(signatures(fetch_release(last, cache).root), signatures(fetch_release(newest, cache).root))
    what = "; ".join(changed) if changed else "the entry points the gate calls take the same parameters"
    raise ReleaseAheadError(
        f"vLLM {newest} is on the package index and the gate follows only {', '.join(followed)}. Against {last}: "
        f"{what}. Try it with nox -s tests_release -- --release {newest}; once the gate supports it, add it to "
        "FOLLOWED_RELEASES in noxfile.py and to docs/releases.md"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.trees.newest", description=__doc__, allow_abbrev=False)
    parser.add_argument("--followed", nargs="+", required=True, help="the releases the gate follows")
    parser.add_argument("--newest", help="take this as the newest release instead of asking the index")
    parser.add_argument("--cache", type=Path, default=Path(".gate") / "cache", help="where releases are unpacked")
    args = parser.parse_args(argv)
    print(check(args.newest or newest_on_index(), args.followed, args.cache), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
