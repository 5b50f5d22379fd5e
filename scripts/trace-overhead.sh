#!/usr/bin/env bash
# Tracing overhead and memory bound (docs/tracing.md):
#  1. run time of an exit-heavy tiny guest with and without --trace, as a ratio (goal < 1.1x);
#  2. max RSS of a traced run of 5 s and of LONG s (default 60): the trace grows, memory must not.
set -euo pipefail
cd "$(dirname "$0")/.."
LONG=${LONG:-60}
BIN=$(scripts/bench-bin.sh trace)
"$BIN"
for secs in 5 "$LONG"; do
  out=$( { /usr/bin/time -v "$BIN" --long "$secs" ; } 2>&1 )
  echo "$out" | grep '^long run'
  echo "  max RSS: $(echo "$out" | awk -F': ' '/Maximum resident set size/ {print $2}') KiB"
done
