"""``nox -s bisect -- --vllm-src CHECKOUT --good REF --bad REF``: the first vLLM commit that made a case slower,
each step a paired A/B of two commits on this GPU, judged by ``ci.core.compare`` (``ci.core.bisect``'s rule).

The commits are the first-parent line from ``--good`` to ``--bad`` of a vLLM checkout. A step builds the two
commits as the gate's trees in branch mode (``ci.trees.build --vllm-src --base-ref A --head-ref B``: ``vllm/`` of
each commit over one release's compiled kernels, so no step compiles anything), times them with a subject's
bench (the Marlin kernel bench by default, ``--subject triton-moe-bench``, or TPOT with ``--tpot``) and reads the
A/B verdict. The first step judges the two ends on ``--suite`` (or ``--cases``); the steps after it time only
the cases that FAILed there, the cases that moved. A pair whose commits hold the same code under ``vllm/``
(files that differ only in comments, docstrings or layout: ``ci.trees.treediff.same_code``) is ``SAME`` without
timing. A commit that changes compiled sources (``csrc/``, CMake, ``setup.py``, ``*.cu``) cannot be an in-process
A/B with the commit before it: the trees hold one release's kernels, ``--vllm``, which must be ``--bad``'s compiled
code, so only the commits from the last such change to ``--bad`` are bisected
(``ci.core.bisect.bisect_past_compiled``; ``--good v0.25.0 --bad v0.25.1 --vllm 0.25.1`` bisects the part of a
release range after its last compiled change). When that part holds no slowdown, the report names the compiled
changes the slowdown must lie at or before (build vLLM from source there and use ``nox -s gpu_gate -- --vllm
installed``). A ``--bad`` that itself changes compiled sources is refused before any step.

Outputs, in ``--out`` (default ``.gate/out/bisect``): ``bisect.json`` (kind ``gate-bisect``) and ``bisect.md``
(every step with its verdict, slowest case and evidence), and ``steps/<earlier>-<later>/`` with each step's
results, verdict and report; ``trees/`` holds the builds. Exit code: 1 when a first slow commit is found
(a regression), 0 when the ends are not confirmed apart, 3 when undecided, 9 when the timed part holds no
slowdown and the rest needs builds from source, a stage's own code when it fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.core import bisect as core
from ci.core import subjects
from ci.core.cli import run_main
from ci.core.errors import DataError, ExitCode, GateError, UsageError
from ci.core.jsonio import check_own_report, read_json, write_report
from ci.core.stats import DEFAULT_THRESHOLD
from ci.host import outputs
from ci.runner.stages import run_stage
from ci.trees.patching import PATCHED_PREFIX, is_compiled
from ci.trees.refpatch import git_bytes, git_text, has_commit
from ci.trees.treediff import same_code

ROOT = Path(__file__).resolve().parents[2]
FROM_SOURCE = (  # the how of the core's "builds from source", for vLLM
    "Builds from source: build vLLM from source at the commits between the two the headline names (at least at "
    "each compiled change and the commit before it) and judge each pair with `nox -s gpu_gate -- --vllm installed`."
)
STEP_CONTRACT = Path(__file__).with_name("bisect-contract.py")  # two commits: every path may change, no rule
KIND, SCHEMA_VERSION = "gate-bisect", 1
JSON_NAME, MD_NAME = "bisect.json", "bisect.md"
TPOT = "tpot"
CODES = {
    core.FOUND: int(ExitCode.FAILED),
    core.NOT_CONFIRMED: int(ExitCode.OK),
    core.UNDECIDED: int(ExitCode.INCONCLUSIVE),
    core.BEFORE_COMPILED: int(ExitCode.ENVIRONMENT),  # the builds that would decide it need compiling from source
}


class StageFailed(GateError):
    """A step's stage (build, bench, compare) ended without a verdict; its code is the bisect's."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code


