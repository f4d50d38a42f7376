"""Shared plumbing of the CLI entry points: error reporting and exit codes."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence

from ci.core.errors import ExitCode, GateError

Main = Callable[[Sequence[str] | None], int]


def run_main(main: Main, argv: Sequence[str] | None = None) -> int:
    """Run a CLI ``main``; turn a :class:`GateError` into one clear message and its exit code."""
    try:
        return main(argv)
    except GateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception:  # a bug of the gate: never let it pass for a verdict (FAIL is 1)
        traceback.print_exc()
        print(
            f"internal error: the gate itself failed (exit {int(ExitCode.INTERNAL)}); this is a bug, not a verdict "
            "on the change: report it with the traceback above",
            file=sys.stderr,
        )
        return int(ExitCode.INTERNAL)
