"""What the Triton fused-MoE tests share: the batch sizes they try, a tuned table read as vLLM reads it, and
vLLM's real ``fused_experts_impl`` run on ``meta`` tensors with its kernels, aligner and quantization spied."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

from ci.triton_moe import spec

ROWS = (
    1,
    2,
    3,
    4,
    5,
    8,
    9,
    16,
    17,
    20,
    21,
    24,
    32,
    33,
    40,
    41,
    48,
    64,
    65,
    96,
    97,
    128,
    129,
    256,
    512,
    513,
    1024,
    1536,
    3000,
    4096,
    8192,
)


def read_table(path: Path) -> dict[int, dict] | None:
    """A tuned table as vLLM reads it: batch size -> config, without its triton_version (None: no file)."""
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    raw.pop("triton_version", None)
    return {int(size): config for size, config in raw.items()}


def require_specified_release(trees) -> spec.Rules:
    """The config-choice rules of the release under test (``spec.rules_of``: written for it, or recognised by
    its code); skip, saying why, on a release whose rules the spec does not have."""
    version = trees.manifest.vllm_version
    source = (trees.base / "vllm/model_executor/layers/fused_moe/fused_moe.py").read_text()
    rules, how = spec.rules_of(version, source)
    if rules is None:
        pytest.skip(f"ci.triton_moe.spec: {how}")
    return rules


def on_device(fused_moe, monkeypatch, device: str) -> None:
    """The platform's answers for ``device`` (this machine has none): its name, CUDA (the WNA16 rule asks) and
    its FP8 type; the tuned tables read again."""
    import torch

    platform = fused_moe.current_platform
    monkeypatch.setattr(platform, "get_device_name", lambda device_id=0: device, raising=False)
    monkeypatch.setattr(platform, "is_cuda", lambda: True, raising=False)
    monkeypatch.setattr(platform, "is_rocm", lambda: False, raising=False)
    monkeypatch.setattr(platform, "fp8_dtype", lambda: torch.float8_e4m3fn, raising=False)
    fused_moe.get_moe_configs.cache_clear()
    named = getattr(fused_moe, "get_device_name_as_file_name", None)  # 0.34.0: the name, read once a process
    if named is not None:
        named.cache_clear()
        monkeypatch.setattr(fused_moe, "get_device_name_as_file_name", named.__wrapped__)


# (config dtype, block_shape, the use_* flag fused_experts_impl takes)
SCHEMES = (
    (None, None, {}),
    ("fp8_w8a8", None, {"use_fp8_w8a8": True}),
    ("fp8_w8a8", [128, 128], {"use_fp8_w8a8": True}),
    ("int8_w8a16", [0, 128], {"use_int8_w8a16": True}),
    ("int4_w4a16", [0, 128], {"use_int4_w4a16": True}),
)
DEVICE = "NVIDIA H200"


def spy_launches(fm, monkeypatch, device: str = DEVICE) -> list[tuple]:
    """``fm`` (a ``fused_moe`` module of one tree) with its kernels, aligner and quantization spied, on
    ``device``: the calls they see, ``("align", tile, global experts, expert map given)`` and
    ``("gemm", config, weight shape)``."""
    calls: list[tuple] = []

    def prepare(topk_ids, config, num_tokens, top_k, global_num_experts, expert_map, **kwargs):
        calls.append(("align", config["BLOCK_SIZE_M"], global_num_experts, expert_map is not None))
        n = topk_ids.numel()
        return (
            torch.empty(n, dtype=torch.int32, device="meta"),
            torch.empty(n, dtype=torch.int32, device="meta"),
            torch.empty(1, dtype=torch.int32, device="meta"),
        )

    def launch(
        a,
        b,
        c,
        a_scale,
        b_scale,
        b_zp,
        topk_weights,
        sorted_ids,
        expert_ids,
        padded,
        mul_routed,
        top_k,
        config,
        **kwargs,
    ):
        calls.append(("gemm", dict(config), tuple(b.shape)))

    on_device(fm, monkeypatch, device)
    monkeypatch.setattr(fm.logger, "disabled", True)  # "Using default MoE config", once per shape: not news here
    monkeypatch.setattr(fm, "_prepare_expert_assignment", prepare)
    monkeypatch.setattr(fm, "dispatch_fused_moe_kernel", launch)
    monkeypatch.setattr(fm, "apply_moe_activation", lambda *args, **kwargs: None)
    monkeypatch.setattr(fm, "moe_kernel_quantize_input", lambda A, A_scale, **kwargs: (A, A_scale))
    monkeypatch.setattr(fm, "ops", types.SimpleNamespace(moe_sum=lambda *args, **kwargs: None))
    monkeypatch.setattr(fm, "tl", types.SimpleNamespace(bfloat16="bf16", float16="fp16", float32="fp32"))
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    fm.get_moe_configs.cache_clear()
    return calls


def weight_shapes(local: int, hidden: int, inter: int, dtype: str | None) -> tuple[tuple, tuple]:
    """w1 (E, 2N, K) and w2 (E, K, N) as the path takes them: int4 packs two values a byte along the last axis."""
    pack = 2 if dtype == "int4_w4a16" else 1
    return (local, 2 * inter, hidden // pack), (local, hidden, inter // pack)


def call_meta(
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
    """One ``fused_experts_impl`` call of ``fm`` on meta tensors: ``m`` rows, EP over ``global_`` experts if
    ``ep`` > 1."""
    meta = {"device": "meta"}
    weight = torch.uint8 if flags else torch.bfloat16
    w1, w2 = (torch.empty(shape, dtype=weight, **meta) for shape in shapes)
    return fm.fused_experts_impl(
        torch.empty(m, hidden, dtype=torch.bfloat16, **meta),
        w1,
        w2,
        torch.empty(m, topk, dtype=torch.float32, **meta),
        torch.empty(m, topk, dtype=torch.int32, **meta),
        global_num_experts=global_ if ep > 1 else spec.NON_EP,
        expert_map=torch.empty(global_, dtype=torch.int32, **meta) if ep > 1 else None,
        block_shape=block,
        **flags,
    )


def launched(fm, calls: list, *args) -> tuple[dict | None, list[str]]:
    """The config one ``call_meta`` call's GEMMs got, and what breaks the invariants every change is held to:
    both GEMMs get one config and the aligner its M tile."""
    calls.clear()
    call_meta(fm, *args)
    gemms = [c[1] for c in calls if c[0] == "gemm"]
    aligns = [c[1] for c in calls if c[0] == "align"]
    if len(gemms) != 2 or gemms[0] != gemms[1]:
        return None, [f"the two GEMMs of one call got {gemms}"]
    if aligns != [gemms[0]["BLOCK_SIZE_M"]]:
        return gemms[0], [f"aligner tile {aligns}, GEMM config {gemms[0]}"]
    return gemms[0], []


def config_mismatches(
    base, cand, contract, monkeypatch, rules: spec.Rules = spec.RULES["0.25.1"]
) -> tuple[list[str], int, int]:
    """The candidate ``fused_moe`` module against the base's and the contract, call by call over the model
    shapes, EP sizes 1, 2 and 8, the schemes and ``ROWS``: (what is wrong, calls checked, calls whose config
    differs from the base's). Without EP the candidate must launch the base's config unless the contract lets
    the non-EP path change; under EP, the contract's ``triton_config`` of the spec's configs for ``M`` and for
    ``ceil(M * E / G)`` rows (or the base's, if the contract does not change the EP path)."""
    from ci.moe.shapes import MODELS
    from ci.trees.contracts import may_change

    calls = {"base": spy_launches(base, monkeypatch), "candidate": spy_launches(cand, monkeypatch)}
    own = Path(cand.__file__).parent / "configs"
    wrong, checked, changed = [], 0, 0
    for name, model in MODELS.items():
        for ep in (1, 2, 8):
            if model.experts % ep:
                continue
            local = model.experts // ep
            for dtype, block, flags in SCHEMES:
                w1_shape, w2_shape = shapes = weight_shapes(local, model.hidden, model.intermediate, dtype)
                table = read_table(
                    own / spec.config_file_name(*spec.table_shape(w2_shape, dtype), dtype, block, DEVICE)
                )
                for m in ROWS:
                    args = (m, shapes, model.hidden, model.topk, ep, flags, model.experts, block)
                    where = f"{name}/ep{ep} {dtype} {block} M={m}"
                    want_base, broken = launched(base, calls["base"], *args)
                    got, broken_cand = launched(cand, calls["candidate"], *args)
                    wrong += [f"{where}: base: {b}" for b in broken] + [f"{where}: candidate: {b}" for b in broken_cand]
                    path = "ep" if ep > 1 else "non_ep"
                    if not may_change(contract, path):
                        if got != want_base:
                            wrong.append(f"{where}: the {path} path changed: {want_base} -> {got}")
                    elif ep > 1 and contract is not None and contract.triton_config is not None:
                        seen = spec.rows_one_rank_sees(m, local, model.experts)
                        of_m, of_seen = (
                            spec.expected_config(
                                w1_shape, w2_shape, model.topk, dtype, rows, block, tables=[table], rules=rules
                            )
                            for rows in (m, seen)
                        )
                        want = contract.triton_config(config_of_m=of_m, config_of_estimate=of_seen)
                        if got != want:
                            wrong.append(f"{where}: the candidate launched {got}; contract {contract.name}: {want}")
                    checked += 1
                    changed += got != want_base
    return wrong, checked, changed
