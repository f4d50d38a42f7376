"""One line at the very end of a run of the CPU tier or the GPU suite: PASS, INCOMPLETE, or which check failed, on
which path, its first case, and what to do.

A failing CPU tier prints one FAILED block per grid point; this line says what they mean for the change
under test, so a contributor knows the next step without reading them. A run whose tests all passed is still
no PASS (INCOMPLETE, exit 10) when the change's own checks of its subject mostly did not run, or when changed
lines ran in no test (``tests/line_coverage.py``, ``ci.trees.changed_lines``).
"""

from __future__ import annotations

import pytest

# test (file::function) -> (what failed, the path, what to do)
CHECKS = {
    "test_block_size_selection.py::test_base_follows_the_release_rule": (
        "the base tree does not pick the release's tile (ci/moe/spec.py)",
        "fused",
        "the oracle does not fit this vLLM release: a bug of the gate for it, not of the change; report it",
    ),
    "test_block_size_selection.py::test_candidate_keeps_the_invariants_and_its_contract": (
        "the candidate breaks a universal invariant or its contract's rule",
        "fused",
        "fix the change, or the rule in its contract.py if the rule is wrong",
    ),
    "test_block_size_selection.py::test_undeclared_paths_keep_the_base_arguments": (
        "a path the change does not declare hands the kernels other arguments",
        "fused",
        "revert that part of the change, or declare the path in its contract.py (CHANGES_NON_EP / CHANGES_EP)",
    ),
    "test_block_size_selection.py::test_the_change_states_its_rule": (
        "the change's contract states no rule",
        "fused",
        "add fused_block_size_m or batched_block_size_m to it",
    ),
    "test_batched_path.py::test_base_follows_the_release_rule": (
        "the base tree does not pick the release's batched tile (ci/moe/spec.py)",
        "batched",
        "the oracle does not fit this vLLM release: a bug of the gate for it, not of the change; report it",
    ),
    "test_batched_path.py::test_candidate_keeps_the_invariants_and_its_contract": (
        "the candidate breaks a universal invariant or its contract's batched rule",
        "batched",
        "fix the change, or the rule in its contract.py if the rule is wrong",
    ),
    "test_batched_path.py::test_batched_arguments_are_the_base_unless_declared": (
        "the batched path, which the change does not declare, hands the kernels other arguments",
        "batched",
        "revert that part of the change, or declare the path in its contract.py (CHANGES_BATCHED = True)",
    ),
    "test_fused_experts_config.py::test_each_launch_gets_the_specified_config_and_the_aligner_the_same_tile": (
        "the base tree does not launch the release's Triton config (ci/triton_moe/spec.py)",
        "triton",
        "the oracle does not fit this vLLM release: a bug of the gate for it, not of the change; report it",
    ),
    "test_candidate_config.py::test_the_candidate_launches_what_its_contract_says": (
        "the candidate's Triton config breaks an invariant, a path it does not declare or its contract's rule",
        "triton",
        "fix the change, or triton_config in its contract.py if the rule is wrong, or declare the path "
        "(CHANGES_NON_EP / CHANGES_EP)",
    ),
}
GPU_SUITE = "test_gpu_equivalence.py"
GPU_CHECK = (
    "the candidate's outputs fail a numerical check on the GPU",
    "GPU",
    "a change that gives other numbers than the base and the float32 reference is wrong: revert it",
)


# GPU-suite tests of what the gate assumes of the base build, not of the change
GATE_ASSUMPTIONS = {"test_gpu_equivalence.py::test_dynamic_per_tensor_scales_under_ep_read_rows_never_written"}


def _check_of(nodeid: str) -> tuple[str, tuple[str, str, str]] | None:
    """The change's check a test is, or None: a test of the gate itself (unit tests, the mutant checks, what
    the GPU suite assumes of the base build)."""
    path, _, rest = nodeid.partition("::")
    file = path.rsplit("/", 1)[-1]
    key = f"{file}::{rest.split('[', 1)[0]}"
    if key in CHECKS:
        return key, CHECKS[key]
    return (key, GPU_CHECK) if file == GPU_SUITE and key not in GATE_ASSUMPTIONS else None


