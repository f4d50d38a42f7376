"""The experts' weights of one rank for vLLM's Marlin MoE kernels, in Marlin's packed layout.

* :func:`quantized_experts`: real quantized weights of a :class:`ci.kernel.formats.Format` through vLLM's own
  helpers (``marlin_utils_test``, ``marlin_utils_fp8``, ``marlin_utils_fp4``), with their dequantized float
  reference (the GPU suite's).
* :func:`random_packed_experts`: random bits in Marlin's packed layout (the bench's: the kernels' speed does not
  depend on the values).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ci.kernel.formats import GPTQ_INT4_G128, Format, QuantScheme
from ci.moe.shapes import Shape


@dataclass
class Experts:
    """One set of expert weights in Marlin's layout (``w*_ref``: dequantized, for the reference)."""

    scheme: QuantScheme
    quant_type_id: int
    w1: torch.Tensor
    w2: torch.Tensor
    s1: torch.Tensor
    s2: torch.Tensor
    zeros1: torch.Tensor | None = None
    zeros2: torch.Tensor | None = None
    g_idx1: torch.Tensor | None = None
    g_idx2: torch.Tensor | None = None
    sort1: torch.Tensor | None = None
    sort2: torch.Tensor | None = None
    global_scale1: torch.Tensor | None = None  # NVFP4: one float32 per expert
    global_scale2: torch.Tensor | None = None
    bias1: torch.Tensor | None = None  # (E, 2N), Marlin-permuted (gpt-oss)
    bias2: torch.Tensor | None = None  # (E, K)
    w1_ref: torch.Tensor | None = None
    w2_ref: torch.Tensor | None = None
    bias1_ref: torch.Tensor | None = None  # the biases in their natural order, for the reference
    bias2_ref: torch.Tensor | None = None
    # W4A8-int8 with grouped scales: the scales are int16 codes and these float32 factors (one per GEMM,
    # shared by every expert) carry their magnitude (vLLM's marlin_act_int8_process_scales)
    input_global_scale1: torch.Tensor | None = None
    input_global_scale2: torch.Tensor | None = None

    PER_EXPERT = (
        "w1",
        "w2",
        "s1",
        "s2",
        "zeros1",
        "zeros2",
        "g_idx1",
        "g_idx2",
        "sort1",
        "sort2",
        "global_scale1",
        "global_scale2",
        "bias1",
        "bias2",
        "w1_ref",
        "w2_ref",
        "bias1_ref",
        "bias2_ref",
    )

    def select(self, local_ids: torch.Tensor) -> Experts:
        """The experts a rank holds, in its local order."""

        def pick(t):
            if t is None or t.numel() == 0:
                return None
            if t.dtype.is_floating_point and t.element_size() == 1:  # FP8/E8M0 scales: index their bytes
                return t.view(torch.uint8)[local_ids].contiguous().view(t.dtype)
            return t[local_ids].contiguous()

        return Experts(
            scheme=self.scheme,
            quant_type_id=self.quant_type_id,
            input_global_scale1=self.input_global_scale1,
            input_global_scale2=self.input_global_scale2,
            **{k: pick(getattr(self, k)) for k in self.PER_EXPERT},
        )

    def kwargs(self) -> dict:
        """The weight arguments of fused_marlin_moe."""
        return dict(
            w1=self.w1,
            w2=self.w2,
            bias1=self.bias1,
            bias2=self.bias2,
            w1_scale=self.s1,
            w2_scale=self.s2,
            quant_type_id=self.quant_type_id,
            w1_zeros=self.zeros1,
            w2_zeros=self.zeros2,
            g_idx1=self.g_idx1,
            g_idx2=self.g_idx2,
            sort_indices1=self.sort1,
            sort_indices2=self.sort2,
            global_scale1=self.global_scale1,
            global_scale2=self.global_scale2,
            input_global_scale1=self.input_global_scale1,
            input_global_scale2=self.input_global_scale2,
            is_k_full=True,
        )


def _scalar_type(name: str):
    from vllm.scalar_type import scalar_types

    return getattr(scalar_types, name)


