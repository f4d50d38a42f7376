"""Contract of the tile oracle's rule (issue 43): #48144 plus the tile the H200 sweep measured.

* ``fused_marlin_moe``: #48144's tile of ``ceil(M * E / G)`` rows under EP (``M`` unchanged when G is -1),
  except where the expected rows per expert ``r = M' * topk / E`` lie in [90.5, 181) and the input is 16-bit:
  there the 48-row tile (1-byte inputs, W4A8, keep #48144's 64: an H100 sweep found 64 faster for them there).
  So non-EP callers change too, but only in that band (a load of 90-181 rows per expert: e.g. Mixtral at
  512 tokens).
* ``batched_fused_marlin_moe`` called by ``BatchedMarlinExperts.apply``: the same rule on the load
  ``min(max(ceil(topk_ids.numel() * num_dispatchers / G), 1), capacity)``, G the global expert count (the
  local one when G is -1); called directly (no load known): on the capacity, as before.
"""

from ci.moe import spec

NAME = "tile-oracle"
UPSTREAM = "none yet: the gate's tile oracle (docs/tile-oracle.md), on top of vLLM PR #48144"
SUMMARY = "#48144 + the 48-row tile at 90.5-181 rows per expert (16-bit inputs) + the batched tile from the load"
CHANGES_NON_EP = True
CHANGES_EP = True
CHANGES_BATCHED = True
OVERRIDE_FROM, OVERRIDE_BELOW, OVERRIDE_TILE = 90.5, 181.0, 48  # the fitted override (ci.kernel.tile_oracle)


def _with_override(tile, rows_per_expert, input_itemsize):
    if OVERRIDE_FROM <= rows_per_expert < OVERRIDE_BELOW and input_itemsize != 1:
        return OVERRIDE_TILE
    return tile


def fused_block_size_m(*, m, topk, local_experts, global_experts, input_itemsize, env):
    m_used = spec.estimated_tokens(m, local_experts, global_experts)
    tile = spec.pick_block_size_m(m_used, topk, local_experts, input_itemsize)
    return _with_override(tile, m_used * topk / local_experts, input_itemsize)


def batched_block_size_m(*, capacity, assignments, num_dispatchers, global_experts, local_experts, input_itemsize, env):
    load = spec.batched_load(
        capacity=capacity,
        assignments=assignments,
        num_dispatchers=num_dispatchers,
        global_experts=global_experts,
        local_experts=local_experts,
    )
    return _with_override(spec.pick_block_size_m(load, 1, 1, input_itemsize), load, input_itemsize)
