"""Run vLLM's real ``fused_marlin_moe`` on the CPU with only its CUDA work replaced by spies.

``moe_align_block_size`` and ``_fused_marlin_moe`` (the two places that launch CUDA kernels;
plus ``ops.moe_sum`` in releases that call it) are swapped for recorders in the module under
test; everything else is vLLM's own Python: argument checks, the block-size choice, the
expert-count handling and the final reduction. The checks compare what the spies saw with
the specification in :mod:`ci.moe.spec`.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from ci.kernel import moe_case as mc
from ci.kernel import weights
from ci.kernel.formats import FORMAT_COMBOS, FORMATS, Format
from ci.moe import spec
from ci.moe.patching import swapped

# The grid (module constants, as in vLLM's tests/kernels/moe/test_moe.py).
M_VALUES = (
    1,
    2,
    3,
    5,
    7,
    8,
    9,
    15,
    16,
    17,
    31,
    33,
    63,
    64,
    65,
    100,
    127,
    128,
    129,
    255,
    256,
    257,
    511,
    513,
    1000,
    1023,
    1024,
    1025,
    2047,
    2048,
    3001,
    4095,
    4096,
    5000,
    6143,
    8191,
    8192,
)
LOCAL_EXPERTS = (1, 5, 8, 32, 128)
# None: a non-EP caller (global_num_experts == -1); 1: the non-EP call as vLLM makes it (global_num_experts == E,
# no expert map: the modular kernel turns -1 into the local expert count before the Marlin experts run, so a
# server without EP calls fused_marlin_moe this way, ci.kernel.callers); 2 and more: EP, with an expert map
EP_SIZES = (None, 1, 2, 4, 8, 16, 32)
NON_EP_SIZES = (None, 1)
TOP_KS = (1, 2, 4, 6, 8)
FORMATS_PER_M = 3  # formats each M value is tried with, at each grid point
HIDDEN = 16  # K: the smallest hidden size the Python checks accept; the spies ignore the weights
ACTIVATIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Case:
    m: int
    topk: int
    local_experts: int
    ep: int | None
    fmt: Format = FORMATS[0]
    activation: str = "bf16"  # the hidden states' dtype

    @property
    def global_experts(self) -> int:
        return spec.NON_EP if self.ep is None else self.local_experts * self.ep

    @property
    def input_dtype(self) -> torch.dtype | None:
        return weights.input_dtype_of(self.fmt)

    @property
    def input_itemsize(self) -> int | None:
        return self.fmt.input_itemsize

    def __str__(self) -> str:
        return (
            f"M={self.m} topk={self.topk} E={self.local_experts} G={self.global_experts} "
            f"format={self.fmt.name} {self.activation}"
        )


def is_non_ep(ep: int | None) -> bool:
    """Whether a grid point is a non-EP call (G == -1, or G == E with no expert map): the non-EP path."""
    return ep in NON_EP_SIZES


def has_enough_experts(local_experts: int, ep: int | None, topk: int) -> bool:
    """True when the model has at least ``topk`` experts, so routing to ``topk`` distinct experts is possible."""
    return local_experts * (ep or 1) >= topk


def combos_for(module) -> list[tuple[Format, str]]:
    """The (format, hidden dtype) pairs ``module``'s fused_marlin_moe can be called with: a release whose
    function lacks an argument a format needs (act-order's ``g_idx1`` in 0.33.0, W4A8's ``input_dtype`` in
    0.34.0) does not serve it (:func:`not_in_release` says why)."""
    takes = mc.parameters_of(module.fused_marlin_moe)
    return [(f, act) for f, act in FORMAT_COMBOS if not missing_arguments(f, takes)]


def not_in_release(module) -> dict[str, list[str]]:
    """Each format of ``ci.kernel.formats`` that ``module``'s fused_marlin_moe cannot take, with the
    arguments it lacks for it (empty: the release serves every format)."""
    takes = mc.parameters_of(module.fused_marlin_moe)
    return {f.name: missing for f in FORMATS if (missing := missing_arguments(f, takes))}


def missing_arguments(fmt: Format, takes) -> list[str]:
    """The arguments a call in ``fmt`` needs that a function taking ``takes`` lacks: the weights' (act-order
    indices, zero points, NVFP4 global scales, int8-input scales, biases) and the activation's."""
    q, need = fmt.quant, []
    if q.act_order:
        need += ["g_idx1", "g_idx2", "sort_indices1", "sort_indices2"]
    if q.has_zero_points:
        need += ["w1_zeros", "w2_zeros"]
    if q.has_global_scale:
        need += ["global_scale1", "global_scale2"]
    if fmt.input_dtype == "int8":
        need += ["input_global_scale1", "input_global_scale2"]
    if fmt.bias:
        need += ["bias1", "bias2"]
    return [n for n in need if n not in takes] + mc.activation_missing(fmt, takes)


