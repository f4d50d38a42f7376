"""The tile oracle: what a tile sweep (``ci.kernel.tile_sweep``) says about Marlin's ``block_size_m`` rule.

Per case of the sweep, the fastest tile (the lowest median over captures of the per-capture medians) and the
**regret** of a rule: the time of its pick over the time of the fastest tile, minus 1, as the Hodges-Lehmann
estimate over captures with its signed-rank interval (``ci.core.stats.capture_effect``: capture ``b`` of the two
tiles was timed in the same fresh capture). Rules: the base's picks and the candidate's as recorded by the sweep
(their own code ran; the candidate is #48144 unless the sweep was made with another ``--change``, and the tables name
the change the sweep recorded), and the **fitted rule**, a table keyed on the expected rows per expert
``r = M * topk / G`` (the valid load of one expert, both paths):

* the loads of the grid are powers of two; a bucket is one of them, from the geometric midpoint below it to
  the one above (so a threshold sits halfway, in log scale, between two measured loads);
* per bucket, over the *fitted* shapes only (:data:`ci.kernel.tile_sweep.FITTED_SHAPES`, every format and
  both paths pooled), the tile of the least geomean regret; it replaces #48144's tile of that bucket only when
  it is faster by more than :data:`MIN_GAIN` (geomean), so the table does not chase noise;
* 16-bit and 1-byte inputs (FP8, int8 activations: W4A8) are fitted apart (an H100 sweep found W4A8 wanting 64
  where 16-bit inputs want 48); a width the sweep did not time keeps #48144's thresholds;
* 1-byte inputs keep vLLM's floor of 16.

The fitted rule is then judged on the *held-out* shapes, which the fit never saw. Output: ``tile-oracle.json``
(the table, per case the three picks with regrets and intervals) and ``tile-oracle.md`` (the tables).

Usage: ``python -m ci.kernel.tile_oracle --sweep tile-sweep.json[.gz] --out DIR``
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ci.core import stats
from ci.core.cli import run_main
from ci.core.errors import DataError, UsageError
from ci.core.jsonio import write_json
from ci.kernel.tile_sweep import Sweep, SweepCase, load_sweep
from ci.moe import spec

KIND = "marlin-tile-oracle"
SCHEMA_VERSION = 2  # 2: the rule has one_byte_overrides, each bucket its inputs
ORACLE_FILE, REPORT_FILE = "tile-oracle.json", "tile-oracle.md"
MIN_GAIN = 0.01  # a bucket leaves #48144's tile only for a geomean gain above 1%
ONE_BYTE_FLOOR = 16  # vLLM's floor for 1-byte inputs
RULES = ("base", "candidate", "fitted")


def threshold_tile(rows_per_expert: float) -> int:
    """#48144's rule on a load (``ci.moe.spec``): the first tile whose fill ``r / tile`` is under 0.9."""
    for tile in spec.BLOCK_SIZES_M:
        if rows_per_expert / tile < float(spec.SATURATION):
            return tile
    return spec.BLOCK_SIZES_M[-1]


@dataclass(frozen=True)
class TileRule:
    """#48144's thresholds on the expected rows per expert, with fitted overrides: ``(r from, r below, tile)``
    ranges where the sweep found another tile faster, one table for 16-bit inputs (``overrides``) and one for
    1-byte inputs (``one_byte_overrides``: int8/FP8 activations run another kernel, and a sweep may show them
    wanting another tile); 1-byte inputs keep the floor of 16."""

    overrides: tuple[tuple[float, float, int], ...] = ()
    one_byte_overrides: tuple[tuple[float, float, int], ...] = ()

    def pick(self, rows_per_expert: float, input_itemsize: int) -> int:
        tile = threshold_tile(rows_per_expert)
        for lo, hi, t in self.one_byte_overrides if input_itemsize == 1 else self.overrides:
            if lo <= rows_per_expert < hi:
                tile = t
        return max(tile, ONE_BYTE_FLOOR) if input_itemsize == 1 else tile


@dataclass(frozen=True)
class CaseTimes:
    """One sweep case reduced to what the analysis needs: per tile, the median of each capture."""

    id: str
    info: dict
    picks: dict[str, int]
    per_capture: dict[int, list[float]]  # tile -> capture medians, in capture order

    @property
    def rows_per_expert(self) -> float:
        return float(self.info["rows_per_expert"])

    @property
    def itemsize(self) -> int:
        return int(self.info.get("input_itemsize") or 2)

    def median(self, tile: int) -> float:
        return stats.median(self.per_capture[tile])

    @property
    def best(self) -> int:
        return min(self.per_capture, key=lambda t: (self.median(t), t))

    def regret(self, tile: int) -> stats.Effect:
        """time(tile) / time(best) over captures (1.0 exactly when ``tile`` is the best)."""
        best = self.best
        return stats.capture_effect(self.per_capture[best], self.per_capture[tile])


