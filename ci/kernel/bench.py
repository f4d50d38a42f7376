"""Time vLLM's fused_marlin_moe as one EP rank sees it, base vs candidate, on one GPU.

Per case (model shape x EP size x tokens per rank, in one format of ``ci.kernel.formats``: GPTQ int4 unless the case
id names another, e.g. ``nvfp4``): the rank holds ``E = G / ep`` experts and
sees ``tokens_per_rank * ep`` DP-padded rows; ``ep = 1`` is the non-EP caller
(``global_num_experts == -1``, or ``== E`` with no expert map as vLLM's modular kernel calls it: the
``ep1-g<E>`` cases). Both builds are first checked to give the same output (bit-identical for ep = 1, or
within 4x the base's own call-to-call spread where the base does not repeat its bits: ``ci.timing.agreement``); a case
whose outputs differ is an error, never a timing: exit 12 for wrong numbers; on the non-EP path, outputs that
differ because the candidate picks another tile are a non-EP change, a FAIL (exit 1) where the change's
contract does not declare the path, and timed where it does.

Timing: a CUDA graph of ``calls`` consecutive calls over rotating input sets (so the L2
cache does not flatter), replayed and timed with CUDA events, after warm-up (the first
Marlin call JIT-compiles PTX). Two captures of the same kernels time 1-3% apart (a systematic
error of the capture: addresses, placement), so each case is timed in ``captures``: every capture
draws fresh input buffers, shifts the next allocations by a random pad, captures both builds
anew in a random order, then times them for a few alternating rounds (A B, B A, ...). The
gate's interval is taken over captures (``ci.core.stats.capture_effect``), so that error is inside it.
Every ``block_size_m`` in {8, 16, 32, 48, 64} is timed too, for each heuristic's regret.
Raw samples (microseconds per call) and each sample's capture go into a versioned results file.

``--inject-slowdown F`` (with ``--aa``) is how the gate's error rates are measured on a GPU
(``ci.kernel.error_rates``): the candidate is the base build with a GPU sleep appended to each of its
graphs, calibrated per case so that the candidate is F (e.g. 0.035) slower than the base.

The cases and suites are ``ci.kernel.suites``; a case's inputs and calls ``ci.kernel.graphs``; the graphs, the timer
and the capture schedule ``ci.timing``; this module is the correctness check before timing, the regret sweep, the
results and the CLI.

A case still INCONCLUSIVE after its captures gets a group of 10 more, judged again, up to 3 groups
(``ci.core.sequential``: the looks spend the error, so the rates hold; ``--sequential off``, ``--max-extra``).

Usage: ``python -m ci.kernel.bench --manifest M [--suite default|quick] [--repeats 90] [--captures 30]
[--sequential on|off] [--max-extra 3] [--threshold 0.03] --out DIR``
(writes ``DIR/kernel-results.json``)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from ci.core import sequential, stats
from ci.core.cli import run_main
from ci.core.errors import UndeclaredChangeError, UsageError, WrongResultsError
from ci.core.results import BenchResults, CaseResult
from ci.host import gpu, outputs
from ci.kernel.formats import FORMATS_BY_NAME
from ci.kernel.graphs import CaseRunner
from ci.kernel.suites import SUITES, BenchCase, runnable_block_sizes, suite_cases
from ci.moe.routing import rank_view
from ci.timing import agreement
from ci.timing.captures import add_bench_arguments, plan_for, time_sequentially
from ci.timing.graphs import CALLS_PER_GRAPH, ROTATING_INPUTS, WARMUP_REPLAYS, calibrate_slowdown, sleep_calibration
from ci.trees import provenance
from ci.trees.manifest import load_trees

DEFAULT_REPEATS = 90  # timed rounds per build, over DEFAULT_CAPTURES captures (README: error rates)
DEFAULT_CAPTURES = 30  # fresh captures per build; 30 x 3 rounds: simulated, with the measured capture error,
# A/A and +2% never FAIL, +3.5% FAILs in 94% (20 x 3: 81%); the GPU time is to be measured on the H200
MIN_CAPTURES = 6  # a 95% signed-rank interval over captures needs at least 6
BLOCK_SIZE_REPEATS = 10  # per forced block size (regret only, not gated)
EP_EQUAL_BOUND = 1e-2  # rel L2 between base and candidate under EP (tiling may differ); ep = 1 must be exact


def _print(line: str) -> None:
    print(line, flush=True)


def check_outputs_agree(
    runner: CaseRunner, base, cand, picks: dict | None = None, *, non_ep_declared: bool = False
) -> dict:
    """The correctness gate before timing: same numbers from both builds (bit-identical on the non-EP path, or
    within the base's own call-to-call spread where the base does not repeat its bits (``ci.timing.agreement``),
    unless the builds pick other tiles there and the change's contract declares the non-EP path)."""
    torch = runner.torch
    r = runner.inputs[0]
    a, b = runner.valid_output(runner.call(base, r), r), runner.valid_output(runner.call(cand, r), r)
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise WrongResultsError(f"{runner.case.id}: NaN/Inf in the output; refusing to time wrong results")
    diff = agreement.rel_l2(a, b)
    identical = bool(torch.equal(a, b))
    case = runner.case
    found = {"ok": True, "identical": identical, "rel_l2": diff}
    if case.non_ep and not identical:
        g = f"global_num_experts {case.global_num_experts}, no expert map"
        if not picks or picks["base"] == picks["candidate"]:
            spread = agreement.own_spread(lambda: runner.valid_output(runner.call(base, r), r), a)
            if not agreement.within_spread(diff, spread):
                raise WrongResultsError(
                    f"{case.id}: a non-EP call ({g}): the candidate's output differs from the "
                    f"base's with the same tile ({agreement.describe(diff, spread)}): wrong numbers"
                )
            found["base_spread"] = spread
        elif not non_ep_declared:
            raise UndeclaredChangeError(
                f"{case.id}: a non-EP change: the candidate picks block_size_m {picks['candidate']} where the base "
                f"picks {picks['base']} ({g}); its output differs by rel L2 {diff:.1e}, as another tile rounds "
                "differently, not wrong numbers. The change's contract does not declare the non-EP path: revert "
                "that part of the change, or declare it (CHANGES_NON_EP = True) and the case is timed"
            )
    if diff > EP_EQUAL_BOUND:
        raise WrongResultsError(f"{case.id}: candidate differs from base (rel L2 {diff:.2e}); refusing to time")
    return found


def picked_block_size(runner: CaseRunner, module) -> int:
    with runner.mc.recorded_block_size(module) as seen:
        runner.call(module, runner.inputs[0])
    return seen[0]


def timing_experts(case: BenchCase, local_experts: int):
    """Random weights in Marlin's packed layout for one rank of ``case`` (``weights.random_packed_experts``)."""
    import torch

    from ci.kernel import weights

    shape = case.shape
    return weights.random_packed_experts(shape, torch.bfloat16, local_experts=local_experts, seed=7, fmt=case.format)


def run_case(
    runner: CaseRunner,
    variants,
    repeats: int,
    captures: int = DEFAULT_CAPTURES,
    *,
    block_size_repeats: int = BLOCK_SIZE_REPEATS,
    inject: float = 0.0,
    sleep: dict | None = None,
    non_ep_declared: bool = False,
    plan: sequential.Plan | None = None,
    threshold: float = stats.DEFAULT_THRESHOLD,
    log=None,
) -> CaseResult:
    """Time one case in ``captures``, and with a sequential ``plan`` (``ci.core.sequential``) a group more each
    time it is INCONCLUSIVE at ``threshold``, up to the plan's cap (None: one look); ``inject`` > 0 (an A/A
    run): the candidate's graphs carry a GPU sleep that makes them ``inject`` slower than the base
    (``calibrate_slowdown``)."""
    base, cand = variants
    modules = {v.name: v.marlin_moe for v in variants}
    picks = {v.name: picked_block_size(runner, v.marlin_moe) for v in variants}
    correctness = check_outputs_agree(runner, base.marlin_moe, cand.marlin_moe, picks, non_ep_declared=non_ep_declared)
    sleep_of: dict[str, int | None] = {"base": None, "candidate": None}
    injected = None
    if inject:
        if cand.marlin_moe is not base.marlin_moe or sleep is None:
            raise UsageError("an injected slowdown is timed in an A/A run (--aa), with the GPU's sleep calibration")
        injected = calibrate_slowdown(runner, base.marlin_moe, inject, sleep)
        sleep_of["candidate"] = injected["sleep_cycles"]
    samples, capture_of, groups = time_sequentially(
        runner,
        runner.case.id,
        plan or sequential.Plan.single(captures),
        max(1, repeats // captures),
        lambda name: runner.capture(modules[name], sleep_cycles=sleep_of[name]),
        threshold,
        log,
    )
    per_bm: dict[str, list[float]] = {}
    if block_size_repeats > 0:
        bm_graphs = {bm: runner.capture(base.marlin_moe, forced_bm=bm) for bm in runnable_block_sizes(runner.case)}
        for _ in range(block_size_repeats):
            for bm, g in bm_graphs.items():
                per_bm.setdefault(str(bm), []).append(runner.time_us(g))
        del bm_graphs
    extra = {"block_sizes_us": per_bm, "correctness": correctness, "captures": capture_of, "groups": groups}
    if injected:
        extra["injected"] = injected
    c = runner.case
    return CaseResult(
        id=c.id,
        unit="us/call",
        samples=samples,
        info={
            "shape": c.shape_name,
            "hidden": c.hidden,
            "intermediate": c.intermediate,
            "global_experts": c.experts,
            "local_experts": int(runner.view.local_ids.numel()),
            "topk": c.topk,
            "ep": c.ep,
            "tokens_per_rank": c.tokens_per_rank,
            "path": c.path,
            **({"capacity": c.capacity} if c.path == "batched" else {}),
            **({"format": c.quant} if c.quant in FORMATS_BY_NAME else {}),
            "rows": c.rows,
            "global_num_experts_arg": c.global_num_experts,
            "quant": c.quant,
            "dtype": c.dtype,
            "block_size_m": picks,
        },
        extra=extra,
    )


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
    "quant",
    "dtype",
)


def run_suite(
    trees,
    cases: list[BenchCase],
    repeats: int,
    suite: str,
    *,
    aa: bool = False,
    case_filter: str | None = None,
    captures: int = DEFAULT_CAPTURES,
    block_size_repeats: int = BLOCK_SIZE_REPEATS,
    inject: float = 0.0,
    log=_print,
    plan: sequential.Plan | None = None,
    threshold: float = stats.DEFAULT_THRESHOLD,
) -> BenchResults:
    """Time ``cases``, each by ``plan`` (None: one look of ``captures``); ``inject`` > 0 needs ``aa`` (the
    candidate is the base plus a calibrated sleep)."""
    if inject and not aa:
        raise UsageError("--inject-slowdown is an A/A run with a slowed candidate: pass --aa too")
    import torch

    from ci.trees import contracts
    from ci.trees.variants import Variant, load_variants, put_base_first

    put_base_first(trees)
    variants = load_variants(trees)
    non_ep_declared = contracts.may_change(contracts.from_manifest(trees.manifest.contract), "non_ep")
    if aa:  # A/A: the base build against itself, to see the noise the gate must tolerate
        variants = (variants[0], Variant("candidate", variants[0].marlin_moe))
    sleep = sleep_calibration(torch) if inject else None
    plan = plan or sequential.Plan.single(captures)
    log(f"bench: {len(cases)} case(s), {max(1, repeats // captures)} round(s) a capture; {plan.describe()}")
    started, results, weights_key, experts, failed, undeclared = time.time(), [], None, None, {}, []
    for i, case in enumerate(cases, 1):
        key = (case.shape_name, case.ep, case.quant)
        if key != weights_key:
            experts, weights_key = None, key
            torch.cuda.empty_cache()
            experts = timing_experts(case, rank_view(case.experts, case.ep, 0).local_ids.numel())
        try:
            result = run_case(
                CaseRunner(case, experts),
                variants,
                repeats,
                captures,
                block_size_repeats=block_size_repeats,
                inject=inject,
                sleep=sleep,
                non_ep_declared=non_ep_declared,
                plan=plan,
                threshold=threshold,
                log=log,
            )
        except (WrongResultsError, UndeclaredChangeError) as exc:  # the other cases still run; the gate FAILs this one
            failed[case.id] = str(exc)
            if isinstance(exc, UndeclaredChangeError):
                undeclared.append(case.id)
            log(f"bench [{i}/{len(cases)}] {case.id}: NOT TIMED: {exc}")
            continue
        results.append(result)
        med = {k: stats.median(v) for k, v in result.samples.items()}
        bm = result.info["block_size_m"]
        log(
            f"bench [{i}/{len(cases)}] {case.id}: base {med['base']:.1f} us, candidate {med['candidate']:.1f} us "
            f"(block_size_m {bm['base']} -> {bm['candidate']}), {time.time() - started:.0f} s"
        )
    return BenchResults(
        kind="kernel-bench",
        suite=suite,
        provenance=provenance.collect(trees, with_cuda=True),
        settings={
            "repeats": repeats,
            "captures": captures,
            "rounds_per_capture": max(1, repeats // captures),
            "block_size_repeats": block_size_repeats,
            "calls_per_graph": CALLS_PER_GRAPH,
            "rotating_inputs": ROTATING_INPUTS,
            "warmup_replays": WARMUP_REPLAYS,
            "timer": "CUDA events around a CUDA-graph replay",
            "wall_time_s": round(time.time() - started, 1),
            "aa": aa,
            "candidate": _candidate_label(aa, inject),
            "inject_slowdown": inject,
            "sleep_calibration": sleep,
            "expected_cases": [c.id for c in cases],
            "complete": True,
            "case_filter": case_filter,
            "failed_cases": failed,
            "undeclared_cases": undeclared,  # of failed_cases: a path the contract does not declare, not wrong numbers
            "identity_keys": list(IDENTITY_KEYS),
            "sequential": plan.to_settings(threshold),
            "extra_captures": {r.id: len(r.extra["groups"]) - 1 for r in results if len(r.extra["groups"]) > 1},
        },
        cases=results,
    )


def _candidate_label(aa: bool, inject: float) -> str:
    if inject:
        return f"base + a GPU sleep of {inject:.1%} (injected slowdown, A/A run)"
    return "base (A/A run)" if aa else "candidate tree"


def check_plan(
    captures: int, repeats: int, block_size_repeats: int = BLOCK_SIZE_REPEATS, inject: float = 0.0, aa: bool = False
) -> None:
    """The bench's numeric options, checked before anything is loaded (usage errors, exit 2)."""
    if captures < MIN_CAPTURES or repeats < captures:
        raise UsageError(
            f"--captures {captures} --repeats {repeats}: a 95% interval over captures needs at least "
            f"{MIN_CAPTURES} captures, and each capture at least one round (defaults {DEFAULT_CAPTURES} and "
            f"{DEFAULT_REPEATS})"
        )
    if block_size_repeats < 0:
        raise UsageError(f"--block-size-repeats {block_size_repeats}: 0 (no sweep) or more")
    if not (0 <= inject <= 0.5):
        raise UsageError(f"--inject-slowdown {inject}: a fraction between 0 and 0.5, e.g. 0.035 for +3.5%")
    if inject and not aa:
        raise UsageError("--inject-slowdown is an A/A run with a slowed candidate: pass --aa too")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.kernel.bench", description=__doc__.split("\n\n")[0]
    )
    add_bench_arguments(
        parser, results_file=outputs.KERNEL_RESULTS, suites=SUITES, captures=DEFAULT_CAPTURES, repeats=DEFAULT_REPEATS
    )
    parser.add_argument(
        "--inject-slowdown",
        type=float,
        default=0.0,
        metavar="F",
        help="with --aa: slow the candidate by F (0.035: +3.5%%), a calibrated GPU sleep",
    )
    parser.add_argument(
        "--block-size-repeats",
        type=int,
        default=BLOCK_SIZE_REPEATS,
        help="timings per forced block size (regret columns); 0: no sweep (%(default)s)",
    )
    args = parser.parse_args(argv)
    check_plan(args.captures, args.repeats, args.block_size_repeats, args.inject_slowdown, args.aa)
    plan = plan_for(args.captures, args.sequential == "on", args.max_extra)
    out = outputs.results_file(args.out, outputs.KERNEL_RESULTS)
    cases = suite_cases(args.suite, args.cases)
    trees = load_trees(args.manifest)
    gpu.require_idle_gpus(1, allow_busy=args.allow_busy)
    results = run_suite(
        trees,
        cases,
        args.repeats,
        args.suite,
        aa=args.aa,
        case_filter=args.cases,
        captures=args.captures,
        block_size_repeats=args.block_size_repeats,
        inject=args.inject_slowdown,
        plan=plan,
        threshold=args.threshold,
    )
    return outputs.save_and_check(results, out, "bench")


if __name__ == "__main__":
    sys.exit(run_main(main))
