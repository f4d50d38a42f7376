"""A Triton fused-MoE change on the CPU: the candidate's real ``fused_experts_impl`` (its ``fused_moe.py`` loaded
from the candidate tree) under the same spies as the base's, call by call, over the model shapes, EP sizes,
quantization schemes and batch sizes of the base's test.

What every change is held to: both GEMMs of a call get one config and the aligner its M tile; without EP
(``global_num_experts == -1``) the candidate launches exactly what the base does, unless its contract says
the non-EP path may change. What a contract adds: under EP, the config of its rule ``triton_config`` given the
spec's configs for ``M`` and for ``ceil(M * E / G)`` rows (``ci.triton_moe.spec``); a contract that does not
change the EP path keeps the base's there too. Skipped, saying so, where the change under test is not on this
path (its contract names no Triton entry module).
"""

from __future__ import annotations

import pytest

from ci.moe.shapes import MODELS
from tests.triton_moe.harness import ROWS, SCHEMES, config_mismatches, require_specified_release


@pytest.fixture
def sides(trees):
    """Base and candidate ``fused_moe`` modules; skipped where the change is not on this path."""
    from ci.trees import variants
    from ci.triton_moe import bench

    if variants.entry_module(trees) != bench.ENTRY:
        pytest.skip(
            f"the change under test enters vLLM through {variants.entry_module(trees)}, not the Triton "
            "fused-MoE path (its own subject's tests check it)"
        )
    rules = require_specified_release(trees)
    modules = bench.load_sides(trees)
    yield modules, rules
    for fm in modules.values():
        fm.get_moe_configs.cache_clear()


def test_the_candidate_launches_what_its_contract_says(sides, contract, monkeypatch):
    modules, rules = sides
    wrong, checked, changed = config_mismatches(modules["base"], modules["candidate"], contract, monkeypatch, rules)
    if wrong:  # one message, not pytest's rendering of every wrong call
        pytest.fail(f"{len(wrong)} of {checked} calls: " + "; ".join(wrong[:3]), pytrace=False)
    assert checked == sum(len(SCHEMES) * len(ROWS) for m in MODELS.values() for ep in (1, 2, 8) if m.experts % ep == 0)
    if contract is not None and contract.changes_ep:
        assert changed > 0, f"contract {contract.name} says the EP path changes, and no call launched otherwise"
