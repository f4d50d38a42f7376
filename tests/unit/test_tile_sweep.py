"""The tile sweep's CPU side: its grid and order, its dataset checks, resume refusal and timing schedule."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from ci.core.errors import DataError, UsageError
from ci.kernel import tile_sweep as ts
from ci.kernel.suites import runnable_block_sizes

SETTINGS = {
    "captures": 6,
    "rounds": 1,
    "calls_per_graph": 10,
    "vllm": "0.25.1",
    "patch_sha256": "ab",
    "case_filter": None,
}
STORED = Path(__file__).parents[2] / "reports/nvidia-h200-x1/tile-oracle/tile-sweep-partial.json.gz"


def _case(cid: str = "s/ep1/tpr1/x", tiles=(8, 16)) -> ts.SweepCase:
    return ts.SweepCase(
        id=cid,
        info={"shape": "s"},
        picks={"base": 8, "candidate": 16},
        samples={str(t): [10.0 + t] * 6 for t in tiles},
        captures={str(t): list(range(6)) for t in tiles},
    )


def test_full_grid_covers_every_format_ep_size_load_and_shape():
    cases = ts.grid_cases("full")
    fused = [c for c in cases if c.path == "fused"]
    assert len({c.id for c in cases}) == len(cases) == 1056 + 34
    assert len(fused) == 4 * 6 * 4 * 11
    assert {c.shape_name for c in fused} == set(ts.FITTED_SHAPES + ts.HELD_OUT_SHAPES)
    assert {c.ep for c in fused} == set(ts.EP_SIZES)
    assert {c.tokens_per_rank for c in fused} == set(ts.DECODE_LOADS)
    assert "gpt-oss-mxfp4" in {c.quant for c in fused if c.shape_name == "gpt-oss-120b"}
    assert "mxfp4" not in {c.quant for c in fused if c.shape_name == "gpt-oss-120b"}
    assert {c.capacity for c in cases if c.path == "batched"} == set(ts.BATCHED_CAPACITIES)
    assert all(c.tokens_per_rank <= c.per_dispatcher for c in cases if c.path == "batched")


def test_order_puts_formats_first_and_keeps_one_weight_set_together():
    cases = ts.grid_cases("full")
    groups = [(c.quant, c.ep, c.shape_name, c.path) for c in cases]
    runs = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
    assert len(runs) == len(set(runs))  # each weight set is made once
    fmts = list(dict.fromkeys("mxfp4" if c.quant == "gpt-oss-mxfp4" else c.quant for c in cases))
    assert fmts == list(ts.SWEEP_FORMATS)
    first_int4 = [c for c in cases if c.quant == ts.INT4][: 4 * 11]
    assert {c.ep for c in first_int4} == {8} and len({c.shape_name for c in first_int4}) == 4


def test_case_filter_and_unknown_grid_are_usage_errors():
    assert [c.id for c in ts.grid_cases("quick", "*/ep8/tpr1/gptq*,*/ep8/tpr1/nvfp4*")] == [
        "qwen3-30b-a3b/ep8/tpr1/gptq-int4-g128/bf16",
        "qwen3-30b-a3b/ep8/tpr1/nvfp4/bf16",
    ]
    with pytest.raises(UsageError, match="matches no case"):
        ts.grid_cases("quick", "nothing*")
    with pytest.raises(UsageError, match="unknown"):
        ts.grid_cases("huge")


def test_case_info_is_the_load_one_expert_sees():
    case = next(c for c in ts.grid_cases("full") if c.id == "deepseek-v3/ep8/tpr64/gptq-int4-g128/bf16")
    info = ts.case_info(case, 32)
    assert info["rows"] == 512 and info["rows_per_expert"] == 512 * 8 / 256 and info["split"] == "fitted"
    held = next(c for c in ts.grid_cases("full") if c.shape_name == "mixtral-8x7b")
    assert ts.case_info(held, 8)["split"] == "held-out"


def test_dataset_round_trip_and_resume(tmp_path):
    path = tmp_path / ts.SWEEP_FILE
    sweep = ts.Sweep(grid="quick", provenance={}, settings=dict(SETTINGS), cases=[_case()])
    sweep.save(path)
    again = ts.resumable(path, "quick", dict(SETTINGS))
    assert again.done() == {"s/ep1/tpr1/x"} and again.cases[0].tiles() == [8, 16]
    assert ts.resumable(tmp_path / "none.json", "quick", SETTINGS) is None


@pytest.mark.parametrize("grid, change", [("full", {}), ("quick", {"captures": 8}), ("quick", {"vllm": "0.26.0"})])
def test_resume_refuses_another_sweep_and_changes_nothing(tmp_path, grid, change):
    path = tmp_path / ts.SWEEP_FILE
    ts.Sweep(grid="quick", provenance={}, settings=dict(SETTINGS), cases=[_case()]).save(path)
    before = path.read_bytes()
    with pytest.raises(UsageError, match="another sweep"):
        ts.resumable(path, grid, {**SETTINGS, **change})
    assert path.read_bytes() == before


def test_resume_refuses_another_gpu_model_and_changes_nothing(tmp_path):
    def gpu(*names):
        return {"count": len(names), "gpus": [{"index": i, "name": n} for i, n in enumerate(names)]}

    path = tmp_path / ts.SWEEP_FILE
    sweep = ts.Sweep(grid="quick", provenance={"gpu": gpu("NVIDIA H200")}, settings=dict(SETTINGS), cases=[_case()])
    sweep.save(path)
    before = path.read_bytes()
    ts.check_same_gpu(path, sweep, gpu("NVIDIA H200"))  # another H200 of the same model resumes it
    ts.check_same_gpu(path, sweep, gpu("NVIDIA H200", "NVIDIA H100 80GB HBM3"))  # the sweep times on the first
    for other in (gpu("NVIDIA H100 80GB HBM3"), gpu(), gpu("NVIDIA H100 80GB HBM3", "NVIDIA H200")):
        with pytest.raises(UsageError, match="started on NVIDIA H200, this machine times on") as err:
            ts.check_same_gpu(path, sweep, other)
        assert "nothing was changed" in str(err.value)
    with pytest.raises(UsageError, match="this machine times on no GPU"):
        ts.check_same_gpu(path, sweep, gpu())
    with pytest.raises(UsageError, match="started on an unknown GPU, this machine times on NVIDIA H200"):
        ts.check_same_gpu(path, dataclasses.replace(sweep, provenance={}), gpu("NVIDIA H200"))
    assert path.read_bytes() == before
    stored = ts.load_sweep(STORED)
    assert ts.timing_gpu(stored.provenance["gpu"]) == "NVIDIA H200"


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda c: c.update(samples={}), "samples and captures"),
        (lambda c: c["captures"].update({"8": [0]}), "one capture id each"),
        (lambda c: c["samples"].update({"8": [1.0, -2.0, 1, 1, 1, 1]}), "positive"),
        (lambda c: c.update(picks={"base": "8"}), "picks"),
        (lambda c: c.update(info=None), "info"),
    ],
)
def test_bad_cases_are_data_errors(tmp_path, edit, match):
    path = tmp_path / ts.SWEEP_FILE
    ts.Sweep(grid="quick", provenance={}, settings=dict(SETTINGS), cases=[_case()]).save(path)
    payload = json.loads(path.read_text())
    edit(payload["cases"][0])
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError, match=match):
        ts.load_sweep(path)
    with pytest.raises(UsageError, match="not a sweep this stage can resume"):
        ts.resumable(path, "quick", SETTINGS)


def test_duplicate_cases_are_refused(tmp_path):
    path = tmp_path / ts.SWEEP_FILE
    ts.Sweep(grid="quick", provenance={}, settings=dict(SETTINGS), cases=[_case(), _case()]).save(path)
    with pytest.raises(DataError, match="duplicate"):
        ts.load_sweep(path)


class _FakeRunner:
    """Stands in for ci.kernel.graphs.CaseRunner: records the schedule, times a tile as its own number."""

    def __init__(self, case):
        self.case, self.events = case, []

    def start_capture(self, b, pad):
        self.events.append(("capture", b))
        return object()

    def capture(self, module, forced_bm):
        self.events.append(("graph", forced_bm))
        return forced_bm

    def time_us(self, graph):
        self.events.append(("time", graph))
        return float(graph)


def test_time_tiles_times_every_tile_in_every_capture_and_is_seeded():
    case = ts.grid_cases("quick")[0]
    tiles = runnable_block_sizes(case)
    runner = _FakeRunner(case)
    samples, caps = ts.time_tiles(runner, None, tiles, captures=6, rounds=2)
    assert set(samples) == {str(t) for t in tiles}
    assert all(samples[str(t)] == [float(t)] * 12 for t in tiles)
    assert all(caps[str(t)] == [b for b in range(6) for _ in range(2)] for t in tiles)
    assert sum(e[0] == "graph" for e in runner.events) == 6 * len(tiles)  # fresh graphs every capture
    again = _FakeRunner(case)
    ts.time_tiles(again, None, tiles, captures=6, rounds=2)
    assert again.events == runner.events


def test_cli_refuses_too_few_captures_and_a_file_as_out(tmp_path):
    with pytest.raises(UsageError, match="at least 6 captures"):
        ts.main(["--manifest", "m.json", "--captures", "5", "--out", str(tmp_path)])
    with pytest.raises(UsageError, match="pass a folder"):
        ts.main(["--manifest", "m.json", "--out", str(tmp_path / "x.json")])
    with pytest.raises(UsageError, match="positive"):
        ts.main(["--manifest", "m.json", "--budget-s", "0", "--out", str(tmp_path)])


def test_stored_partial_sweep_is_a_valid_dataset_of_the_full_grid(tmp_path):
    path = tmp_path / ts.SWEEP_FILE
    path.write_bytes(gzip.decompress(STORED.read_bytes()))
    sweep = ts.load_sweep(path)
    full = {c.id for c in ts.grid_cases("full")}
    assert sweep.grid == "full" and sweep.done() <= full and len(sweep.done()) == 551
    assert sweep.provenance["device"]["name"] == "NVIDIA H200"
    assert all(set(c.picks) == {"base", "candidate"} for c in sweep.cases)
