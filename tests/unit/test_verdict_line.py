"""The one line at the end of a CPU-tier run: PASS, or the check that failed, its path and the next step."""

from __future__ import annotations

from tests.verdict_line import verdict_line

FUSED = "tests/ep_marlin/test_block_size_selection.py"


def test_pass_and_no_tier():
    assert verdict_line([], 412, tier_ran=True) == "gate: CPU tier PASS (412 tests passed)"
    assert verdict_line([], 300, tier_ran=False) is None


def test_an_undeclared_non_ep_change_says_revert_or_declare():
    failed = [f"{FUSED}::test_undeclared_paths_keep_the_base_arguments[E1-epnone-topk1]",
              f"{FUSED}::test_undeclared_paths_keep_the_base_arguments[E5-epnone-topk2]"]  # fmt: skip
    assert verdict_line(failed, 10, tier_ran=True) == (
        "gate: CPU tier FAIL: a path the change does not declare hands the kernels other arguments, on the non-EP "
        "fused path (2 failed test(s), first: test_block_size_selection.py::test_undeclared_paths_keep_the_base_"
        "arguments[E1-epnone-topk1]). What to do: revert that part of the change, or declare the path in its "
        "contract.py (CHANGES_NON_EP / CHANGES_EP)"
    )


def test_paths_are_named_and_the_gates_own_failures_counted_apart():
    failed = [f"{FUSED}::test_candidate_keeps_the_invariants_and_its_contract[E8-ep4-topk2-default]",
              f"{FUSED}::test_candidate_keeps_the_invariants_and_its_contract[E8-epnone-topk2-default]",
              "tests/ep_marlin/test_batched_path.py::test_batched_arguments_are_the_base_unless_declared",
              "tests/unit/test_stats.py::test_x"]  # fmt: skip
    line = verdict_line(failed, 0, tier_ran=True)
    assert "on the EP fused path and the batched path and the non-EP fused path (3 failed test(s)" in line
    assert line.endswith("; and 1 other failure(s). What to do: read the first case below; fix the change, or the "
                         "rule in its contract.py if the rule is wrong")  # fmt: skip
    gpu = ["tests/ep_marlin/test_gpu_equivalence.py::test_ep_sum_equals_non_ep[odd-small-4-linear-tokens7-candidate]"]
    assert "on the GPU suite (test_ep_sum_equals_non_ep)" in verdict_line(gpu, 3, tier_ran=True)
    own = verdict_line(["tests/unit/test_stats.py::test_x"], 5, tier_ran=True)
    assert own.startswith("gate: FAIL of the gate's own tests (1, first: test_stats.py::test_x)")
