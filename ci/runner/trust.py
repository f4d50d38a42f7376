"""The trust checks of the GPU workflows: pull-request code reaches a GPU runner only as the exact
commit a maintainer reviewed, and only from a workflow run of the allowed ref.

* ``verify-pr``: the pull request's head is still the SHA the maintainer named when dispatching
  (a push after the review, or a typo, stops the run before any of its code is checked out), and
  the pull request is open. Reads ``GITHUB_API_URL`` and ``GITHUB_TOKEN`` as Actions sets them.
* ``verify-ref``: a branch of a repository (a vLLM fork's, for the reusable workflow) still points at
  the commit a maintainer reviewed, so nobody who can push to it between the review and the checkout
  runs code on the GPU runner; the job then checks out that commit, not the branch.
* ``check-ref``: the workflow runs from the allowed ref (the default branch): a tripwire on the
  GPU runner behind the runner group's own restriction to that workflow and ref.

Both write ``sha=...`` to ``$GITHUB_OUTPUT`` when it is set; a failed check exits 13 (UNTRUSTED).

CLI: ``python -m ci.runner.trust verify-pr --repository OWNER/NAME --pr N --sha SHA``;
``python -m ci.runner.trust verify-ref --repository OWNER/NAME --ref REF --sha SHA``;
``python -m ci.runner.trust check-ref --ref REF --allowed REF [--sha SHA]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from ci.core.cli import run_main
from ci.core.errors import UntrustedError, UsageError

SHA = re.compile(r"[0-9a-f]{40}")  # fullmatch: "$" would let a trailing newline through
REPOSITORY = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
REF = re.compile(r"(?!-)[A-Za-z0-9_./-]{1,255}")  # a branch or tag: no spaces, quotes or line breaks
PR_NUMBER = re.compile(r"[1-9][0-9]{0,9}")  # as the concurrency group keys on it: no 012, no other digits


def _get(api_url: str, path: str, token: str | None, what: str, accept: str = "application/vnd.github+json") -> bytes:
    request = urllib.request.Request(f"{api_url.rstrip('/')}{path}")
    request.add_header("Accept", accept)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        raise UntrustedError(f"{what}: the API answered {exc.code}; is it spelled right?") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise UntrustedError(f"{what}: cannot read it from {api_url} ({exc})") from exc


def pull_request(api_url: str, repository: str, number: int, token: str | None) -> dict:
    """The pull request as the REST API returns it (``GET /repos/{repository}/pulls/{number}``)."""
    what = f"pull request {repository}#{number}"
    try:
        return json.loads(_get(api_url, f"/repos/{repository}/pulls/{number}", token, what))
    except ValueError as exc:
        raise UntrustedError(f"{what}: the API's answer is not JSON ({exc})") from exc


def ref_head(api_url: str, repository: str, ref: str, token: str | None) -> str:
    """The commit ``ref`` points at now (``GET /repos/{repository}/commits/{ref}``, answered as a bare SHA)."""
    what = f"{repository} {ref}"
    path = f"/repos/{repository}/commits/{urllib.parse.quote(ref, safe='')}"
    return _get(api_url, path, token, what, accept="application/vnd.github.sha").decode(errors="replace").strip()


def verify_ref(head: str, *, repository: str, ref: str, sha: str) -> str:
    """The reviewed SHA, if ``ref`` still points at it; else an :class:`UntrustedError`."""
    if head != sha:
        raise UntrustedError(
            f"{repository} {ref} points at {head}, not the reviewed {sha}: someone pushed after the review (or the "
            "SHA is mistyped); review the new head and dispatch again with its SHA. No code of it was checked out"
        )
    return sha


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
    """``key=value`` lines for ``$GITHUB_OUTPUT``; a value is one line (a newline would add outputs)."""
    bad = {k: v for k, v in values.items() if "\n" in v or "\r" in v}
    if bad:
        raise UsageError(f"refusing to write outputs with a line break: {bad!r}")
    path = os.environ.get("GITHUB_OUTPUT")
    if path:
        with open(path, "a") as fh:
            fh.writelines(f"{k}={v}\n" for k, v in values.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m ci.runner.trust", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    verify = sub.add_parser("verify-pr", help="the PR's head is still the reviewed SHA")
    verify.add_argument("--repository", required=True)
    verify.add_argument("--pr", required=True)
    verify.add_argument("--sha", required=True)
    branch = sub.add_parser("verify-ref", help="a branch still points at the reviewed SHA")
    branch.add_argument("--repository", required=True)
    branch.add_argument("--ref", required=True, help="the branch (or tag) that was reviewed")
    branch.add_argument("--sha", required=True, help="the reviewed commit")
    ref = sub.add_parser("check-ref", help="the workflow runs from the allowed ref")
    ref.add_argument("--ref", required=True)
    ref.add_argument("--allowed", required=True)
    ref.add_argument("--sha", help="the commit to test, written to $GITHUB_OUTPUT")
    args = parser.parse_args(argv)
    if args.command == "check-ref":
        if args.sha is not None and not SHA.fullmatch(args.sha):
            raise UsageError(f"--sha {args.sha!r}: expected a full 40-character commit SHA")
        check_ref(args.ref, args.allowed)
        print(f"trust: running from {args.ref}, the allowed ref")
        if args.sha:
            _output(sha=args.sha)
        return 0
    if not REPOSITORY.fullmatch(args.repository):
        raise UsageError(f"--repository {args.repository!r}: expected OWNER/NAME")
    if not SHA.fullmatch(args.sha):
        raise UsageError(f"--sha {args.sha!r}: expected the full 40-character commit SHA of the reviewed head")
    api = os.environ.get("GITHUB_API_URL", "https://api.github.com")
    if args.command == "verify-ref":
        if not REF.fullmatch(args.ref):
            raise UsageError(f"--ref {args.ref!r}: expected a branch or tag name")
        head = ref_head(api, args.repository, args.ref, os.environ.get("GITHUB_TOKEN"))
        sha = verify_ref(head, repository=args.repository, ref=args.ref, sha=args.sha)
        print(f"trust: {args.repository} {args.ref} is {sha}, the reviewed commit")
        _output(sha=sha)
        return 0
    if not PR_NUMBER.fullmatch(args.pr):
        raise UsageError(f"--pr {args.pr!r}: expected a pull request number as written in its URL (12, not 012)")
    pr = pull_request(api, args.repository, int(args.pr), os.environ.get("GITHUB_TOKEN"))
    sha = verify_pr(pr, repository=args.repository, number=int(args.pr), sha=args.sha)
    print(f"trust: {args.repository}#{args.pr} head is {sha}, the reviewed commit")
    _output(sha=sha)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
