"""The tile oracle's analysis: fastest tile and regret per case, the fitted rule, the shipped change agrees."""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path

import pytest

from ci.core.errors import DataError, UsageError
from ci.kernel import tile_oracle as to
from ci.kernel import tile_sweep as ts
from ci.moe import spec
from ci.trees import contracts

ROOT = Path(__file__).parents[2]
STORED = ROOT / "reports/nvidia-h200-x1/tile-oracle"
H100 = ROOT / "reports/nvidia-h100-x1/tile-oracle"
CHANGE = ROOT / "ci/changes/tile-oracle"


def _case(
    cid: str, r: float, times: dict[int, float], *, split="fitted", itemsize=2, candidate=None, base=64, jitter=0.002
) -> ts.SweepCase:
    """One case whose tile ``t`` takes ``times[t]`` us in each of 6 captures (a capture effect of +-jitter)."""
    caps = range(6)
    samples = {str(t): [x * (1 + jitter * ((b % 3) - 1)) for b in caps] for t, x in times.items()}
    info = {"rows_per_expert": r, "input_itemsize": itemsize, "split": split, "format": "f", "path": "fused"}
    pick = to.threshold_tile(r) if candidate is None else candidate
    return ts.SweepCase(
        id=cid,
        info=info,
        picks={"base": base, "candidate": pick},
        samples=samples,
        captures={t: list(caps) for t in samples},
    )


def _flat(r: float, faster: int | None = None, by: float = 0.0, **kw) -> ts.SweepCase:
    times = {t: 100.0 for t in spec.BLOCK_SIZES_M}
    times[to.threshold_tile(r)] = 100.0
    if faster is not None:
        times[faster] = 100.0 / (1 + by)
    return _case(f"c/r{r}/{faster}/{kw.get('split', 'fitted')}", r, times, **kw)


def _fit(cases, **kw):
    return to.fit_rule([to.case_times(c) for c in cases], **kw)


@pytest.mark.parametrize("m,topk,experts", [(1, 8, 256), (64, 8, 32), (512, 2, 8), (37, 4, 128), (4096, 8, 256)])
def test_threshold_tile_is_the_spec_rule_on_the_load(m, topk, experts):
    assert to.threshold_tile(m * topk / experts) == spec.pick_block_size_m(m, topk, experts)


def test_rule_overrides_only_its_band_and_keeps_the_one_byte_floor():
    rule = to.TileRule(((90.5, 181.0, 48),))
    loads = (2, 8, 64, 90.4, 90.5, 128, 180.9, 181, 512)
    assert [rule.pick(r, 2) for r in loads] == [8, 16, 64, 64, 48, 48, 48, 64, 64]
    assert rule.pick(2, 1) == 16 and to.TileRule().pick(2, 1) == 16 and to.TileRule().pick(128, 2) == 64


def test_fit_overrides_a_bucket_only_for_a_gain_over_min_gain():
    cases = [_flat(128, 48, 0.04), _flat(128, 48, 0.05), _flat(4, 16, 0.005), _flat(4, 16, 0.004)]
    rule, evidence = _fit(cases)
    assert rule.overrides == ((90.5, 181.0, 48),)
    by_load = {e["load"]: e for e in evidence}
    assert by_load[128]["best_tile"] == 48 and by_load[128]["override"] == 48
    assert math.isclose(by_load[128]["gain"], math.exp((math.log(1.04) + math.log(1.05)) / 2) - 1, rel_tol=1e-9)
    assert by_load[4]["override"] is None and by_load[4]["threshold_tiles"] == [8]
    assert _fit(cases, min_gain=0.06)[0].overrides == ()


def test_fit_merges_neighbouring_buckets_and_sees_fitted_cases_only():
    rule, _ = _fit([_flat(128, 48, 0.05), _flat(256, 48, 0.05)])
    assert rule.overrides == ((90.5, 362.0, 48),)
    data = to.analyse(
        ts.Sweep(
            grid="g", provenance={}, settings={}, cases=[_flat(128, 48, 0.05), _flat(8, 32, 0.5, split="held-out")]
        )
    )
    assert [list(o) for o in data["rule"]["overrides"]] == [[90.5, 181.0, 48]]
    with pytest.raises(DataError, match="no fitted cases"):
        to.fit_rule([])


