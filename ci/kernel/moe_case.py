"""Calls of vLLM's Marlin MoE paths as one EP rank sees them (shared by the GPU suite, the CPU tier and the bench);
the experts' weights are ``ci.kernel.weights``.

* :func:`format_kwargs`: the activation arguments a format adds to a call.
* routing and a rank's view: ``ci.moe.routing``, shared with every MoE subject.
* :func:`batched_by_expert` and :func:`call_batched`: the batched path (DeepEP low latency), tokens
  grouped per expert and padded to a capacity, through vLLM's own ``BatchedMarlinExperts.apply``.
* :func:`forced_block_size`: run either path with ``block_size_m`` pinned, by wrapping the callees that
  receive it (nothing else of vLLM's code changes; ``ci.moe.patching.swapped``, the one way vLLM is patched).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace

import torch

from ci.kernel.formats import GPT_OSS_ALPHA, GPT_OSS_BETA, GPT_OSS_CLAMP, Format
from ci.kernel.weights import Experts, input_dtype_of
from ci.moe.patching import swapped
from ci.moe.routing import Routing

# gpt-oss's clamp as three arguments of fused_marlin_moe (vLLM 0.25.1 to 0.33.0); 0.34.0 takes them as one
# ApplyMoEActivationConfig (``activation_config``)
CLAMP_ARGUMENTS = ("clamp_limit", "gemm1_alpha", "gemm1_beta")
ARGUMENTS_0_25 = frozenset({"input_dtype", "activation", *CLAMP_ARGUMENTS})  # what format_kwargs assumes by default


def parameters_of(function: Callable) -> frozenset[str]:
    """The names a vLLM function takes (its signature): what the gate passes is read from the release."""
    return frozenset(inspect.signature(function).parameters)


def activation_missing(fmt: Format, takes: Collection[str]) -> list[str]:
    """The activation arguments ``fmt`` needs that a function taking ``takes`` lacks (empty: it serves them):
    ``input_dtype`` for an int8/FP8 activation (W4A8, gone in 0.34.0), and for gpt-oss's clamp either
    CLAMP_ARGUMENTS or ``activation_config``."""
    missing = []
    if fmt.input_dtype is not None and "input_dtype" not in takes:
        missing.append("input_dtype")
    if fmt.clamp and "activation" not in takes:
        missing.append("activation")
    if fmt.clamp and not (set(CLAMP_ARGUMENTS) <= set(takes) or "activation_config" in takes):
        missing.append("/".join(CLAMP_ARGUMENTS) + " or activation_config")
    return missing


def format_kwargs(fmt: Format, function: Callable | None = None) -> dict:
    """The activation arguments ``fmt`` adds to a call of ``function`` (a release's fused_marlin_moe or
    batched_fused_marlin_moe; None: vLLM 0.25/0.26's names), under the names it takes: the activation
    quantization (``input_dtype``, where the release has it), and gpt-oss's clamped SwiGLU-OAI on the packed
    gate/up layout (CLAMP_ARGUMENTS, or one ``activation_config``). A format the function cannot take is
    refused (ValueError), never passed half."""
    takes = ARGUMENTS_0_25 if function is None else parameters_of(function)
    if missing := activation_missing(fmt, takes):
        raise ValueError(f"format {fmt.name} needs {', '.join(missing)}, which this release's function lacks")
    extra: dict = {"input_dtype": input_dtype_of(fmt)} if "input_dtype" in takes else {}
    if fmt.clamp:
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation

        extra["activation"] = MoEActivation.SWIGLUOAI_UNINTERLEAVE
        if set(CLAMP_ARGUMENTS) <= takes:
            extra.update(clamp_limit=GPT_OSS_CLAMP, gemm1_alpha=GPT_OSS_ALPHA, gemm1_beta=GPT_OSS_BETA)
        else:
            from vllm.model_executor.layers.fused_moe.activation import ApplyMoEActivationConfig

            extra["activation_config"] = ApplyMoEActivationConfig(
                clamp_limit=GPT_OSS_CLAMP, alpha=GPT_OSS_ALPHA, beta=GPT_OSS_BETA
            )
    return extra


def call_moe(
    module: ModuleType,
    experts: Experts,
    routing: Routing,
    *,
    global_num_experts: int,
    expert_map: torch.Tensor | None,
    **extra,
) -> torch.Tensor:
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


def batched_by_expert(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    experts: int,
    capacity: int,
    *,
    own_topk_ids: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
) -> Batched:
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
    return Batched(
        hidden=out.contiguous(),
        counts=counts.to(torch.int32),
        rows=rows,
        slots=slots,
        topk_ids=topk_ids if own_topk_ids is None else own_topk_ids,
    )


def combine_batched(out: torch.Tensor, batched: Batched, topk_weights: torch.Tensor, tokens: int) -> torch.Tensor:
    """float32 (tokens, K): each token's router-weighted sum of its experts' rows (valid slots only)."""
    valid = batched.rows >= 0
    rows, slots = batched.rows[valid], batched.slots[valid]
    total = torch.zeros(tokens, out.shape[-1], dtype=torch.float32, device=out.device)
    total.index_add_(0, rows, out[valid].float() * topk_weights[rows, slots, None].float())
    return total


def batched_experts(
    module: ModuleType, experts: Experts, *, num_dispatchers: int, max_num_tokens: int, fmt: Format | None = None
):
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
        w1_bias=experts.bias1,
        w2_bias=experts.bias2,
        w1_scale=experts.s1,
        w2_scale=experts.s2,
        quant_type_id=experts.quant_type_id,
        a1_gscale=experts.input_global_scale1,
        a2_gscale=experts.input_global_scale2,
        g1_alphas=experts.global_scale1,
        g2_alphas=experts.global_scale2,
        w13_g_idx=experts.g_idx1,
        w2_g_idx=experts.g_idx2,
        w13_g_idx_sort_indices=experts.sort1,
        w2_g_idx_sort_indices=experts.sort2,
        w1_zp=experts.zeros1,
        w2_zp=experts.zeros2,
        input_dtype=None if fmt is None else input_dtype_of(fmt),
        is_k_full=True,
        gemm1_clamp_limit=GPT_OSS_CLAMP if clamp else None,
        gemm1_alpha=GPT_OSS_ALPHA if clamp else 1.0,
        gemm1_beta=GPT_OSS_BETA if clamp else 0.0,
        num_dispatchers=num_dispatchers,
        max_num_tokens=max_num_tokens,
    )
    cls = type("BatchedMarlinExpertsStandIn", (module.BatchedMarlinExperts,), {**values, "__getattr__": missing})
    return object.__new__(cls)


def call_batched(
    module: ModuleType,
    caller,
    w1: torch.Tensor,
    w2: torch.Tensor,
    batched: Batched,
    *,
    global_num_experts: int,
    topk_weights: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    fmt: Format | None = None,
) -> torch.Tensor:
    """vLLM's ``BatchedMarlinExperts.apply`` of ``module`` (the DeepEP low-latency caller): (E, capacity, K);
    the activation is ``fmt``'s (gpt-oss: the clamped SwiGLU-OAI), else SiLU."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    activation = format_kwargs(fmt).get("activation", MoEActivation.SILU) if fmt else MoEActivation.SILU
    return module.BatchedMarlinExperts.apply(
        caller,
        output=None,
        hidden_states=batched.hidden,
        w1=w1,
        w2=w2,
        topk_weights=topk_weights,
        topk_ids=batched.topk_ids,
        activation=activation,
        global_num_experts=global_num_experts,
        expert_map=expert_map,
        a1q_scale=None,
        a2_scale=None,
        workspace13=None,
        workspace2=None,
        expert_tokens_meta=SimpleNamespace(expert_num_tokens=batched.counts),
        apply_router_weight_on_input=False,
    )


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

    with swapped(
        module,
        moe_align_block_size=align_forced,
        batched_moe_align_block_size=batched_align_forced,
        _fused_marlin_moe=kernel_forced,
    ):
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
