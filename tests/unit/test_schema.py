"""ci.core.schema: typed case data, each shape and its message."""

from __future__ import annotations

import math

import pytest

from ci.core import schema as s
from ci.core.errors import DataError


@pytest.mark.parametrize(
    ("value", "kind", "ok"),
    [
        (1, s.NUMBER, True),
        (1.5, s.NUMBER, True),
        (True, s.NUMBER, False),
        (math.nan, s.NUMBER, False),
        (math.inf, s.NUMBER, False),
        ("1", s.NUMBER, False),
        (0, s.POSITIVE, False),
        (0.1, s.POSITIVE, True),
        (-1, s.POSITIVE, False),
        (3, s.INTEGER, True),
        (3.0, s.INTEGER, False),
        (False, s.INTEGER, False),
        ("x", s.STRING, True),
        (1, s.STRING, False),
        (True, s.BOOLEAN, True),
        (0, s.BOOLEAN, False),
    ],
)
def test_scalars_are_what_they_say_and_a_boolean_is_no_number(value, kind, ok):
    found = s.problem(value, kind, "f")
    assert (found is None) == ok
    if not ok:
        assert found == f"f should be {kind}, found {value!r}"


def test_containers_name_the_first_wrong_place():
    spec = {
        "rounds": s.ListOf({"build": s.STRING, "ms": s.Opt(s.POSITIVE)}),
        "sweep": s.MapOf(s.ListOf(s.POSITIVE), digits=True),
        "label": s.Opt(s.OneOf((s.STRING, s.INTEGER))),
    }
    good = {"rounds": [{"build": "base", "ms": None}, {"build": "c"}], "sweep": {"8": [1.0]}, "label": 3}
    assert s.problem(good, spec, "extra") is None
    assert s.problem({**good, "rounds": {}}, spec, "extra") == "extra.rounds should be a list of an object, found {}"
    assert s.problem({**good, "rounds": [{"build": "b"}, {"ms": 1}]}, spec, "extra") == "extra.rounds[1] lacks 'build'"
    assert s.problem({**good, "rounds": [{"build": "b", "ms": 0}]}, spec, "x") == (
        "x.rounds[0].ms should be a positive finite number, found 0"
    )
    assert s.problem({**good, "sweep": {"a": [1.0]}}, spec, "e") == (
        "e.sweep should be an object with keys of digits, found {'a': [1.0]}"
    )
    assert s.problem({**good, "sweep": {"8": [1.0, -2]}}, spec, "e") == (
        "e.sweep['8'][1] should be a positive finite number, found -2"
    )
    assert s.problem({**good, "label": [1]}, spec, "e") == "e.label should be a string or an integer, found [1]"
    assert s.problem("x", spec, "e") == "e should be an object, found 'x'"
    assert s.problem([], s.MapOf(s.STRING), "m") == "m should be an object with string keys, found []"
    assert s.problem({"k": 1}, s.MapOf(s.STRING), "m") == "m['k'] should be a string, found 1"
    assert s.problem(None, s.ListOf(s.STRING), "l") == "l should be a list of a string, found None"
    assert s.problem(None, s.Opt(s.ListOf(s.STRING)), "l") is None
    with pytest.raises(TypeError, match="not a schema"):
        s.problem(1, 3.5, "x")


def test_a_long_value_is_shortened_in_the_message():
    found = s.problem("y" * 200, s.INTEGER, "f")
    assert found.endswith("...") and len(found.split("found ", 1)[1]) == 80
    assert s.problem("y" * 78, s.INTEGER, "f").endswith("'")  # 80 characters with its quotes: whole


def test_a_case_names_the_file_the_case_and_the_field_and_absent_fields_are_fine():
    schema = {"info": {"block_size_m": s.MapOf(s.Opt(s.INTEGER))}, "extra": {"correctness": {"ok": s.BOOLEAN}}}
    s.check_case("f.json", "c", {"info": {}, "extra": {}}, schema)
    s.check_case("f.json", "c", {"info": {"block_size_m": {"base": None}}}, schema)
    with pytest.raises(DataError) as err:
        s.check_case("f.json", "c", {"info": {}, "extra": {"correctness": {"ok": "yes"}}}, schema)
    assert str(err.value) == (
        "f.json: case 'c': extra.correctness.ok should be true or false, found 'yes'; "
        "re-create the file with the stage that writes it"
    )
    with pytest.raises(DataError, match=r"case .c.: info\.block_size_m"):
        s.check_case("f.json", "c", {"info": {"block_size_m": 8}}, schema)


def test_a_value_of_81_characters_is_shortened_and_one_of_80_is_not():
    assert s.problem("y" * 79, s.INTEGER, "f") == "f should be an integer, found '" + "y" * 76 + "..."
    assert s.problem("y" * 78, s.INTEGER, "f") == "f should be an integer, found '" + "y" * 78 + "'"


def test_one_of_names_each_option_and_an_optional_one_as_or_null():
    assert s.problem(5, s.OneOf((s.Opt(s.STRING), s.ListOf(s.INTEGER))), "f") == (
        "f should be a string or null or a list of an integer, found 5"
    )


def test_a_missing_optional_field_does_not_stop_the_check_of_the_next():
    assert s.problem({"b": 5}, {"a": s.Opt(s.STRING), "b": s.STRING}, "x") == "x.b should be a string, found 5"


def test_a_results_file_with_a_malformed_case_is_refused_naming_the_file_and_the_case(tmp_path):
    from ci.core.results import load_results
    from tests.unit.factories import kernel_results, saved

    results = kernel_results()
    results.cases[0].info["block_size_m"] = 8
    path = saved(results, tmp_path / "k.json")
    with pytest.raises(DataError) as err:
        load_results(path)
    assert str(err.value) == (
        f"{path}: case {results.cases[0].id!r}: info.block_size_m should be an object with "
        "string keys, found 8; re-create the file with the stage that writes it"
    )
