"""The gate's core judges samples and knows nothing of what they measure: ``ci/core/`` imports only itself and
names no quantity of a subject; the subjects (``ci/<name>/subject.py``) register themselves.

``python -m tests.unit.test_core_layering`` prints the import graph of the core and of every package."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from ci.core import subjects

CI = Path(__file__).resolve().parents[2] / "ci"
PACKAGES = ("core", "host", "timing", "moe", "trees", "kernel", "serving", "runner", "triton_moe")
SUBJECT_WORDS = re.compile(r"marlin|block_size|tpot|vllm|\bmoe\b|expert", re.IGNORECASE)


def modules(package: str) -> list[str]:
    return sorted(p.stem for p in (CI / package).glob("*.py") if p.stem != "__init__")


def imports(package: str, module: str) -> set[str]:
    """The ``ci`` modules ``ci/<package>/<module>.py`` imports, as ``package.module`` (or ``package``)."""
    tree = ast.parse((CI / package / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ci":
            parts = node.module.split(".")[1:]
            found |= {".".join(parts)} if len(parts) > 1 else {f"{parts[0]}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.partition(".")[2] or "ci" for a in node.names if a.name.split(".")[0] == "ci"}
    return found


def test_every_module_lives_in_a_package():
    assert sorted(p.name for p in CI.glob("*.py")) == ["__init__.py"]
    packages = sorted(p.parent.name for p in CI.glob("*/__init__.py"))
    assert packages == sorted(PACKAGES), packages


def test_the_core_imports_only_itself():
    for module in modules("core"):
        # "ci" itself: the subjects' discovery lists its packages
        outside = {m for m in imports("core", module) if m.split(".")[0] != "core" and m != "ci"}
        assert not outside, f"ci/core/{module}.py imports {sorted(outside)}"


def test_the_core_and_the_timing_name_no_subjects_quantity():
    for package in ("core", "timing"):
        for module in modules(package):
            text = (CI / package / f"{module}.py").read_text().replace("ep-marlin-gate", "")  # the project's name
            found = sorted(set(SUBJECT_WORDS.findall(text)))
            assert not found, f"ci/{package}/{module}.py names {found}"


def test_no_package_imports_a_subjects_registration():
    """Only the core's discovery imports ``<subject>.subject``; the rest reach a subject through the core."""
    for package in PACKAGES:
        for module in modules(package):
            for m in imports(package, module):
                if m.endswith(".subject") and m.split(".")[0] != package:
                    raise AssertionError(f"ci/{package}/{module}.py imports ci.{m}")


def test_the_subjects_are_found_by_their_packages():
    on_disk = {p.parent.name for p in CI.glob(f"*/{subjects.SUBJECT_MODULE}.py")}
    assert on_disk == {"kernel", "serving", "triton_moe"}
    assert {"kernel-bench", "tpot-bench", "triton-moe-bench"} <= set(subjects.kinds())


def test_a_fresh_process_finds_the_subjects_without_being_told():
    """The other tests import the subjects themselves; a process that imports only the core must find them."""
    import subprocess

    code = "from ci.core import subjects; print(' '.join(subjects.kinds()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=CI.parent)
    assert done.stdout.split() == ["kernel-bench", "tpot-bench", "triton-moe-bench"]


if __name__ == "__main__":
    for package in PACKAGES:
        for module in modules(package):
            print(f"ci.{package}.{module} -> {', '.join(sorted(imports(package, module))) or '(nothing)'}")
