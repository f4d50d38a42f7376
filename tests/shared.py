"""What the test plugins and suites share: the stash keys, the properties tests record for the run's summary,
the GPU suite's seed, and the change's contract as the trees' manifest recorded it (one place; no test module
or conftest imports another)."""

from __future__ import annotations

import pytest

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
