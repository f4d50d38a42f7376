"""Inputs for vLLM's fused_marlin_moe as one EP rank sees them (shared by the GPU suite and the bench).

* :class:`Shape` and :class:`QuantScheme`: model shapes and Marlin weight formats.
* :func:`quantized_experts`: real quantized weights through vLLM's own test helpers
  (``marlin_utils_test``), with their dequantized float reference.
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

from ci.shapes import Shape

MARLIN_MULTIPLE = 128  # Marlin needs K and N to be multiples of min_thread_k = 128


@dataclass(frozen=True)
class QuantScheme:
    name: str
    quant_type: str  # a vllm.scalar_type.scalar_types attribute
    group_size: int
    act_order: bool = False

    @property
    def has_zero_points(self) -> bool:
        return self.quant_type == "uint4"

    @property
    def bits(self) -> int:
        return 8 if self.quant_type in ("uint8b128", "float8_e4m3fn") else 4


GPTQ_INT4_G128 = QuantScheme("gptq-int4-g128", "uint4b8", 128)
QUANT_SCHEMES = (
    GPTQ_INT4_G128,
    QuantScheme("gptq-int4-g32", "uint4b8", 32),
    QuantScheme("gptq-int4-channel", "uint4b8", -1),
    QuantScheme("gptq-int4-g128-actorder", "uint4b8", 128, act_order=True),
    QuantScheme("gptq-int4-g32-actorder", "uint4b8", 32, act_order=True),
    QuantScheme("awq-int4-g128", "uint4", 128),
    QuantScheme("gptq-int8-g128", "uint8b128", 128),
    QuantScheme("fp8-g128", "float8_e4m3fn", 128),
    QuantScheme("fp8-channel", "float8_e4m3fn", -1),
)


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
    w1_ref: torch.Tensor | None = None
    w2_ref: torch.Tensor | None = None

    def select(self, local_ids: torch.Tensor) -> Experts:
        """The experts a rank holds, in its local order."""

        def pick(t):
            return None if t is None or t.numel() == 0 else t[local_ids].contiguous()

        return Experts(
            scheme=self.scheme,
            quant_type_id=self.quant_type_id,
            **{k: pick(getattr(self, k)) for k in ("w1", "w2", "s1", "s2", "zeros1", "zeros2", "g_idx1", "g_idx2")},
            **{k: pick(getattr(self, k)) for k in ("sort1", "sort2", "w1_ref", "w2_ref")},
        )

    def kwargs(self) -> dict:
        """The weight arguments of fused_marlin_moe."""
        return dict(
            w1=self.w1,
            w2=self.w2,
            bias1=None,
            bias2=None,
            w1_scale=self.s1,
            w2_scale=self.s2,
            quant_type_id=self.quant_type_id,
            w1_zeros=self.zeros1,
            w2_zeros=self.zeros2,
            g_idx1=self.g_idx1,
            g_idx2=self.g_idx2,
            sort_indices1=self.sort1,
            sort_indices2=self.sort2,
            is_k_full=True,
        )


def _scalar_type(name: str):
    from vllm.scalar_type import scalar_types

    return getattr(scalar_types, name)


def _quantize_one(w: torch.Tensor, scheme: QuantScheme) -> tuple:
    """w: (out, in) in the activation dtype -> (ref (out, in), qweight, scales, zeros, g_idx, sort)."""
    from vllm.model_executor.layers.quantization.utils import marlin_utils_test as mt

    qt = _scalar_type(scheme.quant_type)
    if scheme.quant_type == "float8_e4m3fn":
        from vllm.model_executor.layers.quantization.utils.marlin_utils_fp8 import marlin_quant_fp8_torch

        ref, q, s = marlin_quant_fp8_torch(w, scheme.group_size)
        return ref.T, q, s, None, None, None
    if scheme.has_zero_points:
        ref, q, s, z = mt.awq_marlin_quantize(w.T, qt, scheme.group_size)
        return ref.T, q, s, z, None, None
    perm = torch.randperm(w.shape[1])
    ref, q, s, g_idx, sort, _ = mt.marlin_quantize(w.T, qt, scheme.group_size, scheme.act_order, perm)
    return ref.T, q, s, None, g_idx, sort


def _stack(items: list) -> torch.Tensor | None:
    if items[0] is None or items[0].numel() == 0:
        return None
    return torch.stack(items).contiguous()


def quantized_experts(shape: Shape, scheme: QuantScheme, dtype: torch.dtype, *, seed: int) -> Experts:
    """Random weights (~N(0, 0.1)), quantized by vLLM's own Marlin test helpers, on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    k, n, g = shape.hidden, shape.intermediate, shape.experts
    cols: dict[str, list] = {}
    for name, out_dim, in_dim in (("1", 2 * n, k), ("2", k, n)):
        for _ in range(g):
            w = (torch.randn(out_dim, in_dim, device="cuda", generator=gen) / 10).to(dtype)
            parts = _quantize_one(w, scheme)
            for key, part in zip(("ref", "q", "s", "z", "g", "sort"), parts, strict=True):
                cols.setdefault(key + name, []).append(part)
    return Experts(
        scheme=scheme,
        quant_type_id=_scalar_type(scheme.quant_type).id,
        w1=_stack(cols["q1"]),
        w2=_stack(cols["q2"]),
        s1=_stack(cols["s1"]),
        s2=_stack(cols["s2"]),
        zeros1=_stack(cols["z1"]),
        zeros2=_stack(cols["z2"]),
        g_idx1=_stack(cols["g1"]),
        g_idx2=_stack(cols["g2"]),
        sort1=_stack(cols["sort1"]),
        sort2=_stack(cols["sort2"]),
        w1_ref=_stack(cols["ref1"]),
        w2_ref=_stack(cols["ref2"]),
    )