def cases_for(local_experts: int, ep: int | None, topk: int, combos=FORMAT_COMBOS) -> list[Case]:
    """Every M value, each with FORMATS_PER_M (format, dtype) pairs taken in turn from ``combos``, starting
    at an offset of the grid point: at every point every pair is tried, at different M values."""
    # a grid point with no case checks nothing: it must fail, never pass or divide by zero (issue 40)
    assert combos, "the release serves no (format, dtype) pair of ci.kernel.formats: nothing would be checked"
    start = local_experts * 7 + (ep or 0) * 3 + topk
    cases = []
    for i, m in enumerate(M_VALUES):
        for j in range(FORMATS_PER_M):
            fmt, act = combos[(start + FORMATS_PER_M * i + j) % len(combos)]
            cases.append(Case(m, topk, local_experts, ep, fmt, act))
    return cases


@dataclass
class Inputs:
    hidden_states: torch.Tensor
    weights: dict[str, Any]  # the weight and format arguments of fused_marlin_moe
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    expert_map: torch.Tensor | None


def format_arguments(fmt: Format, e: int, dtype: torch.dtype, gen: torch.Generator) -> dict[str, Any]:
    """The weight arguments of a call in ``fmt``, shaped as fused_marlin_moe checks them (K = HIDDEN): packed
    weights of the format's bit width, its scales, zero points, act-order indices, NVFP4 global scales,
    int8-input scale factors and gpt-oss biases (the activation's arguments: ``mc.format_kwargs``, in the
    release's names). Contents are random: the spies only record them."""
    q = fmt.quant
    scale_dtype = {"float4_e2m1f": torch.float8_e4m3fn}.get(q.quant_type, dtype)
    if q.fp4 and not q.has_global_scale:
        scale_dtype = torch.float8_e8m0fnu
    args: dict[str, Any] = dict(
        w1=torch.randint(0, 2**31 - 1, (e, HIDDEN // 16, 2), generator=gen, dtype=torch.int32),
        w2=torch.randint(0, 2**31 - 1, (e, 1, HIDDEN * q.bits // 2), generator=gen, dtype=torch.int32),
        w1_scale=torch.rand(e, 1, 2, generator=gen).to(dtype).to(scale_dtype),
        w2_scale=torch.rand(e, 1, HIDDEN, generator=gen).to(dtype).to(scale_dtype),
        bias1=None,
        bias2=None,
        quant_type_id=scalar_type_id(q.quant_type),
    )
    if q.has_zero_points:
        args.update(
            w1_zeros=torch.randint(0, 15, (e, 1, 2), generator=gen, dtype=torch.int32),
            w2_zeros=torch.randint(0, 15, (e, 1, 2), generator=gen, dtype=torch.int32),
        )
    if q.act_order:
        args.update(
            g_idx1=torch.randperm(HIDDEN, generator=gen).int().repeat(e, 1),
            g_idx2=torch.randperm(1, generator=gen).int().repeat(e, 1),
            sort_indices1=torch.randperm(HIDDEN, generator=gen).int().repeat(e, 1),
            sort_indices2=torch.zeros(e, 1, dtype=torch.int32),
        )
    if q.has_global_scale:
        args.update(global_scale1=torch.rand(e, generator=gen), global_scale2=torch.rand(e, generator=gen))
    if fmt.input_dtype == "int8":
        args.update(input_global_scale1=torch.rand(1, generator=gen), input_global_scale2=torch.rand(1, generator=gen))
    if fmt.bias:
        args.update(
            bias1=torch.randn(e, 2, generator=gen).to(dtype), bias2=torch.randn(e, HIDDEN, generator=gen).to(dtype)
        )
    return args  # the activation's arguments are the release's names: mc.format_kwargs at the call


def scalar_type_id(name: str) -> int:
    from vllm.scalar_type import scalar_types

    return getattr(scalar_types, name).id


def make_inputs(case: Case, expert_map_fn) -> Inputs:
    """Deterministic inputs of the shapes fused_marlin_moe checks, in the case's format."""
    gen = torch.Generator().manual_seed(case.m * 1009 + case.topk * 31 + case.local_experts)
    g = case.local_experts if case.ep is None else case.global_experts
    first = torch.randint(0, g, (case.m, 1), generator=gen)
    ids = ((first + torch.arange(case.topk)) % g).to(torch.int32)  # topk distinct experts per row
    expert_map = None
    if case.ep is not None and case.ep > 1:
        _, expert_map, _ = expert_map_fn(case.ep, 0, g)
    dtype = ACTIVATIONS[case.activation]
    return Inputs(
        hidden_states=torch.randn(case.m, HIDDEN, generator=gen).to(dtype),
        weights=format_arguments(case.fmt, case.local_experts, dtype, gen),
        topk_weights=torch.rand(case.m, case.topk, generator=gen),
        topk_ids=ids,
        expert_map=expert_map,
    )


def describe(value: Any) -> Any:
    """A comparable description of a kernel argument (tensors by shape, dtype and content)."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
        return ("tensor", tuple(value.shape), str(value.dtype), hashlib.sha1(data).hexdigest())
    if callable(value):
        return ("callable", getattr(value, "__qualname__", repr(value)))
    return value


@dataclass
class Observation:
    align_block_size: int
    align_num_experts: int
    align_got_input_ids: bool
    align_got_input_map: bool
    expert_map_unchanged: bool
    kernel_block_size: int
    kernel_args: dict[str, Any]
    reduced_correctly: bool


class KernelSpies:
    """Swap the CUDA work of one ``marlin_moe`` module for recorders; restore on exit."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.align: list[tuple[tuple, dict]] = []
        self.kernel: list[dict] = []
        self.kernel_out: list[torch.Tensor] = []

    def _align(self, topk_ids, block_size, num_experts, expert_map=None, *args, **kwargs):
        self.align.append(((topk_ids, block_size, num_experts, expert_map, *args), kwargs))
        n = topk_ids.numel() + num_experts * (block_size - 1)
        return (
            torch.arange(n, dtype=torch.int32),
            torch.zeros(n // block_size + 1, dtype=torch.int32),
            torch.tensor([n], dtype=torch.int32),
        )

    def _kernel(self, **kwargs):
        self.kernel.append(kwargs)
        x, w = kwargs["hidden_states"], kwargs["topk_weights"]
        out = (x.float().repeat_interleave(kwargs["num_topk"], dim=0) * w.reshape(-1, 1)).to(x.dtype)
        self.kernel_out.append(out)
        return out

    @staticmethod
    def _moe_sum(moe_out, out, *args):
        torch.sum(moe_out, dim=1, out=out)
        return out

    def __enter__(self) -> KernelSpies:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(
            swapped(self.module, moe_align_block_size=self._align, _fused_marlin_moe=self._kernel)
        )
        self._stack.enter_context(swapped(self.module.ops, moe_sum=self._moe_sum))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()


def observe(module: ModuleType, case: Case, inputs: Inputs) -> Observation:
    """Call the real fused_marlin_moe of ``module`` on ``inputs`` and report what the kernels received."""
    map_before = None if inputs.expert_map is None else inputs.expert_map.clone()
    with KernelSpies(module) as spies:
        output = module.fused_marlin_moe(
            hidden_states=inputs.hidden_states,
            topk_weights=inputs.topk_weights,
            topk_ids=inputs.topk_ids,
            global_num_experts=case.global_experts,
            expert_map=inputs.expert_map,
            **inputs.weights,
            **mc.format_kwargs(case.fmt, module.fused_marlin_moe),
        )
    assert len(spies.align) == 1 and len(spies.kernel) == 1, "expected one align and one kernel call"
    (a_args, a_kwargs), kwargs = spies.align[0], spies.kernel[0]
    a_map = a_args[3] if len(a_args) > 3 else a_kwargs.get("expert_map")
    expected = spies.kernel_out[0].view(-1, case.topk, HIDDEN).sum(dim=1)
    return Observation(
        align_block_size=a_args[1],
        align_num_experts=a_args[2],
        align_got_input_ids=a_args[0] is inputs.topk_ids,
        align_got_input_map=a_map is inputs.expert_map,
        expert_map_unchanged=map_before is None or torch.equal(map_before, inputs.expert_map),
        kernel_block_size=kwargs["block_size_m"],
        kernel_args={k: describe(v) for k, v in kwargs.items()},
        reduced_correctly=output.shape == inputs.hidden_states.shape and torch.equal(output, expected),
    )


def base_rules(manifest) -> dict[str, bool]:
    """The rules the base tree of ``manifest`` may follow (``spec.base_rules``)."""
    return spec.base_rules(
        manifest.vllm_version,
        reverse=manifest.reverse,
        patch_path=manifest.patch_path,
        overlaid=manifest.refs is not None or bool(manifest.overlaid_files),
    )


def block_size_mismatches(obs: Observation, case: Case, *, patched: bool) -> list[str]:
    """Differences between the block sizes the kernels received and the spec's."""
    want = spec.expected_block_size_m(
        m=case.m,
        topk=case.topk,
        local_experts=case.local_experts,
        global_experts=case.global_experts,
        input_itemsize=case.input_itemsize,
        patched=patched,
    )
    errors = []
    if obs.align_block_size != want:
        errors.append(f"{case}: moe_align_block_size got block_size {obs.align_block_size}, spec says {want}")
    if obs.kernel_block_size != want:
        errors.append(f"{case}: _fused_marlin_moe got block_size_m {obs.kernel_block_size}, spec says {want}")
    return errors


def invariant_violations(obs: Observation, case: Case) -> list[str]:
    """What every change must keep, contract or not: a tile the kernel has, the same tile for the aligner
    and the kernel, at least 16 for 1-byte inputs, and the aligner's inputs (:func:`align_mismatches`)."""
    errors = []
    if obs.kernel_block_size not in spec.BLOCK_SIZES_M:
        errors.append(f"{case}: block_size_m {obs.kernel_block_size} is not one the kernel has {spec.BLOCK_SIZES_M}")
    if obs.align_block_size != obs.kernel_block_size:
        errors.append(
            f"{case}: moe_align_block_size got block_size {obs.align_block_size}, the kernel {obs.kernel_block_size}"
        )
    if case.input_itemsize == 1 and obs.kernel_block_size < spec.MIN_BLOCK_SIZE_M_1_BYTE_INPUT:
        errors.append(f"{case}: block_size_m {obs.kernel_block_size} for a 1-byte input (at least 16)")
    return errors + align_mismatches(obs, case)


def rule_mismatches(obs: Observation, case: Case, want: int, rule: str) -> list[str]:
    """The block size a contract's rule says, against what the kernels received."""
    if obs.kernel_block_size == want and obs.align_block_size == want:
        return []
    return [f"{case}: block size {obs.align_block_size}/{obs.kernel_block_size} (aligner/kernel), {rule} says {want}"]


def align_mismatches(obs: Observation, case: Case) -> list[str]:
    """moe_align_block_size must get the global expert count and the caller's routing untouched."""
    errors = []
    want = spec.expected_align_experts(case.local_experts, case.global_experts)
    if obs.align_num_experts != want:
        errors.append(f"{case}: moe_align_block_size got num_experts={obs.align_num_experts}, expected {want}")
    if not (obs.align_got_input_ids and obs.align_got_input_map and obs.expert_map_unchanged):
        errors.append(f"{case}: topk_ids or expert_map was replaced or modified before moe_align_block_size")
    if not obs.reduced_correctly:
        errors.append(f"{case}: the output is not the top-k sum of what the kernel returned")
    return errors


def kernel_arg_differences(base: Observation, cand: Observation, case: Case) -> list[str]:
    """Every argument the kernels received must be identical in base and candidate."""
    errors = []
    if (base.align_block_size, base.align_num_experts) != (cand.align_block_size, cand.align_num_experts):
        errors.append(
            f"{case}: moe_align_block_size args differ: base (bm={base.align_block_size}, "
            f"experts={base.align_num_experts}) vs candidate (bm={cand.align_block_size}, "
            f"experts={cand.align_num_experts})"
        )
    for key in sorted(set(base.kernel_args) | set(cand.kernel_args)):
        if base.kernel_args.get(key) != cand.kernel_args.get(key):
            errors.append(f"{case}: _fused_marlin_moe argument {key!r} differs between base and candidate")
    return errors


def rule_value(contract, case: Case, env: dict) -> int:
    return contract.fused_block_size_m(
        m=case.m,
        topk=case.topk,
        local_experts=case.local_experts,
        global_experts=case.global_experts,
        input_itemsize=case.input_itemsize,
        env=env,
    )
