"""The crafted patches of issue 39 on vLLM's own code (CPU tier): refused at build, caught, or named as unrun.

``tests/data/crafted/*.patch`` are written against vLLM 0.25.1. Each is built from the base tree under test; the
refusals are checked in-process, the two that build are run through the CPU tier in a pytest of their own (the
line-coverage plugin and the verdict line, as ``nox -s check`` runs them): the over-pick at ``G == E`` FAILs on the
non-EP path, the GPU-only line is INCOMPLETE with its line named. How vLLM calls ``fused_marlin_moe`` without EP
is read from the release (``ci.kernel.callers``), and the tile a build picks is recorded from the build
(``ci.moe.picks``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ci.core.errors import ExitCode, PatchError
from ci.kernel import callers
from ci.moe.picks import picked_block_size
from ci.trees.build import BuildOptions, build_trees
from ci.trees.release import Release
from tests.ep_marlin import cpu_harness as h

ROOT = Path(__file__).resolve().parents[2]
CRAFTED = ROOT / "tests" / "data" / "crafted"
WRITTEN_FOR = "0.25.1"


@pytest.fixture(scope="module")
def release(trees):
    if trees.manifest.vllm_version != WRITTEN_FOR or not trees.manifest.base_is_release:
        pytest.skip(f"the crafted patches are written against vLLM {WRITTEN_FOR} as released (forward, no overlay)")
    return Release(version=trees.manifest.vllm_version, root=trees.base, source="base tree")


def _build(release, name: str, tmp_path_factory):
    out = tmp_path_factory.mktemp(name) / "trees"
    return build_trees(BuildOptions(patch=CRAFTED / f"{name}.patch", contract="none", out=out), release=release)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("entry-hijack", "fused_moe/fused_moe.py is imported only through unchanged modules"),
        ("type-checking-only-module", "eep_reconfigure.py is imported only inside `if TYPE_CHECKING:` blocks"),
    ],
)
def test_a_type_checking_import_neither_hijacks_the_entry_nor_hides_a_module(name, says, release, tmp_path_factory):
    with pytest.raises(PatchError) as err:
        _build(release, name, tmp_path_factory)
    assert says in str(err.value) and err.value.exit_code == ExitCode.PATCH


def _cpu_tier(trees, *select: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--gate-manifest",
        str(trees.manifest_path),
        "-p",
        "no:cacheprovider",
        "-q",
        "tests/ep_marlin/test_block_size_selection.py",
        "-k",
        " or ".join(select),
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_a_change_of_a_gpu_only_line_gets_no_cpu_pass_and_the_line_is_named(release, tmp_path_factory):
    """Item 4: 'if hidden_states.is_cuda: expert_map = None' never runs on the CPU: the CPU tier said PASS."""
    trees = _build(release, "gpu-only-expert-map", tmp_path_factory)
    done = _cpu_tier(trees, "E8-ep2-topk2", "E8-epnone-topk2")
    assert done.returncode == ExitCode.INCOMPLETE, done.stdout[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    line = (trees.candidate / "vllm/model_executor/layers/fused_moe/experts/marlin_moe.py").read_text().splitlines()
    number = next(i for i, text in enumerate(line, 1) if text.strip() == "expert_map = None")
    assert last.startswith("gate: CPU tier INCOMPLETE: the tests passed, but 1 of the change's")
    assert f"vllm/model_executor/layers/fused_moe/experts/marlin_moe.py:{number};" in last
    assert "only the GPU suite can vouch for them" in last


def test_an_over_pick_at_g_equals_e_fails_the_non_ep_path(release, tmp_path_factory):
    """Item 8: 8 * M into the tile loop when G == E (the modular kernel's non-EP call): CPU tier PASS before."""
    trees = _build(release, "over-pick-at-g-equals-e", tmp_path_factory)
    done = _cpu_tier(trees, "test_undeclared_paths_keep_the_base_arguments and (E8-ep1-topk2 or E8-epnone-topk2)")
    assert done.returncode == ExitCode.FAILED, done.stdout[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert "on the non-EP fused path (1 failed test(s), first: test_block_size_selection.py::" in last
    assert "[E8-ep1-topk2]; first case: " in last and "G=8" in last


def test_every_non_ep_call_the_release_makes_is_in_the_grid(trees):
    """The release's callers of fused_marlin_moe, read from its code: each form of global_num_experts they can
    pass without EP (-1; E through the modular kernel) is a grid point of the CPU tier."""
    forms = callers.non_ep_forms(trees.base)
    assert callers.UNKNOWN not in forms, f"call sites the gate does not model: {forms[callers.UNKNOWN]}"
    assert forms, "no call of fused_marlin_moe found in the release"
    covered = {callers.MINUS_ONE: None, callers.LOCAL: 1}  # the grid's EP size for each form (cpu_harness)
    assert all(covered[f] in h.NON_EP_SIZES for f in forms)
    if trees.manifest.vllm_version == WRITTEN_FOR:
        assert set(forms) == {callers.MINUS_ONE, callers.LOCAL}  # 0.25.1: modular_kernel.py turns -1 into E


def test_the_tile_a_report_states_is_the_one_the_build_picks(trees, variants, tmp_path_factory):
    """TPOT's results state each build's pick from its own code (ci.moe.picks), not the gate's spec: the
    over-pick patch picks 16 at G == E where the base and the spec pick 8."""
    if trees.manifest.vllm_version != WRITTEN_FOR or not trees.manifest.base_is_release:
        pytest.skip(f"the crafted patch is written against vLLM {WRITTEN_FOR} as released (forward, no overlay)")
    from ci.moe import spec
    from ci.trees.variants import load_candidate

    release = Release(version=trees.manifest.vllm_version, root=trees.base, source="base tree")
    over = load_candidate(_build(release, "over-pick-at-g-equals-e", tmp_path_factory))
    call = dict(m=16, topk=8, local_experts=128, global_num_experts=128)  # a DP = 1 server's decode step
    base = variants[0].marlin_moe
    assert picked_block_size(base, **call) == spec.pick_block_size_m(16, 8, 128) == 8
    assert picked_block_size(over, **call) == 16
    assert picked_block_size(over, **{**call, "global_num_experts": -1}) == 8
    assert picked_block_size(variants[1].marlin_moe, **{**call, "global_num_experts": 256}, with_expert_map=True) == (
        spec.expected_block_size_m(
            m=16,
            topk=8,
            local_experts=128,
            global_experts=256,
            input_itemsize=2,
            patched=trees.manifest.contract is not None,
        )
    )
