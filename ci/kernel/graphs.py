"""One bench case on the GPU: its inputs (rotating sets, fresh for each capture), CUDA graphs of its calls,
the one timer (``replay_us``: CUDA events around a replay), and the GPU sleep an injected slowdown appends."""

from __future__ import annotations

import contextlib

from ci.core import stats
from ci.core.errors import UsageError
from ci.kernel.suites import BenchCase

CALLS_PER_GRAPH = 10
ROTATING_INPUTS = 4
WARMUP_REPLAYS = 1  # per fresh graph before timing (3 until 2026-11-29: 1/3 of the GPU time, see README)
INJECT_PILOT_ROUNDS = 10  # per case, to calibrate an injected slowdown
SLEEP_CALIBRATION_CYCLES = 2_000_000  # torch.cuda._sleep cycles timed once per run (about 1 ms on an H200)
EMPTY_SLEEP_NODES = 50  # empty sleep kernels in one graph, to time what one more kernel node costs


class CaseRunner:
    """Builds the inputs of one case and times graphs of calls on them."""

    def __init__(self, case: BenchCase, experts) -> None:
        import torch

        from ci.kernel import moe_case as mc

        self.torch, self.mc, self.case = torch, mc, case
        shape = mc.Shape(case.shape_name, case.hidden, case.intermediate, case.experts, case.topk)
        self.view = mc.rank_view(case.experts, case.ep, 0)
        self.experts = experts
        self.shape = shape
        self._callers: dict[int, object] = {}  # batched path: one BatchedMarlinExperts stand-in per build
        self.inputs = self._route(capture=0)

    def _route(self, capture: int) -> list:
        routed = [self.mc.route(self.case.rows, self.shape, self.torch.bfloat16,
                                seed=100 + ROTATING_INPUTS * capture + i) for i in range(ROTATING_INPUTS)]  # fmt: skip
        if self.case.path == "fused":
            return routed
        # batched: every rank's tokens routed over the global experts; rank 0 holds what reached its experts
        return [self.mc.batched_by_expert(r.hidden, r.topk_ids, self.experts.w1.shape[0], self.case.capacity,
                                          own_topk_ids=r.topk_ids[: self.case.tokens_per_rank],
                                          expert_map=self.view.expert_map) for r in routed]  # fmt: skip

    def start_capture(self, capture: int, pad_bytes: int):
        """Fresh input buffers for ``capture``, allocated after a pad of ``pad_bytes``, so neither build
        keeps the addresses it had (return the pad: it must live as long as the capture's graphs)."""
        pad = self.torch.empty(pad_bytes, dtype=self.torch.uint8, device="cuda")
        self.inputs = self._route(capture)
        return pad

    def call(self, module, routing):
        if self.case.path == "batched":
            caller = self._callers.get(id(module))
            if caller is None:
                caller = self._callers[id(module)] = self.mc.batched_experts(
                    module, self.experts, num_dispatchers=self.case.ep, max_num_tokens=self.case.per_dispatcher,
                    fmt=self.case.format)  # fmt: skip
            return self.mc.call_batched(module, caller, self.experts.w1, self.experts.w2, routing,
                                        global_num_experts=self.case.global_num_experts,
                                        fmt=self.case.format)  # fmt: skip
        return self.mc.call_moe(
            module, self.experts, routing, global_num_experts=self.case.global_num_experts,
            expert_map=self.view.expert_map, **self.mc.format_kwargs(self.case.format, module.fused_marlin_moe),
        )  # fmt: skip

    def valid_output(self, out, routing):
        """The rows that carry tokens (the batched path leaves padding rows unwritten)."""
        return out if self.case.path == "fused" else out[routing.rows >= 0]

    def capture(self, module, forced_bm: int | None = None, sleep_cycles: int | None = None):
        """A CUDA graph of CALLS_PER_GRAPH calls of ``module``; ``sleep_cycles``: a GPU sleep of that many
        cycles appended inside the graph (an injected slowdown, ``--inject-slowdown``)."""
        ctx = self.mc.forced_block_size(module, forced_bm) if forced_bm else contextlib.nullcontext()
        with ctx:
            return graph_of_calls(self.torch, lambda r: self.call(module, r), self.inputs, sleep_cycles)

    def time_us(self, graph) -> float:
        """Microseconds per call: one replay of a graph of CALLS_PER_GRAPH calls."""
        return replay_us(self.torch, graph) / CALLS_PER_GRAPH


