"""Sessions of the EP-Marlin gate. `nox -l` lists them; options after `--` choose the vLLM
under test (`--vllm 0.25.1|installed`, `--vllm-src PATH`, `--patch FILE`, `--reverse`) and
the rest goes to the tool the session runs. Under `nox --no-venv` nothing is installed: the
interpreter's own packages are used (offline GPU hosts, with `--vllm installed`)."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import nox
import nox.command

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from ci.core.errors import PYTEST_CODES, ExitCode  # noqa: E402
from ci.host import outputs  # noqa: E402  (stdlib-only modules)
from ci.host.gpu import NO_GPU_MESSAGE, query  # noqa: E402
from ci.runner.stages import relay_sigterm, stage_code  # noqa: E402
from ci.trees.sessionargs import SOURCE_OPTIONS, SessionArgs, parse_session_args  # noqa: E402

nox.options.sessions = ["lint", "tests"]
# nox probes for uv at each session and says so when it finds none; the sessions use pip: the line says nothing
logging.getLogger("nox").addFilter(lambda record: record.getMessage() != "uv binary not found.")
OUT = Path(outputs.OUT_DIR)
STAGE_STOP_S = 60  # after Ctrl-C or SIGTERM, a stage gets this long to stop its servers before SIGTERM/SIGKILL


relay_sigterm()


def _stage(session: nox.Session, *args: str, codes: dict[int, int] | None = None) -> None:
    """Run a stage of the gate and keep its exit code: PASS 0, FAIL 1, INCONCLUSIVE 3, NO_BASELINE 4,
    INCOMPLETE 10, ... (README: the codes are the gate's API). nox alone would turn each into 1.
    ``codes`` translates a tool's own codes (pytest's) into the gate's."""
    try:
        session.run(*args, interrupt_timeout=STAGE_STOP_S, terminate_timeout=10)
    except nox.command.CommandFailed as exc:
        code = stage_code(exc.return_code, codes)
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


REQUIREMENTS = ROOT / "requirements"
HASHES_ENV = "GATE_REQUIRE_HASHES"  # set by the GPU workflows: install only from hash locks


def _hashes_required() -> bool:
    return os.environ.get(HASHES_ENV, "") not in ("", "0")


def _requirements(session: nox.Session, *names: str) -> None:
    """Install requirements/<name>.txt; under GATE_REQUIRE_HASHES its hash lock <name>.lock instead."""
    if not _hashes_required():
        _install(session, *[x for n in names for x in ("-r", f"requirements/{n}.txt")])
        return
    locks = [REQUIREMENTS / f"{n}.lock" for n in names]
    missing = [str(p.relative_to(ROOT)) for p in locks if not p.is_file()]
    if missing:
        session.error(f"{HASHES_ENV} is set but {', '.join(missing)} does not exist: create it with `nox -s lock`")
    _install(session, "--require-hashes", "--no-deps", *[x for p in locks for x in ("-r", str(p))])


def gpu_lock(release: str) -> Path:
    return REQUIREMENTS / f"gpu-vllm-{release}.lock"


CPU_TIER = ROOT / "requirements" / "cpu-tier.txt"


def _pin(requirements: Path, package: str) -> str:
    """``package==X`` as ``requirements`` pins it (one place for each pin; torch goes first, from its index)."""
    for line in requirements.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec.lower().startswith(f"{package.lower()}=="):
            return spec
    raise SystemExit(f"{requirements}: no {package}==X pin; add one")


def _install_torch(session: nox.Session, requirement: str) -> None:
    """torch first, from ``GATE_TORCH_INDEX_URL`` when set (a CPU build where PyPI's would be a CUDA one)."""
    torch_index = os.environ.get("GATE_TORCH_INDEX_URL")
    session.install(requirement, *(["--index-url", torch_index] if torch_index else []))


OPTION = re.compile(r"(?<![\w-])--[A-Za-z0-9][\w-]*")


