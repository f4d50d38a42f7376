"""What the test plugins and suites share: the stash keys, the properties tests record for the run's summary,
the GPU suite's seed, and the change's contract as the trees' manifest recorded it (one place; no test module
or conftest imports another)."""

from __future__ import annotations

import json

import pytest

from ci.trees.build import CHANGES_DIR

TREES_KEY = pytest.StashKey()  # the trees of --gate-manifest (tests/conftest.py)
CONTRACT_KEY = pytest.StashKey()
SEED = 1234  # every random weight, routing and permutation of the GPU suite derives from it
COUNT_PROPERTY = "block_size_cases"  # record_property: how many block-size cases a test checked
METRIC_PROPERTY = "gate_metric"  # record_property: a measured error and its bound
NOT_IN_RELEASE_PROPERTY = "formats_not_in_release"  # record_property: {format: arguments the release lacks}


def contract_of(config: pytest.Config):
    """The change's contract recorded in the manifest (None: none), loaded once per process."""
    if CONTRACT_KEY not in config.stash:
        trees = config.stash.get(TREES_KEY, None)
        if trees is None:
            config.stash[CONTRACT_KEY] = None
        else:
            from ci.trees.contracts import from_manifest

            config.stash[CONTRACT_KEY] = from_manifest(trees.manifest.contract, trees.manifest_path)
    return config.stash[CONTRACT_KEY]


# The mutation check of the tiers (tests/<subject>/test_mutants.py): every ci/changes/<change>/mutants/<name>.patch
# has <name>.json beside it, saying which tier catches it and how ({"tier": "cpu", "check": ...} or
# {"tier": "gpu", "tests": ...}); the checks are the subjects': Marlin's four, Triton's one.
MUTANT_CHECKS = {
    "fused": "tests/ep_marlin",
    "align": "tests/ep_marlin",
    "non_ep": "tests/ep_marlin",
    "batched": "tests/ep_marlin",
    "triton": "tests/triton_moe",
}
MUTANTS_WRITTEN_FOR = "0.25.1"  # the changes' and their mutants' patches


def mutants() -> dict[str, dict]:
    """``change/name`` -> its expectation (with the paths), for every mutant patch of ci/changes."""
    found = {}
    for patch in sorted(CHANGES_DIR.glob("*/mutants/*.patch")):
        expect = patch.with_suffix(".json")
        spec = json.loads(expect.read_text()) if expect.exists() else {}
        found[f"{patch.parent.parent.name}/{patch.stem}"] = {
            **spec,
            "patch": patch,
            "expect": expect,
            "change": patch.parent.parent.name,
        }
    return found


def cpu_mutants(*checks: str) -> list[str]:
    """The CPU mutants whose check is one of ``checks``."""
    return [k for k, m in mutants().items() if m.get("tier") == "cpu" and m.get("check") in checks]


def built_mutants(trees, tmp_path_factory, names, load) -> dict:
    """Each mutant of ``names`` and each of their changes built into its own candidate tree from the base tree
    (``load(built trees)`` imports its module); skipped on a base other than the release the patches are for."""
    from ci.trees.build import BuildOptions, build_trees
    from ci.trees.release import Release

    if trees.manifest.vllm_version != MUTANTS_WRITTEN_FOR or not trees.manifest.base_is_release:
        pytest.skip(f"the changes and their mutants are written against vLLM {MUTANTS_WRITTEN_FOR} as released")
    release = Release(version=trees.manifest.vllm_version, root=trees.base, source="base tree")
    every = mutants()

    def candidate(patch, name):
        out = tmp_path_factory.mktemp(name.replace("/", "-"))
        return load(build_trees(BuildOptions(patch=patch, contract="none", out=out), release=release))

    modules = {}
    for name in names:
        change = every[name]["change"]
        if change not in modules:
            modules[change] = candidate(CHANGES_DIR / change / "change.patch", change)
        modules[name] = candidate(every[name]["patch"], name)
    return modules
