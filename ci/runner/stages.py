"""How a session runs a stage (the noxfile's plumbing, kept out of it): the exit code passed on for a stage's
return code, and SIGTERM relayed to the running stage as the interrupt Ctrl-C would have sent.

Standard library at import (the noxfile imports it before any session installs anything); the process scan
takes psutil, which ``requirements/ci.txt`` installs beside nox.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from ci.core.errors import ExitCode


def stage_code(returned: object, codes: dict[int, int] | None = None) -> int:
    """The exit code nox passes on for a stage's return code: the stage's own (``codes`` translates a tool's),
    or 128 + N for a stage killed by signal N (137: SIGKILL, e.g. out of memory), as a shell reports it;
    never 1, the FAIL code, for a stage that did not say FAIL."""
    if not isinstance(returned, int) or returned == 0:
        return int(ExitCode.INTERNAL)  # nox raised without a code: not a verdict
    if returned < 0:
        return 128 - returned
    return (codes or {}).get(returned, returned)


def run_stage(argv: list[str], cwd: Path) -> int:
    """Run one stage as a process of its own; its exit code, or 128 + N when signal N killed it (as a shell
    reports it)."""
    code = subprocess.run(argv, cwd=cwd, check=False).returncode
    return 128 - code if code < 0 else code


def children() -> list[int]:
    """This process's direct children (psutil: any platform it supports)."""
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=False)]


def terminate_as_interrupt(signum, frame):
    """SIGTERM (a cancelled CI job, ``kill``) stops nox like Ctrl-C: the running stage gets SIGINT (what
    Ctrl-C would have sent it; ci.serving.tpot then stops its servers) and nox waits for it (its
    ``interrupt_timeout``) before SIGTERM and SIGKILL, instead of dying and leaving the stage and its servers
    behind."""
    for pid in children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
    raise KeyboardInterrupt


def relay_sigterm() -> None:
    """Install :func:`terminate_as_interrupt` for SIGTERM in this process (the noxfile does, once)."""
    signal.signal(signal.SIGTERM, terminate_as_interrupt)