def commits_between(repo: Path, good: str, bad: str) -> list[str]:
    """``good`` and every commit after it on the first-parent line to ``bad``, oldest first (full hashes)."""
    if not (repo / ".git").exists():
        raise UsageError(f"--vllm-src {repo}: not a git checkout (no .git); clone vLLM with its history")
    for flag, ref in (("--good", good), ("--bad", bad)):
        if not has_commit(repo, ref):
            raise UsageError(f"{flag} {ref}: not a commit of {repo}; `git -C {repo} fetch` it first")
    good_sha, bad_sha = (git_text(repo, "rev-parse", f"{r}^{{commit}}").strip() for r in (good, bad))
    try:
        git_bytes(repo, "merge-base", "--is-ancestor", good_sha, bad_sha)
    except UsageError:
        raise UsageError(f"--good {good} is not an ancestor of --bad {bad}: give the older commit as --good") from None
    line = git_text(repo, "rev-list", "--reverse", "--first-parent", f"{good_sha}..{bad_sha}").split()
    if not line:
        raise UsageError(f"--good {good} and --bad {bad} are the same commit: nothing to bisect")
    return [good_sha, *line]


def changed(repo: Path, earlier: str, later: str) -> list[str]:
    return [p for p in git_text(repo, "diff", "--name-only", "--no-renames", earlier, later).splitlines() if p]


def _blob(repo: Path, rev: str, path: str) -> bytes | None:
    """``path`` at commit ``rev``, or None where the commit has no such file."""
    if not git_text(repo, "ls-tree", "--name-only", rev, "--", path).strip():
        return None
    return git_bytes(repo, "show", f"{rev}:{path}")


def code_changed(repo: Path, earlier: str, later: str) -> tuple[list[str], list[str]]:
    """The files under ``vllm/`` that differ between two commits: (those whose code differs, those that
    differ only in comments, docstrings or layout: ``ci.trees.treediff.same_code``)."""
    code, text = [], []
    for path in (p for p in changed(repo, earlier, later) if p.startswith(PATCHED_PREFIX)):
        before, after = _blob(repo, earlier, path), _blob(repo, later, path)
        same = path.endswith(".py") and before is not None and after is not None and same_code(before, after)
        (text if same else code).append(path)
    return code, text


def compiled_steps(repo: Path, commits: Sequence[str]) -> dict[int, str]:
    """Each commit of the line that changes compiled sources: its index, and 'sha: files'."""
    found = {}
    for i, (earlier, later) in enumerate(itertools.pairwise(commits), 1):
        files = [p for p in changed(repo, earlier, later) if is_compiled(p)]
        if files:
            found[i] = f"{later[:12]}: {', '.join(files[:4])}"
    return found


def short(repo: Path, sha: str) -> str:
    """A commit as the tables show it: its short hash and subject."""
    subject = git_text(repo, "log", "-1", "--format=%s", sha).strip()
    return f"{sha[:12]} {subject[:50]}".rstrip()


