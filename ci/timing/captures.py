"""The capture schedule of every bench: the builds (or tiles) of a case timed in fresh captures, each with its
own order and pad, rounds alternating within it, so that a capture's systematic error (the same kernels timed
1-3% apart in two captures: addresses, placement) is inside the interval the verdict takes over captures
(``ci.core.stats.capture_effect``). The seeds are the case's id: a re-run, or the stored baseline's run,
times capture ``b`` with the same order and pad (baseline mode pairs them).
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone
from pathlib import Path

from ci.core import sequential, stats
from ci.core.compare import fraction
from ci.core.errors import UsageError

SEQUENTIAL_MAX_EXTRA = 3  # groups of extra captures an INCONCLUSIVE case may get (--max-extra)
GROUP_SHARE = 3  # a group is a third of the first look's captures (10 of 30)


def capture_plan(case_id: str, captures: int) -> list[tuple[tuple[str, str], int]]:
    """Per capture: the order the builds are captured and timed in, and the pad (bytes) before its inputs.
    Random but reproducible (seeded by the case id): over the captures each build goes first about half the
    time and sits at varying addresses."""
    rng = random.Random(f"ep-marlin-gate:{case_id}")
    plan = []
    for _ in range(captures):
        order = ("base", "candidate") if rng.random() < 0.5 else ("candidate", "base")
        plan.append((order, 256 * rng.randrange(1, 4096)))
    return plan


def time_in_captures(
    runner, case_id: str, captures: int, rounds: int, capture, plan: list | None = None, first_id: int = 0
) -> tuple[dict, dict]:
    """The timing method of every bench: per capture of ``plan`` (``capture_plan``'s by default: the two builds),
    fresh inputs behind a pad (``runner.start_capture``), a fresh graph of each name (``capture(name)``) in the
    capture's order, then ``rounds`` timings of each, the order reversed every round (A B, B A, ...: with two
    builds, sample i of each is a pair). Returns the samples and the capture of each sample, by name; the
    captures are numbered from ``first_id`` (a later group of the same case goes on where the last ended)."""
    plan = capture_plan(case_id, captures) if plan is None else plan
    samples: dict[str, list[float]] = {name: [] for name in sorted(plan[0][0])}
    capture_of: dict[str, list[int]] = {name: [] for name in samples}
    for b, (order, pad_bytes) in enumerate(plan, first_id):
        pad = runner.start_capture(b, pad_bytes)
        graphs = {name: capture(name) for name in order}
        for name in stats.interleaved_order(rounds, order):
            samples[name].append(runner.time_us(graphs[name]))
            capture_of[name].append(b)
        del graphs, pad
    return samples, capture_of


def time_sequentially(
    runner, case_id: str, plan: sequential.Plan, rounds: int, capture, threshold: float, log=None
) -> tuple[dict, dict, list[dict]]:
    """``time_in_captures`` over the looks of ``plan`` (``ci.core.sequential``): the first look's captures, then,
    while the case is INCONCLUSIVE at ``threshold``, a group more, judged again, up to the plan's cap. Capture
    ``b`` has the same order and pad whatever group it falls in (``capture_plan``), so a case re-run, or timed
    with another plan, times its captures alike. Returns the samples, their captures, and the groups timed
    (captures, when each began and ended: the results keep them)."""
    schedule = capture_plan(case_id, plan.most_captures)
    samples: dict[str, list[float]] = {}
    capture_of: dict[str, list[int]] = {}
    groups: list[dict] = []
    start, size = 0, plan.first
    while size:
        began, t0 = _now(), time.monotonic()
        got, ids = time_in_captures(runner, case_id, size, rounds, capture, schedule[start : start + size], start)
        for name in got:
            samples.setdefault(name, []).extend(got[name])
            capture_of.setdefault(name, []).extend(ids[name])
        start += size
        seconds = round(time.monotonic() - t0, 3)
        groups.append({"captures": [start - size, start], "began": began, "ended": _now(), "seconds": seconds})
        medians = {name: stats.capture_medians(samples[name], capture_of[name]) for name in ("base", "candidate")}
        size = sequential.more_captures(medians, plan, threshold)
        if size and log is not None:
            log(f"{case_id}: INCONCLUSIVE after {start} captures, timing {size} more")
    return samples, capture_of, groups


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def plan_for(captures: int, on: bool = True, max_extra: int = SEQUENTIAL_MAX_EXTRA) -> sequential.Plan:
    """A bench's plan: ``captures`` for the first look, then (``on``) up to ``max_extra`` groups of a third as
    many; refused (a usage error) where a look could never decide."""
    if max_extra < 0:
        raise UsageError(f"--max-extra {max_extra}: 0 (no extra look) or more groups of captures")
    plan = (
        sequential.Plan(first=captures, group=max(1, captures // GROUP_SHARE), max_extra=max_extra)
        if on and max_extra
        else sequential.Plan.single(captures)
    )
    why = plan.undecidable()
    if why:
        raise UsageError(
            f"--captures {captures} with the sequential plan: {why}; pass more --captures, or --sequential off"
        )
    return plan


def add_plan_arguments(parser, max_extra: int | None = SEQUENTIAL_MAX_EXTRA) -> None:
    """The options of a bench's sequential plan (``plan_for``) and the threshold its looks are judged at
    (``max_extra`` None: the stage's default depends on its other options, e.g. a profile)."""
    parser.add_argument("--sequential", choices=("on", "off"), default="on", help="more captures while INCONCLUSIVE")
    parser.add_argument("--max-extra", type=int, default=max_extra, help="groups of them (%(default)s)")
    parser.add_argument("--threshold", type=fraction, default=stats.DEFAULT_THRESHOLD, help="of the looks (0.03)")


def add_bench_arguments(parser, *, results_file: str, suites, captures: int, repeats: int) -> None:
    """The options every bench timed in captures takes (its trees, suite, cases, A/A, captures and rounds, the
    busy-GPU guard, its output folder) and its sequential plan's (``add_plan_arguments``)."""
    parser.add_argument("--manifest", type=Path, required=True, help="manifest.json of the trees (ci.trees.build)")
    parser.add_argument("--suite", default="default", help=f"one of {sorted(suites)} (default %(default)s)")
    parser.add_argument("--cases", help="only case ids matching this glob (or any of several, comma-separated)")
    parser.add_argument("--repeats", type=int, default=repeats, help="rounds per build (%(default)s)")
    parser.add_argument(
        "--captures",
        type=int,
        default=captures,
        help="fresh captures per build, the rounds split among them (%(default)s)",
    )
    parser.add_argument("--out", type=Path, required=True, help=f"folder the stage writes {results_file} into")
    parser.add_argument("--allow-busy", action="store_true", help="time even if another process uses the GPU")
    parser.add_argument("--aa", action="store_true", help="A/A run: time the base build against itself")
    add_plan_arguments(parser)
