"""GPU presence, per-worker pinning and the device fingerprint recorded with every result.

Presence is checked without importing torch (NVML through nvidia-ml-py, else
``nvidia-smi``), so ``nox -s gpu_tests`` can stop at once on a host without a GPU, before
installing anything.

CLI: ``python -m ci.gpu check`` (exit 6 and one line when there is no usable GPU),
``python -m ci.gpu fingerprint`` (JSON), ``python -m ci.gpu leftovers [--kill-own] [--run-id TAG]``
(this run's processes still alive: those whose environment carries ``GATE_RUN_ID=TAG``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ci import stats
from ci.cli import run_main
from ci.errors import NoGPUError, UsageError

NO_GPU_MESSAGE = (
    "no CUDA GPU on this host: gpu_tests needs one (the GPU suite, benchmarks and TPOT run only there); "
    "on any machine run the CPU tier instead: nox -s tests"
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


def _visible_filter(count: int) -> list[int]:
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
        for i in _visible_filter(pynvml.nvmlDeviceGetCount()):
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
    allowed = set(_visible_filter(len(gpus)))
    return driver, [g for g in gpus if g.index in allowed]


def query() -> tuple[str, list[GpuInfo]]:
    """(driver version, visible GPUs); empty list when there is none."""
    found = _query_nvml()
    if found is None or not found[1]:
        smi = _query_smi()
        if smi[1]:
            return smi
    return found or ("", [])


class StateSampler:
    """``with StateSampler() as s: ...`` samples the GPUs' clocks, power draw and temperature
    and the host's load once a second in a thread; ``s.summary()`` gives their medians. It
    explains a slow benchmark round (a clock that dropped, a host that was busy) and never
    fails the run: with no GPU or no NVML the GPU fields are simply absent."""

    def __init__(self, period_s: float = 1.0) -> None:
        import threading

        self.period_s, self.samples = period_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                gpus = query()[1]
            except Exception:  # a sampler must not break the run it watches
                gpus = []
            self.samples.append((gpus, os.getloadavg()[0]))
            self._stop.wait(self.period_s)

    def __enter__(self) -> StateSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def summary(self) -> dict:
        def median(xs):
            xs = [x for x in xs if x is not None]
            return stats.median(xs) if xs else None

        out: dict = {"samples": len(self.samples), "load_1min": median(load for _, load in self.samples)}
        indices = sorted({g.index for gpus, _ in self.samples for g in gpus})
        for field in ("sm_clock_mhz", "mem_clock_mhz", "power_draw_w", "temperature_c"):
            out[field] = [median(getattr(g, field) for gpus, _ in self.samples for g in gpus if g.index == i)
                          for i in indices]  # fmt: skip
        return out


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


def pin_xdist_worker() -> None:
    """Give each pytest-xdist worker its own GPU (gw0 -> first visible GPU, gw1 -> second, ...)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    _, gpus = query()
    if gpus:
        chosen = gpus[int(worker[2:]) % len(gpus)]
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the order NVML and nvidia-smi number GPUs in
        os.environ["CUDA_VISIBLE_DEVICES"] = str(chosen.index)


RUN_ID_ENV = "GATE_RUN_ID"  # every process a gate run starts carries it: leftovers are found by it, not by name


def run_id() -> str:
    """This run's tag (``$GATE_RUN_ID``, e.g. the workflow's run id), made up and exported when unset,
    so the servers and clients this process starts inherit it."""
    if not os.environ.get(RUN_ID_ENV):
        import secrets

        os.environ[RUN_ID_ENV] = f"{os.getpid()}-{secrets.token_hex(4)}"
    return os.environ[RUN_ID_ENV]


def _environ(proc: Path) -> dict[str, str]:
    raw = (proc / "environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def own_leftovers(tag: str) -> list[tuple[int, str]]:
    """(pid, command) of this user's processes that carry ``GATE_RUN_ID=tag`` (a run's servers, engines,
    clients), never another job's: two jobs on one runner each clean up only their own."""
    if not tag:
        raise UsageError(f"leftovers need a run tag: set {RUN_ID_ENV} (the workflows set it per job) or pass --run-id")
    found, mine = [], _ancestors()
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid in mine:  # this process and the shells that started it carry the tag too
            continue
        try:
            if proc.stat().st_uid != os.getuid() or _environ(proc).get(RUN_ID_ENV) != tag:
                continue
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append((pid, cmd))
    return found


def _ancestors() -> set[int]:
    """This process and its parents, up to init."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def kill_own_leftovers(tag: str) -> list[tuple[int, str]]:
    """SIGKILL the processes of run ``tag`` that are still there; return what was found."""
    found = own_leftovers(tag)
    for pid, _ in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return found


def fingerprint() -> dict:
    """Driver and per-GPU facts for provenance."""
    driver, gpus = query()
    return {"driver": driver, "count": len(gpus), "gpus": [asdict(g) for g in gpus]}


def slug(name: str, count: int) -> str:
    """``NVIDIA H200``, 1 -> ``nvidia-h200-x1`` (the baselines folder of that machine)."""
    clean = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    while "--" in clean:
        clean = clean.replace("--", "-")
    return f"{clean}-x{count}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["check"]:
        gpus = require_gpus()
        print(f"gpu: {len(gpus)} visible: " + ", ".join(f"{g.index}:{g.name}" for g in gpus))
        return 0
    if args and args[0] == "leftovers":
        tag = args[args.index("--run-id") + 1] if "--run-id" in args[:-1] else os.environ.get(RUN_ID_ENV, "")
        found = kill_own_leftovers(tag) if "--kill-own" in args else own_leftovers(tag)
        for pid, cmd in found:
            print(f"gpu: leftover process {pid}{' (killed)' if '--kill-own' in args else ''}: {cmd[:160]}")
        _, gpus = query()
        for g in gpus:
            print(f"gpu: GPU {g.index} {g.name}: {g.memory_used_mib} MiB in use after the job")
        return 0
    if args == ["fingerprint"]:
        print(json.dumps(fingerprint(), indent=1))
        return 0
    print("usage: python -m ci.gpu check|fingerprint|leftovers [--kill-own] [--run-id TAG]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(run_main(main))
