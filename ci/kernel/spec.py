"""The block_size_m rule of fused_marlin_moe, written from its specification (vLLM PR #48144).

This is the oracle the CPU tier checks vLLM against: written from the words of the spec in
exact rational arithmetic, not copied from vLLM's code.

* Base (vLLM 0.25.1): ``block_size_m`` is the first of 8, 16, 32, 48, 64 for which
  ``M * topk / E / block_size_m < 0.9`` (64 when none is), with ``E`` the local expert count;
  a 1-byte ``input_dtype`` raises it to at least 16.
* Patched (PR #48144): before that choice, when ``global_num_experts != -1``,
  ``M = ceil(M * E / global_num_experts)`` (the valid tokens per rank under DP/EP padding).
  With ``global_num_experts == -1`` (non-EP callers) ``M`` is unchanged.
* Both: ``moe_align_block_size`` receives the global expert count (``E`` when it is -1).
"""

from __future__ import annotations

from fractions import Fraction

BLOCK_SIZES_M = (8, 16, 32, 48, 64)
SATURATION = Fraction(9, 10)  # a tile is "full enough" below 0.9 tokens per row slot
MIN_BLOCK_SIZE_M_1_BYTE_INPUT = 16
NON_EP = -1  # global_num_experts of callers without expert parallelism


def estimated_tokens(m: int, local_experts: int, global_experts: int) -> int:
    """The patch's estimate of valid rows per rank: ceil(M * E / G), or M when G == -1."""
    if global_experts == NON_EP:
        return m
    return -(-m * local_experts // global_experts)


def pick_block_size_m(m: int, topk: int, local_experts: int, input_itemsize: int | None = None) -> int:
    """The first block size whose expected fill ``M * topk / E / bm`` is under 0.9; else the largest."""
    chosen = BLOCK_SIZES_M[-1]
    for bm in BLOCK_SIZES_M:
        if Fraction(m * topk, local_experts * bm) < SATURATION:
            chosen = bm
            break
    if input_itemsize == 1:
        chosen = max(chosen, MIN_BLOCK_SIZE_M_1_BYTE_INPUT)
    return chosen


def expected_block_size_m(
    *, m: int, topk: int, local_experts: int, global_experts: int, input_itemsize: int | None, patched: bool
) -> int:
    """What vLLM should pick: the base rule, or the patched rule on the estimated M."""
    m_used = estimated_tokens(m, local_experts, global_experts) if patched else m
    return pick_block_size_m(m_used, topk, local_experts, input_itemsize)


def expected_align_experts(local_experts: int, global_experts: int) -> int:
    """The expert count ``moe_align_block_size`` must receive: the global one."""
    return local_experts if global_experts == NON_EP else global_experts


def batched_block_size_m(capacity: int, input_itemsize: int | None = None) -> int:
    """``batched_fused_marlin_moe`` (the batched, DeepEP low-latency path) in 0.25.1: the tile comes from
    each expert's capacity (``BATCH_TOKENS_MAX``, the padded rows per expert), not from the tokens routed:
    the same rule as ``pick_block_size_m`` with M * topk / E replaced by the capacity. #48144 leaves it
    alone; a change that picks from the real load (vLLM #56744) is a different rule for this path."""
    return pick_block_size_m(capacity, 1, 1, input_itemsize)
