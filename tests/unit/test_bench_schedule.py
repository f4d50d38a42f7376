"""The kernel bench's schedule without a GPU: builds alternate A B, B A, ... so sample i of each is a pair."""

from __future__ import annotations

from types import SimpleNamespace

from ci import bench, stats


def test_interleaved_order_alternates_which_build_goes_first():
    assert stats.interleaved_order(3) == ["base", "candidate", "candidate", "base", "base", "candidate"]
    assert stats.interleaved_order(2, ("x", "y")) == ["x", "y", "y", "x"]
    assert stats.interleaved_order(0) == []


def test_bench_times_the_builds_in_interleaved_pairs(monkeypatch):
    """run_case, with the GPU parts replaced: the order of timings is the interleaved one, and
    sample i of each build comes from pair i."""
    calls: list[str] = []

    class Runner:
        case = bench.BenchCase("s", 256, 128, 8, 2, ep=2, tokens_per_rank=4)
        view = SimpleNamespace(local_ids=SimpleNamespace(numel=lambda: 4))

        def capture(self, module, forced_bm=None):
            return module if forced_bm is None else f"bm{forced_bm}"

        def time_us(self, graph):
            calls.append(graph)
            return float(len(calls))

    monkeypatch.setattr(bench, "check_outputs_agree", lambda *a: {"ok": True})
    monkeypatch.setattr(bench, "picked_block_size", lambda runner, module: 8)
    variants = (SimpleNamespace(name="base", marlin_moe="base"), SimpleNamespace(name="candidate", marlin_moe="cand"))
    result = bench.run_case(Runner(), variants, repeats=4)
    timed = [c for c in calls if not c.startswith("bm")]
    assert timed == ["base", "cand", "cand", "base", "base", "cand", "cand", "base"]
    assert result.samples == {"base": [1.0, 4.0, 5.0, 8.0], "candidate": [2.0, 3.0, 6.0, 7.0]}
