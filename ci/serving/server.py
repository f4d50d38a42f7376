"""The lifecycle of one ``vllm serve`` process: start, wait for /health, stop its whole group.

Errors are clear and carry the tail of the server's log: a port already in use, a server
that dies while starting, one that is not healthy in time. The server runs in its own
process group (vLLM starts engine and worker processes), so ``stop`` ends all of them, on
success, on failure and on Ctrl-C alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from ci.core.errors import ServerError

HEALTH_POLL_S = 1.0
STOP_GRACE_S = 20.0
LOG_TAIL_LINES = 40


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(start: int) -> int:
    """The first free port from ``start`` on."""
    for port in range(start, start + 200):
        if not port_in_use(port):
            return port
    raise ServerError(f"no free port in {start}..{start + 199}")


def _die_with_parent() -> None:
    """In the child before exec (Linux): get SIGTERM when the parent dies, even by SIGKILL, so a
    killed gate never leaves a server holding the GPU."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


ITL_METRICS = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")  # newer name first


def parse_metrics(text: str) -> dict[str, float]:
    """``{"itl_sum_s": ..., "itl_count": ...}`` of the first of ``ITL_METRICS`` the text has, summed over its
    label sets; {} when it has none."""
    for name in ITL_METRICS:
        total = {"_sum": 0.0, "_count": 0.0}
        seen = False
        for line in text.splitlines():
            for suffix in total:
                head = name + suffix
                if line.startswith(head) and line[len(head) : len(head) + 1] in ("{", " "):
                    try:
                        total[suffix] += float(line.rsplit(" ", 1)[1])
                    except ValueError:
                        continue
                    seen = True
        if seen:
            return {"itl_sum_s": total["_sum"], "itl_count": total["_count"]}
    return {}


def server_itl_ms(before: dict[str, float], after: dict[str, float]) -> float | None:
    """The server's mean inter-token latency between two scrapes (ms), or None without both."""
    if not before or not after or after["itl_count"] <= before["itl_count"]:
        return None
    return 1000 * (after["itl_sum_s"] - before["itl_sum_s"]) / (after["itl_count"] - before["itl_count"])


class Server:
    """``with Server(...) as s: s.wait_healthy(timeout)`` — always stopped on exit."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        log: Path,
        env: dict[str, str],
        served_name: str | None = None,
    ) -> None:
        self.name, self.argv, self.port, self.log, self.env = name, list(argv), port, log, env
        self.served_name = served_name  # when set, /v1/models must list it: the port is held by this server
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        if port_in_use(self.port):
            raise ServerError(f"{self.name}: port {self.port} is in use; stop what holds it or pick another --port")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return self

    def _died(self) -> ServerError:
        code = self.proc.returncode if self.proc else None
        return ServerError(
            f"{self.name} exited with code {code} before it was healthy; last lines of {self.log}:\n"
            f"{log_tail(self.log)}"
        )

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def metrics(self) -> dict[str, float]:
        """The server's own decode timing so far, from ``/metrics`` (Prometheus text): the sum and count of
        its inter-token latency histogram over every label set (engines, models); {} where it has none."""
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
                text = resp.read().decode(errors="replace")
        except (urllib.error.URLError, OSError):
            return {}
        return parse_metrics(text)

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until /health answered 200; a :class:`ServerError` if it died or timed out."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc is None or self.proc.poll() is not None:
                raise self._died()
            if self.healthy():
                self._check_ours()
                return time.monotonic() - t0
            time.sleep(HEALTH_POLL_S)
        raise ServerError(
            f"{self.name} was not healthy after {timeout_s:.0f} s (raise --health-timeout if start-up is slow); "
            f"last lines of {self.log}:\n{log_tail(self.log)}"
        )

    def _check_ours(self) -> None:
        """The server on the port must answer as ``served_name``: another run's server could hold it."""
        if not self.served_name:
            return
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as resp:
                names = [m.get("id") for m in json.loads(resp.read()).get("data", [])]
        except (urllib.error.URLError, OSError, ValueError, AttributeError) as exc:
            names = [f"<no model list: {exc}>"]
        if self.served_name not in names:
            raise ServerError(
                f"{self.name}: the server on port {self.port} answers as {names}, not as this run's "
                f"{self.served_name!r}: another server holds the port; stop it or let the gate pick another port"
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise self._died() if self.proc else ServerError(f"{self.name} is not running")

    def stop(self) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after a grace period."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
