"""Results made up for the tests of the core (evidence, verdicts, baselines, reports), in one place.

The core asks a results file's subject what a complete run is (``ci.core.subjects``); the real subjects answer
from the gate's definitions (the kernel bench's suites, the TPOT profiles). The core's own rules are
tested on the ``synthetic-bench`` subject registered here, for tests only: it defines a suite as the cases
the file lists in ``settings.expected_cases`` (what a stage of it would have set out to measure), and
shows the kernel bench's columns. No stage of the gate writes this kind.
"""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

from ci.core import subjects
from ci.core.results import BenchResults, CaseResult
from ci.kernel import subject as kernel_subject
from ci.kernel.suites import suite_cases
from ci.serving import subject as serving_subject
from ci.trees import release
from ci.trees.variants import ENTRY_MODULE

GPU = {"driver": "580", "count": 1, "gpus": [{"name": "NVIDIA H200", "index": 0}]}
PROVENANCE = {"gpu": GPU, "gate": "EP-Marlin gate"}  # what ci.trees.provenance.collect records, in part
SYNTHETIC = "synthetic-bench"


def _declared(results) -> list[str]:
    return list(results.settings.get("expected_cases") or [])


def _case_problems(case) -> list[str]:
    """The kernel bench's and the TPOT stage's checks of a case, where the case carries what they read."""
    return [
        *(kernel_subject.case_problems(case) if "correctness" in case.extra else []),
        *(serving_subject.case_problems(case) if "rounds" in case.extra else []),
    ]


subjects.register(
    subjects.Subject(
        kind=SYNTHETIC,
        expected_cases=_declared,
        case_problems=_case_problems,
        columns=kernel_subject.columns,
        annotate=kernel_subject.annotate,
        panel=kernel_subject.panel,
    )
)


def make_results(ratio_by_case: dict[str, float], *, n: int = 50, seed: int = 0, suite: str = "unit") -> BenchResults:
    """One capture a build per case, ``n`` samples, the candidate ``ratio`` slower; a synthetic-bench file."""
    rng = random.Random(seed)
    cases = []
    for cid, ratio in ratio_by_case.items():
        base = [100 * math.exp(rng.gauss(0, 0.004)) for _ in range(n)]
        cand = [ratio * 100 * math.exp(rng.gauss(0, 0.004)) for _ in range(n)]
        sweep = {str(bm): [100.0 + abs(bm - 16)] * 5 for bm in (8, 16, 32, 48, 64)}
        cases.append(
            CaseResult(
                id=cid,
                unit="us/call",
                samples={"base": base, "candidate": cand},
                info={"block_size_m": {"base": 64, "candidate": 16}},
                extra={"block_sizes_us": sweep},
            )
        )
    settings = {"expected_cases": list(ratio_by_case), "complete": True}  # what every stage writes
    return BenchResults(kind=SYNTHETIC, suite=suite, provenance=dict(PROVENANCE), settings=settings, cases=cases)


def captured_results(ratio_by_capture: list[float], rounds: int = 3, case_ratio: float = 1.0) -> BenchResults:
    """One case timed in len(ratio_by_capture) captures: capture b makes the candidate ratio_by_capture[b] slow."""
    r = make_results({"a": case_ratio}, n=len(ratio_by_capture) * rounds)
    case = r.cases[0]
    ids = [b for b in range(len(ratio_by_capture)) for _ in range(rounds)]
    case.samples["candidate"] = [x * ratio_by_capture[b] for x, b in zip(case.samples["candidate"], ids, strict=True)]
    case.extra["captures"] = {"base": ids, "candidate": list(ids)}
    return r


def kernel_results(
    suite: str = "quick",
    *,
    captures: int = 6,
    rounds: int = 3,
    ratio: float = 1.0,
    case_filter: str | None = None,
    seed: int = 0,
) -> BenchResults:
    """A kernel-bench file as the bench writes it: every case of ``suite`` (less ``case_filter``), each timed
    in ``captures`` captures of ``rounds`` rounds, with the correctness check it records."""
    rng = random.Random(seed)
    cases = []
    for bench_case in suite_cases(suite, case_filter):
        ids = [b for b in range(captures) for _ in range(rounds)]
        base = [100 * math.exp(rng.gauss(0, 0.003)) for _ in ids]
        cases.append(
            CaseResult(
                id=bench_case.id,
                unit="us/call",
                samples={"base": base, "candidate": [ratio * x * math.exp(rng.gauss(0, 0.003)) for x in base]},
                info={"block_size_m": {"base": 16, "candidate": 16}, "ep": bench_case.ep},
                extra={"captures": {"base": ids, "candidate": list(ids)}, "correctness": {"ok": True, "rel_l2": 0.0}},
            )
        )
    settings = {
        "expected_cases": [c.id for c in cases],
        "complete": True,
        "case_filter": case_filter,
        "aa": False,
        "failed_cases": {},
    }
    return BenchResults(
        kind=kernel_subject.KIND, suite=suite, provenance=dict(PROVENANCE), settings=settings, cases=cases
    )


