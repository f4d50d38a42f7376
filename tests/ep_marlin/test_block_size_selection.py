"""CPU tier: vLLM's real fused_marlin_moe from each tree, only its CUDA work replaced by spies.

Checks, over a grid of M, local experts, EP sizes, top-k and input dtypes:

* the candidate picks exactly the block size the patch specifies, the base the old rule;
* with ``global_num_experts == -1`` base and candidate pass identical arguments to every
  kernel (the PR's promise: non-EP behaviour unchanged);
* ``moe_align_block_size`` receives the global expert count and the caller's ``expert_map``.
"""

from __future__ import annotations

import pytest

from tests.ep_marlin import cpu_harness as h
from tests.ep_marlin.conftest import COUNT_PROPERTY

GRID = [
    pytest.param(e, ep, topk, id=f"E{e}-ep{'none' if ep is None else ep}-topk{topk}")
    for e in h.LOCAL_EXPERTS
    for ep in h.EP_SIZES
    for topk in h.TOP_KS
    if h.has_enough_experts(e, ep, topk)
]
NON_EP_GRID = [p for p in GRID if p.values[1] is None]


def _run(module, e, ep, topk, quant_type_id, expert_map_fn):
    for case in h.cases_for(e, ep, topk):
        yield case, h.observe(module, case, h.make_inputs(case, expert_map_fn), quant_type_id)


@pytest.mark.parametrize("side", ["base", "candidate"])
@pytest.mark.parametrize(("e", "ep", "topk"), GRID)
def test_block_size_matches_spec(side, e, ep, topk, variants, quant_type_id, expert_map_fn, record_property):
    """base follows the old rule, candidate the patched one; both pass the global expert count."""
    module = dict(zip(("base", "candidate"), variants, strict=True))[side].marlin_moe
    errors, n = [], 0
    for case, obs in _run(module, e, ep, topk, quant_type_id, expert_map_fn):
        errors += h.block_size_mismatches(obs, case, patched=side == "candidate")
        errors += h.align_mismatches(obs, case)
        n += 1
    record_property(COUNT_PROPERTY, {side: n})
    assert not errors, f"{len(errors)} of {n} cases differ from the spec:\n" + "\n".join(errors[:20])


@pytest.mark.parametrize(("e", "ep", "topk"), NON_EP_GRID)
def test_non_ep_kernel_arguments_identical(e, ep, topk, variants, quant_type_id, expert_map_fn):
    """global_num_experts == -1: every kernel argument is the same in base and candidate."""
    base, cand = (v.marlin_moe for v in variants)
    errors = []
    for case in h.cases_for(e, ep, topk):
        inputs = h.make_inputs(case, expert_map_fn)
        errors += h.kernel_arg_differences(
            h.observe(base, case, inputs, quant_type_id), h.observe(cand, case, inputs, quant_type_id), case
        )
    assert not errors, "non-EP behaviour changed:\n" + "\n".join(errors[:20])


def test_grid_is_large():
    """The grid covers hundreds of configurations, odd M values and every EP size of the issue."""
    assert len(GRID) >= 150
    assert {1, 3, 8191, 8192} <= set(h.M_VALUES)
    assert {None, 1, 2, 4, 8, 16, 32} == set(h.EP_SIZES)
