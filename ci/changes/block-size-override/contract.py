"""Contract of the #48067-like change: an opt-in override of block_size_m, default unchanged.

* Default (``VLLM_MARLIN_MOE_BLOCK_SIZE_M`` unset): nothing changes; every kernel argument, EP or not,
  fused or batched, is the base's.
* Set: ``fused_marlin_moe`` uses the given tile (at least 16 for 1-byte inputs); the batched path keeps
  its capacity rule.
"""

from ci.moe import spec

NAME = "block-size-override"
UPSTREAM = "in the spirit of vLLM PR #48067 (open)"
SUMMARY = "VLLM_MARLIN_MOE_BLOCK_SIZE_M overrides fused_marlin_moe's block_size_m; unset: unchanged"
CHANGES_NON_EP = False
CHANGES_EP = False
CHANGES_BATCHED = False
VARIABLE = "VLLM_MARLIN_MOE_BLOCK_SIZE_M"
SETTINGS = {"default": {}, "override-8": {VARIABLE: "8"}, "override-48": {VARIABLE: "48"}}


def fused_block_size_m(*, m, topk, local_experts, global_experts, input_itemsize, env):
    if VARIABLE not in env:
        return spec.pick_block_size_m(m, topk, local_experts, input_itemsize)
    forced = int(env[VARIABLE])
    return max(forced, spec.MIN_BLOCK_SIZE_M_1_BYTE_INPUT) if input_itemsize == 1 else forced


def batched_block_size_m(*, capacity, assignments, num_dispatchers, global_experts, local_experts, input_itemsize, env):
    return spec.batched_block_size_m(capacity, input_itemsize)
