"""One Marlin bench case on the GPU: its inputs (rotating sets, fresh for each capture) and the calls of both
Marlin paths, captured and timed with ``ci.timing.graphs`` (the graphs, the one timer, the injected sleep)."""

from __future__ import annotations

import contextlib

from ci.kernel.suites import BenchCase
from ci.moe.routing import rank_view, route
from ci.timing.graphs import CALLS_PER_GRAPH, ROTATING_INPUTS, graph_of_calls, replay_us


class CaseRunner:
    """Builds the inputs of one case and times graphs of calls on them."""

    def __init__(self, case: BenchCase, experts) -> None:
        import torch

        from ci.kernel import moe_case as mc

        self.torch, self.mc, self.case = torch, mc, case
        shape = case.shape
        self.view = rank_view(case.experts, case.ep, 0)
        self.experts = experts
        self.shape = shape
        self._callers: dict[int, object] = {}  # batched path: one BatchedMarlinExperts stand-in per build
        self.inputs = self._route(capture=0)

    def _route(self, capture: int) -> list:
        routed = [
            route(self.case.rows, self.shape, self.torch.bfloat16, seed=100 + ROTATING_INPUTS * capture + i)
            for i in range(ROTATING_INPUTS)
        ]
        if self.case.path == "fused":
            return routed
        # batched: every rank's tokens routed over the global experts; rank 0 holds what reached its experts
        return [
            self.mc.batched_by_expert(
                r.hidden,
                r.topk_ids,
                self.experts.w1.shape[0],
                self.case.capacity,
                own_topk_ids=r.topk_ids[: self.case.tokens_per_rank],
                expert_map=self.view.expert_map,
            )
            for r in routed
        ]

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
                    module,
                    self.experts,
                    num_dispatchers=self.case.ep,
                    max_num_tokens=self.case.per_dispatcher,
                    fmt=self.case.format,
                )
            return self.mc.call_batched(
                module,
                caller,
                self.experts.w1,
                self.experts.w2,
                routing,
                global_num_experts=self.case.global_num_experts,
                fmt=self.case.format,
            )
        return self.mc.call_moe(
            module,
            self.experts,
            routing,
            global_num_experts=self.case.global_num_experts,
            expert_map=self.view.expert_map,
            **self.mc.format_kwargs(self.case.format, module.fused_marlin_moe),
        )

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
