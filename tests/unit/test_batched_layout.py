"""The batched layout the GPU suite and the bench build (ci.kernel.moe_case.batched_by_expert), on the CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # the CPU tier's environment has it; the mutation environment does not
mc = pytest.importorskip("ci.kernel.moe_case")


def test_grouping_and_combining_round_trip():
    gen = torch.Generator().manual_seed(3)
    tokens, experts, topk = 23, 6, 3
    hidden = torch.randn(tokens, 8, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens)]).to(torch.int32)
    weights = torch.rand(tokens, topk, generator=gen)
    b = mc.batched_by_expert(hidden, ids, experts, capacity=20)
    assert (
        b.hidden.shape == (experts, 20, 8)
        and b.counts.tolist() == torch.bincount(ids.flatten().long(), minlength=experts).tolist()
    )
    for e in range(experts):
        n = int(b.counts[e])
        assert torch.equal(b.hidden[e, :n], hidden[b.rows[e, :n]]) and (b.rows[e, n:] == -1).all()
        assert (ids[b.rows[e, :n], b.slots[e, :n]] == e).all()
        assert b.rows[e, :n].tolist() == sorted(b.rows[e, :n].tolist())  # token order within an expert
    # an "identity expert": the combined output is each token times the sum of its weights
    got = mc.combine_batched(b.hidden, b, weights, tokens)
    assert torch.allclose(got, hidden * weights.sum(dim=1, keepdim=True), atol=1e-6)


def test_other_ranks_experts_are_dropped_and_capacity_is_enforced():
    hidden = torch.arange(4.0).repeat_interleave(2).view(4, 2)
    ids = torch.tensor([[0, 3], [1, 2], [3, 2], [0, 1]], dtype=torch.int32)
    expert_map = torch.tensor([0, -1, -1, 1])  # this rank holds global experts 0 and 3
    b = mc.batched_by_expert(hidden, ids, 2, capacity=4, expert_map=expert_map, own_topk_ids=ids[:1])
    assert b.counts.tolist() == [2, 2] and b.rows[0, :2].tolist() == [0, 3] and b.rows[1, :2].tolist() == [0, 2]
    assert b.topk_ids.shape == (1, 2)
    with pytest.raises(ValueError, match="more than the capacity 1"):
        mc.batched_by_expert(hidden, ids, 2, capacity=1, expert_map=expert_map)
