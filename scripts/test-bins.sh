#!/usr/bin/env bash
# test-bins.sh: builds the vmm crate's test binaries in release (without running them) and prints
# one line per binary, "NAME PATH", as cargo reports them (scripts/test.sh and scripts/svm-tier.sh
# run them directly: cargo holds its build directory's lock while tests run). Fails when cargo
# built none.
set -euo pipefail
cd "$(dirname "$0")/.."
list=$(cargo test --release -p vmm --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
')
[ -n "$list" ] || { echo "error: cargo built no vmm test binary" >&2; exit 1; }
echo "$list"
