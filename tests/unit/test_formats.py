"""The format registry (ci.kernel.formats) and how the bench's suites draw on it (no GPU, no vLLM)."""

from __future__ import annotations

import pytest

from ci.core.errors import UsageError
from ci.kernel import formats, suites
from ci.moe.spec import BLOCK_SIZES_M


def test_every_format_names_a_scheme_and_the_combinations_vllm_serves():
    assert {f.scheme for f in formats.FORMATS} <= set(formats.SCHEMES)
    by_name = formats.FORMATS_BY_NAME
    assert by_name["nvfp4"].quant.has_global_scale and not by_name["mxfp4"].quant.has_global_scale
    assert by_name["nvfp4"].input_dtype is None  # NVFP4 takes no 8-bit input (vLLM's helper asserts it)
    assert all(f.input_dtype != "int8" for f in formats.FORMATS if f.quant.fp4)  # MXFP4: no int8 input
    assert {f.name for f in formats.FORMATS if not f.hopper} == {"w4a8-fp8", "mxfp4-a8-fp8"}
    assert all(f.input_itemsize == (1 if f.input_dtype else None) for f in formats.FORMATS)
    assert by_name["gpt-oss-mxfp4"].bias and by_name["gpt-oss-mxfp4"].clamp
    assert len(formats.FORMAT_COMBOS) == sum(len(f.activations) for f in formats.FORMATS) == 21


def test_the_default_suite_has_the_fp4_int8_and_small_capacity_cases():
    cases = {c.id: c for c in suites.suite_cases("default")}
    assert len(cases) == 165
    fp4 = [c for c in cases.values() if c.format.quant.fp4]
    assert {c.shape_name for c in fp4} == {"deepseek-v3", "gpt-oss-120b"} and {c.ep for c in fp4} == {1, 2, 4, 8}
    assert {c.capacity for c in cases.values() if c.path == "batched"} == {4, 8, 16, 32, 64, 1024}
    assert cases["qwen3-30b-a3b/ep8/tpr8/w4a8-int8/bf16"].format.input_dtype == "int8"
    assert cases["deepseek-v3/ep8/tpr8/gptq-int4-g128/bf16"].format is formats.FORMATS_BY_NAME["gptq-int4"]


def test_the_non_ep_cases_call_with_minus_one_and_with_e_as_the_modular_kernel_does():
    """Every shape's non-EP fused path is timed at G == -1 (a direct caller) and at G == E with no expert map
    (how vLLM's modular kernel calls the experts for a server without EP), in both suites."""
    for suite in ("default", "quick"):
        cases = suites.suite_cases(suite)
        modular = [c for c in cases if c.g_equals_e]
        assert modular and all(c.non_ep and c.global_num_experts == c.experts for c in modular)
        assert {c.id.split("/")[1] for c in modular} == {f"ep1-g{c.experts}" for c in modular}
        minus_one = {(c.shape_name, c.tokens_per_rank) for c in cases if c.non_ep and c.global_num_experts == -1}
        assert {(c.shape_name, c.tokens_per_rank) for c in modular} <= minus_one
    default = suites.suite_cases("default")
    assert {c.shape_name for c in default if c.g_equals_e} == set(suites.MODEL_SHAPES)
    assert not any(c.non_ep for c in default if c.ep > 1 or c.path == "batched")


def test_cases_takes_several_globs_and_names_the_one_that_matches_nothing():
    new = suites.suite_cases("default", "*nvfp4*,*mxfp4*,*w4a8*,*batched-cap[0-9]/*,*batched-cap[0-9][0-9]/*")
    assert len(new) == 35 and all("gptq-int4-g128/bf16" not in c.id or "cap1024" not in c.id for c in new)
    assert len(suites.suite_cases("default", "deepseek-v3/ep8/*")) == 16
    with pytest.raises(UsageError, match="matches no case"):
        suites.suite_cases("default", "nothing/*,nor-this/*")


def test_the_sweep_skips_the_tiles_the_kernel_has_no_config_for_with_8_bit_inputs():
    cases = {c.id: c for c in suites.suite_cases("default")}
    assert suites.runnable_block_sizes(cases["qwen3-30b-a3b/ep8/tpr8/w4a8-int8/bf16"]) == (16, 32, 48, 64)
    assert suites.runnable_block_sizes(cases["deepseek-v3/ep8/tpr8/nvfp4/bf16"]) == BLOCK_SIZES_M
