"""End-to-end TPOT. ``vllm serve`` from each tree, ``vllm bench serve`` against it, A/B.

What is served and sent (models, profiles, command lines) is ``ci.serving.config``; this module
starts the servers, drives the client, schedules the rounds and writes the results.

Rounds alternate builds (base, candidate, candidate, base, ...); each round is one
``vllm bench serve`` run and contributes its median TPOT. By default one client process
(``ci/serving/bench_client.py``: vLLM's own ``vllm.benchmarks.serve``, imported once, from the base
tree) runs every round, so a round costs its measurement and not a vLLM import; the same
instrument measures both builds. ``--bench-client cli`` runs the ``vllm bench serve`` command
from the measured build's tree instead, one process per round. Both servers stay up side by side
(``--server-mode concurrent``, each given a share of GPU memory, started one after the
other) or are started anew for every round (``sequential``). Results use the kernel
benchmark's schema, so ``ci.core.compare`` judges them with the same statistics.

Usage: ``python -m ci.serving.tpot --manifest M [--model qwen3-30b-a3b-like] [--profile pr] [--dp N] --out FILE``;
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
from ci.core.errors import DataError, MissingDependencyError, NoGPUError, ServerError, UsageError
from ci.core.results import BenchResults, CaseResult
from ci.runner import gpu, gpu_state, procs
from ci.serving.config import (
    BUILDS,
    PROFILES,
    Profile,
    bench_args,
    bench_argv,
    block_size_table,
    case_id,
    decode_block_sizes,
    model_dir,
    models,
    moe_backend_flag,
    serve_argv,
    served_name,
    server_env,
    suite_name,
)
from ci.serving.server import Server, free_port, log_tail
from ci.trees import provenance
from ci.trees.build import Trees, load_trees, sha256_file

DEFAULT_PORT = 18000
CLIENTS = {
    "inprocess": "one ci/serving/bench_client.py process (vllm.benchmarks.serve of the base tree) for every round",
    "cli": "one vllm bench serve command per round, from the measured build's tree",
}
CLIENT_SCRIPT = Path(__file__).resolve().parent / "bench_client.py"
# what makes two TPOT runs comparable (ci.core.evidence checks them against a baseline)
IDENTITY_KEYS = ("model", "model_config_sha256", "dp", "expert_parallel", "profile", "server_mode")
CLIENT_IMPORT_TIMEOUT_S = 600.0
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


def round_order(rounds: int) -> list[str]:
    """Interleaved builds, balanced against drift: base cand | cand base | base cand ..."""
    return stats.interleaved_order(rounds, BUILDS)


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

    def tree(self, build: str) -> Path:
        return self.trees.base if build == "base" or self.aa else self.trees.candidate

    def server(self, build: str, port: int) -> Server:
        name = served_name(build)
        argv = serve_argv(self.tree(build), self.model, port=port, profile=self.profile, dp=self.dp, seed=self.seed,
                          name=name)  # fmt: skip
        env = server_env(self.tree(build))
        return Server(f"vllm serve ({build})", argv, port=port, log=self.out_dir / f"server-{build}.log", env=env,
                      served_name=name)  # fmt: skip

    def bench(self, build: str, server: Server, tag: str, prompts: int) -> RoundResult:
        out = self.out_dir / f"bench-{tag}.json"
        kw = {"port": server.port, "profile": self.profile, "prompts": prompts, "out": out, "seed": self.seed,
              "name": server.served_name}  # fmt: skip
        out.unlink(missing_ok=True)  # a file left by an earlier run must not pass for this round's
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
        return replace(parse_bench_result(out, build), machine=machine.summary())


def run_rounds(runner: Runner, mode: str, on_round=None) -> tuple[list[RoundResult], dict]:
    """Start servers, warm them up, run the interleaved rounds; servers are always stopped.

    Concurrent mode starts both servers first, warms each up, and goes on warming them up in
    turn until ``profile.settle_s`` has passed since the first launch. Sequential mode starts
    a server for every round and warms it up each time (no settling: that is per launch).
    ``on_round(rounds, startup)`` runs after every round (the CLI saves partial results there,
    so an interrupted run keeps what it measured). ``startup`` holds the seconds each server
    and the client took to start, and the settling runs and when the first round began."""
    started, rounds, startup = time.monotonic(), [], {}
    servers: dict[str, Server] = {}

    def launch(build: str, tag: str) -> None:
        if mode == "sequential":
            for other in list(servers):
                servers.pop(other).stop()
        port = free_port(DEFAULT_PORT + 10 * len(servers))
        servers[build] = runner.server(build, port).start()
        startup[build] = round(servers[build].wait_healthy(runner.health_timeout_s), 1)
        print(f"tpot: {build} server healthy after {startup[build]} s on port {port}", flush=True)
        if runner.client is not None and "bench-client" not in startup:
            startup["bench-client"] = runner.client.wait_ready()
            print(f"tpot: bench client ready (vLLM imported in {startup['bench-client']} s)", flush=True)
        runner.bench(build, servers[build], f"{build}-warmup-{tag}", runner.profile.warmup_prompts)

    if runner.client is not None:
        runner.client.start()  # imports vLLM while the first server starts
    try:
        if mode == "concurrent":
            for build in BUILDS:
                launch(build, "0")
            settle = 0
            while time.monotonic() - started < runner.profile.settle_s:
                build = BUILDS[settle % 2]
                runner.bench(build, servers[build], f"{build}-settle-{settle // 2}", runner.profile.warmup_prompts)
                settle += 1
            startup["settle_runs"] = settle
            startup["first_round_after_s"] = round(time.monotonic() - started, 1)
            print(f"tpot: {settle} settling runs; rounds start {startup['first_round_after_s']} s after the first "
                  f"launch (settle_s {runner.profile.settle_s:.0f})", flush=True)  # fmt: skip
        for i, build in enumerate(round_order(runner.profile.rounds)):
            if build not in servers:
                launch(build, str(i))
            result = runner.bench(build, servers[build], f"{i:02d}-{build}", runner.profile.prompts)
            rounds.append(result)
            if on_round is not None:
                on_round(rounds, startup)
            so_far = {b: [r.median_tpot_ms for r in rounds if r.build == b] for b in BUILDS}
            print(
                f"tpot round {i + 1}/{2 * runner.profile.rounds} {build}: median TPOT {result.median_tpot_ms:.2f} ms "
                + " ".join(f"{b} {stats.median(v):.2f}" for b, v in so_far.items() if v)
                + f" ms so far, {time.monotonic() - started:.0f} s",
                flush=True,
            )
            if mode == "sequential":
                servers.pop(build).stop()
    finally:
        with _signals_held():  # a second Ctrl-C or SIGTERM must not cut the clean-up short
            for s in servers.values():
                s.stop()
            if runner.client is not None:
                runner.client.close()
    return rounds, startup


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
                        startup: dict, client: str = "inprocess", aa: bool = False,
                        profile: Profile | None = None) -> BenchResults:  # fmt: skip
    """The results file of a TPOT A/B: one case, the median TPOT of each round as its samples."""
    profile = profile or PROFILES[profile_name]
    complete = len(rounds) == 2 * profile.rounds
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
            "decode_block_size_m": [r for r in decode_block_sizes(model_dir(model), profile, dp) if r["profile"]],
        },
        extra={"rounds": [asdict(r) for r in rounds], "timeline": startup},
    )
    return BenchResults(
        kind="tpot-bench",
        suite=suite_name(model, profile_name, dp),
        provenance=provenance.collect(trees),
        settings={
            "rounds_per_build": profile.rounds,
            "order": round_order(profile.rounds),
            "server_mode": mode,
            "complete": complete,
            "rounds_done": len(rounds),
            "aa": aa,
            "candidate": "base (A/A run)" if aa else "candidate tree",
            "expected_cases": [case_id(model, profile_name, dp)],
            "identity_keys": list(IDENTITY_KEYS),
        },
        cases=[case],
    )


def run_tpot(trees: Trees, model: str, profile_name: str, dp: int, out_dir: Path, mode: str, timeout: float,
             save_to: Path | None = None, client: str = "inprocess", aa: bool = False,
             settle_s: float | None = None) -> BenchResults:  # fmt: skip
    profile = PROFILES[profile_name] if settle_s is None else replace(PROFILES[profile_name], settle_s=settle_s)
    bench_client = BenchClient(trees.base, out_dir / "bench-client.log") if client == "inprocess" else None
    runner = Runner(trees, model_dir(model), profile, dp, out_dir, timeout, client=bench_client, aa=aa)

    def results(rounds, startup):
        return results_from_rounds(trees, model, profile_name, dp, mode, rounds, startup, client, aa, profile)

    def save(rounds, startup):
        if save_to is not None:
            results(rounds, startup).save(save_to)

    return results(*run_rounds(runner, mode, on_round=save))


def rounds_from_dir(directory: Path) -> list[RoundResult]:
    """The rounds of a (possibly interrupted) run, from its ``bench-NN-<build>.json`` files."""
    files = sorted(directory.glob("bench-[0-9][0-9]-*.json"))
    if not files:
        raise DataError(f"{directory}: no bench-NN-<build>.json round files")
    return [parse_bench_result(f, f.stem.split("-", 2)[2]) for f in files]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.serving.tpot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, help="the trees' manifest.json (from ci.trees.build)")
    parser.add_argument("--model", default="qwen3-30b-a3b-like", help=f"one of {models()}")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="pr")
    parser.add_argument("--dp", type=int, help="data-parallel size = EP size (default: every visible GPU)")
    parser.add_argument("--server-mode", choices=("concurrent", "sequential"), default="concurrent")
    parser.add_argument(
        "--bench-client",
        choices=sorted(CLIENTS),
        default="inprocess",
        help="; ".join(f"{k}: {v}" for k, v in CLIENTS.items()),
    )
    parser.add_argument("--health-timeout", type=float, default=600.0, help="seconds to wait for /health")
    parser.add_argument("--aa", action="store_true", help="A/A run: both servers run the base tree (the noise floor)")
    parser.add_argument("--settle-s", type=float, help="seconds from the first launch to the first round "
                        "(concurrent mode; default: the profile's)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="results file; logs go beside it")
    parser.add_argument("--block-sizes", action="store_true", help="print the block_size_m each build picks in "
                        "decode for --model, --profile and --dp (default 1), and exit (no GPU needed)")  # fmt: skip
    parser.add_argument("--from-rounds", type=Path, help="rebuild the results of an interrupted run from its folder")
    parser.add_argument("--dp-of-rounds", type=int, default=1, help="with --from-rounds: the DP size that run used")
    args = parser.parse_args(argv)
    if args.block_sizes:
        dp = args.dp or 1
        print(f"{args.model}, profile {args.profile}, DP = EP = {dp}: block_size_m per decode step (ci.kernel.spec)")
        print(block_size_table(decode_block_sizes(model_dir(args.model), PROFILES[args.profile], dp)))
        return 0
    missing = [flag for flag, value in (("--manifest", args.manifest), ("--out", args.out)) if value is None]
    if missing:
        raise UsageError(f"python -m ci.serving.tpot needs {' and '.join(missing)} (or --block-sizes)")
    trees = load_trees(args.manifest)
    if args.from_rounds:
        rounds = rounds_from_dir(args.from_rounds)
        results = results_from_rounds(trees, args.model, args.profile, args.dp_of_rounds, args.server_mode, rounds, {},
                                      args.bench_client, args.aa)  # fmt: skip
        results.save(args.out)
        print(f"tpot: {len(rounds)} rounds from {args.from_rounds} written to {args.out}")
        return 0
    gpus = gpu.require_gpus()
    dp = args.dp or len(gpus)
    if dp > len(gpus):
        raise NoGPUError(f"--dp {dp} needs {dp} GPUs; {len(gpus)} visible")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: servers stop
    print(f"tpot: run tag {procs.RUN_ID_ENV}={procs.run_id()} (servers answer as {served_name('<build>')})", flush=True)
    results = run_tpot(trees, args.model, args.profile, dp, args.out.parent, args.server_mode, args.health_timeout,
                       save_to=args.out, client=args.bench_client, aa=args.aa, settle_s=args.settle_s)  # fmt: skip
    results.save(args.out)
    print(f"tpot: results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
