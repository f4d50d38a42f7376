"""The block-size oracle against a table measured on an H200 (vLLM 0.26.0: the block
size each rule picks, per shape, EP size and tokens per rank) and hand-worked cases."""

from __future__ import annotations

import pytest

from ci.moe import spec


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


def test_one_model_registry_for_the_bench_the_gpu_suite_and_the_served_configs():
    """ci.moe.shapes is the only place a model's MoE shape is written: the bench's suite uses it at full size,
    the GPU suite scales it down, and the configs the TPOT stage serves must agree with it."""
    import json

    from ci.kernel import suites
    from ci.moe import shapes
    from ci.serving import config as serving_config

    assert suites.MODEL_SHAPES["deepseek-v3"] == (7168, 2048, 256, 8)
    assert set(suites.MODEL_SHAPES) == set(shapes.MODELS)
    small = shapes.scaled("gpt-oss-120b", "gpt-oss-like", experts=16)
    assert (small.hidden, small.experts, small.topk) == (2944, 16, 4)
    assert small.note == "2880 padded to 2944 (Marlin: multiples of 128); experts scaled 128 -> 16"
    served = {"qwen3-30b-a3b-like": "qwen3-30b-a3b", "deepseek-v3-moe-shape": "deepseek-v3"}
    models = serving_config.MODELS_DIR
    for config_dir, model in served.items():
        c = json.loads((models / config_dir / "config.json").read_text())
        m = shapes.MODELS[model]
        got = (c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["num_experts_per_tok"])
        assert got == (m.hidden, m.intermediate, m.experts, m.topk), config_dir


@pytest.mark.parametrize(
    ("version", "has"),
    [
        ("0.25.1", False),
        ("0.25.2.dev40+gabc", False),
        ("0.26.0", True),
        ("0.26.0rc1", True),
        ("0.34.0", True),
        ("1.0", True),
    ],
)
def test_releases_from_0_26_hold_48144(version, has):
    assert spec.release_has_48144(version) is has


def test_a_version_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="not of the form"):
        spec.release_has_48144("main")


@pytest.mark.parametrize(
    ("version", "reverse", "patch", "overlaid", "rules"),
    [
        ("0.25.1", False, "ci/changes/tile-oracle/change.patch", False, {"0.25.1's": False}),
        ("0.26.0", False, "ci/changes/tile-oracle/releases/vllm-0.26.0.patch", False, {"#48144's": True}),
        ("0.34.0", True, "ci/changes/marlin-ep-m-estimate/releases/vllm-0.34.0.patch", False, {"0.25.1's": False}),
        ("0.26.0", True, "ci/changes/my-merged-change/change.patch", False, {"#48144's": True}),  # took another out
        ("0.25.1", False, ".gate/refs/a-b/change.patch", True, {"0.25.1's": False, "#48144's": True}),  # a checkout
    ],
)
def test_the_base_rule_follows_the_release_and_what_the_build_took_out(version, reverse, patch, overlaid, rules):
    assert spec.base_rules(version, reverse=reverse, patch_path=patch, overlaid=overlaid) == rules


def test_the_batched_load_is_every_dispatchers_assignments_over_the_global_experts():
    kw = {"num_dispatchers": 8, "global_experts": 256, "local_experts": 32}
    assert spec.batched_load(capacity=1024, assignments=8, **kw) == 1  # 64 assignments over 256 experts: ceil
    assert spec.batched_load(capacity=1024, assignments=8 * 33, **kw) == 9
    assert spec.batched_load(capacity=4, assignments=8 * 33, **kw) == 4  # at most the capacity
    assert spec.batched_load(capacity=64, assignments=0, **kw) == 1  # at least 1
    assert spec.batched_load(capacity=64, assignments=None, **kw) == 64  # a direct caller: the capacity
    assert spec.batched_load(capacity=64, assignments=10, num_dispatchers=2, global_experts=-1, local_experts=5) == 4
