"""``nox -s nightly``: one night of the history (issue 41): add tonight's run to the history, look for change
points, and confirm each new one by a bisect, whose first step is the paired A/B of the builds either side. Only
a confirmed slowdown is an alert.

Tonight's run (``--results``) is the bench's results file of vLLM as it is tonight: the workflow times it first
(``nox -s bench -- --vllm R --vllm-src vllm-main --suite quick``: ``vllm/`` of main's current commit over
release R's kernels, the candidate side the gate's default change, so each night also re-times it). It goes into
the history (``ci.core.history.add``: complete runs only, each once). Then Apache Otava's change points are
looked for in each case's series (``ci.core.history.candidates``); a candidate whose first slow run is one of the
last ``--recent`` runs is new. A new candidate between two commits of the same release, with ``--vllm-src``
given, is bisected on the cases that moved (``--bisect-command``, by default ``ci.runner.bisect`` in this
interpreter; ``nox -s nightly`` passes its GPU session ``nox -s bisect``); one between releases cannot be
(compiled code may differ) and is listed with the command that would judge it. This stage needs no GPU; its
bisects do.

Outputs, in ``--out``: ``nightly.json`` (kind ``gate-nightly``) and ``nightly.md``, whose first line is the title
of the issue the workflow opens and the rest its body (the night, each candidate, each bisect's report); each
bisect's folder under ``bisect/``. Exit code: 1 when a bisect found the commit that made cases slower (an
alert), 0 when no new candidate was confirmed, 3 when a bisect was undecided, 2 on bad input, a bisect's own
code when it failed (e.g. 6: no GPU).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ci.core import bisect as bisect_core
from ci.core import history
from ci.core.cli import run_main
from ci.core.errors import ExitCode, UsageError
from ci.core.jsonio import check_own_report, read_json, sha256_file, write_report
from ci.core.results import load_results
from ci.host import outputs
from ci.runner import bisect as bisect_runner
from ci.runner.stages import run_stage

ROOT = Path(__file__).resolve().parents[2]
KIND, SCHEMA_VERSION = "gate-nightly", 1
JSON_NAME, MD_NAME = outputs.NIGHTLY
TITLE = "Nightly GPU history: a confirmed slowdown"
RECENT = 3  # a candidate whose first slow run is one of the last RECENT runs is new (Otava may move it a run)
BISECT_CODES = {code: status for status, code in bisect_runner.CODES.items()}  # a bisect's exit code: its status


def commit_of(build: dict) -> str:
    """The commit a build names (``sha12 subject``), as its short hash; empty for a release as published."""
    return str(build.get("commit", "")).partition(" ")[0]


def bisectable(candidate: dict) -> bool:
    """Whether a candidate's two builds are commits over one release (so a bisect's trees can hold both)."""
    good, bad = candidate["good"]["build"], candidate["bad"]["build"]
    return bool(commit_of(good) and commit_of(bad) and good.get("vLLM") == bad.get("vLLM"))


def bisect_pairs(found: Sequence[dict]) -> dict[tuple[str, str], list[str]]:
    """New candidates grouped by their two builds' commits (only those naming commits of one release), with
    the cases each pair moved."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for c in filter(bisectable, found):
        pairs.setdefault((commit_of(c["good"]["build"]), commit_of(c["bad"]["build"])), []).append(c["case"])
    return pairs


