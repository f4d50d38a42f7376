"""The kernel bench's schedule without a GPU: each case is timed in captures (fresh inputs, an address
shift, fresh captures in a random order), builds alternating A B, B A within a capture."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ci.core import stats
from ci.core.errors import UsageError
from ci.kernel import bench, suites
from ci.timing import captures, graphs


def test_interleaved_order_alternates_which_build_goes_first():
    assert stats.interleaved_order(3) == ["base", "candidate", "candidate", "base", "base", "candidate"]
    assert stats.interleaved_order(2, ("x", "y")) == ["x", "y", "y", "x"]
    assert stats.interleaved_order(0) == []


class FakeRunner:
    """run_case's view of the GPU: captures and timings recorded, no CUDA."""

    case = suites.BenchCase("s", 256, 128, 8, 2, ep=2, tokens_per_rank=4)
    view = SimpleNamespace(local_ids=SimpleNamespace(numel=lambda: 4))

    def __init__(self):
        self.events: list[tuple] = []

    def start_capture(self, capture, pad_bytes):
        self.events.append(("start", capture, pad_bytes))
        return object()

    def capture(self, module, forced_bm=None, sleep_cycles=None):
        assert sleep_cycles is None, "no slowdown is injected unless asked"
        self.events.append(("capture", module if forced_bm is None else f"bm{forced_bm}"))
        return module if forced_bm is None else f"bm{forced_bm}"

    def time_us(self, graph):
        self.events.append(("time", graph))
        return float(sum(e[0] == "time" for e in self.events))


def _run(monkeypatch, repeats, captures):
    monkeypatch.setattr(bench, "check_outputs_agree", lambda *a, **k: {"ok": True})
    monkeypatch.setattr(bench, "picked_block_size", lambda runner, module: 8)
    runner = FakeRunner()
    variants = (SimpleNamespace(name="base", marlin_moe="base"), SimpleNamespace(name="candidate", marlin_moe="cand"))
    return runner, bench.run_case(runner, variants, repeats=repeats, captures=captures)


def test_each_capture_recaptures_both_builds_in_its_own_order(monkeypatch):
    runner, result = _run(monkeypatch, repeats=12, captures=6)
    plan = captures.capture_plan(FakeRunner.case.id, 6)
    timed = [e for e in runner.events if not str(e[1]).startswith("bm")]  # the regret sweep comes after
    per_capture, current = [], None
    for e in timed:
        if e[0] == "start":
            current = []
            per_capture.append(current)
        else:
            current.append(e)
    assert len(per_capture) == 6
    for (order, _pad), events in zip(plan, per_capture, strict=True):
        names = {"base": "base", "candidate": "cand"}
        first, second = (names[o] for o in order)
        assert events[:2] == [("capture", first), ("capture", second)], "fresh captures, in the capture's order"
        assert [e[1] for e in events[2:]] == [first, second, second, first]  # 2 rounds, alternating
    assert {order for order, _ in plan} == {("base", "candidate"), ("candidate", "base")}
    assert len({pad for _, pad in plan}) > 1 and all(pad % 256 == 0 and pad > 0 for _, pad in plan)
    assert result.extra["captures"] == {
        "base": [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5],
        "candidate": [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5],
    }
    assert len(result.samples["base"]) == len(result.samples["candidate"]) == 12


def test_capture_plan_is_reproducible_per_case_and_differs_between_cases():
    assert captures.capture_plan("a", 30) == captures.capture_plan("a", 30)
    assert captures.capture_plan("a", 30) != captures.capture_plan("b", 30)
    firsts = [order[0] for order, _ in captures.capture_plan("deepseek-v3/ep8/tpr8/gptq-int4-g128/bf16", 30)]
    assert 8 <= firsts.count("base") <= 22, "each build goes first in about half the captures"


def test_sample_i_of_each_build_comes_from_the_same_pair(monkeypatch):
    _, result = _run(monkeypatch, repeats=4, captures=1)
    s = result.samples
    assert sorted(s["base"] + s["candidate"]) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert all(abs(b - c) in (1.0, 3.0) for b, c in zip(s["base"], s["candidate"], strict=True))


