"""The TPOT stage without a GPU: command lines, result parsing, and the server lifecycle
end to end against a stand-in ``vllm`` (start, health wait, timeout, clean stop, log tail on death)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from ci.core.errors import DataError, ServerError
from ci.core.results import load_results
from ci.serving import config as sc
from ci.serving import tpot
from ci.serving.server import Server, free_port
from ci.trees.build import FileChange, TreeManifest, Trees
from tests.unit.factories import fake_tree

HERE = Path(__file__).resolve().parent
QWEN = sc.model_dir("qwen3-30b-a3b-like")


@pytest.fixture(autouse=True)
def worker_ports(monkeypatch) -> None:
    """Ports of their own for each pytest-xdist worker: servers of parallel tests must not race for one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    monkeypatch.setattr(tpot, "DEFAULT_PORT", 20000 + 500 * (int(worker) if worker.isdigit() else 0))


@pytest.fixture
def standin_trees(tmp_path, monkeypatch) -> Trees:
    monkeypatch.setenv("STANDIN_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    change = FileChange(path="vllm/x.py", sha256_before="a", sha256_after="b")
    manifest = TreeManifest(vllm_version="0.0.0", vllm_source="standin", patch_path="x.patch", patch_sha256="0",
                            reverse=False, base="base", candidate="candidate", changed_files=(change,))  # fmt: skip
    return Trees(manifest_path=tmp_path / "manifest.json", manifest=manifest,
                 base=fake_tree(tmp_path / "base"), candidate=fake_tree(tmp_path / "candidate"))  # fmt: skip


def test_serve_command_line(tmp_path):
    tree = fake_tree(tmp_path / "t")
    argv = sc.serve_argv(tree, QWEN, port=18001, profile=sc.PROFILES["pr"], dp=4, seed=3)
    assert argv[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", str(QWEN)]
    joined = " ".join(argv)
    for part in ("--load-format dummy", "--port 18001", "--data-parallel-size 4", "--enable-expert-parallel",
                 "--moe-backend marlin", "--seed 3", "--gpu-memory-utilization 0.4", "--no-enable-prefix-caching",
                 "--enforce-eager"):  # fmt: skip
        if part == "--enforce-eager":
            assert part not in joined, "the pr profile uses CUDA graphs"
        else:
            assert part in joined
    no_flag = fake_tree(tmp_path / "u", moe_flag=False)
    single = " ".join(sc.serve_argv(no_flag, QWEN, port=1, profile=sc.PROFILES["pr"], dp=1, seed=0))
    assert "--data-parallel-size" not in single and "--moe-backend" not in single


def test_bench_command_line_and_env(tmp_path):
    tree = fake_tree(tmp_path / "t")
    out = tmp_path / "r.json"
    argv = sc.bench_argv(QWEN, port=5, profile=sc.PROFILES["nightly"], prompts=640, out=out, seed=0)
    joined = " ".join(argv)
    for part in ("bench serve", "--dataset-name random", "--random-input-len 1024", "--random-output-len 1024",
                 "--max-concurrency 64", "--num-prompts 640", "--ignore-eos", "--temperature 0", "--save-result",
                 f"--result-dir {tmp_path} --result-filename r.json"):  # fmt: skip
        assert part in joined
    # the in-process client gets the same arguments, without the command
    assert argv[5:] == sc.bench_args(QWEN, port=5, profile=sc.PROFILES["nightly"], prompts=640, out=out, seed=0)
    env = sc.server_env(tree)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tree)
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


def test_parse_recorded_bench_result():
    """A file vllm bench serve (0.25.1) wrote on the H200 in this project (model paths made relative)."""
    r = tpot.parse_bench_result(HERE / "data" / "vllm-bench-serve-result.json", "base")
    assert r.completed == 64 and r.failed == 0
    assert round(r.median_tpot_ms, 3) == 2.392 and round(r.mean_tpot_ms, 3) == 2.299
    assert round(r.output_throughput) == 5668 and round(r.median_ttft_ms, 1) == 69.5


def test_bad_bench_results_are_refused(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"completed": 3, "failed": 0}))
    with pytest.raises(DataError, match="median_tpot_ms"):
        tpot.parse_bench_result(p, "base")
    data = json.loads((HERE / "data" / "vllm-bench-serve-result.json").read_text())
    p.write_text(json.dumps({**data, "failed": 2}))
    with pytest.raises(ServerError, match="2 requests failed"):  # the server's failure: exit 8, not 7
        tpot.parse_bench_result(p, "base")
    p.write_text("{")
    with pytest.raises(DataError, match="cannot read"):
        tpot.parse_bench_result(p, "base")


def test_rounds_alternate_and_balance():
    assert tpot.round_order(3) == ["base", "candidate", "candidate", "base", "base", "candidate"]


def _server(trees, tmp_path, mode="ok", delay="0.2"):
    env = {**sc.server_env(trees.base), "STANDIN_MODE": mode, "STANDIN_DELAY": delay}
    port = free_port(tpot.DEFAULT_PORT + 300)
    argv = sc.serve_argv(trees.base, QWEN, port=port, profile=sc.PROFILES["pr"], dp=1, seed=0)
    return Server("standin", argv, port=port, log=tmp_path / "server.log", env=env)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead too
        return fh.read().split()[2] != "Z"


