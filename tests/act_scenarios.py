"""The GPU workflows run locally with act, offline: the trust paths end to end (nox -s act_gpu).

Three runs, each checked from act's log:

1. ``gpu-gate.yml`` dispatched for a pull request whose head is the SHA given (a GitHub API
   stand-in answers for it): the authorize job passes, the GPU job checks out exactly that commit,
   installs from the hash lock and stops at the suite with NO_GPU (exit 6) on a host without one.
2. The same dispatch with a SHA that is not the PR's head: the authorize job fails with UNTRUSTED
   and no job checks out any code of the pull request.
3. ``.github/examples/vllm-fork-gpu-gate.yml``, a caller of the reusable workflow (a vLLM fork's
   view): the reusable workflow's GPU job runs and stops at NO_GPU.
4. The same caller for a branch of the fork, with the SHA it points at: the job checks the branch
   still points there and checks out that commit (not the branch by name).
5. The same with a SHA the branch no longer points at: UNTRUSTED, and no code of the branch is
   checked out.
6. ``gpu-nightly.yml``, its CPU path: a finished kernel-bench run (committed, from an H100) is tonight's
   run and an empty folder the history so far; the job adds the run to the history, finds no change point
   (one run), writes the issue text and uploads the history; no vLLM checkout, no GPU, no issue.

Usage: ``python tests/act_scenarios.py ACT_ARGS...`` (nox -s act_gpu passes act's stand-in options).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / ".github" / "act-standins" / "github-api.py"
PR = 7
NO_GPU = "title=NO_GPU::GPU gate: NO_GPU (exit 6)"
BRANCH = "feature"
NIGHT_RUN = ROOT / "reports" / "nvidia-h100-x1" / "gpu-gate" / "marlin-quick" / "bench" / "kernel-results.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(act: list[str], workflow: str, inputs: dict, env: dict[str, str], log: Path) -> tuple[int, str]:
    event = log.with_suffix(".event.json")
    event.write_text(json.dumps({"repository": {"default_branch": "main"}, "inputs": inputs}))
    # no git remote: act then names the repository nektos/act, whatever the clone's origin is (a path in CI)
    cmd = [
        *act,
        "--remote-name",
        "gate-act-no-remote",
        "-W",
        workflow,
        "workflow_dispatch",
        "-e",
        str(event),
        "-s",
        "GITHUB_TOKEN=act-local",
        *[x for k, v in env.items() for x in ("--env", f"{k}={v}")],
    ]
    with open(log, "w") as fh:
        code = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    return code, re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())


def main(act: list[str]) -> int:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    sha = head.stdout.strip()
    port = _free_port()
    stub = subprocess.Popen(
        [sys.executable, str(STUB), "--port", str(port), "--pr", str(PR), "--sha", sha, "--ref", f"{BRANCH}={sha}"]
    )
    time.sleep(0.5)
    env = {"GITHUB_API_URL": f"http://127.0.0.1:{port}", "GATE_ACT_SOURCE": str(ROOT)}
    logs = Path(tempfile.mkdtemp(prefix="act-gpu-"))
    failures = []

    def expect(name: str, ok: bool, why: str) -> None:
        print(f"act_gpu: {'ok  ' if ok else 'FAIL'} {name}: {why}", flush=True)
        if not ok:
            failures.append(name)

    try:
        dispatch = {
            "pr": str(PR),
            "sha": sha,
            "vllm": "0.25.1",
            "patch": "ci/changes/marlin-ep-m-estimate/change.patch",
            "suite": "quick",
            "tpot": False,
            "gpus": "2",
        }
        code, text = _run(act, ".github/workflows/gpu-gate.yml", dispatch, env, logs / "1-reviewed.log")
        reviewed = (
            f"head is {sha}, the reviewed commit" in text
            and f"checkout stand-in: gate at {sha}" in text
            and "Successfully installed" in text
            and NO_GPU in text
        )
        expect(
            "reviewed SHA",
            code != 0 and reviewed,
            "authorize passed; the GPU job checked out that commit, installed from hashes, stopped at NO_GPU",
        )
        moved = {**dispatch, "sha": "0" * 40}
        code, text = _run(act, ".github/workflows/gpu-gate.yml", moved, env, logs / "2-moved.log")
        expect(
            "moved head",
            code != 0
            and f"its head is {sha}, not the reviewed {'0' * 40}" in text
            and "checkout stand-in: gate at" not in text
            and "GPU equivalence suite" not in text,
            "authorize failed with UNTRUSTED; no job checked out code of the pull request",
        )
        caller = {"head": "", "base": "origin/main", "vllm": "0.25.1"}
        code, text = _run(act, ".github/examples/vllm-fork-gpu-gate.yml", caller, env, logs / "3-caller.log")
        ran = "checkout stand-in: gate at" in text and NO_GPU in text
        expect("fork caller", code != 0 and ran, "the reusable workflow ran through the caller and stopped at NO_GPU")
        branch = {**caller, "head": BRANCH, "sha": sha}
        code, text = _run(act, ".github/examples/vllm-fork-gpu-gate.yml", branch, env, logs / "4-branch.log")
        pinned = (
            f"trust: nektos/act {BRANCH} is {sha}, the reviewed commit" in text
            and f"checkout stand-in: vllm-src at {sha}" in text
        )
        expect("fork branch", pinned, "the branch pointed at the reviewed SHA; that commit was checked out")
        moved = {**branch, "sha": "0" * 40}
        code, text = _run(act, ".github/examples/vllm-fork-gpu-gate.yml", moved, env, logs / "5-branch-moved.log")
        expect(
            "fork branch moved",
            code != 0
            and f"points at {sha}, not the reviewed {'0' * 40}" in text
            and "checkout stand-in: vllm-src" not in text,
            "the job stopped with UNTRUSTED before any code of the branch was checked out",
        )
        empty = Path(tempfile.mkdtemp(prefix="act-nightly-history-"))
        night = {**env, "GATE_NIGHTLY_RESULTS": str(NIGHT_RUN), "GATE_NIGHTLY_HISTORY": str(empty)}
        code, text = _run(act, ".github/workflows/gpu-nightly.yml", {}, night, logs / "6-nightly.log")
        expect(
            "nightly CPU path",
            code == 0
            and f"nightly: added {NIGHT_RUN}" in text
            and "No new candidate change point" in text
            and "artifact gate-history would hold:" in text
            and "act: the issue this run would open" not in text,
            "the run went into the history, no change point was found, the history was uploaded, no issue",
        )
    finally:
        stub.terminate()
    print(f"act_gpu: logs in {logs}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["act"]))
