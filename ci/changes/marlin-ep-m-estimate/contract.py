"""Contract of the shipped change, vLLM PR #48144: re-estimate M before fused_marlin_moe picks block_size_m.

Under EP (``global_num_experts != -1``) the candidate picks the block size of ``ceil(M * E / G)`` rows
(``ci.moe.spec``, written from the PR's words); non-EP callers and the batched path are unchanged.
"""

from ci.moe import spec

NAME = "marlin-ep-m-estimate"
UPSTREAM = "vLLM PR #48144 (merged; in 0.26.0)"
SUMMARY = "M = ceil(M * E / global_num_experts) before the block_size_m choice, under EP only"
CHANGES_NON_EP = False
CHANGES_EP = True
CHANGES_BATCHED = False


def fused_block_size_m(*, m, topk, local_experts, global_experts, input_itemsize, env):
    return spec.expected_block_size_m(
        m=m,
        topk=topk,
        local_experts=local_experts,
        global_experts=global_experts,
        input_itemsize=input_itemsize,
        patched=True,
    )
