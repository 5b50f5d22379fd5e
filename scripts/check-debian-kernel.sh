#!/usr/bin/env bash
# The compatibility check with Debian's prebuilt cloud kernel: the same one-boot test as tier 3
# (2 vCPUs up, init reached, the documented exit code; on a VT-x/SVM host also the init marker,
# nproc = 2 and a clean power-off), with that kernel. On hosts that emulate guest kernel code it
# takes 20-40 minutes, so it is not part of scripts/test.sh; run it and read its report.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
guest-image/build.sh debian-kernel initramfs
eval "$(guest-image/build.sh paths)"
: "${DEBIAN_VMLINUZ:?guest-image/build.sh paths did not name DEBIAN_VMLINUZ}"
echo "[check] booting $DEBIAN_VMLINUZ on 2 vCPUs (timeout ${VPMU_TEST_TIMEOUT:=3600} s)"
VPMU_TEST_KERNEL="$DEBIAN_VMLINUZ" VPMU_TEST_INITRD="$INITRAMFS" VPMU_TEST_TIMEOUT="$VPMU_TEST_TIMEOUT" \
  cargo test --release -p vmm --test linux_boot -- --ignored --nocapture
