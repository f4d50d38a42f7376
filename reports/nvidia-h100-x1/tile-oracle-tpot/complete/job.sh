#!/bin/sh
# job.sh: on vLLM 0.26.0 (installed in /tmp/site): TPOT pr A/B of tile-oracle vs 0.26.0 (#48144)
set -u
A=/tmp/res; mkdir -p $A
export PYTHONUNBUFFERED=1 CUDA_CACHE_PATH=/tmp/cuda-cache PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
q="timestamp,name,pci.bus_id,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,memory.used,utilization.gpu"
nvidia-smi --query-gpu=$q --format=csv -l 5 > $A/gpu.csv 2>&1 &
SMI=$!
s=$(date +%s)
python3 -m nox --no-venv -s tpot -- --vllm installed --change tile-oracle --out $A/tpot > $A/tpot.log 2>&1
echo "tpot exit $? in $(( $(date +%s) - s )) s" >> $A/done
if [ -f $A/tpot/tpot-results.json ]; then
  python3 -m ci.core.compare --results $A/tpot/tpot-results.json --out $A/tpot-ab > $A/tpot-compare.log 2>&1
  echo "tpot compare exit $?" >> $A/done
fi
kill $SMI
echo alldone >> $A/done
