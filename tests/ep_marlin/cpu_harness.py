"""Run vLLM's real ``fused_marlin_moe`` on the CPU with only its CUDA work replaced by spies.

``moe_align_block_size`` and ``_fused_marlin_moe`` (the two places that launch CUDA kernels;
plus ``ops.moe_sum`` in releases that call it) are swapped for recorders in the module under
test; everything else is vLLM's own Python: argument checks, the block-size choice, the
expert-count handling and the final reduction. The checks compare what the spies saw with
the specification in :mod:`ci.spec`.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from ci import spec

# The grid (module constants, as in vLLM's tests/kernels/moe/test_moe.py).
M_VALUES = (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 511, 513,
            1000, 1023, 1024, 1025, 2047, 2048, 3001, 4095, 4096, 5000, 6143, 8191, 8192)  # fmt: skip
LOCAL_EXPERTS = (1, 5, 8, 32, 128)
EP_SIZES = (None, 1, 2, 4, 8, 16, 32)  # None: a non-EP caller (global_num_experts == -1)
TOP_KS = (1, 2, 4, 6, 8)
INPUT_DTYPES = (None, torch.int8, torch.float8_e4m3fn)  # 1-byte inputs raise block_size_m to 16
HIDDEN = 16  # K: the smallest hidden size the Python checks accept; the spies ignore the weights
QUANT_TYPE = "uint4b8"  # GPTQ int4; the bit width only enters an argument check here


@dataclass(frozen=True)
class Case:
    m: int
    topk: int
    local_experts: int
    ep: int | None
    input_dtype: torch.dtype | None

    @property
    def global_experts(self) -> int:
        return spec.NON_EP if self.ep is None else self.local_experts * self.ep

    @property
    def input_itemsize(self) -> int | None:
        return None if self.input_dtype is None else self.input_dtype.itemsize

    def __str__(self) -> str:
        dtype = "bf16" if self.input_dtype is None else str(self.input_dtype).removeprefix("torch.")
        return f"M={self.m} topk={self.topk} E={self.local_experts} G={self.global_experts} input={dtype}"


def has_enough_experts(local_experts: int, ep: int | None, topk: int) -> bool:
    """True when the model has at least ``topk`` experts, so routing to ``topk`` distinct experts is possible."""
    return local_experts * (ep or 1) >= topk


def cases_for(local_experts: int, ep: int | None, topk: int) -> list[Case]:
    return [Case(m, topk, local_experts, ep, dt) for m, dt in itertools.product(M_VALUES, INPUT_DTYPES)]


@dataclass
class Inputs:
    hidden_states: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    scales: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    expert_map: torch.Tensor | None


def make_inputs(case: Case, expert_map_fn) -> Inputs:
    """Deterministic inputs of the shapes fused_marlin_moe checks (int4 weights, bf16 activations)."""
    gen = torch.Generator().manual_seed(case.m * 1009 + case.topk * 31 + case.local_experts)
    g = case.local_experts if case.ep is None else case.global_experts
    first = torch.randint(0, g, (case.m, 1), generator=gen)
    ids = ((first + torch.arange(case.topk)) % g).to(torch.int32)  # topk distinct experts per row
    expert_map = None
    if case.ep is not None and case.ep > 1:
        _, expert_map, _ = expert_map_fn(case.ep, 0, g)
    e = case.local_experts
    return Inputs(
        hidden_states=torch.randn(case.m, HIDDEN, generator=gen).to(torch.bfloat16),
        w1=torch.zeros(e, HIDDEN // 16, 2, dtype=torch.int32),
        w2=torch.zeros(e, 1, HIDDEN * 2, dtype=torch.int32),  # 4-bit: size(2) // 2 == K
        scales=torch.ones(e, 1, 1, dtype=torch.bfloat16),
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
        m = self.module
        self._saved = (m.moe_align_block_size, m._fused_marlin_moe, m.ops.moe_sum)
        m.moe_align_block_size, m._fused_marlin_moe, m.ops.moe_sum = self._align, self._kernel, self._moe_sum
        return self

    def __exit__(self, *exc) -> None:
        m = self.module
        m.moe_align_block_size, m._fused_marlin_moe, m.ops.moe_sum = self._saved


def observe(module: ModuleType, case: Case, inputs: Inputs, quant_type_id: int) -> Observation:
    """Call the real fused_marlin_moe of ``module`` on ``inputs`` and report what the kernels received."""
    map_before = None if inputs.expert_map is None else inputs.expert_map.clone()
    with KernelSpies(module) as spies:
        output = module.fused_marlin_moe(
            hidden_states=inputs.hidden_states,
            w1=inputs.w1,
            w2=inputs.w2,
            bias1=None,
            bias2=None,
            w1_scale=inputs.scales,
            w2_scale=inputs.scales,
            topk_weights=inputs.topk_weights,
            topk_ids=inputs.topk_ids,
            quant_type_id=quant_type_id,
            global_num_experts=case.global_experts,
            expert_map=inputs.expert_map,
            input_dtype=case.input_dtype,
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
        errors.append(f"{case}: moe_align_block_size got block_size {obs.align_block_size}, "
                      f"the kernel {obs.kernel_block_size}")  # fmt: skip
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
    return contract.fused_block_size_m(m=case.m, topk=case.topk, local_experts=case.local_experts,
                                       global_experts=case.global_experts, input_itemsize=case.input_itemsize,
                                       env=env)  # fmt: skip
