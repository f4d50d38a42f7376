"""Contract of ``batched-large-tile``, a regression example: the batched path always runs the 64-row tile.

* ``fused_marlin_moe``: unchanged (kernel arguments must stay the base's, EP or not).
* ``batched_fused_marlin_moe`` (direct or through ``BatchedMarlinExperts.apply``): 64, whatever the capacity
  or the input dtype (64 keeps the 1-byte floor of 16).
"""

NAME = "batched-large-tile"
UPSTREAM = "none: a regression example for the kernel bench's small-capacity cases"
SUMMARY = "batched Marlin tile fixed at 64 (slower below a capacity of 58 rows per expert)"
CHANGES_NON_EP = False
CHANGES_EP = False
CHANGES_BATCHED = True


def batched_block_size_m(*, capacity, assignments, num_dispatchers, global_experts, local_experts, input_itemsize, env):
    return 64
