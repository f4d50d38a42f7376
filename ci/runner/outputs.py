"""The names of the files the stages write, in one place (standard library only: the noxfile imports it).

A stage writes under the folder it is given (``--out``, default ``.gate/out/<session>``); the sessions that
read a stage's output (``gate``, ``update_baselines``) and the workflows take these names from here, not
from a copy of their own (``tests/unit/test_outputs.py`` checks the workflows).
"""

from __future__ import annotations

OUT_DIR = ".gate/out"
KERNEL_RESULTS = "kernel-results.json"  # ci.kernel.bench
TPOT_RESULTS = "tpot-results.json"  # ci.serving.tpot
ERROR_RATES = "error-rates"  # ci.kernel.error_rates: a folder (its runs and error-rates.{json,md})
SUITE_JUNIT = "junit.xml"  # the GPU suite (pytest)
SUITE_SUMMARY = "summary.json"  # the GPU suite's summary (tests/conftest.py, --gate-summary)
VERDICT = ("verdict.json", "report.md", "plot.png")  # ci.core.compare.OUTPUT_FILES, in its --out folder
WRITERS = {KERNEL_RESULTS: "nox -s bench", TPOT_RESULTS: "nox -s tpot"}  # the session that writes each
