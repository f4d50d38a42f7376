"""A stand-in for vLLM's ``serve`` and ``bench serve``: just enough for the TPOT stage's tests.

Installed into fake vLLM trees by the TPOT tests, twice: as ``vllm/entrypoints/cli/main.py``
(the ``vllm serve`` / ``vllm bench serve`` commands) and as ``vllm/benchmarks/serve.py``
(``add_cli_args`` and ``main``, which ``ci/serving/bench_client.py`` imports). Behaviour is set by
environment variables: STANDIN_MODE (ok | die | never-healthy | port-race-once: dies as torch.distributed
does when another process took its port, once per STANDIN_PORT_RACE_FILE), STANDIN_TPOT (ms, the
server's), STANDIN_TPOT_SEQUENCE (comma-separated: the server's first answers, a slow start; with
STANDIN_TPOT_CYCLE=1 its answers for ever, in turn), STANDIN_DELAY (s before healthy),
STANDIN_HEALTHY_AFTER_FILE (not healthy before that file exists), STANDIN_BENCH (ok | fail). The bench asks the
server for its TPOT, so a result says which server it measured; like vLLM, a server started with
``--served-model-name`` lists it at ``/v1/models`` and refuses (404) requests for another model.
`serve` also starts a child process, so the tests can check the whole group is stopped, and
serves ``/metrics`` with an inter-token latency histogram's sum and count (100 tokens a request).
"""

import argparse
import http.server
import json
import os
import subprocess
import sys
import time
import urllib.request

VALUE_FLAGS = (
    "--backend",
    "--model",
    "--tokenizer",
    "--base-url",
    "--dataset-name",
    "--random-input-len",
    "--random-output-len",
    "--max-concurrency",
    "--num-prompts",
    "--seed",
    "--result-dir",
    "--result-filename",
    "--temperature",
    "--served-model-name",
)
SWITCHES = ("--ignore-eos", "--save-result", "--disable-tqdm")


def serve(argv):
    port = int(argv[argv.index("--port") + 1])
    served = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else argv[0]
    mode = os.environ.get("STANDIN_MODE", "ok")
    tpot = os.environ.get("STANDIN_TPOT", "10")
    if os.environ.get("GATE_INJECT_SLEEP_US"):  # the injected sleep in 48 MoE layers a step (ci/serving/inject)
        tpot = str(float(tpot) + 48 * float(os.environ["GATE_INJECT_SLEEP_US"]) / 1000)
    print(f"standin serve on {port}, mode {mode}, args {argv}", flush=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["STANDIN_CHILD_PID_FILE"], "w") as fh:
        fh.write(str(child.pid))
    race = os.environ.get("STANDIN_PORT_RACE_FILE", "")
    if mode == "port-race-once" and not os.path.exists(race):
        open(race, "w").close()
        print(
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            "address. port: 39745, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
        )
        sys.exit(1)
    if mode == "die":
        print("RuntimeError: No available memory for the cache blocks", flush=True)
        sys.exit(3)
    time.sleep(float(os.environ.get("STANDIN_DELAY", "0.2")))
    decoded = {"sum": 0.0, "count": 0}  # like vLLM's inter-token latency histogram: 100 tokens a request
    sequence = [x for x in os.environ.get("STANDIN_TPOT_SEQUENCE", "").split(",") if x]  # the first answers

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/standin-tpot"):
                asked = self.path.partition("?model=")[2] or served
                self.send_response(200 if asked == served else 404)
                self.end_headers()
                now = sequence.pop(0) if sequence else tpot
                if os.environ.get("STANDIN_TPOT_CYCLE") == "1":
                    sequence.append(now)
                self.wfile.write(now.encode())
                decoded["sum"] += 100 * float(now) / 1000
                decoded["count"] += 100
                return
            if self.path == "/metrics":
                self.send_response(200)
                self.end_headers()
                itl, labels = "vllm:inter_token_latency_seconds", f'{{engine="0",model_name="{served}"}}'
                text = f"# TYPE {itl} histogram\n{itl}_sum{labels} {decoded['sum']}\n"
                self.wfile.write((text + f"{itl}_count{labels} {decoded['count']}\n").encode())
                return
            if self.path == "/v1/models":
                self.send_response(200)
                self.end_headers()
                self.wfile.write(json.dumps({"object": "list", "data": [{"id": served}]}).encode())
                return
            gate = os.environ.get("STANDIN_HEALTHY_AFTER_FILE")  # not healthy until that file exists
            healthy = self.path == "/health" and mode != "never-healthy" and (not gate or os.path.exists(gate))
            self.send_response(200 if healthy else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()


def add_cli_args(parser):
    for flag in VALUE_FLAGS:
        parser.add_argument(flag)
    for flag in SWITCHES:
        parser.add_argument(flag, action="store_true")


def main(args):
    if os.environ.get("STANDIN_BENCH") == "fail":
        raise RuntimeError("standin bench: all requests failed")
    model = f"?model={args.served_model_name}" if args.served_model_name else ""
    with urllib.request.urlopen(f"{args.base_url}/standin-tpot{model}", timeout=10) as resp:
        tpot = float(resp.read())
    n = int(args.num_prompts)
    result = {
        "completed": n,
        "failed": 0,
        "median_tpot_ms": tpot,
        "mean_tpot_ms": tpot * 1.01,
        "median_ttft_ms": 50.0,
        "output_throughput": 1000.0 / tpot,
    }
    print(f"standin bench: {n} prompts against {args.base_url}, median TPOT {tpot} ms", flush=True)
    with open(os.path.join(args.result_dir, args.result_filename), "w") as fh:
        json.dump(result, fh)
    return result


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["serve"]:
        serve(args[1:])
    elif args[:2] == ["bench", "serve"]:
        parser = argparse.ArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        main(parser.parse_args(args[2:]))
    else:
        sys.exit(f"standin: unsupported {args}")
