"""A stand-in for the one GitHub REST endpoint the GPU gate's authorize job reads, for local act runs.

``GET /repos/{owner}/{name}/pulls/{number}`` answers ``{"state": "open", "head": {"sha": SHA}}`` for
the pull request given on the command line, 404 for any other. act is pointed at it with
``--env GITHUB_API_URL=http://127.0.0.1:PORT`` (nox -s act_dispatch does this).

Usage: ``python github-api.py --port PORT --pr NUMBER --sha SHA``
"""

import argparse
import http.server
import json

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--pr", type=int, required=True)
parser.add_argument("--sha", required=True)
args = parser.parse_args()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        known = self.path.endswith(f"/pulls/{args.pr}") and self.path.startswith("/repos/")
        body = {"state": "open", "number": args.pr, "head": {"sha": args.sha}} if known else {"message": "Not Found"}
        self.send_response(200 if known else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, fmt, *a):
        print("github-api stand-in:", fmt % a, flush=True)


http.server.HTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
