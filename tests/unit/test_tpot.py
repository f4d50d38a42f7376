"""The TPOT stage without a GPU: command lines, result parsing, and the server lifecycle
end to end against a stand-in ``vllm`` (start, health wait, timeout, clean stop, log tail on death)."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ci.core import sequential
from ci.core.errors import DataError, ServerError
from ci.core.results import load_results
from ci.serving import config as sc
from ci.serving import launches, tpot
from ci.serving.client import CLIENTS, BenchClient, parse_bench_result
from ci.serving.server import Server, free_port
from ci.trees.manifest import TreeManifest, Trees
from ci.trees.treediff import FileChange
from tests.unit.factories import fake_tree

HERE = Path(__file__).resolve().parent
QWEN = sc.model_dir("qwen3-30b-a3b-like")


@pytest.fixture(autouse=True)
def worker_ports(monkeypatch) -> None:
    """Ports of their own for each pytest-xdist worker, and apart for two test sessions at once (e.g. mutmut
    beside a test run): servers of parallel tests must not race for one (free_port checks, then the server binds)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    session = 1000 * (os.getppid() % 20)  # the xdist workers of one session share their parent
    monkeypatch.setattr(launches, "DEFAULT_PORT", 20000 + session + 500 * (int(worker) if worker.isdigit() else 0))


STANDIN_PICKS = [{"base": 8, "candidate": 8, "picked_by": "the stand-in trees (they have no fused_marlin_moe)"}]


@pytest.fixture
def standin_trees(tmp_path, monkeypatch) -> Trees:
    """Stand-in trees (a stand-in vllm serve, no Marlin code): the picks each build makes are stood in for too
    (the real ones: tests/ep_marlin/test_callers.py)."""
    monkeypatch.setattr(tpot, "built_decode_picks", lambda *a, **k: STANDIN_PICKS)
    monkeypatch.setenv("STANDIN_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    change = FileChange(path="vllm/x.py", sha256_before="a", sha256_after="b")
    manifest = TreeManifest(
        vllm_version="0.0.0",
        vllm_source="standin",
        patch_path="x.patch",
        patch_sha256="0",
        reverse=False,
        base="base",
        candidate="candidate",
        changed_files=(change,),
    )
    return Trees(
        manifest_path=tmp_path / "manifest.json",
        manifest=manifest,
        base=fake_tree(tmp_path / "base"),
        candidate=fake_tree(tmp_path / "candidate"),
    )


def test_serve_command_line(tmp_path):
    tree = fake_tree(tmp_path / "t")
    argv = sc.serve_argv(tree, QWEN, port=18001, profile=sc.PROFILES["pr"], dp=4, seed=3)
    assert argv[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", str(QWEN)]
    joined = " ".join(argv)
    for part in (
        "--load-format dummy",
        "--port 18001",
        "--data-parallel-size 4",
        "--enable-expert-parallel",
        "--moe-backend marlin",
        "--seed 3",
        "--gpu-memory-utilization 0.4",
        "--no-enable-prefix-caching",
        "--enforce-eager",
    ):
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
    for part in (
        "bench serve",
        "--dataset-name random",
        "--random-input-len 1024",
        "--random-output-len 1024",
        "--max-concurrency 64",
        "--num-prompts 640",
        "--ignore-eos",
        "--temperature 0",
        "--save-result",
        f"--result-dir {tmp_path} --result-filename r.json",
    ):
        assert part in joined
    # the in-process client gets the same arguments, without the command
    assert argv[5:] == sc.bench_args(QWEN, port=5, profile=sc.PROFILES["nightly"], prompts=640, out=out, seed=0)
    env = sc.server_env(tree)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tree)
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


def test_parse_recorded_bench_result():
    """A file vllm bench serve (0.25.1) wrote on the H200 in this project (model paths made relative)."""
    r = parse_bench_result(HERE / "data" / "vllm-bench-serve-result.json", "base")
    assert r.completed == 64 and r.failed == 0
    assert round(r.median_tpot_ms, 3) == 2.392 and round(r.mean_tpot_ms, 3) == 2.299
    assert round(r.output_throughput) == 5668 and round(r.median_ttft_ms, 1) == 69.5


def test_bad_bench_results_are_refused(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"completed": 3, "failed": 0}))
    with pytest.raises(DataError, match="median_tpot_ms"):
        parse_bench_result(p, "base")
    data = json.loads((HERE / "data" / "vllm-bench-serve-result.json").read_text())
    p.write_text(json.dumps({**data, "failed": 2}))
    with pytest.raises(ServerError, match="2 requests failed"):  # the server's failure: exit 8, not 7
        parse_bench_result(p, "base")
    p.write_text("{")
    with pytest.raises(DataError, match="cannot read"):
        parse_bench_result(p, "base")


def test_rounds_alternate_and_balance():
    assert launches.round_order(3) == ["base", "candidate", "candidate", "base", "base", "candidate"]


def _server(trees, tmp_path, mode="ok", delay="0.2"):
    env = {**sc.server_env(trees.base), "STANDIN_MODE": mode, "STANDIN_DELAY": delay}
    port = free_port(launches.DEFAULT_PORT + 300)
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