def test_server_starts_becomes_healthy_and_stops_its_group(standin_trees, tmp_path):
    server = _server(standin_trees, tmp_path)
    with server:
        assert server.wait_healthy(30) < 30
        child = int((tmp_path / "child.pid").read_text())
        assert _alive(child)
    deadline = time.time() + 10
    while _alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the server's child process outlived stop()"
    assert not server.healthy()


def test_server_death_reports_code_and_log_tail(standin_trees, tmp_path):
    with _server(standin_trees, tmp_path, mode="die") as server, pytest.raises(ServerError) as err:
        server.wait_healthy(30)
    assert "exited with code 3" in str(err.value) and "No available memory" in str(err.value)


def test_health_timeout_is_an_error_with_log_tail(standin_trees, tmp_path):
    with _server(standin_trees, tmp_path, mode="never-healthy") as server, pytest.raises(ServerError) as err:
        server.wait_healthy(2)
    assert "not healthy after 2 s" in str(err.value) and "standin serve" in str(err.value)


def test_port_in_use_is_refused(standin_trees, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = Server("standin", ["true"], port=port, log=tmp_path / "l.log", env=dict(os.environ))
        with pytest.raises(ServerError, match=f"port {port} is in use"):
            server.start()


def _tiny_profile(monkeypatch):
    monkeypatch.setattr(tpot, "PROFILES", {**sc.PROFILES, "t": sc.Profile(
        input_len=8, output_len=8, concurrency=1, prompts=2, rounds=3, warmup_prompts=1, max_model_len=64,
        gpu_memory_fraction=0.1)})  # fmt: skip


@pytest.mark.parametrize(("mode", "client"), [("concurrent", "inprocess"), ("sequential", "inprocess"),
                                              ("concurrent", "cli")])  # fmt: skip
def test_ab_rounds_end_to_end(standin_trees, tmp_path, monkeypatch, mode, client):
    """Both servers from their own trees; the candidate's stand-in server runs 20% faster, and the
    client (one process for all rounds, or one command per round) must measure each server."""
    _tiny_profile(monkeypatch)
    (standin_trees.candidate / "vllm" / "entrypoints" / "cli" / "main.py").write_text(
        "import os\nos.environ['STANDIN_TPOT'] = '8'\n" + (HERE / "standin_vllm.py").read_text()
    )
    saved = tmp_path / "out" / "partial.json"
    results = tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "out", mode, 30, save_to=saved,
                            client=client)  # fmt: skip
    assert load_results(saved).settings["complete"] is True  # saved after every round, last one complete
    rebuilt = tpot.rounds_from_dir(tmp_path / "out")
    assert [r.build for r in rebuilt] == tpot.round_order(3)
    (case,) = results.cases
    assert case.samples == {"base": [10.0] * 3, "candidate": [8.0] * 3}
    assert [r["build"] for r in case.extra["rounds"]] == tpot.round_order(3)
    assert case.info["moe_backend_flag"] == ["--moe-backend", "marlin"]
    assert case.info["bench_client"] == tpot.CLIENTS[client]
    client_log = tmp_path / "out" / "bench-client.log"
    runs = 6 + (2 if mode == "concurrent" else 6)  # rounds, and a warm-up per server start
    if client == "inprocess":  # one process ran them all
        assert client_log.read_text().count("standin bench: ") == runs
        assert not list((tmp_path / "out").glob("bench-*-*.log"))
    else:
        assert not client_log.exists() and len(list((tmp_path / "out").glob("bench-*.log"))) == runs
    assert results.kind == "tpot-bench" and results.suite == "qwen3-30b-a3b-like-dp1-t"
    assert "--load-format dummy" in (tmp_path / "out" / "server-base.log").read_text().replace("', '", " ")


def test_unknown_model_is_a_usage_error():
    from ci.core.errors import UsageError

    with pytest.raises(UsageError, match="qwen3-30b-a3b-like"):
        sc.model_dir("llama")


def test_aa_run_serves_the_base_tree_twice(standin_trees, tmp_path, monkeypatch):
    _tiny_profile(monkeypatch)
    (standin_trees.candidate / "vllm" / "entrypoints" / "cli" / "main.py").write_text(
        "import os\nos.environ['STANDIN_TPOT'] = '8'\n" + (HERE / "standin_vllm.py").read_text()
    )
    results = tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "out", "concurrent", 30, aa=True)
    (case,) = results.cases
    assert case.samples == {"base": [10.0] * 3, "candidate": [10.0] * 3}  # the 8 ms candidate tree never ran
    assert results.settings["aa"] is True and results.settings["candidate"] == "base (A/A run)"
    assert all(set(r["machine"]) >= {"load_1min", "sm_clock_mhz"} for r in case.extra["rounds"])


