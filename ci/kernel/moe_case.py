"""Inputs for vLLM's fused_marlin_moe as one EP rank sees them (shared by the GPU suite and the bench).

* :func:`quantized_experts`: real quantized weights of a :class:`ci.kernel.formats.Format` through vLLM's own
  helpers (``marlin_utils_test``, ``marlin_utils_fp8``, ``marlin_utils_fp4``), with their dequantized float
  reference; :func:`format_kwargs`: the activation arguments the format adds to a call.
* :func:`random_packed_experts`: random bits in Marlin's packed layout (for timing only:
  the kernels' speed does not depend on the values).
* :func:`route` and :func:`rank_view`: top-k routing over the global experts, the DP-padded
  rows a rank sees, and that rank's ``expert_map`` from vLLM's ``determine_expert_map``.
* :func:`batched_by_expert` and :func:`call_batched`: the batched path (DeepEP low latency), tokens
  grouped per expert and padded to a capacity, through vLLM's own ``BatchedMarlinExperts.apply``.
* :func:`forced_block_size`: run either path with ``block_size_m`` pinned, by wrapping the callees that
  receive it (nothing else of vLLM's code changes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace

import torch

from ci.kernel.formats import GPT_OSS_ALPHA, GPT_OSS_BETA, GPT_OSS_CLAMP, GPTQ_INT4_G128, Format, QuantScheme
from ci.kernel.shapes import Shape


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

    PER_EXPERT = ("w1", "w2", "s1", "s2", "zeros1", "zeros2", "g_idx1", "g_idx2", "sort1", "sort2", "global_scale1",
                  "global_scale2", "bias1", "bias2", "w1_ref", "w2_ref", "bias1_ref", "bias2_ref")  # fmt: skip

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


def format_kwargs(fmt: Format) -> dict:
    """The activation arguments ``fmt`` adds to a fused_marlin_moe call (vLLM 0.25/0.26 names): the
    activation quantization, and gpt-oss's clamped SwiGLU-OAI on the packed gate/up layout."""
    extra: dict = {"input_dtype": input_dtype_of(fmt)}
    if fmt.clamp:
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation

        extra.update(activation=MoEActivation.SWIGLUOAI_UNINTERLEAVE, clamp_limit=GPT_OSS_CLAMP,
                     gemm1_alpha=GPT_OSS_ALPHA, gemm1_beta=GPT_OSS_BETA)  # fmt: skip
    return extra


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
    ref, q, s, g_idx, sort, _ = mt.marlin_quantize(w.T, qt, scheme.group_size, scheme.act_order, perm,
                                                   input_dtype=input_dtype)  # fmt: skip
    return ref.T, q, s, None, g_idx, sort, None


def _stack(items: list) -> torch.Tensor | None:
    if items[0] is None or items[0].numel() == 0:
        return None
    if items[0].dtype.is_floating_point and items[0].element_size() == 1:  # FP8/E8M0 scales: stack their bytes
        return torch.stack([t.view(torch.uint8) for t in items]).contiguous().view(items[0].dtype)
    return torch.stack(items).contiguous()


def quantized_experts(shape: Shape, fmt: Format | QuantScheme, dtype: torch.dtype, *, seed: int,
                      keep_ref: bool = True) -> Experts:  # fmt: skip
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
        **{f"{attr}{i}": _stack(cols[f"{key}{i}"]) for i in "12" for attr, key in
           (("w", "q"), ("s", "s"), ("zeros", "z"), ("g_idx", "g"), ("sort", "sort"), ("global_scale", "gs"))},
        **{f"w{i}_ref": _stack(cols[f"ref{i}"]) if keep_ref else None for i in "12"},
    )  # fmt: skip
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