def _path(nodeid: str, path: str) -> str:
    if path == "GPU":
        return "the GPU suite (" + nodeid.partition("::")[2].split("[", 1)[0] + ")"
    if path == "triton":
        return "the Triton fused-MoE path"
    if path != "fused" or "[" not in nodeid:
        return f"the {path} path"
    non_ep = "-epnone-" in nodeid or "-ep1-" in nodeid  # G == -1, or G == E with no expert map (cpu_harness)
    return "the non-EP fused path" if non_ep else "the EP fused path"


def tier_of(ran: list[str]) -> str | None:
    """What ran of the change's checks: "CPU tier", "GPU suite", both, or None (only the gate's own tests)."""
    checks = [found for nodeid in ran if (found := _check_of(nodeid))]
    on_gpu = {path == "GPU" for _, (_, path, _) in checks}
    names = [name for gpu, name in ((False, "CPU tier"), (True, "GPU suite")) if gpu in on_gpu]
    return " and ".join(names) or None


def first_case(message: str | None) -> str:
    """The first failing case a check's assertion message names (its line after the count), shortened."""
    if not message:
        return ""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    pick = lines[1] if len(lines) > 1 else lines[0] if lines else ""
    pick = pick.removeprefix("AssertionError: ")
    return pick if len(pick) <= 240 else pick[:237] + "..."


def _todo(todo: str, has_contract: bool) -> str:
    if has_contract:
        return todo
    return todo.replace(
        "fix the change, or the rule in its contract.py if the rule is wrong",
        "fix the change (it has no contract, so only the universal invariants and the non-EP promise hold)",
    ).replace("or declare the path in its contract.py", "or give the change a contract.py that declares the path")


def verdict_line(
    failed: list[str], passed: int, tier: str | None, *, first_message: str | None = None, has_contract: bool = True
) -> str | None:
    """The line for ``failed`` test ids (``passed`` passed) of a run of ``tier`` (``tier_of``): None when no
    check of the change ran. ``first_message``: the first failed check's assertion message (its first case is
    quoted); ``has_contract``: whether the change has a contract (the advice says what to fix accordingly)."""
    if not tier:
        return None
    checks = [(nodeid, found) for nodeid in failed if (found := _check_of(nodeid))]
    own = [nodeid for nodeid in failed if not _check_of(nodeid)]
    if not failed:
        return f"gate: {tier} PASS ({passed} tests passed)"
    if checks:
        nodeid, (_, (what, _, todo)) = checks[0]
        paths = sorted({_path(n, c[1]) for n, (_, c) in checks})
        more = f"; and {len(own)} other failure(s)" if own else ""
        case = first_case(first_message)
        quoted = f"; first case: {case}" if case else ""
        return (
            f"gate: {tier} FAIL: {what}, on {' and '.join(paths)} ({len(checks)} failed test(s), first: "
            f"{nodeid.rsplit('/', 1)[-1]}{quoted}){more}. What to do: {_todo(todo, has_contract)}"
        )
    return (
        f"gate: FAIL of the gate's own tests ({len(own)}, first: {own[0].rsplit('/', 1)[-1]}): a bug of the gate "
        "or of this environment, not a verdict on the change"
    )


def evidence_gaps(tier: str, ran: int, skipped: int, skip_reason: str, lines, on_gpu: bool) -> str | None:
    """Why a run whose tests all passed is no PASS (INCOMPLETE), or None: the change's own checks of its
    subject did not run (``ran`` of them ran, ``skipped`` skipped), or changed lines ran in no test (``lines``,
    a ``ci.trees.changed_lines.LineReport``; None: not measured in this run)."""
    from ci.trees.changed_lines import shown

    why = f" (first reason: {skip_reason})" if skip_reason else ""
    if ran == 0:
        return (
            f"gate: {tier} INCOMPLETE: none of the change's checks of its subject ran ({skipped} skipped{why}): "
            "nothing vouches for the change"
        )
    if skipped > ran:
        return (
            f"gate: {tier} INCOMPLETE: {skipped} of the change's {skipped + ran} checks of its subject were "
            f"skipped{why}: a PASS of the few that ran says little"
        )
    if lines is None:
        return None
    if not lines.measured:
        return f"gate: {tier} INCOMPLETE: the change's lines were not measured: {lines.why_not_measured}"
    if lines.unexecuted:
        where = "in the GPU suite" if on_gpu else "on the CPU"
        todo = (
            "add a GPU test that runs them, or remove them if no caller reaches them"
            if on_gpu
            else "only the GPU suite can vouch for them: run nox -s gpu_gate on a GPU host"
        )
        return (
            f"gate: {tier} INCOMPLETE: the tests passed, but {len(lines.unexecuted)} of the change's "
            f"{lines.statements} statements never ran {where}: {shown(lines.unexecuted)}; {todo}"
        )
    return None