def case_times(case: SweepCase) -> CaseTimes:
    per_capture = {}
    for tile in case.tiles():
        key = str(tile)
        caps = sorted(set(case.captures[key]))
        by_cap = defaultdict(list)
        for x, b in zip(case.samples[key], case.captures[key], strict=True):
            by_cap[b].append(x)
        per_capture[tile] = [stats.median(by_cap[b]) for b in caps]
    lengths = {len(v) for v in per_capture.values()}
    if len(lengths) != 1:
        raise DataError(
            f"case {case.id!r}: tiles were timed in different numbers of captures ({sorted(lengths)}); re-run the case"
        )
    return CaseTimes(id=case.id, info=case.info, picks=dict(case.picks), per_capture=per_capture)


def _floored(tile: int, case: CaseTimes) -> int:
    return max(tile, ONE_BYTE_FLOOR) if case.itemsize == 1 else tile


def load_bucket(rows_per_expert: float) -> int:
    """The grid load (log2) whose bucket holds ``rows_per_expert``: the nearest power of two in log scale."""
    return round(math.log2(rows_per_expert))


def _mean_log_regret(cases: Sequence[CaseTimes], tile_of: Callable[[CaseTimes], int]) -> float:
    return sum(math.log(c.median(tile_of(c)) / c.median(c.best)) for c in cases) / len(cases)


INPUT_WIDTHS = {"16-bit": lambda c: c.itemsize != 1, "8-bit": lambda c: c.itemsize == 1}


def fit_rule(cases: Sequence[CaseTimes], min_gain: float = MIN_GAIN) -> tuple[TileRule, list[dict]]:
    """#48144's thresholds, overridden in each load bucket where, over ``cases``, another tile has a geomean
    regret lower by more than ``min_gain`` (see the module's doc); fitted apart for 16-bit and 1-byte inputs
    (an input width the sweep did not time keeps #48144's thresholds); with the evidence of each bucket."""
    if not cases:
        raise DataError("no fitted cases in the sweep: nothing to fit a rule on")
    tables, evidence = {}, []
    for width, holds in INPUT_WIDTHS.items():
        group = [c for c in cases if holds(c)]
        tables[width], rows = _fit_overrides(group, min_gain) if group else ((), [])
        evidence += [{"inputs": width, **row} for row in rows]
    return TileRule(tables["16-bit"], tables["8-bit"]), evidence


def _fit_overrides(cases: Sequence[CaseTimes], min_gain: float) -> tuple[tuple[tuple[float, float, int], ...], list]:
    buckets: dict[int, list[CaseTimes]] = defaultdict(list)
    for c in cases:
        buckets[load_bucket(c.rows_per_expert)].append(c)
    tiles = sorted({t for c in cases for t in c.per_capture})
    plain = TileRule()
    overrides: list[tuple[float, float, int]] = []
    evidence = []
    for k in sorted(buckets):
        group = buckets[k]
        runnable = [t for t in tiles if all(_floored(t, c) in c.per_capture for c in group)]
        cost = {t: _mean_log_regret(group, lambda c, t=t: _floored(t, c)) for t in runnable}
        current = _mean_log_regret(group, lambda c: plain.pick(c.rows_per_expert, c.itemsize))
        best = min(cost, key=lambda t: (cost[t], t))
        gain = math.exp(current - cost[best]) - 1
        now = sorted({plain.pick(c.rows_per_expert, c.itemsize) for c in group})
        tile = best if gain > min_gain else None
        if tile is not None:
            lo, hi = round(2.0 ** (k - 0.5), 1), round(2.0 ** (k + 0.5), 1)
            if overrides and overrides[-1][1] == lo and overrides[-1][2] == tile:
                lo = overrides.pop()[0]
            overrides.append((lo, hi, tile))
        evidence.append(
            {
                "load": 2.0**k,
                "cases": len(group),
                "threshold_tiles": now,
                "threshold_regret": math.exp(current) - 1,
                "best_tile": best,
                "best_regret": math.exp(cost[best]) - 1,
                "gain": gain,
                "override": tile,
            }
        )
    return tuple(overrides), evidence


