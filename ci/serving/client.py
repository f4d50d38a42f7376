"""The client side of a TPOT run: one round is one ``vllm bench serve`` run, and its result file.

By default one client process (``ci/serving/bench_client.py``: vLLM's own ``vllm.benchmarks.serve``,
imported once, from the base tree) runs every round, so a round costs its measurement and not a vLLM import;
the same instrument measures both builds. ``--bench-client cli`` runs the ``vllm bench serve`` command from
the measured build's tree instead, one process per round.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ci.core.errors import DataError, MissingDependencyError, ServerError
from ci.serving.config import server_env
from ci.serving.server import log_tail

CLIENTS = {
    "inprocess": "one ci/serving/bench_client.py process (vllm.benchmarks.serve of the base tree) for every round",
    "cli": "one vllm bench serve command per round, from the measured build's tree",
}
CLIENT_SCRIPT = Path(__file__).resolve().parent / "bench_client.py"
CLIENT_IMPORT_TIMEOUT_S = 600.0
ROUND_TIMEOUT_S = 3600.0  # one vllm bench serve run; the nightly profile takes a few minutes


@dataclass(frozen=True, kw_only=True)
class RoundResult:
    build: str
    median_tpot_ms: float
    mean_tpot_ms: float
    median_ttft_ms: float
    output_throughput: float
    completed: int
    failed: int
    machine: dict | None = None  # GPU clock, power, temperature and host load during the round (medians)
    launch: int = 0  # the launch pair the round was measured in
    server_itl_ms: float | None = None  # the server's own mean inter-token latency over the round (/metrics)


class BenchClient:
    """``ci/serving/bench_client.py`` in its own process: vLLM's bench client imported once, one round per request.

    Rounds are sent as the argument lists of ``vllm bench serve``; a failed round, a client that
    dies or hangs, is an error naming the client's log."""

    def __init__(self, tree: Path, log: Path) -> None:
        self.tree, self.log = tree, log
        self.proc: subprocess.Popen | None = None
        self.import_s: float | None = None

    def start(self) -> BenchClient:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, str(CLIENT_SCRIPT), "--log", str(self.log)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=server_env(self.tree),
            start_new_session=True,
        )
        return self

    def _reply(self, what: str, timeout_s: float) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            if ready:  # end of output: the client is gone; reap it to name its exit code
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
            state = f"exited with code {self.proc.poll()}" if ready else f"gave no answer in {timeout_s:.0f} s"
            raise ServerError(f"the bench client ({what}) {state}; last lines of {self.log}:\n{log_tail(self.log)}")
        return json.loads(line)

    def wait_ready(self) -> float:
        if self.import_s is None:
            answer = self._reply("importing vllm.benchmarks.serve", CLIENT_IMPORT_TIMEOUT_S)
            if not answer.get("ready"):
                raise MissingDependencyError(
                    f"{answer.get('error')} (tree {self.tree}); this vLLM may predate vllm.benchmarks.serve: "
                    f"use --bench-client cli; details in {self.log}"
                )
            self.import_s = float(answer["import_s"])
        return self.import_s

    def run(self, args: list[str], tag: str) -> None:
        self.wait_ready()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"argv": args, "tag": tag}) + "\n")
        self.proc.stdin.flush()
        answer = self._reply(tag, ROUND_TIMEOUT_S)
        if not answer.get("ok"):
            raise ServerError(f"vllm bench serve ({tag}) failed: {answer.get('error')}; see {self.log}")

    def close(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # the client's loop ends at end of input
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        self.proc.stdout.close()
        self.proc = None


def parse_bench_result(path: Path, build: str) -> RoundResult:
    """Read a ``vllm bench serve --save-result`` file; refuse one without the numbers we gate on."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot read the vllm bench serve result ({exc})") from exc
    keys = ("median_tpot_ms", "mean_tpot_ms", "median_ttft_ms", "output_throughput", "completed")
    missing = [k for k in keys if not isinstance(data.get(k), (int, float))]
    if missing:
        raise DataError(f"{path}: vllm bench serve result lacks {missing}; is this a --save-result file?")
    failed = int(data.get("failed", 0) or 0)
    if data["completed"] == 0 or failed:
        raise ServerError(f"{path}: {failed} requests failed, {data['completed']} completed; see the server log")
    return RoundResult(
        build=build, **{k: float(data[k]) for k in keys[:-1]}, completed=int(data["completed"]), failed=failed
    )
