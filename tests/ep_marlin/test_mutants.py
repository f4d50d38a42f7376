"""Mutation check of the CPU tier: deliberately wrong candidates must be caught.

Each mutant in ci/changes/marlin-ep-m-estimate/mutants/ is built into its own candidate tree from the base tree
and run through the same checks as the real candidate; each must fail the check it breaks.
"""

from __future__ import annotations

import pytest

from ci.build import DEFAULT_PATCH, MUTANTS_DIR, BuildOptions, Release, build_trees
from ci.variants import load_candidate
from tests.ep_marlin import cpu_harness as h

MUTANTS_WRITTEN_FOR = "0.25.1"
# mutant -> the check that must catch it
MUTANTS = {
    "floor-instead-of-ceil": "block_size",
    "estimate-without-ep": "non_ep",
    "local-experts-to-align": "align",
    "force-64-under-ep": "block_size",
    "drop-expert-map": "align",  # crashes the GPU (illegal memory access): tests/cuda_isolation.py
    "fp4-tile-64-under-ep": "block_size",  # on the FP4 cases (ci.formats) only
}
# Mutants the CPU tier cannot see (its spies replace the kernel call) -> the GPU-suite tests that catch them
GPU_MUTANTS = {"int8-input-scale-dropped": "test_format_*[w4a8-int8*] (tests/ep_marlin/test_gpu_equivalence.py)"}
SAMPLE = [(8, ep, topk) for ep in (None, 2, 4, 8) for topk in (2, 8)] + [(5, 16, 6), (32, 32, 8)]


@pytest.fixture(scope="module")
def mutant_modules(trees, tmp_path_factory):
    if trees.manifest.vllm_version != MUTANTS_WRITTEN_FOR or trees.manifest.reverse:
        pytest.skip(f"the mutants are written against vLLM {MUTANTS_WRITTEN_FOR} (forward); these trees differ")
    release = Release(version=trees.manifest.vllm_version, root=trees.base, source="base tree")
    modules = {}
    patches = {name: MUTANTS_DIR / f"{name}.patch" for name in MUTANTS} | {"shipped": DEFAULT_PATCH}
    for name, patch in patches.items():
        out = tmp_path_factory.mktemp(name)
        built = build_trees(BuildOptions(patch=patch, out=out), release=release)
        modules[name] = load_candidate(built)
    return modules


def _errors(kind, mutant, base, combos, expert_map_fn):
    errors = []
    for e, ep, topk in SAMPLE:
        for case in h.cases_for(e, ep, topk, combos):
            inputs = h.make_inputs(case, expert_map_fn)
            obs = h.observe(mutant, case, inputs)
            if kind == "block_size":
                errors += h.block_size_mismatches(obs, case, patched=True)
            elif kind == "align":
                errors += h.align_mismatches(obs, case)
            elif case.ep is None:
                errors += h.kernel_arg_differences(h.observe(base, case, inputs), obs, case)
    return errors


def test_every_mutant_names_the_tier_that_catches_it():
    """A mutant file with no catcher listed here would be a claim nobody checks."""
    files = {p.stem for p in MUTANTS_DIR.glob("*.patch")}
    assert files == set(MUTANTS) | set(GPU_MUTANTS), f"unlisted {files - set(MUTANTS) - set(GPU_MUTANTS)}"
    assert not set(MUTANTS) & set(GPU_MUTANTS)


@pytest.mark.parametrize(("name", "kind"), MUTANTS.items())
def test_mutant_is_caught(name, kind, mutant_modules, variants, combos, expert_map_fn):
    errors = _errors(kind, mutant_modules[name], variants[0].marlin_moe, combos, expert_map_fn)
    assert errors, f"mutant {name} passed the {kind} check: the CPU tier cannot see this bug"


def test_real_candidate_passes_the_same_checks(mutant_modules, variants, combos, expert_map_fn):
    """The control: the same sample finds nothing wrong with the shipped patch (built here, like the mutants,
    so the control holds whatever change the trees under test carry)."""
    for kind in set(MUTANTS.values()):
        assert not _errors(kind, mutant_modules["shipped"], variants[0].marlin_moe, combos, expert_map_fn)
