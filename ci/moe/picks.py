"""The tile a build's own ``fused_marlin_moe`` picks for a call, found by running that build's code.

Reports say what each build did, never what the gate's copy of the rule (``ci.moe.spec``) says it should:
the call runs the build's real Python up to its aligner, ``moe_align_block_size``, which is swapped for a
recorder that stops the call there (no kernel runs, no GPU is needed), on tensors of the shapes the function
checks. The call is made as vLLM makes it: ``global_num_experts`` as the caller passes it (``E`` for a server
without EP: the modular kernel turns -1 into the local count, ``ci.kernel.callers``), an expert map under EP.
"""

from __future__ import annotations

from types import ModuleType

from ci.moe.patching import swapped

HIDDEN = 16  # K: the smallest hidden size fused_marlin_moe's checks accept (weights are never read)


class _Stop(Exception):
    """Raised by the recording aligner: the tile is known, the rest of the call is not needed."""

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size)
        self.block_size = block_size


def picked_block_size(
    module: ModuleType, *, m: int, topk: int, local_experts: int, global_num_experts: int, with_expert_map: bool = False
) -> int:
    """The ``block_size_m`` the ``fused_marlin_moe`` of ``module`` gives its aligner for this call (GPTQ int4,
    bf16 activations: the formats the served models use)."""
    import torch
    from vllm.scalar_type import scalar_types

    def align(topk_ids, block_size, *args, **kwargs):
        raise _Stop(int(block_size))

    e, g = local_experts, global_num_experts
    ids = (torch.arange(m * topk, dtype=torch.int32) % max(g, e)).reshape(m, topk)
    expert_map = None
    if with_expert_map:
        expert_map = torch.full((g,), -1, dtype=torch.int32)
        expert_map[:e] = torch.arange(e, dtype=torch.int32)
    kwargs = dict(
        hidden_states=torch.zeros(m, HIDDEN, dtype=torch.bfloat16),
        w1=torch.zeros(e, HIDDEN // 16, 2, dtype=torch.int32),
        w2=torch.zeros(e, 1, HIDDEN * 4 // 2, dtype=torch.int32),
        bias1=None,
        bias2=None,
        w1_scale=torch.ones(e, 1, 2, dtype=torch.bfloat16),
        w2_scale=torch.ones(e, 1, HIDDEN, dtype=torch.bfloat16),
        topk_weights=torch.full((m, topk), 1.0 / topk),
        topk_ids=ids,
        quant_type_id=scalar_types.uint4b8.id,
        global_num_experts=g,
        expert_map=expert_map,
    )
    with swapped(module, moe_align_block_size=align):
        try:
            module.fused_marlin_moe(**kwargs)
        except _Stop as stop:
            return stop.block_size
    raise RuntimeError(f"{module.__name__}.fused_marlin_moe returned without calling its aligner")