def check_options(session: nox.Session, args: SessionArgs, *tool: str) -> None:
    """Refuse, before anything is built, an option after ``--`` that neither the gate's source options nor the
    session's tool (``tool --help``: pytest with the gate's plugins, or a stage's CLI) has: a typo (``--pach``)
    or an abbreviation (``--contrac``) would otherwise build the default change and fail later, or be taken
    for another option. Exit 2 with the closest names."""
    given = [a.split("=", 1)[0] for a in args.rest if a.startswith("--") and a != "--"]
    if not given:
        return
    helptext = session.run(*tool, "--help", silent=True, external=True) or ""
    known = set(OPTION.findall(helptext)) | set(SOURCE_OPTIONS)
    unknown = [a for a in given if a not in known]
    if unknown:
        hints = [
            f"{a} (did you mean {' or '.join(m)}?)" if (m := difflib.get_close_matches(a, known, 2, 0.6)) else a
            for a in unknown
        ]
        session.log(
            f"unknown option {', '.join(hints)}: neither the gate's options nor {' '.join(tool[-2:])} take "
            "it; nothing was built. Options are spelled out in full (no abbreviations): docs/sessions.md"
        )
        raise SystemExit(int(ExitCode.USAGE))


def _pytest(session: nox.Session, manifest: Path, *args: str, python: str | None = None) -> None:
    """pytest on the trees of ``manifest``, as a stage: its exit codes become the gate's (9 passes through)."""
    python = python or _python(session)
    _stage(session, python, "-m", "pytest", "--gate-manifest", str(manifest), *args, codes=PYTEST_CODES)


def _install_vllm_deps(session: nox.Session, args: SessionArgs, *, gpu: bool) -> bool:
    """What importing vLLM needs; vLLM itself comes from the trees that ci.trees.build makes. For a GPU session
    with a hash lock for the release (requirements/gpu-vllm-<release>.lock: vLLM, its dependencies and
    the test tools), install that and return True: the trees are then built from that verified vLLM."""
    if _no_venv(session):
        return False
    if args.installed:
        session.error("--vllm installed tests the vLLM of this interpreter: run it as `nox --no-venv -s ...`")
    if gpu:
        lock = gpu_lock(args.vllm)
        if lock.is_file():
            session.install("--require-hashes", "--no-deps", "-r", str(lock))
            return True
        if _hashes_required():
            session.error(
                f"{HASHES_ENV} is set but there is no hash lock for vLLM {args.vllm} ({lock.relative_to(ROOT)}): "
                f"create it with `nox -s lock -- --vllm {args.vllm}`"
            )
        session.install(f"vllm=={args.vllm}")  # its full dependencies, the CUDA torch it pins included
        _requirements(session, "test")
        return False
    _install_torch(session, _pin(CPU_TIER, "torch"))
    session.install("-r", "requirements/cpu-tier.txt")
    return False


def _build(
    session: nox.Session, args: SessionArgs, *, locked: bool = False, name: str | None = None, python: str | None = None
) -> Path:
    """Build the trees. ``locked``: the session's venv holds the release from its hash lock, so the trees
    take that vLLM (no second, unverified download) and its version must be the one asked for."""
    trees = Path(".gate") / "trees" / (name or session.name)
    argv = list(args.build_argv)
    if locked:
        argv[argv.index("--vllm") + 1] = "installed"
    _stage(session, python or _python(session), "-m", "ci.trees.build", *argv, "--out", str(trees))
    manifest = trees / "manifest.json"
    if locked:
        import json

        built = json.loads(manifest.read_text())["vllm_version"]
        if built != args.vllm:
            session.error(f"the locked venv holds vLLM {built}, not {args.vllm}: {gpu_lock(args.vllm).name} is stale")
    return manifest


def _out(session: nox.Session, args: SessionArgs) -> Path:
    return Path(args.out) if args.out else OUT / session.name


def _require_gpu(session: nox.Session) -> int:
    _, gpus = query()
    if not gpus:
        session.log(f"Session {session.name} stopped: {NO_GPU_MESSAGE}")
        raise SystemExit(int(ExitCode.NO_GPU))  # the gate's code for it (6), not nox's 1
    return len(gpus)


def workflow_files() -> tuple[list[str], list[str]]:
    """(workflows, action definitions) of the repository, as paths relative to it: every one is audited."""
    github = ROOT / ".github"
    workflows = sorted(str(p.relative_to(ROOT)) for d in ("workflows", "examples") for p in (github / d).glob("*.yml"))
    actions = sorted(
        str(p.relative_to(ROOT)) for d in ("act-standins", "actions") for p in (github / d).glob("*/action.yml")
    )
    return workflows, actions


