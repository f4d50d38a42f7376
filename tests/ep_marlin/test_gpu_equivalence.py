"""GPU tier: vLLM's real Marlin MoE kernels, base and candidate, over EP and non-EP settings.

1. Reference: fused_marlin_moe against an independent float32 MoE (``reference.py``).
2. EP equivalence: the sum over ranks of each rank's output (its experts, its ``expert_map``,
   ``global_num_experts = G``, the DP-padded rows) equals the non-EP output (G == -1).
3. Base vs candidate: close under EP, bit-identical without it: ``global_num_experts == -1`` and ``== E`` with no
   expert map, the two non-EP calls (``NON_EP_CALLS``: a direct caller's default, and the modular kernel's).
4. Every block size in {8, 16, 32, 48, 64} gives equivalent results.
5. Robustness: poisoned buffers fully overwritten, no NaN/Inf, tokens routed only to other
   ranks' experts give zeros, M = 1, odd M, M = 4096.
6. Every format of ``ci.kernel.formats`` beyond the 16-bit-input schemes (NVFP4, MXFP4, gpt-oss's biases and clamp,
   W4A8-int8; W4A8-FP8 where vLLM runs it): 1, 2, 4 and 5 per format (``test_format_*``).

Tolerances are relative L2 errors (``reference.rel_l2``), named below with their reasons.
"""

from __future__ import annotations

import functools

import pytest
import torch

from ci.kernel import moe_case as mc
from ci.kernel import weights
from ci.kernel.formats import FORMATS_BY_NAME, GPT_OSS_ALPHA, GPT_OSS_BETA, GPT_OSS_CLAMP, QUANT_SCHEMES, Format
from ci.moe.routing import Routing, dp_padded_routing, rank_view, route
from ci.moe.shapes import Shape, scaled
from ci.moe.spec import BLOCK_SIZES_M, MIN_BLOCK_SIZE_M_1_BYTE_INPUT, NON_EP
from tests.reference import max_abs, reference_moe, rel_l2
from tests.shared import SEED

pytestmark = pytest.mark.gpu

# Kernel vs float32 reference. Measured ~4.7e-3 for GPTQ int4 g128 in bf16 on an H200
# (vLLM 0.26.0, torch 2.11): the error is bf16 rounding of the activations between the two GEMMs.
# 4x margin; fp16 has 3 more mantissa bits (8x finer), so its bound is 4x tighter.
REFERENCE_BOUND = {torch.bfloat16: 2e-2, torch.float16: 5e-3}
# Two kernel runs that differ only in tiling (block size, EP sharding, base vs candidate):
# they round the same way up to accumulation order (measured ~2e-3 for EP sums in bf16).
CONSISTENCY_BOUND = {torch.bfloat16: 1e-2, torch.float16: 2.5e-3}

