"""A calibrated GPU sleep in every ``fused_marlin_moe`` call of a TPOT server: how the TPOT gate's error
rates are measured (``python -m ci.serving.tpot --aa --inject-sleep-us US``).

``ci.serving.tpot`` puts this folder first on the ``PYTHONPATH`` of the candidate server only, with
``GATE_INJECT_SLEEP_US`` set; Python imports ``sitecustomize`` in every process of the server (the API
server, the engine core and its workers). When vLLM's Marlin MoE module is imported, its
``fused_marlin_moe`` is wrapped: each call first runs ``torch.cuda._sleep`` for that many microseconds on
the current stream, so the sleep is captured into the decode CUDA graphs like the kernels themselves.
The sleep's cycles per microsecond are timed on the first call outside a graph capture (vLLM's memory
profiling runs the model before it captures). Another ``sitecustomize`` further down the path still runs.
Standard library only until the first call (then torch, which vLLM has imported).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

TARGET = "vllm.model_executor.layers.fused_moe.experts.marlin_moe"
SLEEP_US = float(os.environ.get("GATE_INJECT_SLEEP_US") or 0)
CALIBRATION_CYCLES = 1_000_000


def _cycles_per_us(torch, tries: int = 5) -> float:
    """Sleep cycles a microsecond, from the shortest of ``tries`` timed sleeps: other servers starting on the
    same GPU at the same time can only lengthen one."""
    torch.cuda._sleep(1000)  # the kernel loaded and the stream warm
    shortest_ms = float("inf")
    for _ in range(tries):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        end.record()
        end.synchronize()
        shortest_ms = min(shortest_ms, start.elapsed_time(end))
    return CALIBRATION_CYCLES / (shortest_ms * 1000.0)


def slowed(fn, sleep_us: float):
    """``fn`` with a GPU sleep of ``sleep_us`` before each call (cycles timed on the first uncaptured call)."""
    state: dict = {}

    def fused_marlin_moe(*args, **kwargs):
        import torch

        if "cycles" not in state:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "gate injection: the first fused_marlin_moe call is inside a graph capture, "
                    "so the sleep cannot be timed; nothing was injected"
                )
            state["cycles"] = max(0, round(sleep_us * _cycles_per_us(torch)))
            print(
                f"gate injection: {sleep_us} us = {state['cycles']} GPU sleep cycles a fused_marlin_moe call",
                file=sys.stderr,
                flush=True,
            )
        torch.cuda._sleep(state["cycles"])
        return fn(*args, **kwargs)

    fused_marlin_moe.__wrapped__ = fn
    return fused_marlin_moe


class _Loader(importlib.abc.Loader):
    def __init__(self, inner) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        module.fused_marlin_moe = slowed(module.fused_marlin_moe, SLEEP_US)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, the one this file shadows."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if entry and os.path.abspath(entry) != here:
            spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                return


if SLEEP_US > 0:
    sys.meta_path.insert(0, _Finder())
_chain()
