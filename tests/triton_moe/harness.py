"""What the Triton fused-MoE tests share: the batch sizes they try, and a tuned table read as vLLM reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci.triton_moe import spec

ROWS = (1, 2, 3, 4, 5, 8, 9, 16, 17, 20, 21, 24, 32, 33, 40, 41, 48, 64, 65, 96, 97, 128, 129, 256, 512, 513, 1024,
        1536, 3000, 4096, 8192)  # fmt: skip


def read_table(path: Path) -> dict[int, dict] | None:
    """A tuned table as vLLM reads it: batch size -> config, without its triton_version (None: no file)."""
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    raw.pop("triton_version", None)
    return {int(size): config for size, config in raw.items()}


def require_specified_release(trees) -> None:
    """Skip, saying why, on a release the spec is not written from: its rules may differ (0.33.0's do)."""
    version = trees.manifest.vllm_version
    if version not in spec.SPEC_OF:
        pytest.skip(f"ci.triton_moe.spec is vLLM {', '.join(spec.SPEC_OF)}'s config choice; this tree is vLLM "
                    f"{version}: the subject follows it once the spec has its rules")  # fmt: skip


def on_device(fused_moe, monkeypatch, device: str) -> None:
    """The platform's answers for ``device`` (this machine has none): its name, CUDA (the WNA16 rule asks) and
    its FP8 type; the tuned tables read again."""
    import torch

    platform = fused_moe.current_platform
    monkeypatch.setattr(platform, "get_device_name", lambda device_id=0: device, raising=False)
    monkeypatch.setattr(platform, "is_cuda", lambda: True, raising=False)
    monkeypatch.setattr(platform, "is_rocm", lambda: False, raising=False)
    monkeypatch.setattr(platform, "fp8_dtype", lambda: torch.float8_e4m3fn, raising=False)
    fused_moe.get_moe_configs.cache_clear()
