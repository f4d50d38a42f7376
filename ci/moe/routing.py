"""Routing of an MoE layer's tokens as one EP rank sees it, shared by every MoE subject (Marlin, Triton): softmax
top-k over the global experts, the DP-padded rows a rank sees, and that rank's ``expert_map`` from vLLM's own
``determine_expert_map``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ci.moe.shapes import Shape

if TYPE_CHECKING:  # torch is imported where it runs: this module loads without it (the CPU-only stages)
    import torch


@dataclass
class Routing:
    hidden: torch.Tensor  # (rows, K)
    topk_weights: torch.Tensor  # float32 (rows, topk)
    topk_ids: torch.Tensor  # int32 global expert ids (rows, topk)
    valid: torch.Tensor  # bool (rows,): False for DP padding rows


def route(
    rows: int, shape: Shape, dtype: torch.dtype, *, seed: int, valid_rows: int | None = None, scale: float = 0.1
) -> Routing:
    """Softmax top-k routing over the global experts, hidden states ~N(0, scale^2); rows past ``valid_rows``
    are zero padding."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    hidden = (torch.randn(rows, shape.hidden, device="cuda", generator=gen) * scale).to(dtype)
    scores = torch.randn(rows, shape.experts, device="cuda", generator=gen).softmax(dim=-1)
    weights, ids = scores.topk(shape.topk, dim=-1)
    valid = torch.ones(rows, dtype=torch.bool, device="cuda")
    if valid_rows is not None:
        valid[valid_rows:] = False
        hidden[~valid] = 0
    return Routing(hidden=hidden.contiguous(), topk_weights=weights.float(), topk_ids=ids.to(torch.int32), valid=valid)


def dp_padded_routing(tokens: list[int], shape: Shape, dtype: torch.dtype, *, seed: int, scale: float = 0.1) -> Routing:
    """The rows every rank sees under DP: each rank's tokens padded to the largest count, concatenated."""
    import torch

    pad_to = max(tokens)
    parts = [route(pad_to, shape, dtype, seed=seed + r, valid_rows=t, scale=scale) for r, t in enumerate(tokens)]
    return Routing(
        hidden=torch.cat([p.hidden for p in parts]).contiguous(),
        topk_weights=torch.cat([p.topk_weights for p in parts]),
        topk_ids=torch.cat([p.topk_ids for p in parts]),
        valid=torch.cat([p.valid for p in parts]),
    )


@dataclass
class RankView:
    rank: int
    local_ids: torch.Tensor  # global ids of the rank's experts, in local order
    expert_map: torch.Tensor | None  # (G,) global -> local or -1; None without EP


def rank_view(experts: int, ep: int, rank: int, *, strategy: str = "linear") -> RankView:
    """vLLM's own expert placement for one rank (uneven splits as vLLM makes them)."""
    import torch
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

    if ep == 1:
        return RankView(rank=0, local_ids=torch.arange(experts, device="cuda"), expert_map=None)
    _, expert_map, _ = determine_expert_map(ep, rank, experts, expert_placement_strategy=strategy)
    expert_map = expert_map.cuda()
    local = torch.nonzero(expert_map >= 0).flatten()
    order = torch.argsort(expert_map[local])
    return RankView(rank=rank, local_ids=local[order], expert_map=expert_map)
