"""vLLM's real ``fused_experts_impl`` (the Triton fused-MoE path), with its kernel launches, the aligner, the
activation quantization and ``moe_sum`` replaced by spies: the config each launch gets, under EP and without.

The tensors live on PyTorch's ``meta`` device (shapes, no storage: a full-size model costs nothing) and every
CUDA or Triton call is a spy, so the base tree's own Python runs on any machine. Each call must launch both
GEMMs with the config the spec (``ci.triton_moe.spec``) gives for ``M = hidden_states.size(0)``, and hand the
aligner the same ``BLOCK_SIZE_M`` and the global expert count. Under EP that ``M`` is every rank's padded rows,
while one rank's experts see about ``ceil(M * E / G)`` of them: the table at the end counts where the two
would pick different configs, the exposure a change of the rule would act on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ci.moe.shapes import MODELS
from ci.triton_moe import spec
from tests.triton_moe.harness import (
    DEVICE,
    ROWS,
    SCHEMES,
    call_meta,
    read_table,
    require_specified_release,
    spy_launches,
    weight_shapes,
)


@pytest.fixture
def spied(trees, monkeypatch):
    """The base tree's fused_moe module with its kernels, aligner and quantization spied; the calls they saw."""
    rules = require_specified_release(trees)
    from vllm.model_executor.layers.fused_moe import fused_moe as fm

    calls = spy_launches(fm, monkeypatch)
    yield fm, calls, rules
    fm.get_moe_configs.cache_clear()


def test_each_launch_gets_the_specified_config_and_the_aligner_the_same_tile(spied):
    fm, calls, rules = spied
    own = Path(fm.__file__).parent / "configs"
    checked, exposed, points = 0, 0, 0
    for name, model in MODELS.items():
        for ep in (1, 2, 8):
            if model.experts % ep:
                continue
            local = model.experts // ep
            for dtype, block, flags in SCHEMES:
                w1_shape, w2_shape = shapes = weight_shapes(local, model.hidden, model.intermediate, dtype)
                name_of_table = spec.config_file_name(*spec.table_shape(w2_shape, dtype), dtype, block, DEVICE)
                table = read_table(own / name_of_table)
                for m in ROWS:
                    calls.clear()
                    out = call_meta(fm, m, shapes, model.hidden, model.topk, ep, flags, model.experts, block)
                    want = spec.expected_config(
                        w1_shape, w2_shape, model.topk, dtype, m, block, tables=[table], rules=rules
                    )
                    where = f"{name}/ep{ep} {dtype} {block} M={m}"
                    assert tuple(out.shape) == (m, model.hidden), where
                    (align,) = [c for c in calls if c[0] == "align"]
                    gemms = [c for c in calls if c[0] == "gemm"]
                    assert [g[1] for g in gemms] == [want, want], f"{where}: launched with {gemms}, spec {want}"
                    assert align[1] == want["BLOCK_SIZE_M"], f"{where}: aligner tile {align[1]}, kernels {want}"
                    assert align[2] == (model.experts if ep > 1 else local) and align[3] == (ep > 1), where
                    checked += 1
                    if ep > 1:
                        seen = spec.rows_one_rank_sees(m, local, model.experts)
                        other = spec.expected_config(
                            w1_shape, w2_shape, model.topk, dtype, seen, block, tables=[table], rules=rules
                        )
                        points += 1
                        exposed += other != want
    assert checked == sum(len(SCHEMES) * len(ROWS) for m in MODELS.values() for ep in (1, 2, 8) if m.experts % ep == 0)
    # under EP the config for the padded M and the one for the rows a rank's experts see differ at many points:
    # what a change of the rule would act on (the subject's bench measures which is faster)
    assert 0 < exposed < points
