#!/bin/sh
# usage: gpu-history.sh REPO OUT   (from the project's root, vLLM 0.25.1 importable: --vllm installed)
# The nightly runs of the chain made by make-chain.sh: for each of its nine commits, the gate's kernel bench
# (quick suite; base = the commit's vllm/ over the installed release's kernels, candidate = the commit + the
# default change) into OUT/nights/cN; then the bisect of the chain's two ends into OUT/bisect. Every stage's
# output goes to OUT/logs; OUT/done holds the exit codes.
set -u
repo=$1
out=$2
mkdir -p "$out/nights" "$out/logs"
i=0
for sha in $(git -C "$repo" rev-list --reverse main); do
    git -C "$repo" checkout -q "$sha"
    started=$(date +%s)
    python3 -m ci.trees.build --vllm installed --vllm-src "$repo" --out "/tmp/history-trees/c$i" \
        > "$out/logs/c$i-build.log" 2>&1
    python3 -m ci.kernel.bench --manifest "/tmp/history-trees/c$i/manifest.json" --suite quick \
        --out "$out/nights/c$i" > "$out/logs/c$i-bench.log" 2>&1
    echo "c$i $sha bench exit $? in $(( $(date +%s) - started )) s" | tee -a "$out/done"
    i=$((i + 1))
done
git -C "$repo" checkout -q main
started=$(date +%s)
python3 -m ci.runner.bisect --vllm installed --vllm-src "$repo" --good "$(git -C "$repo" rev-list --max-parents=0 main)" \
    --bad main --suite quick --out "$out/bisect" > "$out/logs/bisect.log" 2>&1
echo "bisect exit $? in $(( $(date +%s) - started )) s" | tee -a "$out/done"