def _tiny_profile(monkeypatch, **fields):
    profile = sc.Profile(
        input_len=8,
        output_len=8,
        concurrency=1,
        prompts=2,
        launches=2,
        rounds=3,
        warmup_prompts=1,
        max_model_len=64,
        gpu_memory_fraction=0.1,
    )
    profiles = {**sc.PROFILES, "t": replace(profile, **fields)}
    monkeypatch.setattr(tpot, "PROFILES", profiles)
    monkeypatch.setattr(sc, "PROFILES", profiles)  # what the subject's evidence rules read


@pytest.mark.parametrize(
    ("mode", "client"), [("concurrent", "inprocess"), ("sequential", "inprocess"), ("concurrent", "cli")]
)
def test_ab_launch_pairs_end_to_end(standin_trees, tmp_path, monkeypatch, mode, client):
    """Both servers from their own trees in each launch pair; the candidate's stand-in server runs 20% faster,
    and the client (one process for all rounds, or one command per round) must measure each server. Each
    round's launch pair is its capture; the pairs alternate which build starts first."""
    _tiny_profile(monkeypatch)
    (standin_trees.candidate / "vllm" / "entrypoints" / "cli" / "main.py").write_text(
        "import os\nos.environ['STANDIN_TPOT'] = '8'\n" + (HERE / "standin_vllm.py").read_text()
    )
    saved = tmp_path / "out" / "partial.json"
    results = tpot.run_tpot(
        standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "out", mode, 30, save_to=saved, client=client
    )
    assert load_results(saved).settings["complete"] is True  # saved after every round, last one complete
    if mode == "concurrent":  # the pair's two servers side by side, rounds interleaved
        order = ["base", "candidate", "candidate", "base", "base", "candidate"]
        order += ["candidate", "base", "base", "candidate", "candidate", "base"]
    else:  # one server at a time, in the pair's start order
        order = ["base"] * 3 + ["candidate"] * 6 + ["base"] * 3
    rebuilt = tpot.rounds_from_dir(tmp_path / "out")
    assert [r.build for r in rebuilt] == order and [r.launch for r in rebuilt] == [0] * 6 + [1] * 6
    (case,) = results.cases
    assert case.samples == {"base": [10.0] * 6, "candidate": [8.0] * 6}
    assert case.extra["captures"] == {"base": [0, 0, 0, 1, 1, 1], "candidate": [0, 0, 0, 1, 1, 1]}
    assert [r["build"] for r in case.extra["rounds"]] == order
    assert [r["server_itl_ms"] for r in case.extra["rounds"]] == pytest.approx(
        [10 if b == "base" else 8 for b in order]
    )
    launches = case.extra["timeline"]["launches"]
    assert [rec["order"][0] for rec in launches] == ["base", "candidate"]  # who started first alternates
    assert all(set(rec["startup_s"]) == {"base", "candidate"} for rec in launches)
    assert results.settings["order"] == [f"{n}:{b}" for n, b in zip([0] * 6 + [1] * 6, order, strict=True)]
    assert case.info["moe_backend_flag"] == ["--moe-backend", "marlin"]
    assert case.info["bench_client"] == CLIENTS[client]
    client_log = tmp_path / "out" / "bench-client.log"
    runs = 12 + 4  # rounds, and a warm-up per server launch
    if client == "inprocess":  # one process ran them all
        assert client_log.read_text().count("standin bench: ") == runs
        assert not list((tmp_path / "out").glob("bench-*-*.log"))
    else:
        assert not client_log.exists() and len(list((tmp_path / "out").glob("bench-*.log"))) == runs
    assert results.kind == "tpot-bench" and results.suite == "qwen3-30b-a3b-like-dp1-t"
    assert "--load-format dummy" in (tmp_path / "out" / "server-l0-base.log").read_text().replace("', '", " ")
    from ci.core import compare

    gate = compare.compare_ab(results, 0.03, 0.95)
    (verdict,) = gate.cases  # the interval is over the 2 launch pairs: too few for a 95% interval
    assert gate.problems == [] and verdict.verdict.name == "INCONCLUSIVE"
    assert verdict.effect.method == compare.stats.METHOD_CAPTURES and verdict.effect.ratio == pytest.approx(0.8)


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
    assert case.samples == {"base": [10.0] * 6, "candidate": [10.0] * 6}  # the 8 ms candidate tree never ran
    assert results.settings["aa"] is True and results.settings["candidate"] == "base (A/A run)"
    assert all(set(r["machine"]) >= {"load_1min", "sm_clock_mhz"} for r in case.extra["rounds"])


