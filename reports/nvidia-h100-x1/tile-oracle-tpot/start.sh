#!/bin/sh
# start.sh: install the engine wheels, check the server's imports, copy the tree to /tmp/job, start job.sh there
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev3/whl/*.whl || exit 3
export PYTHONPATH=/tmp/site
bad=0
for m in vllm.entrypoints.cli.launch; do
  python3 -c "import $m" > /tmp/imp.log 2>&1 || { bad=1; echo "IMPORT $m FAILED"; tail -3 /tmp/imp.log; }
done
[ $bad = 0 ] || exit 5
echo imports ok
rm -rf /tmp/job && mkdir /tmp/job && tar --exclude='./.dev1' --exclude='./.dev2' --exclude='./.dev3' --exclude='./.dev4' -cf - . | tar -xf - -C /tmp/job || exit 4
cd /tmp/job && setsid nohup sh .devjob/job.sh > /tmp/job.log 2>&1 < /dev/null &
echo started
