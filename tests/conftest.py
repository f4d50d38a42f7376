"""Test-wide options: which vLLM trees to test, and how GPU tests behave without a GPU."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci.runner.suite_summary import SuiteSummary
from tests.shared import TREES_KEY

GPU_SKIP_REASON = "needs a CUDA GPU: run `nox -s gpu_tests` on a GPU host"
# vLLM's import-time messages about CUDA and Triton a CPU machine lacks, filtered (tests/quiet_vllm.py); set
# before any test imports vLLM, inherited by the xdist workers
os.environ.setdefault("VLLM_LOGGING_CONFIG_PATH", str(Path(__file__).with_name("vllm-logging.json")))
# one CPU thread for torch in each test process: the CPU tier's tensors are small, and xdist's workers (one a
# core) each running torch's default thread pool oversubscribe the cores: 339 s for tests/ep_marlin on 2 cores
# with `-n 2`, 85 s with one thread each
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ep-marlin gate")
    group.addoption(
        "--gate-manifest",
        default=os.environ.get("GATE_MANIFEST"),
        help="manifest.json of the vLLM trees under test (written by `python -m ci.trees.build`; nox passes it)",
    )
    group.addoption(
        "--require-gpu",
        action="store_true",
        help="fail, instead of skip, GPU tests when no CUDA GPU is usable (nox -s gpu_tests sets it)",
    )
    group.addoption("--gate-summary", help="write a JSON summary of this run (with provenance) here")
    group.addoption(
        "--run-network",
        action="store_true",
        help="also run the tests marked network (they download other vLLM releases from the package index)",
    )


def pytest_report_header(config: pytest.Config) -> str:
    from tests.shared import SEED

    return f"ep-marlin gate: fixed seed {SEED} (GPU suite weights, routing, permutations)"


def pytest_configure(config: pytest.Config) -> None:
    from tests import cuda_isolation, verdict_line

    if not config.pluginmanager.is_registered(cuda_isolation):
        config.pluginmanager.register(cuda_isolation, "gate-cuda-isolation")  # one broken test fails alone
    if not config.pluginmanager.is_registered(verdict_line):
        config.pluginmanager.register(verdict_line, "gate-verdict-line")  # one line: what failed, what to do
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped with a reason on CPU-only runs)")
    config.addinivalue_line("markers", "trees: needs the vLLM trees of --gate-manifest")
    config.addinivalue_line("markers", "network: downloads from the package index (skipped unless --run-network)")
    manifest = config.getoption("--gate-manifest")
    if manifest:
        from ci.trees.manifest import load_trees
        from ci.trees.variants import put_base_first
        from tests import line_coverage

        trees = load_trees(Path(manifest))
        put_base_first(trees)
        config.stash[TREES_KEY] = trees
        # vLLM's import costs about 15 s of CPU. Its check (one clear error for a missing dependency, not one per
        # test) runs once in the controller; with xdist workers in a process of its own, while each worker imports
        # vLLM for its tests at the same time (waited for before any test runs: pytest_runtestloop)
        if hasattr(config, "workerinput"):
            _import_quietly(trees)
        elif config.getoption("numprocesses", None):
            config.stash[IMPORT_CHECK_KEY] = subprocess.Popen(
                [sys.executable, "-c", IMPORT_CHECK, str(manifest)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        else:
            _exit_unless_importable(trees)
        # the change's lines, measured from here on: after the base's vLLM is imported (its import runs no
        # candidate code, and runs several times slower under a tracer), before the candidate is loaded
        if not config.pluginmanager.is_registered(line_coverage):
            config.pluginmanager.register(line_coverage, "gate-line-coverage")
    if config.getoption("--require-gpu"):
        pin_xdist_worker()


IMPORT_CHECK_KEY = pytest.StashKey[subprocess.Popen]()
ROOT = Path(__file__).resolve().parents[1]
IMPORT_CHECK = """
import sys
from pathlib import Path
from tests.conftest import load_and_put_first, why_not_importable
why = why_not_importable(load_and_put_first(Path(sys.argv[1])))
if why:
    print(why[0])
    sys.exit(why[1])
"""


def load_and_put_first(manifest: Path):
    from ci.trees.manifest import load_trees
    from ci.trees.variants import put_base_first

    trees = load_trees(manifest)
    put_base_first(trees)
    return trees


def why_not_importable(trees) -> tuple[str, int] | None:
    """Import the base tree's entry module: None, or the one clear message of a missing dependency and its
    exit code."""
    from ci.core.errors import MissingDependencyError
    from ci.trees.variants import check_base_importable

    try:
        check_base_importable(trees)
    except MissingDependencyError as exc:
        return f"gate: {exc}", int(exc.exit_code)
    return None


def _exit_unless_importable(trees) -> None:
    why = why_not_importable(trees)
    if why:
        pytest.exit(why[0], returncode=why[1])


def _import_quietly(trees) -> None:
    """A worker imports the entry module now; what fails is the controller's to report (its own check)."""
    from ci.core.errors import GateError
    from ci.trees.variants import check_base_importable

    with contextlib.suppress(GateError, ImportError):
        check_base_importable(trees)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Before any test runs: the controller's import check (started at configure) must have passed."""
    check = session.config.stash.get(IMPORT_CHECK_KEY, None)
    if check is None:
        return
    out, err = check.communicate()
    if check.returncode != 0:
        why = out.strip() or err.strip()[-2000:] or f"exit code {check.returncode}"
        pytest.exit(
            why if why.startswith("gate: ") else f"gate: the base tree's vLLM does not import: {why}",
            returncode=check.returncode,
        )


