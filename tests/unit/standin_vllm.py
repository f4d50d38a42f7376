"""A stand-in for ``python -m vllm.entrypoints.cli.main``: just enough of `serve` and `bench serve`.

Installed into fake vLLM trees by the TPOT tests. Behaviour is set by environment variables:
STANDIN_MODE (ok | die | never-healthy), STANDIN_TPOT (ms), STANDIN_DELAY (s before healthy).
`serve` also starts a child process, so the tests can check the whole group is stopped.
"""

import http.server
import json
import os
import subprocess
import sys
import time


def serve(argv):
    port = int(argv[argv.index("--port") + 1])
    mode = os.environ.get("STANDIN_MODE", "ok")
    print(f"standin serve on {port}, mode {mode}, args {argv}", flush=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["STANDIN_CHILD_PID_FILE"], "w") as fh:
        fh.write(str(child.pid))
    if mode == "die":
        print("RuntimeError: No available memory for the cache blocks", flush=True)
        sys.exit(3)
    time.sleep(float(os.environ.get("STANDIN_DELAY", "0.2")))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            healthy = self.path == "/health" and mode != "never-healthy"
            self.send_response(200 if healthy else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()


def bench(argv):
    out_dir = argv[argv.index("--result-dir") + 1]
    name = argv[argv.index("--result-filename") + 1]
    tpot = float(os.environ.get("STANDIN_TPOT", "10"))
    n = int(argv[argv.index("--num-prompts") + 1])
    result = {"completed": n, "failed": 0, "median_tpot_ms": tpot, "mean_tpot_ms": tpot * 1.01,
              "median_ttft_ms": 50.0, "output_throughput": 1000.0 / tpot}  # fmt: skip
    with open(os.path.join(out_dir, name), "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["serve"]:
        serve(args[1:])
    elif args[:2] == ["bench", "serve"]:
        bench(args[2:])
    else:
        sys.exit(f"standin: unsupported {args}")