def triton_results(
    suite: str = "quick", *, captures: int = 6, rounds: int = 2, ratio_of=lambda case_id: 1.0, seed: int = 0
) -> BenchResults:
    """A Triton fused-MoE bench file as ``ci.triton_moe.bench`` writes it: every case of ``suite``, the
    candidate ``ratio_of(case id)`` slower, the configs chosen and a regret sweep of two configs."""
    from ci.triton_moe import bench as triton_bench
    from ci.triton_moe import suites as triton_suites

    rng = random.Random(seed)
    cases = []
    for case in triton_suites.suite_cases(suite):
        ids = [b for b in range(captures) for _ in range(rounds)]
        base = [100 * math.exp(rng.gauss(0, 0.003)) for _ in ids]
        cand = [ratio_of(case.id) * x * math.exp(rng.gauss(0, 0.003)) for x in base]
        labels = {"base": "m64-n128-k64-w8-s3", "candidate": "m16-n64-k128-w4-s4"}
        cases.append(
            CaseResult(
                id=case.id,
                unit="us/call",
                samples={"base": base, "candidate": cand},
                info={"ep": case.ep, "config_label": labels, "config": {"base": {}, "candidate": {}}},
                extra={
                    "captures": {"base": ids, "candidate": list(ids)},
                    "correctness": {"ok": True, "rel_l2": 0.0},
                    "configs_us": {
                        labels["base"]: [100.0, 101.0],
                        labels["candidate"]: [120.0, 121.0],
                        "m32-n64-k64-w4-s3": [90.0, 90.0],
                    },
                },
            )
        )
    settings = {"expected_cases": [c.id for c in cases], "case_filter": None, "aa": False, "failed_cases": {}}
    return BenchResults(
        kind=triton_bench.KIND, suite=suite, provenance=dict(PROVENANCE), settings=settings, cases=cases
    )


# A toy vLLM release and patches of it (the builder's tests) ------------------------------------------

MOD = "vllm/layers/mod.py"
BEFORE = "import os\n\n\ndef pick(m):\n    m = m\n    return m\n\n\nLIMIT = 3\n"
AFTER = "import os\n\n\ndef pick(m):\n    m = m // 2\n    return m\n\n\nLIMIT = 3\n"


def diff(path: str, old: str, new: str) -> str:
    import difflib

    body = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))
    return f"diff --git a/{path} b/{path}\n{body}"


ENTRY = ENTRY_MODULE.replace(".", "/") + ".py"


def make_release(root: Path, text: str = BEFORE, version: str = "9.9.9") -> release.Release:
    """A release of two modules: the gate's entry module (marlin_moe), which imports ``vllm/layers/mod.py``."""
    (root / "vllm" / "layers").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    (root / MOD).write_text(text)
    (root / "vllm" / "_C.abi3.so").write_bytes(b"\x7fELF kernels")
    (root / ENTRY).parent.mkdir(parents=True)
    (root / ENTRY).write_text("from vllm.layers import mod\n")
    return release.Release(version=version, root=root, source="test")


def plain_diff(path: str, old: str, new: str) -> str:
    """A section without a ``diff --git`` line (``diff -u``), which git apply applies all the same."""
    import difflib

    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))


# A stand-in vLLM tree for the serving stage's tests (tests/unit/standin_vllm.py as its CLI) -----------------

STANDIN = Path(__file__).with_name("standin_vllm.py")


def fake_tree(root: Path, *, moe_flag: bool = True, bench_module: bool = True, kv_flag: bool = True) -> Path:
    cli = root / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for pkg in (root / "vllm", root / "vllm" / "entrypoints", cli):
        (pkg / "__init__.py").write_text("")
    shutil.copy(STANDIN, cli / "main.py")
    if bench_module:
        for sub in ("benchmarks", "utils"):
            (root / "vllm" / sub).mkdir()
            (root / "vllm" / sub / "__init__.py").write_text("")
        shutil.copy(STANDIN, root / "vllm" / "benchmarks" / "serve.py")
        (root / "vllm" / "utils" / "argparse_utils.py").write_text(
            "from argparse import ArgumentParser as FlexibleArgumentParser  # noqa: F401\n"
        )
    (root / "vllm" / "engine").mkdir()
    flags = [f for f, on in (("--moe-backend", moe_flag), ("--kv-cache-memory-bytes", kv_flag)) if on]
    (root / "vllm" / "engine" / "arg_utils.py").write_text("".join(f'add("{f}")\n' for f in flags))
    return root


def saved(results: BenchResults, path: Path, **settings) -> Path:
    """``results`` written to ``path`` (with ``settings`` merged into its settings first): the file a stage wrote."""
    results.settings.update(settings)
    results.save(path)
    return path
