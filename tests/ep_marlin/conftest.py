"""Fixtures of the equivalence suite: vLLM's base and candidate modules, the change's contract and its
settings, and case counting."""

from __future__ import annotations

import pytest

from tests.shared import contract_of


@pytest.fixture(scope="session")
def variants(trees):
    """(base, candidate): vLLM's marlin_moe module from each tree, in this process. A change whose contract
    names another subject's entry module (e.g. Triton's fused_moe) is not on this path: skipped, saying so."""
    from ci.trees.variants import ENTRY_MODULE, entry_module, load_variants

    if entry_module(trees) != ENTRY_MODULE:
        pytest.skip(
            f"the change under test enters vLLM through {entry_module(trees)}, not the Marlin MoE path "
            "(its own subject's tests check it)"
        )
    return load_variants(trees)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``setting``: every environment setting the contract names ("default" only without a contract)."""
    if "setting" in metafunc.fixturenames:
        contract = contract_of(metafunc.config)
        names = list(contract.settings) if contract else ["default"]
        metafunc.parametrize("setting", names)


@pytest.fixture
def default_setting(contract, monkeypatch) -> dict[str, str]:
    """Unset every variable the contract's settings name: the default is the default, whatever the shell says."""
    for name in {n for values in (contract.settings.values() if contract else ()) for n in values}:
        monkeypatch.delenv(name, raising=False)
    return {}


@pytest.fixture
def setting_env(setting, contract, default_setting, monkeypatch) -> dict[str, str]:
    """Apply the setting's environment for the test; returns it (what the contract's rules receive)."""
    env = contract.settings[setting] if contract else {}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture(scope="session")
def combos(variants):
    """The (format, hidden dtype) pairs of ``ci.kernel.formats`` the release's fused_marlin_moe takes."""
    from tests.ep_marlin.cpu_harness import combos_for

    return combos_for(variants[0].marlin_moe)


@pytest.fixture(scope="session")
def expert_map_fn():
    """vLLM's own expert placement (linear, uneven splits supported)."""
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

    return determine_expert_map