class SleepyRunner(FakeRunner):
    """FakeRunner whose graphs take 100 us a call, plus 0.1 us for an appended sleep kernel and its cycles."""

    def capture(self, module, forced_bm=None, sleep_cycles=None):
        self.events.append(("capture", module, sleep_cycles))
        return (module, sleep_cycles)

    def time_us(self, graph):
        _module, cycles = graph
        self.events.append(("time", graph))
        return 100.0 if cycles is None else 100.0 + 0.1 + cycles / (2000.0 * graphs.CALLS_PER_GRAPH)


def test_an_injected_slowdown_sleeps_in_the_candidates_graphs_only(monkeypatch):
    monkeypatch.setattr(bench, "check_outputs_agree", lambda *a, **k: {"ok": True})
    monkeypatch.setattr(bench, "picked_block_size", lambda runner, module: 8)
    runner = SleepyRunner()
    same = SimpleNamespace(name="base", marlin_moe="base"), SimpleNamespace(name="candidate", marlin_moe="base")
    sleep = {"cycles_per_us": 2000.0, "empty_sleep_us": 1.0}  # per graph: 0.1 us a call
    result = bench.run_case(runner, same, repeats=12, captures=6, block_size_repeats=0, inject=0.035, sleep=sleep)
    injected = result.extra["injected"]
    assert injected["pilot_base_us"] == 100.0 and injected["smallest_fraction"] == pytest.approx(0.001)
    assert injected["sleep_cycles"] == round((3.5 - 0.1) * graphs.CALLS_PER_GRAPH * 2000)
    ratios = [c / b for b, c in zip(result.samples["base"], result.samples["candidate"], strict=True)]
    assert ratios == pytest.approx([1.035] * 12), "the candidate is exactly the injected fraction slower"
    assert result.extra["block_sizes_us"] == {}, "no sweep with block_size_repeats=0"
    timed_captures = [e for e in runner.events if e[0] == "capture"][1:]  # after the pilot capture
    assert len(timed_captures) == 12 and {e[2] for e in timed_captures} == {None, injected["sleep_cycles"]}


def test_an_injected_slowdown_needs_an_aa_run_and_a_sleep_rate(monkeypatch):
    monkeypatch.setattr(bench, "check_outputs_agree", lambda *a, **k: {"ok": True})
    monkeypatch.setattr(bench, "picked_block_size", lambda runner, module: 8)
    variants = (SimpleNamespace(name="base", marlin_moe="base"), SimpleNamespace(name="candidate", marlin_moe="c"))
    with pytest.raises(UsageError, match="A/A run"):
        bench.run_case(SleepyRunner(), variants, repeats=6, captures=6, inject=0.02, sleep={"cycles_per_us": 1.0})
    with pytest.raises(UsageError, match="pass --aa too"):
        bench.check_plan(30, 90, inject=0.02, aa=False)
    with pytest.raises(UsageError, match=r"between 0 and 0\.5"):
        bench.check_plan(30, 90, inject=0.9, aa=True)
    with pytest.raises(UsageError, match="block-size-repeats -1"):
        bench.check_plan(30, 90, block_size_repeats=-1)
    bench.check_plan(6, 6, block_size_repeats=0, inject=0.5, aa=True)


def test_sleep_cycles_for_takes_the_empty_kernel_off_and_never_goes_negative():
    assert graphs.sleep_cycles_for(0.05, 20.0, 0.2, 1980.0) == round(0.8 * graphs.CALLS_PER_GRAPH * 1980)
    assert graphs.sleep_cycles_for(0.02, 10.0, 0.5, 1980.0) == 0  # the empty kernel alone is already +5%
    for bad in ((0, 20.0, 0.1, 1980.0), (0.02, 0.0, 0.1, 1980.0), (0.02, 20.0, -0.1, 1980.0), (0.02, 20, 0, 0)):
        with pytest.raises(UsageError):
            graphs.sleep_cycles_for(*bad)
