"""nox -s gpu_gate: the stages in order, each only after the ones before passed, one table, one exit code."""

from __future__ import annotations

import json

import pytest

from ci.runner import gpu_gate
from ci.trees import build
from tests.unit.factories import AFTER, BEFORE, MOD, diff, kernel_results, make_release


@pytest.fixture
def built(tmp_path):
    patch = tmp_path / "change.patch"
    patch.write_text(diff(MOD, BEFORE, AFTER))
    return build.build_trees(
        build.BuildOptions(patch=patch, out=tmp_path / "trees"), release=make_release(tmp_path / "r")
    )


def _fake(codes: dict[str, int], seen: list, results_path=None):
    def run(step, argv, codes_map=None):
        seen.append((step.name, argv))
        if "ci.kernel.bench" in argv and results_path is not None:
            results_path.parent.mkdir(parents=True, exist_ok=True)
            kernel_results().save(results_path)
        step.code = next((c for k, c in codes.items() if step.name.startswith(k)), 0)
        return step

    return run


@pytest.mark.parametrize(
    ("failing", "code", "ran", "counted", "overall"),
    [
        ("GPU equivalence suite", 1, 1, False, 1),
        ("kernel bench", 12, 2, False, 12),
        ("kernel verdict (A/B)", 3, 3, False, 3),
        ("kernel verdict (baseline", 1, 4, False, 0),
        ("kernel verdict (baseline", 1, 4, True, 1),
        ("kernel verdict (baseline", 4, 4, True, 0),
    ],
)
def test_each_stage_runs_only_after_the_ones_before_passed(
    built, tmp_path, monkeypatch, failing, code, ran, counted, overall
):
    seen = []
    out = tmp_path / "out"
    monkeypatch.setattr(gpu_gate, "_run", _fake({failing: code}, seen, out / "bench" / "kernel-results.json"))
    steps, found = gpu_gate.run_gate(
        built.manifest_path, out, suite="quick", workers=2, baseline_dir=tmp_path / "b", count_baseline=counted
    )
    assert len(seen) == ran and found == overall
    suite = seen[0][1]
    assert suite[suite.index("-n") + 1] == "2" and "--require-gpu" in suite, "one xdist worker per GPU asked for"
    text = gpu_gate.table(steps, found)
    assert text.startswith(f"### GPU gate: {gpu_gate.describe(overall)[0]} (exit {overall})")
    assert text.count("| not run |") == 4 - ran
    if ran == 4 and overall == 0:
        assert f"| {gpu_gate.describe(code)[0]} (shown, not counted) | {code} |" in text


def test_the_baseline_side_is_the_candidate_only_for_the_baselines_own_change(tmp_path):
    stored = kernel_results()
    stored.provenance["vllm"] = {"patch_sha256": "abc"}
    path = tmp_path / "b.json"
    stored.save(path)
    assert gpu_gate.baseline_side("abc", path) == "candidate"
    assert gpu_gate.baseline_side("other", path) == "base"
    assert gpu_gate.baseline_side("abc", tmp_path / "missing.json") == "base"
    path.write_text(json.dumps({"provenance": "junk"}))
    assert gpu_gate.baseline_side("abc", path) == "base"


def test_a_triton_change_gets_the_triton_stages_and_the_threshold_reaches_both_verdicts(tmp_path, monkeypatch):
    from ci.trees import variants

    release = make_release(tmp_path / "r")
    triton = release.root / (variants.ENTRY_MODULES[1].replace(".", "/") + ".py")
    triton.write_text("K = 1\n")
    patch = tmp_path / "triton.patch"
    patch.write_text(diff(str(triton.relative_to(release.root)), "K = 1\n", "K = 2\n"))
    trees = build.build_trees(build.BuildOptions(patch=patch, contract="none", out=tmp_path / "t"), release=release)
    seen: list = []
    monkeypatch.setattr(gpu_gate, "_run", _fake({"triton-moe bench": 12}, seen))
    steps, code = gpu_gate.run_gate(
        trees.manifest_path, tmp_path / "o", suite="quick", workers=1, baseline_dir=tmp_path, threshold=0.05
    )
    assert code == 12 and [s.name for s in steps][:2] == ["GPU equivalence suite", "triton-moe bench"]
    suite, bench = seen[0][1], seen[1][1]
    assert "tests/triton_moe" in suite and "tests/ep_marlin" not in suite
    assert bench[bench.index("-m") + 1] == "ci.triton_moe.bench" and "--suite" in bench
    assert steps[1].output.endswith("triton-moe-results.json")
    seen.clear()
    monkeypatch.setattr(gpu_gate, "_run", _fake({}, seen))
    gpu_gate.run_gate(
        trees.manifest_path, tmp_path / "o2", suite="quick", workers=1, baseline_dir=tmp_path, threshold=0.05
    )
    verdicts = [argv for name, argv in seen if "verdict" in name]
    assert len(verdicts) == 2 and all(argv[argv.index("--threshold") + 1] == "0.05" for argv in verdicts)


def test_a_change_no_subject_with_gpu_stages_enters_is_refused_before_any_stage(built, tmp_path, monkeypatch):
    from ci.core.errors import UsageError

    seen: list = []
    monkeypatch.setattr(gpu_gate, "_run", _fake({}, seen))
    monkeypatch.setattr(gpu_gate.subjects, "by_entry_module", lambda entry: None)
    with pytest.raises(UsageError, match="which no subject with GPU stages registered"):
        gpu_gate.run_gate(built.manifest_path, tmp_path / "o", suite="quick", workers=1, baseline_dir=tmp_path)
    assert seen == []


def test_the_cli_refuses_a_threshold_that_is_not_a_fraction(built, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_gate.main(["--manifest", str(built.manifest_path), "--out", str(tmp_path / "o"), "--threshold", "3"])
    assert exc.value.code == 2 and "strictly between 0 and 1" in capsys.readouterr().err
