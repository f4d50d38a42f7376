"""What the gate's core asks of a subject (the thing measured), so the core never names one.

The core (``results``, ``stats``, ``evidence``, ``compare``, ``baselines``, ``report``) judges samples
per case and knows nothing of what a case measures. A subject, keyed by the results ``kind``
its stage writes, says what a complete run of it is, from the gate's own definitions and never from
what a results file claims (``expected_cases``: its suites and the run's case filter; ``min_samples``;
``min_captures``: how many fresh timing units, ``extra.captures``, each build needs), and adds what only it
understands: extra report columns and verdict data per case (``annotate``), notes, Markdown under the
table (``details``), a second plot panel (``panel``), what build each side of a run is (``identity``: a
baseline is compared with a run of the same build only), and the file name of its baselines
(``baseline_prefix``). A results file of a kind no subject registered is refused (``ci.core.results``).

A subject is a package ``ci/<name>/`` whose module ``subject`` calls :func:`register` when imported; the
core finds them by that convention (``tests/unit/test_core_layering.py`` checks it names none).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

SUBJECT_MODULE = "subject"  # ci/<name>/subject.py registers the kinds its stage writes


@dataclass
class Annotation:
    """A subject's additions to one case's verdict: report cells by column, data for verdict.json, notes."""

    cells: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _undefined(results: Any) -> list[str]:
    from ci.core.errors import DataError

    raise DataError(f"the gate defines no cases for results of kind {results.kind!r}: no complete run of it exists")


@dataclass(frozen=True, kw_only=True)
class Subject:
    kind: str
    # results -> the case ids a complete run holds, from the gate's definitions (a GateError: not one it defines)
    expected_cases: Callable[[Any], list[str]] = _undefined
    min_samples: Callable[[Any], int] = lambda results: 0  # per case and judged build, beyond the core's floor
    # results -> the fresh timing units (captures, ``extra.captures``) each judged build needs in each case
    min_captures: Callable[[Any], int] = lambda results: 1
    # capture b of two runs of a case did the same work (inputs, order and padding seeded by case and b, as the
    # kernel bench's): baseline mode pairs them; False (server launches, independent in each run): it compares
    # the two runs' captures unpaired, so the interval holds the spread between captures of different runs
    captures_match_across_runs: bool = True
    case_problems: Callable[[Any], list[str]] = lambda case: []  # what keeps a case from counting as evidence
    baseline_prefix: str = ""
    results_file: str = ""  # the name of the results file its stage writes, and the command that writes it
    writer: str = ""
    columns: Callable[[str], Sequence[str]] = lambda mode: ()  # report columns for mode "ab" / "baseline"
    # (case, stored case or None, judged side or None) -> Annotation; stored is None in A/B mode
    annotate: Callable[[Any, Any, str | None], Annotation] | None = None
    details: Callable[[Any], list[str]] = lambda results: []  # Markdown lines under the table
    panel: Callable[[Any], Callable[[Any], None] | None] = lambda results: None  # a drawer for a 2nd panel
    # the types of the case fields its code reads ({"info": {...}, "extra": {...}}, ci.core.schema): checked when
    # a results file is read, so a field of the wrong type is one error naming it, never a traceback
    schema: dict = field(default_factory=dict)
    # (results, side) -> what build that side is ({name: value}): baseline mode compares only like with like
    identity: Callable[[Any, str], dict[str, str]] = lambda results, side: {}
    # results -> the side that is the software as published (the base, unless the run took the change out of a
    # release that holds it): the side a history of nightly runs follows
    published_side: Callable[[Any], str] = lambda results: "base"
    # the GPU stages of a subject a change enters directly (the one-command GPU verdict runs them): the module of
    # the software under test its changes are loaded through, its test folder (the CPU tier and, marked gpu, the
    # GPU suite) and its bench (``python -m BENCH --manifest M --suite S --out DIR``, writing ``results_file``)
    entry_module: str = ""
    test_folder: str = ""
    bench: str = ""


_REGISTRY: dict[str, Subject] = {}


def register(subject: Subject) -> Subject:
    _REGISTRY[subject.kind] = subject
    return subject


def _load() -> None:
    import ci

    for package in pkgutil.iter_modules(ci.__path__):  # imported once; each registers itself (sys.modules)
        if package.ispkg and importlib.util.find_spec(f"ci.{package.name}.{SUBJECT_MODULE}") is not None:
            importlib.import_module(f"ci.{package.name}.{SUBJECT_MODULE}")


def capture_ids(case: Any, side: str) -> list[int] | None:
    """The capture of each sample of ``side`` (``extra.captures[side]``: fresh timing units, e.g. a CUDA-graph
    capture or a pair of server launches), or None: the file records none (one capture)."""
    from ci.core.errors import DataError

    captures = case.extra.get("captures")
    if captures is None:
        return None
    ids = captures.get(side) if isinstance(captures, dict) else None
    samples = case.samples.get(side, [])
    if not isinstance(ids, list) or len(ids) != len(samples) or not all(type(b) is int for b in ids):
        raise DataError(f"case {case.id}: extra.captures[{side!r}] should give the capture of each of its samples")
    return ids


def captures(case: Any, side: str) -> int:
    """How many fresh captures ``side`` of ``case`` was sampled in (none recorded: one)."""
    ids = capture_ids(case, side)
    return 1 if ids is None else len(set(ids))


def written_by(name: str) -> str:
    """Which command writes a results file of this name (for the message when it is missing): the subject's
    that names it, or every subject's."""
    _load()
    writers = {s.results_file: s.writer for s in _REGISTRY.values() if s.results_file and s.writer}
    if name in writers:
        return f"{writers[name]} writes {name}"
    return "; ".join(f"{w} writes {n}" for n, w in sorted(writers.items())) or "no subject names its results file"


def kinds() -> tuple[str, ...]:
    """The results kinds a subject registered: the only ones the gate reads."""
    _load()
    return tuple(sorted(_REGISTRY))


def by_entry_module(entry: str) -> Subject | None:
    """The subject whose changes enter through the module ``entry`` (None: no subject registered it)."""
    _load()
    return next((s for s in _REGISTRY.values() if s.entry_module and s.entry_module == entry), None)


def subject_of(kind: str) -> Subject:
    """The subject of a results kind; a plain one (no extra columns, no defined cases) for a kind nobody
    registered (``ci.core.results`` refuses such a file before it gets here)."""
    _load()
    return _REGISTRY.get(kind) or Subject(kind=kind)