def _zizmor(session: nox.Session, *args: str, inputs: Sequence[str]) -> None:
    """zizmor over ``inputs``, failing on a finding and on an input it did not audit (a folder it collects
    nothing from gives "no inputs collected" and no error)."""
    out = session.run("zizmor", "--offline", "--strict-collection", *args, *inputs, silent=True) or ""
    session.log(out.strip())
    audited = {line.rsplit("completed ", 1)[1].strip() for line in out.splitlines() if "completed " in line}
    missed = sorted(set(inputs) - audited)
    if missed:
        session.error(f"zizmor did not audit {', '.join(missed)}: check the file is a workflow or action")


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff and the import layers (import-linter) over the code; zizmor and the GitHub schemas over the workflows."""
    _install(session, "-r", "requirements/lint.txt")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")  # ci/'s layers, [tool.importlinter] in pyproject.toml: no import points upwards
    workflows, actions = workflow_files()
    _zizmor(session, inputs=[*workflows, *actions])
    _zizmor(session, "--persona=auditor", inputs=[*workflows, *actions])  # the self-hosted-runner audits too
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-actions", *actions)


def _subject_tier(manifest: Path) -> str:
    """The tests of the change's subject: by the entry module the build chose for it (ci.trees.variants)."""
    from ci.trees.manifest import load_trees
    from ci.trees.variants import SUBJECT_TESTS, entry_module

    return SUBJECT_TESTS[entry_module(load_trees(manifest))]


def _cpu_tier(session: nox.Session, *paths: str, subject_tier: bool = False) -> None:
    """Install what the default release needs, build its trees, run pytest over ``paths`` on them (first the
    tier of the change's subject, with ``subject_tier``)."""
    args = parse_session_args(session.posargs)
    _install_vllm_deps(session, args, gpu=False)
    _requirements(session, "test")
    check_options(session, args, _python(session), "-m", "pytest")
    manifest = _build(session, args)
    if subject_tier:
        paths = (_subject_tier(manifest), *paths)
    _pytest(session, manifest, *paths, "-n", os.environ.get("GATE_TEST_WORKERS", "auto"), *args.rest)


@nox.session
def tests(session: nox.Session) -> None:
    """CPU tier and unit tests: vLLM's real Python with spies for its CUDA kernels (any machine)."""
    _cpu_tier(session, "tests")


# the mutant checks test the gate's own checks (can they catch known-wrong candidates?), not the change
GATE_OWN_CHECKS = ("--ignore=tests/ep_marlin/test_mutants.py", "--ignore=tests/triton_moe/test_mutants.py")


@nox.session(default=False)
def check(session: nox.Session) -> None:
    """A patch tried fast: the CPU tier of the change's subject alone (no unit tests of the gate), one verdict."""
    _cpu_tier(session, "-m", "not gpu", *GATE_OWN_CHECKS, "-q", subject_tier=True)


# Releases the CPU tier follows besides the default one, each in its own environment, its dependencies read
# from the release's own metadata (ci/trees/release_deps.py): `nox -s tests_release -- --release 0.33.0`.
FOLLOWED_RELEASES = ("0.26.0", "0.33.0", "0.34.0")


def _release_env(release: str) -> Path:
    return ROOT / ".nox" / f"tests_release-vllm-{release}"


def _release_python(session: nox.Session, release: str) -> str:
    """The interpreter of vLLM ``release``'s own environment (``.nox/tests_release-vllm-<release>``), made
    from this interpreter when missing: one per release, so no release's packages leak into another's."""
    env = _release_env(release)
    python = env / "bin" / "python"
    if not python.is_file():
        session.run(sys.executable, "-m", "venv", str(env))
    return str(python)


