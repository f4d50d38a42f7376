"""``vllm bench serve`` kept in one process for all the rounds of a TPOT A/B.

Each ``vllm bench serve`` command spends about half a minute importing vLLM before it sends
a request; over a dozen rounds that is longer than the measurement. This script imports
``vllm.benchmarks.serve`` once (vLLM's own client: the code the CLI's ``cmd`` calls) and runs
its ``main`` once per round, with the argument list ``vllm bench serve`` would get.

Protocol (driven by :class:`ci.serving.client.BenchClient`): one JSON line on stdout when ready,
``{"ready": true, "import_s": ...}`` (or ``{"ready": false, "error": ...}``); then for each
line ``{"argv": [...], "tag": "..."}`` on stdin, one line ``{"ok": true, "seconds": ...}`` or
``{"ok": false, "error": "..."}`` on stdout. Everything vLLM prints goes to ``--log``.

Standalone on purpose (standard library and vLLM only): it runs with the tree's vLLM first
on ``PYTHONPATH``, as ``python ci/serving/bench_client.py --log FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", required=True, help="where vLLM's output goes")
    args = parser.parse_args()
    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    log_fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)

    def answer(**fields) -> None:
        reply.write(json.dumps(fields) + "\n")

    t0 = time.monotonic()
    try:
        from vllm.benchmarks.serve import add_cli_args
        from vllm.benchmarks.serve import main as bench_main
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except Exception as exc:  # reported to the driver, which names the fix
        traceback.print_exc()
        answer(ready=False, error=f"cannot import vllm.benchmarks.serve: {exc!r}")
        return 1
    answer(ready=True, import_s=round(time.monotonic() - t0, 1))

    for line in sys.stdin:
        request = json.loads(line)
        print(f"\n===== vllm bench serve ({request.get('tag', '?')}): {' '.join(request['argv'])}", flush=True)
        bench_parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(bench_parser)
        t0 = time.monotonic()
        try:
            bench_main(bench_parser.parse_args(request["argv"]))
        except SystemExit as exc:  # argparse rejects an argument
            answer(ok=False, error=f"vllm bench serve exited with {exc.code} (bad arguments?)")
            continue
        except Exception as exc:  # one failed round is reported; the client stays up
            traceback.print_exc()
            answer(ok=False, error=repr(exc))
            continue
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        answer(ok=True, seconds=round(time.monotonic() - t0, 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
