"""The Triton fused-MoE config choice as specified: which config ``fused_experts_impl`` launches with.

vLLM 0.25.1 (``fused_moe/fused_moe.py``: ``try_get_optimal_moe_config``, ``get_moe_configs``,
``get_default_config``), written down from its rules, independently of its code, so the gate can check a
candidate's choice against it:

1. An override (``fused_moe.override_config``) wins.
2. Else the tuned table of the device, if a file is there: ``E=<E>,N=<N>,device_name=<device>[,dtype=<d>]
   [,block_shape=[n,k]].json`` (``E``, ``N`` from ``w2``: local experts and the intermediate size, ``N`` doubled
   for ``int4_w4a16``; any device of the H200 family reads the H200's), the user's folder
   (``VLLM_TUNED_CONFIG_FOLDER``) before vLLM's own; the entry whose batch size is nearest to ``M`` (the first
   of equals, in the file's order). Under ``VLLM_BATCH_INVARIANT`` no table is read.
3. Else the default config for ``M`` (below).

``M`` is the number of rows ``fused_experts_impl`` receives (``hidden_states.size(0)``): under DP/EP the
all-gathered, padded rows of every rank, while one rank's ``E`` local experts see about ``M * E / G`` of them
(``G``: ``global_num_experts``), the shape of the Marlin bug #48144 fixed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SPEC_OF = ("0.25.1",)  # the releases whose rules this is (0.33.0 adds GROUP_SIZE_M to the WNA16 CUDA config)
NON_EP = -1  # global_num_experts of a caller without expert parallelism
BATCH_INVARIANT_CONFIG = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "SPLIT_K": 1}
WNA16_CUDA_GROUP_SIZES = (32, 64, 128)


def config_file_name(experts: int, n: int, dtype: str | None, block_shape: Sequence[int] | None, device: str) -> str:
    """The tuned table's file name for this shape on ``device`` (the device name as the platform gives it)."""
    name = device.replace(" ", "_")
    if "H200" in name.split("_"):
        name = "NVIDIA_H200"
    kind = f",dtype={dtype}" if dtype else ""
    shape = f",block_shape=[{block_shape[0]},{block_shape[1]}]" if block_shape and all(block_shape) else ""
    return f"E={experts},N={n},device_name={name}{kind}{shape}.json"


def table_shape(w2_shape: Sequence[int], dtype: str | None) -> tuple[int, int]:
    """(E, N) of the tuned table for ``w2`` of shape (E, K, N): ``int4_w4a16`` packs two values a byte."""
    experts, _, n = w2_shape
    return experts, n * 2 if dtype == "int4_w4a16" else n


def nearest_entry(table: Mapping[int, dict], m: int) -> dict:
    """The entry of the batch size nearest to ``m``; of equally near ones, the first in the table's order."""
    best = None
    for size in table:
        if best is None or abs(size - m) < abs(best - m):
            best = size
    if best is None:
        raise ValueError("a tuned table with no entry")
    return table[best]


def wna16_uses_cuda(valid_tokens: int, group_size: int, experts: int, bit: int, *, cuda: bool = True) -> bool:
    """Whether the WNA16 MoE runs vLLM's CUDA kernel rather than Triton's (few tokens an expert, int4)."""
    return cuda and bit == 4 and group_size in WNA16_CUDA_GROUP_SIZES and valid_tokens / experts <= 6


def default_config(m: int, experts: int, n: int, k: int, topk: int, dtype: str | None,
                   block_shape: Sequence[int] | None = None, *, batch_invariant: bool = False, rocm: bool = False,
                   cuda: bool = True) -> dict:  # fmt: skip
    """The config without a tuned table (``k`` is unused by 0.25.1's rules, kept as its signature has it)."""
    if batch_invariant:
        return dict(BATCH_INVARIANT_CONFIG)
    if dtype == "fp8_w8a8" and block_shape is not None:
        if rocm:
            block_n, stages = block_shape[0], 2
        elif m <= 8 and block_shape[0] % 64 == 0:
            block_n, stages = 64, (4 if m <= 4 else 3)
        else:
            block_n, stages = block_shape[0], 3
        return {"BLOCK_SIZE_M": 16 if m <= 64 else 64, "BLOCK_SIZE_N": block_n, "BLOCK_SIZE_K": block_shape[1],
                "GROUP_SIZE_M": 1 if m <= 16 else 32, "SPLIT_K": 1, "num_warps": 4, "num_stages": stages}  # fmt: skip
    if dtype in ("int4_w4a16", "int8_w8a16") and block_shape is not None:
        bit = 4 if dtype == "int4_w4a16" else 8
        if wna16_uses_cuda(m * topk, block_shape[1], experts, bit, cuda=cuda and not rocm):
            return {"BLOCK_SIZE_M": min(16, m), "SPLIT_K": 1}
        tile = 16 if m <= 20 else 32 if m <= 40 else 64
        return {"BLOCK_SIZE_M": tile, "GROUP_SIZE_M": 1, "SPLIT_K": 1}
    tile_m = 16 if m <= 32 else 32 if m <= 96 else 64 if m <= 512 else 128
    return {
        "BLOCK_SIZE_M": tile_m,
        "BLOCK_SIZE_N": 64 if m <= 64 else 128,
        "BLOCK_SIZE_K": 128 if dtype == "fp8_w8a8" or m <= 64 else 64,
        "GROUP_SIZE_M": 16 if m // max(experts, 1) > 128 else 1,
        "SPLIT_K": 1,
        "num_warps": 4 if m <= 128 else 8,
        "num_stages": 2 if rocm else 4 if m <= 32 else 3,
    }


def expected_config(w1_shape: Sequence[int], w2_shape: Sequence[int], topk: int, dtype: str | None, m: int,
                    block_shape: Sequence[int] | None = None, *, tables: Sequence[Mapping[int, dict] | None] = (),
                    override: dict | None = None, batch_invariant: bool = False, rocm: bool = False,
                    cuda: bool = True) -> dict:  # fmt: skip
    """The config ``try_get_optimal_moe_config`` returns for ``m`` rows. ``tables``: the tuned tables found for
    this shape, in the order vLLM looks (the user's folder, then its own; None where no file is)."""
    if override:
        return override
    experts, n = table_shape(w2_shape, dtype)
    if not batch_invariant:
        for table in tables:
            if table:
                return nearest_entry(table, m)
    return default_config(m, experts, n, w1_shape[2], topk, dtype, block_shape, batch_invariant=batch_invariant,
                          rocm=rocm, cuda=cuda)  # fmt: skip


def rows_one_rank_sees(m: int, local_experts: int, global_experts: int) -> int:
    """About how many of ``m`` padded rows reach one EP rank's experts: ``ceil(m * E / G)`` (``m`` without EP)."""
    if global_experts == NON_EP or global_experts <= 0:
        return m
    return -(-m * local_experts // global_experts)
