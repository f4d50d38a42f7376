"""vLLM's real ``fused_experts_impl`` (the Triton fused-MoE path), with its kernel launches, the aligner, the
activation quantization and ``moe_sum`` replaced by spies: the config each launch gets, under EP and without.

The tensors live on PyTorch's ``meta`` device (shapes, no storage: a full-size model costs nothing) and every
CUDA or Triton call is a spy, so the base tree's own Python runs on any machine. Each call must launch both
GEMMs with the config the spec (``ci.triton_moe.spec``) gives for ``M = hidden_states.size(0)``, and hand the
aligner the same ``BLOCK_SIZE_M`` and the global expert count. Under EP that ``M`` is every rank's padded rows,
while one rank's experts see about ``ceil(M * E / G)`` of them: the table at the end counts where the two
would pick different configs, the exposure a change of the rule would act on.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from ci.kernel.shapes import MODELS
from ci.triton_moe import spec
from tests.triton_moe.harness import ROWS, on_device, read_table, require_specified_release

# (config dtype, block_shape, the use_* flag fused_experts_impl takes)
SCHEMES = ((None, None, {}), ("fp8_w8a8", None, {"use_fp8_w8a8": True}),
           ("fp8_w8a8", [128, 128], {"use_fp8_w8a8": True}), ("int8_w8a16", [0, 128], {"use_int8_w8a16": True}),
           ("int4_w4a16", [0, 128], {"use_int4_w4a16": True}))  # fmt: skip
DEVICE = "NVIDIA H200"


@pytest.fixture
def spied(trees, monkeypatch):
    """The base tree's fused_moe module with its kernels, aligner and quantization spied; the calls they saw."""
    require_specified_release(trees)
    from vllm.model_executor.layers.fused_moe import fused_moe as fm

    calls: list[tuple] = []

    def prepare(topk_ids, config, num_tokens, top_k, global_num_experts, expert_map, **kwargs):
        calls.append(("align", config["BLOCK_SIZE_M"], global_num_experts, expert_map is not None))
        n = topk_ids.numel()
        return (torch.empty(n, dtype=torch.int32, device="meta"), torch.empty(n, dtype=torch.int32, device="meta"),
                torch.empty(1, dtype=torch.int32, device="meta"))  # fmt: skip

    def launch(a, b, c, a_scale, b_scale, b_zp, topk_weights, sorted_ids, expert_ids, padded, mul_routed, top_k,
               config, **kwargs):  # fmt: skip
        calls.append(("gemm", dict(config), tuple(b.shape)))

    on_device(fm, monkeypatch, DEVICE)
    monkeypatch.setattr(fm, "_prepare_expert_assignment", prepare)
    monkeypatch.setattr(fm, "dispatch_fused_moe_kernel", launch)
    monkeypatch.setattr(fm, "apply_moe_activation", lambda *args, **kwargs: None)
    monkeypatch.setattr(fm, "moe_kernel_quantize_input", lambda A, A_scale, **kwargs: (A, A_scale))
    monkeypatch.setattr(fm, "ops", types.SimpleNamespace(moe_sum=lambda *args, **kwargs: None))
    monkeypatch.setattr(fm, "tl", types.SimpleNamespace(bfloat16="bf16", float16="fp16", float32="fp32"))
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    fm.get_moe_configs.cache_clear()
    yield fm, calls
    fm.get_moe_configs.cache_clear()


def weight_shapes(local: int, hidden: int, inter: int, dtype: str | None) -> tuple[tuple, tuple]:
    """w1 (E, 2N, K) and w2 (E, K, N) as the path takes them: int4 packs two values a byte along the last axis."""
    pack = 2 if dtype == "int4_w4a16" else 1
    return (local, 2 * inter, hidden // pack), (local, hidden, inter // pack)


def _call(
    fm,
    m: int,
    shapes: tuple[tuple, tuple],
    hidden: int,
    topk: int,
    ep: int,
    flags: dict,
    global_: int,
    block: list[int] | None,
):
    meta = {"device": "meta"}
    weight = torch.uint8 if flags else torch.bfloat16
    w1, w2 = (torch.empty(shape, dtype=weight, **meta) for shape in shapes)
    return fm.fused_experts_impl(
        torch.empty(m, hidden, dtype=torch.bfloat16, **meta), w1, w2,
        torch.empty(m, topk, dtype=torch.float32, **meta), torch.empty(m, topk, dtype=torch.int32, **meta),
        global_num_experts=global_ if ep > 1 else spec.NON_EP,
        expert_map=torch.empty(global_, dtype=torch.int32, **meta) if ep > 1 else None, block_shape=block,
        **flags,
    )  # fmt: skip


def test_each_launch_gets_the_specified_config_and_the_aligner_the_same_tile(spied):
    fm, calls = spied
    own = Path(fm.__file__).parent / "configs"
    checked, exposed, points = 0, 0, 0
    for name, model in MODELS.items():
        for ep in (1, 2, 8):
            if model.experts % ep:
                continue
            local = model.experts // ep
            for dtype, block, flags in SCHEMES:
                w1_shape, w2_shape = shapes = weight_shapes(local, model.hidden, model.intermediate, dtype)
                name_of_table = spec.config_file_name(*spec.table_shape(w2_shape, dtype), dtype, block, DEVICE)
                table = read_table(own / name_of_table)
                for m in ROWS:
                    calls.clear()
                    out = _call(fm, m, shapes, model.hidden, model.topk, ep, flags, model.experts, block)
                    want = spec.expected_config(w1_shape, w2_shape, model.topk, dtype, m, block, tables=[table])
                    where = f"{name}/ep{ep} {dtype} {block} M={m}"
                    assert tuple(out.shape) == (m, model.hidden), where
                    (align,) = [c for c in calls if c[0] == "align"]
                    gemms = [c for c in calls if c[0] == "gemm"]
                    assert [g[1] for g in gemms] == [want, want], f"{where}: launched with {gemms}, spec {want}"
                    assert align[1] == want["BLOCK_SIZE_M"], f"{where}: aligner tile {align[1]}, kernels {want}"
                    assert align[2] == (model.experts if ep > 1 else local) and align[3] == (ep > 1), where
                    checked += 1
                    if ep > 1:
                        seen = spec.rows_one_rank_sees(m, local, model.experts)
                        other = spec.expected_config(w1_shape, w2_shape, model.topk, dtype, seen, block,
                                                     tables=[table])  # fmt: skip
                        points += 1
                        exposed += other != want
    assert checked == sum(len(SCHEMES) * len(ROWS) for m in MODELS.values() for ep in (1, 2, 8) if m.experts % ep == 0)
    # under EP the config for the padded M and the one for the rows a rank's experts see differ at many points:
    # what a change of the rule would act on (the subject's bench measures which is faster)
    assert 0 < exposed < points