@dataclass(kw_only=True)
class Stages:
    """How a step runs its stages: the commands, and ``run`` (a subprocess returning its exit code)."""

    repo: Path
    vllm: str
    out: Path
    kind: str  # the subject's results kind, or TPOT
    suite: str
    cases: str | None
    threshold: float
    tpot_profile: str = "pr"
    run: Callable[[list[str]], int] | None = None

    def __post_init__(self) -> None:
        if self.kind == TPOT:
            self.bench, self.results_file = "ci.serving.tpot", outputs.TPOT_RESULTS
        else:
            subject = subjects.subject_of(self.kind)
            if not (subject.bench and subject.results_file):
                benches = [k for k in subjects.kinds() if subjects.subject_of(k).bench]
                raise UsageError(f"--subject {self.kind}: no bench registered for it (those with one: {benches})")
            self.bench, self.results_file = subject.bench, subject.results_file

    def _call(self, name: str, argv: list[str]) -> int:
        print(f"bisect: {name}: {' '.join(argv)}", flush=True)
        if self.run is not None:
            return self.run(argv)
        return run_stage(argv, ROOT)

    def bench_argv(self, manifest: Path, out: Path) -> list[str]:
        if self.kind == TPOT:
            which = ["--profile", self.tpot_profile]
        else:
            which = ["--suite", self.suite, *(["--cases", self.cases] if self.cases else [])]
        judge = ["--threshold", repr(self.threshold)]
        return [sys.executable, "-m", self.bench, "--manifest", str(manifest), *which, *judge, "--out", str(out)]

    def judge(self, earlier: str, later: str) -> core.Step:
        started = time.time()
        code, text = code_changed(self.repo, earlier, later)
        if not code:
            note = f"no code under vllm/ differs ({', '.join(text)}: comments or docstrings)"
            return core.Step(
                earlier=earlier, later=later, verdict=core.SAME, note=note if text else "no file under vllm/ differs"
            )
        pair = f"{earlier[:12]}-{later[:12]}"
        trees, step = self.out / "trees" / pair, self.out / "steps" / pair
        build = [
            sys.executable,
            "-m",
            "ci.trees.build",
            "--vllm",
            self.vllm,
            "--vllm-src",
            str(self.repo),
            "--base-ref",
            earlier,
            "--head-ref",
            later,
            "--contract",
            str(STEP_CONTRACT),
            "--out",
            str(trees),
        ]
        results = step / "bench" / self.results_file
        compare = [
            sys.executable,
            "-m",
            "ci.core.compare",
            "--results",
            str(results),
            "--threshold",
            repr(self.threshold),
            "--out",
            str(step / "ab"),
        ]
        for name, argv, ok in (
            ("build", build, (0,)),
            ("bench", self.bench_argv(trees / "manifest.json", results.parent), (0,)),
            ("verdict", compare, (0, int(ExitCode.FAILED), int(ExitCode.INCONCLUSIVE))),
        ):
            code = self._call(f"{pair} {name}", argv)
            if code not in ok:
                raise StageFailed(f"bisect step {pair}: the {name} stage ended with exit {code}; see its output", code)
        return step_of(step / "ab" / "verdict.json", earlier, later, time.time() - started)


def step_of(verdict_path: Path, earlier: str, later: str, seconds: float) -> core.Step:
    """A step from the verdict ``ci.core.compare`` wrote."""
    payload = read_json(verdict_path, kind="gate-verdict", versions=(2, 3))
    cases = payload.get("cases")
    overall = payload.get("overall")
    if not isinstance(cases, list) or not cases or overall not in (core.PASS, core.FAIL, core.INCONCLUSIVE):
        raise DataError(f"{verdict_path}: no cases or no PASS/FAIL/INCONCLUSIVE overall verdict; re-run the step")
    try:
        worst = max(cases, key=lambda c: c["effect"]["ratio"])
        shown = (
            f"{worst['id']} {worst['effect']['ratio']:.4f} "
            f"[{worst['effect']['ci_low']:.4f}, {worst['effect']['ci_high']:.4f}]"
        )
        failed = tuple(c["id"] for c in cases if c["verdict"] == core.FAIL)
    except (KeyError, TypeError) as exc:
        raise DataError(f"{verdict_path}: a case lacks {exc} (id, verdict, effect); re-run the step") from None
    return core.Step(
        earlier=earlier,
        later=later,
        verdict=overall,
        failed=failed,
        worst=shown,
        seconds=seconds,
        evidence=str(verdict_path.parent),
    )


def run_bisect(commits: Sequence[str], stages: Stages, compiled: Sequence[int] = ()) -> core.Outcome:
    """The bisect over ``commits`` (those at the indices ``compiled`` change compiled sources:
    ``ci.core.bisect.bisect_past_compiled``); after the first step, only its FAILed cases are timed."""
    first_done = []

    def judge(earlier: str, later: str) -> core.Step:
        step = stages.judge(earlier, later)
        if not first_done:
            first_done.append(step)
            if step.failed and stages.kind != TPOT:
                stages.cases = ",".join(step.failed)
        return step

    return core.bisect_past_compiled(commits, compiled, judge)


