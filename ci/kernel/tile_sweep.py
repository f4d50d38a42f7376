"""The tile sweep: the time of every Marlin MoE tile (``block_size_m``) the kernel has, for each case of a grid,
with each build's own pick beside it (the base's, and the candidate's: #48144 unless ``--change`` says otherwise).

A case is a :class:`ci.kernel.suites.BenchCase` (model shape x EP size x tokens per rank x format, on the fused
path or the batched one at a capacity); the grids are :data:`GRIDS`. Every tile is timed with the bench's own
method (``ci.kernel.graphs``: a CUDA graph of calls over rotating inputs, CUDA events), in ``captures`` fresh
captures (fresh inputs behind a random pad, the tiles captured in a random order), ``rounds`` timings of each
tile per capture in alternating order; so every tile's ratio to the case's best tile has an interval over
captures (``ci.core.stats.capture_effect``), as the gate's verdicts do. The tile of a case is forced on the base
build (``ci.kernel.moe_case.forced_block_size``); the builds' picks come from running their own code.

The dataset (``tile-sweep.json``, :data:`KIND`, :data:`SCHEMA_VERSION`) is written after every case (atomic
writes), so a sweep stopped by ``--budget-s`` or by the machine resumes where it stopped with the same command;
a file of another grid, other settings or another vLLM, or one begun on another GPU model, is refused, never
overwritten. The analysis (regret of each rule, the fitted rule) is ``ci.kernel.tile_oracle``.

Usage: ``python -m ci.kernel.tile_sweep --manifest M [--grid full|quick] [--captures 6] [--rounds 1]
[--budget-s S] --out DIR``
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import json
import random
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ci.core.cli import run_main
from ci.core.errors import DataError, IncompleteEvidenceError, UsageError
from ci.core.jsonio import check_header, read_json, write_json
from ci.kernel.suites import MODEL_SHAPES, BenchCase, runnable_block_sizes
from ci.moe.routing import rank_view

KIND = "marlin-tile-sweep"
SCHEMA_VERSION = 1
SWEEP_FILE = "tile-sweep.json"
DEFAULT_CAPTURES = 6  # the fewest a 95% signed-rank interval over captures takes (ci.kernel.bench.MIN_CAPTURES)
DEFAULT_ROUNDS = 1  # timings of each tile per capture (the interval is over captures; more rounds add
# replicates within a capture, not captures)
INT4 = "gptq-int4-g128"  # the bench's id of GPTQ int4 (BenchCase's default format)

# The shapes the rule is fitted on, and the shapes it is validated on (never seen by the fit).
FITTED_SHAPES = ("deepseek-v3", "qwen3-30b-a3b")
HELD_OUT_SHAPES = ("mixtral-8x7b", "gpt-oss-120b")
# Every format Marlin serves on Hopper (ci.kernel.formats: FP8 *inputs* run on SM89/SM12x only); gpt-oss's own
# MXFP4 (biases, clamped SwiGLU) stands for MXFP4 on its shape.
SWEEP_FORMATS = (INT4, "nvfp4", "fp8", "mxfp4", "gptq-int8", "w4a8-int8")  # in the order the sweep times them
DECODE_LOADS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # tokens per rank
EP_SIZES = (1, 2, 4, 8)
BATCHED_CAPACITIES = (4, 8, 16, 32, 64, 128, 256, 512, 1024)  # rows per expert of the batched (DeepEP LL) path
BATCHED_LOADS = (1, 8, 32)  # tokens per rank on the batched path (at most the rows a dispatcher may send)

GRIDS = {
    "full": {
        "shapes": FITTED_SHAPES + HELD_OUT_SHAPES,
        "formats": SWEEP_FORMATS,
        "ep": EP_SIZES,
        "tokens": DECODE_LOADS,
        "batched": {
            "shapes": FITTED_SHAPES,
            "formats": (INT4,),
            "capacities": BATCHED_CAPACITIES,
            "tokens": BATCHED_LOADS,
        },
    },
    "quick": {
        "shapes": ("qwen3-30b-a3b",),
        "formats": (INT4, "nvfp4"),
        "ep": (1, 8),
        "tokens": (1, 16, 128),
        "batched": {"shapes": ("qwen3-30b-a3b",), "formats": (INT4,), "capacities": (16, 1024), "tokens": (1, 8)},
    },
}


def _quant_on(shape: str, fmt: str) -> str:
    """gpt-oss is served as its own MXFP4 (biases, clamped SwiGLU): the sweep times that on its shape."""
    return "gpt-oss-mxfp4" if fmt == "mxfp4" and shape == "gpt-oss-120b" else fmt


def _batched_ep(capacity: int) -> tuple[int, int]:
    """(EP size, rows per dispatcher) of a batched capacity: 8 dispatchers where the capacity allows."""
    ep = 8 if capacity >= 8 else capacity
    return ep, capacity // ep


def grid_cases(grid: str, pattern: str | None = None) -> list[BenchCase]:
    """The cases of a grid, grouped so that one weight set (shape, EP size, format) is made once, in order of
    priority (see :func:`_priority`): a sweep stopped by its budget has every shape of the formats it reached."""
    if grid not in GRIDS:
        raise UsageError(f"--grid {grid!r}: unknown; choose one of {sorted(GRIDS)}")
    g, b = GRIDS[grid], GRIDS[grid]["batched"]
    cases = [
        BenchCase(s, *MODEL_SHAPES[s], ep=ep, tokens_per_rank=t, quant=_quant_on(s, f))
        for f in g["formats"]
        for ep in g["ep"]
        for s in g["shapes"]
        for t in g["tokens"]
    ]
    for s in b["shapes"]:
        for f in b["formats"]:
            for cap in b["capacities"]:
                ep, rows = _batched_ep(cap)
                cases += [
                    BenchCase(
                        s,
                        *MODEL_SHAPES[s],
                        ep=ep,
                        tokens_per_rank=t,
                        quant=_quant_on(s, f),
                        path="batched",
                        per_dispatcher=rows,
                    )
                    for t in b["tokens"]
                    if t <= rows
                ]
    cases.sort(key=lambda c: _priority(g, c))  # stable: the loads of one weight set stay together, in order
    if pattern:
        globs = [p for p in pattern.split(",") if p]
        cases = [c for c in cases if any(fnmatch.fnmatch(c.id, p) for p in globs)]
        if not cases:
            raise UsageError(f"--cases {pattern!r} matches no case of grid {grid!r}")
    return cases


EP_PRIORITY = (8, 1, 4, 2)  # the EP sizes in the order the sweep times them: the ends of the range first


def _priority(g: dict, case: BenchCase) -> tuple:
    """Formats in the grid's order; in each, the fused path (EP sizes 8, 1, 4, 2, every shape of one EP size
    together) before the batched path."""
    fmt = next(i for i, f in enumerate(g["formats"]) if _quant_on(case.shape_name, f) == case.quant)
    ep = EP_PRIORITY.index(case.ep) if case.ep in EP_PRIORITY else len(EP_PRIORITY)
    return (fmt, case.path == "batched", 0 if case.path == "batched" else ep)


def split_of(case: BenchCase) -> str:
    """'fitted' or 'held-out': whether the rule's fit may see the case."""
    return "fitted" if case.shape_name in FITTED_SHAPES else "held-out"


