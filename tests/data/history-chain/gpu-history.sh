#!/bin/sh
# usage: gpu-history.sh REPO OUT [NIGHTS [GOOD BAD]]   (from the project's root, vLLM 0.25.1 importable: --vllm installed)
# The nightly runs of the chain made by make-chain.sh, then a bisect. NIGHTS: the chain's commits timed as nights,
# by position (0 = vLLM 0.25.1 itself, 8 = the last), in order; default all nine ("0 1 2 3 4 5 6 7 8"). A night
# that lands several commits is a night whose list skips some: "0 2 3 5 7 8" is six nights, commit 4 landing in
# the fourth with commit 5. For each, the gate's kernel bench (quick suite; base = the commit's vllm/ over the
# installed release's kernels, candidate = the commit + the default change) into OUT/nights/cN. Then the bisect
# of GOOD..BAD (positions; default the chain's two ends) into OUT/bisect. NIGHTS "" times no night, GOOD "none"
# runs no bisect (so the two can run in either order). Every stage's output goes to OUT/logs; OUT/done holds the
# exit codes and times.
set -u
repo=$1
out=$2
nights=${3-0 1 2 3 4 5 6 7 8}
good=${4:-0}
bad=${5:-8}
mkdir -p "$out/nights" "$out/logs"
shas=$(git -C "$repo" rev-list --reverse main)
sha_at() { echo "$shas" | sed -n "$(( $1 + 1 ))p"; }
for i in $nights; do
    sha=$(sha_at "$i")
    git -C "$repo" checkout -q "$sha"
    started=$(date +%s)
    python3 -m ci.trees.build --vllm installed --vllm-src "$repo" --out "/tmp/history-trees/c$i" \
        > "$out/logs/c$i-build.log" 2>&1
    python3 -m ci.kernel.bench --manifest "/tmp/history-trees/c$i/manifest.json" --suite quick \
        --out "$out/nights/c$i" > "$out/logs/c$i-bench.log" 2>&1
    echo "c$i $sha bench exit $? in $(( $(date +%s) - started )) s" | tee -a "$out/done"
done
git -C "$repo" checkout -q main
[ "$good" = none ] && exit 0
started=$(date +%s)
python3 -m ci.runner.bisect --vllm installed --vllm-src "$repo" --good "$(sha_at "$good")" --bad "$(sha_at "$bad")" \
    --suite quick --out "$out/bisect" > "$out/logs/bisect.log" 2>&1
echo "bisect c$good..c$bad exit $? in $(( $(date +%s) - started )) s" | tee -a "$out/done"
