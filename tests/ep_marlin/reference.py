"""An independent float32 MoE: the reference the GPU suite holds vLLM's kernels to.

Per expert: ``y = (silu(x W1_gate^T) * (x W1_up^T)) W2^T``, weighted by the router and summed
over the top-k experts; the weights are the dequantized values the quantizer produced. With
an ``expert_map`` only the rank's own experts contribute (other experts' tokens add zero).
"""

from __future__ import annotations

import torch


def reference_moe(x, w1_ref, w2_ref, topk_weights, topk_ids, expert_map=None) -> torch.Tensor:
    """x (M, K); w1_ref (E, 2N, K); w2_ref (E, K, N); returns float32 (M, K)."""
    local_ids = topk_ids.long() if expert_map is None else expert_map[topk_ids.long()].long()
    n = w2_ref.shape[-1]
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w1_ref.shape[0]):
        rows, slots = torch.nonzero(local_ids == e, as_tuple=True)
        if rows.numel() == 0:
            continue
        h = x[rows].float() @ w1_ref[e].float().T
        act = torch.nn.functional.silu(h[:, :n]) * h[:, n:]
        y = act @ w2_ref[e].float().T
        out.index_add_(0, rows, y * topk_weights[rows, slots, None].float())
    return out


def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64 (inf when actual holds NaN/Inf)."""
    a, e = actual.double(), expected.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return float(torch.linalg.vector_norm(a - e) / torch.linalg.vector_norm(e).clamp_min(1e-30))


def max_abs(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).abs().max())
