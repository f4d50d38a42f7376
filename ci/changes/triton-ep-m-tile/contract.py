"""Contract of the M-tile-only rule for Triton's fused_experts_impl under EP.

Under EP the config is the spec's for ``M`` rows with its ``BLOCK_SIZE_M`` taken from the spec's config for
``ceil(M * E / G)`` rows (``ci.triton_moe.spec``); without EP every launch is the base's.
"""

NAME = "triton-ep-m-tile"
UPSTREAM = "this gate's own rule (not upstream)"
SUMMARY = "under EP, BLOCK_SIZE_M of ceil(M * E / global_num_experts) rows; the rest of the config M's"
ENTRY_MODULE = "vllm.model_executor.layers.fused_moe.fused_moe"
CHANGES_NON_EP = False
CHANGES_EP = True
CHANGES_BATCHED = False


def triton_config(*, config_of_m, config_of_estimate):
    return {**config_of_m, "BLOCK_SIZE_M": config_of_estimate["BLOCK_SIZE_M"]}