def test_each_launch_settles_until_every_server_is_stable(standin_trees, tmp_path, monkeypatch):
    """After its warm-up a server answers 13, 12, 11 ms, then 10: settling runs go on, the servers in turn, until
    each server's last three agree within 1%, and no round is measured sooner; the timeline says so."""
    _tiny_profile(monkeypatch, launches=1, rounds=1, settle_max_s=60.0, settle_prompts=1)
    monkeypatch.setenv("STANDIN_TPOT_SEQUENCE", "14,13,12,11")  # the warm-up takes the first
    results = tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "out", "concurrent", 30)
    (settle,) = results.cases[0].extra["timeline"]["launches"][0]["settle"]
    assert settle["settled"] is True and settle["servers"] == ["l0-base", "l0-candidate"]
    assert settle["median_tpot_ms"] == {
        "l0-base": [13.0, 12.0, 11.0, 10.0, 10.0, 10.0],
        "l0-candidate": [13.0, 12.0, 11.0, 10.0, 10.0, 10.0],
    }
    assert settle["runs"] == 12 and results.cases[0].samples == {"base": [10.0], "candidate": [10.0]}
    assert len(list((tmp_path / "out").glob("bench-settle-l0-*.json"))) == 12


def test_settling_stops_at_the_cap_and_says_it_did_not_settle(standin_trees, tmp_path, monkeypatch):
    _tiny_profile(monkeypatch, launches=1, rounds=1, settle_max_s=6.0, settle_prompts=1)
    monkeypatch.setenv("STANDIN_TPOT_SEQUENCE", "20,25")  # never stable, however many runs fit in the cap
    monkeypatch.setenv("STANDIN_TPOT_CYCLE", "1")
    results = tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "out", "concurrent", 30)
    (settle,) = results.cases[0].extra["timeline"]["launches"][0]["settle"]
    assert settle["settled"] is False and settle["runs"] >= 2
    assert results.cases[0].extra["timeline"]["launches"][0]["first_round_after_s"] >= 6.0


def test_the_settling_rule():
    assert launches.settled([10.0, 10.05, 10.08], 3, 0.01) and not launches.settled([10.0, 10.05], 3, 0.01)
    assert not launches.settled([10.0, 10.2, 10.05], 3, 0.01) and launches.settled([12.0, 10.0, 10.05, 10.0], 3, 0.01)


def test_launch_pairs_alternate_who_starts_and_balance_rounds():
    assert [launches.launch_order(n) for n in range(3)] == [
        ("base", "candidate"),
        ("candidate", "base"),
        ("base", "candidate"),
    ]
    profile = replace(sc.PROFILES["pr"], launches=2, rounds=2)
    assert launches.run_order(profile) == [
        (0, "base"),
        (0, "candidate"),
        (0, "candidate"),
        (0, "base"),
        (1, "candidate"),
        (1, "base"),
        (1, "base"),
        (1, "candidate"),
    ]


def test_profile_overrides_are_checked_and_recorded(standin_trees, tmp_path, monkeypatch):
    from ci.core.errors import UsageError

    with pytest.raises(UsageError, match=r"--launches 0, --settle-max-s -1.0: launches and rounds need at least 1"):
        tpot.main(["--launches", "0", "--settle-max-s", "-1", "--block-sizes"])
    _tiny_profile(monkeypatch)
    results = tpot.run_tpot(
        standin_trees,
        "qwen3-30b-a3b-like",
        "t",
        1,
        tmp_path / "out",
        "concurrent",
        30,
        overrides={"launches": 1, "rounds": 1},
    )
    assert results.cases[0].info["profile"]["launches"] == 1 and results.settings["rounds_per_build"] == 1
    from ci.core import evidence

    problems = evidence.run_problems(results)  # the suite's profile "t" runs 2 pairs of 3 rounds
    assert "case qwen3-30b-a3b-like/dp1-ep1/t: 1 sample(s) of 'base', at least 6 are needed" in problems


def test_a_fixed_kv_cache_is_what_the_profile_can_hold_on_one_rank(tmp_path):
    """Qwen3-30B-A3B-like: 48 layers x 4 KV heads x 128 x K and V in bf16 = 96 KiB a token."""
    assert sc.kv_cache_bytes(QWEN, sc.PROFILES["pr"], 1) == 2 * sc.GIB  # 1.25 x 16 x 1024 tokens = 1.9 GiB
    assert sc.kv_cache_bytes(QWEN, sc.PROFILES["pr-ep"], 2) == 8 * sc.GIB  # 64 requests a rank: 7.5 GiB
    argv = sc.serve_argv(
        fake_tree(tmp_path / "t"), QWEN, port=1, profile=sc.PROFILES["pr"], dp=1, seed=0, kv_bytes=2 * sc.GIB
    )
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(2 * sc.GIB)
    from ci.core.errors import UsageError

    with pytest.raises(UsageError, match="this vLLM has no --kv-cache-memory-bytes, which --start parallel needs"):
        sc.serve_argv(
            fake_tree(tmp_path / "old", kv_flag=False),
            QWEN,
            port=1,
            profile=sc.PROFILES["pr"],
            dp=1,
            seed=0,
            kv_bytes=sc.GIB,
        )