def case_info(case: BenchCase, local_experts: int) -> dict:
    """What the analysis keys on: the case's shape, format, EP layout and the load it puts on one expert."""
    rows = case.rows
    return {
        "shape": case.shape_name,
        "hidden": case.hidden,
        "intermediate": case.intermediate,
        "global_experts": case.experts,
        "local_experts": local_experts,
        "topk": case.topk,
        "ep": case.ep,
        "tokens_per_rank": case.tokens_per_rank,
        "rows": rows,
        "path": case.path,
        "format": case.quant,
        "input_itemsize": case.format.input_itemsize,
        "global_num_experts_arg": case.global_num_experts,
        "capacity": case.capacity if case.path == "batched" else None,
        "rows_per_expert": rows * case.topk / case.experts,  # the mean valid load of one expert
        "split": split_of(case),
    }


@dataclass(kw_only=True)
class SweepCase:
    """One case of the sweep: per tile, raw microseconds per call and each sample's capture."""

    id: str
    info: dict
    picks: dict[str, int]  # build -> the block_size_m its own code picks
    samples: dict[str, list[float]]  # str(tile) -> us/call
    captures: dict[str, list[int]]  # str(tile) -> the capture of each sample
    wall_s: float = 0.0

    def tiles(self) -> list[int]:
        return sorted(int(t) for t in self.samples)


