"""The Triton fused-MoE bench's cases (standard library only): one EP rank's ``fused_experts_impl`` call.

A case is a model's MoE shape (``ci.moe.shapes``, full size), an EP size and a decode load (tokens per
rank). Rank 0 holds its ``E = G / ep`` local experts (vLLM's linear placement) and receives every rank's
rows, ``tokens_per_rank * ep`` (DP pads each rank's rows to the largest; here all are full), routed over
the ``G`` global experts: the ``M`` vLLM's config choice keys on. ``ep`` 1 is the non-EP caller
(``global_num_experts == -1``), where no change may change a thing.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from ci.core.errors import UsageError
from ci.moe.shapes import MODELS
from ci.triton_moe.spec import NON_EP

SCHEMES = ("bf16",)  # the bench times bf16 weights and activations; FP8 W8A8 is checked by the GPU suite

SUITES = {
    "default": {"shapes": ("qwen3-30b-a3b", "deepseek-v3"), "ep": (1, 2, 8), "tokens": (8, 32, 64, 128)},
    "quick": {"shapes": ("qwen3-30b-a3b", "deepseek-v3"), "ep": (1, 8), "tokens": (32, 64)},
}


@dataclass(frozen=True)
class TritonCase:
    shape_name: str
    ep: int
    tokens_per_rank: int
    scheme: str = "bf16"

    @property
    def id(self) -> str:
        return f"{self.shape_name}/ep{self.ep}/tpr{self.tokens_per_rank}/{self.scheme}"

    @property
    def shape(self):
        return MODELS[self.shape_name]

    @property
    def rows(self) -> int:
        """``M``: every rank's rows, as rank 0's ``fused_experts_impl`` receives them."""
        return self.tokens_per_rank * self.ep

    @property
    def global_num_experts(self) -> int:
        return NON_EP if self.ep == 1 else self.shape.experts


def suite_cases(suite: str, pattern: str | None = None) -> list[TritonCase]:
    """The cases of ``suite``, less those no glob of ``pattern`` (comma-separated) matches."""
    if suite not in SUITES:
        raise UsageError(f"--suite {suite!r}: the Triton fused-MoE bench has the suites {', '.join(sorted(SUITES))}")
    spec = SUITES[suite]
    cases = [TritonCase(s, ep, t) for s in spec["shapes"] for ep in spec["ep"] for t in spec["tokens"]]
    if pattern:
        globs = [g.strip() for g in pattern.split(",") if g.strip()]
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c.id, g) for g in globs)]
        if not cases:
            raise UsageError(
                f"--cases {pattern!r} matches no case of the suite {suite!r}; ids look like "
                f"{TritonCase('deepseek-v3', 8, 64).id}"
            )
    return cases


# The sweep of the regret table: the M and N tiles and the warps the default config steps between; the
# K tile, GROUP_SIZE_M and stages held (the chosen configs are timed as they are, beside the sweep).
SWEEP_BLOCK_M = (16, 32, 64)
SWEEP_BLOCK_N = (64, 128)
SWEEP_WARPS = (4, 8)
SWEEP_FIXED = {"BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "SPLIT_K": 1, "num_stages": 3}


def sweep_configs() -> list[dict]:
    return [
        {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, **SWEEP_FIXED, "num_warps": w}
        for m in SWEEP_BLOCK_M
        for n in SWEEP_BLOCK_N
        for w in SWEEP_WARPS
    ]


def config_label(config: dict) -> str:
    """``m16-n64-k128-w4-s4`` (``g`` GROUP_SIZE_M where not 1): a config as a key of the regret table."""
    parts = [
        f"m{config.get('BLOCK_SIZE_M')}",
        f"n{config.get('BLOCK_SIZE_N')}",
        f"k{config.get('BLOCK_SIZE_K')}",
        f"w{config.get('num_warps')}",
        f"s{config.get('num_stages')}",
    ]
    if config.get("GROUP_SIZE_M", 1) != 1:
        parts.append(f"g{config['GROUP_SIZE_M']}")
    return "-".join(parts)
