"""Mutation check of the contracts: a wrong version of each shipped change must fail the CPU tier's checks
under that change's contract (and the change itself must pass the same checks).

Each change of ``ci/changes/`` with a ``mutants/`` folder is built into a candidate tree from the base
tree, beside each of its mutants; the checks are the ones the CPU tier runs (``test_block_size_selection``
and ``test_batched_path``), under the contract setting named here.
"""

from __future__ import annotations

import pytest

from ci.build import CHANGES_DIR, BuildOptions, Release, build_trees
from ci.contracts import load_contract
from ci.variants import load_candidate
from tests.ep_marlin import batched_harness as bh
from tests.ep_marlin import cpu_harness as h

WRITTEN_FOR = "0.25.1"
# (change, mutant, contract setting, check): the check that must catch the mutant
MUTANTS = [
    ("block-size-override", "override-below-16-for-1-byte", "override-8", "fused"),
    ("batched-tile-from-load", "load-without-dispatchers", "default", "batched"),
]
FUSED_SAMPLE = [(8, ep, topk) for ep in (None, 4) for topk in (2, 8)]


def _candidate(trees, patch, out):
    release = Release(version=trees.manifest.vllm_version, root=trees.base, source="base tree")
    return load_candidate(build_trees(BuildOptions(patch=patch, contract="none", out=out), release=release))


@pytest.fixture(scope="module")
def built(trees, tmp_path_factory):
    if trees.manifest.vllm_version != WRITTEN_FOR or trees.manifest.reverse:
        pytest.skip(f"the changes and their mutants are written against vLLM {WRITTEN_FOR} (forward)")
    modules = {}
    for change, mutant, _, _ in MUTANTS:
        folder = CHANGES_DIR / change
        if change not in modules:
            modules[change] = _candidate(trees, folder / "change.patch", tmp_path_factory.mktemp(change))
        modules[mutant] = _candidate(trees, folder / "mutants" / f"{mutant}.patch", tmp_path_factory.mktemp(mutant))
    return modules


def _errors(module, contract, env, check, combos, expert_map_fn) -> list[str]:
    errors = []
    if check == "fused":
        for e, ep, topk in FUSED_SAMPLE:
            for case in h.cases_for(e, ep, topk, combos):
                obs = h.observe(module, case, h.make_inputs(case, expert_map_fn))
                errors += h.invariant_violations(obs, case)
                errors += h.rule_mismatches(obs, case, h.rule_value(contract, case, env), contract.name)
    else:
        for call in bh.calls_for(combos):
            obs = bh.observe(module, call)
            errors += bh.invariant_violations(obs, call)
            if obs["kernel_block_size"] != bh.contract_rule(contract, call, env):
                errors.append(f"{bh.where(call)}: not the contract's tile")
    return errors


@pytest.mark.parametrize(("change", "mutant", "setting_name", "check"), MUTANTS, ids=[m[1] for m in MUTANTS])
def test_contract_catches_the_mutant_and_passes_the_change(
    change, mutant, setting_name, check, built, monkeypatch, combos, expert_map_fn
):
    contract = load_contract(CHANGES_DIR / change / "contract.py")
    env = contract.settings[setting_name]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert not _errors(built[change], contract, env, check, combos, expert_map_fn), (
        f"the change {change} itself fails its contract under {setting_name}"
    )
    assert _errors(built[mutant], contract, env, check, combos, expert_map_fn), (
        f"mutant {mutant} passed the {check} checks of {change}'s contract ({setting_name}): they cannot see this bug"
    )
