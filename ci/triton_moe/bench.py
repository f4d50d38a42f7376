"""The Triton fused-MoE bench: one EP rank's ``fused_experts_impl``, base vs candidate, on one GPU.

Each case (``ci.triton_moe.suites``) is timed as the Marlin bench times its cases, with its code: fresh
CUDA-graph captures of 10 calls (``ci.timing.graphs.graph_of_calls``) in a seeded order and at seeded addresses,
rounds within each capture in alternating order, more captures while a case is INCONCLUSIVE
(``ci.timing.captures.time_sequentially``), one timer
(``ci.timing.graphs.replay_us``); the verdict's interval is over captures (``ci.core``). Before timing, the
builds' outputs must agree (bit for bit without EP, or within the base's own spread where it does not repeat its
bits: ``ci.timing.agreement``). The config each build launches with is recorded, and a
**regret table** times a small sweep (``suites.sweep_configs``: the M and N tiles and the warps) beside the
two chosen configs: how much slower each choice is than the best config found.

Both builds run in one process: the candidate's ``fused_moe.py`` is loaded from its tree as a fresh module
(``ci.trees.variants``) without registering its torch op again (the bench calls ``fused_experts_impl``
itself, never ``torch.ops.vllm.fused_experts``).

Usage: ``python -m ci.triton_moe.bench --manifest M --out DIR [--suite default] [--cases GLOB] [--aa]
[--captures 30] [--repeats 90] [--sweep-repeats 5] [--sequential on|off] [--max-extra 3] [--threshold 0.03]``;
writes ``DIR/triton-moe-results.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Sequence

from ci.core import sequential, stats
from ci.core.cli import run_main
from ci.core.errors import UsageError, WrongResultsError
from ci.core.results import BenchResults, CaseResult
from ci.host import gpu, outputs
from ci.timing import agreement
from ci.timing.captures import add_bench_arguments, plan_for, time_sequentially
from ci.timing.graphs import CALLS_PER_GRAPH, ROTATING_INPUTS, graph_of_calls, replay_us
from ci.trees import provenance
from ci.trees.manifest import load_trees
from ci.triton_moe.spec import NON_EP
from ci.triton_moe.suites import SUITES, TritonCase, config_label, suite_cases, sweep_configs

KIND = "triton-moe-bench"
ENTRY = "vllm.model_executor.layers.fused_moe.fused_moe"
DEFAULT_CAPTURES, DEFAULT_REPEATS = 30, 90  # the Marlin bench's: 30 captures x 3 rounds a build
MIN_CAPTURES = 6  # a 95% signed-rank interval over captures needs at least 6
SWEEP_REPEATS = 5  # timed replays per config of the regret sweep (regret only, not gated)
EP_EQUAL_BOUND = 1e-2  # rel L2 between the builds under EP (another tiling sums in another order)
WEIGHT_SCALE = 0.02
IDENTITY_KEYS = (
    "shape",
    "hidden",
    "intermediate",
    "global_experts",
    "local_experts",
    "topk",
    "ep",
    "tokens_per_rank",
    "rows",
    "global_num_experts_arg",
    "scheme",
)


def _print(line: str) -> None:
    print(line, flush=True)


@contextlib.contextmanager
def op_registration_skipped():
    """While the candidate's ``fused_moe.py`` is imported: its ``direct_register_custom_op`` calls do nothing
    (the base's registration of ``vllm::fused_experts`` stays; a second one is an error in torch)."""
    from vllm.utils import torch_utils

    from ci.moe.patching import swapped

    with swapped(torch_utils, direct_register_custom_op=lambda *args, **kwargs: None):
        yield


def load_sides(trees, aa: bool = False) -> dict:
    """``{"base": module, "candidate": module}``: the two builds' ``fused_moe`` modules (the base's twice: A/A)."""
    from ci.trees.variants import check_base_importable, load_candidate, put_base_first

    put_base_first(trees)
    base = check_base_importable(trees, ENTRY)
    candidate = base if aa else load_candidate(trees, ENTRY, during=op_registration_skipped())
    return {"base": base, "candidate": candidate}


def local_weights(case: TritonCase, seed: int = 7):
    """Rank 0's experts: ``w1`` (E, 2I, H) and ``w2`` (E, H, I), bf16, random."""
    import torch

    s = case.shape
    local = s.experts // case.ep
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w1 = torch.randn(local, 2 * s.intermediate, s.hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    w2 = torch.randn(local, s.hidden, s.intermediate, device="cuda", dtype=torch.bfloat16, generator=gen)
    return w1.mul_(WEIGHT_SCALE), w2.mul_(WEIGHT_SCALE)


class Runner:
    """One case on the GPU: its routed rows (fresh per capture), calls, graphs and the config they get."""

    def __init__(self, case: TritonCase, weights) -> None:
        import torch

        from ci.moe import routing as mr

        self.torch, self.mr, self.case = torch, mr, case
        self.w1, self.w2 = weights
        self.view = mr.rank_view(case.shape.experts, case.ep, 0)
        self.inputs = self._route(0)

    def _route(self, capture: int) -> list:
        return [
            self.mr.route(
                self.case.rows, self.case.shape, self.torch.bfloat16, seed=100 + ROTATING_INPUTS * capture + i
            )
            for i in range(ROTATING_INPUTS)
        ]

    def start_capture(self, capture: int, pad_bytes: int):
        pad = self.torch.empty(pad_bytes, dtype=self.torch.uint8, device="cuda")
        self.inputs = self._route(capture)
        return pad

    def call(self, module, routing):
        return module.fused_experts_impl(
            routing.hidden,
            self.w1,
            self.w2,
            routing.topk_weights,
            routing.topk_ids,
            global_num_experts=self.case.global_num_experts,
            expert_map=self.view.expert_map,
        )

    def chosen_config(self, module) -> dict:
        """The config both GEMM launches of one call get (they must get the same one)."""
        from ci.moe.patching import swapped

        seen, launch = [], module.dispatch_fused_moe_kernel

        def recording(*args, **kwargs):
            seen.append(dict(kwargs["config"] if "config" in kwargs else args[12]))
            return launch(*args, **kwargs)

        with swapped(module, dispatch_fused_moe_kernel=recording):
            self.call(module, self.inputs[0])
        if len(seen) != 2 or seen[0] != seen[1]:
            raise WrongResultsError(f"{self.case.id}: the two GEMMs of one call got {seen}, not one config twice")
        return seen[0]

    def capture(self, module, config: dict | None = None):
        """A CUDA graph of CALLS_PER_GRAPH calls; ``config``: forced on every call (the regret sweep)."""
        from ci.moe.patching import swapped

        forced = swapped(module, try_get_optimal_moe_config=lambda *a, **k: dict(config)) if config else None
        with forced or contextlib.nullcontext():
            return graph_of_calls(self.torch, lambda r: self.call(module, r), self.inputs)

    def time_us(self, graph) -> float:
        return replay_us(self.torch, graph) / CALLS_PER_GRAPH


def check_outputs_agree(runner: Runner, sides: dict) -> dict:
    torch, r = runner.torch, runner.inputs[0]
    a, b = runner.call(sides["base"], r), runner.call(sides["candidate"], r)
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise WrongResultsError(f"{runner.case.id}: NaN/Inf in the output; refusing to time wrong results")
    diff = agreement.rel_l2(a, b)
    identical = bool(torch.equal(a, b))
    found = {"ok": True, "identical": identical, "rel_l2": diff}
    if runner.case.global_num_experts == NON_EP and not identical:
        spread = agreement.own_spread(lambda: runner.call(sides["base"], r), a)
        if not agreement.within_spread(diff, spread):
            raise WrongResultsError(
                f"{runner.case.id}: global_num_experts == -1 but the candidate's output differs from the base's "
                f"({agreement.describe(diff, spread)}): wrong numbers"
            )
        found["base_spread"] = spread
    if diff > EP_EQUAL_BOUND:
        raise WrongResultsError(f"{runner.case.id}: candidate differs from base (rel L2 {diff:.2e}); refusing to time")
    return found


def run_case(
    runner: Runner,
    sides: dict,
    repeats: int,
    captures: int,
    sweep_repeats: int,
    plan: sequential.Plan | None = None,
    threshold: float = stats.DEFAULT_THRESHOLD,
    log=None,
) -> CaseResult:
    """Time one case by ``plan`` (``ci.timing.captures.time_sequentially``; None: one look of ``captures``)."""
    case = runner.case
    correctness = check_outputs_agree(runner, sides)
    configs = {name: runner.chosen_config(module) for name, module in sides.items()}
    samples, capture_of, groups = time_sequentially(
        runner,
        case.id,
        plan or sequential.Plan.single(captures),
        max(1, repeats // captures),
        lambda name: runner.capture(sides[name]),
        threshold,
        log,
    )
    configs_us: dict[str, list[float]] = {}
    if sweep_repeats > 0:
        tried = {config_label(c): c for c in [*sweep_configs(), *configs.values()]}
        for label, config in tried.items():
            graph = runner.capture(sides["base"], config)
            configs_us[label] = [runner.time_us(graph) for _ in range(sweep_repeats)]
            del graph
    s = case.shape
    return CaseResult(
        id=case.id,
        unit="us/call",
        samples=samples,
        info={
            "shape": s.name,
            "hidden": s.hidden,
            "intermediate": s.intermediate,
            "global_experts": s.experts,
            "local_experts": int(runner.view.local_ids.numel()),
            "topk": s.topk,
            "ep": case.ep,
            "tokens_per_rank": case.tokens_per_rank,
            "rows": case.rows,
            "global_num_experts_arg": case.global_num_experts,
            "scheme": case.scheme,
            "config": configs,
            "config_label": {k: config_label(v) for k, v in configs.items()},
        },
        extra={"captures": capture_of, "correctness": correctness, "configs_us": configs_us, "groups": groups},
    )


def run_suite(
    trees,
    cases: list[TritonCase],
    suite: str,
    *,
    aa: bool = False,
    case_filter: str | None = None,
    repeats: int = DEFAULT_REPEATS,
    captures: int = DEFAULT_CAPTURES,
    sweep_repeats: int = SWEEP_REPEATS,
    log=_print,
    plan: sequential.Plan | None = None,
    threshold: float = stats.DEFAULT_THRESHOLD,
) -> BenchResults:
    import torch

    sides = load_sides(trees, aa)
    plan = plan or sequential.Plan.single(captures)
    log(f"triton bench: {len(cases)} case(s), {max(1, repeats // captures)} round(s) a capture; {plan.describe()}")
    started, results, failed, weights, key = time.time(), [], {}, None, None
    for i, case in enumerate(cases, 1):
        if (case.shape_name, case.ep) != key:
            weights, key = None, (case.shape_name, case.ep)
            torch.cuda.empty_cache()
            weights = local_weights(case)
        try:
            result = run_case(Runner(case, weights), sides, repeats, captures, sweep_repeats, plan, threshold, log)
        except WrongResultsError as exc:  # the other cases still run; the gate FAILs this one
            failed[case.id] = str(exc)
            log(f"triton bench [{i}/{len(cases)}] {case.id}: NOT TIMED: {exc}")
            continue
        results.append(result)
        med = {k: stats.median(v) for k, v in result.samples.items()}
        labels = result.info["config_label"]
        log(
            f"triton bench [{i}/{len(cases)}] {case.id}: base {med['base']:.1f} us, candidate "
            f"{med['candidate']:.1f} us ({labels['base']} -> {labels['candidate']}), {time.time() - started:.0f} s"
        )
    return BenchResults(
        kind=KIND,
        suite=suite,
        provenance=provenance.collect(trees, with_cuda=True),
        settings={
            "repeats": repeats,
            "captures": captures,
            "rounds_per_capture": max(1, repeats // captures),
            "sweep_repeats": sweep_repeats,
            "calls_per_graph": CALLS_PER_GRAPH,
            "rotating_inputs": ROTATING_INPUTS,
            "timer": "CUDA events around a CUDA-graph replay",
            "wall_time_s": round(time.time() - started, 1),
            "aa": aa,
            "candidate": "base (A/A run)" if aa else "candidate tree",
            "expected_cases": [c.id for c in cases],
            "case_filter": case_filter,
            "failed_cases": failed,
            "identity_keys": list(IDENTITY_KEYS),
            "sequential": plan.to_settings(threshold),
            "extra_captures": {r.id: len(r.extra["groups"]) - 1 for r in results if len(r.extra["groups"]) > 1},
        },
        cases=results,
    )


def check_plan(captures: int, repeats: int, sweep_repeats: int) -> None:
    if captures < MIN_CAPTURES or repeats < captures:
        raise UsageError(
            f"--captures {captures} --repeats {repeats}: a 95% interval over captures needs at least "
            f"{MIN_CAPTURES} captures, and each capture at least one round (defaults "
            f"{DEFAULT_CAPTURES} and {DEFAULT_REPEATS})"
        )
    if sweep_repeats < 0:
        raise UsageError(f"--sweep-repeats {sweep_repeats}: 0 (no regret table) or more")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.triton_moe.bench", description=__doc__.split("\n\n")[0]
    )
    add_bench_arguments(
        parser, results_file=outputs.TRITON_RESULTS, suites=SUITES, captures=DEFAULT_CAPTURES, repeats=DEFAULT_REPEATS
    )
    parser.add_argument(
        "--sweep-repeats",
        type=int,
        default=SWEEP_REPEATS,
        help="timings per config of the regret sweep; 0: no sweep (%(default)s)",
    )
    args = parser.parse_args(argv)
    check_plan(args.captures, args.repeats, args.sweep_repeats)
    plan = plan_for(args.captures, args.sequential == "on", args.max_extra)
    out = outputs.results_file(args.out, outputs.TRITON_RESULTS)
    cases = suite_cases(args.suite, args.cases)
    trees = load_trees(args.manifest)
    gpu.require_idle_gpus(1, allow_busy=args.allow_busy)
    results = run_suite(
        trees,
        cases,
        args.suite,
        aa=args.aa,
        case_filter=args.cases,
        repeats=args.repeats,
        captures=args.captures,
        sweep_repeats=args.sweep_repeats,
        plan=plan,
        threshold=args.threshold,
    )
    return outputs.save_and_check(results, out, "triton bench")


if __name__ == "__main__":
    sys.exit(run_main(main))
