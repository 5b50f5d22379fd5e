#!/usr/bin/env bash
# bench-bin.sh NAME: builds benches/NAME.rs (without running it) and prints the executable's
# path as cargo reports it; fails when cargo built none.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(cargo bench -p vpmu-benches --bench "$1" --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l) if l.startswith("{") else {}
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])' | tail -n 1)
[ -x "$bin" ] || { echo "error: cargo built no $1 bench executable" >&2; exit 1; }
echo "$bin"
