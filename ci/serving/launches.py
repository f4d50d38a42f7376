"""The launch pairs of a TPOT run: start both servers (which first alternates per pair), warm each up,
settle, measure the pair's rounds (a, b, b, a), stop both; the timeline of what each pair did.

The unit of evidence is the launch pair: each round records its pair, which ``ci.serving.tpot`` writes as
the round's capture, so the interval is over pairs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from ci.core import stats
from ci.core.errors import ServerError
from ci.host import gpu_state
from ci.serving.client import BenchClient, RoundResult, parse_bench_result
from ci.serving.config import (
    BUILDS,
    Profile,
    bench_args,
    bench_argv,
    kv_cache_bytes,
    memory_fraction,
    serve_argv,
    served_name,
    server_env,
)
from ci.serving.server import Server, free_port, log_tail, server_itl_ms
from ci.trees.manifest import Trees

DEFAULT_PORT = 18000
# A server that died starting because another took the port vLLM had just found free (torch.distributed's
# store, between vLLM's probe and its bind: servers that start at once race for them; one of the H200's runs
# of 2026-12-01) is started again, so often at most; its first log is kept beside the new one
PORT_RACE = "EADDRINUSE"
PORT_RACE_RESTARTS = 2
INJECT_DIR = Path(__file__).resolve().parent / "inject"  # sitecustomize: the injected slowdown
STARTS = {
    "serial": "a pair's servers start one after the other, each sizing its KV cache from the free memory",
    "parallel": "a pair's servers start at once, each with a fixed KV cache (--kv-cache-memory-bytes)",
}


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
        parallel = self.start == "parallel"
        kv = kv_cache_bytes(self.model, self.profile, self.dp) if parallel else None
        argv = serve_argv(
            self.tree(build),
            self.model,
            port=port,
            profile=self.profile,
            dp=self.dp,
            seed=self.seed,
            name=name,
            kv_bytes=kv,
            memory_fraction=memory_fraction(self.profile, parallel),
        )
        env = server_env(self.tree(build))
        if build == "candidate" and self.inject_sleep_us > 0:  # ci/serving/inject/sitecustomize.py
            env["PYTHONPATH"] = os.pathsep.join([str(INJECT_DIR), env["PYTHONPATH"]])
            env["GATE_INJECT_SLEEP_US"] = str(self.inject_sleep_us)
        return Server(
            f"vllm serve ({build}, launch {launch})",
            argv,
            port=port,
            log=self.out_dir / f"server-l{launch}-{build}.log",
            env=env,
            served_name=name,
        )

    def bench(self, build: str, server: Server, tag: str, prompts: int) -> RoundResult:
        out = self.out_dir / f"bench-{tag}.json"
        kw = {
            "port": server.port,
            "profile": self.profile,
            "prompts": prompts,
            "out": out,
            "seed": self.seed,
            "name": server.served_name,
        }
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


Key = tuple[int, str]  # (launch pair, build): one server


def launch_groups(profile: Profile, start: str, first: int = 0, pairs: int | None = None) -> list[list[int]]:
    """The launch pairs that start together: ``pairs_at_once`` consecutive pairs with ``start`` parallel (one
    pair at a time otherwise), the last group holding what is left; pairs ``first`` to ``first + pairs`` (all
    the profile's by default: a sequential run adds groups of pairs after them)."""
    k = max(1, profile.pairs_at_once) if start == "parallel" else 1
    end = first + (profile.launches if pairs is None else pairs)
    return [list(range(g, min(g + k, end))) for g in range(first, end, k)]


def _start(runner: Runner, keys: Sequence[Key], servers: dict[Key, Server], records: dict[int, dict]) -> None:
    """Start the servers of ``keys`` and warm each up: one after the other (start, healthy, warm-up; the
    seconds to healthy are each server's own), or all at once with ``runner.start`` parallel (the seconds are
    from the group's start)."""
    parallel = runner.start == "parallel"
    t0 = time.monotonic()
    if parallel:
        for key in keys:
            servers[key] = runner.server(key[1], _port(key, records[key[0]]), key[0]).start()
    for key in keys:
        pair, build = key
        if not parallel:
            t0 = time.monotonic()
            servers[key] = runner.server(build, _port(key, records[pair]), pair).start()
        _wait_healthy(runner, key, servers, records[pair])
        records[pair]["startup_s"][build] = round(time.monotonic() - t0, 1)
        print(
            f"tpot: launch {pair}: {build} server healthy after {records[pair]['startup_s'][build]} s on port "
            f"{servers[key].port}",
            flush=True,
        )
        if not parallel:
            _warm_up(runner, key, servers, records[pair])
    for key in keys if parallel else ():
        _warm_up(runner, key, servers, records[key[0]])


def _wait_healthy(runner: Runner, key: Key, servers: dict[Key, Server], record: dict) -> None:
    """Wait for the server of ``key``; one that lost a port race (its log says ``EADDRINUSE``) is started again,
    at most ``PORT_RACE_RESTARTS`` times, each restart recorded (``port_race_restarts``);
    any other failure is the error it was."""
    pair, build = key
    for restart in range(PORT_RACE_RESTARTS + 1):
        try:
            servers[key].wait_healthy(runner.health_timeout_s)
            return
        except ServerError:
            server = servers[key]
            if restart == PORT_RACE_RESTARTS or server.running() or PORT_RACE not in log_tail(server.log, 400):
                raise
            server.stop()
            server.log.rename(server.log.with_name(f"{server.log.stem}-port-race-{restart + 1}.log"))
            print(f"tpot: launch {pair}: {build} server lost a port race ({PORT_RACE}), starting it again", flush=True)
            record.setdefault("port_race_restarts", {})[build] = restart + 1
            servers[key] = runner.server(build, _port(key, record), pair).start()


def _warm_up(runner: Runner, key: Key, servers: dict[Key, Server], record: dict) -> None:
    if runner.client is not None:
        runner.client.wait_ready()
    pair, build = key
    w0 = time.monotonic()
    runner.bench(build, servers[key], f"warmup-l{pair}-{build}", runner.profile.warmup_prompts)
    record["warmup_s"][build] = round(time.monotonic() - w0, 1)


def _port(key: Key, record: dict) -> int:
    """Ports of their own per launch pair and build: a server of the pair before may still be releasing its
    port."""
    pair, build = key
    return free_port(DEFAULT_PORT + 10 * (2 * pair + record["order"].index(build)))


def _label(key: Key) -> str:
    return f"l{key[0]}-{key[1]}"


def _settle(runner: Runner, keys: Sequence[Key], servers: dict[Key, Server], since: float) -> dict:
    """Short runs, the servers in turn, until each is stable (``settled``) or the profile's cap has passed
    since ``since`` (the launch); what was run, for the timeline (per server, ``l<pair>-<build>``)."""
    p = runner.profile
    medians: dict[Key, list[float]] = {k: [] for k in keys}
    t0, i = time.monotonic(), 0
    while p.settle_max_s > 0 and time.monotonic() - since < p.settle_max_s:
        if all(settled(medians[k], p.settle_window, p.settle_tolerance) for k in keys):
            break
        key = keys[i % len(keys)]
        r = runner.bench(key[1], servers[key], f"settle-l{key[0]}-{i:02d}-{key[1]}", p.settle_prompts)
        medians[key].append(r.median_tpot_ms)
        i += 1
    return {
        "servers": [_label(k) for k in keys],
        "runs": i,
        "seconds": round(time.monotonic() - t0, 1),
        "settled": all(settled(medians[k], p.settle_window, p.settle_tolerance) for k in keys),
        "median_tpot_ms": {_label(k): v for k, v in medians.items()},
    }


def run_launches(runner: Runner, mode: str, on_round=None, more=None) -> tuple[list[RoundResult], dict]:
    """Every launch pair of the run: start both servers (the pair's first build first), warm each up,
    settle, measure the pair's rounds, stop both. Servers are always stopped.

    Concurrent mode keeps the pair's two servers up side by side and interleaves their rounds;
    sequential mode runs one server at a time (start, warm up, settle, its rounds, stop), each
    with the GPU to itself. With ``--start parallel`` the profile's ``pairs_at_once`` pairs start
    together (``launch_groups``): all their servers at once, then settling over all of them, then
    each pair's rounds in turn while the others idle. ``on_round(rounds, timeline)`` runs after
    every round (the CLI saves partial results there, so an interrupted run keeps what it
    measured). ``more(rounds)``, once the pairs planned so far are done, says how many pairs to add
    (a sequential run: ``ci.core.sequential``; 0 ends the run); each batch of pairs is one entry of the
    timeline's ``groups`` (its pairs, when it began and ended). The timeline records, per launch pair,
    the start order, each server's start-up, warm-up and settling, and when its rounds began and ended."""
    started, rounds = time.monotonic(), []
    timeline: dict = {"launches": [], "groups": []}
    servers: dict[Key, Server] = {}
    p = runner.profile
    if runner.client is not None:
        runner.client.start()  # imports vLLM while the first server starts
    try:
        first, pairs = 0, p.launches
        while pairs:
            batch = {"pairs": [first, first + pairs], "began": _now(), "began_after_s": _since(started)}
            timeline["groups"].append(batch)
            for group in launch_groups(p, runner.start, first, pairs):
                _run_group(runner, mode, group, servers, rounds, timeline, started, on_round)
            batch.update(ended=_now(), ended_after_s=_since(started))
            first += pairs
            pairs = more(rounds) if more is not None else 0
            if pairs:
                print(f"tpot: INCONCLUSIVE after {first} launch pairs: {pairs} more", flush=True)
        timeline["total_s"] = _since(started)
    finally:
        with _signals_held():  # a second Ctrl-C or SIGTERM must not cut the clean-up short
            for s in servers.values():
                s.stop()
            if runner.client is not None:
                runner.client.close()
    return rounds, timeline


def _run_group(runner, mode, group, servers, rounds, timeline, started, on_round) -> None:
    """The launch pairs of ``group`` (``launch_groups``): started together, measured, stopped."""
    p = runner.profile
    records = {}
    for pair in group:
        records[pair] = {
            "launch": pair,
            "order": list(launch_order(pair)),
            "started_with": group,
            "startup_s": {},
            "warmup_s": {},
            "began_after_s": _since(started),
        }
        timeline["launches"].append(records[pair])
    since = time.monotonic()
    keys = [(pair, b) for pair in group for b in launch_order(pair)]
    starts = [keys] if mode == "concurrent" else [[k] for k in keys]
    for up in starts:
        _start(runner, up, servers, records)
        if runner.client is not None and "bench_client_import_s" not in timeline:
            timeline["bench_client_import_s"] = runner.client.wait_ready()
        settle = _settle(runner, up, servers, since)
        for pair in dict.fromkeys(k[0] for k in up):
            records[pair].setdefault("settle", []).append(settle)
            records[pair].setdefault("first_round_after_s", _since(started))
            builds = [b for n, b in up if n == pair]
            for build in round_order(p.rounds, builds) if len(builds) > 1 else builds * p.rounds:
                tag = f"r{len(rounds):03d}-l{pair}-{build}"
                result = replace(runner.bench(build, servers[(pair, build)], tag, p.prompts), launch=pair)
                rounds.append(result)
                if on_round is not None:
                    on_round(rounds, timeline)
                _progress(rounds, p, started)
        for key in up:
            servers.pop(key).stop()
        since = time.monotonic()
    for pair in group:
        records[pair]["ended_after_s"] = _since(started)


def _since(started: float) -> float:
    return round(time.monotonic() - started, 1)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _progress(rounds: list[RoundResult], p: Profile, started: float) -> None:
    r = rounds[-1]
    so_far = {b: [x.median_tpot_ms for x in rounds if x.build == b] for b in BUILDS}
    print(
        f"tpot round {len(rounds)} (launch {r.launch}) {r.build}: median TPOT "
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
