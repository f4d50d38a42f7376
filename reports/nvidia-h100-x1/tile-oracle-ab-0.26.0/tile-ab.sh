#!/bin/sh
# tile-ab.sh: vLLM 0.26.0 (holds #48144) against 0.26.0 + the tile oracle's rule, on the high_load cases where
# the picks differ; int4 first, then NVFP4/FP8; results and verdicts packed into $OUT/tile-ab.tgz after each
set -u
export PYTHONUNBUFFERED=1 CUDA_CACHE_PATH=/tmp/cuda-cache
mkdir -p /tmp/site0260 && tar -xJf .bundle-0260/vllm-0.26.0-sm90.tar.xz -C /tmp/site0260 || exit 3
export PYTHONPATH=/tmp/site0260:/tmp/site
A=/tmp/tileab; mkdir -p $A
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $A/gpu-start.csv
python3 -m ci.trees.build --vllm installed --change tile-oracle --out /tmp/tile-trees > $A/build.log 2>&1 || { tail -5 $A/build.log; exit 4; }
I4=deepseek-v3/ep4/tpr1024/gptq-int4-g128/bf16,deepseek-v3/ep8/tpr512/gptq-int4-g128/bf16,qwen3-30b-a3b/ep2/tpr1024/gptq-int4-g128/bf16,qwen3-30b-a3b/ep4/tpr512/gptq-int4-g128/bf16,qwen3-30b-a3b/ep8/tpr256/gptq-int4-g128/bf16,mixtral-8x7b/ep1/tpr512/gptq-int4-g128/bf16,mixtral-8x7b/ep2/tpr256/gptq-int4-g128/bf16,gpt-oss-120b/ep4/tpr1024/gptq-int4-g128/bf16,gpt-oss-120b/ep8/tpr512/gptq-int4-g128/bf16,mixtral-8x7b/ep1-g8/tpr512/gptq-int4-g128/bf16
FP=deepseek-v3/ep4/tpr1024/nvfp4/bf16,deepseek-v3/ep8/tpr512/nvfp4/bf16,mixtral-8x7b/ep2/tpr256/fp8/bf16,mixtral-8x7b/ep4/tpr128/fp8/bf16,mixtral-8x7b/ep8/tpr64/fp8/bf16
for part in int4:$I4 fp:$FP; do
  n=${part%%:*}; cases=${part#*:}; s=$(date +%s)
  python3 -m ci.kernel.bench --manifest /tmp/tile-trees/manifest.json --suite high_load --cases "$cases" --out $A/$n > $A/$n-bench.log 2>&1
  echo "$n bench exit $? in $(( $(date +%s) - s )) s" | tee -a $A/done
  python3 -m ci.core.compare --results $A/$n/kernel-results.json --out $A/$n-ab > $A/$n-compare.log 2>&1; echo "$n compare exit $?" | tee -a $A/done
  tail -3 $A/$n-bench.log
  tar -czf "$OUT/tile-ab.tgz" -C /tmp tileab
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $A/gpu-end.csv
tar -czf "$OUT/tile-ab.tgz" -C /tmp tileab; cat $A/int4-ab/report.md 2>/dev/null | head -30
