#!/usr/bin/env bash
# The main job, from a fresh machine: install what is missing, build the guest images (cached
# outside the clone) and the VMM, then profile packet receive on the default guest in both
# accounting modes and print the side-by-side table (vpmu-vmm compare --workload packet-rx),
# followed by the seconds-long tiny-guest comparison. Tables, CSV and SVG charts go to
# ./vpmu-compare (or $VPMU_COMPARE_OUT).
#   scripts/demo.sh [extra `vpmu-vmm compare` args, e.g. --phase-secs 60 --net-rx-pps 15]
# Installs and builds print one progress line per step; apt-get's and cargo's output go to logs
# under $VPMU_CACHE/logs (default ~/.cache/vpmu/logs), named on the way; a failing step prints
# its log's tail and path and the demo exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[demo] %s\n' "$*"; }
out=${VPMU_COMPARE_OUT:-vpmu-compare}
logs=${VPMU_CACHE:-$HOME/.cache/vpmu}/logs
mkdir -p "$logs"

scripts/deps.sh
say "building the guest images (cached; the first build of the default kernel takes ~6 minutes)"
guest-image/build.sh default-kernel spin-initramfs
eval "$(guest-image/build.sh paths)"
say "building vpmu-vmm (cargo build --release; log: $logs/cargo-build.log)"
if ! cargo build --release >"$logs/cargo-build.log" 2>&1; then
  say "last lines of $logs/cargo-build.log:" >&2
  tail -n 30 "$logs/cargo-build.log" >&2
  say "error: cargo build --release failed (full log: $logs/cargo-build.log)" >&2
  exit 1
fi
say "packet receive on the default guest ($DEFAULT_BZIMAGE), cpu-switch vs domain-switch; on hosts that emulate guest kernel code the boot takes a minute or more"
target/release/vpmu-vmm compare --workload packet-rx --kernel "$DEFAULT_BZIMAGE" \
  --initrd "$SPIN_INITRAMFS" --out "$out" "$@"
say "the same comparison on a bare-metal tiny guest that samples itself with the vPMU (seconds)"
target/release/vpmu-vmm compare --workload tiny --out "$out"
say "tables, CSV and SVG charts are in $out/"
