#!/bin/sh
# to-job.sh VER: on vLLM VER (installed), gpu_gate --change tile-oracle --suite quick, then the default-suite cases
# where the rule's pick differs from #48144's (0.26.0 only), bench + A/B
set -u
V=$1; A=/tmp/to/v$V; mkdir -p $A
export PYTHONUNBUFFERED=1 CUDA_CACHE_PATH=/tmp/cuda-cache PYTHONPATH=/tmp/site$V:/tmp/site
q="name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw"
nvidia-smi --query-gpu=$q --format=csv > $A/gpu-start.csv 2>&1
s=$(date +%s)
python3 -m nox --no-venv -s gpu_gate -- --vllm installed --change tile-oracle --suite quick --out $A/gate > $A/gate.log 2>&1
echo "gate exit $? in $(( $(date +%s) - s )) s" >> $A/done
if [ "$V" = 0260 ]; then
  D=mixtral-8x7b/ep4/tpr128/gptq-int4-g128/bf16,mixtral-8x7b/ep8/tpr64/gptq-int4-g128/bf16,deepseek-v3/ep8/tpr1/batched-cap1024/gptq-int4-g128/bf16,deepseek-v3/ep8/tpr8/batched-cap1024/gptq-int4-g128/bf16,deepseek-v3/ep8/tpr32/batched-cap1024/gptq-int4-g128/bf16,qwen3-30b-a3b/ep8/tpr1/batched-cap1024/gptq-int4-g128/bf16,qwen3-30b-a3b/ep8/tpr8/batched-cap1024/gptq-int4-g128/bf16,qwen3-30b-a3b/ep8/tpr32/batched-cap1024/gptq-int4-g128/bf16,deepseek-v3/ep2/tpr1/batched-cap8/gptq-int4-g128/bf16,deepseek-v3/ep8/tpr1/batched-cap16/gptq-int4-g128/bf16,deepseek-v3/ep8/tpr1/batched-cap32/gptq-int4-g128/bf16,deepseek-v3/ep8/tpr1/batched-cap64/gptq-int4-g128/bf16
  s=$(date +%s)
  python3 -m ci.trees.build --vllm installed --change tile-oracle --out /tmp/to-trees > $A/build.log 2>&1
  python3 -m ci.kernel.bench --manifest /tmp/to-trees/manifest.json --suite default --cases "$D" --out $A/differ > $A/differ-bench.log 2>&1
  echo "differ bench exit $? in $(( $(date +%s) - s )) s" >> $A/done
  python3 -m ci.core.compare --results $A/differ/kernel-results.json --out $A/differ-ab > $A/differ-compare.log 2>&1
  echo "differ compare exit $?" >> $A/done
fi
nvidia-smi --query-gpu=$q --format=csv > $A/gpu-end.csv 2>&1
echo "alldone $V" >> $A/done