@dataclass(kw_only=True)
class Sweep:
    grid: str
    provenance: dict
    settings: dict
    cases: list[SweepCase] = field(default_factory=list)
    kind: str = KIND
    schema_version: int = SCHEMA_VERSION

    def done(self) -> set[str]:
        return {c.id for c in self.cases}

    def save(self, path: Path) -> None:
        write_json(path, asdict(self))


def _check_case(where: str, raw: object) -> SweepCase:
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        raise DataError(f"{where}: each case must be an object with an id, found {str(raw)[:80]!r}")
    cid = raw["id"]
    samples, captures, picks = raw.get("samples"), raw.get("captures"), raw.get("picks")
    if not isinstance(samples, dict) or not samples or not isinstance(captures, dict) or set(captures) != set(samples):
        raise DataError(f"{where}: case {cid!r}: samples and captures must be objects keyed by the same tiles")
    for tile, xs in samples.items():
        caps = captures[tile]
        if not (tile.isdigit() and isinstance(xs, list) and xs and isinstance(caps, list) and len(caps) == len(xs)):
            raise DataError(f"{where}: case {cid!r}, tile {tile!r}: needs non-empty samples, one capture id each")
        if not all(isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in xs):
            raise DataError(f"{where}: case {cid!r}, tile {tile}: timings must be positive numbers")
    if not isinstance(picks, dict) or not all(isinstance(v, int) for v in picks.values()):
        raise DataError(f"{where}: case {cid!r}: picks must map each build to its block_size_m")
    info = raw.get("info")
    if not isinstance(info, dict):
        raise DataError(f"{where}: case {cid!r}: info must be an object")
    return SweepCase(
        id=cid, info=info, picks=picks, samples=samples, captures=captures, wall_s=float(raw.get("wall_s", 0.0))
    )


def load_sweep(path: Path | str) -> Sweep:
    """Read and check a sweep dataset, plain or gzipped (``.gz``: the committed form); a :class:`DataError`
    (exit 7) names what is wrong."""
    path = Path(path)
    if path.suffix == ".gz":
        try:
            raw = json.loads(gzip.decompress(path.read_bytes()))
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: not a gzipped JSON sweep ({exc}); re-download or re-run the sweep") from None
        payload = check_header(raw, path, kind=KIND, versions=(SCHEMA_VERSION,))
    else:
        payload = read_json(path, kind=KIND, versions=(SCHEMA_VERSION,))
    for key, typ in (("grid", str), ("provenance", dict), ("settings", dict), ("cases", list)):
        if not isinstance(payload.get(key), typ):
            raise DataError(f"{path}: {key!r} missing or not a {typ.__name__}; re-run the sweep into a new --out")
    cases = [_check_case(str(path), raw) for raw in payload["cases"]]
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise DataError(f"{path}: duplicate case ids; re-run the sweep into a new --out")
    return Sweep(grid=payload["grid"], provenance=payload["provenance"], settings=payload["settings"], cases=cases)


MAX_FAILED_IN_A_ROW = 3
RESUME_KEYS = ("captures", "rounds", "calls_per_graph", "vllm", "patch_sha256", "case_filter")


def resumable(path: Path, grid: str, settings: dict) -> Sweep | None:
    """The sweep already in ``path`` when it is this sweep's (same grid and settings), else None when there is
    none; a file that is not a sweep, or a sweep of something else, is a usage error (nothing is changed)."""
    if not path.exists():
        return None
    try:
        sweep = load_sweep(path)
    except DataError as exc:
        raise UsageError(
            f"--out {path.parent}: {SWEEP_FILE} there is not a sweep this stage can resume ({exc}); "
            "pick another --out folder (nothing was changed)"
        ) from None
    differs = [k for k in RESUME_KEYS if sweep.settings.get(k) != settings.get(k)]
    if sweep.grid != grid or differs:
        what = (
            f"grid {sweep.grid!r}"
            if sweep.grid != grid
            else ", ".join(f"{k} {sweep.settings.get(k)!r} (now {settings.get(k)!r})" for k in differs)
        )
        raise UsageError(
            f"--out {path.parent}: {SWEEP_FILE} there is another sweep ({what}); resume it with its "
            "own options, or pick another --out folder (nothing was changed)"
        )
    return sweep