def test_parallel_start_launches_both_servers_of_a_pair_at_once(standin_trees, tmp_path, monkeypatch):
    """Each stand-in server is healthy only once the candidate's server of the pair has been started: started
    one after the other, the base server never gets healthy; started at once, both do, each with a fixed
    KV cache on its command line, and the results record how they started."""
    _tiny_profile(monkeypatch, launches=1, rounds=1)
    out = tmp_path / "out"
    monkeypatch.setenv("STANDIN_HEALTHY_AFTER_FILE", str(out / "server-l0-candidate.log"))
    results = tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, out, "concurrent", 20, start="parallel")
    assert results.cases[0].samples == {"base": [10.0], "candidate": [10.0]}
    assert results.cases[0].info["start"] == "parallel" and results.cases[0].info["kv_cache_bytes"] == sc.GIB
    assert "--kv-cache-memory-bytes" in (out / "server-l0-base.log").read_text()
    monkeypatch.setenv("STANDIN_HEALTHY_AFTER_FILE", str(tmp_path / "serial" / "server-l0-candidate.log"))
    with pytest.raises(ServerError, match=r"vllm serve \(base, launch 0\) was not healthy after 3 s"):
        tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "serial", "concurrent", 3)
    from ci.core.errors import UsageError

    with pytest.raises(UsageError, match="--start parallel starts a pair's two servers at once"):
        tpot.main(["--start", "parallel", "--server-mode", "sequential", "--block-sizes"])
    with pytest.raises(UsageError, match="--start parallel starts a pair's two servers at once"):
        tpot.main(["--server-mode", "sequential", "--block-sizes"])  # pr's default start is parallel
    with pytest.raises(UsageError, match="--pairs-at-once 2 starts several launch pairs' servers at once: it needs"):
        tpot.main(["--pairs-at-once", "2", "--start", "serial", "--block-sizes"])
    with pytest.raises(UsageError, match="--pairs-at-once 0 starts several"):
        tpot.main(["--pairs-at-once", "0", "--block-sizes"])
    pr, tiny = sc.PROFILES["pr"], sc.PROFILES["t"]  # pr starts three pairs at once: in parallel by default
    assert sc.resolve_start(pr, None, None, "concurrent") == ("parallel", 3)
    assert sc.resolve_start(pr, "serial", None, "concurrent") == ("serial", 1)
    assert sc.resolve_start(pr, None, 1, "concurrent") == ("parallel", 1)
    assert sc.resolve_start(tiny, None, None, "sequential") == ("serial", 1)
    with pytest.raises(UsageError, match="it needs --server-mode concurrent"):
        sc.resolve_start(pr, None, None, "sequential")
    monkeypatch.delenv("STANDIN_HEALTHY_AFTER_FILE")
    serial = tpot.run_tpot(
        standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "s1", "concurrent", 20, overrides={"pairs_at_once": 2}
    )
    assert serial.cases[0].info["profile"]["pairs_at_once"] == 1  # serial: one pair at a time, and recorded so


def test_a_server_that_lost_a_port_race_is_started_again_and_recorded(standin_trees, tmp_path, monkeypatch):
    """A server that died with EADDRINUSE (another server took the port vLLM found free) starts again, its
    first log kept and the restart recorded; a server that died otherwise, or lost every race, is the error."""
    _tiny_profile(monkeypatch, launches=1, rounds=1)
    monkeypatch.setenv("STANDIN_MODE", "port-race-once")
    monkeypatch.setenv("STANDIN_PORT_RACE_FILE", str(tmp_path / "raced"))
    out = tmp_path / "out"
    results = tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, out, "concurrent", 20)
    (record,) = results.cases[0].extra["timeline"]["launches"]
    first = record["order"][0]
    assert record["port_race_restarts"] == {first: 1}
    assert results.cases[0].samples == {"base": [10.0], "candidate": [10.0]}
    assert "EADDRINUSE" in (out / f"server-l0-{first}-port-race-1.log").read_text()
    assert "EADDRINUSE" not in (out / f"server-l0-{first}.log").read_text()
    monkeypatch.setattr(launches, "PORT_RACE_RESTARTS", 0)
    (tmp_path / "raced").unlink()
    with pytest.raises(ServerError, match=r"exited with code 1 before it was healthy(?s:.)*EADDRINUSE"):
        tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "lost", "concurrent", 20)
    monkeypatch.setattr(launches, "PORT_RACE_RESTARTS", 2)
    monkeypatch.setenv("STANDIN_MODE", "die")
    with pytest.raises(ServerError, match="exited with code 3"):
        tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "died", "concurrent", 20)
    assert not list((tmp_path / "died").glob("*port-race*"))


