"""One line at the end of a run of the CPU tier or the GPU suite: PASS, or which check failed, on which path, and
what to do.

A failing CPU tier prints one FAILED block per grid point; this line says what they mean for the change
under test, so a contributor knows the next step without reading them.
"""

from __future__ import annotations

import pytest

# test (file::function) -> (what failed, the path, what to do)
CHECKS = {
    "test_block_size_selection.py::test_base_follows_the_release_rule": (
        "the base tree does not pick the release's tile (ci/kernel/spec.py)", "fused",
        "the oracle does not fit this vLLM release: a bug of the gate for it, not of the change; report it"),
    "test_block_size_selection.py::test_candidate_keeps_the_invariants_and_its_contract": (
        "the candidate breaks a universal invariant or its contract's rule", "fused",
        "read the first case below; fix the change, or the rule in its contract.py if the rule is wrong"),
    "test_block_size_selection.py::test_undeclared_paths_keep_the_base_arguments": (
        "a path the change does not declare hands the kernels other arguments", "fused",
        "revert that part of the change, or declare the path in its contract.py (CHANGES_NON_EP / CHANGES_EP)"),
    "test_block_size_selection.py::test_the_change_states_its_rule": (
        "the change's contract states no rule", "fused", "add fused_block_size_m or batched_block_size_m to it"),
    "test_batched_path.py::test_base_follows_the_release_rule": (
        "the base tree does not pick the release's batched tile (ci/kernel/spec.py)", "batched",
        "the oracle does not fit this vLLM release: a bug of the gate for it, not of the change; report it"),
    "test_batched_path.py::test_candidate_keeps_the_invariants_and_its_contract": (
        "the candidate breaks a universal invariant or its contract's batched rule", "batched",
        "read the first case below; fix the change, or the rule in its contract.py if the rule is wrong"),
    "test_batched_path.py::test_batched_arguments_are_the_base_unless_declared": (
        "the batched path, which the change does not declare, hands the kernels other arguments", "batched",
        "revert that part of the change, or declare the path in its contract.py (CHANGES_BATCHED = True)"),
    "test_fused_experts_config.py::test_each_launch_gets_the_specified_config_and_the_aligner_the_same_tile": (
        "the base tree does not launch the release's Triton config (ci/triton_moe/spec.py)", "triton",
        "the oracle does not fit this vLLM release: a bug of the gate for it, not of the change; report it"),
    "test_candidate_config.py::test_the_candidate_launches_what_its_contract_says": (
        "the candidate's Triton config breaks an invariant, a path it does not declare or its contract's rule",
        "triton", "read the first call named below; fix the change, or triton_config in its contract.py if the "
        "rule is wrong, or declare the path (CHANGES_NON_EP / CHANGES_EP)"),
}  # fmt: skip
GPU_SUITE = "test_gpu_equivalence.py"
GPU_CHECK = ("the candidate's outputs fail a numerical check on the GPU", "GPU",
             "read the first failure (it names the case and the error); a change that gives other numbers than the "
             "base and the float32 reference is wrong: revert it")  # fmt: skip


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
    return "the non-EP fused path" if "-epnone-" in nodeid else "the EP fused path"


def tier_of(ran: list[str]) -> str | None:
    """What ran of the change's checks: "CPU tier", "GPU suite", both, or None (only the gate's own tests)."""
    checks = [found for nodeid in ran if (found := _check_of(nodeid))]
    on_gpu = {path == "GPU" for _, (_, path, _) in checks}
    names = [name for gpu, name in ((False, "CPU tier"), (True, "GPU suite")) if gpu in on_gpu]
    return " and ".join(names) or None


def verdict_line(failed: list[str], passed: int, tier: str | None) -> str | None:
    """The line for ``failed`` test ids (``passed`` passed) of a run of ``tier`` (``tier_of``): None when no
    check of the change ran."""
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
        return (f"gate: {tier} FAIL: {what}, on {' and '.join(paths)} ({len(checks)} failed test(s), first: "
                f"{nodeid.rsplit('/', 1)[-1]}){more}. What to do: {todo}")  # fmt: skip
    return (f"gate: FAIL of the gate's own tests ({len(own)}, first: {own[0].rsplit('/', 1)[-1]}): a bug of the gate "
            "or of this environment, not a verdict on the change")  # fmt: skip


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    stats = terminalreporter.stats
    failed = [r.nodeid for key in ("failed", "error") for r in stats.get(key, []) if hasattr(r, "nodeid")]
    passed = len(stats.get("passed", []))
    ran = [r.nodeid for key in ("passed", "failed", "error") for r in stats.get(key, []) if hasattr(r, "nodeid")]
    line = verdict_line(failed, passed, tier_of(ran))
    if line:
        terminalreporter.write_sep("-", "verdict")
        terminalreporter.write_line(line, bold=True, red=bool(failed), green=not failed)
