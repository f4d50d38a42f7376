"""End-to-end serving (``ci.tpot``: ``vllm serve`` + ``vllm bench serve``) as a subject of the gate core
(``ci.subjects``): its baselines are ``tpot-<suite>.json``, and under the verdict table the report lists
every round in the order run, with the machine's state where recorded."""

from __future__ import annotations

from ci.subjects import Subject, register

KIND = "tpot-bench"


def details(results) -> list[str]:
    lines: list[str] = []
    for case in results.cases:
        rounds = case.extra.get("rounds") or []
        if not rounds:
            continue
        lines += ["", f"Rounds of {case.id} (in the order run):", "",
                  "| # | build | median TPOT (ms) | mean TPOT (ms) | median TTFT (ms) | output tok/s | SM clock (MHz) "
                  "| power (W) | host load |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for i, r in enumerate(rounds, 1):
            m = r.get("machine") or {}

            def first(key, m=m):
                values = [v for v in m.get(key) or [] if v is not None]
                return f"{values[0]:.0f}" if values else "-"

            load = m.get("load_1min")
            lines.append(
                f"| {i} | {r['build']} | {r['median_tpot_ms']:.3f} | {r['mean_tpot_ms']:.3f} | "
                f"{r['median_ttft_ms']:.1f} | {r['output_throughput']:.0f} | {first('sm_clock_mhz')} | "
                f"{first('power_draw_w')} | {'-' if load is None else f'{load:.2f}'} |"
            )
    return lines


SUBJECT = register(Subject(kind=KIND, baseline_prefix="tpot-", details=details))