def test_fit_respects_the_one_byte_floor():
    # tile 8 would be fastest, but a 1-byte input runs 16 at least: no override to a tile it cannot run
    case = _case("c/fp8", 2, {8: 50.0, 16: 100.0, 32: 120.0}, itemsize=1, candidate=16)
    rule, evidence = _fit([case])
    assert rule.overrides == () and evidence[0]["best_tile"] == 8 and evidence[0]["gain"] == 0.0


def test_one_byte_inputs_are_fitted_apart_and_untimed_widths_keep_the_thresholds():
    # 16-bit inputs want 48 at r = 128; 1-byte inputs (W4A8) want 64 there (48 is 3% slower) and 32 at r = 32
    wide = [_flat(128, 48, 0.05), _flat(128, 48, 0.04)]
    narrow = [_case(f"w4a8/{i}", 128, {48: 103.0, 64: 100.0}, itemsize=1) for i in range(2)]
    narrow += [_case("w4a8/r32", 32, {32: 95.0, 48: 100.0, 64: 110.0}, itemsize=1)]
    rule, evidence = _fit(wide + narrow)
    assert rule.overrides == ((90.5, 181.0, 48),) and rule.one_byte_overrides == ((22.6, 45.3, 32),)
    assert (rule.pick(128, 2), rule.pick(128, 1), rule.pick(32, 1), rule.pick(32, 2)) == (48, 64, 32, 48)
    assert {(e["inputs"], e["load"], e["override"]) for e in evidence} == {
        ("16-bit", 128, 48),
        ("8-bit", 128, None),
        ("8-bit", 32, 32),
    }
    only_wide, _ = _fit(wide)
    assert only_wide.one_byte_overrides == () and only_wide.pick(128, 1) == 64
    sweep = ts.Sweep(grid="g", provenance={}, settings={"captures": 6}, cases=wide)
    data = to.analyse(sweep)
    report = to.render(sweep, to.TileRule(**data["rule"]), data["buckets"], data["summary"], data["cases"])
    assert "| 16-bit | 90.5 | 181 | 48 |" in report and "Not timed: 8-bit inputs" in report


def test_regret_and_summary_name_the_fitted_gain_where_picks_differ():
    slow64 = _flat(128, 48, 0.10)
    same = _flat(8, None)
    ct = to.case_times(slow64)
    assert ct.best == 48 and ct.regret(48).ratio == 1.0
    e = ct.regret(64)
    assert math.isclose(e.ratio, 1.10, rel_tol=1e-6) and e.ci_low <= e.ratio <= e.ci_high
    rule = to.TileRule(((90.5, 181.0, 48),))
    (row,) = to.summarize([ct, to.case_times(same)], rule)
    assert row["cases"] == 2 and row["differ"] == 1
    assert math.isclose(row["differ_speedup_geomean"], 0.10, rel_tol=1e-6)
    assert math.isclose(row["candidate_worst"], 0.10, rel_tol=1e-6) and row["fitted_worst"] == 0.0


def test_tiles_timed_in_different_capture_counts_are_a_data_error():
    case = _flat(8)
    case.samples["8"], case.captures["8"] = case.samples["8"][:3], [0, 1, 2]
    with pytest.raises(DataError, match="different numbers of captures"):
        to.case_times(case)