def markdown(night: dict, found: Sequence[dict], bisects: Sequence[dict]) -> str:
    alerts = [b for b in bisects if b["status"] == bisect_core.FOUND]
    if alerts:
        named = ", ".join(f"{b.get('first_bad', '?')[:12]} ({len(b['cases'])} case(s))" for b in alerts)
        title = f"{TITLE} on {night['machine']}: vLLM commit {named}"
    else:
        title = "Nightly GPU history: no confirmed slowdown"
    lines = [title, ""]
    lines.append(
        f"Night: {night['results']} ({night['machine']}, {night['kind']}, suite {night['suite']}); the build: "
        f"{history.build_text(night['build'])}; history: {night['history']} ({night['runs']} runs)."
    )
    lines.append("")
    if not found:
        lines.append("No new candidate change point: no case's time went up in the last runs.")
    else:
        lines.append(history.detect_markdown(found).rstrip())
    for b in bisects:
        lines += ["", f"#### Bisect {b['good']}..{b['bad']}: {b['status']} (exit {b['code']})", ""]
        report = Path(b["out"]) / bisect_runner.MD_NAME
        lines.append(report.read_text().rstrip() if report.is_file() else f"no report: see {b['out']}")
    for c in found:
        if not bisectable(c):
            good, bad = c["good"]["build"], c["bad"]["build"]
            lines += [
                "",
                f"{c['case']}: between {history.build_text(good)} and {history.build_text(bad)} the compiled code "
                "may differ, so no bisect was run; judge the two builds with `nox -s gpu_gate -- --vllm installed` "
                "on each.",
            ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None, run: Callable[[list[str]], int] | None = None, detector=None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.runner.nightly", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--results", type=Path, required=True, help="tonight's run (the bench's results file)")
    parser.add_argument("--vllm-src", type=Path, help="the vLLM checkout tonight's build came from, for bisects")
    parser.add_argument(
        "--bisect-command",
        default=f"{sys.executable} -m ci.runner.bisect --vllm installed",
        help="how a bisect is started (default: %(default)s); nox -s nightly passes its bisect session",
    )
    parser.add_argument("--subject", default="kernel-bench", help="the bench's results kind (default kernel-bench)")
    parser.add_argument("--history", type=Path, default=history.DEFAULT_DIR, help="the history folder")
    parser.add_argument("--recent", type=int, default=RECENT, help="a candidate in the last N runs is new (3)")
    parser.add_argument("--no-bisect", action="store_true", help="list new candidates without bisecting them")
    parser.add_argument("--at", help="place tonight's run at this ISO 8601 time (ci.core.history add --at)")
    parser.add_argument("--out", type=Path, default=ROOT / ".gate" / "out" / "nightly")
    args = parser.parse_args(argv)
    if args.recent < 1:
        raise UsageError(f"--recent {args.recent}: give 1 or more runs")
    if args.vllm_src is not None and not (args.vllm_src / ".git").exists():
        raise UsageError(f"--vllm-src {args.vllm_src}: not a git checkout; clone vLLM with its history")
    check_own_report(args.out, JSON_NAME, MD_NAME, kind=KIND, version=SCHEMA_VERSION)
    stage = run or (lambda a: run_stage(a, ROOT))
    bisect_command = shlex.split(args.bisect_command)
    results = load_results(args.results)
    if results.kind != args.subject:
        raise UsageError(f"--results {args.results}: a {results.kind!r} run, not {args.subject!r} (--subject)")
    path = history.add(args.results, args.history, args.at)
    print(f"nightly: added {args.results} to {path}", flush=True)
    data = history.load_history(path)
    runs = len(data["entries"])
    found = [
        c for c in history.candidates(data, detector or history.otava_detector()) if c["index"] >= runs - args.recent
    ]
    bisects = []
    if found and not args.no_bisect and args.vllm_src is not None:
        for (good, bad), cases in sorted(bisect_pairs(found).items()):
            out = args.out / "bisect" / f"{good}-{bad}"
            cmd = [*bisect_command, "--vllm-src", str(args.vllm_src)]
            cmd += ["--good", good, "--bad", bad, "--subject", args.subject, "--suite", results.suite]
            cmd += ["--cases", ",".join(sorted(cases)), "--out", str(out)]
            print(f"nightly: bisect: {' '.join(cmd)}", flush=True)
            code = stage(cmd)
            if code not in BISECT_CODES:
                print(f"nightly: the bisect {good}..{bad} ended with exit {code}", file=sys.stderr)
            report = out / bisect_runner.JSON_NAME
            first_bad = (
                read_json(report, kind=bisect_runner.KIND, versions=(bisect_runner.SCHEMA_VERSION,)).get(
                    "first_bad", ""
                )
                if report.is_file()
                else ""
            )
            bisects.append(
                {
                    "first_bad": str(first_bad),
                    "good": good,
                    "bad": bad,
                    "cases": sorted(cases),
                    "code": code,
                    "status": BISECT_CODES.get(code, f"stopped (exit {code})"),
                    "out": str(out),
                }
            )
    night = {
        "results": str(args.results),
        "machine": path.parent.parent.name,
        "kind": results.kind,
        "suite": results.suite,
        "history": str(path),
        "runs": runs,
    }
    digest = sha256_file(args.results)
    tonight = next(e for e in data["entries"] if e["run"]["sha256"] == digest)  # with --at, not always the last
    night["build"] = tonight["builds"][history.published(tonight)]
    payload = {"kind": KIND, "schema_version": SCHEMA_VERSION, "night": night, "candidates": found, "bisects": bisects}
    write_report(args.out, JSON_NAME, MD_NAME, payload, markdown(night, found, bisects))
    stopped = [b["code"] for b in bisects if b["code"] not in BISECT_CODES]
    if stopped:  # a bisect that could not run (e.g. no GPU): its code, after the report says so
        return stopped[0]
    if any(b["status"] == bisect_core.FOUND for b in bisects):
        return int(ExitCode.FAILED)
    if any(b["status"] == bisect_core.UNDECIDED for b in bisects):
        return int(ExitCode.INCONCLUSIVE)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
