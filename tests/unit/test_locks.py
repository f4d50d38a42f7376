"""Hash-pinned installs for the GPU workflows: the locks match their inputs, and the nox sessions use
them (and nothing else) when GATE_REQUIRE_HASHES is set."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQ = ROOT / "requirements"
PIN = re.compile(r"^([A-Za-z0-9_.\[\]-]+)==([^\s;\\]+)")


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if m := PIN.match(line.strip()):
            pins[m[1].lower().split("[")[0]] = m[2]
    return pins


@pytest.mark.parametrize("name", ["ci", "test", "mutation"])
def test_each_lock_holds_its_pins_with_hashes(name):
    wanted, locked = _pins(REQ / f"{name}.txt"), _pins(REQ / f"{name}.lock")
    assert wanted and all(locked.get(k) == v for k, v in wanted.items()), (name, wanted, locked)
    text = (REQ / f"{name}.lock").read_text()
    for block in re.split(r"\n(?=[A-Za-z])", text.strip()):
        assert "--hash=sha256:" in block, f"{name}.lock: no hash for {block.splitlines()[0]}"


def test_gpu_lock_pins_vllm_and_the_test_tools_but_takes_numpy_from_vllm():
    locked = _pins(REQ / "gpu-vllm-0.25.1.lock")
    assert locked["vllm"] == "0.25.1" and locked["torch"] == "2.11.0"
    tools = {k: v for k, v in _pins(REQ / "test.txt").items() if k != "numpy"}
    assert all(locked.get(k) == v for k, v in tools.items())
    assert tuple(int(x) for x in locked["numpy"].split(".")[:2]) < (2, 4)  # vLLM 0.25.1 needs numpy < 2.4


class FakeSession:
    def __init__(self):
        self.installed, self.logs = [], []
        self.venv_backend = "virtualenv"
        self.posargs = []

    def install(self, *args):
        self.installed.append(args)

    def log(self, msg):
        self.logs.append(msg)

    def error(self, msg):
        raise SystemExit(msg)


@pytest.fixture(scope="module")
def noxfile():
    import signal
    import sys

    if "gate_noxfile" in sys.modules:
        return sys.modules["gate_noxfile"]
    handler = signal.getsignal(signal.SIGTERM)
    spec = importlib.util.spec_from_file_location("gate_noxfile", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["gate_noxfile"] = module
    signal.signal(signal.SIGTERM, handler)  # the noxfile turns SIGTERM into an interrupt for nox itself
    return module


def test_sessions_install_only_hash_locks_when_required(noxfile, monkeypatch):
    session = FakeSession()
    monkeypatch.delenv(noxfile.HASHES_ENV, raising=False)
    noxfile._requirements(session, "test")
    assert session.installed == [("-r", "requirements/test.txt")]
    monkeypatch.setenv(noxfile.HASHES_ENV, "1")
    session = FakeSession()
    noxfile._requirements(session, "test", "mutation")
    assert session.installed == [
        ("--require-hashes", "--no-deps", "-r", str(REQ / "test.lock"), "-r", str(REQ / "mutation.lock"))
    ]
    with pytest.raises(SystemExit, match="does not exist: create it with `nox -s lock`"):
        noxfile._requirements(FakeSession(), "lint")


def test_gpu_sessions_use_the_release_lock_and_build_from_it(noxfile, monkeypatch):
    from ci.trees.sessionargs import parse_session_args

    monkeypatch.setenv(noxfile.HASHES_ENV, "1")
    session = FakeSession()
    assert noxfile._install_vllm_deps(session, parse_session_args([]), gpu=True) is True
    assert session.installed == [("--require-hashes", "--no-deps", "-r", str(REQ / "gpu-vllm-0.25.1.lock"))]
    with pytest.raises(SystemExit, match=r"no hash lock for vLLM 0\.26\.0"):
        noxfile._install_vllm_deps(FakeSession(), parse_session_args(["--vllm", "0.26.0"]), gpu=True)
    monkeypatch.delenv(noxfile.HASHES_ENV)
    session = FakeSession()  # without the requirement, a release without a lock installs from the index
    assert noxfile._install_vllm_deps(session, parse_session_args(["--vllm", "0.26.0"]), gpu=True) is False
    assert session.installed == [("vllm==0.26.0",), ("-r", "requirements/test.txt")]


def test_a_stage_killed_by_a_signal_exits_128_plus_the_signal_never_fail():
    """A stage killed for memory returned -9, which the noxfile turned into 1, the FAIL code (issue 21, item 5)."""
    from ci.core.errors import PYTEST_CODES
    from ci.runner.stages import stage_code

    assert stage_code(-9) == 137 and stage_code(-15) == 143
    assert stage_code(1) == 1 and stage_code(10) == 10
    assert stage_code(5, PYTEST_CODES) == 2 and stage_code(1, PYTEST_CODES) == 1
    assert stage_code(None) == stage_code(0) == 70


def test_sigterm_reaches_the_running_stage_as_an_interrupt():
    """The relay finds this process's children (psutil) and sends each SIGINT, then stops nox like Ctrl-C."""
    import signal
    import subprocess
    import sys

    from ci.runner import stages

    # the child takes SIGINT as Ctrl-C even where it was started with SIGINT ignored (a background job of a
    # non-interactive shell), and says so before the relay runs
    code = (
        "import signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "print('ready', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert child.pid in stages.children()
        with pytest.raises(KeyboardInterrupt):
            stages.terminate_as_interrupt(signal.SIGTERM, None)
        assert child.wait(timeout=20) != 0  # it got SIGINT: KeyboardInterrupt in the child
    finally:
        child.kill()
