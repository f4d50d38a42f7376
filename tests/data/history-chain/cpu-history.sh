#!/bin/sh
# usage: cpu-history.sh HIST REPORT   (from the project's root; PY: a Python with Apache Otava and matplotlib,
#   e.g. PY=.nox/history/bin/python after `nox -s history -- --help`; default python3)
# The CPU half of the history, after gpu-history.sh and gpu-release-night.sh: the nights of HIST/nights
# into REPORT/history, each placed at the date of its code (history add --at: the chain's commits carry the
# dates make-chain.sh gives them, 2026-11-01 to 11-09; the releases are placed around the chain, 0.25.0 before
# and 0.26.0 after, not at their PyPI dates), the nightly on the chain's last night (its report in
# REPORT/nightly-c8), then 0.26.0, and show, detect and plot over the whole history.
set -u
H=$1
R=$2
D=$R/history
py=${PY:-python3}
mkdir -p "$R"
add() { [ -f "$H/nights/$1/kernel-results.json" ] && $py -m ci.core.history add --dir "$D" --at "$2" "$H/nights/$1/kernel-results.json"; }
add 0.25.0 2026-10-31T00:00:00+00:00
add c0 2026-11-01T00:00:00+00:00
add c2 2026-11-03T12:00:00+00:00
add c3 2026-11-04T12:00:00+00:00
add c5 2026-11-06T12:00:00+00:00
add c7 2026-11-08T12:00:00+00:00
$py -m ci.runner.nightly --results "$H/nights/c8/kernel-results.json" --history "$D" --at 2026-11-09T12:00:00+00:00 \
    --no-bisect --out "$R/nightly-c8"
echo "nightly exit $?"
add 0.26.0 2026-11-10T00:00:00+00:00
m=$(ls "$D")
$py -m ci.core.history show --machine "$m" --kind kernel-bench --suite quick --dir "$D" > "$R/show.md"
$py -m ci.core.history detect --machine "$m" --kind kernel-bench --suite quick --dir "$D" > "$R/detect.md"
echo "detect exit $?"
$py -m ci.core.history plot --machine "$m" --kind kernel-bench --suite quick --dir "$D" --out "$R/series.png"