def random_packed_experts(shape: Shape, dtype: torch.dtype, *, local_experts: int, seed: int) -> Experts:
    """GPTQ-int4 group-128 weights of random bits in Marlin's packed layout (for timing only)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    k, n, e, group = shape.hidden, shape.intermediate, local_experts, GPTQ_INT4_G128.group_size

    def bits(*size):
        return torch.randint(-(2**31), 2**31 - 1, size, device="cuda", dtype=torch.int32, generator=gen)

    def scales(*size):
        return (torch.rand(*size, device="cuda", generator=gen) * 0.02 + 0.005).to(dtype)

    return Experts(
        scheme=GPTQ_INT4_G128,
        quant_type_id=_scalar_type(GPTQ_INT4_G128.quant_type).id,
        w1=bits(e, k // 16, 2 * n * 2),  # 4-bit: (K/16, 2N * 16 / 8)
        w2=bits(e, n // 16, k * 2),
        s1=scales(e, k // group, 2 * n),
        s2=scales(e, n // group, k),
    )


@dataclass
class Routing:
    hidden: torch.Tensor  # (rows, K)
    topk_weights: torch.Tensor  # float32 (rows, topk)
    topk_ids: torch.Tensor  # int32 global expert ids (rows, topk)
    valid: torch.Tensor  # bool (rows,): False for DP padding rows


def route(rows: int, shape: Shape, dtype: torch.dtype, *, seed: int, valid_rows: int | None = None) -> Routing:
    """Softmax top-k routing over the global experts; rows past ``valid_rows`` are zero padding."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hidden = (torch.randn(rows, shape.hidden, device="cuda", generator=gen) / 10).to(dtype)
    scores = torch.randn(rows, shape.experts, device="cuda", generator=gen).softmax(dim=-1)
    weights, ids = scores.topk(shape.topk, dim=-1)
    valid = torch.ones(rows, dtype=torch.bool, device="cuda")
    if valid_rows is not None:
        valid[valid_rows:] = False
        hidden[~valid] = 0
    return Routing(hidden=hidden.contiguous(), topk_weights=weights.float(), topk_ids=ids.to(torch.int32), valid=valid)


def dp_padded_routing(tokens: list[int], shape: Shape, dtype: torch.dtype, *, seed: int) -> Routing:
    """The rows every rank sees under DP: each rank's tokens padded to the largest count, concatenated."""
    pad_to = max(tokens)
    parts = [route(pad_to, shape, dtype, seed=seed + r, valid_rows=t) for r, t in enumerate(tokens)]
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
                    input_dtype: torch.dtype | None = None):  # fmt: skip
    """A ``BatchedMarlinExperts`` of ``module`` holding ``experts``, made without its ``__init__`` (building a real
    one needs a whole model config): the values ``apply`` reads shadow the class's properties of the same name
    (quant_type_id, w1_scale, ...), its methods are vLLM's own, and an attribute a release adds (e.g.
    ``activation_config`` in 0.33.0) reads as None, its default."""

    def missing(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    values = dict(
        w1_bias=None, w2_bias=None, w1_scale=experts.s1, w2_scale=experts.s2,
        quant_type_id=experts.quant_type_id, a1_gscale=None, a2_gscale=None,
        w13_g_idx=experts.g_idx1, w2_g_idx=experts.g_idx2,
        w13_g_idx_sort_indices=experts.sort1, w2_g_idx_sort_indices=experts.sort2,
        w1_zp=experts.zeros1, w2_zp=experts.zeros2, input_dtype=input_dtype, is_k_full=True,
        gemm1_clamp_limit=None, gemm1_alpha=1.0, gemm1_beta=0.0,
        num_dispatchers=num_dispatchers, max_num_tokens=max_num_tokens,
    )  # fmt: skip
    cls = type("BatchedMarlinExpertsStandIn", (module.BatchedMarlinExperts,), {**values, "__getattr__": missing})
    return object.__new__(cls)


def call_batched(module: ModuleType, caller, w1: torch.Tensor, w2: torch.Tensor,
                 batched: Batched, *, global_num_experts: int, topk_weights: torch.Tensor | None = None,
                 expert_map: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """vLLM's ``BatchedMarlinExperts.apply`` of ``module`` (the DeepEP low-latency caller): (E, capacity, K)."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    return module.BatchedMarlinExperts.apply(
        caller, output=None, hidden_states=batched.hidden, w1=w1, w2=w2,
        topk_weights=topk_weights, topk_ids=batched.topk_ids, activation=MoEActivation.SILU,
        global_num_experts=global_num_experts, expert_map=expert_map, a1q_scale=None, a2_scale=None,
        workspace13=None, workspace2=None, expert_tokens_meta=SimpleNamespace(expert_num_tokens=batched.counts),
        apply_router_weight_on_input=False,
    )  # fmt: skip


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

    module.moe_align_block_size, module.batched_moe_align_block_size = align_forced, batched_align_forced
    module._fused_marlin_moe = kernel_forced
    try:
        yield
    finally:
        module.moe_align_block_size, module.batched_moe_align_block_size, module._fused_marlin_moe = (
            align, batched_align, kernel)  # fmt: skip


@contextlib.contextmanager
def recorded_block_size(module: ModuleType) -> Iterator[list[int]]:
    """Record the ``block_size_m`` the module's own heuristic picks, on either path (calls pass through)."""
    seen: list[int] = []
    kernel = module._fused_marlin_moe

    def kernel_recording(*args, **kwargs):
        seen.append(kwargs["block_size_m"])
        return kernel(*args, **kwargs)

    module._fused_marlin_moe = kernel_recording
    try:
        yield seen
    finally:
        module._fused_marlin_moe = kernel
