"""The gate's core judges samples and knows nothing of what they measure: it imports no subject and no tree
module, and names no quantity of a subject; the subjects register themselves (ci/<name>_subject.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ci import subjects

CI = Path(__file__).resolve().parents[2] / "ci"
CORE = ("results", "stats", "evidence", "compare", "baselines", "report", "subjects")  # what decides verdicts
PLUMBING = ("errors", "cli", "jsonio", "outputs")  # what the core may use besides itself
SUBJECT_WORDS = re.compile(r"marlin|block_size|tpot|vllm|\bmoe\b|expert", re.IGNORECASE)


def _imports(module: str) -> set[str]:
    tree = ast.parse((CI / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ci":
            found |= {node.module} if node.module != "ci" else {f"ci.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ci"}
    return found


def test_the_core_imports_only_itself_and_its_plumbing():
    allowed = {f"ci.{m}" for m in (*CORE, *PLUMBING)} | {"ci"}
    for module in CORE:
        assert _imports(module) <= allowed, f"ci/{module}.py imports {sorted(_imports(module) - allowed)}"


def test_the_core_names_no_subjects_quantity():
    for module in CORE:
        text = (CI / f"{module}.py").read_text()
        assert not SUBJECT_WORDS.findall(text), f"ci/{module}.py names {sorted(set(SUBJECT_WORDS.findall(text)))}"


def test_the_subjects_are_found_by_their_modules_names():
    on_disk = {p.stem for p in CI.glob(f"*{subjects.SUBJECT_SUFFIX}.py")}
    assert on_disk == {"kernel_subject", "serving_subject"}
    assert {"kernel-bench", "tpot-bench"} <= set(subjects.kinds())


def test_a_fresh_process_finds_the_subjects_without_being_told():
    """The other tests import the subjects themselves; a process that imports only the core must find them."""
    import subprocess
    import sys

    code = "from ci import subjects; print(' '.join(subjects.kinds()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=CI.parent)
    assert done.stdout.split() == ["kernel-bench", "tpot-bench"]
