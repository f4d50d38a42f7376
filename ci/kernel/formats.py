"""Every weight and activation format vLLM's Marlin MoE path takes, in one place (standard library only):
the CPU tier, the GPU suite and the bench all draw their formats from here, as they draw shapes from
``ci.moe.shapes``.

* :class:`QuantScheme`: a weight format, a ``vllm.scalar_type.scalar_types`` name and a group size
  (GPTQ/AWQ int4, int8, FP8, and the FP4 formats Hopper serves through Marlin: NVFP4 with its global
  scale, MXFP4).
* :class:`Format`: what one ``fused_marlin_moe`` call is given: a weight scheme, the activation dtype of
  the hidden states (bf16/fp16), the activation quantization Marlin applies (``input_dtype``: int8 or FP8,
  the W4A8 paths, where the tile is raised to at least 16), and gpt-oss's expert biases and clamped
  SwiGLU. The list follows vLLM's own ``MOE_MARLIN_QUANT_TEST_CONFIGS`` (``tests/kernels/moe/test_moe.py``):
  NVFP4 takes no 8-bit input, MXFP4 no int8 input, and FP8 inputs run on SM89/SM12x only (vLLM refuses
  them on Hopper: ``get_marlin_input_dtype``), so on an H200 they are seen by the CPU tier only.
"""

from __future__ import annotations

from dataclasses import dataclass

# gpt-oss's SwiGLU-OAI as vLLM 0.25.1 configures it (quantization/mxfp4.py): clamp 7.0, alpha 1.702, beta 1.0
GPT_OSS_CLAMP = 7.0
GPT_OSS_ALPHA = 1.702
GPT_OSS_BETA = 1.0


@dataclass(frozen=True)
class QuantScheme:
    name: str
    quant_type: str  # a vllm.scalar_type.scalar_types attribute
    group_size: int
    act_order: bool = False

    @property
    def has_zero_points(self) -> bool:
        return self.quant_type == "uint4"

    @property
    def bits(self) -> int:
        return 8 if self.quant_type in ("uint8b128", "float8_e4m3fn") else 4

    @property
    def fp4(self) -> bool:
        return self.quant_type == "float4_e2m1f"

    @property
    def has_global_scale(self) -> bool:
        """NVFP4 (FP4 in groups of 16, FP8 scales) carries a per-expert global scale; MXFP4 (groups of 32)
        does not."""
        return self.fp4 and self.group_size == 16


GPTQ_INT4_G128 = QuantScheme("gptq-int4-g128", "uint4b8", 128)
QUANT_SCHEMES = (
    GPTQ_INT4_G128,
    QuantScheme("gptq-int4-g32", "uint4b8", 32),
    QuantScheme("gptq-int4-channel", "uint4b8", -1),
    QuantScheme("gptq-int4-g128-actorder", "uint4b8", 128, act_order=True),
    QuantScheme("gptq-int4-g32-actorder", "uint4b8", 32, act_order=True),
    QuantScheme("awq-int4-g128", "uint4", 128),
    QuantScheme("gptq-int8-g128", "uint8b128", 128),
    QuantScheme("fp8-g128", "float8_e4m3fn", 128),
    QuantScheme("fp8-channel", "float8_e4m3fn", -1),
    QuantScheme("nvfp4-g16", "float4_e2m1f", 16),
    QuantScheme("mxfp4-g32", "float4_e2m1f", 32),
)
SCHEMES = {s.name: s for s in QUANT_SCHEMES}


@dataclass(frozen=True)
class Format:
    name: str
    scheme: str  # a QUANT_SCHEMES name
    input_dtype: str | None = None  # Marlin's activation quantization: "int8", "fp8" or None (16-bit)
    activations: tuple[str, ...] = ("bf16", "fp16")  # hidden-state dtypes the format is served with
    bias: bool = False  # expert biases on both GEMMs (gpt-oss)
    clamp: bool = False  # gpt-oss's clamped SwiGLU-OAI (GPT_OSS_*)
    hopper: bool = True  # False: vLLM serves it on SM89/SM12x only (FP8 inputs), not on an H200

    @property
    def quant(self) -> QuantScheme:
        return SCHEMES[self.scheme]

    @property
    def input_itemsize(self) -> int | None:
        return None if self.input_dtype is None else 1


FORMATS = (
    Format("gptq-int4", "gptq-int4-g128"),
    Format("gptq-int4-actorder", "gptq-int4-g128-actorder"),
    Format("awq-int4", "awq-int4-g128"),
    Format("gptq-int8", "gptq-int8-g128"),
    Format("fp8", "fp8-g128"),
    Format("nvfp4", "nvfp4-g16"),
    Format("mxfp4", "mxfp4-g32", activations=("bf16",)),
    Format("gpt-oss-mxfp4", "mxfp4-g32", activations=("bf16",), bias=True, clamp=True),
    Format("w4a8-int8", "gptq-int4-g128", input_dtype="int8"),
    Format("w4a8-int8-awq", "awq-int4-g128", input_dtype="int8"),
    Format("w4a8-fp8", "gptq-int4-g128", input_dtype="fp8", hopper=False),
    Format("mxfp4-a8-fp8", "mxfp4-g32", input_dtype="fp8", activations=("bf16",), hopper=False),
)
FORMATS_BY_NAME = {f.name: f for f in FORMATS}
# (format, hidden-state dtype): every combination vLLM serves, the unit the CPU tier rotates through
FORMAT_COMBOS = tuple((f, act) for f in FORMATS for act in f.activations)
