#!/usr/bin/env bash
# PMI storm and soak figures (docs/vpmu.md, "Storm and soak"; benches/storm_soak.rs).
#   scripts/storm-soak.sh [MINUTES] [storm|soak|both]     (defaults: 30, both)
# storm: 2 vCPUs with period-1 counters and LVTPC unmasked, modes switching every second,
#        60 s at the default --pmi-limit 2000, then 30 s at --pmi-limit 500 (the rate must
#        follow the cap); the console, the control port 0x511 and the schedule thread are
#        probed while it runs (each must answer within 100 ms).
# soak:  the same for MINUTES minutes, fds and VmRSS of the VMM process sampled every minute
#        (both must stay flat), the PMI accounting checked at the end.
# Each run prints its figures and "all invariants hold" or the failed ones (exit status 1).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-30}
WHAT=${2:-both}
case "$WHAT" in storm|soak|both) ;; *) echo "usage: $0 [MINUTES] [storm|soak|both]" >&2; exit 2;; esac
BIN=$(scripts/bench-bin.sh storm_soak)
status=0
if [ "$WHAT" != soak ]; then
  "$BIN" --label "storm (cap 2000)" --secs 60 --sample 10 --probe 0.25 --pmi-limit 2000 || status=1
  echo
  "$BIN" --label "storm (cap 500)" --secs 30 --sample 10 --probe 0.25 --pmi-limit 500 || status=1
  echo
fi
if [ "$WHAT" != storm ]; then
  secs=$(awk -v m="$MINUTES" 'BEGIN { print m * 60 }')
  "$BIN" --label "soak (${MINUTES} min)" --secs "$secs" --sample 60 --probe 1 --pmi-limit 2000 || status=1
fi
exit $status