def timing_gpu(gpu: dict | None) -> str | None:
    """The model of the GPU a sweep times on, from a provenance's ``gpu`` record (``ci.trees.provenance.collect``):
    the first visible one (``cuda:0``; the record lists the visible GPUs in order), None where there is none."""
    gpus = (gpu or {}).get("gpus") or []
    return str(gpus[0].get("name", "?")) if gpus else None


def check_same_gpu(path: Path, sweep: Sweep, gpu_now: dict) -> None:
    """Refuse to resume ``sweep`` on a GPU model other than the one it started on (:func:`timing_gpu`): a regret
    mixed from two models would be neither's (nothing is changed)."""
    started, now = timing_gpu(sweep.provenance.get("gpu")), timing_gpu(gpu_now)
    if started != now:
        raise UsageError(
            f"--out {path.parent}: {SWEEP_FILE} there was started on {started or 'an unknown GPU'}, this machine "
            f"times on {now or 'no GPU'}; resume it on its own GPU model, or pick another --out folder for this one "
            "(nothing was changed)"
        )


def time_tiles(runner, module, tiles: Sequence[int], captures: int, rounds: int) -> tuple[dict, dict]:
    """Every tile of ``tiles`` forced on ``module``, timed by the bench's method
    (``ci.timing.captures.time_in_captures``) in ``captures`` fresh captures, each with its own random pad and
    random order of the tiles. Seeded by the case id: a re-run times in the same order."""
    from ci.timing.captures import time_in_captures

    rng = random.Random(f"ep-marlin-gate:tile-sweep:{runner.case.id}")
    plan = []
    for _ in range(captures):
        pad = 256 * rng.randrange(1, 4096)
        plan.append(([str(t) for t in rng.sample(list(tiles), len(tiles))], pad))
    return time_in_captures(
        runner, runner.case.id, captures, rounds, lambda tile: runner.capture(module, forced_bm=int(tile)), plan
    )


def _bar(done: int, total: int, started: float, width: int = 24) -> str:
    frac = done / total if total else 1.0
    elapsed = time.time() - started
    eta = elapsed / frac - elapsed if frac > 0 else 0.0
    filled = round(width * frac)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {elapsed:.0f} s, ETA {eta:.0f} s"


