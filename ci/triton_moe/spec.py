"""The Triton fused-MoE config choice as specified: which config ``fused_experts_impl`` launches with.

vLLM 0.25.1 (``fused_moe/fused_moe.py``: ``try_get_optimal_moe_config``, ``get_moe_configs``,
``get_default_config``), written down from its rules, independently of its code, so the gate can check a
candidate's choice against it; what later releases changed is in :data:`RULES`, one entry per release
written from that release's code, and a release not listed is recognised by its code (:func:`rules_of`):

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

import hashlib
import io
import tokenize
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Rules:
    """How a release's config choice differs from 0.25.1's (each field written from that release's code)."""

    # the WNA16 CUDA kernel's config: 0.25.1 {"BLOCK_SIZE_M": min(16, M), "SPLIT_K": 1}; 0.33.0 on
    # {"BLOCK_SIZE_M": min(16, next_power_of_2(M)), "GROUP_SIZE_M": 1, "SPLIT_K": 1}
    wna16_cuda_power_of_two: bool = False


RULES = {
    "0.25.1": Rules(),
    "0.26.0": Rules(),
    "0.33.0": Rules(wna16_cuda_power_of_two=True),
    "0.34.0": Rules(wna16_cuda_power_of_two=True),
}
SPEC_OF = tuple(RULES)  # the releases whose rules are written here
# get_default_config of each release above, as :func:`code_fingerprint` reads it: a release not in RULES whose
# default config is written as one of these follows that release's rules (the tuned tables are its own files)
DEFAULT_CONFIG_CODE = {
    "0.25.1": "323a17d792c9899a",
    "0.26.0": "323a17d792c9899a",
    "0.33.0": "cc56ab9c515c01e5",
    "0.34.0": "cc56ab9c515c01e5",
}
NON_EP = -1  # global_num_experts of a caller without expert parallelism
BATCH_INVARIANT_CONFIG = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "SPLIT_K": 1}
WNA16_CUDA_GROUP_SIZES = (32, 64, 128)


def code_fingerprint(source: str, function: str = "get_default_config") -> str | None:
    """A digest of ``function``'s code in a module's ``source``, its tokens without comments, blank lines or
    layout (the same on every Python version); None when the module has no such function."""
    import ast

    node = next((n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == function), None)
    if node is None:
        return None
    code = "".join(source.splitlines(keepends=True)[node.lineno - 1 : node.end_lineno])
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    tokens = [t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type not in skip]
    return hashlib.sha256(" ".join(tokens).encode()).hexdigest()[:16]


def rules_of(version: str, fused_moe_source: str) -> tuple[Rules | None, str]:
    """The rules vLLM ``version`` follows and how they were found: written for it (RULES), or read from its
    code (its get_default_config is written as a specified release's); (None, why) when neither."""
    if version in RULES:
        return RULES[version], f"the rules written for vLLM {version}"
    digest = code_fingerprint(fused_moe_source)
    same = [v for v, d in DEFAULT_CONFIG_CODE.items() if d == digest]
    if same:
        return RULES[same[-1]], f"vLLM {same[-1]}'s rules: {version}'s get_default_config is written as its"
    return None, (
        f"vLLM {version}'s get_default_config differs from that of every release the spec is written "
        f"for ({', '.join(SPEC_OF)}): add its rules to RULES in ci/triton_moe/spec.py"
    )


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


def default_config(
    m: int,
    experts: int,
    n: int,
    k: int,
    topk: int,
    dtype: str | None,
    block_shape: Sequence[int] | None = None,
    *,
    batch_invariant: bool = False,
    rocm: bool = False,
    cuda: bool = True,
    rules: Rules = RULES["0.25.1"],
) -> dict:
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
        return {
            "BLOCK_SIZE_M": 16 if m <= 64 else 64,
            "BLOCK_SIZE_N": block_n,
            "BLOCK_SIZE_K": block_shape[1],
            "GROUP_SIZE_M": 1 if m <= 16 else 32,
            "SPLIT_K": 1,
            "num_warps": 4,
            "num_stages": stages,
        }
    if dtype in ("int4_w4a16", "int8_w8a16") and block_shape is not None:
        bit = 4 if dtype == "int4_w4a16" else 8
        if wna16_uses_cuda(m * topk, block_shape[1], experts, bit, cuda=cuda and not rocm):
            if rules.wna16_cuda_power_of_two:
                return {"BLOCK_SIZE_M": min(16, 1 << (m - 1).bit_length()), "GROUP_SIZE_M": 1, "SPLIT_K": 1}
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


def expected_config(
    w1_shape: Sequence[int],
    w2_shape: Sequence[int],
    topk: int,
    dtype: str | None,
    m: int,
    block_shape: Sequence[int] | None = None,
    *,
    tables: Sequence[Mapping[int, dict] | None] = (),
    override: dict | None = None,
    batch_invariant: bool = False,
    rocm: bool = False,
    cuda: bool = True,
    rules: Rules = RULES["0.25.1"],
) -> dict:
    """The config ``try_get_optimal_moe_config`` returns for ``m`` rows. ``tables``: the tuned tables found for
    this shape, in the order vLLM looks (the user's folder, then its own; None where no file is)."""
    if override:
        return override
    experts, n = table_shape(w2_shape, dtype)
    if not batch_invariant:
        for table in tables:
            if table:
                return nearest_entry(table, m)
    return default_config(
        m,
        experts,
        n,
        w1_shape[2],
        topk,
        dtype,
        block_shape,
        batch_invariant=batch_invariant,
        rocm=rocm,
        cuda=cuda,
        rules=rules,
    )


def rows_one_rank_sees(m: int, local_experts: int, global_experts: int) -> int:
    """About how many of ``m`` padded rows reach one EP rank's experts: ``ceil(m * E / G)`` (``m`` without EP)."""
    if global_experts == NON_EP or global_experts <= 0:
        return m
    return -(-m * local_experts // global_experts)
