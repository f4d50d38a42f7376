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
* Releases: #48144 is in vLLM from 0.26.0 on (:func:`release_has_48144`), so a release's own rule is the patched
  one from there; a base built by taking #48144 out of such a release follows the base rule again.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import PurePath

BLOCK_SIZES_M = (8, 16, 32, 48, 64)
SATURATION = Fraction(9, 10)  # a tile is "full enough" below 0.9 tokens per row slot
MIN_BLOCK_SIZE_M_1_BYTE_INPUT = 16
NON_EP = -1  # global_num_experts of callers without expert parallelism
FIRST_RELEASE_WITH_48144 = (0, 26, 0)  # vLLM PR #48144 shipped in 0.26.0 (and every release after it)
CHANGE_48144 = "marlin-ep-m-estimate"  # its name in ci/changes/


def release_has_48144(version: str) -> bool:
    """Whether vLLM ``version`` (a release, an rc or a dev build of main) holds #48144 in its published code."""
    parts = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if parts is None:
        raise ValueError(f"vLLM version {version!r} is not of the form X.Y[.Z]")
    return tuple(int(x or 0) for x in parts.groups()) >= FIRST_RELEASE_WITH_48144


def base_rules(version: str, *, reverse: bool, patch_path: str, overlaid: bool) -> dict[str, bool]:
    """The rules a base tree may follow, by name -> ``patched`` (for :func:`expected_block_size_m`).

    A release as published follows its own rule: #48144's from 0.26.0 on, unless the build took #48144 out
    (the change under test is #48144, reverse-applied: the base rule again). A base that overlays a checkout
    (``--vllm-src``: a branch's merge-base) has that checkout's code, which the release's version cannot tell:
    either rule (the caller requires every case to follow the same one)."""
    if overlaid:
        return {"0.25.1's": False, "#48144's": True}
    took_out = reverse and CHANGE_48144 in PurePath(patch_path).parts
    return {"#48144's": True} if release_has_48144(version) and not took_out else {"0.25.1's": False}


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


def batched_load(
    *, capacity: int, assignments: int | None, num_dispatchers: int, global_experts: int, local_experts: int
) -> int:
    """The rows per expert a load-keyed batched rule (#56744-like) picks from: ``ceil(assignments *
    num_dispatchers / G)`` (G the global expert count, the local one when it is -1), at least 1 and at most the
    capacity; a direct caller (``assignments`` None: no load known) gets the capacity."""
    if assignments is None:
        return capacity
    experts = global_experts if global_experts > 0 else local_experts
    return min(max(-(-assignments * num_dispatchers // experts), 1), capacity)