def payload_of(outcome: core.Outcome, repo: Path, stages: Stages) -> dict:
    def step(s: core.Step) -> dict:
        return {
            "earlier": s.earlier,
            "later": s.later,
            "verdict": s.verdict,
            "failed": list(s.failed),
            "worst": s.worst,
            "seconds": round(s.seconds, 1),
            "evidence": s.evidence,
            "note": s.note,
        }

    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "repo": str(repo),
        "subject": stages.kind,
        "threshold": stages.threshold,
        "status": outcome.status,
        "commits": list(outcome.builds),
        "not_timed": list(outcome.earlier),  # commits whose compiled code is not --bad's
        "compiled": list(outcome.compiled),  # the commits that change compiled sources
        "last_good": outcome.last_good,
        "first_bad": outcome.first_bad,
        "seconds": round(outcome.seconds, 1),
        "steps": [step(s) for s in outcome.steps],
    }


def main(argv: Sequence[str] | None = None, run: Callable[[list[str]], int] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.runner.bisect", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--vllm", default="0.25.1", help="the release whose kernels the trees reuse, or 'installed'")
    parser.add_argument("--vllm-src", type=Path, required=True, help="a vLLM checkout with the commits")
    parser.add_argument("--good", required=True, help="a commit known fast (older)")
    parser.add_argument("--bad", required=True, help="a commit known slow (newer)")
    parser.add_argument("--subject", default="kernel-bench", help="the bench's results kind (default kernel-bench)")
    parser.add_argument("--tpot", action="store_true", help="judge each step by TPOT (ci.serving.tpot) instead")
    parser.add_argument("--profile", default="pr", help="with --tpot: the TPOT profile (default pr)")
    parser.add_argument("--suite", default="default", help="the bench's suite for the first step")
    parser.add_argument("--cases", help="only these case ids (a glob, or several comma-separated)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="the slowdown that FAILs (0.03)")
    parser.add_argument("--out", type=Path, default=ROOT / ".gate" / "out" / "bisect")
    args = parser.parse_args(argv)
    check_own_report(args.out, JSON_NAME, MD_NAME, kind=KIND, version=SCHEMA_VERSION)
    commits = commits_between(args.vllm_src, args.good, args.bad)
    compiled = compiled_steps(args.vllm_src, commits)
    if compiled and max(compiled) == len(commits) - 1:
        raise UsageError(
            f"--bad {args.bad} itself changes compiled sources ({compiled[max(compiled)]}), so no commit before it "
            "shares its kernels: give a later --bad, or build vLLM from source at each end and run "
            "nox -s gpu_gate -- --vllm installed"
        )
    if compiled:
        print(
            f"bisect: {len(compiled)} commit(s) change compiled sources ({'; '.join(list(compiled.values())[:6])}); "
            f"only the commits from the last of them on share --bad's kernels (--vllm {args.vllm} must be that "
            "code's release) and are timed",
            flush=True,
        )
    stages = Stages(
        repo=args.vllm_src,
        vllm=args.vllm,
        out=args.out,
        kind=TPOT if args.tpot else args.subject,
        suite=args.suite,
        cases=args.cases,
        threshold=args.threshold,
        tpot_profile=args.profile,
        run=run,
    )
    timed = len(commits) - max(compiled, default=0)
    print(f"bisect: {timed} commits, at most {core.planned_steps(timed)} steps", flush=True)
    try:
        outcome = run_bisect(commits, stages, sorted(compiled))
    except StageFailed as exc:
        print(f"bisect: stopped: {exc}", file=sys.stderr)
        return exc.exit_code
    names = {c: short(args.vllm_src, c) for c in commits}
    shown = core.Outcome(
        status=outcome.status,
        builds=tuple(names[c] for c in outcome.builds),
        last_good=names[outcome.last_good],
        first_bad=names[outcome.first_bad],
        steps=[dataclasses.replace(s, earlier=names[s.earlier], later=names[s.later]) for s in outcome.steps],
        earlier=tuple(names[c] for c in outcome.earlier),
        compiled=tuple(names[c] for c in outcome.compiled),
    )
    text = core.markdown(shown)
    if outcome.status == core.BEFORE_COMPILED:
        text = f"{text.rstrip()}\n\n{FROM_SOURCE}\n"
    write_report(args.out, JSON_NAME, MD_NAME, payload_of(outcome, args.vllm_src, stages), text)
    return CODES[outcome.status]


if __name__ == "__main__":
    sys.exit(run_main(main))
