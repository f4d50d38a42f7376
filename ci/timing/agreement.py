"""How a bench tells a candidate's other numbers from the base's own nondeterminism, before it times anything.

Where the builds must give the same numbers (the same code path and tile), a bench asks for the same bits.
Some kernels do not give the same bits twice: on one H100 (2026-12-06, docs/tile-oracle.md) the base build of
one large case differed from its own first output by up to rel L2 5.5e-5 from call to call on the same inputs
(a smaller load of the same shape repeats its bits), so a bit-for-bit check failed even an A/A run there. So
where the outputs differ, the base is called ``REPEAT_CALLS`` more times on the same inputs: if it repeats its
bits every time, the difference is the candidate's (wrong numbers); if not, the candidate is held to
``SPREAD_FACTOR`` times the largest distance the base showed from its own first output. Nothing here knows
what is called.
"""

from __future__ import annotations

from collections.abc import Callable

REPEAT_CALLS = 4  # more base calls on the same inputs, where the builds' outputs differ
SPREAD_FACTOR = 4.0  # that H100 case: the candidate 4.7e-5 and 5.2e-5 from the base, the base 5.5e-5 from itself


def rel_l2(a, b) -> float:
    """The relative L2 distance of tensor ``b`` from tensor ``a`` (in float64)."""
    return float((a.double() - b.double()).norm() / a.double().norm().clamp_min(1e-30))


def own_spread(call: Callable[[], object], first, calls: int = REPEAT_CALLS, distance=rel_l2) -> float:
    """The largest ``distance`` between ``first`` (the base's output) and ``calls`` more outputs of ``call()`` on
    the same inputs: 0.0 where the base repeats its output every time."""
    return max(distance(first, call()) for _ in range(calls))


def within_spread(diff: float, spread: float) -> bool:
    """Whether a candidate ``diff`` from the base is the base's own nondeterminism: never where the base repeats
    its bits (``spread`` 0), else at most ``SPREAD_FACTOR`` times its spread."""
    return spread > 0.0 and diff <= SPREAD_FACTOR * spread


def describe(diff: float, spread: float) -> str:
    """Why a ``diff`` is wrong numbers, given the base's own ``spread``."""
    if spread == 0.0:
        return f"rel L2 {diff:.2e}, while the base repeats its own output bit for bit ({REPEAT_CALLS} more calls)"
    return (
        f"rel L2 {diff:.2e}, more than {SPREAD_FACTOR:g}x the base's own call-to-call spread on the same inputs "
        f"(rel L2 {spread:.2e} over {REPEAT_CALLS} more calls)"
    )
