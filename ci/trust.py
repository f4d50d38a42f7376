"""The trust checks of the GPU workflows: pull-request code reaches a GPU runner only as the exact
commit a maintainer reviewed, and only from a workflow run of the allowed ref.

* ``verify-pr``: the pull request's head is still the SHA the maintainer named when dispatching
  (a push after the review, or a typo, stops the run before any of its code is checked out), and
  the pull request is open. Reads ``GITHUB_API_URL`` and ``GITHUB_TOKEN`` as Actions sets them.
* ``check-ref``: the workflow runs from the allowed ref (the default branch): a tripwire on the
  GPU runner behind the runner group's own restriction to that workflow and ref.

Both write ``sha=...`` to ``$GITHUB_OUTPUT`` when it is set; a failed check exits 13 (UNTRUSTED).

CLI: ``python -m ci.trust verify-pr --repository OWNER/NAME --pr N --sha SHA``;
``python -m ci.trust check-ref --ref REF --allowed REF [--sha SHA]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

from ci.cli import run_main
from ci.errors import UntrustedError, UsageError

SHA = re.compile(r"^[0-9a-f]{40}$")
REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


def pull_request(api_url: str, repository: str, number: int, token: str | None) -> dict:
    """The pull request as the REST API returns it (``GET /repos/{repository}/pulls/{number}``)."""
    request = urllib.request.Request(f"{api_url.rstrip('/')}/repos/{repository}/pulls/{number}")
    request.add_header("Accept", "application/vnd.github+json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise UntrustedError(
            f"pull request {repository}#{number}: the API answered {exc.code}; is the number right?"
        ) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise UntrustedError(f"pull request {repository}#{number}: cannot read it from {api_url} ({exc})") from exc


def verify_pr(pr: dict, *, repository: str, number: int, sha: str) -> str:
    """The reviewed SHA, if it is still the open pull request's head; else an :class:`UntrustedError`."""
    head = (pr.get("head") or {}).get("sha")
    if pr.get("state") != "open":
        raise UntrustedError(f"pull request {repository}#{number} is {pr.get('state')!r}, not open: nothing to test")
    if head != sha:
        raise UntrustedError(
            f"pull request {repository}#{number}: its head is {head}, not the reviewed {sha}; someone pushed after "
            "the review (or the SHA is mistyped): review the new head and dispatch again with its SHA. "
            "No code of the pull request was checked out"
        )
    return sha


def check_ref(ref: str, allowed: str) -> None:
    if ref != allowed:
        raise UntrustedError(
            f"this workflow runs from {ref!r}, but GPU runners take it only from {allowed!r}: dispatch it from "
            "the default branch (the runner group should allow only that workflow and ref; README, trust model)"
        )


def _output(**values: str) -> None:
    path = os.environ.get("GITHUB_OUTPUT")
    if path:
        with open(path, "a") as fh:
            fh.writelines(f"{k}={v}\n" for k, v in values.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.trust", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    verify = sub.add_parser("verify-pr", help="the PR's head is still the reviewed SHA")
    verify.add_argument("--repository", required=True)
    verify.add_argument("--pr", required=True)
    verify.add_argument("--sha", required=True)
    ref = sub.add_parser("check-ref", help="the workflow runs from the allowed ref")
    ref.add_argument("--ref", required=True)
    ref.add_argument("--allowed", required=True)
    ref.add_argument("--sha", help="the commit to test, written to $GITHUB_OUTPUT")
    args = parser.parse_args(argv)
    if args.command == "check-ref":
        check_ref(args.ref, args.allowed)
        print(f"trust: running from {args.ref}, the allowed ref")
        if args.sha:
            _output(sha=args.sha)
        return 0
    if not REPOSITORY.match(args.repository):
        raise UsageError(f"--repository {args.repository!r}: expected OWNER/NAME")
    if not args.pr.isdigit() or int(args.pr) < 1:
        raise UsageError(f"--pr {args.pr!r}: expected a pull request number")
    if not SHA.match(args.sha):
        raise UsageError(f"--sha {args.sha!r}: expected the full 40-character commit SHA of the reviewed head")
    api = os.environ.get("GITHUB_API_URL", "https://api.github.com")
    pr = pull_request(api, args.repository, int(args.pr), os.environ.get("GITHUB_TOKEN"))
    sha = verify_pr(pr, repository=args.repository, number=int(args.pr), sha=args.sha)
    print(f"trust: {args.repository}#{args.pr} head is {sha}, the reviewed commit")
    _output(sha=sha)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
