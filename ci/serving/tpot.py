"""End-to-end TPOT. ``vllm serve`` from each tree, ``vllm bench serve`` against it, A/B.

What is served and sent (models, profiles, command lines) is ``ci.serving.config``; this module
starts the servers, drives the client, schedules the rounds and writes the results.

The unit of evidence is a launch pair: both servers started (which one first alternates per pair),
warmed up, settled (short runs until each server's TPOT is stable, ``ci.serving.config.Profile``),
then the pair's rounds, alternating builds (a, b, b, a), then both stopped. Each round is one
``vllm bench serve`` run and contributes its median TPOT; the launch pair of each round is its
capture (``extra.blocks``), so ``ci.core.compare`` takes the interval over launch pairs with the
same blocked statistics as the kernel bench. The server's own mean inter-token latency
(``/metrics``) is recorded beside each round. By default one client process
(``ci/serving/bench_client.py``: vLLM's own ``vllm.benchmarks.serve``, imported once, from the base
tree) runs every round, so a round costs its measurement and not a vLLM import; the same
instrument measures both builds. ``--bench-client cli`` runs the ``vllm bench serve`` command
from the measured build's tree instead, one process per round. A pair's servers stay up side by side
(``--server-mode concurrent``, each given a share of GPU memory, started one after the
other) or run one after the other, each alone on the GPU (``sequential``).

Usage: ``python -m ci.serving.tpot --manifest M [--model qwen3-30b-a3b-like] [--profile pr] [--dp N] --out DIR``;
``python -m ci.serving.tpot --block-sizes --profile pr-ep --dp 2`` prints the block size each build picks in decode.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ci.core import stats
from ci.core.cli import run_main
from ci.core.errors import DataError, GPUBusyError, MissingDependencyError, NoGPUError, ServerError, UsageError
from ci.core.results import BenchResults, CaseResult
from ci.runner import gpu, gpu_state, outputs, procs
from ci.serving.config import (
    BUILDS,
    PROFILES,
    Profile,
    bench_args,
    bench_argv,
    block_size_table,
    case_id,
    decode_block_sizes,
    kv_cache_bytes,
    model_dir,
    models,
    moe_backend_flag,
    serve_argv,
    served_name,
    server_env,
    suite_name,
)
from ci.serving.server import Server, free_port, log_tail, server_itl_ms
from ci.trees import provenance
from ci.trees.build import Trees, load_trees, sha256_file

DEFAULT_PORT = 18000
CLIENTS = {
    "inprocess": "one ci/serving/bench_client.py process (vllm.benchmarks.serve of the base tree) for every round",
    "cli": "one vllm bench serve command per round, from the measured build's tree",
}
CLIENT_SCRIPT = Path(__file__).resolve().parent / "bench_client.py"
INJECT_DIR = Path(__file__).resolve().parent / "inject"  # sitecustomize: the injected slowdown
# what makes two TPOT runs comparable (ci.core.evidence checks them against a baseline)
IDENTITY_KEYS = ("model", "model_config_sha256", "dp", "expert_parallel", "profile", "server_mode", "start")
STARTS = {
    "serial": "a pair's servers start one after the other, each sizing its KV cache from the free memory",
    "parallel": "a pair's servers start at once, each with a fixed KV cache (--kv-cache-memory-bytes)",
}
CLIENT_IMPORT_TIMEOUT_S = 600.0
# profile fields a run may override (flag: field, type, least value); the results record the profile as run
PROFILE_OVERRIDES = {"--launches": ("launches", int, 1), "--rounds-per-launch": ("rounds", int, 1),
                     "--settle-max-s": ("settle_max_s", float, 0.0)}  # fmt: skip
ROUND_TIMEOUT_S = 3600.0  # one vllm bench serve run; the nightly profile takes a few minutes


@dataclass(frozen=True, kw_only=True)
class RoundResult:
    build: str
    median_tpot_ms: float
    mean_tpot_ms: float
    median_ttft_ms: float
    output_throughput: float
    completed: int
    failed: int
    machine: dict | None = None  # GPU clock, power, temperature and host load during the round (medians)
    launch: int = 0  # the launch pair the round was measured in
    server_itl_ms: float | None = None  # the server's own mean inter-token latency over the round (/metrics)


class BenchClient:
    """``ci/serving/bench_client.py`` in its own process: vLLM's bench client imported once, one round per request.

    Rounds are sent as the argument lists of ``vllm bench serve``; a failed round, a client that
    dies or hangs, is an error naming the client's log."""

    def __init__(self, tree: Path, log: Path) -> None:
        self.tree, self.log = tree, log
        self.proc: subprocess.Popen | None = None
        self.import_s: float | None = None

    def start(self) -> BenchClient:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, str(CLIENT_SCRIPT), "--log", str(self.log)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=server_env(self.tree), start_new_session=True)  # fmt: skip
        return self

    def _reply(self, what: str, timeout_s: float) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            if ready:  # end of output: the client is gone; reap it to name its exit code
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
            state = f"exited with code {self.proc.poll()}" if ready else f"gave no answer in {timeout_s:.0f} s"
            raise ServerError(f"the bench client ({what}) {state}; last lines of {self.log}:\n{log_tail(self.log)}")
        return json.loads(line)

    def wait_ready(self) -> float:
        if self.import_s is None:
            answer = self._reply("importing vllm.benchmarks.serve", CLIENT_IMPORT_TIMEOUT_S)
            if not answer.get("ready"):
                raise MissingDependencyError(
                    f"{answer.get('error')} (tree {self.tree}); this vLLM may predate vllm.benchmarks.serve: "
                    f"use --bench-client cli; details in {self.log}"
                )
            self.import_s = float(answer["import_s"])
        return self.import_s

    def run(self, args: list[str], tag: str) -> None:
        self.wait_ready()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"argv": args, "tag": tag}) + "\n")
        self.proc.stdin.flush()
        answer = self._reply(tag, ROUND_TIMEOUT_S)
        if not answer.get("ok"):
            raise ServerError(f"vllm bench serve ({tag}) failed: {answer.get('error')}; see {self.log}")

    def close(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # the client's loop ends at end of input
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        self.proc.stdout.close()
        self.proc = None


def parse_bench_result(path: Path, build: str) -> RoundResult:
    """Read a ``vllm bench serve --save-result`` file; refuse one without the numbers we gate on."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot read the vllm bench serve result ({exc})") from exc
    keys = ("median_tpot_ms", "mean_tpot_ms", "median_ttft_ms", "output_throughput", "completed")
    missing = [k for k in keys if not isinstance(data.get(k), (int, float))]
    if missing:
        raise DataError(f"{path}: vllm bench serve result lacks {missing}; is this a --save-result file?")
    failed = int(data.get("failed", 0) or 0)
    if data["completed"] == 0 or failed:
        raise ServerError(f"{path}: {failed} requests failed, {data['completed']} completed; see the server log")
    return RoundResult(build=build, **{k: float(data[k]) for k in keys[:-1]}, completed=int(data["completed"]),
                       failed=failed)  # fmt: skip


def launch_order(launch: int) -> tuple[str, str]:
    """Which build starts first in launch pair ``launch``: base in even pairs, candidate in odd ones, so
    start order and memory placement are balanced over an even number of pairs."""
    return BUILDS if launch % 2 == 0 else BUILDS[::-1]


def round_order(rounds: int, first: Sequence[str] = BUILDS) -> list[str]:
    """The rounds of one launch pair, balanced against drift: a b b a a b ... (``first`` starts)."""
    return stats.interleaved_order(rounds, tuple(first))


def run_order(profile: Profile, mode: str = "concurrent") -> list[tuple[int, str]]:
    """Every round of a run as (launch pair, build), in the order measured: concurrent mode interleaves a
    pair's rounds, sequential mode runs each server's rounds while it is up alone."""
    if mode == "sequential":
        return [(p, b) for p in range(profile.launches) for b in launch_order(p) for _ in range(profile.rounds)]
    return [(p, b) for p in range(profile.launches) for b in round_order(profile.rounds, launch_order(p))]


def settled(medians: Sequence[float], window: int, tolerance: float) -> bool:
    """The last ``window`` settling runs of one server agree within ``tolerance`` (max / min - 1)."""
    last = list(medians)[-window:]
    return len(last) >= window and max(last) / min(last) - 1 <= tolerance


@dataclass
class Runner:
    trees: Trees
    model: Path
    profile: Profile
    dp: int
    out_dir: Path
    health_timeout_s: float
    seed: int = 0
    client: BenchClient | None = None  # None: one ``vllm bench serve`` command per round
    aa: bool = False  # A/A: the "candidate" server runs the base tree too
    start: str = "serial"  # STARTS
    inject_sleep_us: float = 0.0  # > 0 (A/A only): a GPU sleep in each fused_marlin_moe call of the candidate

    def tree(self, build: str) -> Path:
        return self.trees.base if build == "base" or self.aa else self.trees.candidate

    def server(self, build: str, port: int, launch: int) -> Server:
        name = served_name(build)
        kv = kv_cache_bytes(self.model, self.profile, self.dp) if self.start == "parallel" else None
        argv = serve_argv(self.tree(build), self.model, port=port, profile=self.profile, dp=self.dp, seed=self.seed,
                          name=name, kv_bytes=kv)  # fmt: skip
        env = server_env(self.tree(build))
        if build == "candidate" and self.inject_sleep_us > 0:  # ci/serving/inject/sitecustomize.py
            env["PYTHONPATH"] = os.pathsep.join([str(INJECT_DIR), env["PYTHONPATH"]])
            env["GATE_INJECT_SLEEP_US"] = str(self.inject_sleep_us)
        return Server(f"vllm serve ({build}, launch {launch})", argv, port=port,
                      log=self.out_dir / f"server-l{launch}-{build}.log", env=env, served_name=name)  # fmt: skip

    def bench(self, build: str, server: Server, tag: str, prompts: int) -> RoundResult:
        out = self.out_dir / f"bench-{tag}.json"
        kw = {"port": server.port, "profile": self.profile, "prompts": prompts, "out": out, "seed": self.seed,
              "name": server.served_name}  # fmt: skip
        out.unlink(missing_ok=True)  # a file left by an earlier run must not pass for this round's
        before = server.metrics()
        with gpu_state.StateSampler() as machine:
            if self.client is not None:
                try:
                    self.client.run(bench_args(self.model, **kw), tag)
                finally:
                    server.check_alive()
            else:
                log = self.out_dir / f"bench-{tag}.log"
                with open(log, "wb") as fh:
                    argv = bench_argv(self.model, **kw)
                    env = server_env(self.tree(build))
                    done = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
                server.check_alive()
                if done.returncode != 0:
                    raise ServerError(f"vllm bench serve ({tag}) exited with {done.returncode}; see {log}")
        itl = server_itl_ms(before, server.metrics())
        return replace(parse_bench_result(out, build), machine=machine.summary(), server_itl_ms=itl)


def _start(runner: Runner, group: Sequence[str], launch: int, servers: dict[str, Server], record: dict) -> None:
    """Start the servers of ``group`` and warm each up: one after the other (start, healthy, warm-up; the
    seconds to healthy are each server's own), or all at once with ``runner.start`` parallel (the seconds are
    from the pair's start)."""
    parallel = runner.start == "parallel"
    t0 = time.monotonic()
    if parallel:
        for build in group:
            servers[build] = runner.server(build, _port(launch, servers), launch).start()
    for build in group:
        if not parallel:
            t0 = time.monotonic()
            servers[build] = runner.server(build, _port(launch, servers), launch).start()
        servers[build].wait_healthy(runner.health_timeout_s)
        record["startup_s"][build] = round(time.monotonic() - t0, 1)
        print(f"tpot: launch {launch}: {build} server healthy after {record['startup_s'][build]} s on port "
              f"{servers[build].port}", flush=True)  # fmt: skip
        if not parallel:
            _warm_up(runner, build, launch, servers, record)
    for build in group if parallel else ():
        _warm_up(runner, build, launch, servers, record)


def _warm_up(runner: Runner, build: str, launch: int, servers: dict[str, Server], record: dict) -> None:
    if runner.client is not None:
        runner.client.wait_ready()
    w0 = time.monotonic()
    runner.bench(build, servers[build], f"warmup-l{launch}-{build}", runner.profile.warmup_prompts)
    record["warmup_s"][build] = round(time.monotonic() - w0, 1)


def _port(launch: int, servers: dict[str, Server]) -> int:
    """Ports of their own per launch and build: a server of the pair before may still be releasing its port."""
    return free_port(DEFAULT_PORT + 10 * (2 * launch + len(servers)))


def _settle(runner: Runner, builds: Sequence[str], servers: dict[str, Server], launch: int, since: float) -> dict:
    """Short runs, the servers in turn, until each is stable (``settled``) or the profile's cap has passed
    since ``since`` (the launch); what was run, for the timeline."""
    p = runner.profile
    medians: dict[str, list[float]] = {b: [] for b in builds}
    t0, i = time.monotonic(), 0
    while p.settle_max_s > 0 and time.monotonic() - since < p.settle_max_s:
        if all(settled(medians[b], p.settle_window, p.settle_tolerance) for b in builds):
            break
        build = builds[i % len(builds)]
        r = runner.bench(build, servers[build], f"settle-l{launch}-{i:02d}-{build}", p.settle_prompts)
        medians[build].append(r.median_tpot_ms)
        i += 1
    return {
        "builds": list(builds),
        "runs": i,
        "seconds": round(time.monotonic() - t0, 1),
        "settled": all(settled(medians[b], p.settle_window, p.settle_tolerance) for b in builds),
        "median_tpot_ms": medians,
    }


def run_launches(runner: Runner, mode: str, on_round=None) -> tuple[list[RoundResult], dict]:
    """Every launch pair of the run: start both servers (the pair's first build first), warm each up,
    settle, measure the pair's rounds, stop both. Servers are always stopped.

    Concurrent mode keeps the pair's two servers up side by side and interleaves their rounds;
    sequential mode runs one server at a time (start, warm up, settle, its rounds, stop), each
    with the GPU to itself. ``on_round(rounds, timeline)`` runs after every round (the CLI saves
    partial results there, so an interrupted run keeps what it measured). The timeline records,
    per launch pair, the start order, each server's start-up, warm-up and settling, and when its
    rounds began and ended."""
    started, rounds = time.monotonic(), []
    timeline: dict = {"launches": []}
    servers: dict[str, Server] = {}
    p = runner.profile
    if runner.client is not None:
        runner.client.start()  # imports vLLM while the first server starts
    try:
        for launch in range(p.launches):
            order = launch_order(launch)
            record: dict = {"launch": launch, "order": list(order), "startup_s": {}, "warmup_s": {},
                            "began_after_s": round(time.monotonic() - started, 1)}  # fmt: skip
            timeline["launches"].append(record)
            since = time.monotonic()
            groups = [order] if mode == "concurrent" else [(b,) for b in order]
            for group in groups:
                _start(runner, group, launch, servers, record)
                if runner.client is not None and "bench_client_import_s" not in timeline:
                    timeline["bench_client_import_s"] = runner.client.wait_ready()
                record.setdefault("settle", []).append(_settle(runner, group, servers, launch, since))
                record.setdefault("first_round_after_s", round(time.monotonic() - started, 1))
                for build in round_order(p.rounds, group) if len(group) > 1 else [group[0]] * p.rounds:
                    tag = f"r{len(rounds):03d}-l{launch}-{build}"
                    result = replace(runner.bench(build, servers[build], tag, p.prompts), launch=launch)
                    rounds.append(result)
                    if on_round is not None:
                        on_round(rounds, timeline)
                    _progress(rounds, p, started)
                for build in group:
                    servers.pop(build).stop()
                since = time.monotonic()
            record["ended_after_s"] = round(time.monotonic() - started, 1)
        timeline["total_s"] = round(time.monotonic() - started, 1)
    finally:
        with _signals_held():  # a second Ctrl-C or SIGTERM must not cut the clean-up short
            for s in servers.values():
                s.stop()
            if runner.client is not None:
                runner.client.close()
    return rounds, timeline


def _progress(rounds: list[RoundResult], p: Profile, started: float) -> None:
    r = rounds[-1]
    so_far = {b: [x.median_tpot_ms for x in rounds if x.build == b] for b in BUILDS}
    print(
        f"tpot round {len(rounds)}/{2 * p.rounds_per_build} (launch {r.launch}) {r.build}: median TPOT "
        f"{r.median_tpot_ms:.3f} ms, server ITL {'-' if r.server_itl_ms is None else f'{r.server_itl_ms:.3f}'} ms; "
        + " ".join(f"{b} {stats.median(v):.3f}" for b, v in so_far.items() if v)
        + f" ms so far, {time.monotonic() - started:.0f} s",
        flush=True,
    )


@contextlib.contextmanager
def _signals_held():
    """Ignore SIGINT and SIGTERM in the block (main thread only), then restore the handlers."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def results_from_rounds(trees: Trees, model: str, profile_name: str, dp: int, mode: str, rounds: list[RoundResult],
                        timeline: dict, client: str = "inprocess", aa: bool = False,
                        profile: Profile | None = None, start: str = "serial",
                        inject_sleep_us: float = 0.0) -> BenchResults:  # fmt: skip
    """The results file of a TPOT A/B: one case, the median TPOT of each round as its samples, and the
    launch pair of each sample as its capture (``extra.blocks``): the core's interval is over the pairs."""
    profile = profile or PROFILES[profile_name]
    complete = len(rounds) == 2 * profile.rounds_per_build
    case = CaseResult(
        id=case_id(model, profile_name, dp),
        unit="ms median TPOT",
        samples={b: [r.median_tpot_ms for r in rounds if r.build == b] for b in BUILDS},
        info={
            "model": model,
            "model_config_sha256": sha256_file(model_dir(model) / "config.json"),
            "dp": dp,
            "expert_parallel": dp > 1,
            "profile": asdict(profile),
            "moe_backend_flag": moe_backend_flag(trees.base) or "none (auto)",
            "server_mode": mode,
            "bench_client": CLIENTS[client],
            "start": start,
            "kv_cache_bytes": kv_cache_bytes(model_dir(model), profile, dp)
            if start == "parallel"
            else "from free memory",
            "decode_block_size_m": [r for r in decode_block_sizes(model_dir(model), profile, dp) if r["profile"]],
        },
        extra={
            "blocks": {b: [r.launch for r in rounds if r.build == b] for b in BUILDS},
            "rounds": [asdict(r) for r in rounds],
            "timeline": timeline,
        },
    )
    return BenchResults(
        kind="tpot-bench",
        suite=suite_name(model, profile_name, dp),
        provenance=provenance.collect(trees),
        settings={
            "launches": profile.launches,
            "rounds_per_launch": profile.rounds,
            "rounds_per_build": profile.rounds_per_build,
            "order": [f"{launch}:{build}" for launch, build in run_order(profile, mode)],
            "server_mode": mode,
            "complete": complete,
            "rounds_done": len(rounds),
            "aa": aa,
            "candidate": ("base (A/A run)" if aa else "candidate tree")
            + (f" with a GPU sleep of {inject_sleep_us} us in each fused_marlin_moe call" if inject_sleep_us else ""),
            "inject_sleep_us": inject_sleep_us,
            "expected_cases": [case_id(model, profile_name, dp)],
            "identity_keys": list(IDENTITY_KEYS),
        },
        cases=[case],
    )


def run_tpot(trees: Trees, model: str, profile_name: str, dp: int, out_dir: Path, mode: str, timeout: float,
             save_to: Path | None = None, client: str = "inprocess", aa: bool = False,
             overrides: dict | None = None, start: str = "serial",
             inject_sleep_us: float = 0.0) -> BenchResults:  # fmt: skip
    """One TPOT A/B (or A/A); ``overrides`` replaces fields of the profile (``--launches``, ...), and the
    results record the profile as run; ``start``: how a pair's servers start (``STARTS``)."""
    profile = replace(PROFILES[profile_name], **(overrides or {}))
    bench_client = BenchClient(trees.base, out_dir / "bench-client.log") if client == "inprocess" else None
    if inject_sleep_us and not aa:
        raise UsageError("--inject-sleep-us slows the candidate of an A/A run (the error rates): pass --aa too")
    runner = Runner(trees, model_dir(model), profile, dp, out_dir, timeout, client=bench_client, aa=aa, start=start,
                    inject_sleep_us=inject_sleep_us)  # fmt: skip

    def results(rounds, timeline):
        return results_from_rounds(trees, model, profile_name, dp, mode, rounds, timeline, client, aa, profile,
                                   start, inject_sleep_us)  # fmt: skip

    def save(rounds, timeline):
        if save_to is not None:
            results(rounds, timeline).save(save_to)

    return results(*run_launches(runner, mode, on_round=save))


ROUND_FILE = "bench-r[0-9][0-9][0-9]-l*-*.json"  # bench-r<NNN>-l<launch>-<build>.json


def rounds_from_dir(directory: Path) -> list[RoundResult]:
    """The rounds of a (possibly interrupted) run, from its ``bench-r<NNN>-l<launch>-<build>.json`` files."""
    files = sorted(directory.glob(ROUND_FILE))
    if not files:
        raise DataError(f"{directory}: no {ROUND_FILE} round files")
    found = []
    for f in files:
        _, launch, build = f.stem.removeprefix("bench-").split("-", 2)
        found.append(replace(parse_bench_result(f, build), launch=int(launch.removeprefix("l"))))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.serving.tpot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, help="the trees' manifest.json (from ci.trees.build)")
    parser.add_argument("--model", default="qwen3-30b-a3b-like", help=f"one of {models()}")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="pr")
    parser.add_argument("--dp", type=int, help="data-parallel size = EP size (default: every visible GPU)")
    parser.add_argument("--server-mode", choices=("concurrent", "sequential"), default="concurrent")
    parser.add_argument("--start", choices=sorted(STARTS), default="serial",
                        help="; ".join(f"{k}: {v}" for k, v in STARTS.items()))  # fmt: skip
    parser.add_argument(
        "--bench-client",
        choices=sorted(CLIENTS),
        default="inprocess",
        help="; ".join(f"{k}: {v}" for k, v in CLIENTS.items()),
    )
    parser.add_argument("--health-timeout", type=float, default=600.0, help="seconds to wait for /health")
    parser.add_argument("--aa", action="store_true", help="A/A run: both servers run the base tree (the noise floor)")
    parser.add_argument("--inject-sleep-us", type=float, default=0.0, metavar="US",
                        help="with --aa: a GPU sleep of US microseconds in each fused_marlin_moe call of the candidate "
                        "server, captured into its CUDA graphs (the error rates)")  # fmt: skip
    for flag, (field, kind, _) in PROFILE_OVERRIDES.items():
        parser.add_argument(flag, dest=field, type=kind, help=f"the profile's {field}, overridden (recorded)")
    parser.add_argument("--out", type=Path, help=f"folder for {outputs.TPOT_RESULTS} and the run's logs")
    parser.add_argument("--allow-busy", action="store_true", help="measure even if another process uses the GPU")
    parser.add_argument("--block-sizes", action="store_true", help="print the block_size_m each build picks in "
                        "decode for --model, --profile and --dp (default 1), and exit (no GPU needed)")  # fmt: skip
    parser.add_argument("--from-rounds", type=Path, help="rebuild the results of an interrupted run from its folder")
    parser.add_argument("--dp-of-rounds", type=int, default=1, help="with --from-rounds: the DP size that run used")
    args = parser.parse_args(argv)
    overrides = {f: v for f, _, _ in PROFILE_OVERRIDES.values() if (v := getattr(args, f)) is not None}
    bad = [f"{flag} {v}" for flag, (f, _, low) in PROFILE_OVERRIDES.items() if (v := overrides.get(f, low)) < low]
    if bad:
        raise UsageError(f"{', '.join(bad)}: launches and rounds need at least 1, the settling cap at least 0 s")
    if args.inject_sleep_us < 0 or (args.inject_sleep_us and not args.aa):
        raise UsageError(f"--inject-sleep-us {args.inject_sleep_us}: a positive sleep, with --aa (the candidate of an "
                         "A/A run is slowed; the error rates)")  # fmt: skip
    if args.start == "parallel" and args.server_mode == "sequential":
        raise UsageError("--start parallel starts a pair's two servers at once: it needs --server-mode concurrent")
    if args.block_sizes:
        dp = args.dp or 1
        print(f"{args.model}, profile {args.profile}, DP = EP = {dp}: block_size_m per decode step (ci.kernel.spec)")
        print(block_size_table(decode_block_sizes(model_dir(args.model), PROFILES[args.profile], dp)))
        return 0
    missing = [flag for flag, value in (("--manifest", args.manifest), ("--out", args.out)) if value is None]
    if missing:
        raise UsageError(f"python -m ci.serving.tpot needs {' and '.join(missing)} (or --block-sizes)")
    out = outputs.results_file(args.out, outputs.TPOT_RESULTS)
    trees = load_trees(args.manifest)
    if args.from_rounds:
        rounds = rounds_from_dir(args.from_rounds)
        profile = replace(PROFILES[args.profile], **overrides)
        results = results_from_rounds(trees, args.model, args.profile, args.dp_of_rounds, args.server_mode, rounds, {},
                                      args.bench_client, args.aa, profile, args.start)  # fmt: skip
        results.save(out)
        print(f"tpot: {len(rounds)} rounds from {args.from_rounds} written to {out}")
        return 0
    gpus = gpu.require_gpus()
    dp = args.dp or len(gpus)
    if dp > len(gpus):
        raise NoGPUError(f"--dp {dp} needs {dp} GPUs; {len(gpus)} visible")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: servers stop
    print(f"tpot: run tag {procs.RUN_ID_ENV}={procs.run_id()} (servers answer as {served_name('<build>')})", flush=True)
    busy = gpu.busy_gpus(gpus[:dp])
    if busy and not args.allow_busy:
        raise GPUBusyError(f"the GPU is busy: {busy[0]}; wait for it, or pass --allow-busy (TPOT will be noisy)")
    results = run_tpot(trees, args.model, args.profile, dp, args.out, args.server_mode, args.health_timeout,
                       save_to=out, client=args.bench_client, aa=args.aa, overrides=overrides,
                       start=args.start, inject_sleep_us=args.inject_sleep_us)  # fmt: skip
    results.save(out)
    print(f"tpot: results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
