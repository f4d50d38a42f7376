#!/bin/sh
# to-wait.sh VER SECONDS: wait for to-job.sh VER, packing /tmp/to (no trees) into $OUT/to.tgz as it goes
V=$1; lim=$2; t=0
while ! grep -q alldone /tmp/to/v$V/done 2>/dev/null && [ $t -lt "$lim" ]; do
  sleep 10; t=$((t+10))
  [ $((t % 30)) -eq 0 ] && tar -czf "$OUT/to.tgz.part" --exclude=trees -C /tmp to 2>/dev/null && mv "$OUT/to.tgz.part" "$OUT/to.tgz"
done
cat /tmp/to/v$V/done 2>/dev/null; tail -5 /tmp/to/v$V/gate.log 2>/dev/null
tar -czf "$OUT/to.tgz.part" --exclude=trees -C /tmp to 2>/dev/null && mv "$OUT/to.tgz.part" "$OUT/to.tgz"; ls -la "$OUT"
