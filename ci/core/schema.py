"""Typed case data: what a subject's fields of a results file must be, checked once when the file is read.

A subject declares the ``info`` and ``extra`` fields its code reads (``ci.core.subjects.Subject.schema``) with
the few shapes below; ``ci.core.results.load_results`` checks every case against them, so a field of the wrong
type (a string where a list of times belongs, a round without its build) is one :class:`DataError` naming the
file, the case and the field, and the subject's code (verdict data, report, plot) reads only what it declared.
Fields a schema does not name are not checked (and not read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ci.core.errors import DataError


@dataclass(frozen=True)
class Opt:
    """May be missing or null; when present, ``of``."""

    of: Any


@dataclass(frozen=True)
class ListOf:
    of: Any


@dataclass(frozen=True)
class MapOf:
    """An object whose keys are strings (``digits``: strings of digits) and whose values are ``of``."""

    of: Any
    digits: bool = False


@dataclass(frozen=True)
class OneOf:
    options: tuple


NUMBER = "a finite number"
POSITIVE = "a positive finite number"
INTEGER = "an integer"
STRING = "a string"
BOOLEAN = "true or false"


def _scalar(value: Any, kind: str) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return {
        NUMBER: number,
        POSITIVE: number and value > 0,
        INTEGER: isinstance(value, int) and not isinstance(value, bool),
        STRING: isinstance(value, str),
        BOOLEAN: isinstance(value, bool),
    }[kind]


def _describe(spec: Any) -> str:
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Opt):
        return f"{_describe(spec.of)} or null"
    if isinstance(spec, ListOf):
        return f"a list of {_describe(spec.of)}"
    if isinstance(spec, (MapOf, dict)):
        return "an object"
    if isinstance(spec, OneOf):
        return " or ".join(_describe(o) for o in spec.options)
    return repr(spec)


def problem(value: Any, spec: Any, where: str) -> str | None:
    """The first way ``value`` is not ``spec`` (``where`` names the field), or None."""
    if isinstance(spec, Opt):
        return None if value is None else problem(value, spec.of, where)
    if isinstance(spec, OneOf):
        if any(problem(value, o, where) is None for o in spec.options):
            return None
        return f"{where} should be {_describe(spec)}, found {_short(value)}"
    if isinstance(spec, str):
        return None if _scalar(value, spec) else f"{where} should be {spec}, found {_short(value)}"
    if isinstance(spec, ListOf):
        if not isinstance(value, list):
            return f"{where} should be {_describe(spec)}, found {_short(value)}"
        return next((p for i, x in enumerate(value) if (p := problem(x, spec.of, f"{where}[{i}]"))), None)
    if isinstance(spec, MapOf):
        if not isinstance(value, dict) or (spec.digits and not all(str(k).isdigit() for k in value)):
            keys = "keys of digits" if spec.digits else "string keys"
            return f"{where} should be an object with {keys}, found {_short(value)}"
        return next((p for k, x in value.items() if (p := problem(x, spec.of, f"{where}[{k!r}]"))), None)
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{where} should be an object, found {_short(value)}"
        for key, sub in spec.items():
            if key not in value:
                if isinstance(sub, Opt):
                    continue
                return f"{where} lacks {key!r}"
            found = problem(value[key], sub, f"{where}.{key}")
            if found:
                return found
        return None
    raise TypeError(f"not a schema: {spec!r}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_case(path: Any, case_id: str, fields: dict[str, Any], schema: dict[str, Any]) -> None:
    """A :class:`DataError` for the first field of a case (``fields``: its ``info`` and ``extra``) that is not
    what ``schema`` says."""
    for part, spec in schema.items():
        found = problem(fields.get(part, {}), {k: Opt(v) for k, v in spec.items()}, part)  # Opt(Opt(x)) is Opt(x)
        if found:
            raise DataError(f"{path}: case {case_id!r}: {found}; re-create the file with the stage that writes it")
