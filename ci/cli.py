"""Shared plumbing of the CLI entry points: error reporting and exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from ci.errors import GateError

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
