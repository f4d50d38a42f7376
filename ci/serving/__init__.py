"""The end-to-end serving subject: ``vllm serve`` from each tree, ``vllm bench serve`` against it, TPOT
(``python -m ci.serving.tpot``). ``subject`` registers the results kind ``tpot-bench`` with the core; the
model configs it serves are in ``models/``."""
