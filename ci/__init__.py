"""The EP-Marlin gate: build vLLM trees with and without a change, test them, benchmark them, judge.

Packages, by what they know:

- ``ci.core``: results files, statistics, evidence, verdicts, baselines, reports and the subject
  protocol. It judges samples per case and names no subject (``tests/unit/test_core_layering.py``).
- ``ci.trees``: the vLLM trees under test: a release, the change (patch, branch or folder), its
  contract, the two trees and the candidate's modules loaded beside the base's.
- ``ci.kernel``: the Marlin MoE kernel subject: shapes, formats, the block-size rule as specified,
  the inputs of both Marlin paths, the kernel bench and its error rates.
- ``ci.serving``: the end-to-end serving subject: ``vllm serve`` + ``vllm bench serve`` (TPOT).
- ``ci.runner``: the plumbing of a GPU runner: the GPU, its state, processes, trust checks of the
  workflows, job summaries and the one-command GPU verdict.

``docs/layout.md`` has one line per module.
"""
