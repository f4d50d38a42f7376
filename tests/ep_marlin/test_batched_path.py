"""CPU tier, the batched path: vLLM's real ``batched_fused_marlin_moe`` from each tree, only its CUDA work
(``batched_moe_align_block_size``, ``_fused_marlin_moe``) replaced by spies.

The batched path (DeepEP low latency: tokens already grouped per expert, ``[E, capacity, K]``) picks its
tile from the capacity. The shipped patch does not touch it, so here both builds must pick
``ci.spec.batched_block_size_m`` and hand the kernels identical arguments; the aligner must get the
capacity and the caller's per-expert token counts untouched.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from ci import spec
from tests.ep_marlin import cpu_harness as h
from tests.ep_marlin.conftest import COUNT_PROPERTY

CAPACITIES = (1, 2, 7, 8, 9, 14, 15, 16, 17, 28, 29, 32, 43, 44, 48, 57, 58, 64, 65, 128, 256, 1024)
LOCAL_EXPERTS = (1, 4, 8)
LOADS = ("full", "sparse", "empty")  # tokens per expert: all at capacity, a few, none


class BatchedSpies:
    def __init__(self, module) -> None:
        self.module, self.align, self.kernel = module, [], []

    def _align(self, *, max_tokens_per_batch, block_size, expert_num_tokens):
        self.align.append({"max_tokens_per_batch": max_tokens_per_batch, "block_size": block_size,
                           "expert_num_tokens": expert_num_tokens})  # fmt: skip
        n = expert_num_tokens.numel() * max_tokens_per_batch
        return torch.arange(n, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), torch.tensor([n])

    def _kernel(self, **kwargs):
        self.kernel.append(kwargs)
        return kwargs["hidden_states"].clone()

    def __enter__(self):
        m = self.module
        self._saved = (m.batched_moe_align_block_size, m._fused_marlin_moe)
        m.batched_moe_align_block_size, m._fused_marlin_moe = self._align, self._kernel
        return self

    def __exit__(self, *exc) -> None:
        self.module.batched_moe_align_block_size, self.module._fused_marlin_moe = self._saved


def observe(module, e: int, capacity: int, load: str, input_dtype, quant_type_id: int):
    gen = torch.Generator().manual_seed(e * 1009 + capacity)
    hidden = torch.randn(e, capacity, h.HIDDEN, generator=gen).to(torch.bfloat16)
    per_expert = {"full": capacity, "sparse": min(capacity, 2), "empty": 0}[load]
    counts = torch.full((e,), per_expert, dtype=torch.int32)
    counts_before = counts.clone()
    with BatchedSpies(module) as spies:
        out = module.batched_fused_marlin_moe(
            hidden_states=hidden,
            expert_num_tokens=counts,
            w1=torch.zeros(e, h.HIDDEN // 16, 2, dtype=torch.int32),
            w2=torch.zeros(e, 1, h.HIDDEN * 2, dtype=torch.int32),  # 4-bit: size(2) // 2 == K
            bias1=None,
            bias2=None,
            w1_scale=torch.ones(e, 1, 1, dtype=torch.bfloat16),
            w2_scale=torch.ones(e, 1, 1, dtype=torch.bfloat16),
            quant_type_id=quant_type_id,
            input_dtype=input_dtype,
        )
    assert len(spies.align) == 1 and len(spies.kernel) == 1, "one align and one kernel call"
    align, kernel = spies.align[0], spies.kernel[0]
    return {
        "align_block_size": align["block_size"],
        "kernel_block_size": kernel["block_size_m"],
        "align_capacity": align["max_tokens_per_batch"],
        "counts_passed": align["expert_num_tokens"] is counts and torch.equal(counts, counts_before),
        "kernel_args": {k: h.describe(v) for k, v in kernel.items()},
        "output_shape_ok": tuple(out.shape) == (e, capacity, h.HIDDEN) and torch.equal(out, hidden),
    }


GRID = list(itertools.product(LOCAL_EXPERTS, CAPACITIES, LOADS, h.INPUT_DTYPES))


def _itemsize(dtype) -> int | None:
    return None if dtype is None else dtype.itemsize


@pytest.mark.parametrize("side", ["base", "candidate"])
def test_batched_block_size_comes_from_the_capacity(side, variants, quant_type_id, record_property):
    module = dict(zip(("base", "candidate"), variants, strict=True))[side].marlin_moe
    errors = []
    for e, cap, load, dtype in GRID:
        obs = observe(module, e, cap, load, dtype, quant_type_id)
        want = spec.batched_block_size_m(cap, _itemsize(dtype))
        where = f"E={e} capacity={cap} load={load} input={dtype}"
        if obs["align_block_size"] != want or obs["kernel_block_size"] != want:
            errors.append(f"{where}: block size {obs['align_block_size']}/{obs['kernel_block_size']}, spec {want}")
        if obs["align_capacity"] != cap or not obs["counts_passed"] or not obs["output_shape_ok"]:
            errors.append(f"{where}: the aligner did not get the capacity and the caller's token counts, "
                          "or the output is not the kernel's, reshaped")  # fmt: skip
    record_property(COUNT_PROPERTY, {f"batched {side}": len(GRID)})
    assert not errors, f"{len(errors)} of {len(GRID)} batched cases differ:\n" + "\n".join(errors[:20])


def test_batched_kernel_arguments_identical_in_both_builds(variants, quant_type_id):
    """#48144 changes fused_marlin_moe only: on the batched path every kernel argument stays the same."""
    base, cand = (v.marlin_moe for v in variants)
    errors = []
    for e, cap, load, dtype in GRID:
        a, b = (observe(m, e, cap, load, dtype, quant_type_id)["kernel_args"] for m in (base, cand))
        errors += [
            f"E={e} capacity={cap} load={load}: {k} differs" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
        ]
    assert not errors, "the batched path changed:\n" + "\n".join(errors[:20])


def test_the_batched_rule_in_the_spec():
    assert [spec.batched_block_size_m(c) for c in (1, 7, 8, 14, 15, 28, 29, 43, 44, 57, 58, 1024)] == [
        8, 8, 16, 16, 32, 32, 48, 48, 64, 64, 64, 64]  # fmt: skip
    assert spec.batched_block_size_m(1, input_itemsize=1) == 16