def graph_of_calls(torch, call, inputs: list, sleep_cycles: int | None = None):
    """A CUDA graph of CALLS_PER_GRAPH calls ``call(inputs[i % ROTATING_INPUTS])``, each input called once
    before, outside the graph (JIT, workspace allocation), replayed WARMUP_REPLAYS times after; ``sleep_cycles``:
    a GPU sleep of that many cycles appended inside the graph (an injected slowdown)."""
    for r in inputs:
        call(r)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS_PER_GRAPH):
            call(inputs[i % ROTATING_INPUTS])
        if sleep_cycles is not None:
            torch.cuda._sleep(sleep_cycles)
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def sleep_cycles_for(fraction: float, base_us: float, overhead_us: float, cycles_per_us: float) -> int:
    """GPU sleep cycles to append to a graph of CALLS_PER_GRAPH calls of ``base_us`` each so that the graph
    is ``fraction`` slower; ``overhead_us`` (per call) is what an empty sleep kernel already adds."""
    if not (fraction > 0 and base_us > 0 and cycles_per_us > 0 and overhead_us >= 0):
        raise UsageError(f"an injected slowdown needs fraction, base time and sleep rate > 0 (got {fraction}, "
                         f"{base_us} us, {cycles_per_us} cycles/us)")  # fmt: skip
    return round(max(0.0, fraction * base_us - overhead_us) * CALLS_PER_GRAPH * cycles_per_us)


def replay_us(torch, graph) -> float:
    """The one timer of the bench: microseconds of one replay of a CUDA graph, between CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0


def _graph_time_us(torch, graph, replays: int = 5) -> float:
    return stats.median([replay_us(torch, graph) for _ in range(replays)])


def sleep_calibration(torch) -> dict:
    """The GPU sleep on this GPU now, timed in CUDA graphs: cycles per microsecond, and what one more
    (empty) kernel node costs a graph. Once per run, away from the cases' own captures and their error."""
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    long, empties = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(long):
        torch.cuda._sleep(SLEEP_CALIBRATION_CYCLES)
    with torch.cuda.graph(empties):
        for _ in range(EMPTY_SLEEP_NODES):
            torch.cuda._sleep(0)
    long.replay()
    empties.replay()
    torch.cuda.synchronize()
    return {"cycles_per_us": SLEEP_CALIBRATION_CYCLES / _graph_time_us(torch, long),
            "empty_sleep_us": _graph_time_us(torch, empties) / EMPTY_SLEEP_NODES}  # fmt: skip


def calibrate_slowdown(runner, module, fraction: float, sleep: dict) -> dict:
    """Per case: time the base graph (a pilot) and size the sleep appended to the candidate's graphs so that
    they are ``fraction`` slower (the empty kernel's own cost is a floor: ``smallest_fraction``)."""
    plain = runner.capture(module)
    base_us = stats.median([runner.time_us(plain) for _ in range(INJECT_PILOT_ROUNDS)])
    del plain
    overhead_us = sleep["empty_sleep_us"] / CALLS_PER_GRAPH  # per call, as time_us reports
    return {
        "fraction": fraction,
        "pilot_base_us": base_us,
        "sleep_cycles": sleep_cycles_for(fraction, base_us, overhead_us, sleep["cycles_per_us"]),
        "smallest_fraction": overhead_us / base_us,
    }
