#!/bin/sh
# wait-rest.sh SECONDS: wait for rest.sh, packing /tmp/rest into $OUT/rest.tgz as it goes
lim=$1; t=0
pack() { tar -czf "$OUT/rest.tgz.part" -C /tmp rest 2>/dev/null; mv "$OUT/rest.tgz.part" "$OUT/rest.tgz"; }
while ! grep -q alldone /tmp/rest/done 2>/dev/null && [ $t -lt "$lim" ]; do
  sleep 10; t=$((t+10)); [ $((t % 60)) -eq 0 ] && pack
done
cat /tmp/rest/done 2>/dev/null; tail -3 /tmp/rest/fp-bench.log /tmp/rest/i4-bench.log 2>/dev/null
pack; ls -la "$OUT"