def _tier_on_release(session: nox.Session, release: str, rest: Sequence[str]) -> None:
    """The CPU tier (tests/ep_marlin, tests/triton_moe) on vLLM ``release``, in its own environment, with what
    that release requires."""
    args = parse_session_args(["--vllm", release, *rest])
    from ci.trees.build import GATE_DIR
    from ci.trees.release import fetch_release
    from ci.trees.release_deps import metadata_of, write_requirements

    unpacked = fetch_release(release, GATE_DIR / "cache")
    try:
        deps = write_requirements(
            metadata_of(unpacked.root), GATE_DIR / "deps" / f"vllm-{release}.txt", version=release
        )
    except ValueError as exc:  # e.g. a URL requirement: never installed
        session.error(f"vLLM {release}'s metadata: {exc}")
    session.log(f"vLLM {release}'s dependencies for the CPU tier, from its Requires-Dist: {deps}")
    python = _release_python(session, release)
    pip = (python, "-m", "pip", "install", "--disable-pip-version-check")
    torch = next(line for line in deps.read_text().splitlines() if line.startswith("torch"))
    torch_index = os.environ.get("GATE_TORCH_INDEX_URL")
    session.run(*pip, torch, *(["--index-url", torch_index] if torch_index else []))
    test_txt = REQUIREMENTS / "test.txt"  # only the runner: the rest of test.txt pins numpy, releases pin their own
    session.run(
        *pip, "-r", str(deps), _pin(test_txt, "pytest"), _pin(test_txt, "pytest-xdist"), _pin(test_txt, "coverage")
    )
    check_options(session, args, python, "-m", "pytest")
    manifest = _build(session, args, name=f"tests-vllm-{release}", python=python)
    workers = os.environ.get("GATE_TEST_WORKERS", "auto")
    _pytest(session, manifest, "tests/ep_marlin", "tests/triton_moe", "-n", workers, *args.rest, python=python)


@nox.session(default=False, venv_backend="none")
def tests_release(session: nox.Session) -> None:
    """CPU tier on other vLLM releases (-- --release newest X.Y.Z), each in an environment of its own.

    Without ``--release``: the newest release on the package index and every one of FOLLOWED_RELEASES. A
    newest release the gate does not follow yet is tested too, and the session then exits 14 (RELEASE_AHEAD)
    naming it and what its entry points changed, even when its tier passes."""
    from ci.core.errors import ReleaseAheadError, UsageError
    from ci.trees.build import GATE_DIR
    from ci.trees.newest import check, newest_on_index
    from ci.trees.release import DEFAULT_VLLM
    from ci.trees.sessionargs import parse_release_args

    try:
        asked, rest, discard_envs = parse_release_args(session.posargs, default=("newest", *FOLLOWED_RELEASES))
    except UsageError as exc:
        session.log(f"tests_release: {exc}")
        raise SystemExit(int(exc.exit_code)) from None
    if any(a == "--vllm" or a.startswith("--vllm=") for a in rest):
        session.error(
            "this session picks the vLLM with --release newest|X.Y.Z (each its own environment): leave out --vllm"
        )
    newest = newest_on_index() if "newest" in asked else None
    releases = list(dict.fromkeys(newest if r == "newest" else r for r in asked))
    ahead = None
    if newest is not None:
        try:
            session.log(check(newest, [DEFAULT_VLLM, *FOLLOWED_RELEASES], GATE_DIR / "cache"))
        except ReleaseAheadError as exc:
            ahead = exc
            session.log(f"tests_release: {exc} (its CPU tier runs anyway, to show what breaks)")
    codes = {}
    for release in releases:
        try:
            _tier_on_release(session, release, rest)
            codes[release] = 0
        except SystemExit as exc:  # a stage's own code (_stage): the other releases still run
            codes[release] = exc.code if isinstance(exc.code, int) else int(ExitCode.INTERNAL)
        if discard_envs:  # only the session's own environment (.nox/tests_release-vllm-<release>), made by it
            env = _release_env(release)
            session.log(f"tests_release: --discard-envs: removing {env}")
            shutil.rmtree(env, ignore_errors=True)
    session.log("tests_release: " + "; ".join(f"vLLM {r} exit {c}" for r, c in codes.items()))
    failed = [c for c in codes.values() if c]
    if failed:
        raise SystemExit(failed[0])
    if ahead is not None:
        session.log(f"tests_release: {ahead}")
        raise SystemExit(int(ahead.exit_code))


@nox.session(default=False)
def releases(session: nox.Session) -> None:
    """Whether vLLM's newest release on the package index is one the gate follows (exit 14: a newer one).

    Exit 14 names the newer release and the parameters its entry points added and removed; ``-- --newest
    X.Y.Z`` checks one release without asking the index."""
    from ci.trees.build import GATE_DIR
    from ci.trees.release import DEFAULT_VLLM

    followed = [DEFAULT_VLLM, *FOLLOWED_RELEASES]
    session.run(
        _python(session),
        "-m",
        "ci.trees.newest",
        "--followed",
        *followed,
        "--cache",
        str(GATE_DIR / "cache"),
        *session.posargs,
        external=True,
    )


