"""End-to-end TPOT. ``vllm serve`` from each tree, ``vllm bench serve`` against it, A/B.

What is served and sent (models, profiles, command lines) is ``ci.serving.config``; the launch pairs are
``ci.serving.launches``, a round's client ``ci.serving.client``; this module writes the results and is
the stage's CLI.

The unit of evidence is a launch pair: both servers started (which one first alternates per pair),
warmed up, settled (short runs until each server's TPOT is stable, ``ci.serving.config.Profile``),
then the pair's rounds, alternating builds (a, b, b, a), then both stopped. Each round is one
``vllm bench serve`` run and contributes its median TPOT; the launch pair of each round is its
capture (``extra.captures``), so ``ci.core.compare`` takes the interval over launch pairs with the
same per-capture statistics as the kernel bench. The server's own mean inter-token latency
(``/metrics``) is recorded beside each round. By default one client process
(``ci/serving/bench_client.py``: vLLM's own ``vllm.benchmarks.serve``, imported once, from the base
tree) runs every round, so a round costs its measurement and not a vLLM import; the same
instrument measures both builds. ``--bench-client cli`` runs the ``vllm bench serve`` command
from the measured build's tree instead, one process per round. A pair's servers stay up side by side
(``--server-mode concurrent``, each given a share of GPU memory, started one after the
other) or run one after the other, each alone on the GPU (``sequential``).

A run is sequential (``ci.core.sequential``, ``tpot_plan``): while the verdict is INCONCLUSIVE after the profile's
launch pairs, it adds a group of pairs and judges again, up to the profile's cap (``SEQUENTIAL_MAX_EXTRA``), the
error spent over the looks; ``--sequential off`` or ``--max-extra 0`` runs the profile's pairs alone.

Usage: ``python -m ci.serving.tpot --manifest M [--model qwen3-30b-a3b-like] [--profile pr] [--dp N]
[--sequential on|off] [--max-extra N] [--threshold 0.03] --out DIR``;
``python -m ci.serving.tpot --block-sizes --profile pr-ep --dp 2`` prints the block size each build picks in decode.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from ci.core import sequential, stats
from ci.core.cli import run_main
from ci.core.errors import DataError, GPUBusyError, NoGPUError, UsageError
from ci.core.jsonio import sha256_file
from ci.core.results import BenchResults, CaseResult
from ci.host import gpu, outputs, procs
from ci.serving.client import CLIENTS, BenchClient, RoundResult, parse_bench_result
from ci.serving.config import (
    BUILDS,
    PROFILES,
    SEQUENTIAL_MAX_EXTRA,
    Profile,
    block_size_table,
    case_id,
    decode_block_sizes,
    fit_pairs_at_once,
    kv_cache_bytes,
    memory_fraction,
    model_dir,
    models,
    moe_backend_flag,
    resolve_start,
    sequential_group,
    served_name,
    server_bytes,
    suite_name,
)
from ci.serving.launches import STARTS, Runner, run_launches, run_order
from ci.timing.captures import add_plan_arguments
from ci.trees import provenance
from ci.trees.manifest import Trees, load_trees

# what makes two TPOT runs comparable (ci.core.evidence checks them against a baseline)
IDENTITY_KEYS = ("model", "model_config_sha256", "dp", "expert_parallel", "profile", "server_mode", "start")
# profile fields a run may override (flag: field, type, least value); the results record the profile as run
PROFILE_OVERRIDES = {
    "--launches": ("launches", int, 1),
    "--rounds-per-launch": ("rounds", int, 1),
    "--settle-max-s": ("settle_max_s", float, 0.0),
}


def built_decode_picks(trees: Trees, model: str, profile: Profile, dp: int, aa: bool = False) -> list[dict]:
    """The ``block_size_m`` each build's own ``fused_marlin_moe`` picks in a decode step of the profile (its
    decode batch per rank), called as a server calls it: ``global_num_experts == E`` without EP (the modular
    kernel's -1 -> E), G and an expert map with it (``ci.moe.picks``: the build's code, on the CPU)."""
    from ci.moe.picks import picked_block_size
    from ci.trees.variants import load_variants, put_base_first

    put_base_first(trees)
    base, cand = load_variants(trees)
    modules = {"base": base.marlin_moe, "candidate": base.marlin_moe if aa else cand.marlin_moe}
    rows = []
    for row in decode_block_sizes(model_dir(model), profile, dp):
        if not row["profile"]:
            continue
        call = dict(
            m=row["padded_m"],
            topk=row["topk"],
            local_experts=row["local_experts"],
            global_num_experts=row["global_experts"],
            with_expert_map=dp > 1,
        )
        picks = {build: picked_block_size(module, **call) for build, module in modules.items()}
        rows.append(
            {
                **row,
                **picks,
                "global_num_experts_arg": call["global_num_experts"],
                "picked_by": "each build's fused_marlin_moe (ci.moe.picks)",
            }
        )
    return rows


def results_from_rounds(
    trees: Trees,
    model: str,
    profile_name: str,
    dp: int,
    mode: str,
    rounds: list[RoundResult],
    timeline: dict,
    client: str = "inprocess",
    aa: bool = False,
    profile: Profile | None = None,
    start: str = "serial",
    inject_sleep_us: float = 0.0,
    picks: list[dict] | None = None,
    plan: sequential.Plan | None = None,
    threshold: float = stats.DEFAULT_THRESHOLD,
) -> BenchResults:
    """The results file of a TPOT A/B: one case, the median TPOT of each round as its samples, and the
    launch pair of each sample as its capture (``extra.captures``): the core's interval is over the pairs. A
    sequential run (``plan``) records its plan, and the launch pairs it planned by the last look it reached."""
    profile = profile or PROFILES[profile_name]
    planned = pairs_planned(profile, rounds, timeline)
    complete = len(rounds) == 2 * profile.rounds * planned
    case = CaseResult(
        id=case_id(model, profile_name, dp),
        unit="ms median TPOT",
        samples={b: [r.median_tpot_ms for r in rounds if r.build == b] for b in BUILDS},
        info={
            "model": model,
            "model_config_sha256": sha256_file(model_dir(model) / "config.json"),
            "dp": dp,
            "expert_parallel": dp > 1,
            "profile": asdict(profile),
            "moe_backend_flag": moe_backend_flag(trees.base) or "none (auto)",
            "server_mode": mode,
            "bench_client": CLIENTS[client],
            "start": start,
            "kv_cache_bytes": kv_cache_bytes(model_dir(model), profile, dp)
            if start == "parallel"
            else "from free memory",
            "gpu_memory_utilization": memory_fraction(profile, start == "parallel"),
            "decode_block_size_m": picks if picks is not None else "not recorded",
        },
        extra={
            "captures": {b: [r.launch for r in rounds if r.build == b] for b in BUILDS},
            "rounds": [asdict(r) for r in rounds],
            "timeline": timeline,
        },
    )
    return BenchResults(
        kind="tpot-bench",
        suite=suite_name(model, profile_name, dp),
        provenance=provenance.collect(trees),
        settings={
            "launches": profile.launches,
            "rounds_per_launch": profile.rounds,
            "rounds_per_build": profile.rounds_per_build,
            "launches_run": planned,
            "order": [f"{launch}:{build}" for launch, build in run_order(replace(profile, launches=planned), mode)],
            "server_mode": mode,
            "complete": complete,
            "rounds_done": len(rounds),
            "aa": aa,
            "candidate": ("base (A/A run)" if aa else "candidate tree")
            + (f" with a GPU sleep of {inject_sleep_us} us in each fused_marlin_moe call" if inject_sleep_us else ""),
            "inject_sleep_us": inject_sleep_us,
            "expected_cases": [case_id(model, profile_name, dp)],
            "identity_keys": list(IDENTITY_KEYS),
            **({"sequential": plan.to_settings(threshold)} if plan is not None else {}),
        },
        cases=[case],
    )


def pairs_planned(profile: Profile, rounds: list[RoundResult], timeline: dict) -> int:
    """The launch pairs the run had planned when it ended: the profile's, and the groups a sequential run added
    (the timeline's ``groups``; a run rebuilt from its rounds: the pairs its rounds reached)."""
    groups = timeline.get("groups") or []
    if groups:
        return groups[-1]["pairs"][1]
    return max([profile.launches] + [r.launch + 1 for r in rounds])


def tpot_plan(profile_name: str, profile: Profile, on: bool, max_extra: int | None) -> sequential.Plan | None:
    """A TPOT run's plan of looks (``ci.core.sequential``): the profile's launch pairs, then while INCONCLUSIVE
    up to ``max_extra`` (default: ``SEQUENTIAL_MAX_EXTRA`` of the profile) groups of ``sequential_group`` pairs;
    None (one look, as before) when off or capped at 0. Refused where a look could never decide."""
    extra = SEQUENTIAL_MAX_EXTRA.get(profile_name, 0) if max_extra is None else max_extra
    if extra < 0:
        raise UsageError(f"--max-extra {extra}: 0 (no extra look) or more groups of launch pairs")
    if not on or extra == 0:
        return None
    plan = sequential.Plan(first=profile.launches, group=sequential_group(profile), max_extra=extra)
    why = plan.undecidable()
    if why:
        raise UsageError(
            f"--launches {profile.launches} with the sequential plan: {why} (launch pairs); pass more "
            "--launches, or --sequential off"
        )
    return plan


def _more_pairs(plan: sequential.Plan, threshold: float):
    """``run_launches``' ``more``: the pairs to add after a look (``sequential.more_captures`` over each launch
    pair's median TPOT of each build)."""

    def more(rounds: list[RoundResult]) -> int:
        medians = {
            b: stats.capture_medians(
                [r.median_tpot_ms for r in rounds if r.build == b], [r.launch for r in rounds if r.build == b]
            )
            for b in BUILDS
        }
        return sequential.more_captures(medians, plan, threshold)

    return more


def run_tpot(
    trees: Trees,
    model: str,
    profile_name: str,
    dp: int,
    out_dir: Path,
    mode: str,
    timeout: float,
    save_to: Path | None = None,
    client: str = "inprocess",
    aa: bool = False,
    overrides: dict | None = None,
    start: str = "serial",
    inject_sleep_us: float = 0.0,
    plan: sequential.Plan | None = None,
    threshold: float = stats.DEFAULT_THRESHOLD,
) -> BenchResults:
    """One TPOT A/B (or A/A); ``overrides`` replaces fields of the profile (``--launches``, ...), and the
    results record the profile as run; ``start``: how a pair's servers start (``STARTS``); ``plan``: a
    sequential run (``tpot_plan``), which adds launch pairs while the verdict at ``threshold`` is open."""
    profile = replace(PROFILES[profile_name], **(overrides or {}))
    if start != "parallel":  # one pair at a time, whatever the profile says (and recorded so)
        profile = replace(profile, pairs_at_once=1)
    bench_client = BenchClient(trees.base, out_dir / "bench-client.log") if client == "inprocess" else None
    if inject_sleep_us and not aa:
        raise UsageError("--inject-sleep-us slows the candidate of an A/A run (the error rates): pass --aa too")
    runner = Runner(
        trees,
        model_dir(model),
        profile,
        dp,
        out_dir,
        timeout,
        client=bench_client,
        aa=aa,
        start=start,
        inject_sleep_us=inject_sleep_us,
    )
    picks = built_decode_picks(trees, model, profile, dp, aa)

    def results(rounds, timeline):
        return results_from_rounds(
            trees,
            model,
            profile_name,
            dp,
            mode,
            rounds,
            timeline,
            client,
            aa,
            profile,
            start,
            inject_sleep_us,
            picks,
            plan,
            threshold,
        )

    def save(rounds, timeline):
        if save_to is not None:
            results(rounds, timeline).save(save_to)

    more = _more_pairs(plan, threshold) if plan is not None else None
    return results(*run_launches(runner, mode, on_round=save, more=more))


ROUND_FILE = "bench-r[0-9][0-9][0-9]-l*-*.json"  # bench-r<NNN>-l<launch>-<build>.json


def rounds_from_dir(directory: Path) -> list[RoundResult]:
    """The rounds of a (possibly interrupted) run, from its ``bench-r<NNN>-l<launch>-<build>.json`` files."""
    files = sorted(directory.glob(ROUND_FILE))
    if not files:
        raise DataError(f"{directory}: no {ROUND_FILE} round files")
    found = []
    for f in files:
        _, launch, build = f.stem.removeprefix("bench-").split("-", 2)
        found.append(replace(parse_bench_result(f, build), launch=int(launch.removeprefix("l"))))
    return found


def serving_gpus(dp: int | None, allow_busy: bool) -> list:
    """The GPUs of a serving run, one a DP rank (default: every visible GPU), once they are there and idle."""
    gpus = gpu.require_gpus()
    dp = dp or len(gpus)
    if dp > len(gpus):
        raise NoGPUError(f"--dp {dp} needs {dp} GPUs; {len(gpus)} visible")
    busy = gpu.busy_gpus(gpus[:dp])
    if busy and not allow_busy:
        raise GPUBusyError(f"the GPU is busy: {busy[0]}; wait for it, or pass --allow-busy (TPOT will be noisy)")
    return gpus[:dp]


def fitted_pairs(gpus: Sequence, model: str, profile: Profile, start: str, pairs: int, asked: int | None) -> int:
    """The launch pairs a parallel start starts together on these GPUs (``fit_pairs_at_once``: fewer than the
    profile's where its servers would not fit, said on one line; an error where ``--pairs-at-once`` asked for
    more than fit, or one pair does not); a serial start's one pair unchanged."""
    if start != "parallel":
        return pairs
    gpu_bytes = min(g.memory_total_mib for g in gpus) << 20
    server = server_bytes(model_dir(model), profile, len(gpus))
    fit, why = fit_pairs_at_once(pairs, asked is not None, gpu_bytes, server)
    if why:
        print(f"tpot: {why}", flush=True)
    return fit


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.serving.tpot", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--manifest", type=Path, help="the trees' manifest.json (from ci.trees.build)")
    parser.add_argument("--model", default="qwen3-30b-a3b-like", help=f"one of {models()}")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="pr")
    parser.add_argument("--dp", type=int, help="data-parallel size = EP size (default: every visible GPU)")
    parser.add_argument("--server-mode", choices=("concurrent", "sequential"), default="concurrent")
    starts = "; ".join(f"{k}: {v}" for k, v in STARTS.items())
    parser.add_argument(
        "--start",
        choices=sorted(STARTS),
        help=f"{starts} (default: parallel where the profile starts several pairs at once, else serial)",
    )
    parser.add_argument(
        "--bench-client",
        choices=sorted(CLIENTS),
        default="inprocess",
        help="; ".join(f"{k}: {v}" for k, v in CLIENTS.items()),
    )
    parser.add_argument("--health-timeout", type=float, default=600.0, help="seconds to wait for /health")
    parser.add_argument("--aa", action="store_true", help="A/A run: both servers run the base tree (the noise floor)")
    parser.add_argument(
        "--inject-sleep-us",
        type=float,
        default=0.0,
        metavar="US",
        help="with --aa: a GPU sleep of US microseconds in each fused_marlin_moe call of the candidate "
        "server, captured into its CUDA graphs (the error rates)",
    )
    for flag, (field, kind, _) in PROFILE_OVERRIDES.items():
        parser.add_argument(flag, dest=field, type=kind, help=f"the profile's {field}, overridden (recorded)")
    parser.add_argument(
        "--pairs-at-once",
        type=int,
        help="with --start parallel: launch pairs whose servers start together (default: the profile's; recorded)",
    )
    parser.add_argument("--out", type=Path, help=f"folder for {outputs.TPOT_RESULTS} and the run's logs")
    parser.add_argument("--allow-busy", action="store_true", help="measure even if another process uses the GPU")
    parser.add_argument(
        "--block-sizes",
        action="store_true",
        help="print the block_size_m each build picks in "
        "decode for --model, --profile and --dp (default 1), and exit (no GPU needed)",
    )
    parser.add_argument("--from-rounds", type=Path, help="rebuild the results of an interrupted run from its folder")
    add_plan_arguments(parser, max_extra=None)
    parser.add_argument("--dp-of-rounds", type=int, default=1, help="with --from-rounds: the DP size that run used")
    args = parser.parse_args(argv)
    overrides = {f: v for f, _, _ in PROFILE_OVERRIDES.values() if (v := getattr(args, f)) is not None}
    bad = [f"{flag} {v}" for flag, (f, _, low) in PROFILE_OVERRIDES.items() if (v := overrides.get(f, low)) < low]
    if bad:
        raise UsageError(f"{', '.join(bad)}: launches and rounds need at least 1, the settling cap at least 0 s")
    if args.inject_sleep_us < 0 or (args.inject_sleep_us and not args.aa):
        raise UsageError(
            f"--inject-sleep-us {args.inject_sleep_us}: a positive sleep, with --aa (the candidate of an "
            "A/A run is slowed; the error rates)"
        )
    args.start, overrides["pairs_at_once"] = resolve_start(
        PROFILES[args.profile], args.start, args.pairs_at_once, args.server_mode
    )
    plan = tpot_plan(
        args.profile, replace(PROFILES[args.profile], **overrides), args.sequential == "on", args.max_extra
    )
    if args.block_sizes:
        dp = args.dp or 1
        print(
            f"{args.model}, profile {args.profile}, DP = EP = {dp}: block_size_m per decode step as the spec says "
            "(ci.moe.spec; a run records what each build picked)"
        )
        print(block_size_table(decode_block_sizes(model_dir(args.model), PROFILES[args.profile], dp)))
        return 0
    missing = [flag for flag, value in (("--manifest", args.manifest), ("--out", args.out)) if value is None]
    if missing:
        raise UsageError(f"python -m ci.serving.tpot needs {' and '.join(missing)} (or --block-sizes)")
    out = outputs.results_file(args.out, outputs.TPOT_RESULTS)
    trees = load_trees(args.manifest)
    if args.from_rounds:
        rounds = rounds_from_dir(args.from_rounds)
        profile = replace(PROFILES[args.profile], **overrides)
        picks = built_decode_picks(trees, args.model, profile, args.dp_of_rounds, args.aa)
        results = results_from_rounds(
            trees,
            args.model,
            args.profile,
            args.dp_of_rounds,
            args.server_mode,
            rounds,
            {},
            args.bench_client,
            args.aa,
            profile,
            args.start,
            picks=picks,
            plan=plan,
            threshold=args.threshold,
        )
        results.save(out)
        print(f"tpot: {len(rounds)} rounds from {args.from_rounds} written to {out}")
        return 0
    gpus = serving_gpus(args.dp, args.allow_busy)
    dp = len(gpus)
    fit = fitted_pairs(
        gpus, args.model, PROFILES[args.profile], args.start, overrides["pairs_at_once"], args.pairs_at_once
    )
    if fit != overrides["pairs_at_once"]:  # fewer pairs start together: the plan's groups follow
        overrides["pairs_at_once"] = fit
        plan = tpot_plan(
            args.profile, replace(PROFILES[args.profile], **overrides), args.sequential == "on", args.max_extra
        )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: servers stop
    print(f"tpot: run tag {procs.RUN_ID_ENV}={procs.run_id()} (servers answer as {served_name('<build>')})", flush=True)
    launches = overrides.get("launches", PROFILES[args.profile].launches)
    budget = plan.describe() if plan is not None else f"one look after {launches} captures (sequential off)"
    print(f"tpot: the captures are launch pairs; {budget}", flush=True)
    results = run_tpot(
        trees,
        args.model,
        args.profile,
        dp,
        args.out,
        args.server_mode,
        args.health_timeout,
        save_to=out,
        client=args.bench_client,
        aa=args.aa,
        overrides=overrides,
        start=args.start,
        inject_sleep_us=args.inject_sleep_us,
        plan=plan,
        threshold=args.threshold,
    )
    results.save(out)
    print(f"tpot: results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
