#!/usr/bin/env bash
# Tracing overhead and memory bound (docs/tracing.md):
#  1. run time of an exit-heavy tiny guest with and without --trace, as a ratio (goal < 1.1x);
#  2. max RSS of a traced run of 5 s and of LONG s (default 60): the trace grows, memory must not.
set -euo pipefail
cd "$(dirname "$0")/.."
LONG=${LONG:-60}
# The bench executable, as cargo names it (not the newest file that looks like it).
BIN=$(cargo bench -p vpmu-benches --bench trace --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l) if l.startswith("{") else {}
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])' | tail -n 1)
[ -x "$BIN" ] || { echo "error: cargo built no trace bench executable" >&2; exit 1; }
"$BIN"
for secs in 5 "$LONG"; do
  out=$( { /usr/bin/time -v "$BIN" --long "$secs" ; } 2>&1 )
  echo "$out" | grep '^long run'
  echo "  max RSS: $(echo "$out" | awk -F': ' '/Maximum resident set size/ {print $2}') KiB"
done