def random_packed_experts(shape: Shape, dtype: torch.dtype, *, local_experts: int, seed: int,
                          fmt: Format | None = None) -> Experts:  # fmt: skip
    """Weights for timing only (the kernels' speed does not depend on the values): GPTQ-int4 group-128
    random bits in Marlin's packed layout, with int16 scale codes for int8 inputs (W4A8-int8); FP4
    formats through vLLM's own random-FP4 helpers (their scales must be valid FP8/E8M0 numbers)."""
    if fmt is not None and fmt.quant.fp4:
        small = Shape(shape.name, shape.hidden, shape.intermediate, local_experts, shape.topk)
        return quantized_experts(small, fmt, dtype, seed=seed, keep_ref=False)
    if fmt is not None and fmt.scheme != GPTQ_INT4_G128.name:
        raise ValueError(f"format {fmt.name}: timing weights are made for GPTQ int4 g128 and FP4 only")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    k, n, e, group = shape.hidden, shape.intermediate, local_experts, GPTQ_INT4_G128.group_size

    def bits(*size):
        return torch.randint(-(2**31), 2**31 - 1, size, device="cuda", dtype=torch.int32, generator=gen)

    def scales(*size):
        if fmt is not None and fmt.input_dtype == "int8":  # int16 codes (as marlin_act_int8_process_scales)
            return torch.randint(1024, 4097, size, device="cuda", dtype=torch.int16, generator=gen).view(dtype)
        return (torch.rand(*size, device="cuda", generator=gen) * 0.02 + 0.005).to(dtype)

    int8_factor = None
    if fmt is not None and fmt.input_dtype == "int8":
        int8_factor = torch.tensor(0.02 / 4096, device="cuda", dtype=torch.float32)
    return Experts(
        scheme=GPTQ_INT4_G128,
        quant_type_id=_scalar_type(GPTQ_INT4_G128.quant_type).id,
        w1=bits(e, k // 16, 2 * n * 2),  # 4-bit: (K/16, 2N * 16 / 8)
        w2=bits(e, n // 16, k * 2),
        s1=scales(e, k // group, 2 * n),
        s2=scales(e, n // group, k),
        input_global_scale1=int8_factor,
        input_global_scale2=int8_factor,
    )


@dataclass
class Routing:
    hidden: torch.Tensor  # (rows, K)
    topk_weights: torch.Tensor  # float32 (rows, topk)
    topk_ids: torch.Tensor  # int32 global expert ids (rows, topk)
    valid: torch.Tensor  # bool (rows,): False for DP padding rows


def route(rows: int, shape: Shape, dtype: torch.dtype, *, seed: int, valid_rows: int | None = None,
          scale: float = 0.1) -> Routing:  # fmt: skip
    """Softmax top-k routing over the global experts, hidden states ~N(0, scale^2); rows past ``valid_rows``
    are zero padding."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hidden = (torch.randn(rows, shape.hidden, device="cuda", generator=gen) * scale).to(dtype)
    scores = torch.randn(rows, shape.experts, device="cuda", generator=gen).softmax(dim=-1)
    weights, ids = scores.topk(shape.topk, dim=-1)
    valid = torch.ones(rows, dtype=torch.bool, device="cuda")
    if valid_rows is not None:
        valid[valid_rows:] = False
        hidden[~valid] = 0
    return Routing(hidden=hidden.contiguous(), topk_weights=weights.float(), topk_ids=ids.to(torch.int32), valid=valid)


def dp_padded_routing(tokens: list[int], shape: Shape, dtype: torch.dtype, *, seed: int,
                      scale: float = 0.1) -> Routing:  # fmt: skip
    """The rows every rank sees under DP: each rank's tokens padded to the largest count, concatenated."""
    pad_to = max(tokens)
    parts = [route(pad_to, shape, dtype, seed=seed + r, valid_rows=t, scale=scale) for r, t in enumerate(tokens)]
    return Routing(
        hidden=torch.cat([p.hidden for p in parts]).contiguous(),
        topk_weights=torch.cat([p.topk_weights for p in parts]),
        topk_ids=torch.cat([p.topk_ids for p in parts]),
        valid=torch.cat([p.valid for p in parts]),
    )


@dataclass
class RankView:
    rank: int
    local_ids: torch.Tensor  # global ids of the rank's experts, in local order
    expert_map: torch.Tensor | None  # (G,) global -> local or -1; None without EP


def rank_view(experts: int, ep: int, rank: int, *, strategy: str = "linear") -> RankView:
    """vLLM's own expert placement for one rank (uneven splits as vLLM makes them)."""
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

    if ep == 1:
        return RankView(rank=0, local_ids=torch.arange(experts, device="cuda"), expert_map=None)
    _, expert_map, _ = determine_expert_map(ep, rank, experts, expert_placement_strategy=strategy)
    expert_map = expert_map.cuda()
    local = torch.nonzero(expert_map >= 0).flatten()
    order = torch.argsort(expert_map[local])
    return RankView(rank=rank, local_ids=local[order], expert_map=expert_map)


def call_moe(module: ModuleType, experts: Experts, routing: Routing, *, global_num_experts: int,
             expert_map: torch.Tensor | None, **extra) -> torch.Tensor:  # fmt: skip
    """vLLM's fused_marlin_moe of ``module`` on these weights and rows."""
    return module.fused_marlin_moe(
        hidden_states=routing.hidden,
        topk_weights=routing.topk_weights,
        topk_ids=routing.topk_ids,
        global_num_experts=global_num_experts,
        expert_map=expert_map,
        **experts.kwargs(),
        **extra,
    )


@dataclass
class Batched:
    """Tokens grouped per expert, as DeepEP low latency hands them to the batched experts."""

    hidden: torch.Tensor  # (E, capacity, K); rows past counts[e] are padding
    counts: torch.Tensor  # int32 (E,): valid rows per expert
    rows: torch.Tensor  # long (E, capacity): the token each slot holds, -1 for padding
    slots: torch.Tensor  # long (E, capacity): which of the token's top-k choices, -1 for padding
    topk_ids: torch.Tensor  # the routing of this rank's own tokens (what apply() receives)

    @property
    def capacity(self) -> int:
        return self.hidden.shape[1]


def batched_by_expert(hidden: torch.Tensor, topk_ids: torch.Tensor, experts: int, capacity: int, *,
                      own_topk_ids: torch.Tensor | None = None, expert_map: torch.Tensor | None = None,
                      ) -> Batched:  # fmt: skip
    """Group the rows of ``hidden`` by the experts of ``topk_ids`` (local ids through ``expert_map``),
    in token order, into ``capacity`` slots per expert; assignments to other ranks' experts are dropped."""
    ids = topk_ids.long() if expert_map is None else expert_map[topk_ids.long()].long()
    flat = torch.arange(ids.numel(), device=ids.device)
    e_of, row_of, slot_of = ids.flatten(), flat // ids.shape[1], flat % ids.shape[1]
    keep = e_of >= 0
    e_of, row_of, slot_of = e_of[keep], row_of[keep], slot_of[keep]
    order = torch.argsort(e_of * ids.shape[0] + row_of, stable=True)
    e_of, row_of, slot_of = e_of[order], row_of[order], slot_of[order]
    counts = torch.bincount(e_of, minlength=experts)
    if counts.numel() and int(counts.max()) > capacity:
        raise ValueError(f"an expert got {int(counts.max())} tokens, more than the capacity {capacity}")
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(e_of.numel(), device=ids.device) - starts[e_of]
    out = torch.zeros(experts, capacity, hidden.shape[1], dtype=hidden.dtype, device=hidden.device)
    rows = torch.full((experts, capacity), -1, dtype=torch.long, device=hidden.device)
    slots = torch.full((experts, capacity), -1, dtype=torch.long, device=hidden.device)
    out[e_of, pos] = hidden[row_of]
    rows[e_of, pos], slots[e_of, pos] = row_of, slot_of
    return Batched(hidden=out.contiguous(), counts=counts.to(torch.int32), rows=rows, slots=slots,
                   topk_ids=topk_ids if own_topk_ids is None else own_topk_ids)  # fmt: skip


def combine_batched(out: torch.Tensor, batched: Batched, topk_weights: torch.Tensor, tokens: int) -> torch.Tensor:
    """float32 (tokens, K): each token's router-weighted sum of its experts' rows (valid slots only)."""
    valid = batched.rows >= 0
    rows, slots = batched.rows[valid], batched.slots[valid]
    total = torch.zeros(tokens, out.shape[-1], dtype=torch.float32, device=out.device)
    total.index_add_(0, rows, out[valid].float() * topk_weights[rows, slots, None].float())
    return total


def batched_experts(module: ModuleType, experts: Experts, *, num_dispatchers: int, max_num_tokens: int,
                    fmt: Format | None = None):  # fmt: skip
    """A ``BatchedMarlinExperts`` of ``module`` holding ``experts`` (in format ``fmt``: its input dtype and
    gpt-oss clamp), made without its ``__init__`` (building a real one needs a whole model config): the
    values ``apply`` reads shadow the class's properties of the same name (quant_type_id, w1_scale, ...),
    its methods are vLLM's own, and an attribute a release adds (e.g. ``activation_config`` in 0.33.0)
    reads as None, its default."""

    def missing(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    clamp = fmt is not None and fmt.clamp
    values = dict(
        w1_bias=experts.bias1, w2_bias=experts.bias2, w1_scale=experts.s1, w2_scale=experts.s2,
        quant_type_id=experts.quant_type_id, a1_gscale=experts.input_global_scale1,
        a2_gscale=experts.input_global_scale2, g1_alphas=experts.global_scale1, g2_alphas=experts.global_scale2,
        w13_g_idx=experts.g_idx1, w2_g_idx=experts.g_idx2,
        w13_g_idx_sort_indices=experts.sort1, w2_g_idx_sort_indices=experts.sort2,
        w1_zp=experts.zeros1, w2_zp=experts.zeros2, input_dtype=None if fmt is None else input_dtype_of(fmt),
        is_k_full=True, gemm1_clamp_limit=GPT_OSS_CLAMP if clamp else None,
        gemm1_alpha=GPT_OSS_ALPHA if clamp else 1.0, gemm1_beta=GPT_OSS_BETA if clamp else 0.0,
        num_dispatchers=num_dispatchers, max_num_tokens=max_num_tokens,
    )  # fmt: skip
    cls = type("BatchedMarlinExpertsStandIn", (module.BatchedMarlinExperts,), {**values, "__getattr__": missing})
    return object.__new__(cls)


def call_batched(module: ModuleType, caller, w1: torch.Tensor, w2: torch.Tensor,
                 batched: Batched, *, global_num_experts: int, topk_weights: torch.Tensor | None = None,
                 expert_map: torch.Tensor | None = None, fmt: Format | None = None) -> torch.Tensor:  # fmt: skip
    """vLLM's ``BatchedMarlinExperts.apply`` of ``module`` (the DeepEP low-latency caller): (E, capacity, K);
    the activation is ``fmt``'s (gpt-oss: the clamped SwiGLU-OAI), else SiLU."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    activation = format_kwargs(fmt).get("activation", MoEActivation.SILU) if fmt else MoEActivation.SILU
    return module.BatchedMarlinExperts.apply(
        caller, output=None, hidden_states=batched.hidden, w1=w1, w2=w2,
        topk_weights=topk_weights, topk_ids=batched.topk_ids, activation=activation,
        global_num_experts=global_num_experts, expert_map=expert_map, a1q_scale=None, a2_scale=None,
        workspace13=None, workspace2=None, expert_tokens_meta=SimpleNamespace(expert_num_tokens=batched.counts),
        apply_router_weight_on_input=False,
    )  # fmt: skip


@contextlib.contextmanager
def swapped(owner, **replacements) -> Iterator[None]:
    """Replace attributes of ``owner`` (a vLLM module, or its ``ops``) for the block, restored on exit whatever
    happens: the one way this project patches vLLM (forcing and recording the tile, the CPU tier's spies)."""
    saved = {name: getattr(owner, name) for name in replacements}
    for name, value in replacements.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)


@contextlib.contextmanager
def forced_block_size(module: ModuleType, block_size_m: int) -> Iterator[None]:
    """Pin ``block_size_m`` for calls into ``module`` (every callee that receives it sees the same value)."""
    align, batched_align, kernel = (
        module.moe_align_block_size,
        module.batched_moe_align_block_size,
        module._fused_marlin_moe,
    )

    def align_forced(topk_ids, block_size, *args, **kwargs):
        return align(topk_ids, block_size_m, *args, **kwargs)

    def batched_align_forced(*args, **kwargs):
        kwargs["block_size"] = block_size_m
        return batched_align(*args, **kwargs)

    def kernel_forced(*args, **kwargs):
        kwargs["block_size_m"] = block_size_m
        return kernel(*args, **kwargs)

    with swapped(module, moe_align_block_size=align_forced, batched_moe_align_block_size=batched_align_forced,
                 _fused_marlin_moe=kernel_forced):  # fmt: skip
        yield


@contextlib.contextmanager
def recorded_block_size(module: ModuleType) -> Iterator[list[int]]:
    """Record the ``block_size_m`` the module's own heuristic picks, on either path (calls pass through)."""
    seen: list[int] = []
    kernel = module._fused_marlin_moe

    def kernel_recording(*args, **kwargs):
        seen.append(kwargs["block_size_m"])
        return kernel(*args, **kwargs)

    with swapped(module, _fused_marlin_moe=kernel_recording):
        yield seen
