"""Stage 3b: end-to-end TPOT. ``vllm serve`` from each tree, ``vllm bench serve`` against it, A/B.

The model is a config shipped in ``ci/models/`` (GPTQ-int4 ``quantization_config``, so the
Marlin MoE path runs) with ``--load-format dummy`` (no weights) and the small word-level
tokenizer in ``ci/models/tokenizer``. With N > 1 GPUs the server runs
``--data-parallel-size N --enable-expert-parallel``. The Marlin MoE backend is forced with
``--moe-backend marlin`` where the tree's vLLM has that flag (recorded either way).

Rounds alternate builds (base, candidate, candidate, base, ...); each round is one
``vllm bench serve`` run and contributes its median TPOT. By default one client process
(``ci/bench_client.py``: vLLM's own ``vllm.benchmarks.serve``, imported once, from the base
tree) runs every round, so a round costs its measurement and not a vLLM import; the same
instrument measures both builds. ``--bench-client cli`` runs the ``vllm bench serve`` command
from the measured build's tree instead, one process per round. Both servers stay up side by side
(``--server-mode concurrent``, each given a share of GPU memory, started one after the
other) or are started anew for every round (``sequential``). Results use the kernel
benchmark's schema, so ``ci.compare`` judges them with the same statistics.

Usage: ``python -m ci.tpot --manifest M [--model qwen3-30b-a3b-like] [--profile pr] [--dp N] --out FILE``;
``python -m ci.tpot --block-sizes --profile pr-ep --dp 2`` prints the block size each build picks in decode.
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

from ci import gpu, gpu_state, procs, provenance, stats
from ci.build import Trees, load_trees, sha256_file
from ci.cli import run_main
from ci.errors import DataError, MissingDependencyError, NoGPUError, ServerError, UsageError
from ci.results import BenchResults, CaseResult
from ci.server import Server, free_port, log_tail

MODELS_DIR = Path(__file__).resolve().parent / "models"
TOKENIZER_DIR = MODELS_DIR / "tokenizer"
DEFAULT_PORT = 18000
BUILDS = ("base", "candidate")
CLIENTS = {
    "inprocess": "one ci/bench_client.py process (vllm.benchmarks.serve of the base tree) for every round",
    "cli": "one vllm bench serve command per round, from the measured build's tree",
}
CLIENT_SCRIPT = Path(__file__).resolve().parent / "bench_client.py"
# what makes two TPOT runs comparable (ci.evidence checks them against a baseline)
IDENTITY_KEYS = ("model", "model_config_sha256", "dp", "expert_parallel", "profile", "server_mode")
CLIENT_IMPORT_TIMEOUT_S = 600.0
ROUND_TIMEOUT_S = 3600.0  # one vllm bench serve run; the nightly profile takes a few minutes


@dataclass(frozen=True, kw_only=True)
class Profile:
    input_len: int
    output_len: int
    concurrency: int
    prompts: int
    rounds: int  # per build
    warmup_prompts: int
    max_model_len: int
    gpu_memory_fraction: float  # per server (two share the GPUs in concurrent mode)
    # concurrent mode: no measured round before this many seconds after the first server's launch
    # (both servers keep warming up, in turn, until then). On the H200, TPOT ran 5% high
    # (7.60-7.63 ms, then 7.21-7.27 ms) on both servers alike until about 310 s after the first
    # launch, in two runs (A/B and A/A), with the SM clock (1980 MHz), temperature and host load
    # unchanged and the power draw 3% lower; the cause is not known. Rounds measured across such
    # a step make a broken pair, which widened the A/B's interval to [1.003, 1.029].
    settle_s: float = 0.0
    # decode batches captured as full CUDA graphs, no torch.compile (fast start, eager-free decode)
    compilation_config: str = '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}'


PROFILES = {
    "pr": Profile(input_len=256, output_len=128, concurrency=16, prompts=256, rounds=8, warmup_prompts=256,
                  max_model_len=1024, gpu_memory_fraction=0.4, settle_s=360),
    "nightly": Profile(input_len=1024, output_len=1024, concurrency=64, prompts=640, rounds=6, warmup_prompts=64,
                       max_model_len=4096, gpu_memory_fraction=0.4, settle_s=360),
    # DP/EP decode where #48144 changes the pick: 128 concurrent requests over DP = EP = 2 are
    # 64 decode tokens per rank; the padded M is 128, and with 128 experts, top-8 (qwen3-30b-a3b-like)
    # the old rule picks 32 and the new one 16 (the ``pr`` profile's 8 tokens per rank: both 8).
    # ``python -m ci.tpot --block-sizes`` prints the table for any model, profile and DP size.
    "pr-ep": Profile(input_len=256, output_len=128, concurrency=128, prompts=512, rounds=8, warmup_prompts=128,
                     max_model_len=1024, gpu_memory_fraction=0.4, settle_s=360),
    "smoke": Profile(input_len=64, output_len=32, concurrency=4, prompts=8, rounds=1, warmup_prompts=4,
                     max_model_len=512, gpu_memory_fraction=0.3),
}  # fmt: skip


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


def moe_shape(model: Path) -> tuple[int, int]:
    """(routed experts, top-k) of a shipped config: what ``fused_marlin_moe`` sees per layer."""
    config = json.loads((model / "config.json").read_text())
    for experts_key, topk_key in (("num_experts", "num_experts_per_tok"), ("n_routed_experts", "num_experts_per_tok"),
                                  ("num_local_experts", "num_experts_per_tok")):  # fmt: skip
        if isinstance(config.get(experts_key), int) and isinstance(config.get(topk_key), int):
            return config[experts_key], config[topk_key]
    raise UsageError(f"{model / 'config.json'}: no expert count and top-k (num_experts, num_experts_per_tok)")


def decode_block_sizes(model: Path, profile: Profile, dp: int) -> list[dict]:
    """The ``block_size_m`` each build picks in a decode step, per tokens-per-rank (ci.spec's rules).

    Under DP/EP each rank holds ``G / dp`` experts and sees ``dp * t`` padded rows (t: decode
    tokens per rank, the largest rank's, after CUDA-graph padding). The profile's own decode
    batch is ``ceil(concurrency / dp)`` per rank (``"profile": True`` marks it)."""
    from ci import spec  # pure: the oracle of the CPU tier

    experts, topk = moe_shape(model)
    local = experts // dp if dp > 1 else experts
    global_ = experts if dp > 1 else spec.NON_EP
    own = -(-profile.concurrency // dp)
    rows = []
    for t in sorted({1, 2, 4, 8, 16, 32, 64, 128, own}):
        m = t * dp
        picks = {build: spec.expected_block_size_m(m=m, topk=topk, local_experts=local, global_experts=global_,
                                                   input_itemsize=2, patched=build == "candidate")
                 for build in BUILDS}  # fmt: skip
        rows.append({"tokens_per_rank": t, "padded_m": m, "local_experts": local, "global_experts": experts,
                     "topk": topk, **picks, "profile": t == own})  # fmt: skip
    return rows


def block_size_table(rows: list[dict]) -> str:
    lines = ["| tokens per rank | padded M | local / global experts | top-k | base bm | candidate bm | |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        mark = "this profile" if r["profile"] else ""
        lines.append(f"| {r['tokens_per_rank']} | {r['padded_m']} | {r['local_experts']} / {r['global_experts']} | "
                     f"{r['topk']} | {r['base']} | {r['candidate']} | {mark} |")  # fmt: skip
    return "\n".join(lines)


def models() -> list[str]:
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())


def model_dir(name: str) -> Path:
    path = MODELS_DIR / name
    if not (path / "config.json").is_file():
        raise UsageError(f"--model {name!r}: no ci/models/{name}/config.json; choose one of {models()}")
    return path


def moe_backend_flag(tree: Path) -> list[str]:
    """``--moe-backend marlin`` where this vLLM has the flag (read from its source, not imported)."""
    arg_utils = tree / "vllm" / "engine" / "arg_utils.py"
    if arg_utils.is_file() and '"--moe-backend"' in arg_utils.read_text():
        return ["--moe-backend", "marlin"]
    return []


def server_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # FlashInfer is optional; its sampler needs it
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (shared hosts)
    env.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: config and tokenizer ship in the repo
    env.setdefault("VLLM_NO_USAGE_STATS", "1")  # no telemetry thread in a benchmark's servers
    return env


def served_name(build: str) -> str:
    """The model name a server of this run answers to: proves a port is held by this run's server."""
    return f"gate-{procs.run_id()}-{build}"


def serve_argv(tree: Path, model: Path, *, port: int, profile: Profile, dp: int, seed: int,
               name: str | None = None) -> list[str]:  # fmt: skip
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model),
            "--tokenizer", str(TOKENIZER_DIR), "--load-format", "dummy", "--port", str(port),
            "--host", "127.0.0.1", "--seed", str(seed), "--max-model-len", str(profile.max_model_len),
            "--gpu-memory-utilization", str(profile.gpu_memory_fraction),
            "--max-num-seqs", str(max(profile.concurrency, 1)),
            # every round repeats the same prompts (same seed): without prefix caching each round
            # does the same work, instead of the first one filling the cache for the rest
            "--no-enable-prefix-caching",
            "--compilation-config", profile.compilation_config]  # fmt: skip
    if dp > 1:
        argv += ["--data-parallel-size", str(dp), "--enable-expert-parallel"]
    if name:
        argv += ["--served-model-name", name]
    return argv + moe_backend_flag(tree)


