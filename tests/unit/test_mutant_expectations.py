"""Every mutant of ci/changes says which tier catches it and how, and a subject's test folder checks it."""

from __future__ import annotations

from ci.trees.contracts import load_contract
from tests.shared import CHANGES_DIR, MUTANT_CHECKS, mutants


def test_every_mutant_says_which_tier_catches_it():
    """A mutant without its expectation, or with one nobody checks, is a claim nobody checks."""
    found = mutants()
    assert len(found) >= 9
    for m in found.values():
        assert m["expect"].exists(), f"{m['patch']}: no {m['expect'].name} beside it saying which tier catches it"
        assert m.get("tier") in ("cpu", "gpu"), f"{m['expect']}: tier is 'cpu' or 'gpu'"
        assert m["tier"] == "gpu" or m.get("check") in MUTANT_CHECKS, f"{m['expect']}: check is one of " + ", ".join(
            MUTANT_CHECKS
        )
        assert m["tier"] == "cpu" or m.get("tests"), f"{m['expect']}: a GPU mutant names the tests that catch it"
        assert m.get("why"), f"{m['expect']}: say what the mutant breaks"
        contract = load_contract(CHANGES_DIR / m["change"] / "contract.py")
        assert m.get("setting", "default") in contract.settings, f"{m['expect']}: no such setting"


def test_every_check_has_a_test_folder_that_runs_it():
    for check, folder in MUTANT_CHECKS.items():
        text = (CHANGES_DIR.parents[1] / folder / "test_mutants.py").read_text()  # the repository's root
        assert f'"{check}"' in text, f"{folder}/test_mutants.py does not run the {check!r} mutants"
