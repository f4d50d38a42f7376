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
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] == "ci":
            return _internal()
        print(f"error: {missing_dependency(exc.name)}", file=sys.stderr)
        return int(ExitCode.ENVIRONMENT)
    except Exception:  # a bug of the gate: never let it pass for a verdict (FAIL is 1)
        return _internal()


def _internal() -> int:
    traceback.print_exc()
    print(
        f"internal error: the gate itself failed (exit {int(ExitCode.INTERNAL)}); this is a bug, not a verdict "
        "on the change: report it with the traceback above",
        file=sys.stderr,
    )
    return int(ExitCode.INTERNAL)


def missing_dependency(module: str) -> str:
    """One line for a package this environment lacks (not a bug of the gate): what, and how to install it."""
    return (
        f"this environment has no module {module!r} (package {module.split('.')[0]!r}), which this stage needs: "
        "run it through its nox session, which installs what it needs (`nox -s SESSION`), or install the "
        "session's requirements here (python -m pip install -r requirements/test.txt)"
    )
