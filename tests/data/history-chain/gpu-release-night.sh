#!/bin/sh
# usage: gpu-release-night.sh NAME OUT   (from the project's root, the release importable: --vllm installed)
# One nightly run of a release as published: the gate's kernel bench (quick suite; base = the release, candidate
# = the release with the default change, or without it where the release holds it) into OUT/nights/NAME.
set -u
name=$1
out=$2
mkdir -p "$out/nights" "$out/logs"
started=$(date +%s)
python3 -m ci.trees.build --vllm installed --out "/tmp/history-trees/$name" > "$out/logs/$name-build.log" 2>&1
python3 -m ci.kernel.bench --manifest "/tmp/history-trees/$name/manifest.json" --suite quick \
    --out "$out/nights/$name" > "$out/logs/$name-bench.log" 2>&1
echo "$name bench exit $? in $(( $(date +%s) - started )) s" | tee -a "$out/done"
