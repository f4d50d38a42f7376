"""CPU tier: vLLM's real fused_marlin_moe from each tree, only its CUDA work replaced by spies.

Checks, over a grid of M, local experts, EP sizes, top-k and input dtypes:

* the base picks exactly the release's block size (``ci.spec``: the oracle, written from the rule's words);
* the candidate keeps the universal invariants, in every setting its contract names: a block size the
  kernel has, the same one for aligner and kernel, at least 16 for 1-byte inputs, and
  ``moe_align_block_size`` gets the global expert count and the caller's ``expert_map``;
* the candidate picks exactly what its contract's rule says (``ci/changes/<name>/contract.py``), when the
  change has a contract with a rule for this path; without one, the test says that no rule was checked;
* every path the change does not declare (``global_num_experts == -1`` always, unless declared) hands the
  kernels identical arguments in base and candidate (the promise of #48144: non-EP behaviour unchanged).
"""

from __future__ import annotations

import pytest

from ci import contracts, spec
from tests.ep_marlin import cpu_harness as h
from tests.shared import COUNT_PROPERTY, contract_of

GRID = [
    pytest.param(e, ep, topk, id=f"E{e}-ep{'none' if ep is None else ep}-topk{topk}")
    for e in h.LOCAL_EXPERTS
    for ep in h.EP_SIZES
    for topk in h.TOP_KS
    if h.has_enough_experts(e, ep, topk)
]
NON_EP_GRID = [p for p in GRID if p.values[1] is None]


def _observations(module, e, ep, topk, quant_type_id, expert_map_fn):
    for case in h.cases_for(e, ep, topk):
        yield case, h.observe(module, case, h.make_inputs(case, expert_map_fn), quant_type_id)


@pytest.mark.parametrize(("e", "ep", "topk"), GRID)
def test_base_follows_the_release_rule(e, ep, topk, variants, quant_type_id, expert_map_fn, record_property):
    """The base tree picks the release's block size (the oracle in ci.spec) and feeds the aligner right."""
    errors, n = [], 0
    for case, obs in _observations(variants[0].marlin_moe, e, ep, topk, quant_type_id, expert_map_fn):
        errors += h.block_size_mismatches(obs, case, patched=False)
        errors += h.align_mismatches(obs, case)
        n += 1
    record_property(COUNT_PROPERTY, {"base": n})
    assert not errors, f"{len(errors)} of {n} cases differ from the spec:\n" + "\n".join(errors[:20])


@pytest.mark.parametrize(("e", "ep", "topk"), GRID)
def test_candidate_keeps_the_invariants_and_its_contract(
    e, ep, topk, setting, setting_env, contract, variants, quant_type_id, expert_map_fn, record_property
):
    """Universal invariants always; the contract's exact rule where it has one (under each of its settings)."""
    rule = contract.fused_block_size_m if contract else None
    errors, n = [], 0
    for case, obs in _observations(variants[1].marlin_moe, e, ep, topk, quant_type_id, expert_map_fn):
        errors += h.invariant_violations(obs, case)
        if rule is not None:
            errors += h.rule_mismatches(obs, case, h.rule_value(contract, case, setting_env), f"{contract.name}")
        n += 1
    record_property(
        COUNT_PROPERTY, {"candidate" if setting == contracts.DEFAULT_SETTING else f"candidate {setting}": n}
    )
    where = f"setting {setting} {setting_env}" if setting_env else "default setting"
    assert not errors, f"{len(errors)} of {n} cases break the invariants or the contract ({where}):\n" + "\n".join(
        errors[:20]
    )


def test_the_change_states_its_rule(contract, trees):
    """The contract the manifest recorded is the one checked; without one, the report says no rule was."""
    if contract is None:
        pytest.skip(contracts.NO_CONTRACT)
    assert contract.rules, f"{contract.path} declares no rule: only the invariants are checked"
    assert trees.manifest.contract["rules"] == contract.rules


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The identical-arguments check runs on the grid points of the paths the change does not declare."""
    if metafunc.definition.name != "test_undeclared_paths_keep_the_base_arguments":
        return
    contract = contract_of(metafunc.config)
    points = [p for p in GRID if not contracts.may_change(contract, "non_ep" if p.values[1] is None else "ep")]
    everything = pytest.param(None, None, None, id="none", marks=pytest.mark.skip(reason="the change declares "
                              "both fused paths (non-EP and EP) changed"))  # fmt: skip
    metafunc.parametrize(("e", "ep", "topk"), points or [everything])


def test_undeclared_paths_keep_the_base_arguments(e, ep, topk, default_setting, variants, quant_type_id, expert_map_fn):
    """A path the change does not declare (non-EP always, unless declared): every kernel argument is the base's."""
    base, cand = (v.marlin_moe for v in variants)
    errors = []
    for case in h.cases_for(e, ep, topk):
        inputs = h.make_inputs(case, expert_map_fn)
        errors += h.kernel_arg_differences(
            h.observe(base, case, inputs, quant_type_id), h.observe(cand, case, inputs, quant_type_id), case
        )
    assert not errors, "a path the change does not declare changed:\n" + "\n".join(errors[:20])


def test_grid_is_large():
    """The grid covers hundreds of configurations, odd M values and every EP size of the issue."""
    assert len(GRID) >= 150 and len(NON_EP_GRID) >= 15
    assert {1, 3, 8191, 8192} <= set(h.M_VALUES)
    assert {None, 1, 2, 4, 8, 16, 32} == set(h.EP_SIZES)
    assert spec.NON_EP == -1
