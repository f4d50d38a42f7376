"""The machine's state while a benchmark runs: GPU clocks, power, temperature and the host's load."""

from __future__ import annotations

import os

from ci.core import stats
from ci.host.gpu import query


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
            out[field] = [
                median(getattr(g, field) for gpus, _ in self.samples for g in gpus if g.index == i) for i in indices
            ]
        return out
