"""The capture schedule of every bench: the builds (or tiles) of a case timed in fresh captures, each with its
own order and pad, rounds alternating within it, so that a capture's systematic error (the same kernels timed
1-3% apart in two captures: addresses, placement) is inside the interval the verdict takes over captures
(``ci.core.stats.capture_effect``). The seeds are the case's id: a re-run, or the stored baseline's run,
times capture ``b`` with the same order and pad (baseline mode pairs them).
"""

from __future__ import annotations

import random

from ci.core import stats


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
    runner, case_id: str, captures: int, rounds: int, capture, plan: list | None = None
) -> tuple[dict, dict]:
    """The timing method of every bench: per capture of ``plan`` (``capture_plan``'s by default: the two builds),
    fresh inputs behind a pad (``runner.start_capture``), a fresh graph of each name (``capture(name)``) in the
    capture's order, then ``rounds`` timings of each, the order reversed every round (A B, B A, ...: with two
    builds, sample i of each is a pair). Returns the samples and the capture of each sample, by name."""
    plan = capture_plan(case_id, captures) if plan is None else plan
    samples: dict[str, list[float]] = {name: [] for name in sorted(plan[0][0])}
    capture_of: dict[str, list[int]] = {name: [] for name in samples}
    for b, (order, pad_bytes) in enumerate(plan):
        pad = runner.start_capture(b, pad_bytes)
        graphs = {name: capture(name) for name in order}
        for name in stats.interleaved_order(rounds, order):
            samples[name].append(runner.time_us(graphs[name]))
            capture_of[name].append(b)
        del graphs, pad
    return samples, capture_of