def _subject_checks(stats: dict, trees, on_gpu: bool) -> tuple[int, int, str]:
    """(ran, skipped, first skip reason) of the change's own checks of its subject: the tests of its subject's
    folder (ci.trees.variants.SUBJECT_TESTS), of this run's kind (GPU tests on a GPU run, the others on the
    CPU), less the gate's own mutant checks."""
    from ci.trees.variants import SUBJECT_TESTS, entry_module

    folder = SUBJECT_TESTS.get(entry_module(trees), "")
    ran, skipped, reason = 0, 0, ""
    for key in ("passed", "failed", "error", "skipped"):
        for r in stats.get(key, []):
            nodeid = getattr(r, "nodeid", "")
            if not nodeid.startswith(folder + "/") or "test_mutants.py" in nodeid:
                continue
            if bool((getattr(r, "keywords", None) or {}).get("gpu")) != on_gpu:
                continue
            if key == "skipped":
                skipped += 1
                if not reason and isinstance(r.longrepr, tuple) and len(r.longrepr) == 3:
                    reason = str(r.longrepr[2]).removeprefix("Skipped: ")
            else:
                ran += 1
    return ran, skipped, reason


VERDICT_KEY = pytest.StashKey()


def _failure_message(stats: dict) -> str | None:
    for key in ("failed", "error"):
        for r in stats.get(key, []):
            if _check_of(getattr(r, "nodeid", "")):
                crash = getattr(getattr(r, "longrepr", None), "reprcrash", None)
                return getattr(crash, "message", None)
    return None


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Decide the run's line and, for a run whose tests all passed on incomplete evidence, its exit code:
    INCOMPLETE (10), never PASS (after tests/line_coverage.py measured the change's lines)."""
    config = session.config
    if hasattr(config, "workerinput"):
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    stats = reporter.stats if reporter is not None else {}
    failed = [r.nodeid for key in ("failed", "error") for r in stats.get(key, []) if hasattr(r, "nodeid")]
    passed = len(stats.get("passed", []))
    ran = [r.nodeid for key in ("passed", "failed", "error") for r in stats.get(key, []) if hasattr(r, "nodeid")]
    tier = tier_of(ran)
    from tests.line_coverage import REPORT_KEY
    from tests.shared import TREES_KEY

    trees = config.stash.get(TREES_KEY, None)
    lines = config.stash.get(REPORT_KEY, None)
    if lines is None and trees is not None:
        from ci.trees.changed_lines import LineReport, changed_statements

        if changed_statements(trees):  # the measuring plugin did not run (-p no:gate-line-coverage)
            lines = LineReport(
                measured=False,
                why_not_measured="the line-coverage plugin (tests/line_coverage.py) did not run in this session",
            )
    has_contract = trees is None or trees.manifest.contract is not None
    line = verdict_line(failed, passed, tier, first_message=_failure_message(stats), has_contract=has_contract)
    if line and trees is not None and not failed and session.exitstatus == 0:
        on_gpu = bool(config.getoption("--require-gpu", False))
        gap = evidence_gaps(tier, *_subject_checks(stats, trees, on_gpu), lines, on_gpu)
        if gap:
            from ci.core.errors import ExitCode

            line = gap
            session.exitstatus = int(ExitCode.INCOMPLETE)
    elif line and lines is not None and lines.unexecuted:
        from ci.trees.changed_lines import shown

        line += f" (and {len(lines.unexecuted)} changed statement(s) never ran: {shown(lines.unexecuted)})"
    config.stash[VERDICT_KEY] = line


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The verdict is the run's last line, after pytest's own summary."""
    line = config.stash.get(VERDICT_KEY, None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if not line or reporter is None:
        return
    failed = " FAIL" in line or " INCOMPLETE" in line
    reporter.write_sep("-", "verdict")
    reporter.write_line(line, bold=True, red=failed, green=not failed)
