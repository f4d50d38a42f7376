"""The kernel bench's cases: model shape x EP size x tokens per rank, in one format of ``ci.kernel.formats``, on
the fused path or the batched one (DeepEP low latency), and the suites that list them."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from ci.core.errors import UsageError
from ci.kernel.formats import FORMATS_BY_NAME, Format
from ci.moe.shapes import MODELS, Shape
from ci.moe.spec import BLOCK_SIZES_M, MIN_BLOCK_SIZE_M_1_BYTE_INPUT, NON_EP

BATCHED_MAX_TOKENS = 128  # DeepEP low latency: tokens a dispatcher may send per expert (capacity = 128 x EP)


@dataclass(frozen=True)
class BenchCase:
    shape_name: str
    hidden: int
    intermediate: int
    experts: int
    topk: int
    ep: int
    tokens_per_rank: int
    dtype: str = "bf16"
    quant: str = (
        "gptq-int4-g128"  # the 16-bit-input GPTQ int4 of every case until 2026-12-01, or a ci.kernel.formats name
    )
    path: str = "fused"  # "batched": DeepEP low latency, BatchedMarlinExperts.apply on rank 0
    per_dispatcher: int = BATCHED_MAX_TOKENS  # batched: rows each dispatcher may send an expert
    # ep = 1 only: global_num_experts == E (no expert map), the non-EP call as vLLM's modular kernel makes it
    # (it turns -1 into the local expert count: ci.kernel.callers), not the bare -1 of a direct caller
    g_equals_e: bool = False

    @property
    def id(self) -> str:
        where = "" if self.path == "fused" else f"batched-cap{self.capacity}/"
        ep = f"ep{self.ep}-g{self.experts}" if self.g_equals_e else f"ep{self.ep}"
        return f"{self.shape_name}/{ep}/tpr{self.tokens_per_rank}/{where}{self.quant}/{self.dtype}"

    @property
    def non_ep(self) -> bool:
        """A non-EP call of the fused path (global_num_experts -1, or E with no expert map)."""
        return self.ep == 1 and self.path == "fused"

    @property
    def shape(self) -> Shape:
        """The MoE shape the case runs, as one object (its name and dimensions)."""
        return Shape(self.shape_name, self.hidden, self.intermediate, self.experts, self.topk)

    @property
    def format(self) -> Format:
        return FORMATS_BY_NAME.get(self.quant, GPTQ_INT4)

    @property
    def capacity(self) -> int:
        """Batched: rows per expert, ``per_dispatcher`` from each of the ``ep`` dispatchers."""
        return self.per_dispatcher * self.ep

    @property
    def rows(self) -> int:
        return self.tokens_per_rank * self.ep

    @property
    def global_num_experts(self) -> int:
        return NON_EP if self.non_ep and not self.g_equals_e else self.experts


GPTQ_INT4 = FORMATS_BY_NAME["gptq-int4"]

# Real model shapes, full size (ci.moe.shapes; the weights are random bits: no quantization cost).
MODEL_SHAPES = {name: (m.hidden, m.intermediate, m.experts, m.topk) for name, m in MODELS.items()}

# "batched": the DeepEP low-latency path (decode: a few tokens per expert at a large capacity).
# "formats" (ci.kernel.formats): the FP4 formats on the models that ship them (DeepSeek-V3 as NVFP4, gpt-oss as MXFP4
# with its biases and clamped SwiGLU) and W4A8-int8 inputs, at the EP sizes and decode loads of the int4 cases.
# "modular": the non-EP fused path called with global_num_experts == E and no expert map, as a server without EP
# calls it (the modular kernel's -1 -> E), beside the ep1 cases' bare -1 (a direct caller's default).
# "small_capacities": the batched path where a dispatcher may send an expert only a few rows, (ep, rows per
# dispatcher): capacities 4 to 64, where vLLM 0.25.1 picks the tiles 8, 16, 32, 48 and 64 (at the
# capacity-1024 cases every rule picks 64).
SUITES = {
    "default": {
        "shapes": tuple(MODEL_SHAPES),
        "ep": (1, 2, 4, 8),
        "tokens": (1, 4, 8, 16, 32, 64, 128),
        "batched": {"shapes": ("deepseek-v3", "qwen3-30b-a3b"), "ep": (8,), "tokens": (1, 8, 32)},
        "formats": (
            {"shape": "deepseek-v3", "quant": "nvfp4", "ep": (1, 2, 4, 8), "tokens": (1, 8, 64)},
            {"shape": "gpt-oss-120b", "quant": "gpt-oss-mxfp4", "ep": (1, 2, 4, 8), "tokens": (1, 8, 64)},
            {"shape": "qwen3-30b-a3b", "quant": "w4a8-int8", "ep": (1, 8), "tokens": (1, 8, 64)},
        ),
        "small_capacities": {
            "shapes": ("deepseek-v3",),
            "ep_rows": ((1, 4), (2, 4), (8, 2), (8, 4), (8, 8)),
            "tokens": 1,
        },
        "modular": {"shapes": tuple(MODEL_SHAPES), "tokens": (1, 8, 64)},
    },
    # "high_load": where the tile oracle's rule (ci/changes/tile-oracle) leaves #48144: 90.5-181 rows per expert
    # and the loads on either side, every shape (the held-out ones too) in int4, and NVFP4 and FP8 beside it.
    "high_load": {
        "shapes": tuple(MODEL_SHAPES),
        "ep": (1, 2, 4, 8),
        "tokens": (256, 512, 1024),
        "formats": (
            {"shape": "deepseek-v3", "quant": "nvfp4", "ep": (4, 8), "tokens": (256, 512, 1024)},
            {"shape": "mixtral-8x7b", "quant": "fp8", "ep": (1, 2, 4, 8), "tokens": (64, 128, 256)},
        ),
        "modular": {"shapes": ("mixtral-8x7b",), "tokens": (512,)},
    },
    "quick": {
        "shapes": ("deepseek-v3", "qwen3-30b-a3b"),
        "ep": (1, 8),
        "tokens": (8, 64),
        "batched": {"shapes": ("deepseek-v3",), "ep": (8,), "tokens": (8,)},
        "modular": {"shapes": ("deepseek-v3", "qwen3-30b-a3b"), "tokens": (8, 64)},
    },
}


def suite_cases(suite: str, pattern: str | None = None) -> list[BenchCase]:
    if suite not in SUITES:
        raise UsageError(f"--suite {suite!r}: unknown; choose one of {sorted(SUITES)}")
    spec = SUITES[suite]
    cases = [
        BenchCase(name, *MODEL_SHAPES[name], ep=ep, tokens_per_rank=t)
        for name in spec["shapes"]
        for ep in spec["ep"]
        for t in spec["tokens"]
    ]
    batched = spec.get("batched", {})
    cases += [
        BenchCase(name, *MODEL_SHAPES[name], ep=ep, tokens_per_rank=t, path="batched")
        for name in batched.get("shapes", ())
        for ep in batched["ep"]
        for t in batched["tokens"]
    ]
    cases += [
        BenchCase(f["shape"], *MODEL_SHAPES[f["shape"]], ep=ep, tokens_per_rank=t, quant=f["quant"])
        for f in spec.get("formats", ())
        for ep in f["ep"]
        for t in f["tokens"]
    ]
    small = spec.get("small_capacities", {})
    cases += [
        BenchCase(
            name, *MODEL_SHAPES[name], ep=ep, tokens_per_rank=small["tokens"], path="batched", per_dispatcher=rows
        )
        for name in small.get("shapes", ())
        for ep, rows in small["ep_rows"]
    ]
    modular = spec.get("modular", {})
    cases += [
        BenchCase(name, *MODEL_SHAPES[name], ep=1, tokens_per_rank=t, g_equals_e=True)
        for name in modular.get("shapes", ())
        for t in modular["tokens"]
    ]
    if pattern:  # one glob, or several separated by commas (a case matching any of them)
        globs = [g for g in pattern.split(",") if g]
        cases = [c for c in cases if any(fnmatch.fnmatch(c.id, g) for g in globs)]
        if not cases:
            raise UsageError(f"--cases {pattern!r} matches no case of suite {suite!r}")
    return cases


def runnable_block_sizes(case: BenchCase) -> tuple[int, ...]:
    """The tiles the kernel runs for this case: with 1-byte inputs (W4A8) not those under 16 (the Marlin kernel
    has no thread config for them: "Invalid thread config", which is why vLLM raises the tile to 16)."""
    if case.format.input_itemsize == 1:
        return tuple(bm for bm in BLOCK_SIZES_M if bm >= MIN_BLOCK_SIZE_M_1_BYTE_INPUT)
    return BLOCK_SIZES_M
