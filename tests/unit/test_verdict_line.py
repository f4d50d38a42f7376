"""The one line at the end of a run of the CPU tier or the GPU suite: PASS, or the failed check, its path, the fix."""

from __future__ import annotations

from tests.verdict_line import tier_of, verdict_line

FUSED = "tests/ep_marlin/test_block_size_selection.py"


def test_pass_and_no_tier():
    assert verdict_line([], 412, tier="CPU tier") == "gate: CPU tier PASS (412 tests passed)"
    assert verdict_line([], 300, tier=None) is None


def test_an_undeclared_non_ep_change_says_revert_or_declare():
    failed = [
        f"{FUSED}::test_undeclared_paths_keep_the_base_arguments[E1-epnone-topk1]",
        f"{FUSED}::test_undeclared_paths_keep_the_base_arguments[E5-epnone-topk2]",
    ]
    assert verdict_line(failed, 10, tier="CPU tier") == (
        "gate: CPU tier FAIL: a path the change does not declare hands the kernels other arguments, on the non-EP "
        "fused path (2 failed test(s), first: test_block_size_selection.py::test_undeclared_paths_keep_the_base_"
        "arguments[E1-epnone-topk1]). What to do: revert that part of the change, or declare the path in its "
        "contract.py (CHANGES_NON_EP / CHANGES_EP)"
    )


def test_paths_are_named_and_the_gates_own_failures_counted_apart():
    failed = [
        f"{FUSED}::test_candidate_keeps_the_invariants_and_its_contract[E8-ep4-topk2-default]",
        f"{FUSED}::test_candidate_keeps_the_invariants_and_its_contract[E8-epnone-topk2-default]",
        "tests/ep_marlin/test_batched_path.py::test_batched_arguments_are_the_base_unless_declared",
        "tests/unit/test_stats.py::test_x",
    ]
    line = verdict_line(failed, 0, tier="CPU tier")
    assert "on the EP fused path and the batched path and the non-EP fused path (3 failed test(s)" in line
    assert line.endswith(
        "; and 1 other failure(s). What to do: fix the change, or the rule in its contract.py if the rule is wrong"
    )
    gpu = ["tests/ep_marlin/test_gpu_equivalence.py::test_ep_sum_equals_non_ep[odd-small-4-linear-tokens7-candidate]"]
    assert verdict_line(gpu, 3, tier_of(gpu)).startswith("gate: GPU suite FAIL: the candidate's outputs fail")
    assert "on the GPU suite (test_ep_sum_equals_non_ep)" in verdict_line(gpu, 3, tier_of(gpu))
    own = verdict_line(["tests/unit/test_stats.py::test_x"], 5, tier="CPU tier")
    assert own.startswith("gate: FAIL of the gate's own tests (1, first: test_stats.py::test_x)")


def test_the_line_names_the_tier_that_ran():
    cpu = f"{FUSED}::test_undeclared_paths_keep_the_base_arguments[E1-epnone-topk1]"
    gpu = "tests/triton_moe/test_gpu_equivalence.py::test_ep_sum_matches_reference[2-tokens0-bf16]"
    assert tier_of([cpu, "tests/unit/test_stats.py::test_x"]) == "CPU tier"
    assert tier_of([gpu]) == "GPU suite"
    assert tier_of([gpu, cpu]) == "CPU tier and GPU suite"
    assert tier_of(["tests/unit/test_stats.py::test_x"]) is None
    assert verdict_line([], 25, tier_of([gpu])) == "gate: GPU suite PASS (25 tests passed)"
    probe = "tests/triton_moe/test_gpu_equivalence.py::test_dynamic_per_tensor_scales_under_ep_read_rows_never_written"
    assert verdict_line([probe], 24, tier_of([gpu, probe])).startswith("gate: FAIL of the gate's own tests (1, first")
