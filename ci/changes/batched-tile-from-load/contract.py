"""Contract of the #56744-like change: the batched path picks its tile from the token load.

* ``fused_marlin_moe``: unchanged (the tile rule moved into a shared helper; kernel arguments must stay
  the base's, EP or not).
* ``batched_fused_marlin_moe`` called by ``BatchedMarlinExperts.apply`` (DeepEP low latency): the tile of
  ``min(max(ceil(topk_ids.numel() * num_dispatchers / G), 1), capacity)`` rows per expert, G the global
  expert count (the local one when G is -1); called directly (no load known): from the capacity, as before.
"""

from ci.moe import spec

NAME = "batched-tile-from-load"
UPSTREAM = "in the spirit of vLLM PR #56744 (open)"
SUMMARY = "batched Marlin tile from topk_ids.numel()-based load, capacity as the fallback"
CHANGES_NON_EP = False
CHANGES_EP = False
CHANGES_BATCHED = True


def batched_block_size_m(*, capacity, assignments, num_dispatchers, global_experts, local_experts, input_itemsize, env):
    load = spec.batched_load(
        capacity=capacity,
        assignments=assignments,
        num_dispatchers=num_dispatchers,
        global_experts=global_experts,
        local_experts=local_experts,
    )
    return spec.pick_block_size_m(load, 1, 1, input_itemsize)