def test_concurrent_servers_settle_before_the_first_round(standin_trees, tmp_path, monkeypatch):
    """With settle_s, both servers warm up in turn until then, and no round is measured sooner."""
    monkeypatch.setattr(tpot, "PROFILES", {**sc.PROFILES, "s": sc.Profile(
        input_len=8, output_len=8, concurrency=1, prompts=2, rounds=1, warmup_prompts=1, max_model_len=64,
        gpu_memory_fraction=0.1, settle_s=60.0)})  # fmt: skip
    # settle_s (--settle-s) overrides the profile's 60 s
    results = tpot.run_tpot(
        standin_trees, "qwen3-30b-a3b-like", "s", 1, tmp_path / "out", "concurrent", 30, settle_s=4.0
    )
    timeline = results.cases[0].extra["timeline"]
    assert 4.0 <= timeline["first_round_after_s"] < 30 and timeline["settle_runs"] >= 1
    assert results.cases[0].info["profile"]["settle_s"] == 4.0
    settles = sorted(p.name for p in (tmp_path / "out").glob("bench-*-settle-*.json"))
    assert len(settles) == timeline["settle_runs"] and settles[0] == "bench-base-settle-0.json"
    assert [r["build"] for r in results.cases[0].extra["rounds"]] == ["base", "candidate"]


def test_failed_round_is_an_error_and_servers_stop(standin_trees, tmp_path, monkeypatch):
    _tiny_profile(monkeypatch)
    monkeypatch.setenv("STANDIN_BENCH", "fail")
    with pytest.raises(ServerError, match="all requests failed") as err:
        tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "out", "concurrent", 30)
    assert "bench-client.log" in str(err.value)
    assert "RuntimeError: standin bench" in (tmp_path / "out" / "bench-client.log").read_text()
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.time() + 10
    while _alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the server outlived the failed round"


def test_client_of_a_vllm_without_the_bench_module_says_what_to_do(tmp_path):
    from ci.core.errors import MissingDependencyError

    client = tpot.BenchClient(fake_tree(tmp_path / "old", bench_module=False), tmp_path / "c.log").start()
    try:
        with pytest.raises(MissingDependencyError, match="use --bench-client cli"):
            client.wait_ready()
    finally:
        client.close()
    assert "ModuleNotFoundError" in (tmp_path / "c.log").read_text()


def test_decode_block_sizes_show_where_the_patch_matters_under_ep():
    """The pr profile's 8 tokens per rank at DP = EP = 2 picks 8 in both builds (nothing to measure);
    pr-ep's 64 tokens per rank pick 32 (base) and 16 (candidate), by the spec's exact rules."""
    (pr,) = [r for r in sc.decode_block_sizes(QWEN, sc.PROFILES["pr"], 2) if r["profile"]]
    assert (pr["tokens_per_rank"], pr["padded_m"], pr["base"], pr["candidate"]) == (8, 16, 8, 8)
    rows = {r["tokens_per_rank"]: r for r in sc.decode_block_sizes(QWEN, sc.PROFILES["pr-ep"], 2)}
    assert rows[64]["profile"] and (rows[64]["base"], rows[64]["candidate"]) == (32, 16)
    assert (rows[32]["base"], rows[32]["candidate"]) == (16, 8)
    assert (rows[64]["local_experts"], rows[64]["global_experts"], rows[64]["topk"]) == (64, 128, 8)
    # without EP the patch changes nothing, whatever the load
    assert all(r["base"] == r["candidate"] for r in sc.decode_block_sizes(QWEN, sc.PROFILES["pr-ep"], 1))


def test_block_size_table_cli_needs_no_gpu_and_run_needs_its_files(capsys):
    from ci.core.errors import UsageError

    assert tpot.main(["--block-sizes", "--profile", "pr-ep", "--dp", "2"]) == 0
    out = capsys.readouterr().out
    assert "| 64 | 128 | 64 / 128 | 8 | 32 | 16 | this profile |" in out
    with pytest.raises(UsageError, match="--manifest and --out"):
        tpot.main(["--profile", "pr-ep"])


def test_committed_two_gpu_baseline_is_a_complete_ep_ab_run():
    """The x2 TPOT baseline is what its path claims: 2 GPUs, DP = EP = 2, pr-ep, every round, not an A/A,
    measured where the builds pick different block sizes."""
    root = HERE.parent.parent
    path = root / "baselines" / "nvidia-h200-x2" / "tpot-qwen3-30b-a3b-like-dp2-pr-ep.json"
    results = load_results(path)
    assert results.gpu_key() == ("NVIDIA H200", 2) and results.suite == "qwen3-30b-a3b-like-dp2-pr-ep"
    assert results.settings["complete"] is True and results.settings["aa"] is False
    (case,) = results.cases
    assert case.info["dp"] == 2 and case.info["expert_parallel"] is True
    assert case.info["profile"]["concurrency"] == sc.PROFILES["pr-ep"].concurrency
    assert {len(v) for v in case.samples.values()} == {sc.PROFILES["pr-ep"].rounds}
    (row,) = case.info["decode_block_size_m"]
    assert (row["base"], row["candidate"]) == (32, 16)
