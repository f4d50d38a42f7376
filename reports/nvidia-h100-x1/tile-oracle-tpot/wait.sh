#!/bin/sh
# wait.sh SECONDS: wait for job.sh, packing /tmp/res into $OUT/res.tgz as it goes
lim=$1; t=0
pack() { tar -czf "$OUT/res.tgz.part" --exclude=trees -C /tmp res job.log 2>/dev/null; mv "$OUT/res.tgz.part" "$OUT/res.tgz"; }
while ! grep -q alldone /tmp/res/done 2>/dev/null && [ $t -lt "$lim" ]; do
  sleep 10; t=$((t+10)); [ $((t % 60)) -eq 0 ] && pack
done
cat /tmp/res/done 2>/dev/null; tail -4 /tmp/res/tpot.log 2>/dev/null; tail -4 /tmp/res/gate.log 2>/dev/null
pack; ls -la "$OUT"
