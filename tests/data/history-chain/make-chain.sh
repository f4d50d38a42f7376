#!/bin/sh
# usage: make-chain.sh SITE REPO
#   SITE: the folder holding an installed vLLM 0.25.1 (SITE/vllm); REPO: a new folder for the chain.
# Makes a git repository whose first commit is vLLM 0.25.1's Python files and whose next eight commits are
# this folder's 000N-*.patch (git format-patch files), with fixed dates so that the same files give the same
# commits. Commit 0004 makes the Marlin MoE tile rule worse; the other seven change nothing timed.
set -eu
site=$1
repo=$2
here=$(cd "$(dirname "$0")" && pwd)
if [ -e "$repo" ]; then echo "make-chain: $repo exists; give a new folder (nothing was changed)" >&2; exit 2; fi
if [ ! -f "$site/vllm/__init__.py" ]; then echo "make-chain: no vLLM under $site (SITE/vllm/__init__.py)" >&2; exit 2; fi
mkdir -p "$repo"
(cd "$site" && find vllm -name '*.py' -print0 | tar --null -cf - -T -) | tar -xf - -C "$repo"
export GIT_AUTHOR_NAME=gate GIT_AUTHOR_EMAIL=gate@localhost GIT_COMMITTER_NAME=gate GIT_COMMITTER_EMAIL=gate@localhost
export GIT_AUTHOR_DATE=2026-11-01T00:00:00Z GIT_COMMITTER_DATE=2026-11-01T00:00:00Z
git -C "$repo" init -q -b main
git -C "$repo" add -A
git -C "$repo" commit -q -m "vLLM 0.25.1 (its Python files)"
unset GIT_AUTHOR_DATE GIT_COMMITTER_DATE
git -C "$repo" am -q -k --committer-date-is-author-date "$here"/000*.patch
git -C "$repo" log --format='%h %s' --reverse
