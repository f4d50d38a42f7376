"""How every bench times work on the GPU: a CUDA graph of ``CALLS_PER_GRAPH`` calls over rotating inputs, the one
timer (``replay_us``: CUDA events around a replay), and the GPU sleep an injected slowdown appends, sized per
case (``calibrate_slowdown``) from the sleep's rate on this GPU (``sleep_calibration``).

A subject brings a *runner* for its case: ``capture(module, sleep_cycles=None)`` returns a graph of its calls,
``time_us(graph)`` the microseconds of one call in it, ``start_capture(b, pad_bytes)`` fresh inputs behind a pad
(``ci.timing.captures``). Nothing here knows what is called.
"""

from __future__ import annotations

from ci.core import stats
from ci.core.errors import UsageError

CALLS_PER_GRAPH = 10
ROTATING_INPUTS = 4
WARMUP_REPLAYS = 1  # per fresh graph before timing (3 until 2026-11-29: 1/3 of the GPU time, see README)
INJECT_PILOT_ROUNDS = 10  # per case, to calibrate an injected slowdown
SLEEP_CALIBRATION_CYCLES = 2_000_000  # torch.cuda._sleep cycles timed once per run (about 1 ms on an H200)
EMPTY_SLEEP_NODES = 50  # empty sleep kernels in one graph, to time what one more kernel node costs


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
        raise UsageError(
            f"an injected slowdown needs fraction, base time and sleep rate > 0 (got {fraction}, "
            f"{base_us} us, {cycles_per_us} cycles/us)"
        )
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
    return {
        "cycles_per_us": SLEEP_CALIBRATION_CYCLES / _graph_time_us(torch, long),
        "empty_sleep_us": _graph_time_us(torch, empties) / EMPTY_SLEEP_NODES,
    }


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
