"""Contract of the Marlin fix transplanted to Triton's fused_experts_impl: the config of ceil(M * E / G) rows.

Under EP (``global_num_experts != -1``) both GEMMs and the aligner get the config the spec
(``ci.triton_moe.spec``) gives for ``ceil(M * E / G)`` rows; without EP every launch is the base's.
"""

NAME = "triton-ep-m-estimate"
UPSTREAM = "vLLM PR #48144's rule, transplanted to the Triton path (not upstream)"
SUMMARY = "fused_experts_impl's config chosen for ceil(M * E / global_num_experts) rows, under EP only"
ENTRY_MODULE = "vllm.model_executor.layers.fused_moe.fused_moe"
CHANGES_NON_EP = False
CHANGES_EP = True
CHANGES_BATCHED = False


def triton_config(*, config_of_m, config_of_estimate):
    return config_of_estimate
