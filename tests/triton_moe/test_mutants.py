"""Mutation check of the Triton tier: deliberately wrong versions of each shipped Triton change must be caught.

A CPU mutant whose check is ``triton`` is built into its own candidate tree from the base tree, beside its
change, and the config each launch of ``fused_experts_impl`` gets is checked against the base's and the contract's
``triton_config`` (``tests/triton_moe/harness.py``): the mutant must fail, its change must pass (the control).
"""

from __future__ import annotations

import importlib

import pytest

from ci.trees.contracts import load_contract
from ci.trees.variants import load_candidate
from ci.triton_moe import bench
from tests.shared import CHANGES_DIR, built_mutants, cpu_mutants, mutants
from tests.triton_moe.harness import config_mismatches

CPU_MUTANTS = cpu_mutants("triton")


@pytest.fixture(scope="module")
def built(trees, tmp_path_factory):
    return built_mutants(
        trees,
        tmp_path_factory,
        CPU_MUTANTS,
        lambda t: load_candidate(t, bench.ENTRY, during=bench.op_registration_skipped()),
    )


@pytest.mark.parametrize("name", CPU_MUTANTS)
def test_the_cpu_tier_catches_the_mutant_and_passes_its_change(name, built, monkeypatch):
    m = mutants()[name]
    contract = load_contract(CHANGES_DIR / m["change"] / "contract.py")
    base = importlib.import_module(bench.ENTRY)
    control = config_mismatches(base, built[m["change"]], contract, monkeypatch)[0]
    assert not control, f"{m['change']} itself fails the triton check: {control[:3]}"
    assert config_mismatches(base, built[name], contract, monkeypatch)[0], (
        f"mutant {name} passed the triton check ({m['why']}): the CPU tier cannot see this bug"
    )