def picks_of(case: CaseTimes, rule: TileRule) -> dict[str, int]:
    return {
        "base": case.picks["base"],
        "candidate": case.picks["candidate"],
        "fitted": rule.pick(case.rows_per_expert, case.itemsize),
    }


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summarize(cases: Sequence[CaseTimes], rule: TileRule) -> list[dict]:
    """Per (split, format, path): geomean and worst regret of each rule, and where the fitted pick differs from
    #48144's, the geomean speed-up of the fitted pick and the worst case."""
    groups: dict[tuple, list[CaseTimes]] = defaultdict(list)
    for c in cases:
        groups[(c.info["split"], c.info["format"], c.info["path"])].append(c)
    rows = []
    for (split, fmt, path), group in sorted(groups.items()):
        row = {"split": split, "format": fmt, "path": path, "cases": len(group)}
        for name in RULES:
            ratios = [c.median(picks_of(c, rule)[name]) / c.median(c.best) for c in group]
            row[f"{name}_geomean"], row[f"{name}_worst"] = geomean(ratios) - 1, max(ratios) - 1
        differ = [c for c in group if picks_of(c, rule)["fitted"] != c.picks["candidate"]]
        speedups = [c.median(c.picks["candidate"]) / c.median(picks_of(c, rule)["fitted"]) for c in differ]
        row["differ"] = len(differ)
        row["differ_speedup_geomean"] = geomean(speedups) - 1 if differ else None
        row["differ_worst"] = min(speedups) - 1 if differ else None
        rows.append(row)
    return rows


def case_rows(cases: Sequence[CaseTimes], rule: TileRule) -> list[dict]:
    out = []
    for c in cases:
        picks = picks_of(c, rule)
        regrets = {}
        for name, tile in picks.items():
            e = c.regret(tile)
            regrets[name] = {
                "tile": tile,
                "regret": round(e.ratio - 1, 5),
                "ci": [round(e.ci_low - 1, 5), round(e.ci_high - 1, 5)],
            }
        out.append(
            {
                "id": c.id,
                "split": c.info["split"],
                "format": c.info["format"],
                "path": c.info["path"],
                "rows_per_expert": c.rows_per_expert,
                "best": c.best,
                **regrets,
            }
        )
    return out