def test_cli_reads_the_gzip_writes_both_files_and_refuses_foreign_ones(tmp_path):
    sweep = ts.Sweep(
        grid="g",
        provenance={"vllm": {"version": "0.25.1"}},
        settings={"captures": 6},
        cases=[_flat(128, 48, 0.05), _flat(8)],
    )
    plain = tmp_path / "s.json"
    sweep.save(plain)
    gz = tmp_path / "s.json.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    out = tmp_path / "out"
    assert to.main(["--sweep", str(gz), "--out", str(out)]) == 0
    report = (out / to.REPORT_FILE).read_text()
    assert "| 90.5 | 181 | 48 |" in report and "vLLM 0.25.1" in report
    assert json.loads((out / to.ORACLE_FILE).read_text())["kind"] == to.KIND
    assert to.main(["--sweep", str(plain), "--out", str(out)]) == 0  # its own files: rewritten
    (out / to.REPORT_FILE).write_text("my notes\n")
    with pytest.raises(UsageError, match="not written by the tile oracle"):
        to.main(["--sweep", str(plain), "--out", str(out)])
    assert (out / to.REPORT_FILE).read_text() == "my notes\n"
    with pytest.raises(UsageError, match="no such file"):
        to.main(["--sweep", str(tmp_path / "none.json"), "--out", str(out)])
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b'{"kind": "other"}'))
    with pytest.raises(DataError, match=r"expected a .marlin-tile-sweep. file, found kind=.other."):
        to.main(["--sweep", str(bad), "--out", str(tmp_path / "o2")])


@pytest.mark.parametrize(
    "vllm,label",
    [
        ({"version": "0.25.1", "contract": {"name": "marlin-ep-m-estimate"}}, "#48144"),
        ({"version": "0.25.1", "contract": {"name": "tile-oracle"}}, "`tile-oracle`"),
        ({"version": "0.26.0"}, "candidate (no change recorded)"),
    ],
)
def test_the_report_names_the_rule_the_candidate_build_ran(vllm, label):
    """A sweep made with ``--change tile-oracle`` timed that rule's picks: its columns must not say #48144."""
    sweep = ts.Sweep(grid="g", provenance={"vllm": vllm}, settings={"captures": 6}, cases=[_flat(128, 48, 0.05)])
    data = to.analyse(sweep)
    report = to.render(sweep, to.TileRule(**data["rule"]), data["buckets"], data["summary"], data["cases"])
    assert data["sweep"]["candidate"] == label
    assert f"| base | {label} | fitted | picks differ | fitted vs {label} there" in report
    assert f"the candidate build's picks are {label}'s" in report
    assert f"Where the fitted pick is not {label}'s" in report


def _stored_sweep() -> Path:
    found = sorted(STORED.glob("tile-sweep*.json.gz"))
    assert found, f"no stored sweep in {STORED}"
    return found[-1]


def test_the_shipped_change_is_the_rule_fitted_on_the_stored_sweep():
    data = to.analyse(to.read_sweep(_stored_sweep()))
    ((lo, hi, tile),) = data["rule"]["overrides"]
    contract = contracts.load_contract(CHANGE / contracts.CONTRACT_FILE)
    assert contract.name == "tile-oracle" and contract.rules == ["fused_block_size_m", "batched_block_size_m"]
    src = (CHANGE / contracts.CONTRACT_FILE).read_text()
    assert f"OVERRIDE_FROM, OVERRIDE_BELOW, OVERRIDE_TILE = {lo}, {hi}, {tile}" in src
    for patch in (CHANGE / "change.patch", CHANGE / "releases/vllm-0.26.0.patch"):
        added = "".join(line[1:] for line in patch.read_text().splitlines(keepends=True) if line.startswith("+"))
        assert re.search(
            rf"if {lo} <= tokens_per_expert < {hi} and not one_byte_input:\n\s+block_size_m = {tile}\n", added
        ), patch
        assert "one_byte_input = input_dtype is not None and input_dtype.itemsize == 1\n" in added, patch


def test_the_h100_sweep_fits_the_same_band_and_keeps_64_for_one_byte_inputs():
    """MXFP4, GPTQ int8 and W4A8 on an H100 (none of them in the H200 fit): the 16-bit inputs want the same
    48-row band, the 1-byte ones (W4A8) no override, which the shipped contract follows."""
    data = to.analyse(to.read_sweep(next(H100.glob("tile-sweep*.json.gz"))))
    assert [list(o) for o in data["rule"]["overrides"]] == [[90.5, 181.0, 48]]
    assert list(data["rule"]["one_byte_overrides"]) == []
    (w4a8,) = [e for e in data["buckets"] if e["inputs"] == "8-bit" and e["load"] == 128]
    assert w4a8["threshold_tiles"] == [64] and w4a8["best_tile"] == 64
    rule = contracts.load_contract(CHANGE / contracts.CONTRACT_FILE).fused_block_size_m
    kw = {"m": 512, "topk": 2, "local_experts": 8, "global_experts": -1, "env": {}}
    assert (rule(input_itemsize=2, **kw), rule(input_itemsize=1, **kw)) == (48, 64)


