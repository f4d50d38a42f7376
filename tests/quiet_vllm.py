"""vLLM's import-time messages that say nothing on a machine the CPU tier runs on (no CUDA, no Triton), kept
out of the tier's output: a logging filter, installed through vLLM's own VLLM_LOGGING_CONFIG_PATH (the
config in ``vllm-logging.json`` beside this file is vLLM's default, with the standard formatter and this
filter added)."""

from __future__ import annotations

import logging

HARMLESS = (
    "Failed to import Triton kernels",  # fused_moe/config.py: no Triton on a CPU machine
    "Failed to import from vllm._C",  # platforms: the CUDA kernels library does not load without CUDA
    "Triton not installed or not compatible",
    "uv binary not found",
)


class HarmlessImportMessages(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(HARMLESS)
