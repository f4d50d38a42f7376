"""A stand-in for the GitHub REST endpoints the GPU gate's trust checks read, for local act runs.

``GET /repos/{owner}/{name}/pulls/{number}`` answers ``{"state": "open", "head": {"sha": SHA}}`` for
the pull request given on the command line, 404 for any other; ``GET /repos/{owner}/{name}/commits/{ref}``
answers the SHA of ``--ref NAME=SHA`` as the bare text (``Accept: application/vnd.github.sha``). act is
pointed at it with ``--env GITHUB_API_URL=http://127.0.0.1:PORT`` (tests/act_scenarios.py does this).

Usage: ``python github-api.py --port PORT --pr NUMBER --sha SHA [--ref NAME=SHA ...]``
"""

import argparse
import http.server
import json

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--pr", type=int, required=True)
parser.add_argument("--sha", required=True)
parser.add_argument("--ref", action="append", default=[], help="NAME=SHA: a branch and the commit it points at")
args = parser.parse_args()
refs = dict(r.split("=", 1) for r in args.ref)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        parts = self.path.split("/")
        if len(parts) == 6 and parts[1] == "repos" and parts[4] == "commits":
            sha = refs.get(parts[5])
            self.send_response(200 if sha else 404)
            self.end_headers()
            self.wfile.write((sha or "Not Found").encode())
            return
        known = self.path.endswith(f"/pulls/{args.pr}") and self.path.startswith("/repos/")
        body = {"state": "open", "number": args.pr, "head": {"sha": args.sha}} if known else {"message": "Not Found"}
        self.send_response(200 if known else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, fmt, *a):
        print("github-api stand-in:", fmt % a, flush=True)


http.server.HTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
