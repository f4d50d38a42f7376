"""ci.timing.agreement without a GPU or torch: the base's own spread and the bound it sets."""

from __future__ import annotations

import pytest

from ci.timing import agreement


def test_the_spread_is_the_largest_distance_of_more_base_calls_from_its_first_output():
    outputs = iter([1.0, 1.5, 0.75, 1.0])
    calls = []

    def call():
        calls.append(1)
        return next(outputs)

    assert agreement.own_spread(call, 1.0, calls=4, distance=lambda a, b: abs(a - b)) == 0.5
    assert len(calls) == 4
    assert agreement.own_spread(lambda: 2.0, 2.0, distance=lambda a, b: abs(a - b)) == 0.0


def test_a_base_that_repeats_its_bits_excuses_no_difference():
    assert not agreement.within_spread(1e-12, 0.0)
    assert not agreement.within_spread(0.0, 0.0)  # equal bits never reach this; a zero spread still excuses nothing


def test_a_base_that_does_not_repeat_its_bits_excuses_up_to_four_times_its_spread():
    assert agreement.SPREAD_FACTOR == 4.0
    assert agreement.within_spread(2e-4, 5e-5)
    assert not agreement.within_spread(2.0001e-4, 5e-5)
    assert agreement.within_spread(0.0, 5e-5)


def test_the_message_says_which_bound_was_crossed():
    assert "repeats its own output bit for bit (4 more calls)" in agreement.describe(1e-7, 0.0)
    said = agreement.describe(3e-4, 5e-5)
    assert "rel L2 3.00e-04, more than 4x the base's own call-to-call spread" in said
    assert "rel L2 5.00e-05 over 4 more calls" in said


def test_rel_l2_is_relative_and_in_float64():
    """Also run by the bench tests with torch; the mutation environment has none (tests/mutation-survivors.txt)."""
    torch = pytest.importorskip("torch")
    a = torch.full((2, 3), 2.0**-10, dtype=torch.bfloat16)  # exact in bf16; a norm under 1, so the floor matters
    assert agreement.rel_l2(a, a * 2) == pytest.approx(1.0)
    assert agreement.rel_l2(a, a * 1.5) == pytest.approx(0.5)
    assert agreement.rel_l2(a, a) == 0.0
    assert agreement.rel_l2(torch.zeros(2), torch.zeros(2)) == 0.0
    assert agreement.rel_l2(torch.zeros(2), torch.tensor([3.0, 4.0])) == pytest.approx(5e30)  # a zero base: huge
