"""The output names of ci/host/outputs.py are the ones the noxfile and the workflows use."""

from __future__ import annotations

import re
from pathlib import Path

from ci.core import compare
from ci.host import outputs

ROOT = Path(__file__).resolve().parents[2]


def test_the_workflows_read_the_stages_outputs_by_their_names():
    """Every `.gate/out/...` file a workflow names is one a stage writes under that name."""
    names = {
        outputs.KERNEL_RESULTS,
        outputs.TPOT_RESULTS,
        outputs.SUITE_JUNIT,
        outputs.SUITE_SUMMARY,
        *outputs.VERDICT,
        *outputs.NIGHTLY,
    }
    found = []
    for yml in sorted((ROOT / ".github").rglob("*.yml")):
        for path in re.findall(r"\.gate/out/[\w./-]+\.(?:json|xml|md|png)", yml.read_text()):
            found.append(path)
            assert Path(path).name in names, f"{yml.name} reads {path}, which no stage writes (ci/host/outputs.py)"
    assert found, "no workflow reads a stage's output: the pattern above no longer matches them"


def test_the_stages_use_the_names():
    text = (ROOT / "noxfile.py").read_text()
    assert "kernel-results.json" not in text and "tpot-results.json" not in text and "'junit.xml'" not in text
    assert compare.OUTPUT_FILES == outputs.VERDICT == ("verdict.json", "report.md", "plot.png")
    assert outputs.OUT_DIR == ".gate/out"
