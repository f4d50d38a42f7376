#!/bin/sh
# rest2.sh: after the fix (ci.timing.agreement): the 39 int4 cases of rest.sh again, and an A/A of the case
# whose base does not repeat its bits; vLLM 0.26.0 installed in /tmp/site
set -u
export PYTHONUNBUFFERED=1 CUDA_CACHE_PATH=/tmp/cuda-cache PYTHONPATH=/tmp/site
A=/tmp/rest2; mkdir -p $A
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $A/gpu-start.csv
python3 -m ci.trees.build --vllm installed --change tile-oracle --out /tmp/rest-trees > $A/build.log 2>&1 || { echo "build failed" >> $A/done; echo alldone >> $A/done; exit 4; }
C=mixtral-8x7b/ep1/tpr1024/gptq-int4-g128/bf16
s=$(date +%s)
python3 -m ci.kernel.bench --manifest /tmp/rest-trees/manifest.json --suite high_load --cases "$(cat .devjob/i4)" --out $A/i4 > $A/i4-bench.log 2>&1
echo "i4 bench exit $? in $(( $(date +%s) - s )) s" >> $A/done
python3 -m ci.core.compare --results $A/i4/kernel-results.json --out $A/i4-ab > $A/i4-compare.log 2>&1; echo "i4 compare exit $?" >> $A/done
s=$(date +%s)
python3 -m ci.kernel.bench --manifest /tmp/rest-trees/manifest.json --suite high_load --cases $C --aa --out $A/aa > $A/aa-bench.log 2>&1
echo "aa bench exit $? in $(( $(date +%s) - s )) s" >> $A/done
python3 -m ci.core.compare --results $A/aa/kernel-results.json --out $A/aa-ab > $A/aa-compare.log 2>&1; echo "aa compare exit $?" >> $A/done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $A/gpu-end.csv
echo alldone >> $A/done
