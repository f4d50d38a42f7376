"""Crash isolation for the GPU suite: one test that breaks the CUDA context fails alone.

After a fatal CUDA error (an illegal memory access, a device-side assert, ...) the process's
CUDA context stays broken and every later GPU call fails, so one candidate that crashes the
kernel would turn the whole suite red, base-side tests included. This pytest plugin (loaded by
``tests/conftest.py``) keeps the blame where it belongs:

* the test that hit the error fails, with a line naming it and the error;
* under pytest-xdist (``nox -s gpu_tests`` runs one worker per GPU) the worker then exits
  before its next test, and xdist starts a fresh one; the next test, which never ran, is put
  back in the queue (``pytest_handlecrashitem``) and runs in the fresh worker, so it is not
  reported as crashed;
* without xdist the later GPU tests are skipped with a reason (the run still fails on the first);
* a worker that leaves on purpose does not count against xdist's ``--max-worker-restart`` (4 per
  worker by default): a candidate that crashes 17 tests must not stop xdist replacing workers, which
  on the H200 once left a test that never ran and was never reported;
* and, whatever happens to the workers, a test that was collected but never reported fails the run
  with its name (``never ran``): no verdict on a suite that did not run in full.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

import pytest

FATAL_CUDA = re.compile(
    r"CUDA error: (an illegal memory access|device-side assert|unspecified launch failure|misaligned address|"
    r"an illegal instruction|operation not permitted when stream is capturing|uncorrectable ECC error)"
    r"|CUBLAS_STATUS_EXECUTION_FAILED|cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS"
)
MARKERS_ENV = "GATE_CUDA_ISOLATION_DIR"  # the controller's folder where a worker says why it exits
EXIT_CODE = 75  # a worker that leaves on purpose (EX_TEMPFAIL): the controller replaces it
ISOLATED = "isolated"  # outcome of xdist's crash report for a worker that left on purpose: not a failure
_broken_by: str | None = None  # this process: the test whose fatal CUDA error broke the context
_config: pytest.Config | None = None
_collected: list[str] = []  # the controller: test ids the workers collected
_reported: set[str] = set()  # the controller: test ids with a result


def _worker_id(config: pytest.Config) -> str | None:
    workerinput = getattr(config, "workerinput", None)
    return workerinput["workerid"] if workerinput else None


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config
    if _worker_id(config) is None and not os.environ.get(MARKERS_ENV):
        os.environ[MARKERS_ENV] = tempfile.mkdtemp(prefix="gate-cuda-isolation-")  # workers inherit it


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    """Controller: what the workers collected (the same list for each, or xdist stops)."""
    if not _collected:
        _collected.extend(ids)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome != ISOLATED:
        _reported.add(report.nodeid)


def never_ran(collected: list[str], reported: set[str]) -> list[str]:
    """Collected test ids without any result, in collection order."""
    return [nodeid for nodeid in collected if nodeid not in reported]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Controller: a suite that left tests unrun fails, naming them."""
    if _worker_id(session.config) is not None or not _collected:
        return
    missing = never_ran(_collected, _reported)
    if not missing:
        return
    reporter = session.config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", f"gate: {len(missing)} collected test(s) never ran", red=True)
        for nodeid in missing:
            reporter.write_line(f"never ran: {nodeid}")
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    global _broken_by
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or _broken_by is not None:
        return
    text = f"{call.excinfo.typename}: {call.excinfo.value}"
    if FATAL_CUDA.search(text):
        _broken_by = item.nodeid
        line = FATAL_CUDA.search(text)[0]
        report.sections.append(
            (
                "gate: CUDA context broken",
                f"{item.nodeid} hit a fatal CUDA error ({line}); the tests after it run "
                "in a fresh process, so they are not blamed for it",
            )
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """Before a test: if an earlier test of this process broke the CUDA context, leave (xdist
    replaces the worker and re-queues this test) or, without xdist, skip GPU tests."""
    if _broken_by is None:
        return None
    worker = _worker_id(item.config)
    if worker is not None:
        marker = Path(os.environ[MARKERS_ENV]) / f"{worker}.broken"
        marker.write_text(_broken_by)
        time.sleep(1.0)  # let the previous test's completion reach the controller
        from tests import line_coverage

        line_coverage.flush()  # what this worker measured of the change's lines counts
        os._exit(EXIT_CODE)
    if item.get_closest_marker("gpu") is not None:
        item.add_marker(
            pytest.mark.skip(
                reason=f"the CUDA context was broken by {_broken_by}; run under xdist "
                "(nox -s gpu_tests) to run the rest in a fresh process"
            )
        )
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report, sched) -> None:
    """Controller: a worker that left after a fatal CUDA error did not crash on ``crashitem``."""
    directory = os.environ.get(MARKERS_ENV)
    worker = getattr(getattr(report, "node", None), "gateway", None)
    if not directory or worker is None:
        return
    marker = Path(directory) / f"{worker.id}.broken"
    if not marker.is_file():
        return  # a real crash: xdist's report stands
    broken_by = marker.read_text()
    marker.unlink()
    dsession = _config.pluginmanager.getplugin("dsession") if _config is not None else None
    if dsession is not None and hasattr(dsession, "_failed_nodes_count"):
        dsession._failed_nodes_count -= 1  # xdist adds 1 right after this hook: an isolation is not a crash
    report.outcome = ISOLATED
    report.longrepr = f"worker {worker.id} left after {broken_by} broke its CUDA context; a fresh worker goes on"
    if crashitem != broken_by:  # it never ran: run it in the fresh worker
        sched.mark_test_pending(crashitem)


def pytest_report_teststatus(report, config):
    if report.outcome == ISOLATED:
        return ISOLATED, "R", "ISOLATED (fresh worker)"
    return None
