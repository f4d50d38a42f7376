"""Fixtures of the equivalence suite: vLLM's base and candidate modules, and case counting."""

from __future__ import annotations

import pytest

COUNT_PROPERTY = "block_size_cases"
SEED = 1234  # every random weight, routing and permutation of the GPU suite derives from it


@pytest.fixture(scope="session")
def variants(trees):
    """(base, candidate): vLLM's marlin_moe module from each tree, in this process."""
    from ci.variants import load_variants

    return load_variants(trees)


@pytest.fixture(scope="session")
def quant_type_id():
    from vllm.scalar_type import scalar_types

    return scalar_types.uint4b8.id


@pytest.fixture(scope="session")
def expert_map_fn():
    """vLLM's own expert placement (linear, uneven splits supported)."""
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

    return determine_expert_map


METRIC_PROPERTY = "gate_metric"


@pytest.fixture
def metric(record_property):
    """Record a measured error (and its bound) for the run's JSON summary: metric(check, value, bound)."""

    def record(check: str, value: float, bound: float | None) -> None:
        record_property(METRIC_PROPERTY, {"check": check, "value": float(value), "bound": bound})

    return record