@nox.session(default=False)
def build(session: nox.Session) -> None:
    """Build the base and candidate vLLM trees and print where they are."""
    args = parse_session_args(session.posargs)
    if not _no_venv(session) and not args.installed:
        session.install("pip")
    _build(session, args)


def _gpu_session(session: nox.Session, *tool: str) -> tuple[int, SessionArgs, Path]:
    """What every GPU session does first: stop without a GPU, install, check the options for ``tool`` (a module
    run with ``python -m``, or pytest), build the trees (GPUs, args, manifest)."""
    n_gpus = _require_gpu(session)
    args = parse_session_args(session.posargs)
    locked = _install_vllm_deps(session, args, gpu=True)
    check_options(session, args, _python(session), "-m", *(tool or ("pytest",)))
    return n_gpus, args, _build(session, args, locked=locked)


@nox.session(default=False)
def gpu_tests(session: nox.Session) -> None:
    """GPU equivalence suite of the change's subject, one pytest-xdist worker per GPU (stops without a GPU)."""
    n_gpus, args, manifest = _gpu_session(session, "pytest")
    out = _out(session, args)
    _pytest(
        session,
        manifest,
        _subject_tier(manifest),
        "-m",
        "gpu",
        "--require-gpu",
        "-n",
        str(n_gpus),
        f"--junitxml={out / outputs.SUITE_JUNIT}",
        f"--gate-summary={out / outputs.SUITE_SUMMARY}",
        *args.rest,
    )


BENCH_RESULTS = OUT / "bench" / outputs.KERNEL_RESULTS


def _gpu_stage(session: nox.Session, module: str, folder: str = "") -> None:
    """The shape of the GPU stages: stop without a GPU, install, build trees, run ``module`` with the session's
    --out folder (or ``folder`` in it); the stage names its files there (ci/host/outputs.py)."""
    _, args, manifest = _gpu_session(session, module)
    out = _out(session, args) / folder
    _stage(session, _python(session), "-m", module, "--manifest", str(manifest), "--out", str(out), *args.rest)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Kernel benchmark: base vs candidate fused_marlin_moe under simulated EP on one GPU."""
    _gpu_stage(session, "ci.kernel.bench")


@nox.session(default=False)
def tile_sweep(session: nox.Session) -> None:
    """The time of every Marlin MoE tile per case, and each build's pick (resumable: the same command resumes)."""
    _gpu_stage(session, "ci.kernel.tile_sweep", "tile_sweep")


@nox.session(default=False)
def history(session: nox.Session) -> None:
    """The history of complete runs per machine, subject and suite (`-- add|show|detect|plot ...`).

    Installs Apache Otava and matplotlib (requirements/changepoints.txt); docs/sessions.md has the options."""
    _requirements(session, "changepoints")
    _stage(session, _python(session), "-m", "ci.core.history", *session.posargs)


@nox.session(default=False)
def bisect(session: nox.Session) -> None:
    """The first vLLM commit between two refs that made cases slower, each step a paired A/B (docs/history.md).

    `-- --vllm-src PATH --good REF --bad REF [--suite S | --cases GLOB] [--tpot]`; each commit is built as the
    gate's trees in branch mode."""
    _require_gpu(session)
    args = parse_session_args(session.posargs)
    locked = _install_vllm_deps(session, args, gpu=True)
    check_options(session, args, _python(session), "-m", "ci.runner.bisect")
    argv = list(args.build_argv)
    if locked:  # the session's venv holds the release from its hash lock: the trees take that vLLM
        argv[argv.index("--vllm") + 1] = "installed"
    out = str(_out(session, args))
    _stage(session, _python(session), "-m", "ci.runner.bisect", *argv, "--out", out, *args.rest)


@nox.session(default=False)
def nightly(session: nox.Session) -> None:
    """One night of the GPU history: add a run, find change points, bisect new ones (docs/history.md).

    `-- --results FILE [--vllm-src CHECKOUT] [--history DIR] [--vllm R]`: the run is `nox -s bench`'s, timed
    first; this session needs no GPU (Apache Otava, requirements/changepoints.txt), its bisects run through
    `nox -s bisect -- --vllm R` (default 0.25.1), which does."""
    _requirements(session, "changepoints")
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--vllm", default="0.25.1")
    known, rest = parser.parse_known_args(session.posargs)
    bisect = shlex.join([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "bisect", "--"])
    bisect += f" --vllm {shlex.quote(known.vllm)}"
    _stage(session, _python(session), "-m", "ci.runner.nightly", "--bisect-command", bisect, *rest)


