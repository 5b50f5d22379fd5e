#!/usr/bin/env bash
# The main job, from a fresh machine: install what is missing, build the guest images (cached
# outside the clone) and the VMM, then boot the default guest with the vPMU (domain-switch
# unless you pass another --vpmu) and show what the guest's perf driver and the VMM saw.
#   scripts/demo.sh [extra vpmu-vmm run args, e.g. --vpmu cpu-switch]
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[demo] %s\n' "$*"; }

scripts/deps.sh
say "building the guest images (cached; the first build of the default kernel takes ~6 minutes)"
guest-image/build.sh default-kernel initramfs-tiny
eval "$(guest-image/build.sh paths)"
say "building vpmu-vmm"
cargo build --release --quiet
say "booting the default guest: $DEFAULT_BZIMAGE (guest kernel code is emulated on some hosts: minutes)"
set +e
log=$(mktemp)
target/release/vpmu-vmm run --kernel "$DEFAULT_BZIMAGE" --initrd "$INITRAMFS_TINY" --cpus 2 --timeout 900 \
  --vpmu domain-switch --cmdline "nmi_watchdog=0" "$@" | tee "$log"
code=${PIPESTATUS[0]}
say "what the guest kernel said about its PMU:"
grep -E "Performance Events|NMI watchdog|smp: Brought up|Run /init" "$log" | sed 's/^/    /' || true
set -e
say "vpmu-vmm exited with code $code (see 'vpmu-vmm run --help' for the exit codes)"