def run_sweep(
    trees,
    cases: list[BenchCase],
    sweep: Sweep,
    out: Path,
    *,
    captures: int,
    rounds: int,
    budget_s: float | None = None,
    log=print,
) -> Sweep:
    """Time the cases not yet in ``sweep``, saving after each; stop starting cases once ``budget_s`` is spent."""
    import torch

    from ci.kernel.bench import picked_block_size, timing_experts
    from ci.kernel.graphs import CaseRunner
    from ci.trees.variants import load_variants, put_base_first

    put_base_first(trees)
    base, cand = load_variants(trees)
    todo = [c for c in cases if c.id not in sweep.done()]
    started, key, experts, in_a_row = time.time(), None, None, 0
    log(
        f"tile sweep: {len(cases)} cases in grid {sweep.grid!r}, {len(cases) - len(todo)} already done, "
        f"{len(todo)} to time ({captures} captures x {rounds} rounds per tile)"
    )
    for i, case in enumerate(todo, 1):
        if budget_s is not None and time.time() - started > budget_s:
            log(
                f"tile sweep: budget of {budget_s:.0f} s spent; {len(todo) - i + 1} cases left: run the same "
                "command again to resume"
            )
            break
        try:
            local = int(rank_view(case.experts, case.ep, 0).local_ids.numel())
            if (case.shape_name, case.ep, case.quant) != key:
                experts, key = None, (case.shape_name, case.ep, case.quant)
                torch.cuda.empty_cache()
                experts = timing_experts(case, local)
            t0 = time.time()
            runner = CaseRunner(case, experts)
            picks = {v.name: picked_block_size(runner, v.marlin_moe) for v in (base, cand)}
            samples, capture_of = time_tiles(runner, base.marlin_moe, runnable_block_sizes(case), captures, rounds)
            del runner
        except Exception as exc:  # one case that cannot run must not lose the sweep
            # A case that fails is named with its error and left untimed (so the sweep stays incomplete, exit 10).
            failed = sweep.settings.setdefault("failed", {})
            failed[case.id] = f"{type(exc).__name__}: {str(exc)[:300]}"
            log(f"tile sweep: {case.id}: not timed: {failed[case.id]}\n{traceback.format_exc(limit=6)}")
            key, experts, in_a_row = None, None, in_a_row + 1
            sweep.save(out)
            if in_a_row >= MAX_FAILED_IN_A_ROW:  # a broken CUDA context fails every case after it
                log(f"tile sweep: {in_a_row} cases in a row not timed: stopping (fix, then resume)")
                break
            torch.cuda.empty_cache()
            continue
        in_a_row = 0
        sweep.cases.append(
            SweepCase(
                id=case.id,
                info=case_info(case, local),
                picks=picks,
                samples=samples,
                captures=capture_of,
                wall_s=round(time.time() - t0, 2),
            )
        )
        sweep.settings["wall_time_s"] = round(sweep.settings.get("wall_time_s", 0.0) + time.time() - t0, 1)
        sweep.settings["complete"] = len(sweep.done() & {c.id for c in cases}) == len(cases)
        sweep.save(out)
        best = min(samples, key=lambda t: sorted(samples[t])[len(samples[t]) // 2])
        log(
            f"tile sweep {_bar(len(cases) - len(todo) + i, len(cases), started)} {case.id}: best {best}, "
            f"base picks {picks['base']}, candidate {picks['candidate']}"
        )
    return sweep


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.kernel.tile_sweep", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--manifest", type=Path, required=True, help="manifest.json of the trees (ci.trees.build)")
    parser.add_argument("--grid", default="full", help=f"one of {sorted(GRIDS)} (default %(default)s)")
    parser.add_argument("--cases", help="only case ids matching this glob (or any of several, comma-separated)")
    parser.add_argument("--captures", type=int, default=DEFAULT_CAPTURES, help="fresh captures per case (%(default)s)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="timings per tile per capture (%(default)s)")
    parser.add_argument("--budget-s", type=float, help="stop starting cases after this many seconds (resume later)")
    parser.add_argument("--allow-busy", action="store_true", help="time even if another process uses the GPU")
    parser.add_argument("--out", type=Path, required=True, help=f"folder the stage writes {SWEEP_FILE} into")
    args = parser.parse_args(argv)
    if args.captures < DEFAULT_CAPTURES or args.rounds < 1:
        raise UsageError(
            f"--captures {args.captures} --rounds {args.rounds}: an interval over captures needs at "
            f"least {DEFAULT_CAPTURES} captures and one round each"
        )
    if args.budget_s is not None and args.budget_s <= 0:
        raise UsageError(f"--budget-s {args.budget_s}: a positive number of seconds")
    if args.out.suffix == ".json" or (args.out.exists() and not args.out.is_dir()):
        raise UsageError(f"--out {args.out}: the folder the stage writes {SWEEP_FILE} into; pass a folder")
    cases = grid_cases(args.grid, args.cases)
    from ci.host import gpu
    from ci.timing.graphs import CALLS_PER_GRAPH
    from ci.trees import provenance
    from ci.trees.manifest import load_trees

    trees = load_trees(args.manifest)
    settings = {
        "captures": args.captures,
        "rounds": args.rounds,
        "calls_per_graph": CALLS_PER_GRAPH,
        "vllm": trees.manifest.vllm_version,
        "patch_sha256": trees.manifest.patch_sha256,
        "case_filter": args.cases,
        "expected_cases": [c.id for c in cases],
        "complete": False,
        "timer": "CUDA events around a CUDA-graph replay (ci.kernel.graphs)",
    }
    path = args.out / SWEEP_FILE
    sweep = resumable(path, args.grid, settings)
    gpu.require_idle_gpus(1, allow_busy=args.allow_busy)
    gpu_now = provenance.collect(with_cuda=True)["gpu"]
    if sweep is None:
        sweep = Sweep(grid=args.grid, provenance=provenance.collect(trees, with_cuda=True), settings=settings)
    else:
        check_same_gpu(path, sweep, gpu_now)
    sweep.provenance.setdefault("resumed", []).append(gpu_now)
    sweep = run_sweep(trees, cases, sweep, path, captures=args.captures, rounds=args.rounds, budget_s=args.budget_s)
    missing = [c.id for c in cases if c.id not in sweep.done()]
    print(f"tile sweep: {len(cases) - len(missing)} of {len(cases)} cases in {path}")
    if missing:
        raise IncompleteEvidenceError(
            f"{len(missing)} cases not timed yet (first {missing[0]}); run the same "
            "command again: the sweep resumes where it stopped"
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
