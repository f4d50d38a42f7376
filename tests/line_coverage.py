"""Which of the change's lines a test run executed (pytest plugin, loaded by ``tests/conftest.py``).

Every test process (the controller and each xdist worker) measures the candidate's changed files with
coverage.py from configure on, before the candidate is loaded (``ci.trees.changed_lines``); each saves its
data when its session ends (or when a worker leaves after a fatal CUDA error, ``flush``); the controller
combines them and stashes a :class:`ci.trees.changed_lines.LineReport` under ``REPORT_KEY`` for the verdict
line and the run's summary JSON.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.shared import TREES_KEY

REPORT_KEY = pytest.StashKey()
_cov = None


def _folder(config: pytest.Config, trees) -> Path:
    from ci.trees import changed_lines

    if hasattr(config, "workerinput") and os.environ.get(changed_lines.DIR_ENV):
        return Path(os.environ[changed_lines.DIR_ENV])
    folder = trees.manifest_path.resolve().parent / changed_lines.DATA_DIR / f"run-{os.getpid()}-{time.time_ns()}"
    os.environ[changed_lines.DIR_ENV] = str(folder)  # the xdist workers, started after this, inherit it
    return folder


def pytest_configure(config: pytest.Config) -> None:
    global _cov
    trees = config.stash.get(TREES_KEY, None)
    if trees is None or _cov is not None:
        return
    from ci.trees import changed_lines

    folder = _folder(config, trees)
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", None):
        return  # an xdist controller runs no test: its workers measure
    _cov = changed_lines.start(trees, folder)


def flush() -> None:
    """Save this process's data now (a worker about to leave with ``os._exit``)."""
    global _cov
    if _cov is None:
        return  # nothing measured in this process (no trees, or already saved)
    from ci.trees import changed_lines

    changed_lines.stop(_cov)
    _cov = None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    flush()
    config = session.config
    trees = config.stash.get(TREES_KEY, None)
    if trees is None or hasattr(config, "workerinput"):  # the controller combines
        return
    from ci.trees import changed_lines

    folder = Path(os.environ.get(changed_lines.DIR_ENV, ""))
    config.stash[REPORT_KEY] = changed_lines.summarize(trees, folder)
