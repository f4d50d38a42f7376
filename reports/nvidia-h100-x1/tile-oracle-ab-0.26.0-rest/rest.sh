#!/bin/sh
# rest.sh: vLLM 0.26.0 (holds #48144, installed in /tmp/site) against 0.26.0 + the tile oracle's rule, on the
# 52 high_load cases where both pick the same tile (the other 15: ../tile-oracle-ab-0.26.0/); FP formats first,
# then int4; started with setsid, results packed by wait-rest.sh
set -u
export PYTHONUNBUFFERED=1 CUDA_CACHE_PATH=/tmp/cuda-cache PYTHONPATH=/tmp/site
A=/tmp/rest; mkdir -p $A
[ -d /tmp/site/vllm ] || { echo "no vllm in /tmp/site" > $A/done; echo alldone >> $A/done; exit 9; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $A/gpu-start.csv
python3 -m ci.trees.build --vllm installed --change tile-oracle --out /tmp/rest-trees > $A/build.log 2>&1 || { echo "build failed" >> $A/done; echo alldone >> $A/done; exit 4; }
for n in fp i4; do
  s=$(date +%s)
  python3 -m ci.kernel.bench --manifest /tmp/rest-trees/manifest.json --suite high_load --cases "$(cat .devjob/$n)" --out $A/$n > $A/$n-bench.log 2>&1
  echo "$n bench exit $? in $(( $(date +%s) - s )) s" >> $A/done
  python3 -m ci.core.compare --results $A/$n/kernel-results.json --out $A/$n-ab > $A/$n-compare.log 2>&1; echo "$n compare exit $?" >> $A/done
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $A/gpu-end.csv
echo alldone >> $A/done
