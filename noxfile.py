"""Sessions of the EP-Marlin gate. `nox -l` lists them; options after `--` choose the vLLM
under test (`--vllm 0.25.1|installed`, `--vllm-src PATH`, `--patch FILE`, `--reverse`) and
the rest goes to the tool the session runs. Under `nox --no-venv` nothing is installed: the
interpreter's own packages are used (offline GPU hosts, with `--vllm installed`)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import nox
import nox.command

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from ci.errors import ExitCode  # noqa: E402  (stdlib-only modules)
from ci.gpu import NO_GPU_MESSAGE, query  # noqa: E402
from ci.sessionargs import SessionArgs, parse_session_args  # noqa: E402

nox.options.sessions = ["lint", "tests"]
OUT = Path(".gate") / "out"
STAGE_STOP_S = 60  # after Ctrl-C or SIGTERM, a stage gets this long to stop its servers before SIGTERM/SIGKILL


def _terminate_as_interrupt(signum, frame):
    """SIGTERM (a cancelled CI job, ``kill``) stops nox like Ctrl-C: nox then interrupts the running
    stage and waits for it, instead of dying and leaving the stage and its servers behind."""
    raise KeyboardInterrupt


signal.signal(signal.SIGTERM, _terminate_as_interrupt)


def _stage(session: nox.Session, *args: str) -> None:
    """Run a stage of the gate and keep its exit code: PASS 0, FAIL 1, INCONCLUSIVE 3, NO_BASELINE 4,
    INCOMPLETE 10, ... (README: the codes are the gate's API). nox alone would turn each into 1."""
    try:
        session.run(*args, interrupt_timeout=STAGE_STOP_S, terminate_timeout=10)
    except nox.command.CommandFailed as exc:
        code = exc.return_code if isinstance(exc.return_code, int) and exc.return_code > 0 else 1
        session.log(f"{' '.join(args[1:3])} exited with code {code}: nox exits with it too")
        raise SystemExit(code) from None  # not an Exception: nox lets it through, with the stage's code


def _no_venv(session: nox.Session) -> bool:
    return session.venv_backend == "none"


def _python(session: nox.Session) -> str:
    return sys.executable if _no_venv(session) else "python"


def _install(session: nox.Session, *args: str) -> None:
    if _no_venv(session):
        session.log(f"--no-venv: not installing {' '.join(args)}; using this interpreter's packages")
        return
    session.install(*args)


def _install_vllm_deps(session: nox.Session, args: SessionArgs, *, gpu: bool) -> None:
    """What importing vLLM needs. vLLM itself comes from the trees that ci.build makes."""
    if _no_venv(session):
        return
    if args.installed:
        session.error("--vllm installed tests the vLLM of this interpreter: run it as `nox --no-venv -s ...`")
    if gpu:
        session.install(f"vllm=={args.vllm}")  # its full dependencies, the CUDA torch it pins included
        return
    torch_index = os.environ.get("GATE_TORCH_INDEX_URL")
    session.install("torch==2.13.0", *(["--index-url", torch_index] if torch_index else []))
    session.install("-r", "requirements/cpu-tier.txt")


def _build(session: nox.Session, args: SessionArgs) -> Path:
    trees = Path(".gate") / "trees" / session.name
    _stage(session, _python(session), "-m", "ci.build", *args.build_argv, "--out", str(trees))
    return trees / "manifest.json"


def _out(session: nox.Session, args: SessionArgs) -> Path:
    return Path(args.out) if args.out else OUT / session.name


def _require_gpu(session: nox.Session) -> int:
    _, gpus = query()
    if not gpus:
        session.log(f"Session {session.name} stopped: {NO_GPU_MESSAGE}")
        raise SystemExit(int(ExitCode.NO_GPU))  # the gate's code for it (6), not nox's 1
    return len(gpus)


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff over the code; zizmor and the GitHub JSON schemas over the workflows."""
    _install(session, "-r", "requirements/lint.txt")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("zizmor", "--offline", ".github/workflows")
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    actions = sorted(str(p) for p in (ROOT / ".github" / "act-standins").glob("*/action.yml"))
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-actions", *actions)


@nox.session
def tests(session: nox.Session) -> None:
    """CPU tier and unit tests: vLLM's real Python with spies for its CUDA kernels (any machine)."""
    args = parse_session_args(session.posargs)
    _install_vllm_deps(session, args, gpu=False)
    _install(session, "-r", "requirements/test.txt")
    manifest = _build(session, args)
    workers = os.environ.get("GATE_TEST_WORKERS", "auto")
    session.run(_python(session), "-m", "pytest", "tests", "-n", workers, "--gate-manifest", str(manifest), *args.rest)


@nox.session(default=False)
def build(session: nox.Session) -> None:
    """Build the base and candidate vLLM trees and print where they are."""
    args = parse_session_args(session.posargs)
    if not _no_venv(session) and not args.installed:
        session.install("pip")
    _build(session, args)


@nox.session(default=False)
def gpu_tests(session: nox.Session) -> None:
    """GPU equivalence suite, one pytest-xdist worker per GPU (stops at once without a GPU)."""
    n_gpus = _require_gpu(session)
    args = parse_session_args(session.posargs)
    _install_vllm_deps(session, args, gpu=True)
    _install(session, "-r", "requirements/test.txt")
    manifest = _build(session, args)
    out = _out(session, args)
    _stage(
        session,
        _python(session),
        "-m",
        "pytest",
        "tests/ep_marlin",
        "-m",
        "gpu",
        "--require-gpu",
        "-n",
        str(n_gpus),
        "--gate-manifest",
        str(manifest),
        f"--junitxml={out / 'junit.xml'}",
        f"--gate-summary={out / 'summary.json'}",
        *args.rest,
    )


BENCH_RESULTS = OUT / "bench" / "kernel-results.json"


def _gpu_stage(session: nox.Session, module: str, results_name: str) -> None:
    """The shape of the GPU stages: stop without a GPU, install, build trees, run ``module``."""
    _require_gpu(session)
    args = parse_session_args(session.posargs)
    _install_vllm_deps(session, args, gpu=True)
    _install(session, "-r", "requirements/test.txt")
    manifest = _build(session, args)
    out = _out(session, args) / results_name
    _stage(session, _python(session), "-m", module, "--manifest", str(manifest), "--out", str(out), *args.rest)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Kernel benchmark: base vs candidate fused_marlin_moe under simulated EP on one GPU."""
    _gpu_stage(session, "ci.bench", BENCH_RESULTS.name)


@nox.session(default=False)
def gate(session: nox.Session) -> None:
    """Judge benchmark results: A/B (default) or `--mode baseline`; exits with the verdict's code (README)."""
    _install(session, "-r", "requirements/test.txt")
    rest = list(session.posargs)
    if "--results" not in rest:
        rest = ["--results", str(BENCH_RESULTS), *rest]
    _stage(session, _python(session), "-m", "ci.compare", *rest)


@nox.session(default=False)
def update_baselines(session: nox.Session) -> None:
    """Store a results file as the baseline of its GPU and suite (refuses to overwrite without --force)."""
    rest = list(session.posargs)
    results = str(BENCH_RESULTS)
    if "--results" in rest:
        i = rest.index("--results")
        results = rest[i + 1]
        del rest[i : i + 2]
    _stage(session, _python(session), "-m", "ci.baselines", "record", results, *rest)


@nox.session(default=False)
def tpot(session: nox.Session) -> None:
    """End-to-end TPOT A/B: vllm serve (dummy weights, DP/EP over this host's GPUs) + vllm bench serve."""
    _gpu_stage(session, "ci.tpot", "tpot-results.json")


SURVIVORS = ROOT / "tests" / "mutation-survivors.txt"


@nox.session(default=False)
def mutation(session: nox.Session) -> None:
    """Mutation testing of the verdict logic (mutmut, [tool.mutmut] in pyproject.toml): fails on a
    surviving mutant that tests/mutation-survivors.txt does not explain."""
    _install(session, "-r", "requirements/test.txt", "-r", "requirements/mutation.txt")
    session.run("mutmut", "run", "--max-children", str(os.cpu_count() or 2))
    listing = session.run("mutmut", "results", "--all", "true", silent=True) or ""
    status = dict(line.strip().rsplit(": ", 1) for line in listing.splitlines() if ": " in line)
    survived = {m for m, s in status.items() if s != "killed"}
    explained = {line.split("#")[0].strip() for line in SURVIVORS.read_text().splitlines()} - {""}
    killed = len(status) - len(survived)
    score = f"{killed} of {len(status)} mutants killed ({killed / max(len(status), 1):.1%})"
    session.log(f"mutation score: {score}; {len(survived)} survived, {len(survived & explained)} of them explained")
    for gone in sorted(explained - survived):
        session.log(f"listed but no longer surviving (remove it from {SURVIVORS.name}): {gone}")
    new = sorted(survived - explained)
    if new:
        session.error(
            f"{len(new)} surviving mutant(s) not explained: {', '.join(new)}; see each with `mutmut show NAME`, "
            f"then kill it with a test or list it with its reason in {SURVIVORS.name}"
        )


# Actions that act would fetch from the network, and the local stand-ins it uses instead.
ACT_STANDINS = {
    "actions/setup-python@a26af69be951a213d495a4c3e4e4022e16d87065": ".github/act-standins/setup-python",
    "actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02": ".github/act-standins/upload-artifact",
}


@nox.session(default=False)
def act(session: nox.Session) -> None:
    """Run a workflow job locally with act on this host (default: the CPU job); args go to act."""
    _install(session, "-r", "requirements/ci.txt")
    args = list(session.posargs) or ["-W", ".github/workflows/cpu.yml", "-j", "tests"]
    standins = [x for ref, path in ACT_STANDINS.items() for x in ("--local-repository", f"{ref}={ROOT / path}")]
    platforms = ["-P", "ubuntu-latest=-self-hosted", "-P", "self-hosted=-self-hosted"]
    session.run("act", "--no-cache-server", *platforms, *standins, *args, external=True)
