#!/usr/bin/env bash
# The main job, from a fresh machine: install what is missing, build the guest images (cached
# outside the clone) and the VMM, then boot the default guest and show what the VMM saw.
#   scripts/demo.sh [--vpmu off|cpu-switch|domain-switch] [extra vpmu-vmm run args]
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[demo] %s\n' "$*"; }

scripts/deps.sh
say "building the guest images (cached; the first build of the default kernel takes ~6 minutes)"
guest-image/build.sh default-kernel initramfs
eval "$(guest-image/build.sh paths)"
say "building vpmu-vmm"
cargo build --release --quiet
say "booting the default guest: $DEFAULT_BZIMAGE (guest kernel code is emulated on some hosts: minutes)"
set +e
target/release/vpmu-vmm run --kernel "$DEFAULT_BZIMAGE" --initrd "$INITRAMFS" --cpus 2 --timeout 900 "$@"
code=$?
set -e
say "vpmu-vmm exited with code $code (see 'vpmu-vmm run --help' for the exit codes)"
