"""What a TPOT run serves and sends: the shipped models, the load profiles, the block size each build
picks in decode, and the ``vllm serve`` / ``vllm bench serve`` command lines (``ci.serving.tpot`` runs them).

The model is a config shipped in ``ci/serving/models/`` (GPTQ-int4 ``quantization_config``, so the Marlin MoE
path runs) with ``--load-format dummy`` (no weights) and the small word-level tokenizer in
``ci/serving/models/tokenizer``. With N > 1 GPUs the server runs ``--data-parallel-size N
--enable-expert-parallel``; ``--moe-backend marlin`` is passed where the tree's vLLM has that flag.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ci.core.errors import UsageError
from ci.host import procs

MODELS_DIR = Path(__file__).resolve().parent / "models"
TOKENIZER_DIR = MODELS_DIR / "tokenizer"
BUILDS = ("base", "candidate")


@dataclass(frozen=True, kw_only=True)
class Profile:
    input_len: int
    output_len: int
    concurrency: int
    prompts: int  # per round
    # The unit of evidence is a pair of server launches (one per build): a server's launch fixes its
    # memory placement and start order, which moved TPOT by 0.2-0.5% (one H200) and 2.8% (DP = 2)
    # between the builds of one pair, more than rounds inside a launch vary. A run makes ``launches``
    # pairs, alternating which build starts first, and ``rounds`` rounds of each build inside each
    # launch pair; the interval is over the pairs (ci.core.stats.capture_effect).
    launches: int
    rounds: int  # per build and launch pair
    warmup_prompts: int  # one run of these per server launch, unmeasured
    max_model_len: int
    gpu_memory_fraction: float  # per server (two share the GPUs in concurrent mode)
    # With ``--start parallel`` (a fixed KV cache per server) this many launch pairs start together: all
    # their servers at once, then each pair's rounds in turn while the others idle. A server's start-up
    # (about 50 s of Python imports, 10 s on the GPU) is what a run spends most on; pairs started together
    # share it, and each pair's two servers still have their own launch.
    pairs_at_once: int = 1
    # Settling, after the warm-up: short runs of ``settle_prompts``, the two servers in turn, until the
    # median TPOT of each server's last ``settle_window`` runs lies within ``settle_tolerance`` (max/min - 1),
    # or ``settle_max_s`` after the pair's first launch (then the launch records settled: false).
    settle_prompts: int = 32
    settle_window: int = 3
    settle_tolerance: float = 0.01
    settle_max_s: float = 0.0  # 0: no settling runs
    # decode batches captured as full CUDA graphs, no torch.compile (fast start, eager-free decode)
    compilation_config: str = '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}'

    @property
    def rounds_per_build(self) -> int:
        return self.launches * self.rounds


PROFILES = {
    # pr: 9 launch pairs of one round each, three pairs started at once (6 servers, 120 GB of an H200 with
    # their fixed 2 GiB KV caches; on a GPU that cannot hold six, as many pairs as fit: fit_pairs_at_once, one
    # on an 80 GB H100), no settling. On one H200 (docs/tpot.md) a launch pair's log ratio varied
    # by 0.33-0.36% with one or two rounds a build (the launch's error dominates), so pairs, not rounds, buy
    # resolution: resampled from 45 measured A/A pairs, 9 pairs FAIL a true +3.5% in 93.8% of runs (6 pairs:
    # 82%); settling changed nothing measured. A #48144 A/B took 462 s (6 pairs x 2 rounds with settling: 465 s).
    "pr": Profile(
        input_len=256,
        output_len=128,
        concurrency=16,
        prompts=128,
        launches=9,
        rounds=1,
        warmup_prompts=64,
        max_model_len=1024,
        gpu_memory_fraction=0.4,
        pairs_at_once=3,
    ),
    "nightly": Profile(
        input_len=1024,
        output_len=1024,
        concurrency=64,
        prompts=320,
        launches=6,
        rounds=1,
        warmup_prompts=64,
        max_model_len=4096,
        gpu_memory_fraction=0.4,
        settle_prompts=64,
        settle_max_s=180,
    ),
    # DP/EP decode where #48144 changes the pick: 128 concurrent requests over DP = EP = 2 are
    # 64 decode tokens per rank; the padded M is 128, and with 128 experts, top-8 (qwen3-30b-a3b-like)
    # the old rule picks 32 and the new one 16 (the ``pr`` profile's 8 tokens per rank: both 8).
    # ``python -m ci.serving.tpot --block-sizes`` prints the table for any model, profile and DP size.
    # pr's design (pairs at once, no settling) so that a run fits a device session at DP = 2, where one pair at
    # a time with settling would take about 30 minutes (estimated); two rounds a build per pair, because there
    # rounds of one server varied by 4-5% (docs/tpot.md). Not yet run so: 6 servers of 2 ranks, each rank about
    # 10 GB of weights and an 8 GiB KV cache (an estimate, 120 GB of a GPU), is what a first x2 run has to show.
    "pr-ep": Profile(
        input_len=256,
        output_len=128,
        concurrency=128,
        prompts=256,
        launches=9,
        rounds=2,
        warmup_prompts=128,
        max_model_len=1024,
        gpu_memory_fraction=0.4,
        pairs_at_once=3,
    ),
    "smoke": Profile(
        input_len=64,
        output_len=32,
        concurrency=4,
        prompts=8,
        launches=1,
        rounds=1,
        warmup_prompts=4,
        max_model_len=512,
        gpu_memory_fraction=0.3,
    ),
}


# A sequential run (ci.core.sequential, issue 44): while the verdict is INCONCLUSIVE after the profile's launch pairs,
# up to this many groups of pairs more (a group: the pairs started at once, else a third of the profile's pairs),
# each judged again with the error spent over the looks. pr: at most 9 + 3 x 3 = 18 pairs, about 3 x 150 s more on
# one H200 where the question is open. nightly (6 pairs) and smoke (1) add none: a first look at 97.5% needs 7.
SEQUENTIAL_MAX_EXTRA = {"pr": 3, "pr-ep": 3, "nightly": 0, "smoke": 0}


def sequential_group(profile: Profile) -> int:
    """The launch pairs a sequential run adds at a time: the pairs that start together, else a third of the
    profile's pairs (at least one)."""
    return profile.pairs_at_once if profile.pairs_at_once > 1 else max(1, profile.launches // 3)


def case_id(model: str, profile: str, dp: int) -> str:
    """The id of the one case of a TPOT run, and (``suite_name``) its suite."""
    return f"{model}/dp{dp}-ep{dp if dp > 1 else 1}/{profile}"


def suite_name(model: str, profile: str, dp: int) -> str:
    return f"{model}-dp{dp}-{profile}"


def parse_suite(suite: str) -> tuple[str, str, int]:
    """(model, profile, dp) of a suite name of ``suite_name``; a :class:`UsageError` for any other name."""
    for profile in sorted(PROFILES, key=len, reverse=True):
        head, dash, _ = suite.rpartition(f"-{profile}")
        model, _, dp = head.rpartition("-dp")
        if (
            dash
            and suite.endswith(f"-{profile}")
            and model in models()
            and dp.isascii()
            and dp.isdigit()
            and (dp == str(int(dp)) and int(dp) >= 1)
        ):
            return model, profile, int(dp)
    raise UsageError(
        f"suite {suite!r} is not one the TPOT stage defines (MODEL-dpN-PROFILE, with a model of "
        f"{', '.join(models())} and a profile of {', '.join(sorted(PROFILES))})"
    )


def moe_shape(model: Path) -> tuple[int, int]:
    """(routed experts, top-k) of a shipped config: what ``fused_marlin_moe`` sees per layer."""
    config = json.loads((model / "config.json").read_text())
    for experts_key, topk_key in (
        ("num_experts", "num_experts_per_tok"),
        ("n_routed_experts", "num_experts_per_tok"),
        ("num_local_experts", "num_experts_per_tok"),
    ):
        if isinstance(config.get(experts_key), int) and isinstance(config.get(topk_key), int):
            return config[experts_key], config[topk_key]
    raise UsageError(f"{model / 'config.json'}: no expert count and top-k (num_experts, num_experts_per_tok)")


def decode_block_sizes(model: Path, profile: Profile, dp: int) -> list[dict]:
    """The ``block_size_m`` each build picks in a decode step, per tokens-per-rank (ci.moe.spec's rules).

    Under DP/EP each rank holds ``G / dp`` experts and sees ``dp * t`` padded rows (t: decode
    tokens per rank, the largest rank's, after CUDA-graph padding). The profile's own decode
    batch is ``ceil(concurrency / dp)`` per rank (``"profile": True`` marks it)."""
    from ci.moe import spec  # pure: the oracle of the CPU tier

    experts, topk = moe_shape(model)
    local = experts // dp if dp > 1 else experts
    global_ = experts if dp > 1 else spec.NON_EP
    own = -(-profile.concurrency // dp)
    rows = []
    for t in sorted({1, 2, 4, 8, 16, 32, 64, 128, own}):
        m = t * dp
        picks = {
            build: spec.expected_block_size_m(
                m=m,
                topk=topk,
                local_experts=local,
                global_experts=global_,
                input_itemsize=2,
                patched=build == "candidate",
            )
            for build in BUILDS
        }
        rows.append(
            {
                "tokens_per_rank": t,
                "padded_m": m,
                "local_experts": local,
                "global_experts": experts,
                "topk": topk,
                **picks,
                "profile": t == own,
            }
        )
    return rows


def block_size_table(rows: list[dict]) -> str:
    lines = [
        "| tokens per rank | padded M | local / global experts | top-k | base bm | candidate bm | |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "this profile" if r["profile"] else ""
        lines.append(
            f"| {r['tokens_per_rank']} | {r['padded_m']} | {r['local_experts']} / {r['global_experts']} | "
            f"{r['topk']} | {r['base']} | {r['candidate']} | {mark} |"
        )
    return "\n".join(lines)


def models() -> list[str]:
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())


def model_dir(name: str) -> Path:
    path = MODELS_DIR / name
    if not (path / "config.json").is_file():
        raise UsageError(f"--model {name!r}: no ci/serving/models/{name}/config.json; choose one of {models()}")
    return path


def has_flag(tree: Path, flag: str) -> bool:
    """This vLLM's engine arguments define ``flag`` (read from its source, not imported)."""
    arg_utils = tree / "vllm" / "engine" / "arg_utils.py"
    return arg_utils.is_file() and f'"{flag}"' in arg_utils.read_text()


def moe_backend_flag(tree: Path) -> list[str]:
    """``--moe-backend marlin`` where this vLLM has the flag."""
    return ["--moe-backend", "marlin"] if has_flag(tree, "--moe-backend") else []


def server_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a server writes no bytecode into the tree it runs (ci.trees.treediff)
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # FlashInfer is optional; its sampler needs it
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (shared hosts)
    env.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: config and tokenizer ship in the repo
    env.setdefault("VLLM_NO_USAGE_STATS", "1")  # no telemetry thread in a benchmark's servers
    return env


GIB = 1 << 30


def attention_shape(config: dict) -> tuple[int, int, int]:
    """(attention heads, KV heads, head dim) of a model config (KV heads default to the heads, the head dim to
    hidden / heads)."""
    heads = config["num_attention_heads"]
    return heads, config.get("num_key_value_heads") or heads, config.get("head_dim") or config["hidden_size"] // heads


def kv_cache_bytes(model: Path, profile: Profile, dp: int) -> int:
    """A fixed KV cache for one server (``--kv-cache-memory-bytes``): what the profile's load can hold at
    once on one rank (its share of the concurrent requests, each up to ``max_model_len`` tokens, bf16 K and V
    of every layer), a quarter more, in whole GiB. With it vLLM sizes no KV cache from the device's free
    memory, so two servers may start at once (``--start parallel``): its memory profiling reads the whole
    device, and a server starting beside another would count the other's memory as its own."""
    config = json.loads((model / "config.json").read_text())
    _, heads, head_dim = attention_shape(config)
    per_token = 2 * config["num_hidden_layers"] * heads * head_dim * 2
    requests = -(-profile.concurrency // dp)
    need = 1.25 * per_token * requests * profile.max_model_len
    return max(1, -(-int(need) // GIB)) * GIB


# What one server holds on its GPU besides its weights and its fixed KV cache: CUDA context, CUDA graphs,
# activations, the Marlin workspace, and vLLM's own buffers. Set from two measurements of `pr` (DP = 1,
# qwen3-30b-a3b-like): six servers on one H200 peaked at 120,087 MiB (20,015 MiB = 19.5 GiB a server;
# nvidia-smi, reports/nvidia-h200-x1/tpot-9-pairs/gpu.csv), and vLLM 0.26.0 on an H100 logged "Model loading took
# 15.81 GiB" a server; the weights estimated below are 14.5 GiB, the KV cache 2 GiB, so 3 GiB besides.
SERVER_OVERHEAD_BYTES = 3 * GIB
# the share of a GPU the servers that start together may hold (memory_fraction asks each for its part of it)
START_SHARE = 0.9


def weight_bytes(model: Path, dp: int) -> int:
    """The weights one GPU of a server holds, estimated from the shipped config (a Qwen3-MoE layout): the
    attention and expert projections at ``bits / 8`` bytes a weight and a 2-byte scale a group (GPTQ; 2 bytes a
    weight unquantized), the routed experts split over the DP = EP ranks; embeddings, LM head and routers in
    bf16. qwen3-30b-a3b-like: 14.5 GiB at DP = 1 (vLLM 0.26.0 logs 15.8 GiB loaded: SERVER_OVERHEAD_BYTES holds
    the rest)."""
    config = json.loads((model / "config.json").read_text())
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "moe_intermediate_size", "vocab_size")
    missing = [k for k in keys if not isinstance(config.get(k), int)]
    if missing:
        raise UsageError(
            f"{model / 'config.json'}: no {', '.join(missing)}: the memory a server needs is estimated from them "
            "(a Qwen3-MoE layout); add them, or pass --start serial"
        )
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads, head_dim = attention_shape(config)
    experts, _ = moe_shape(model)
    quant = config.get("quantization_config") or {}
    bits, group = quant.get("bits", 16), quant.get("group_size", 128)
    per_weight = bits / 8 + (2 / group if bits < 16 else 0)
    local = -(-experts // dp) if dp > 1 else experts
    attention = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    routed = 3 * hidden * config["moe_intermediate_size"] * local
    dense = 2 * config["vocab_size"] * hidden + layers * hidden * experts  # embeddings, LM head, routers
    return int(layers * (attention + routed) * per_weight + 2 * dense)


def server_bytes(model: Path, profile: Profile, dp: int) -> int:
    """What one server started with a fixed KV cache holds on each of its GPUs: weights, KV cache, the rest."""
    return weight_bytes(model, dp) + kv_cache_bytes(model, profile, dp) + SERVER_OVERHEAD_BYTES


def pairs_that_fit(gpu_bytes: int, server: int) -> int:
    """Launch pairs whose servers (two a pair) fit on one GPU at once, within START_SHARE of it."""
    return int(START_SHARE * gpu_bytes // (2 * server))


def fit_pairs_at_once(pairs: int, asked: bool, gpu_bytes: int, server: int) -> tuple[int, str]:
    """The launch pairs a parallel start may start together on GPUs of ``gpu_bytes``, and a line that says why
    where it is fewer than ``pairs`` (the profile's, or ``--pairs-at-once`` where ``asked``). A
    :class:`UsageError` where one pair does not fit, or where the pairs asked for do not: six servers of `pr`
    need about 120 GB, an H200's, and on an 80 GB H100 vLLM refuses the later servers at start-up (free memory
    below what each asks for)."""
    fit = pairs_that_fit(gpu_bytes, server)
    besides = SERVER_OVERHEAD_BYTES // GIB
    need = f"a server needs about {server / GIB:.1f} GiB a GPU (weights, KV cache, {besides} GiB besides)"
    have = f"{START_SHARE:.0%} of the GPU's {gpu_bytes / GIB:.1f} GiB"
    if fit < 1:
        raise UsageError(
            f"one launch pair does not fit one GPU at once: {need}, two of them more than {have}; "
            "pass --start serial (each server sizes its KV cache from what is free)"
        )
    if pairs <= fit:
        return pairs, ""
    if asked:
        raise UsageError(
            f"--pairs-at-once {pairs}: {2 * pairs} servers do not fit at once ({need}, {have}); "
            f"pass --pairs-at-once {fit}"
        )
    return (
        fit,
        f"{pairs} launch pairs at once do not fit: {need}, {have} holds {fit} pair(s); {fit} at a time (recorded)",
    )


def kv_cache_flag(tree: Path, nbytes: int | None) -> list[str]:
    """``--kv-cache-memory-bytes N`` where ``nbytes`` is given; a :class:`UsageError` for a vLLM without it."""
    if nbytes is None:
        return []
    if not has_flag(tree, "--kv-cache-memory-bytes"):
        raise UsageError(
            f"{tree}: this vLLM has no --kv-cache-memory-bytes, which --start parallel needs; use --start serial"
        )
    return ["--kv-cache-memory-bytes", str(nbytes)]


def resolve_start(profile: Profile, start: str | None, pairs_at_once: int | None, mode: str) -> tuple[str, int]:
    """How a run's servers start, and how many launch pairs at once: the profile's unless overridden. A profile
    that starts several pairs at once starts them in parallel (``--start``'s default); a serial start is one pair
    at a time. A :class:`UsageError` for a combination that cannot run."""
    start = start or ("parallel" if profile.pairs_at_once > 1 else "serial")
    pairs = pairs_at_once if pairs_at_once is not None else (profile.pairs_at_once if start == "parallel" else 1)
    if start == "parallel" and mode == "sequential":
        raise UsageError(
            "--start parallel starts a pair's two servers at once: it needs --server-mode concurrent "
            "(or --start serial)"
        )
    if pairs < 1 or (pairs > 1 and start != "parallel"):
        raise UsageError(
            f"--pairs-at-once {pairs} starts several launch pairs' servers at once: it needs --start "
            "parallel (a fixed KV cache per server), and at least 1"
        )
    return start, pairs


def memory_fraction(profile: Profile, parallel: bool) -> float:
    """``--gpu-memory-utilization`` of one server. With a fixed KV cache (``parallel``) vLLM only checks that
    so much is free when the server starts; the servers of ``pairs_at_once`` pairs start together, so each asks
    for at most its share of 90% of the device."""
    if not parallel:
        return profile.gpu_memory_fraction
    return min(profile.gpu_memory_fraction, round(START_SHARE / (2 * max(1, profile.pairs_at_once)), 3))


def served_name(build: str) -> str:
    """The model name a server of this run answers to: proves a port is held by this run's server."""
    return f"gate-{procs.run_id()}-{build}"


def serve_argv(
    tree: Path,
    model: Path,
    *,
    port: int,
    profile: Profile,
    dp: int,
    seed: int,
    name: str | None = None,
    kv_bytes: int | None = None,
    memory_fraction: float | None = None,
) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(model),
        "--tokenizer",
        str(TOKENIZER_DIR),
        "--load-format",
        "dummy",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--seed",
        str(seed),
        "--max-model-len",
        str(profile.max_model_len),
        "--gpu-memory-utilization",
        str(memory_fraction or profile.gpu_memory_fraction),
        "--max-num-seqs",
        str(max(profile.concurrency, 1)),
        # every round repeats the same prompts (same seed): without prefix caching each round
        # does the same work, instead of the first one filling the cache for the rest
        "--no-enable-prefix-caching",
        "--compilation-config",
        profile.compilation_config,
    ]
    if dp > 1:
        argv += ["--data-parallel-size", str(dp), "--enable-expert-parallel"]
    if name:
        argv += ["--served-model-name", name]
    return argv + kv_cache_flag(tree, kv_bytes) + moe_backend_flag(tree)


def bench_args(
    model: Path, *, port: int, profile: Profile, prompts: int, out: Path, seed: int, name: str | None = None
) -> list[str]:
    """The arguments of ``vllm bench serve`` for one round (greedy, fixed lengths, same prompts each round).

    With ``name`` the requests ask for that served model, so a server of another run on the port
    answers 404 (failed requests, a ServerError) instead of being measured."""
    return [
        "--backend",
        "vllm",
        "--model",
        str(model),
        "--tokenizer",
        str(TOKENIZER_DIR),
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--dataset-name",
        "random",
        "--random-input-len",
        str(profile.input_len),
        "--random-output-len",
        str(profile.output_len),
        "--max-concurrency",
        str(profile.concurrency),
        "--num-prompts",
        str(prompts),
        "--ignore-eos",
        "--temperature",
        "0",
        "--disable-tqdm",
        "--seed",
        str(seed),
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
        *(["--served-model-name", name] if name else []),
    ]


def bench_argv(model: Path, **kw) -> list[str]:
    """The ``vllm bench serve`` command line (``--bench-client cli``; the tree comes from its PYTHONPATH)."""
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", *bench_args(model, **kw)]
