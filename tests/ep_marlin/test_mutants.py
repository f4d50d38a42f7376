"""Mutation check of the Marlin tiers: deliberately wrong versions of each shipped Marlin change must be caught.

Every ``ci/changes/<change>/mutants/<name>.patch`` says in ``<name>.json`` which tier catches it
(``tests/unit/test_mutant_expectations.py`` checks every one says so). A CPU mutant of a Marlin check is built
into its own candidate tree from the base tree, beside its change, and run through the CPU tier's checks under
the change's contract and the named setting:

* ``fused``: the universal invariants and the contract's rule for ``fused_marlin_moe``;
* ``align``: ``moe_align_block_size`` gets the global expert count and the caller's routing;
* ``non_ep``: non-EP calls (G == -1, and G == E with no expert map) hand the kernels the base's arguments;
* ``batched``: the batched path's invariants and the contract's batched rule.

The mutant must fail its check; the change itself must pass the same check (the control). A ``{"tier": "gpu"}``
mutant names the GPU-suite tests that catch what the spies cannot see (``nox -s gpu_tests -- --patch <mutant>
--contract ci/changes/<change>/contract.py`` on a GPU host). Triton's mutants: ``tests/triton_moe/test_mutants.py``.
"""

from __future__ import annotations

import pytest

from ci.trees.contracts import load_contract
from ci.trees.variants import load_candidate
from tests.ep_marlin import batched_harness as bh
from tests.ep_marlin import cpu_harness as h
from tests.shared import CHANGES_DIR, built_mutants, cpu_mutants, mutants

CPU_MUTANTS = cpu_mutants("fused", "align", "non_ep", "batched")
# grid points (local experts, EP, top-k): both non-EP calls (G == -1; EP 1: G == E, no map) and EP ones
SAMPLE = [(8, ep, topk) for ep in (None, 1, 2, 4, 8) for topk in (2, 8)] + [(5, 16, 6), (32, 32, 8)]


@pytest.fixture(scope="module")
def built(trees, tmp_path_factory):
    return built_mutants(trees, tmp_path_factory, CPU_MUTANTS, load_candidate)


def _errors(check, module, base, contract, env, combos, expert_map_fn) -> list[str]:
    errors = []
    if check == "batched":
        for call in bh.calls_for(combos):
            obs = bh.observe(module, call)
            errors += bh.invariant_violations(obs, call)
            if contract.batched_block_size_m and obs["kernel_block_size"] != bh.contract_rule(contract, call, env):
                errors.append(f"{bh.where(call)}: not the contract's tile")
        return errors
    for e, ep, topk in SAMPLE:
        if check == "non_ep" and not h.is_non_ep(ep):
            continue
        for case in h.cases_for(e, ep, topk, combos):
            inputs = h.make_inputs(case, expert_map_fn)
            obs = h.observe(module, case, inputs)
            if check == "fused":
                errors += h.invariant_violations(obs, case)
                if contract.fused_block_size_m:
                    errors += h.rule_mismatches(obs, case, h.rule_value(contract, case, env), contract.name)
            elif check == "align":
                errors += h.align_mismatches(obs, case)
            else:
                errors += h.kernel_arg_differences(h.observe(base, case, inputs), obs, case)
    return errors


@pytest.mark.parametrize("name", CPU_MUTANTS)
def test_the_cpu_tier_catches_the_mutant_and_passes_its_change(
    name, built, variants, combos, expert_map_fn, monkeypatch
):
    m = mutants()[name]
    contract = load_contract(CHANGES_DIR / m["change"] / "contract.py")
    env = contract.settings[m.get("setting", "default")]
    for var in {v for values in contract.settings.values() for v in values}:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    base = variants[0].marlin_moe
    args = (base, contract, env, combos, expert_map_fn)
    assert not _errors(m["check"], built[m["change"]], *args), f"{m['change']} itself fails the {m['check']} check"
    assert _errors(m["check"], built[name], *args), (
        f"mutant {name} passed the {m['check']} check ({m['why']}): the CPU tier cannot see this bug"
    )
