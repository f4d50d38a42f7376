"""The subjects of the gate core (ci.core.subjects): the registry, and the kernel subject's report cells."""

from __future__ import annotations

import pytest

from ci.core import compare, subjects
from ci.core.subjects import Subject
from ci.kernel import subject as kernel_subject
from tests.unit.factories import captured_results as _captured_results


def test_a_registered_subject_is_found_by_its_kind_and_others_get_the_plain_one():
    subjects.register(subjects.Subject(kind="unit-test-kind", baseline_prefix="u-"))
    assert subjects.subject_of("unit-test-kind").baseline_prefix == "u-"
    plain = subjects.subject_of("nobody-registered-this")
    assert plain.kind == "nobody-registered-this" and plain.annotate is None and plain.details(None) == []


@pytest.mark.parametrize(
    ("picks", "text"),
    [
        (None, "-"),
        ({}, "-"),
        ({"base": 8}, "8"),
        ({"base": 64, "candidate": 16}, "64 -> 16"),
        ({"candidate": 16, "base": 64}, "64 -> 16"),
        ({"base": 64, "other": 1}, "64 -> ?"),
        ({"candidate": 8, "other": 1}, "? -> 8"),
        ({"baseline": 16, "this run": None}, "16 -> ?"),
    ],
)
def test_picks_text(picks, text):
    assert kernel_subject.picks_text(picks) == text


def test_regret_text():
    assert kernel_subject.regret_text(None) == "-"
    found = {"best_block_size_m": 16, "base": 0.48, "candidate": 0.0}
    assert kernel_subject.regret_text(found) == "best 16: base +48%, candidate +0%"
    assert kernel_subject.regret_text({"best_block_size_m": 16, "candidate": 0.1}) == "best 16: candidate +10%"


def test_columns_by_mode():
    assert kernel_subject.columns("ab") == ("block_size_m (base -> candidate)", "regret vs best block size")
    assert kernel_subject.columns("baseline")[0] == "block_size_m (baseline -> this run)"
    with pytest.raises(KeyError):
        kernel_subject.columns("other")


def test_captured_ab_and_baseline_cases_carry_the_kernel_annotations():
    run = _captured_results([1.0] * 10)
    (case,) = compare.compare_ab(run, 0.03, 0.95).cases
    assert case.annotations["block_size_m"] == {"base": 64, "candidate": 16}
    assert case.cells["block_size_m (base -> candidate)"] == "64 -> 16"
    (case,) = compare.compare_baseline(run, _captured_results([1.0] * 10), "base", 0.03, 0.95, "B").cases
    assert case.cells == {
        "block_size_m (baseline -> this run)": "64 -> 64",
        "regret vs best block size": "best 16: base +48%",
    }


def test_a_missing_results_file_names_the_command_of_the_subject_that_writes_it(monkeypatch):
    """Only a subject that names both its file and its writer counts; none: the message says so."""
    monkeypatch.setattr(subjects, "_REGISTRY", {})
    monkeypatch.setattr(subjects, "_load", lambda: None)
    subjects.register(Subject(kind="a", results_file="a.json"))  # no writer
    subjects.register(Subject(kind="b", writer="make b"))  # no file
    assert subjects.written_by("a.json") == "no subject names its results file"
    subjects.register(Subject(kind="c", results_file="c.json", writer="make c"))
    subjects.register(Subject(kind="d", results_file="d.json", writer="make d"))
    assert subjects.written_by("d.json") == "make d writes d.json"
    assert subjects.written_by("other.json") == "make c writes c.json; make d writes d.json"


def test_a_subject_is_found_by_the_entry_module_its_changes_enter_through():
    """gpu_gate's lookup: the module a change is loaded through names the subject whose GPU stages it gets."""
    from ci.trees.variants import ENTRY_MODULES

    marlin, triton = (subjects.by_entry_module(e) for e in ENTRY_MODULES)
    assert (marlin.kind, marlin.test_folder, marlin.bench) == ("kernel-bench", "tests/ep_marlin", "ci.kernel.bench")
    assert (triton.kind, triton.test_folder) == ("triton-moe-bench", "tests/triton_moe")
    assert subjects.by_entry_module("vllm.nothing") is None
    assert subjects.by_entry_module("") is None  # a subject without GPU stages (TPOT) is never the answer