INPUT_DTYPES = {None: None, "int8": torch.int8, "fp8": torch.float8_e4m3fn}


def input_dtype_of(fmt: Format) -> torch.dtype | None:
    return INPUT_DTYPES[fmt.input_dtype]


def _quantize_one(w: torch.Tensor, scheme: QuantScheme, input_dtype: torch.dtype | None) -> tuple:
    """w: (out, in) in the activation dtype -> (ref (out, in), qweight, scales, zeros, g_idx, sort, global)."""
    from vllm.model_executor.layers.quantization.utils import marlin_utils_test as mt

    qt = _scalar_type(scheme.quant_type)
    if scheme.fp4:
        from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4 as fp4

        if scheme.has_global_scale:
            ref, q, s, gs = fp4.rand_marlin_weight_nvfp4_like(w, scheme.group_size, input_dtype=input_dtype)
        else:
            (ref, q, s), gs = fp4.rand_marlin_weight_mxfp4_like(w, scheme.group_size, input_dtype=input_dtype), None
        return ref.T, q, s, None, None, None, gs
    if scheme.quant_type == "float8_e4m3fn":
        from vllm.model_executor.layers.quantization.utils.marlin_utils_fp8 import marlin_quant_fp8_torch

        ref, q, s = marlin_quant_fp8_torch(w, scheme.group_size, input_dtype=input_dtype)
        return ref.T, q, s, None, None, None, None
    if scheme.has_zero_points:
        ref, q, s, z = mt.awq_marlin_quantize(w.T, qt, scheme.group_size, input_dtype=input_dtype)
        return ref.T, q, s, z, None, None, None
    perm = torch.randperm(w.shape[1])
    ref, q, s, g_idx, sort, _ = mt.marlin_quantize(
        w.T, qt, scheme.group_size, scheme.act_order, perm, input_dtype=input_dtype
    )
    return ref.T, q, s, None, g_idx, sort, None


def _stack(items: list) -> torch.Tensor | None:
    if items[0] is None or items[0].numel() == 0:
        return None
    if items[0].dtype.is_floating_point and items[0].element_size() == 1:  # FP8/E8M0 scales: stack their bytes
        return torch.stack([t.view(torch.uint8) for t in items]).contiguous().view(items[0].dtype)
    return torch.stack(items).contiguous()