def bench_args(model: Path, *, port: int, profile: Profile, prompts: int, out: Path, seed: int,
               name: str | None = None) -> list[str]:  # fmt: skip
    """The arguments of ``vllm bench serve`` for one round (greedy, fixed lengths, same prompts each round).

    With ``name`` the requests ask for that served model, so a server of another run on the port
    answers 404 (failed requests, a ServerError) instead of being measured."""
    return ["--backend", "vllm", "--model", str(model), "--tokenizer", str(TOKENIZER_DIR),
            "--base-url", f"http://127.0.0.1:{port}", "--dataset-name", "random",
            "--random-input-len", str(profile.input_len), "--random-output-len", str(profile.output_len),
            "--max-concurrency", str(profile.concurrency), "--num-prompts", str(prompts), "--ignore-eos",
            "--temperature", "0", "--disable-tqdm", "--seed", str(seed), "--save-result",
            "--result-dir", str(out.parent), "--result-filename", out.name,
            *(["--served-model-name", name] if name else [])]  # fmt: skip


def bench_argv(model: Path, **kw) -> list[str]:
    """The ``vllm bench serve`` command line (``--bench-client cli``; the tree comes from its PYTHONPATH)."""
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", *bench_args(model, **kw)]


class BenchClient:
    """``ci/bench_client.py`` in its own process: vLLM's bench client imported once, one round per request.

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
    case_id = f"{model}/dp{dp}-ep{dp if dp > 1 else 1}/{profile_name}"
    case = CaseResult(
        id=case_id,
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
        suite=f"{model}-dp{dp}-{profile_name}",
        provenance=provenance.collect(trees),
        settings={
            "rounds_per_build": profile.rounds,
            "order": round_order(profile.rounds),
            "server_mode": mode,
            "complete": complete,
            "rounds_done": len(rounds),
            "aa": aa,
            "candidate": "base (A/A run)" if aa else "candidate tree",
            "expected_cases": [case_id],
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
    parser = argparse.ArgumentParser(prog="python -m ci.tpot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, help="the trees' manifest.json (from ci.build)")
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
        print(f"{args.model}, profile {args.profile}, DP = EP = {dp}: block_size_m per decode step (ci.spec)")
        print(block_size_table(decode_block_sizes(model_dir(args.model), PROFILES[args.profile], dp)))
        return 0
    missing = [flag for flag, value in (("--manifest", args.manifest), ("--out", args.out)) if value is None]
    if missing:
        raise UsageError(f"python -m ci.tpot needs {' and '.join(missing)} (or --block-sizes)")
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
