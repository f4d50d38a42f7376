"""A gate run's own processes: its tag, and finding or stopping what it left behind.

Every process a run starts carries ``GATE_RUN_ID=<tag>`` in its environment (the workflows set it per
job; ``run_id()`` makes one up otherwise), so a clean-up finds this run's servers, engines and clients by
the tag, never by name: two jobs on one runner each stop only their own.

CLI: ``python -m ci.host.procs leftovers [--kill-own] [--run-id TAG]`` (this run's processes still alive,
killed with ``--kill-own``; then each GPU's memory in use).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from ci.core.cli import run_main
from ci.core.errors import UsageError

RUN_ID_ENV = "GATE_RUN_ID"  # every process a gate run starts carries it: leftovers are found by it, not by name


def run_id() -> str:
    """This run's tag (``$GATE_RUN_ID``, e.g. the workflow's run id), made up and exported when unset,
    so the servers and clients this process starts inherit it."""
    if not os.environ.get(RUN_ID_ENV):
        import secrets

        os.environ[RUN_ID_ENV] = f"{os.getpid()}-{secrets.token_hex(4)}"
    return os.environ[RUN_ID_ENV]


def _environ(proc: Path) -> dict[str, str]:
    raw = (proc / "environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def own_leftovers(tag: str) -> list[tuple[int, str]]:
    """(pid, command) of this user's processes that carry ``GATE_RUN_ID=tag`` (a run's servers, engines,
    clients), never another job's: two jobs on one runner each clean up only their own."""
    if not tag:
        raise UsageError(f"leftovers need a run tag: set {RUN_ID_ENV} (the workflows set it per job) or pass --run-id")
    found, mine = [], _ancestors()
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid in mine:  # this process and the shells that started it carry the tag too
            continue
        try:
            if proc.stat().st_uid != os.getuid() or _environ(proc).get(RUN_ID_ENV) != tag:
                continue
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append((pid, cmd))
    return found


def _ancestors() -> set[int]:
    """This process and its parents, up to init."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def kill_own_leftovers(tag: str) -> list[tuple[int, str]]:
    """SIGKILL the processes of run ``tag`` that are still there; return what was found."""
    found = own_leftovers(tag)
    for pid, _ in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.host.procs", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    left = sub.add_parser("leftovers", help="this run's processes still alive (by GATE_RUN_ID)")
    left.add_argument("--kill-own", action="store_true", help="SIGKILL them")
    left.add_argument("--run-id", default=os.environ.get(RUN_ID_ENV, ""), help=f"the run's tag (${RUN_ID_ENV})")
    args = parser.parse_args(argv)
    found = kill_own_leftovers(args.run_id) if args.kill_own else own_leftovers(args.run_id)
    for pid, cmd in found:
        print(f"procs: leftover process {pid}{' (killed)' if args.kill_own else ''}: {cmd[:160]}")
    from ci.host.gpu import query

    for g in query()[1]:
        print(f"procs: GPU {g.index} {g.name}: {g.memory_used_mib} MiB in use after the job")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