@nox.session(python=False, default=False)
def tile_oracle(session: nox.Session) -> None:
    """The tile sweep's analysis: regret of each rule and the fitted rule (`-- --sweep FILE[.gz] --out DIR`)."""
    _stage(session, sys.executable, "-m", "ci.kernel.tile_oracle", *session.posargs)


@nox.session(default=False)
def gpu_gate(session: nox.Session) -> None:
    """The whole GPU verdict: GPU suite, kernel A/B and the verdict against the stored baseline, one exit code."""
    n_gpus, args, manifest = _gpu_session(session, "ci.runner.gpu_gate")
    workers = ["--workers", str(n_gpus)] if "--workers" not in args.rest else []
    _stage(
        session,
        _python(session),
        "-m",
        "ci.runner.gpu_gate",
        "--manifest",
        str(manifest),
        "--out",
        str(_out(session, args)),
        *workers,
        *args.rest,
    )


@nox.session(default=False)
def error_rates(session: nox.Session) -> None:
    """The kernel gate's false alarms and detection on this GPU: A/A runs and injected slowdowns (README)."""
    _gpu_stage(session, "ci.kernel.error_rates", outputs.ERROR_RATES)


def _with_results(posargs: Sequence[str]) -> list[str]:
    """The session's arguments, with ``--results`` defaulting to the kernel bench's results file: the
    judging sessions (gate, update_baselines) take the same ``--results FILE`` as their stages."""
    rest = list(posargs)
    return rest if "--results" in rest else ["--results", str(BENCH_RESULTS), *rest]


@nox.session(default=False)
def gate(session: nox.Session) -> None:
    """Judge benchmark results: A/B (default) or `--mode baseline`; exits with the verdict's code (README)."""
    _requirements(session, "test")
    _stage(session, _python(session), "-m", "ci.core.compare", *_with_results(session.posargs))


@nox.session(default=False)
def update_baselines(session: nox.Session) -> None:
    """Store a results file as the baseline of its GPU and suite (refuses to overwrite without --force)."""
    _stage(session, _python(session), "-m", "ci.core.baselines", "record", *_with_results(session.posargs))


@nox.session(default=False)
def triton_bench(session: nox.Session) -> None:
    """Triton fused-MoE A/B on one GPU: one EP rank's fused_experts_impl, its config choice and regret table."""
    _gpu_stage(session, "ci.triton_moe.bench")


@nox.session(default=False)
def tpot(session: nox.Session) -> None:
    """End-to-end TPOT A/B: vllm serve (dummy weights, DP/EP over this host's GPUs) + vllm bench serve."""
    _gpu_stage(session, "ci.serving.tpot")


@nox.session(default=False)
def tpot_error_rates(session: nox.Session) -> None:
    """The TPOT gate's false alarms and detection here: TPOT A/A runs, and A/A runs with a GPU sleep (docs/tpot.md)."""
    _gpu_stage(session, "ci.serving.error_rates", outputs.ERROR_RATES)


@nox.session(default=False)
def changepoint_rates(session: nox.Session) -> None:
    """Change-point rules (3% threshold, Otava, Otava + the gate's A/B) on simulated histories (`-- --runs A.json`)."""
    _requirements(session, "changepoints")
    _stage(session, _python(session), "-m", "ci.core.changepoints", *session.posargs)


@nox.session(default=False)
def tests_changepoints(session: nox.Session) -> None:
    """The history's and the change points' tests with Apache Otava installed, so its real detector runs too.

    Otava pins numpy 2.2.0, which keeps it out of the `tests` and `mutation` environments."""
    _requirements(session, "changepoints")
    test_txt = REQUIREMENTS / "test.txt"
    session.install(*(_pin(test_txt, p) for p in ("pytest", "hypothesis", "psutil")))
    tests = ("tests/unit/test_history.py", "tests/unit/test_changepoints.py", "tests/unit/test_nightly.py")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, *session.posargs)


@nox.session(python=False, default=False)
def resample(session: nox.Session) -> None:
    """Error rates of a design resampled from measured A/A runs (`-- --results A.json ... --captures 6,8,10`)."""
    _stage(session, sys.executable, "-m", "ci.core.resample", *session.posargs)


