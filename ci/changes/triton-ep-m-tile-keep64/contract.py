"""Contract of the M-tile rule that keeps 64: under EP the config for ``M`` rows, its ``BLOCK_SIZE_M`` that of
the spec's config for ``ceil(M * E / G)`` rows, but not below 64 where the config for ``M`` has 64 or more;
without EP every launch is the base's."""

NAME = "triton-ep-m-tile-keep64"
UPSTREAM = "this gate's own rule, from its regret table (not upstream)"
SUMMARY = "under EP, BLOCK_SIZE_M of ceil(M * E / G) rows, not cut below 64; the rest of the config M's"
ENTRY_MODULE = "vllm.model_executor.layers.fused_moe.fused_moe"
CHANGES_NON_EP = False
CHANGES_EP = True
CHANGES_BATCHED = False


def triton_config(*, config_of_m, config_of_estimate):
    tile = config_of_estimate["BLOCK_SIZE_M"]
    if config_of_m["BLOCK_SIZE_M"] >= 64:
        tile = max(tile, 64)
    return {**config_of_m, "BLOCK_SIZE_M": tile}
