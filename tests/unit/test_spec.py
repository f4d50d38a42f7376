"""The block-size oracle against a table measured on an H200 (vLLM 0.26.0: the block
size each rule picks, per shape, EP size and tokens per rank) and hand-worked cases."""

from __future__ import annotations

import pytest

from ci import spec


@pytest.mark.parametrize(
    ("g", "topk", "ep", "tokens_per_rank", "old", "new"),
    [
        (256, 8, 8, 8, 32, 8),  # DeepSeek-V3-like
        (256, 8, 8, 32, 64, 16),
        (256, 8, 8, 64, 64, 32),
        (128, 8, 4, 16, 32, 8),  # Qwen3-30B-A3B-like
    ],
)
def test_design_table_picks(g, topk, ep, tokens_per_rank, old, new):
    e, m = g // ep, tokens_per_rank * ep
    kw = dict(m=m, topk=topk, local_experts=e, global_experts=g, input_itemsize=None)
    assert spec.expected_block_size_m(**kw, patched=False) == old
    assert spec.expected_block_size_m(**kw, patched=True) == new


def test_estimate_is_ceil_and_non_ep_keeps_m():
    assert spec.estimated_tokens(10, 3, 8) == 4  # 30 / 8 = 3.75 -> 4
    assert spec.estimated_tokens(16, 4, 8) == 8
    assert spec.estimated_tokens(777, 32, spec.NON_EP) == 777


def test_threshold_is_strict_and_saturates_at_64():
    # M * topk / E / bm == 0.9 exactly is not below 0.9: move on to the next size.
    assert spec.pick_block_size_m(m=9, topk=8, local_experts=10) == 16  # 72/10/8 = 0.9
    assert spec.pick_block_size_m(m=1, topk=1, local_experts=1) == 8
    assert spec.pick_block_size_m(m=10**6, topk=8, local_experts=1) == 64


def test_one_byte_inputs_use_at_least_16():
    assert spec.pick_block_size_m(1, 1, 64, input_itemsize=1) == 16
    assert spec.pick_block_size_m(1, 1, 64, input_itemsize=2) == 8
    assert spec.pick_block_size_m(10**4, 8, 4, input_itemsize=1) == 64


def test_align_gets_global_count():
    assert spec.expected_align_experts(32, 256) == 256
    assert spec.expected_align_experts(32, spec.NON_EP) == 32
