"""An independent float32 MoE: the reference the GPU suite holds vLLM's kernels to.

Per expert: ``y = act(x W1^T + b1) W2^T + b2``, weighted by the router and summed over the top-k
experts; the weights are the dequantized values the quantizer produced, the biases (gpt-oss) are optional.
``act`` is SwiGLU on the packed gate/up halves: ``silu(gate) * up``, or, with ``clamp`` (gpt-oss's
SwiGLU-OAI), ``g * sigmoid(alpha g) * (u + beta)`` with ``g = min(gate, clamp)`` and
``u = clamp(up, -clamp, clamp)``. With ``input_int8`` both GEMM inputs are first rounded as Marlin's
W4A8-int8 path quantizes them: per row, symmetric, to ``round(x / s) * s`` with ``s = max|x| / 127``.
With an ``expert_map`` only the rank's own experts contribute (other experts' tokens add zero).
"""

from __future__ import annotations

import torch


def int8_per_row(x: torch.Tensor) -> torch.Tensor:
    """x rounded to 8-bit signed integers per row (scale max|x| / 127), in float32."""
    s = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-10) / 127
    return torch.round(x / s).clamp(-127, 127) * s


def swiglu(h: torch.Tensor, n: int, clamp: tuple[float, float, float] | None) -> torch.Tensor:
    gate, up = h[:, :n], h[:, n:]
    if clamp is None:
        return torch.nn.functional.silu(gate) * up
    limit, alpha, beta = clamp
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + beta)


def reference_moe(
    x,
    w1_ref,
    w2_ref,
    topk_weights,
    topk_ids,
    expert_map=None,
    *,
    bias1=None,
    bias2=None,
    clamp: tuple[float, float, float] | None = None,
    input_int8: bool = False,
) -> torch.Tensor:
    """x (M, K); w1_ref (E, 2N, K); w2_ref (E, K, N); bias1 (E, 2N), bias2 (E, K); clamp (limit, alpha, beta);
    returns float32 (M, K)."""
    local_ids = topk_ids.long() if expert_map is None else expert_map[topk_ids.long()].long()
    n = w2_ref.shape[-1]
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    x32 = int8_per_row(x.float()) if input_int8 else x.float()
    for e in range(w1_ref.shape[0]):
        rows, slots = torch.nonzero(local_ids == e, as_tuple=True)
        if rows.numel() == 0:
            continue
        h = x32[rows] @ w1_ref[e].float().T
        if bias1 is not None:
            h = h + bias1[e].float()
        act = swiglu(h, n, clamp)
        if input_int8:
            act = int8_per_row(act)
        y = act @ w2_ref[e].float().T
        if bias2 is not None:
            y = y + bias2[e].float()
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
