#!/bin/sh
# wait-rest2.sh SECONDS: wait for rest.sh, packing /tmp/rest into $OUT/rest2.tgz as it goes
lim=$1; t=0
pack() { tar -czf "$OUT/rest2.tgz.part" -C /tmp rest2 2>/dev/null; mv "$OUT/rest2.tgz.part" "$OUT/rest2.tgz"; }
while ! grep -q alldone /tmp/rest2/done 2>/dev/null && [ $t -lt "$lim" ]; do
  sleep 10; t=$((t+10)); [ $((t % 60)) -eq 0 ] && pack
done
cat /tmp/rest2/done 2>/dev/null; tail -3 /tmp/rest2/fp-bench.log /tmp/rest2/i4-bench.log 2>/dev/null
pack; ls -la "$OUT"