def test_pairs_started_together_share_a_start_and_keep_their_own_rounds(standin_trees, tmp_path, monkeypatch):
    """Three pairs, two at a time: pair 0's servers get healthy only once pair 1's candidate server has
    started, so the group's four servers start at once; then each pair's rounds in turn (a b b a), the pairs
    still the captures, and each server asks for its share of the GPU's memory."""
    _tiny_profile(monkeypatch, launches=3, rounds=1, pairs_at_once=2)
    out = tmp_path / "out"
    monkeypatch.setenv("STANDIN_HEALTHY_AFTER_FILE", str(out / "server-l1-candidate.log"))
    results = tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, out, "concurrent", 20, start="parallel")
    (case,) = results.cases
    assert [(r["launch"], r["build"]) for r in case.extra["rounds"]] == [
        (0, "base"),
        (0, "candidate"),
        (1, "candidate"),
        (1, "base"),
        (2, "base"),
        (2, "candidate"),
    ]
    assert case.extra["captures"] == {"base": [0, 1, 2], "candidate": [0, 1, 2]}
    records = case.extra["timeline"]["launches"]
    assert [rec["started_with"] for rec in records] == [[0, 1], [0, 1], [2]]
    assert records[0]["settle"] == records[1]["settle"]  # one settling over the group's four servers
    assert records[0]["settle"][0]["servers"] == ["l0-base", "l0-candidate", "l1-candidate", "l1-base"]
    assert case.info["gpu_memory_utilization"] == 0.1  # the profile's, under 90% / 4 servers
    assert sc.memory_fraction(replace(sc.PROFILES["pr"], pairs_at_once=3), True) == 0.15
    assert sc.memory_fraction(replace(sc.PROFILES["pr"], pairs_at_once=3), False) == 0.4
    assert sc.memory_fraction(replace(sc.PROFILES["pr"], pairs_at_once=1), True) == 0.4
    log = (out / "server-l1-base.log").read_text()
    assert "--kv-cache-memory-bytes" in log and "--gpu-memory-utilization', '0.1'" in log


def test_a_sequential_run_adds_a_group_of_pairs_while_open_and_records_each_group(standin_trees, tmp_path, monkeypatch):
    """Issue 44: two launch pairs (an interval over two pairs is unbounded: INCONCLUSIVE) then, as the plan says,
    one group of two pairs more started together, judged again; the results record the plan, the pairs planned
    and each group with its times, and the gate judges the looks (the last one, unbounded again, stays open)."""
    _tiny_profile(monkeypatch, launches=2, rounds=1, pairs_at_once=2)
    plan = sequential.Plan(first=2, group=2, max_extra=1)
    out = tmp_path / "out"
    results = tpot.run_tpot(
        standin_trees, "qwen3-30b-a3b-like", "t", 1, out, "concurrent", 20, start="parallel", plan=plan
    )
    (case,) = results.cases
    assert case.extra["captures"] == {"base": [0, 1, 2, 3], "candidate": [0, 1, 2, 3]}
    groups = case.extra["timeline"]["groups"]
    assert [g["pairs"] for g in groups] == [[0, 2], [2, 4]] and all("ended" in g for g in groups)
    assert [rec["started_with"] for rec in case.extra["timeline"]["launches"]] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert results.settings["complete"] is True and results.settings["launches_run"] == 4
    assert results.settings["sequential"] == plan.to_settings(0.03)
    assert results.settings["order"][-2:] == ["3:candidate", "3:base"]
    from ci.core import compare

    (verdict,) = compare.compare_ab(results, 0.03, 0.95).cases
    assert [look["captures"] for look in verdict.looks] == [2, 4] and verdict.verdict.name == "INCONCLUSIVE"
    single = tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "one", "concurrent", 20)
    assert "sequential" not in single.settings and single.cases[0].extra["timeline"]["groups"] == [
        {**single.cases[0].extra["timeline"]["groups"][0], "pairs": [0, 2]}
    ]


FAKE_TORCH = """
import os
calls = []
class _Cuda:
    def _sleep(self, cycles):
        calls.append(cycles)
    def is_current_stream_capturing(self):
        return os.environ.get("FAKE_CAPTURING") == "1"
    class Event:
        def __init__(self, enable_timing):
            pass
        def record(self):
            pass
        def synchronize(self):
            pass
        timings = [0.8, 0.5, 0.6, 0.5, 0.9]  # ms for the 1,000,000 calibration cycles, another process
        def elapsed_time(self, other):  # lengthening some: the shortest is 2,000 cycles a microsecond
            return self.timings.pop(0)
cuda = _Cuda()
"""
MARLIN = "def fused_marlin_moe(x):\n    return 2 * x\n\ndef apply(x):\n    return fused_marlin_moe(x)\n"


