"""Where a result came from: GPU, driver, torch, vLLM trees, this project's commit, command, time."""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from ci.host import gpu
from ci.trees.build import command_line
from ci.trees.manifest import Trees

ROOT = Path(__file__).resolve().parents[2]


def project_commit() -> str:
    """This project's git sha (with ``-dirty`` when the tree has changes), or ``unknown``."""
    git = shutil.which("git")
    if git is None:
        return "unknown"

    def run(*args: str) -> str:
        done = subprocess.run([git, *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    sha = run("rev-parse", "HEAD")
    if not sha:
        return "unknown"
    return sha + ("-dirty" if run("status", "--porcelain", "--untracked-files=no") else "")


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


GATE_NAME = "EP-Marlin gate"  # what the reports call the gate (the core reads it from here, as recorded)


def side_identity(results, side: str) -> dict[str, str]:
    """What build ``side`` of a run is, as its provenance records it (``collect``): the vLLM release and, for the
    candidate, the change (the patch's sha256; an A/A run's candidate is the base build, with its injected
    slowdown). Every subject that runs vLLM's trees registers it as its ``identity``."""
    vllm = results.provenance.get("vllm")
    vllm = vllm if isinstance(vllm, dict) else {}
    found = {"vLLM": str(vllm["version"])} if "version" in vllm else {}
    commit = side_commit(vllm, side)
    if commit:
        found["commit"] = commit
    if side == "candidate" and "patch_sha256" in vllm:
        if results.settings.get("aa"):
            inject = results.settings.get("inject_slowdown") or results.settings.get("inject_sleep_us")
            found["change"] = "none: the base build (A/A run" + (f", slowed by {inject}" if inject else "") + ")"
        else:
            found["change"] = f"{vllm.get('patch', 'a patch')} (sha256 {str(vllm['patch_sha256'])[:12]})"
    return found


def published_side(results) -> str:
    """The side of a run that is vLLM as published: the candidate when the change was reverse-applied (the
    release holds it, so the base is the release without it), else the base."""
    vllm = results.provenance.get("vllm")
    return "candidate" if isinstance(vllm, dict) and vllm.get("reverse") is True else "base"


def side_commit(vllm: dict, side: str) -> str:
    """The vLLM commit a side's Python files came from, as ``sha12 subject``: in branch mode the merge-base (base)
    or the head (candidate); with a ``--vllm-src`` checkout its commit (the candidate adds the change to it)."""
    refs, overlay = vllm.get("refs"), vllm.get("overlay")
    if isinstance(refs, dict):
        sha = refs.get("merge_base" if side == "base" else "head_sha")
        return str(sha)[:12] if sha else ""
    if isinstance(overlay, dict) and overlay.get("commit"):
        dirty = " + uncommitted changes" if overlay.get("status") != "clean" else ""
        return f"{str(overlay['commit'])[:12]} {overlay.get('subject', '')}".rstrip() + dirty
    return ""


def change_line(trees: Trees) -> str:
    """One line for reports: the change under test, on which vLLM, and its contract (or none)."""
    from ci.trees.contracts import NO_CONTRACT

    m = trees.manifest
    reverse = " (reverse-applied: the release holds it)" if m.reverse else ""
    contract = m.contract["describe"] if m.contract else NO_CONTRACT
    return f"Change under test: `{m.patch_path}` on vLLM {m.vllm_version}{reverse}; {contract}."


def collect(trees: Trees | None = None, *, with_cuda: bool = False) -> dict:
    """A provenance record; ``with_cuda`` adds what torch reports (imports torch)."""
    record = {
        "gate": GATE_NAME,
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
        "project_commit": project_commit(),
        "python": platform.python_version(),
        "host": platform.node(),
        "torch": _dist_version("torch"),
        "gpu": gpu.fingerprint(),
    }
    if with_cuda:
        import torch

        record["torch"] = torch.__version__
        record["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            record["device"] = {
                "name": props.name,
                "sm_count": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.total_memory / 2**30, 1),
            }
    if trees is not None:
        m = trees.manifest
        record["change"] = change_line(trees)
        record["vllm"] = {
            "version": m.vllm_version,
            "source": m.vllm_source,
            "patch": m.patch_path,
            "patch_sha256": m.patch_sha256,
            "reverse": m.reverse,
            "refs": m.refs,
            "overlay": m.overlay,
            "changed_files": [c.__dict__ for c in m.changed_files],
            "contract": m.contract,  # None: no rule of the change was checked (ci.trees.contracts.NO_CONTRACT)
            "manifest_created_at": m.created_at,
        }
    return record
