"""Mutation check of the tiers: deliberately wrong versions of each shipped change must be caught.

Every ``ci/changes/<change>/mutants/<name>.patch`` has ``<name>.json`` beside it, saying which tier catches
it and how: ``{"tier": "cpu", "check": ..., "setting": ...}`` is run here, ``{"tier": "gpu", "tests": ...}``
names the GPU-suite tests that catch what the CPU tier's spies cannot see (run on a GPU host with
``nox -s gpu_tests -- --patch <mutant> --contract ci/changes/<change>/contract.py``). A CPU mutant is built
into its own candidate tree from the base tree, beside its change, and run through the CPU tier's checks
under the change's contract and the named setting:

* ``fused``: the universal invariants and the contract's rule for ``fused_marlin_moe``;
* ``align``: ``moe_align_block_size`` gets the global expert count and the caller's routing;
* ``non_ep``: non-EP calls (G == -1, and G == E with no expert map) hand the kernels the base's arguments;
* ``batched``: the batched path's invariants and the contract's batched rule;
* ``triton``: a Triton fused-MoE change (its contract's ``ENTRY_MODULE``): the config each launch of
  ``fused_experts_impl`` gets, against the base's and the contract's ``triton_config``
  (``tests/triton_moe/harness.py``).

The mutant must fail its check; the change itself must pass the same check (the control).
"""

from __future__ import annotations

import json

import pytest

from ci.trees.build import CHANGES_DIR, BuildOptions, build_trees
from ci.trees.contracts import load_contract
from ci.trees.release import Release
from ci.trees.variants import load_candidate
from tests.ep_marlin import batched_harness as bh
from tests.ep_marlin import cpu_harness as h

WRITTEN_FOR = "0.25.1"
CHECKS = ("fused", "align", "non_ep", "batched", "triton")
# grid points (local experts, EP, top-k): both non-EP calls (G == -1; EP 1: G == E, no map) and EP ones
SAMPLE = [(8, ep, topk) for ep in (None, 1, 2, 4, 8) for topk in (2, 8)] + [(5, 16, 6), (32, 32, 8)]


def _mutants() -> dict[str, dict]:
    """``change/name`` -> its expectation (with the paths), for every mutant patch of ci/changes."""
    found = {}
    for patch in sorted(CHANGES_DIR.glob("*/mutants/*.patch")):
        expect = patch.with_suffix(".json")
        spec = json.loads(expect.read_text()) if expect.exists() else {}
        found[f"{patch.parent.parent.name}/{patch.stem}"] = {**spec, "patch": patch, "expect": expect,
                                                             "change": patch.parent.parent.name}  # fmt: skip
    return found


MUTANTS = _mutants()
CPU_MUTANTS = [k for k, m in MUTANTS.items() if m.get("tier") == "cpu"]


def test_every_mutant_says_which_tier_catches_it():
    """A mutant without its expectation, or with one nobody checks, is a claim nobody checks."""
    assert len(MUTANTS) >= 9
    for m in MUTANTS.values():
        assert m["expect"].exists(), f"{m['patch']}: no {m['expect'].name} beside it saying which tier catches it"
        assert m.get("tier") in ("cpu", "gpu"), f"{m['expect']}: tier is 'cpu' or 'gpu'"
        assert m["tier"] == "gpu" or m.get("check") in CHECKS, f"{m['expect']}: check is one of {CHECKS}"
        assert m["tier"] == "cpu" or m.get("tests"), f"{m['expect']}: a GPU mutant names the tests that catch it"
        assert m.get("why"), f"{m['expect']}: say what the mutant breaks"
        contract = load_contract(CHANGES_DIR / m["change"] / "contract.py")
        assert m.get("setting", "default") in contract.settings, f"{m['expect']}: no such setting"


@pytest.fixture(scope="module")
def built(trees, tmp_path_factory):
    if trees.manifest.vllm_version != WRITTEN_FOR or trees.manifest.reverse:
        pytest.skip(f"the changes and their mutants are written against vLLM {WRITTEN_FOR} (forward)")
    release = Release(version=trees.manifest.vllm_version, root=trees.base, source="base tree")

    def candidate(patch, name, check):
        out = tmp_path_factory.mktemp(name.replace("/", "-"))
        built = build_trees(BuildOptions(patch=patch, contract="none", out=out), release=release)
        if check != "triton":
            return load_candidate(built)
        from ci.triton_moe import bench

        return load_candidate(built, bench.ENTRY, during=bench.op_registration_skipped())

    modules = {}
    for name in CPU_MUTANTS:
        change = MUTANTS[name]["change"]
        check = MUTANTS[name]["check"]
        if change not in modules:
            modules[change] = candidate(CHANGES_DIR / change / "change.patch", change, check)
        modules[name] = candidate(MUTANTS[name]["patch"], name, check)
    return modules


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
def test_the_cpu_tier_catches_the_mutant_and_passes_its_change(name, built, variants, combos, expert_map_fn,
                                                               monkeypatch):  # fmt: skip
    m = MUTANTS[name]
    contract = load_contract(CHANGES_DIR / m["change"] / "contract.py")
    env = contract.settings[m.get("setting", "default")]
    for var in {v for values in contract.settings.values() for v in values}:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    if m["check"] == "triton":
        import importlib

        from ci.triton_moe import bench
        from tests.triton_moe.harness import config_mismatches

        base = importlib.import_module(bench.ENTRY)
        control = config_mismatches(base, built[m["change"]], contract, monkeypatch)[0]
        assert not control, f"{m['change']} itself fails the triton check: {control[:3]}"
        assert config_mismatches(base, built[name], contract, monkeypatch)[0], (
            f"mutant {name} passed the triton check ({m['why']}): the CPU tier cannot see this bug"
        )
        return
    base = variants[0].marlin_moe
    args = (base, contract, env, combos, expert_map_fn)
    assert not _errors(m["check"], built[m["change"]], *args), f"{m['change']} itself fails the {m['check']} check"
    assert _errors(m["check"], built[name], *args), (
        f"mutant {name} passed the {m['check']} check ({m['why']}): the CPU tier cannot see this bug"
    )