def quantized_experts(
    shape: Shape, fmt: Format | QuantScheme, dtype: torch.dtype, *, seed: int, keep_ref: bool = True
) -> Experts:
    """Random weights (~N(0, 0.1)), quantized by vLLM's own Marlin helpers, on the GPU (FP4: vLLM's random
    FP4 codes, scaled like the weights). A bare scheme is the 16-bit-input format of that scheme.
    ``keep_ref=False``: no dequantized copy (the bench only times)."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils import (
        marlin_act_int8_process_scales,
        marlin_permute_bias,
    )

    fmt = fmt if isinstance(fmt, Format) else Format(fmt.name, fmt.name)
    scheme, input_dtype = fmt.quant, input_dtype_of(fmt)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    torch.manual_seed(seed)  # the FP4 helpers and the act-order permutation draw from the global generators
    k, n, g = shape.hidden, shape.intermediate, shape.experts
    cols: dict[str, list] = {}
    for name, out_dim, in_dim in (("1", 2 * n, k), ("2", k, n)):
        for _ in range(g):
            w = (torch.randn(out_dim, in_dim, device="cuda", generator=gen) / 10).to(dtype)
            parts = _quantize_one(w, scheme, input_dtype)
            for key, part in zip(("ref", "q", "s", "z", "g", "sort", "gs"), parts, strict=True):
                cols.setdefault(key + name, []).append(part if keep_ref or key != "ref" else None)
            if fmt.bias:
                b = torch.randn(out_dim, device="cuda", generator=gen).to(dtype)  # O(1), like gpt-oss's
                cols.setdefault("b" + name, []).append(b)
    experts = Experts(
        scheme=scheme,
        quant_type_id=_scalar_type(scheme.quant_type).id,
        **{
            f"{attr}{i}": _stack(cols[f"{key}{i}"])
            for i in "12"
            for attr, key in (
                ("w", "q"),
                ("s", "s"),
                ("zeros", "z"),
                ("g_idx", "g"),
                ("sort", "sort"),
                ("global_scale", "gs"),
            )
        },
        **{f"w{i}_ref": _stack(cols[f"ref{i}"]) if keep_ref else None for i in "12"},
    )
    if fmt.bias:
        for i in "12":
            ref = _stack(cols[f"b{i}"])
            setattr(experts, f"bias{i}_ref", ref)
            setattr(experts, f"bias{i}", torch.stack([marlin_permute_bias(b) for b in ref]).contiguous())
    if fmt.input_dtype == "int8" and scheme.group_size != -1:
        for i in "12":
            codes, factor = marlin_act_int8_process_scales(getattr(experts, f"s{i}"))
            setattr(experts, f"s{i}", codes)
            setattr(experts, f"input_global_scale{i}", factor)
    return experts


def random_packed_experts(
    shape: Shape, dtype: torch.dtype, *, local_experts: int, seed: int, fmt: Format | None = None
) -> Experts:
    """Weights for timing only (the kernels' speed does not depend on the values): GPTQ int4/int8 and FP8
    group-128 random bits in Marlin's packed layout (FP8 without NaN codes), with int16 scale codes for int8
    inputs (W4A8-int8); FP4
    formats through vLLM's own random-FP4 helpers (their scales must be valid FP8/E8M0 numbers)."""
    if fmt is not None and fmt.quant.fp4:
        small = Shape(shape.name, shape.hidden, shape.intermediate, local_experts, shape.topk)
        return quantized_experts(small, fmt, dtype, seed=seed, keep_ref=False)
    scheme = GPTQ_INT4_G128 if fmt is None else fmt.quant
    if fmt is not None and (
        scheme.group_size != 128
        or scheme.act_order
        or scheme.has_zero_points
        or (scheme.bits == 4 and scheme.name != GPTQ_INT4_G128.name)
    ):
        raise ValueError(f"format {fmt.name}: timing weights are made for GPTQ int4/int8 g128, FP8 g128 and FP4 only")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    k, n, e, group = shape.hidden, shape.intermediate, local_experts, scheme.group_size
    per_int32 = 32 // scheme.bits  # values packed in one int32

    def bits(*size):
        if scheme.quant_type == "float8_e4m3fn":  # random FP8 codes, NaN codes (0x7F, 0xFF) replaced by zero
            b = torch.randint(0, 256, (*size[:-1], size[-1] * 4), device="cuda", dtype=torch.uint8, generator=gen)
            return b.masked_fill_((b & 0x7F) == 0x7F, 0).view(torch.int32)
        return torch.randint(-(2**31), 2**31 - 1, size, device="cuda", dtype=torch.int32, generator=gen)

    def scales(*size):
        if fmt is not None and fmt.input_dtype == "int8":  # int16 codes (as marlin_act_int8_process_scales)
            return torch.randint(1024, 4097, size, device="cuda", dtype=torch.int16, generator=gen).view(dtype)
        return (torch.rand(*size, device="cuda", generator=gen) * 0.02 + 0.005).to(dtype)

    int8_factor = None
    if fmt is not None and fmt.input_dtype == "int8":
        int8_factor = torch.tensor(0.02 / 4096, device="cuda", dtype=torch.float32)
    return Experts(
        scheme=scheme,
        quant_type_id=_scalar_type(scheme.quant_type).id,
        w1=bits(e, k // 16, 2 * n * 16 // per_int32),  # Marlin's tiles of 16 rows: (K/16, 2N * 16 / per int32)
        w2=bits(e, n // 16, k * 16 // per_int32),
        s1=scales(e, k // group, 2 * n),
        s2=scales(e, n // group, k),
        input_global_scale1=int8_factor,
        input_global_scale2=int8_factor,
    )
