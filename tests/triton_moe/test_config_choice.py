"""The Triton fused-MoE config choice of the base tree's vLLM against its specification (``ci.triton_moe.spec``).

vLLM's real ``try_get_optimal_moe_config`` (pure Python: no kernel runs) over the model shapes of
``ci.moe.shapes`` at every EP size, each config dtype, batch sizes from 1 to 8192, on an H200 (whose tuned
tables ship with vLLM), an H100 and a device without tables, with and without a user's table folder and
under ``VLLM_BATCH_INVARIANT``. Only the platform's answers are stand-ins (this machine has no GPU): the
device name, and whether it is CUDA. The oracle must agree everywhere; this is what a candidate's choice is
checked against once the subject has a contract (issue: the Triton fused_moe subject).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci.moe.shapes import MODELS
from ci.triton_moe import spec
from tests.triton_moe.harness import ROWS, on_device, read_table, require_specified_release

# the H200 family reads the H200's tables (an "H200 NVL" too); a GH200 is not of it
DEVICES = ("NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA GH200 480GB", "NVIDIA H100 80GB HBM3", "NVIDIA A10G")
# (config dtype, block_shape): bf16, FP8 per tensor, FP8 block-quantized, int4 / int8 weight-only with groups of 128
DTYPES = (
    (None, None),
    ("fp8_w8a8", None),
    ("fp8_w8a8", [128, 128]),
    ("int4_w4a16", [0, 128]),
    ("int8_w8a16", [0, 128]),
)


@pytest.fixture(scope="module")
def rules(trees):
    """The release's config-choice rules (the spec's, for this release)."""
    return require_specified_release(trees)


@pytest.fixture(scope="module")
def fused_moe(trees, rules):
    from vllm.model_executor.layers.fused_moe import fused_moe as module

    assert Path(module.__file__).resolve().is_relative_to(trees.base.resolve())
    return module


@pytest.fixture
def platform(fused_moe, monkeypatch):
    """Answer as a given device (``harness.on_device``)."""
    yield lambda device: on_device(fused_moe, monkeypatch, device)
    fused_moe.get_moe_configs.cache_clear()


def _shapes():
    for name, m in MODELS.items():
        for ep in (1, 2, 4, 8):
            if m.experts % ep == 0:
                local = m.experts // ep
                yield f"{name}/ep{ep}", (local, 2 * m.intermediate, m.hidden), (local, m.hidden, m.intermediate), m.topk


def _check(fused_moe, device: str, user: Path | None, batch_invariant: bool, rules) -> tuple[int, int]:
    """Every shape, dtype and batch size: vLLM's choice is the spec's. (points checked, shapes with a table)"""
    own = Path(fused_moe.__file__).parent / "configs"
    checked, tuned = 0, 0
    for case, w1, w2, topk in _shapes():
        for dtype, block in DTYPES:
            experts, n = spec.table_shape(w2, dtype)
            name = spec.config_file_name(experts, n, dtype, block, device)
            tables = [read_table(folder / name) for folder in ([user] if user else []) + [own]]
            tuned += any(tables)
            for m in ROWS:
                got = fused_moe.try_get_optimal_moe_config(w1, w2, topk, dtype, m, block_shape=block)
                want = spec.expected_config(
                    w1, w2, topk, dtype, m, block, tables=tables, batch_invariant=batch_invariant, rules=rules
                )
                assert got == want, f"{case} {dtype} {block} M={m} on {device}: vLLM {got}, spec {want}"
                checked += 1
    return checked, tuned


@pytest.mark.parametrize("device", DEVICES)
def test_the_config_choice_follows_the_spec(fused_moe, rules, platform, device, monkeypatch):
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    platform(device)
    checked, tuned = _check(fused_moe, device, None, batch_invariant=False, rules=rules)
    assert checked == len(list(_shapes())) * len(DTYPES) * len(ROWS)
    if "H200" in device.split():  # vLLM ships H200 tables for some of these shapes: the tuned path is exercised
        assert tuned > 0


def test_a_users_table_comes_first_and_ties_go_to_the_first_entry(fused_moe, rules, platform, tmp_path, monkeypatch):
    """A user's folder (VLLM_TUNED_CONFIG_FOLDER) is read before vLLM's own; of two batch sizes equally near M,
    the first in the file wins (8 and 16 for M = 12: 16 first in this file)."""
    platform("NVIDIA H200")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    m = MODELS["qwen3-30b-a3b"]
    w1, w2 = (m.experts, 2 * m.intermediate, m.hidden), (m.experts, m.hidden, m.intermediate)
    small = {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 32,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }
    table = {"16": {**small, "BLOCK_SIZE_N": 64}, "8": small, "triton_version": "3.6.0"}
    name = spec.config_file_name(*spec.table_shape(w2, None), None, None, "NVIDIA H200")
    (tmp_path / name).write_text(json.dumps(table))
    assert fused_moe.try_get_optimal_moe_config(w1, w2, m.topk, None, 12) == {**small, "BLOCK_SIZE_N": 64}
    assert spec.nearest_entry({16: "a", 8: "b"}, 12) == "a" and spec.nearest_entry({8: "b", 16: "a"}, 12) == "b"
    int4 = spec.config_file_name(*spec.table_shape(w2, "int4_w4a16"), "int4_w4a16", [0, 128], "NVIDIA H200")
    assert int4.startswith(f"E={m.experts},N={2 * m.intermediate},")  # two int4 values a byte: N doubled
    (tmp_path / int4).write_text(json.dumps({"1": small}))
    assert fused_moe.try_get_optimal_moe_config(w1, w2, m.topk, "int4_w4a16", 64, block_shape=[0, 128]) == small
    assert _check(fused_moe, "NVIDIA H200", tmp_path, batch_invariant=False, rules=rules)[1] > 0


def test_batch_invariant_mode_reads_noread_table(fused_moe, rules, platform, monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    platform("NVIDIA H200")
    assert _check(fused_moe, "NVIDIA H200", None, batch_invariant=True, rules=rules)[0] > 0


def test_the_rows_one_ep_rank_sees():
    """``M * E / G`` rounded up: 128 padded rows over 16 of 128 experts reach 16; without EP, all of them."""
    assert spec.rows_one_rank_sees(128, 16, 128) == 16 and spec.rows_one_rank_sees(129, 16, 128) == 17
    assert spec.rows_one_rank_sees(128, 128, spec.NON_EP) == 128
