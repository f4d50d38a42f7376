"""GPU detection and clean-up helpers, on a host without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ci.core.errors import NoGPUError
from ci.host import gpu, gpu_state, procs


def test_no_gpu_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(gpu, "query", lambda: ("", []))
    with pytest.raises(NoGPUError, match="nox -s tests"):
        gpu.require_gpus()


def test_cuda_visible_devices_filters(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert gpu.visible_filter(4) == [1, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu.visible_filter(4) == []


def test_busy_gpu_is_reported():
    g = gpu.GpuInfo(index=0, name="NVIDIA H200", uuid="u", memory_total_mib=100, memory_used_mib=80)
    assert gpu.busy_gpus([g]) and not gpu.busy_gpus([gpu.GpuInfo(**{**g.__dict__, "memory_used_mib": 10})])


def test_state_sampler_summarises_medians(monkeypatch):
    clocks = iter([1980, 1500, 1980, 1980, 1980, 1980, 1980, 1980])

    def fake_query():
        g = gpu.GpuInfo(
            index=0,
            name="NVIDIA H200",
            uuid="u",
            memory_total_mib=1,
            memory_used_mib=0,
            sm_clock_mhz=next(clocks, 1980),
            power_draw_w=400.0,
            temperature_c=40,
        )
        return "580", [g]

    monkeypatch.setattr(gpu_state, "query", fake_query)
    with gpu_state.StateSampler(period_s=0.01) as sampler:
        time.sleep(0.1)
    summary = sampler.summary()
    assert summary["samples"] >= 3 and summary["load_1min"] is not None
    assert summary["sm_clock_mhz"] == [1980] and summary["power_draw_w"] == [400.0]


def test_state_sampler_never_breaks_the_run(monkeypatch):
    monkeypatch.setattr(gpu_state, "query", lambda: 1 / 0)
    with gpu_state.StateSampler(period_s=0.01) as sampler:
        time.sleep(0.05)
    assert sampler.summary()["sm_clock_mhz"] == [] and sampler.summary()["samples"] >= 1


def _sleeper(tag: str) -> subprocess.Popen:
    env = {**os.environ, procs.RUN_ID_ENV: tag}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "vllm.entrypoints.cli.main"], env=env)


def test_leftovers_kill_only_this_runs_processes(capsys, monkeypatch):
    """Two jobs on one runner: job A's clean-up kills A's server, never B's (same user, same name)."""
    mine, other = _sleeper("job-a-1"), _sleeper("job-b-1")
    try:
        deadline = time.time() + 5
        while not Path(f"/proc/{mine.pid}/environ").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert [pid for pid, _ in procs.own_leftovers("job-a-1")] == [mine.pid]
        monkeypatch.setenv(procs.RUN_ID_ENV, "job-a-1")
        assert procs.main(["leftovers", "--kill-own"]) == 0 and f"{mine.pid} (killed)" in capsys.readouterr().out
        deadline = time.time() + 5
        while mine.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert mine.poll() is not None, "this run's process survived its clean-up"
        assert other.poll() is None, "the clean-up killed another job's process"
        assert procs.main(["leftovers", "--run-id", "job-b-1"]) == 0 and str(other.pid) in capsys.readouterr().out
    finally:
        mine.kill()
        other.kill()


def test_leftovers_without_a_run_tag_refuse_to_guess(monkeypatch):
    from ci.core.cli import run_main
    from ci.core.errors import ExitCode

    monkeypatch.delenv(procs.RUN_ID_ENV, raising=False)
    assert run_main(procs.main, ["leftovers", "--kill-own"]) == ExitCode.USAGE


def test_cli_check_exits_with_no_gpu_code(monkeypatch):
    from ci.core.cli import run_main
    from ci.core.errors import ExitCode

    monkeypatch.setattr(gpu, "query", lambda: ("", []))
    assert run_main(gpu.main, ["check"]) == ExitCode.NO_GPU


def test_leftovers_spare_the_shell_that_runs_the_clean_up(tmp_path):
    """A workflow step's shell carries the job's tag too: the clean-up must not kill it (nor itself)."""
    env = {**os.environ, procs.RUN_ID_ENV: "job-c-1"}
    script = "from ci.host import procs; print(sorted(pid for pid, _ in procs.own_leftovers('job-c-1')))"
    root = Path(__file__).resolve().parents[2]
    command = ["bash", "-c", f'echo "$$"; "{sys.executable}" -c "{script}"']
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=root, check=True)
    shell, found = done.stdout.splitlines()
    assert found == "[]", f"the clean-up found its own shell {shell} or itself: {found}"
