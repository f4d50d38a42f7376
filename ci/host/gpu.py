"""GPU presence, the device fingerprint recorded with every result, and the machine key of baselines.

Presence is checked without importing torch (NVML through nvidia-ml-py, else
``nvidia-smi``), so ``nox -s gpu_tests`` can stop at once on a host without a GPU, before
installing anything.

The machine's state during a run is sampled by ``ci.host.gpu_state``; a run's own processes are found and
stopped by ``ci.host.procs``.

CLI: ``python -m ci.host.gpu check`` (exit 6 and one line when there is no usable GPU),
``python -m ci.host.gpu fingerprint`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ci.core.cli import run_main
from ci.core.errors import NoGPUError

NO_GPU_MESSAGE = (
    "no CUDA GPU on this host: the GPU suite, the benchmarks and TPOT run only on one; "
    "on any machine run the CPU tier instead: nox -s tests (or nox -s check for a patch)"
)
BUSY_MEMORY_FRACTION = 0.5  # another process holding over half of a GPU's memory makes timings meaningless


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_total_mib: int
    memory_used_mib: int
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    power_limit_w: float | None = None
    temperature_c: int | None = None
    power_draw_w: float | None = None
    processes: int | None = None


def visible_filter(count: int) -> list[int]:
    """Indices allowed by CUDA_VISIBLE_DEVICES (numeric form; other forms keep all)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(count))
    if env.strip() in ("", "-1"):
        return []
    try:
        return [i for i in (int(x) for x in env.split(",") if x.strip()) if 0 <= i < count]
    except ValueError:
        return list(range(count))


def _query_nvml() -> tuple[str, list[GpuInfo]] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return "", []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for i in visible_filter(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)

            def opt(fn, *args, h=h):
                try:
                    return fn(h, *args)
                except pynvml.NVMLError:
                    return None

            procs = opt(pynvml.nvmlDeviceGetComputeRunningProcesses)
            power = opt(pynvml.nvmlDeviceGetPowerManagementLimit)
            draw = opt(pynvml.nvmlDeviceGetPowerUsage)
            gpus.append(
                GpuInfo(
                    index=i,
                    name=_text(pynvml.nvmlDeviceGetName(h)),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                    memory_total_mib=mem.total // 2**20,
                    memory_used_mib=mem.used // 2**20,
                    sm_clock_mhz=opt(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM),
                    sm_clock_max_mhz=opt(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM),
                    mem_clock_mhz=opt(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM),
                    power_limit_w=None if power is None else power / 1000,
                    temperature_c=opt(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
                    power_draw_w=None if draw is None else draw / 1000,
                    processes=None if procs is None else len(procs),
                )
            )
        return _text(driver), gpus
    finally:
        pynvml.nvmlShutdown()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _query_smi() -> tuple[str, list[GpuInfo]]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "", []
    fields = "index,name,uuid,memory.total,memory.used,driver_version"
    done = subprocess.run(
        [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return "", []
    gpus, driver = [], ""
    for line in done.stdout.strip().splitlines():
        idx, name, uuid, total, used, driver = (x.strip() for x in line.split(","))
        gpus.append(
            GpuInfo(index=int(idx), name=name, uuid=uuid, memory_total_mib=int(total), memory_used_mib=int(used))
        )
    allowed = set(visible_filter(len(gpus)))
    return driver, [g for g in gpus if g.index in allowed]


def query() -> tuple[str, list[GpuInfo]]:
    """(driver version, visible GPUs); empty list when there is none."""
    found = _query_nvml()
    if found is None or not found[1]:
        smi = _query_smi()
        if smi[1]:
            return smi
    return found or ("", [])


def require_gpus() -> list[GpuInfo]:
    """The visible GPUs; a :class:`NoGPUError` with one clear line when there is none."""
    _, gpus = query()
    if not gpus:
        raise NoGPUError(NO_GPU_MESSAGE)
    return gpus


def busy_gpus(gpus: Sequence[GpuInfo]) -> list[str]:
    """Descriptions of GPUs another workload is using heavily (timings there would be noise)."""
    return [
        f"GPU {g.index} ({g.name}): {g.memory_used_mib} of {g.memory_total_mib} MiB in use by other processes"
        for g in gpus
        if g.memory_used_mib > BUSY_MEMORY_FRACTION * g.memory_total_mib
    ]


def fingerprint() -> dict:
    """Driver and per-GPU facts for provenance."""
    driver, gpus = query()
    return {"driver": driver, "count": len(gpus), "gpus": [asdict(g) for g in gpus]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.host.gpu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("command", choices=("check", "fingerprint"))
    args = parser.parse_args(argv)
    if args.command == "check":
        gpus = require_gpus()
        print(f"gpu: {len(gpus)} visible: " + ", ".join(f"{g.index}:{g.name}" for g in gpus))
        return 0
    print(json.dumps(fingerprint(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))


def require_idle_gpus(count: int = 1, *, allow_busy: bool = False, what: str = "timings will be noisy") -> list:
    """The first ``count`` visible GPUs, refused (:class:`GPUBusyError`) when another workload uses one
    heavily, unless ``allow_busy``; ``what`` says what a busy GPU would spoil."""
    from ci.core.errors import GPUBusyError

    gpus = require_gpus()[:count]
    busy = busy_gpus(gpus)
    if busy and not allow_busy:
        raise GPUBusyError(f"the GPU is busy: {busy[0]}; wait for it, or pass --allow-busy ({what})")
    return gpus