@nox.session(python=False, default=False)
def clean(session: nox.Session) -> None:
    """What .gate and .nox hold, with sizes; `-- NAME...`, `-- --all` (.gate) or `-- --nox` (.nox) removes."""
    _stage(session, sys.executable, "-m", "ci.trees.clean", *session.posargs)


SURVIVORS = ROOT / "tests" / "mutation-survivors.txt"


@nox.session(default=False)
def mutation(session: nox.Session) -> None:
    """Mutation testing of the verdict logic (mutmut): fails on a survivor tests/mutation-survivors.txt lacks.

    The modules mutated and the tests run are [tool.mutmut] in pyproject.toml."""
    _requirements(session, "test", "mutation")
    session.run("mutmut", "run", "--max-children", str(os.cpu_count() or 2))
    listing = session.run("mutmut", "results", "--all", "true", silent=True) or ""
    status = dict(line.strip().rsplit(": ", 1) for line in listing.splitlines() if ": " in line)
    survived = {m for m, s in status.items() if s not in ("killed", "timeout")}  # a hang fails the tests too
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


@nox.session(default=False)
def lock(session: nox.Session) -> None:
    """Hash locks for the GPU workflows (uv pip compile): requirements/*.lock and gpu-vllm-<release>.lock.

    ci.lock, test.lock, mutation.lock, changepoints.lock, and gpu-vllm-<release>.lock (that vLLM, its dependencies
    and the test tools, CPython 3.12 on x86-64 Linux)."""
    args = parse_session_args(session.posargs)
    _install(session, "-r", "requirements/lock-tools.txt")
    uv = ["uv", "pip", "compile", "--generate-hashes", "--no-header", "--quiet"]
    for name, python in (("ci", "3.10"), ("test", "3.11"), ("mutation", "3.11"), ("changepoints", "3.11")):
        req = f"requirements/{name}.txt"
        session.run(*uv, "--universal", "--python-version", python, req, "-o", f"requirements/{name}.lock")
    # numpy comes from vLLM's own constraint (0.25.1 needs numpy < 2.4; the CPU tier pins 2.4.6)
    tools = [line for line in (REQUIREMENTS / "test.txt").read_text().splitlines() if line.split("==")[0] != "numpy"]
    source = REQUIREMENTS / f"gpu-vllm-{args.vllm}.in"
    source.write_text(
        f"# input of gpu-vllm-{args.vllm}.lock (nox -s lock -- --vllm {args.vllm})\n"
        f"vllm=={args.vllm}\n" + "\n".join(t for t in tools if not t.startswith("#")) + "\n"
    )
    session.run(
        *uv,
        "--python-version",
        "3.12",
        "--python-platform",
        "x86_64-manylinux_2_28",
        str(source.relative_to(ROOT)),
        "-o",
        str(gpu_lock(args.vllm).relative_to(ROOT)),
    )


# Actions that act would fetch from the network, and the local stand-ins it uses instead.
ACT_STANDINS = {
    "actions/checkout@08c6903cd8c0fde910a37f88322edcfb5dd907a8": ".github/act-standins/checkout",
    "actions/setup-python@a26af69be951a213d495a4c3e4e4022e16d87065": ".github/act-standins/setup-python",
    "actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02": ".github/act-standins/upload-artifact",
}


def _act_command() -> list[str]:
    standins = [x for ref, path in ACT_STANDINS.items() for x in ("--local-repository", f"{ref}={ROOT / path}")]
    platforms = ["-P", "ubuntu-latest=-self-hosted", "-P", "self-hosted=-self-hosted"]
    return ["act", "--no-cache-server", *platforms, *standins, "--env", f"GATE_ACT_SOURCE={ROOT}"]


@nox.session(default=False)
def act(session: nox.Session) -> None:
    """Run a workflow job locally with act on this host (default: the CPU job); args go to act."""
    _install(session, "-r", "requirements/ci.txt")
    args = list(session.posargs) or ["-W", ".github/workflows/cpu.yml", "-j", "tests"]
    session.run(*_act_command(), *args, external=True)


@nox.session(default=False)
def act_gpu(session: nox.Session) -> None:
    """The GPU workflows' trust paths with act, offline (tests/act_scenarios.py); no GPU needed.

    A reviewed SHA runs, a moved PR head stops before any of its code is checked out, a fork's caller runs the
    reusable workflow."""
    _install(session, "-r", "requirements/ci.txt")
    session.run(_python(session), "tests/act_scenarios.py", *_act_command())