def test_the_injected_sleep_is_timed_then_runs_before_every_fused_marlin_moe_call(tmp_path):
    """ci/serving/inject/sitecustomize.py in a fresh process, with a stand-in torch and vLLM module: the module's
    own calls (global lookup, as MarlinExperts.apply makes them) go through the sleep; the next sitecustomize on
    the path still runs; a first call inside a graph capture is refused (nothing can be timed there)."""
    import subprocess
    import sys

    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(FAKE_TORCH)
    module = fake / "vllm/model_executor/layers/fused_moe/experts/marlin_moe.py"
    module.parent.mkdir(parents=True)
    module.write_text(MARLIN)
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\n")
    code = (
        "import os, torch\nfrom vllm.model_executor.layers.fused_moe.experts import marlin_moe as m\n"
        "print(m.apply(3), m.fused_marlin_moe(4), torch.calls, os.environ.get('OTHER_SITECUSTOMIZE'))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(launches.INJECT_DIR), str(fake), str(other)]),
        "GATE_INJECT_SLEEP_US": "5",
    }
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.split(" ", 2)[:2] == ["6", "8"], done.stderr
    assert done.stdout.strip().endswith(f"[1000, {'1000000, ' * 5}10000, 10000] ran")  # warm, time, 5 us a call
    assert "gate injection: 5.0 us = 10000 GPU sleep cycles a fused_marlin_moe call" in done.stderr
    captured = subprocess.run(
        [sys.executable, "-c", code], env={**env, "FAKE_CAPTURING": "1"}, capture_output=True, text=True, cwd=tmp_path
    )
    assert captured.returncode == 1 and "inside a graph capture, so the sleep cannot be timed" in captured.stderr
    plain = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "GATE_INJECT_SLEEP_US": ""},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert plain.stdout.strip() == "6 8 [] ran"  # no sleep asked: the module is left alone


def test_only_the_candidate_server_of_an_aa_run_gets_the_sleep(standin_trees, tmp_path, monkeypatch):
    from ci.core.errors import UsageError

    runner = launches.Runner(standin_trees, QWEN, sc.PROFILES["pr"], 1, tmp_path, 10, aa=True, inject_sleep_us=2.5)
    cand, base = runner.server("candidate", 1, 0), runner.server("base", 2, 0)
    assert cand.env["GATE_INJECT_SLEEP_US"] == "2.5" and cand.env["PYTHONPATH"].startswith(str(launches.INJECT_DIR))
    assert "GATE_INJECT_SLEEP_US" not in base.env and str(launches.INJECT_DIR) not in base.env["PYTHONPATH"]
    assert (
        str(standin_trees.base) in cand.env["PYTHONPATH"] and str(standin_trees.candidate) not in cand.env["PYTHONPATH"]
    )
    _tiny_profile(monkeypatch, launches=1, rounds=1)
    results = tpot.run_tpot(
        standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "out", "concurrent", 30, aa=True, inject_sleep_us=2.5
    )
    assert results.settings["inject_sleep_us"] == 2.5
    assert results.settings["candidate"] == "base (A/A run) with a GPU sleep of 2.5 us in each fused_marlin_moe call"
    with pytest.raises(UsageError, match="--inject-sleep-us slows the candidate of an A/A run"):
        tpot.run_tpot(standin_trees, "qwen3-30b-a3b-like", "t", 1, tmp_path / "x", "concurrent", 30, inject_sleep_us=1)
    with pytest.raises(UsageError, match=r"--inject-sleep-us 2.0: a positive sleep, with --aa"):
        tpot.main(["--inject-sleep-us", "2", "--block-sizes"])


def test_tpot_error_rates_size_the_sleep_from_the_pilot_and_judge_every_run(standin_trees, tmp_path, monkeypatch):
    """The first A/A is the pilot: its base TPOT (10 ms) over 48 MoE layers sizes a +5% sleep, less the 1% of the
    step given as the sleep's own overhead, at 8.333 us a call, which the stand-in server adds to its TPOT as the
    real one would (48 calls a step, no overhead of its own): 1.04, FAIL; the A/A: PASS."""
    from ci.host import gpu
    from ci.serving import error_rates
    from ci.trees import manifest

    _tiny_profile(monkeypatch, launches=6, rounds=1)
    monkeypatch.setattr(
        gpu,
        "query",
        lambda: (
            "580",
            [gpu.GpuInfo(index=0, name="NVIDIA H200", uuid="u", memory_total_mib=143771, memory_used_mib=0)],
        ),
    )
    monkeypatch.setattr(manifest, "load_trees", lambda path: standin_trees)
    out = tmp_path / "rates"
    argv = [
        "--manifest",
        "m.json",
        "--out",
        str(out),
        "--profile",
        "t",
        "--sleep-overhead",
        "0.01",
        "--aa-runs",
        "1",
        "--inject",
        "0.05",
    ]
    from ci.core.errors import UsageError

    for overhead in ("0.05", "-0.001"):  # refused before anything runs
        with pytest.raises(UsageError, match=f"--sleep-overhead {float(overhead)}: a fraction of the step from 0"):
            error_rates.main([*argv[:6], "--sleep-overhead", overhead, "--inject", "0.02,0.05"])
    assert not out.exists()
    assert error_rates.main(argv) == 0
    payload = json.loads((out / "error-rates.json").read_text())
    aa, slowed = payload["runs"]
    assert (aa["run"], aa["overall"], aa["sleep_us"]) == ("aa-1", "PASS", 0.0)
    assert (slowed["run"], slowed["overall"], slowed["sleep_us"]) == ("inject-5pct-1", "FAIL", 8.333)
    assert slowed["median_ratio"] == pytest.approx(1.04, abs=1e-4) and payload["settings"]["moe_layers"] == 48
    assert payload["pooled"]["0.05"]["share"]["FAIL"] == 1.0 and payload["settings"]["pilot_base_tpot_ms"] == 10.0
    first = (out / "error-rates.md").read_text()
    assert "| +5.0% injected | 1 | 0.0% | 0.0% | 100.0% | FAIL in 100% | 1.0400 |" in first
    assert "sized for its level minus 1.0% of the step" in first and payload["settings"]["sleep_overhead"] == 0.01
    assert (out / "inject-5pct-1" / "tpot-results.json").is_file()
    # another session adds to the table: numbered on, the earlier pilot sizes the sleep, both sessions' rows kept
    assert error_rates.main([*argv[:8], "--aa-runs", "0", "--inject", "0.05"]) == 0
    payload = json.loads((out / "error-rates.json").read_text())
    assert [r["run"] for r in payload["runs"]] == ["aa-1", "inject-5pct-1", "inject-5pct-2"]
    assert payload["runs"][2]["sleep_us"] == 8.333 and payload["pooled"]["0.05"]["runs"] == 2
    text = (out / "error-rates.md").read_text()
    assert payload["runs"][2]["session"]["run_id"] and "| inject-5pct-2 | 20" in text
    assert "| 100.0% | FAIL in 100% | 1.0400 to 1.0400 |" in text and "| no FAIL and no INCONCLUSIVE | 1.0000 |" in text

    with pytest.raises(UsageError, match=r"measured something else \(start: 'serial' there, 'parallel' now\)"):
        error_rates.main([*argv[:8], "--aa-runs", "0", "--start", "parallel"])
    with pytest.raises(UsageError, match=r"measured something else \(sleep_overhead: 0.01 there, 0.0 now\)"):
        error_rates.main([*argv[:6], "--aa-runs", "0"])
    with pytest.raises(UsageError, match=r"--aa-runs 0: .* has no pilot yet"):
        error_rates.main(["--manifest", "m.json", "--out", str(tmp_path / "new"), "--profile", "t", "--aa-runs", "0"])