def where_picks_differ(rows: Sequence[dict]) -> list[dict]:
    """Per (split, path), and over all: the cases where the fitted pick is not #48144's, the geomean speed-up of
    the fitted pick there (time of #48144's pick / time of the fitted pick - 1) and the least of them."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r["fitted"]["tile"] != r["candidate"]["tile"]:
            speedup = (1 + r["candidate"]["regret"]) / (1 + r["fitted"]["regret"])
            for key in ((r["split"], r["path"]), ("all", r["path"]), ("all", "all")):
                groups[key].append(speedup)
    return [
        {"split": split, "path": path, "cases": len(v), "speedup_geomean": geomean(v) - 1, "speedup_least": min(v) - 1}
        for (split, path), v in sorted(groups.items())
    ]


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x * 100:+.1f}%"


def _gpu_name(prov: dict) -> str:
    gpus = (prov.get("gpu") or {}).get("gpus") or [{}]
    return f"{len(gpus)} x {gpus[0].get('name', 'unknown GPU')}"


def _vllm_version(prov: dict) -> str:
    vllm = prov.get("vllm")
    return str(vllm.get("version", "?")) if isinstance(vllm, dict) else str(vllm)


def candidate_label(prov: dict) -> str:
    """The rule the sweep's candidate build ran, from the contract its provenance records: ``#48144`` for the
    gate's #48144 change, else the change's name (a sweep made with ``--change tile-oracle`` times that rule's
    picks, not #48144's)."""
    vllm = prov.get("vllm")
    contract = vllm.get("contract") if isinstance(vllm, dict) else None
    name = contract.get("name") if isinstance(contract, dict) else None
    if not name:
        return "candidate (no change recorded)"
    return "#48144" if name == spec.CHANGE_48144 else f"`{name}`"


def render(sweep: Sweep, rule: TileRule, evidence: list[dict], summary: list[dict], rows: list[dict]) -> str:
    prov = sweep.provenance
    cand = candidate_label(prov)
    lines = [
        "# Tile oracle",
        "",
        f"Sweep: {len(sweep.cases)} cases, grid `{sweep.grid}`, {_gpu_name(prov)}, vLLM {_vllm_version(prov)}, "
        f"{sweep.settings.get('captures')} captures per tile; the candidate build's picks are {cand}'s.",
        "",
        "## The fitted rule",
        "",
        "#48144's thresholds on the expected rows per expert r = M * topk / G (the first tile of 8, 16, 32, 48, "
        "64 with r / tile < 0.9; 1-byte inputs at least 16), on both paths, with these overrides:",
        "",
        "| inputs | r from | r below | tile |",
        "|---|---:|---:|---:|",
    ]
    table = [("16-bit", o) for o in rule.overrides] + [("8-bit", o) for o in rule.one_byte_overrides]
    lines += [f"| {w} | {lo:g} | {hi:g} | {t} |" for w, (lo, hi, t) in table] or ["| - | - | - | none |"]
    timed = sorted({e["inputs"] for e in evidence})
    untimed = [w for w in INPUT_WIDTHS if w not in timed]
    lines += [
        "",
        f"Per input width and load bucket (fitted shapes): the thresholds' tile and regret, the best tile, its "
        f"regret, and the override (a gain over {MIN_GAIN:.0%} geomean)."
        + (f" Not timed: {', '.join(untimed)} inputs, which keep #48144's thresholds." if untimed else ""),
        "",
        "| inputs | load | cases | thresholds' tile | its regret | best tile | best regret | override |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {e['inputs']} | {e['load']:g} | {e['cases']} | {'/'.join(map(str, e['threshold_tiles']))} | "
        f"{_pct(e['threshold_regret'])} | {e['best_tile']} | {_pct(e['best_regret'])} | "
        f"{e['override'] or '-'} |"
        for e in evidence
    ]
    lines += [
        "",
        "## Regret (time of the pick / time of the fastest tile - 1): geomean / worst",
        "",
        f"| split | format | path | cases | base | {cand} | fitted | picks differ | fitted vs {cand} there "
        "(geomean / worst) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summary:
        lines.append(
            f"| {r['split']} | {r['format']} | {r['path']} | {r['cases']} | "
            + " | ".join(f"{_pct(r[f'{n}_geomean'])} / {_pct(r[f'{n}_worst'])}" for n in RULES)
            + f" | {r['differ']} | {_pct(r['differ_speedup_geomean'])} / "
            f"{_pct(r['differ_worst'])} |"
        )
    lines += [
        "",
        f"Where the fitted pick is not {cand}'s: the fitted pick's speed-up over {cand}'s (geomean, and the "
        "least: negative would be a case it makes slower).",
        "",
        "| split | path | cases | speed-up geomean | least |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [
        f"| {d['split']} | {d['path']} | {d['cases']} | {_pct(d['speedup_geomean'])} | {_pct(d['speedup_least'])} |"
        for d in where_picks_differ(rows)
    ]
    worst = sorted(rows, key=lambda r: -r["fitted"]["regret"])[:5]
    lines += ["", "Worst cases of the fitted rule (regret with its 95% interval over captures):", ""]
    lines += [
        f"- `{r['id']}`: pick {r['fitted']['tile']}, best {r['best']}, {_pct(r['fitted']['regret'])} "
        f"[{_pct(r['fitted']['ci'][0])}, {_pct(r['fitted']['ci'][1])}]"
        for r in worst
    ]
    return "\n".join(lines) + "\n"


def read_sweep(path: Path) -> Sweep:
    """A sweep dataset, plain or gzipped (the committed form)."""
    if not path.exists():
        raise UsageError(
            f"--sweep {path}: no such file; run `nox -s tile_sweep` first, or pass the committed "
            "reports/<machine>/tile-oracle/*.json.gz"
        )
    return load_sweep(path)


def analyse(sweep: Sweep, min_gain: float = MIN_GAIN) -> dict:
    cases = [case_times(c) for c in sweep.cases]
    rule, evidence = fit_rule([c for c in cases if c.info["split"] == "fitted"], min_gain)
    summary = summarize(cases, rule)
    rows = case_rows(cases, rule)
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "sweep": {
            "grid": sweep.grid,
            "cases": len(cases),
            "provenance": sweep.provenance,
            "candidate": candidate_label(sweep.provenance),
            "settings": {k: v for k, v in sweep.settings.items() if k != "expected_cases"},
        },
        "min_gain": min_gain,
        "rule": asdict(rule),
        "buckets": evidence,
        "summary": summary,
        "where_picks_differ": where_picks_differ(rows),
        "cases": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tile_oracle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", required=True, type=Path, help="tile-sweep.json (or .json.gz)")
    ap.add_argument("--out", required=True, type=Path, help="folder for tile-oracle.json and tile-oracle.md")
    ap.add_argument("--min-gain", type=float, default=MIN_GAIN, help="geomean gain a bucket needs to change tile")
    args = ap.parse_args(argv)
    sweep = read_sweep(args.sweep)
    result = analyse(sweep, args.min_gain)
    rule = TileRule(tuple(tuple(o) for o in result["rule"]["overrides"]))
    report = render(sweep, rule, result["buckets"], result["summary"], result["cases"])
    args.out.mkdir(parents=True, exist_ok=True)
    for name in (ORACLE_FILE, REPORT_FILE):
        if (args.out / name).exists() and not _ours(args.out / name):
            raise UsageError(
                f"--out {args.out}: {name} there was not written by the tile oracle; pick another "
                "folder (nothing was changed)"
            )
    write_json(args.out / ORACLE_FILE, result)
    (args.out / REPORT_FILE).write_text(report)
    print(report)
    return 0


def _ours(path: Path) -> bool:
    if path.name == REPORT_FILE:
        return path.read_text(errors="replace").startswith("# Tile oracle")
    try:
        return json.loads(path.read_text()).get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


if __name__ == "__main__":
    sys.exit(run_main(main))
