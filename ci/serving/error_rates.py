"""The TPOT gate's error rates, measured on this machine: false alarms and detection.

A/A runs (the base build served twice, ``ci.serving.tpot --aa``) show how often the gate fails, or cannot
clear, a change that does nothing; A/A runs whose candidate server sleeps on the GPU in every
``fused_marlin_moe`` call (``--inject-sleep-us``) show how often it catches a real slowdown. The sleep is
sized from a pilot, the first A/A run: for a slowdown F of the step, F x (its base median TPOT) over the
model's MoE layers (one ``fused_marlin_moe`` call each a step); each run records the sleep and the ratio it
caused. ``--sleep-overhead O`` sizes each sleep for F - O instead, where the sleep's own cost (its kernel
launch in every MoE layer) is known to add O of the step beyond what it asks. Every run is a full TPOT run
judged by ``ci.core.compare`` as the gate judges a change; this stage measures and decides nothing (exit 0
once every run is in).

Usage: ``python -m ci.serving.error_rates --manifest M --out DIR [--aa-runs 3] [--inject 0.02,0.035,0.05]
[--inject-runs 1] [--sleep-overhead 0.004] [--profile pr] [--model qwen3-30b-a3b-like] [--dp N]
[--start parallel|serial] [--pairs-at-once K]``

Writes, as each run ends (a stopped job keeps what it measured): ``DIR/<run>/tpot-results.json`` (the
run) and ``DIR/error-rates.json`` / ``DIR/error-rates.md`` (the table so far). A ``DIR`` that holds an
earlier table of the same settings on the same GPU (e.g. a committed one, from another session's machine)
gets the new runs added, numbered on from its own, with its pilot's figure (``--aa-runs 0`` is then
allowed): a session's 30 minutes of GPU time buy three ``pr`` runs, and the shares grow over sessions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ci.core import rates, stats
from ci.core.cli import run_main
from ci.core.errors import UsageError
from ci.host import procs
from ci.serving import config as serving_config
from ci.serving import tpot
from ci.timing.captures import add_plan_arguments

KIND = "tpot-error-rates"
VERSION = 1


def moe_layers(model: Path) -> int:
    """The ``fused_marlin_moe`` calls of one decode step: the config's MoE layers (every layer, unless the
    config says how sparse they are)."""
    config = json.loads((model / "config.json").read_text())
    layers = config["num_hidden_layers"]
    step = config.get("decoder_sparse_step") or 1
    dense = set(config.get("mlp_only_layers") or [])
    return sum(1 for i in range(layers) if (i + 1) % step == 0 and i not in dense)


def sleep_us_for(fraction: float, base_tpot_ms: float, layers: int) -> float:
    """The sleep a ``fused_marlin_moe`` call needs so that a step of ``base_tpot_ms`` is ``fraction`` slower."""
    if not (fraction > 0 and base_tpot_ms > 0 and layers > 0):
        raise UsageError(
            f"an injected slowdown needs a fraction, a base TPOT and MoE layers > 0 (got {fraction}, "
            f"{base_tpot_ms} ms, {layers})"
        )
    return round(fraction * base_tpot_ms * 1000 / layers, 3)


def measured(runs: Sequence[dict], key: str) -> str:
    """The ratios the runs of one level measured (lowest to highest): what a level asked for and what its sleep
    caused can differ (on the H200 about 0.3% of the step more, docs/tpot.md)."""
    ratios = sorted(
        r["median_ratio"] for r in runs if r["median_ratio"] is not None and rates.level_key(r["inject"]) == key
    )
    if not ratios:
        return "-"
    return f"{ratios[0]:.4f}" if len(ratios) == 1 else f"{ratios[0]:.4f} to {ratios[-1]:.4f}"


def markdown(payload: dict) -> str:
    s = payload["settings"]
    lines = [
        f"### TPOT gate error rates on {payload['gpu']} (`{s['model']}`, profile `{s['profile']}`, DP = {s['dp']}, "
        f"{s['launches']} launch pairs x {s['rounds']} rounds, threshold {s['threshold']:.0%})",
        "",
        "Each run is one TPOT A/A judged as the gate judges a change (`ci.core.compare`, A/B over launch pairs).",
        "",
    ]
    if s.get("sleep_overhead"):
        overhead = f"{s['sleep_overhead']:.1%}"
        lines += [
            f"Each injected sleep is sized for its level minus {overhead} of the step, the sleep's own cost",
            "beyond what it asks; the last column shows what each level measured.",
            "",
        ]
    lines += [
        "| level | runs | PASS | INCONCLUSIVE | FAIL | target | ratios measured |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for key, level in sorted(payload["pooled"].items(), key=lambda kv: -1.0 if kv[0] == "aa" else float(kv[0])):
        label = "A/A (no change)" if key == "aa" else f"+{float(key):.1%} injected"
        share = level["share"]
        target = rates.TARGETS.get("aa" if key == "aa" else float(key), "")
        cells = " | ".join(rates.pct(share.get(v)) for v in ("PASS", "INCONCLUSIVE", "FAIL"))
        lines.append(f"| {label} | {level['runs']} | {cells} | {target} | {measured(payload['runs'], key)} |")
    lines += [
        "",
        "| run | started (UTC), run tag | sleep us a call | verdict | ratio | wall s |",
        "|---|---|---:|---|---:|---:|",
    ]
    for r in payload["runs"]:
        ratio = "-" if r["median_ratio"] is None else f"{r['median_ratio']:.4f}"
        session = r.get("session") or {}
        when = f"{session.get('started_utc', '-')}, {session.get('run_id', '-')}"
        cells = [r["run"], when, r.get("sleep_us", 0), r["overall"], ratio, r["wall_time_s"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.serving.error_rates", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--manifest", type=Path, required=True, help="manifest.json of the trees (ci.trees.build)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs and the table")
    parser.add_argument("--model", default="qwen3-30b-a3b-like", help=f"one of {serving_config.models()}")
    parser.add_argument("--profile", choices=sorted(serving_config.PROFILES), default="pr")
    parser.add_argument("--dp", type=int, help="data-parallel size = EP size (default: every visible GPU)")
    parser.add_argument("--start", choices=sorted(tpot.STARTS), help="as ci.serving.tpot's (default: the profile's)")
    parser.add_argument(
        "--pairs-at-once",
        type=int,
        help="with --start parallel: pairs whose servers start together (default: the profile's)",
    )
    parser.add_argument("--aa-runs", type=int, default=3, help="A/A runs, the first also the pilot (%(default)s)")
    parser.add_argument(
        "--inject",
        type=rates.parse_levels,
        default=rates.DEFAULT_INJECT,
        help="slowdowns of the step, e.g. 0.02,0.035,0.05",
    )
    parser.add_argument("--inject-runs", type=int, default=1, help="runs per injected slowdown (%(default)s)")
    parser.add_argument(
        "--sleep-overhead",
        type=float,
        default=0.0,
        help="size each sleep for the level minus this fraction of the step, which the sleep adds "
        "beyond what it asks (e.g. 0.004 on the H200, docs/tpot.md; default %(default)s)",
    )
    parser.add_argument("--health-timeout", type=float, default=600.0, help="seconds to wait for /health")
    parser.add_argument("--allow-busy", action="store_true", help="measure even if another process uses the GPU")
    add_plan_arguments(parser, max_extra=None)
    args = parser.parse_args(argv)
    if args.aa_runs < 0 or args.inject_runs < 0:
        raise UsageError(f"--aa-runs {args.aa_runs} --inject-runs {args.inject_runs}: 0 or more runs of each")
    if not 0 <= args.sleep_overhead < min(args.inject, default=1.0):
        raise UsageError(
            f"--sleep-overhead {args.sleep_overhead}: a fraction of the step from 0 up to less than the "
            f"smallest --inject level ({min(args.inject, default=1.0)}): the sleep is sized for the "
            "level minus it"
        )
    start, pairs = serving_config.resolve_start(
        serving_config.PROFILES[args.profile], args.start, args.pairs_at_once, "concurrent"
    )
    rates.check_out(args.out)
    from ci.trees.manifest import load_trees

    trees = load_trees(args.manifest)
    gpus = tpot.serving_gpus(args.dp, args.allow_busy)
    dp = len(gpus)
    profile = serving_config.PROFILES[args.profile]
    overrides = {"pairs_at_once": tpot.fitted_pairs(gpus, args.model, profile, start, pairs, args.pairs_at_once)}
    profile = replace(profile, **overrides)
    looks = tpot.tpot_plan(args.profile, profile, args.sequential == "on", args.max_extra)
    layers = moe_layers(serving_config.model_dir(args.model))
    payload = {
        "kind": KIND,
        "schema_version": VERSION,
        "gpu": f"{gpus[0].name} x{dp}",
        "settings": {
            "model": args.model,
            "profile": args.profile,
            "dp": dp,
            "start": start,
            "pairs_at_once": profile.pairs_at_once,
            "launches": profile.launches,
            "rounds": profile.rounds,
            "moe_layers": layers,
            "sleep_overhead": args.sleep_overhead,
            "threshold": args.threshold,
            "confidence": stats.DEFAULT_CONFIDENCE,
            "sequential": None if looks is None else looks.to_settings(args.threshold),
        },
        "targets": {str(k): v for k, v in rates.TARGETS.items()},
        "runs": [],
    }
    payload = rates.continued(args.out, payload, keep=("pilot_base_tpot_ms",))  # an earlier session's table
    pilot_ms = payload["settings"].get("pilot_base_tpot_ms")
    if pilot_ms is None and args.aa_runs < 1:
        raise UsageError(
            f"--aa-runs 0: {args.out} has no pilot yet (the first A/A run, whose base TPOT sizes the "
            "injected sleep); run at least one A/A"
        )
    plan = [(0.0, rates.next_index(payload, 0.0) + i) for i in range(args.aa_runs)]
    plan += [(f, rates.next_index(payload, f) + i) for f in args.inject for i in range(args.inject_runs)]
    args.out.mkdir(parents=True, exist_ok=True)
    for inject, index in plan:
        name = rates.run_name(inject, index) + (f"-{index}" if inject else "")  # several runs per level
        sleep_us = sleep_us_for(inject - args.sleep_overhead, pilot_ms, layers) if inject else 0.0
        started = time.time()
        print(f"tpot error_rates: run {name} (sleep {sleep_us} us a fused_marlin_moe call)", flush=True)
        out = args.out / name
        results = tpot.run_tpot(
            trees,
            args.model,
            args.profile,
            dp,
            out,
            "concurrent",
            args.health_timeout,
            save_to=out / "tpot-results.json",
            aa=True,
            start=start,
            inject_sleep_us=sleep_us,
            overrides=overrides,
            plan=looks,
            threshold=args.threshold,
        )
        results.save(out / "tpot-results.json")
        if pilot_ms is None:
            pilot_ms = stats.median(results.cases[0].samples["base"])
            payload["settings"]["pilot_base_tpot_ms"] = pilot_ms
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(started))
        rates.record_run(
            args.out,
            payload,
            name,
            inject,
            results,
            time.time() - started,
            markdown,
            sleep_us=sleep_us,
            session={"run_id": procs.run_id(), "started_utc": when},
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