def test_the_sleep_per_call_and_the_moe_layers():
    from ci.core.errors import UsageError
    from ci.serving import error_rates

    assert error_rates.moe_layers(QWEN) == 48
    assert error_rates.sleep_us_for(0.035, 7.19, 48) == 5.243
    with pytest.raises(UsageError, match="needs a fraction, a base TPOT and MoE layers > 0"):
        error_rates.sleep_us_for(0.035, 0.0, 48)


def test_server_side_decode_timing_from_metrics():
    from ci.serving.server import parse_metrics, server_itl_ms

    itl = "vllm:inter_token_latency_seconds"
    text = (
        f'# HELP {itl} ...\n{itl}_bucket{{le="0.01"}} 3\n{itl}_sum{{engine="0"}} 1.5\n'
        f'{itl}_sum{{engine="1"}} 0.5\n{itl}_count{{engine="0"}} 150\n{itl}_count{{engine="1"}} 50\n'
        f'{itl}_created{{engine="0"}} 1.7e9\n'
    )
    assert parse_metrics(text) == {"itl_sum_s": 2.0, "itl_count": 200.0}
    old = "vllm:time_per_output_token_seconds_sum 0.3\nvllm:time_per_output_token_seconds_count 30\n"
    assert parse_metrics(old) == {"itl_sum_s": 0.3, "itl_count": 30.0} and parse_metrics("up 1\n") == {}
    assert server_itl_ms({"itl_sum_s": 2.0, "itl_count": 200.0}, {"itl_sum_s": 3.0, "itl_count": 300.0}) == 10.0
    assert server_itl_ms({}, {"itl_sum_s": 1.0, "itl_count": 1.0}) is None
    assert server_itl_ms({"itl_sum_s": 1.0, "itl_count": 5.0}, {"itl_sum_s": 1.0, "itl_count": 5.0}) is None


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

    client = BenchClient(fake_tree(tmp_path / "old", bench_module=False), tmp_path / "c.log").start()
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


def test_the_two_gpu_ab_of_one_launch_pair_is_no_complete_run_now():
    """The two-GPU A/B (DP = EP = 2, pr-ep, not an A/A, where the builds pick different block sizes) was
    recorded before launch pairs, and was the x2 baseline: 8 rounds of each build from one pair of launches,
    which the evidence rules now refuse (the pr-ep profile runs 9 pairs of 2 rounds)."""
    root = HERE.parent.parent
    path = root / "reports" / "nvidia-h200-x2" / "tpot-pr-ep-ab.json"
    results = load_results(path)
    assert results.gpu_key() == ("NVIDIA H200", 2) and results.suite == "qwen3-30b-a3b-like-dp2-pr-ep"
    assert results.settings["complete"] is True and results.settings["aa"] is False
    (case,) = results.cases
    assert case.info["dp"] == 2 and case.info["expert_parallel"] is True
    assert case.info["profile"]["concurrency"] == sc.PROFILES["pr-ep"].concurrency
    # recorded before launch pairs: 8 rounds of each build in one pair, which the evidence rules now refuse
    assert {len(v) for v in case.samples.values()} == {8} and "captures" not in case.extra
    from ci.core import evidence

    assert "case qwen3-30b-a3b-like/dp2-ep2/pr-ep: 8 sample(s) of 'base', at least 18 are needed" in (
        evidence.run_problems(results)
    )
    (row,) = case.info["decode_block_size_m"]
    assert (row["base"], row["candidate"]) == (32, 16)


