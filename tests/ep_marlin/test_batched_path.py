"""CPU tier, the batched path: vLLM's real ``batched_fused_marlin_moe`` from each tree, only its CUDA work
(``batched_moe_align_block_size``, ``_fused_marlin_moe``) replaced by spies, reached two ways:

* ``direct``: called as a library function (no token load known);
* ``apply``: through vLLM's ``BatchedMarlinExperts.apply``, the DeepEP low-latency caller, which sees this
  rank's ``topk_ids`` and the number of dispatchers (``ci.kernel.moe_case.call_batched``).

The tokens arrive grouped per expert, ``[E, capacity, K]``. The base must pick the release's tile, from the
capacity (``ci.moe.spec.batched_block_size_m``). The candidate must keep the universal invariants (a tile the
kernel has, the same for aligner and kernel, at least 16 for 1-byte inputs, the aligner gets the capacity
and the caller's per-expert counts untouched, the output is the kernel's), follow its contract's batched
rule where it has one, and hand the kernels the base's arguments when the change does not declare this path.
"""

from __future__ import annotations

import pytest

from ci.moe import spec
from ci.trees import contracts
from tests.ep_marlin import batched_harness as bh
from tests.shared import COUNT_PROPERTY


def test_base_follows_the_release_rule(variants, combos, record_property):
    """Both callers: the base's tile comes from the capacity (ci.moe.spec.batched_block_size_m)."""
    errors = []
    for call in bh.calls_for(combos):
        obs = bh.observe(variants[0].marlin_moe, call)
        want = spec.batched_block_size_m(call["capacity"], bh.itemsize(call))
        if obs["kernel_block_size"] != want:
            errors.append(f"{bh.where(call)}: block size {obs['kernel_block_size']}, the release's rule says {want}")
        errors += bh.invariant_violations(obs, call)
    record_property(COUNT_PROPERTY, {"batched base": len(bh.calls_for(combos))})
    assert not errors, f"{len(errors)} of {len(bh.calls_for(combos))} batched cases differ:\n" + "\n".join(errors[:20])


def test_candidate_keeps_the_invariants_and_its_contract(
    setting, setting_env, contract, variants, combos, record_property
):
    rule = contract.batched_block_size_m if contract else None
    errors = []
    for call in bh.calls_for(combos):
        obs = bh.observe(variants[1].marlin_moe, call)
        errors += bh.invariant_violations(obs, call)
        if rule is not None and obs["kernel_block_size"] != (want := bh.contract_rule(contract, call, setting_env)):
            errors.append(f"{bh.where(call)}: block size {obs['kernel_block_size']}, {contract.name} says {want}")
    label = "batched candidate" + ("" if setting == contracts.DEFAULT_SETTING else f" {setting}")
    record_property(COUNT_PROPERTY, {label: len(bh.calls_for(combos))})
    n = len(bh.calls_for(combos))
    assert not errors, f"{len(errors)} of {n} batched cases break the invariants or the contract:\n" + "\n".join(
        errors[:20]
    )


def test_batched_arguments_are_the_base_unless_declared(default_setting, contract, variants, combos):
    """A change that does not declare the batched path (#48144 does not) leaves every kernel argument alone."""
    if contracts.may_change(contract, "batched"):
        pytest.skip(f"the batched path may change ({contract.name if contract else 'no contract'})")
    base, cand = (v.marlin_moe for v in variants)
    errors = []
    for call in bh.calls_for(combos):
        a, b = (bh.observe(m, call)["kernel_args"] for m in (base, cand))
        errors += [f"{bh.where(call)}: {k} differs" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    assert not errors, "the batched path changed:\n" + "\n".join(errors[:20])


def test_the_batched_rule_in_the_spec():
    assert [spec.batched_block_size_m(c) for c in (1, 7, 8, 14, 15, 28, 29, 43, 44, 57, 58, 1024)] == [
        8,
        8,
        16,
        16,
        32,
        32,
        48,
        48,
        64,
        64,
        64,
        64,
    ]
    assert spec.batched_block_size_m(1, input_itemsize=1) == 16
    assert len(bh.DIRECT) == 594 and len(bh.APPLY) == 972


def test_a_release_that_serves_no_batched_pair_fails_rather_than_passing_on_nothing():
    with pytest.raises(AssertionError, match="no batched case to run: the release serves none"):
        bh.calls_for([])
