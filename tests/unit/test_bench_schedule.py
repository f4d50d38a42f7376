"""The kernel bench's schedule without a GPU: each case is timed in blocks (fresh inputs, an address
shift, fresh captures in a random order), builds alternating A B, B A within a block."""

from __future__ import annotations

from types import SimpleNamespace

from ci import bench, stats


def test_interleaved_order_alternates_which_build_goes_first():
    assert stats.interleaved_order(3) == ["base", "candidate", "candidate", "base", "base", "candidate"]
    assert stats.interleaved_order(2, ("x", "y")) == ["x", "y", "y", "x"]
    assert stats.interleaved_order(0) == []


class FakeRunner:
    """run_case's view of the GPU: captures and timings recorded, no CUDA."""

    case = bench.BenchCase("s", 256, 128, 8, 2, ep=2, tokens_per_rank=4)
    view = SimpleNamespace(local_ids=SimpleNamespace(numel=lambda: 4))

    def __init__(self):
        self.events: list[tuple] = []

    def start_block(self, block, pad_bytes):
        self.events.append(("block", block, pad_bytes))
        return object()

    def capture(self, module, forced_bm=None):
        self.events.append(("capture", module if forced_bm is None else f"bm{forced_bm}"))
        return module if forced_bm is None else f"bm{forced_bm}"

    def time_us(self, graph):
        self.events.append(("time", graph))
        return float(sum(e[0] == "time" for e in self.events))


def _run(monkeypatch, repeats, blocks):
    monkeypatch.setattr(bench, "check_outputs_agree", lambda *a: {"ok": True})
    monkeypatch.setattr(bench, "picked_block_size", lambda runner, module: 8)
    runner = FakeRunner()
    variants = (SimpleNamespace(name="base", marlin_moe="base"), SimpleNamespace(name="candidate", marlin_moe="cand"))
    return runner, bench.run_case(runner, variants, repeats=repeats, blocks=blocks)


def test_each_block_recaptures_both_builds_in_its_own_order(monkeypatch):
    runner, result = _run(monkeypatch, repeats=12, blocks=6)
    plan = bench.block_plan(FakeRunner.case.id, 6)
    timed = [e for e in runner.events if not str(e[1]).startswith("bm")]  # the regret sweep comes after
    per_block, current = [], None
    for e in timed:
        if e[0] == "block":
            current = []
            per_block.append(current)
        else:
            current.append(e)
    assert len(per_block) == 6
    for (order, _pad), events in zip(plan, per_block, strict=True):
        names = {"base": "base", "candidate": "cand"}
        first, second = (names[o] for o in order)
        assert events[:2] == [("capture", first), ("capture", second)], "fresh captures, in the block's order"
        assert [e[1] for e in events[2:]] == [first, second, second, first]  # 2 rounds, alternating
    assert {order for order, _ in plan} == {("base", "candidate"), ("candidate", "base")}
    assert len({pad for _, pad in plan}) > 1 and all(pad % 256 == 0 and pad > 0 for _, pad in plan)
    assert result.extra["blocks"] == {"base": [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5],
                                      "candidate": [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]}  # fmt: skip
    assert len(result.samples["base"]) == len(result.samples["candidate"]) == 12


def test_block_plan_is_reproducible_per_case_and_differs_between_cases():
    assert bench.block_plan("a", 30) == bench.block_plan("a", 30)
    assert bench.block_plan("a", 30) != bench.block_plan("b", 30)
    firsts = [order[0] for order, _ in bench.block_plan("deepseek-v3/ep8/tpr8/gptq-int4-g128/bf16", 30)]
    assert 8 <= firsts.count("base") <= 22, "each build goes first in about half the blocks"


def test_sample_i_of_each_build_comes_from_the_same_pair(monkeypatch):
    _, result = _run(monkeypatch, repeats=4, blocks=1)
    s = result.samples
    assert sorted(s["base"] + s["candidate"]) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert all(abs(b - c) in (1.0, 3.0) for b, c in zip(s["base"], s["candidate"], strict=True))