H100_MIB, H200_MIB = 81559, 143771  # NVML's memory.total of the H100 80GB HBM3 and the H200 the gate ran on


def test_the_servers_that_start_together_fit_the_gpu(tmp_path):
    """pr's six servers held 120,087 MiB of one H200 (20,015 MiB a server); on an 80 GB H100 vLLM 0.26.0 refused
    the later ones at start-up (free memory below what each asks for). The estimate meets both: about 19.5 GiB
    a server, three pairs at once on the H200, one on the H100; more asked for than fit is refused."""
    from ci.core.errors import UsageError

    server = sc.server_bytes(QWEN, sc.PROFILES["pr"], 1)
    assert 0.97 * 20015 * 2**20 < server < 1.03 * 20015 * 2**20
    assert 14 * sc.GIB < sc.weight_bytes(QWEN, 1) < 15.81 * sc.GIB  # vLLM 0.26.0 logged 15.81 GiB loaded
    assert sc.weight_bytes(QWEN, 2) < 0.55 * sc.weight_bytes(QWEN, 1)  # the routed experts split over 2 ranks
    h100, h200 = H100_MIB << 20, H200_MIB << 20
    assert sc.pairs_that_fit(h200, server) == 3 and sc.pairs_that_fit(h100, server) == 1
    six = int(6 * server / sc.START_SHARE)  # the GPU whose 90% holds six servers
    assert sc.pairs_that_fit(six + 2**20, server) == 3 and sc.pairs_that_fit(six - 2**20, server) == 2
    assert sc.fit_pairs_at_once(3, False, h200, server) == (3, "")
    assert sc.fit_pairs_at_once(1, True, h100, server) == (1, "")
    fit, why = sc.fit_pairs_at_once(3, False, h100, server)
    assert fit == 1 and why.startswith("3 launch pairs at once do not fit: a server needs about 19.5 GiB a GPU")
    assert "90% of the GPU's 79.6 GiB holds 1 pair(s); 1 at a time (recorded)" in why
    with pytest.raises(UsageError, match=r"--pairs-at-once 2: 4 servers do not fit at once .*; pass --pairs-at-once 1"):
        sc.fit_pairs_at_once(2, True, h100, server)
    with pytest.raises(UsageError, match=r"one launch pair does not fit one GPU at once: .*; pass --start serial"):
        sc.fit_pairs_at_once(1, False, 40 * sc.GIB, server)
    (tmp_path / "config.json").write_text(json.dumps({"num_experts": 8, "num_experts_per_tok": 2, "hidden_size": 64}))
    with pytest.raises(
        UsageError, match=r"config.json: no num_hidden_layers, num_attention_heads, moe_intermediate_size"
    ):
        sc.weight_bytes(tmp_path, 1)


def test_a_run_starts_together_only_the_pairs_that_fit_its_gpu(standin_trees, tmp_path, monkeypatch, capsys):
    """`nox -s tpot` on one H100: pr's three pairs at once become one, said and passed on (the results record the
    profile as run); on an H200 the profile's three; --pairs-at-once above the fit is refused before any server;
    a serial start is left alone."""
    from ci.core.errors import UsageError
    from ci.host import gpu

    board = {"mib": H100_MIB}
    monkeypatch.setattr(
        gpu,
        "query",
        lambda: ("580", [gpu.GpuInfo(index=0, name="H", uuid="u", memory_total_mib=board["mib"], memory_used_mib=0)]),
    )
    monkeypatch.setattr(tpot, "load_trees", lambda path: standin_trees)
    runs = []

    class Saved:
        def save(self, path):
            runs[-1]["saved"] = path

    monkeypatch.setattr(tpot, "run_tpot", lambda *a, **k: runs.append(k) or Saved())
    argv = ["--manifest", "m.json", "--out", str(tmp_path / "o")]
    assert tpot.main(argv) == 0
    assert runs[-1]["overrides"]["pairs_at_once"] == 1 and runs[-1]["start"] == "parallel"
    assert runs[-1]["plan"].group == 3  # the extra looks add a third of the pairs, one at a time
    assert "tpot: 3 launch pairs at once do not fit: a server needs about 19.5 GiB" in capsys.readouterr().out
    board["mib"] = H200_MIB
    assert tpot.main(argv) == 0 and runs[-1]["overrides"]["pairs_at_once"] == 3
    assert "do not fit" not in capsys.readouterr().out
    board["mib"] = H100_MIB
    with pytest.raises(UsageError, match="--pairs-at-once 3: 6 servers do not fit at once"):
        tpot.main([*argv, "--pairs-at-once", "3"])
    assert len(runs) == 2
    assert tpot.main([*argv, "--start", "serial"]) == 0 and runs[-1]["overrides"]["pairs_at_once"] == 1
