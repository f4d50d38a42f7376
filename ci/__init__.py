"""The EP-Marlin gate: build vLLM trees, test, benchmark, compare, report.

One module per stage: ``build`` (vLLM under test), ``variants`` (import base and
candidate side by side), ``spec`` (the block-size rule as specified), ``bench`` (kernel
timing), ``stats`` (pure statistics), ``compare`` (verdicts), ``baselines`` (stored
results), ``report`` (Markdown, JSON, PNG), ``tpot`` (end-to-end serving), ``gpu``
(device checks and fingerprints).
"""