@pytest.mark.parametrize(
    "m,topk,local,glob,itemsize,want",
    [
        (8 * 64, 2, 1, 8, 2, 48),  # mixtral EP 8, 64 tokens per rank: r = ceil(512 / 8) * 2 / 1 = 128
        (8 * 512, 2, 1, 8, 2, 64),  # mixtral EP 8, 512 tokens per rank: r = 1024
        (512, 2, 8, -1, 2, 48),  # non-EP, r = 128
        (512, 2, 8, 8, 2, 48),  # non-EP as the modular kernel calls it (G == E)
        (256, 2, 8, -1, 2, 64),  # r = 64: #48144's 64
        (8 * 256, 8, 16, 128, 2, 48),  # qwen3 EP 8, 256 tokens per rank: r = ceil(2048 * 16 / 128) * 8 / 16 = 128
        (8 * 32, 8, 32, 256, 1, 16),  # deepseek EP 8, 32 tokens per rank, 1-byte input: 8 floored to 16
        (512, 2, 8, -1, 1, 64),  # non-EP, r = 128, 1-byte input (W4A8): #48144's 64, no override
    ],
)
def test_contract_rule_fused(m, topk, local, glob, itemsize, want):
    rule = contracts.load_contract(CHANGE / contracts.CONTRACT_FILE).fused_block_size_m
    assert rule(m=m, topk=topk, local_experts=local, global_experts=glob, input_itemsize=itemsize, env={}) == want


def test_contract_rule_batched_is_keyed_on_the_load():
    rule = contracts.load_contract(CHANGE / contracts.CONTRACT_FILE).batched_block_size_m
    kw = {"num_dispatchers": 8, "global_experts": 256, "local_experts": 32, "input_itemsize": 2, "env": {}}
    assert rule(capacity=1024, assignments=8, **kw) == 8  # 1 token x topk 8 per rank: 1 row per expert
    assert rule(capacity=1024, assignments=8 * 32, **kw) == 16  # 8 rows per expert
    assert rule(capacity=1024, assignments=None, **kw) == 64  # a direct caller: the capacity, as before
    assert rule(capacity=128, assignments=None, **kw) == 48  # capacity 128 is in the override band
    assert rule(capacity=128, assignments=None, **{**kw, "input_itemsize": 1}) == 64  # not for 1-byte inputs


def test_where_picks_differ_is_per_split_and_path_and_over_all():
    rows = [
        {
            "split": "fitted",
            "path": "fused",
            "candidate": {"tile": 64, "regret": 0.05},
            "fitted": {"tile": 48, "regret": 0.0},
        },
        {
            "split": "held-out",
            "path": "batched",
            "candidate": {"tile": 64, "regret": 1.0},
            "fitted": {"tile": 8, "regret": 0.0},
        },
        {
            "split": "held-out",
            "path": "fused",
            "candidate": {"tile": 16, "regret": 0.0},
            "fitted": {"tile": 16, "regret": 0.0},
        },
    ]
    got = {(d["split"], d["path"]): d for d in to.where_picks_differ(rows)}
    assert set(got) == {
        ("fitted", "fused"),
        ("held-out", "batched"),
        ("all", "fused"),
        ("all", "batched"),
        ("all", "all"),
    }
    assert got[("all", "all")]["cases"] == 2
    assert math.isclose(got[("all", "all")]["speedup_geomean"], math.sqrt(1.05 * 2.0) - 1)
    assert math.isclose(got[("all", "all")]["speedup_least"], 0.05)