def pin_xdist_worker() -> None:
    """Give each pytest-xdist worker its own GPU (gw0 -> first visible GPU, gw1 -> second, ...)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    from ci.host.gpu import query

    _, gpus = query()
    if gpus:
        chosen = gpus[int(worker[2:]) % len(gpus)]
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the order NVML and nvidia-smi number GPUs in
        os.environ["CUDA_VISIBLE_DEVICES"] = str(chosen.index)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--run-network"):
        skip = pytest.mark.skip(
            reason="downloads a vLLM release: run with --run-network (nox -s tests -- --run-network)"
        )
        for item in items:
            if item.get_closest_marker("network"):
                item.add_marker(skip)
    needs_trees = [i for i in items if "trees" in getattr(i, "fixturenames", ())]
    if needs_trees and TREES_KEY not in config.stash:
        raise pytest.UsageError(
            f"{len(needs_trees)} tests need vLLM trees but no --gate-manifest was given (nor GATE_MANIFEST): "
            "run `nox -s tests`, or `python -m ci.trees.build` and pass its manifest.json"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    import torch

    if not torch.cuda.is_available():
        if item.config.getoption("--require-gpu"):
            pytest.fail(f"no usable CUDA GPU in this test process; {GPU_SKIP_REASON}", pytrace=False)
        pytest.skip(GPU_SKIP_REASON)


@pytest.fixture
def metric(record_property):
    """Record a measured error (and its bound) for the run's JSON summary: metric(check, value, bound)."""
    from tests.shared import METRIC_PROPERTY

    def record(check: str, value: float, bound: float | None) -> None:
        record_property(METRIC_PROPERTY, {"check": check, "value": float(value), "bound": bound})

    return record


@pytest.fixture
def contract(request):
    """The change's contract (None: the change has none)."""
    from tests.shared import contract_of

    return contract_of(request.config)


@pytest.fixture(scope="session")
def trees(request: pytest.FixtureRequest):
    """The base and candidate vLLM trees under test (see ci.trees.build)."""
    return request.config.stash[TREES_KEY]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect outcomes, checked-case counts and measured errors (works across xdist workers)."""
    from tests.shared import COUNT_PROPERTY, METRIC_PROPERTY, NOT_IN_RELEASE_PROPERTY

    if report.when == "call" or report.outcome != "passed":
        failed_outside_call = report.when != "call" and report.outcome == "failed"
        _SUMMARY.add_outcome(report.nodeid, "error" if failed_outside_call else report.outcome)
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == COUNT_PROPERTY:
            for side, n in value.items():
                _CASE_COUNTS[side] = _CASE_COUNTS.get(side, 0) + n
        elif name == METRIC_PROPERTY:
            _SUMMARY.add_metric(report.nodeid, value["check"], value["value"], value["bound"])
        elif name == NOT_IN_RELEASE_PROPERTY:
            _SUMMARY.not_in_release = dict(value)


_CASE_COUNTS: dict[str, int] = {}
_SUMMARY = SuiteSummary()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The run's summary JSON, after the verdict line decided the exit status (tests/verdict_line.py)."""
    path = session.config.getoption("--gate-summary")
    if not path or hasattr(session.config, "workerinput"):  # the xdist controller writes it
        return
    from ci.trees import provenance
    from tests.line_coverage import REPORT_KEY

    trees = session.config.stash.get(TREES_KEY, None)
    _SUMMARY.changed_lines = session.config.stash.get(REPORT_KEY, None)
    _SUMMARY.write(Path(path), provenance.collect(trees), int(session.exitstatus))


def pytest_terminal_summary(terminalreporter) -> None:
    if _SUMMARY.checks:
        terminalreporter.write_line("largest measured error per check (bound):")
        for check, st in sorted(_SUMMARY.checks.items()):
            terminalreporter.write_line(f"  {check:36s} {st.largest:.3e}  ({st.bound})  n={st.samples}")
    if _SUMMARY.not_in_release:
        lacks = "; ".join(f"{name} (it lacks {', '.join(m)})" for name, m in sorted(_SUMMARY.not_in_release.items()))
        terminalreporter.write_line(f"formats not in this release (not tried): {lacks}")
    if _CASE_COUNTS:
        counts = ", ".join(f"{n:,} on {side}" for side, n in sorted(_CASE_COUNTS.items()))
        terminalreporter.write_line(f"CPU tier: block-size cases checked against the spec: {counts}")
    trees = terminalreporter.config.stash.get(TREES_KEY, None)
    if trees is not None:
        from ci.trees.contracts import NO_CONTRACT

        contract = trees.manifest.contract
        terminalreporter.write_line(
            f"change: {trees.manifest.patch_path}; {contract['describe'] if contract else NO_CONTRACT}"
        )