SHAPES = {
    s.name: s
    for s in (
        scaled("deepseek-v3", "deepseek-v3-like", experts=16),
        scaled("qwen3-30b-a3b", "qwen3-30b-a3b-like"),
        scaled("mixtral-8x7b", "mixtral-like", intermediate=3584),
        scaled("gpt-oss-120b", "gpt-oss-like", experts=16),
        Shape("odd-small", 256, 384, 12, 3),
    )
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SCHEMES = {s.name: s for s in QUANT_SCHEMES if not s.fp4}  # the FP4 schemes: FORMAT_GRID below
# (shape, ep, placement) with the tokens each DP rank holds; uneven splits as vLLM makes them.
EP_CASES = [
    ("deepseek-v3-like", 8, "linear", [8, 3, 1, 8, 5, 8, 2, 7]),  # 16 experts: 2 a rank
    ("qwen3-30b-a3b-like", 4, "linear", [16, 16, 9, 1]),
    ("qwen3-30b-a3b-like", 2, "round_robin", [64, 33]),
    ("qwen3-30b-a3b-like", 3, "linear", [5, 4, 5]),  # 128 experts over 3 ranks: 43, 43, 42
    ("mixtral-like", 2, "linear", [31, 32]),
    ("gpt-oss-like", 4, "linear", [2, 1, 4, 4]),
    ("odd-small", 8, "linear", [3, 1, 2, 3, 3, 1, 2, 3]),  # 12 experts over 8 ranks: 2 or 1 each
    ("odd-small", 4, "linear", [37, 12, 40, 1]),
]


# The non-EP calls of fused_marlin_moe (no expert map): a direct caller's default, and the one a server without EP
# makes (vLLM's modular kernel turns -1 into the local expert count: ci.kernel.callers)
NON_EP_CALLS = {"G=-1": lambda shape: NON_EP, "G=E": lambda shape: shape.experts}


@functools.lru_cache(maxsize=32)
def experts_for(shape_name: str, scheme_name: str, dtype_name: str) -> weights.Experts:
    torch.manual_seed(SEED)
    return weights.quantized_experts(SHAPES[shape_name], SCHEMES[scheme_name], DTYPES[dtype_name], seed=SEED)


def _ref(experts: weights.Experts, routing: Routing, expert_map=None) -> torch.Tensor:
    return reference_moe(
        routing.hidden, experts.w1_ref, experts.w2_ref, routing.topk_weights, routing.topk_ids, expert_map
    )


def _ep_sum(
    module,
    experts: weights.Experts,
    routing: Routing,
    shape: Shape,
    ep: int,
    placement: str,
    extra: dict | None = None,
):
    total = torch.zeros(routing.hidden.shape, dtype=torch.float32, device="cuda")
    for rank in range(ep):
        view = rank_view(shape.experts, ep, rank, strategy=placement)
        out = mc.call_moe(
            module,
            experts.select(view.local_ids),
            routing,
            global_num_experts=shape.experts,
            expert_map=view.expert_map,
            **(extra or {}),
        )
        total += out.float()
    return total


# Every shape in bf16 with the main scheme; fp16 and every quantization scheme on the small
# shapes (the large ones cost seconds of CPU packing per dtype in vLLM's test helpers).
REFERENCE_GRID = (
    [(s, "gptq-int4-g128", "bf16") for s in SHAPES]
    + [("qwen3-30b-a3b-like", "gptq-int4-g128", "fp16")]
    + [("odd-small", q, d) for q in SCHEMES for d in DTYPES if (q, d) != ("gptq-int4-g128", "bf16")]
)


@pytest.mark.parametrize(("shape_name", "scheme_name", "dtype_name"), REFERENCE_GRID)
def test_matches_float32_reference(shape_name, scheme_name, dtype_name, variants, metric):
    """Non-EP output of both trees (global_num_experts == -1, and == E) vs the float32 reference."""
    shape, dtype = SHAPES[shape_name], DTYPES[dtype_name]
    experts = experts_for(shape_name, scheme_name, dtype_name)
    routing = route(67, shape, dtype, seed=SEED)
    expected = _ref(experts, routing)
    for v in variants:
        for call, g in NON_EP_CALLS.items():
            got = mc.call_moe(v.marlin_moe, experts, routing, global_num_experts=g(shape), expert_map=None)
            err = rel_l2(got, expected)
            metric("reference_rel_l2", err, REFERENCE_BOUND[dtype])
            assert err < REFERENCE_BOUND[dtype], f"{v.name} ({call}): rel L2 error {err:.2e} vs the float32 reference"


@pytest.mark.parametrize("side", ["base", "candidate"])
@pytest.mark.parametrize(("shape_name", "ep", "placement", "tokens"), EP_CASES)
def test_ep_sum_equals_non_ep(shape_name, ep, placement, tokens, side, variants, metric):
    """Sum over EP ranks (global_num_experts = G, expert_map) == the non-EP output, padding included."""
    shape, dtype = SHAPES[shape_name], torch.bfloat16
    module = dict(zip(("base", "candidate"), variants, strict=True))[side].marlin_moe
    experts = experts_for(shape_name, "gptq-int4-g128", "bf16")
    routing = dp_padded_routing(tokens, shape, dtype, seed=SEED + ep)
    non_ep = mc.call_moe(module, experts, routing, global_num_experts=NON_EP, expert_map=None).float()
    ep_sum = _ep_sum(module, experts, routing, shape, ep, placement)
    err = rel_l2(ep_sum, non_ep)
    metric("ep_sum_vs_non_ep_rel_l2", err, CONSISTENCY_BOUND[dtype])
    assert err < CONSISTENCY_BOUND[dtype], f"EP sum differs from non-EP output: rel L2 {err:.2e}"
    ref_err = rel_l2(ep_sum, _ref(experts, routing))
    metric("ep_sum_vs_reference_rel_l2", ref_err, REFERENCE_BOUND[dtype])
    assert ref_err < REFERENCE_BOUND[dtype]
    assert torch.all(ep_sum[~routing.valid] == 0), "zero padding rows must give zero output"
    # Padding does not change the valid rows: the same tokens without padding give the same output.
    unpadded = Routing(
        hidden=routing.hidden[routing.valid].contiguous(),
        topk_weights=routing.topk_weights[routing.valid],
        topk_ids=routing.topk_ids[routing.valid],
        valid=routing.valid[routing.valid],
    )
    alone = _ep_sum(module, experts, unpadded, shape, ep, placement)
    pad_err = rel_l2(ep_sum[routing.valid], alone)
    metric("padding_effect_rel_l2", pad_err, CONSISTENCY_BOUND[dtype])
    assert pad_err < CONSISTENCY_BOUND[dtype], f"padding rows changed the valid rows: rel L2 {pad_err:.2e}"


# Loads where a rule may leave #48144's tile: the tile oracle's 48-row band, 90.5-181 rows per expert (Mixtral-like,
# 8 experts, top 2: 512 rows without EP, 256 tokens a rank at EP 2, are 128 rows per expert). Without them the GPU
# suite never runs such a rule's override line, and gpu_gate says INCOMPLETE.
HIGH_LOAD_CASES = [("mixtral-like", 1, "", [512]), ("mixtral-like", 2, "linear", [256, 256])]


@pytest.mark.parametrize(
    ("shape_name", "ep", "placement", "tokens"), [*EP_CASES, ("qwen3-30b-a3b-like", 1, "", [97]), *HIGH_LOAD_CASES]
)
def test_candidate_matches_base(shape_name, ep, placement, tokens, variants, contract, metric):
    """Same inputs through both trees: close under EP; bit-identical without it (global_num_experts == -1 and
    == E with no expert map), unless the change's contract declares the non-EP path (then close)."""
    from ci.trees.contracts import may_change

    shape, dtype = SHAPES[shape_name], torch.bfloat16
    base, cand = (v.marlin_moe for v in variants)
    experts = experts_for(shape_name, "gptq-int4-g128", "bf16")
    routing = dp_padded_routing(tokens, shape, dtype, seed=SEED + 7)
    for call, g in NON_EP_CALLS.items():
        a = mc.call_moe(base, experts, routing, global_num_experts=g(shape), expert_map=None)
        b = mc.call_moe(cand, experts, routing, global_num_experts=g(shape), expert_map=None)
        metric("non_ep_candidate_vs_base_max_abs", max_abs(a, b), 0.0)
        if may_change(contract, "non_ep"):
            assert rel_l2(b, a) < CONSISTENCY_BOUND[dtype], f"{call}: candidate differs from base beyond rounding"
        else:
            assert torch.equal(a, b), f"the non-EP call {call} changed the output: max abs diff {max_abs(a, b):.3e}"
    for rank in range(ep if ep > 1 else 0):
        view = rank_view(shape.experts, ep, rank, strategy=placement)
        local = experts.select(view.local_ids)
        kw = dict(global_num_experts=shape.experts, expert_map=view.expert_map)
        a, b = mc.call_moe(base, local, routing, **kw), mc.call_moe(cand, local, routing, **kw)
        err = rel_l2(b, a) if a.abs().sum() > 0 else max_abs(a, b)
        metric("ep_candidate_vs_base_rel_l2", err, CONSISTENCY_BOUND[dtype])
        metric("ep_candidate_vs_base_max_abs", max_abs(a, b), None)
        assert err < CONSISTENCY_BOUND[dtype], f"rank {rank}: candidate differs from base, rel L2 {err:.2e}"


@pytest.mark.parametrize(
    ("shape_name", "ep", "rows", "scheme_name", "dtype_name"),
    [
        ("qwen3-30b-a3b-like", 4, 64, "gptq-int4-g128", "bf16"),
        ("deepseek-v3-like", 8, 256, "gptq-int4-g128", "bf16"),
        ("odd-small", 1, 123, "gptq-int4-g128", "fp16"),
        ("odd-small", 4, 517, "awq-int4-g128", "bf16"),
        ("odd-small", 1, 300, "gptq-int8-g128", "bf16"),
    ],
)
def test_every_block_size_is_equivalent(shape_name, ep, rows, scheme_name, dtype_name, variants, metric):
    """Whatever block_size_m a heuristic picks, the numbers are the same (within rounding)."""
    shape, dtype = SHAPES[shape_name], DTYPES[dtype_name]
    module = variants[1].marlin_moe
    experts = experts_for(shape_name, scheme_name, dtype_name)
    routing = route(rows, shape, dtype, seed=SEED + rows)
    view = rank_view(shape.experts, ep, 0)
    local = experts.select(view.local_ids)
    g = NON_EP if ep == 1 else shape.experts
    outs = {}
    for bm in BLOCK_SIZES_M:
        with mc.forced_block_size(module, bm):
            outs[bm] = mc.call_moe(module, local, routing, global_num_experts=g, expert_map=view.expert_map)
    expected = _ref(local, routing, view.expert_map)
    for bm, out in outs.items():
        err = rel_l2(out, expected)
        metric("block_size_vs_reference_rel_l2", err, REFERENCE_BOUND[dtype])
        assert err < REFERENCE_BOUND[dtype], f"block_size_m={bm}: rel L2 {err:.2e} vs reference"
        spread = rel_l2(out, outs[8])
        metric("block_size_vs_bm8_rel_l2", spread, CONSISTENCY_BOUND[dtype])
        assert spread < CONSISTENCY_BOUND[dtype], f"block_size_m={bm} differs from 8: rel L2 {spread:.2e}"


def poisoned_buffers(routing: Routing, shape: Shape, dtype: torch.dtype) -> dict:
    """The output and scratch buffers of a fused_marlin_moe call, sized as it sizes them, all NaN."""
    rows = routing.hidden.shape[0]
    nan = float("nan")
    return dict(
        output=torch.full_like(routing.hidden, nan),
        intermediate_cache13=torch.full(
            (rows * shape.topk * max(2 * shape.intermediate, shape.hidden),), nan, dtype=dtype, device="cuda"
        ),
        intermediate_cache2=torch.full((rows * shape.topk, shape.intermediate), nan, dtype=dtype, device="cuda"),
    )


@pytest.mark.parametrize("rows", [1, 37, 4096])
@pytest.mark.parametrize("ep", [1, 4])
def test_poisoned_buffers_are_overwritten(rows, ep, variants, metric):
    """Outputs and scratch buffers start as NaN; every element must be written, none left NaN/Inf."""
    shape, dtype = SHAPES["qwen3-30b-a3b-like"], torch.bfloat16
    experts = experts_for(shape.name, "gptq-int4-g128", "bf16")
    routing = route(rows, shape, dtype, seed=SEED + rows)
    view = rank_view(shape.experts, ep, 1 if ep > 1 else 0)
    local = experts.select(view.local_ids)
    g = NON_EP if ep == 1 else shape.experts
    for v in variants:
        buffers = poisoned_buffers(routing, shape, dtype)
        got = mc.call_moe(v.marlin_moe, local, routing, global_num_experts=g, expert_map=view.expert_map, **buffers)
        assert got.data_ptr() == buffers["output"].data_ptr(), "the output buffer passed in was not used"
        assert torch.isfinite(got).all(), f"{v.name}: NaN/Inf left in the output (rows={rows}, ep={ep})"
        err = rel_l2(got, _ref(local, routing, view.expert_map))
        metric("poisoned_vs_reference_rel_l2", err, REFERENCE_BOUND[dtype])
        assert err < REFERENCE_BOUND[dtype]


def test_tokens_routed_only_to_other_ranks_give_zero(variants):
    """A rank none of whose experts is chosen must return exact zeros, not garbage."""
    shape, dtype, ep = SHAPES["qwen3-30b-a3b-like"], torch.bfloat16, 4
    experts = experts_for(shape.name, "gptq-int4-g128", "bf16")
    routing = route(40, shape, dtype, seed=SEED)
    view = rank_view(shape.experts, ep, 0)
    foreign = torch.nonzero(view.expert_map < 0).flatten()
    routing.topk_ids = foreign[torch.arange(40 * shape.topk, device="cuda") % foreign.numel()].view(40, -1)
    routing.topk_ids = routing.topk_ids.to(torch.int32).contiguous()
    for v in variants:
        got = mc.call_moe(
            v.marlin_moe,
            experts.select(view.local_ids),
            routing,
            global_num_experts=shape.experts,
            expert_map=view.expert_map,
        )
        assert torch.equal(got, torch.zeros_like(got)), f"{v.name}: non-zero output for tokens of other ranks"


# The batched path (DeepEP low latency): tokens grouped per expert and padded to a capacity, through vLLM's
# BatchedMarlinExperts.apply. (shape, tokens, capacity, dispatchers): a capacity far above the load makes
# the capacity rule pick 64 while a load-based rule (#56744-like) picks a small tile; dispatchers only
# enter the tile choice (each rank here holds every expert: G == E).
BATCHED_CASES = [
    ("qwen3-30b-a3b-like", 1, 256, 8),
    ("qwen3-30b-a3b-like", 37, 256, 8),
    ("qwen3-30b-a3b-like", 200, 256, 1),
    ("deepseek-v3-like", 16, 128, 8),
    ("odd-small", 9, 64, 1),
    ("odd-small", 150, 160, 4),
]


@pytest.mark.parametrize(("shape_name", "tokens", "capacity", "dispatchers"), BATCHED_CASES)
def test_batched_path_matches_reference_and_unbatched(shape_name, tokens, capacity, dispatchers, variants, metric):
    """Each build's batched output, router-weighted per token, against the float32 reference and against the
    same build's fused_marlin_moe on the same tokens; padding rows never reach the result."""
    shape, dtype = SHAPES[shape_name], torch.bfloat16
    experts = experts_for(shape_name, "gptq-int4-g128", "bf16")
    routing = route(tokens, shape, dtype, seed=SEED + tokens)
    batched = mc.batched_by_expert(routing.hidden, routing.topk_ids, shape.experts, capacity)
    batched.hidden[batched.rows < 0] = float("nan")  # padding: must not reach any valid row
    expected = _ref(experts, routing)
    for v in variants:
        caller = mc.batched_experts(v.marlin_moe, experts, num_dispatchers=dispatchers, max_num_tokens=capacity)
        out = mc.call_batched(
            v.marlin_moe,
            caller,
            experts.w1,
            experts.w2,
            batched,
            global_num_experts=shape.experts,
            topk_weights=routing.topk_weights,
        )
        assert out.shape == batched.hidden.shape, f"{v.name}: batched output shape {tuple(out.shape)}"
        got = mc.combine_batched(out, batched, routing.topk_weights, tokens)
        err = rel_l2(got, expected)
        metric("batched_vs_reference_rel_l2", err, REFERENCE_BOUND[dtype])
        assert err < REFERENCE_BOUND[dtype], f"{v.name}: batched path rel L2 {err:.2e} vs the float32 reference"
        unbatched = mc.call_moe(v.marlin_moe, experts, routing, global_num_experts=NON_EP, expert_map=None)
        spread = rel_l2(got, unbatched)
        metric("batched_vs_unbatched_rel_l2", spread, CONSISTENCY_BOUND[dtype])
        assert spread < CONSISTENCY_BOUND[dtype], f"{v.name}: batched vs fused_marlin_moe rel L2 {spread:.2e}"


def test_batched_every_block_size_is_equivalent(variants, metric):
    """The batched path gives the same numbers whatever tile it is forced to."""
    shape, dtype = SHAPES["qwen3-30b-a3b-like"], torch.bfloat16
    experts = experts_for(shape.name, "gptq-int4-g128", "bf16")
    routing = route(48, shape, dtype, seed=SEED)
    batched = mc.batched_by_expert(routing.hidden, routing.topk_ids, shape.experts, 96)
    module = variants[1].marlin_moe
    caller = mc.batched_experts(module, experts, num_dispatchers=1, max_num_tokens=96)
    outs = {}
    for bm in BLOCK_SIZES_M:
        with mc.forced_block_size(module, bm):
            out = mc.call_batched(module, caller, experts.w1, experts.w2, batched, global_num_experts=shape.experts)
        outs[bm] = mc.combine_batched(out, batched, routing.topk_weights, 48)
    expected = _ref(experts, routing)
    for bm, got in outs.items():
        err = rel_l2(got, expected)
        metric("batched_block_size_vs_reference_rel_l2", err, REFERENCE_BOUND[dtype])
        assert err < REFERENCE_BOUND[dtype], f"batched, block_size_m={bm}: rel L2 {err:.2e} vs reference"
        assert rel_l2(got, outs[8]) < CONSISTENCY_BOUND[dtype], f"batched, block_size_m={bm} differs from 8"


# Formats beyond 16-bit GPTQ/AWQ/int8/FP8 (ci.kernel.formats): the FP4 weights Hopper serves through Marlin (NVFP4 with
# its per-expert global scale, MXFP4), W4A8-int8 (Marlin quantizes both GEMM inputs per token to int8; the
# tile is raised to at least 16), gpt-oss-like MXFP4 with expert biases and the clamped SwiGLU-OAI, and
# W4A8-FP8, which vLLM runs on SM89/SM12x only. The weights come from vLLM's own helpers (random FP4 codes
# for FP4); the reference is tests/reference.py with the format's biases, clamp and int8 rounding.
# Bounds (relative L2):
# * FP4 weights: the reference holds the exact dequantized weights, so the error is the bf16 rounding of the
#   activations between the GEMMs, as for int4: REFERENCE_BOUND.
# * W4A8-int8: the kernel rounds the intermediate activation to bf16 before quantizing it to int8, the
#   reference quantizes the float32 value: an element near a rounding edge lands one int8 step (max|x|/127
#   of its row) away, so twice REFERENCE_BOUND. Without the int8 scale factors (input_global_scale) the
#   output is off by orders of magnitude.
# * gpt-oss: the hidden states are scaled (x ~ N(0, 20^2)) so that the gate/up pre-activations reach the
#   clamp (7.0) on a share of elements that the test checks (13% on the H200), and the biases are O(1), so
#   that both weigh in the output the reference is compared with.
INT8_INPUT_BOUND = 2 * REFERENCE_BOUND[torch.bfloat16]
GPT_OSS_HIDDEN_SCALE = 20.0
MIN_CLAMPED_SHARE = 0.01
FORMAT_SHAPES = {
    "nvfp4": "deepseek-v3-like",
    "mxfp4": "gpt-oss-like",
    "gpt-oss-mxfp4": "gpt-oss-like",
    "w4a8-int8": "odd-small",
    "w4a8-int8-awq": "odd-small",
    "w4a8-fp8": "odd-small",
}
FORMAT_EP = {
    "deepseek-v3-like": (8, [8, 3, 1, 8, 5, 8, 2, 7]),
    "gpt-oss-like": (4, [2, 1, 4, 4]),
    "odd-small": (4, [37, 12, 40, 1]),
}
FORMAT_GRID = [
    pytest.param(
        name,
        marks=()
        if FORMATS_BY_NAME[name].hopper
        else pytest.mark.skipif(
            not torch.cuda.is_available() or torch.cuda.get_device_capability() not in ((8, 9), (12, 0)),
            reason="vLLM runs Marlin with FP8 inputs on SM89/SM12x only (get_marlin_input_dtype)",
        ),
    )
    for name in FORMAT_SHAPES
]


@functools.lru_cache(maxsize=8)
def format_experts(name: str) -> weights.Experts:
    return weights.quantized_experts(SHAPES[FORMAT_SHAPES[name]], FORMATS_BY_NAME[name], torch.bfloat16, seed=SEED)


def _format_routing(fmt: Format, shape: Shape, rows: int | list[int], seed: int) -> Routing:
    scale = GPT_OSS_HIDDEN_SCALE if fmt.clamp else 0.1
    if isinstance(rows, list):
        return dp_padded_routing(rows, shape, torch.bfloat16, seed=seed, scale=scale)
    return route(rows, shape, torch.bfloat16, seed=seed, scale=scale)


def _format_ref(fmt: Format, experts: weights.Experts, routing: Routing, expert_map=None) -> torch.Tensor:
    return reference_moe(
        routing.hidden,
        experts.w1_ref,
        experts.w2_ref,
        routing.topk_weights,
        routing.topk_ids,
        expert_map,
        bias1=experts.bias1_ref,
        bias2=experts.bias2_ref,
        input_int8=fmt.input_dtype == "int8",
        clamp=(GPT_OSS_CLAMP, GPT_OSS_ALPHA, GPT_OSS_BETA) if fmt.clamp else None,
    )


def _format_bound(fmt: Format) -> float:
    return INT8_INPUT_BOUND if fmt.input_dtype == "int8" else REFERENCE_BOUND[torch.bfloat16]


@pytest.mark.parametrize("name", FORMAT_GRID)
def test_format_matches_float32_reference(name, variants, metric):
    """Non-EP output of both trees in each format vs the float32 reference (gpt-oss: the clamp does bind)."""
    fmt = FORMATS_BY_NAME[name]
    shape, experts = SHAPES[FORMAT_SHAPES[name]], format_experts(name)
    routing = _format_routing(fmt, shape, 67, SEED)
    expected = _format_ref(fmt, experts, routing)
    if fmt.clamp:
        share = _clamped_share(experts, routing)
        metric("gpt_oss_clamped_share", share, MIN_CLAMPED_SHARE)
        assert share > MIN_CLAMPED_SHARE, f"the clamp binds on {share:.2%} of pre-activations only"
    for v in variants:
        got = mc.call_moe(
            v.marlin_moe,
            experts,
            routing,
            global_num_experts=NON_EP,
            expert_map=None,
            **mc.format_kwargs(fmt, v.marlin_moe.fused_marlin_moe),
        )
        err = rel_l2(got, expected)
        metric(f"{name}_reference_rel_l2", err, _format_bound(fmt))
        assert err < _format_bound(fmt), f"{v.name}, {name}: rel L2 error {err:.2e} vs the float32 reference"


def _clamped_share(experts: weights.Experts, routing: Routing) -> float:
    """The share of gate/up pre-activations of the routed rows beyond the clamp, in the reference."""
    clamped = total = 0
    for e in routing.topk_ids.unique().tolist():
        rows = (routing.topk_ids == e).any(dim=1)
        h = routing.hidden[rows].float() @ experts.w1_ref[e].float().T + experts.bias1_ref[e].float()
        clamped += int((h.abs() > GPT_OSS_CLAMP).sum())
        total += h.numel()
    return clamped / total


@pytest.mark.parametrize("name", FORMAT_GRID)
def test_format_ep_sum_equals_non_ep(name, variants, metric):
    """Per format, each tree: the sum over EP ranks (DP-padded rows) equals the non-EP output and the reference."""
    fmt = FORMATS_BY_NAME[name]
    shape, experts = SHAPES[FORMAT_SHAPES[name]], format_experts(name)
    ep, tokens = FORMAT_EP[shape.name]
    routing = _format_routing(fmt, shape, tokens, SEED + ep)
    extra = mc.format_kwargs(fmt, variants[0].marlin_moe.fused_marlin_moe)
    for v in variants:
        non_ep = mc.call_moe(v.marlin_moe, experts, routing, global_num_experts=NON_EP, expert_map=None, **extra)
        ep_sum = _ep_sum(v.marlin_moe, experts, routing, shape, ep, "linear", extra)
        err = rel_l2(ep_sum, non_ep.float())
        metric(f"{name}_ep_sum_vs_non_ep_rel_l2", err, CONSISTENCY_BOUND[torch.bfloat16])
        assert err < CONSISTENCY_BOUND[torch.bfloat16], f"{v.name}, {name}: EP sum vs non-EP rel L2 {err:.2e}"
        ref_err = rel_l2(ep_sum, _format_ref(fmt, experts, routing))
        metric(f"{name}_ep_sum_vs_reference_rel_l2", ref_err, _format_bound(fmt))
        assert ref_err < _format_bound(fmt), f"{v.name}, {name}: EP sum vs reference rel L2 {ref_err:.2e}"
        if not fmt.bias:  # a padding row of zeros still gets the biases: it is zero only without them
            assert torch.all(ep_sum[~routing.valid] == 0), f"{v.name}, {name}: padding rows gave non-zero output"


@pytest.mark.parametrize("name", FORMAT_GRID)
def test_format_every_block_size_is_equivalent(name, variants, metric):
    """Per format, under EP (rank 0): every tile gives the reference's numbers and those of the smallest
    (for 1-byte inputs the tiles from 16: smaller ones are what the floor of 16 keeps the kernel from)."""
    fmt = FORMATS_BY_NAME[name]
    shape, experts = SHAPES[FORMAT_SHAPES[name]], format_experts(name)
    ep, _ = FORMAT_EP[shape.name]
    routing = _format_routing(fmt, shape, 200, SEED + 200)
    view = rank_view(shape.experts, ep, 0)
    local, module = experts.select(view.local_ids), variants[1].marlin_moe
    extra = mc.format_kwargs(fmt, module.fused_marlin_moe)
    outs = {}
    for bm in [b for b in BLOCK_SIZES_M if fmt.input_itemsize != 1 or b >= MIN_BLOCK_SIZE_M_1_BYTE_INPUT]:
        with mc.forced_block_size(module, bm):
            outs[bm] = mc.call_moe(
                module, local, routing, global_num_experts=shape.experts, expert_map=view.expert_map, **extra
            )
    expected = _format_ref(fmt, local, routing, view.expert_map)
    first = min(outs)
    for bm, out in outs.items():
        err = rel_l2(out, expected)
        metric(f"{name}_block_size_vs_reference_rel_l2", err, _format_bound(fmt))
        assert err < _format_bound(fmt), f"{name}, block_size_m={bm}: rel L2 {err:.2e} vs reference"
        spread = rel_l2(out, outs[first])
        metric(f"{name}_block_size_vs_bm{first}_rel_l2", spread, CONSISTENCY_BOUND[torch.bfloat16])
        assert spread < CONSISTENCY_BOUND[torch.bfloat16], f"{name}, block_size_m={bm} vs {first}: {spread:.2e}"


@pytest.mark.parametrize("rows", [1, 37])
@pytest.mark.parametrize("name", FORMAT_GRID)
def test_format_poisoned_buffers_are_overwritten(name, rows, variants, metric):
    """Per format, under EP (rank 1): output and scratch buffers start as NaN; all written, none left NaN."""
    fmt = FORMATS_BY_NAME[name]
    shape, experts = SHAPES[FORMAT_SHAPES[name]], format_experts(name)
    ep, _ = FORMAT_EP[shape.name]
    routing = _format_routing(fmt, shape, rows, SEED + rows)
    view = rank_view(shape.experts, ep, 1)
    local, dtype = experts.select(view.local_ids), torch.bfloat16
    for v in variants:
        buffers = poisoned_buffers(routing, shape, dtype)
        got = mc.call_moe(
            v.marlin_moe,
            local,
            routing,
            global_num_experts=shape.experts,
            expert_map=view.expert_map,
            **buffers,
            **mc.format_kwargs(fmt, v.marlin_moe.fused_marlin_moe),
        )
        assert got.data_ptr() == buffers["output"].data_ptr(), "the output buffer passed in was not used"
        assert torch.isfinite(got).all(), f"{v.name}, {name}: NaN/Inf left in the output (rows={rows})"
        err = rel_l2(got, _format_ref(fmt, local, routing, view.expert_map))
        metric(f"{name}_poisoned_vs_reference_rel_l2", err, _format_bound(fmt))
        assert err < _format_bound(fmt)
