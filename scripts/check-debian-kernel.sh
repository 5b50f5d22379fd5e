#!/usr/bin/env bash
# The vPMU check with Debian's prebuilt cloud kernel (6.1, the distribution's own config), run
# once and reported: it takes 20-40 minutes on hosts that emulate guest kernel code, so it is not
# part of scripts/test.sh. One boot, the perf NMI watchdog on the vPMU (watchdog_thresh=1),
# the accounting mode alternating between cpu-switch and domain-switch every SLICE seconds for
# the whole run; the report gives the PMU driver line, the watchdog line, PMIs and RDPMCs per
# mode, and any PMU-related error in the guest log.
#   scripts/check-debian-kernel.sh [TIMEOUT_SECS [SLICE_SECS [CPUS]]]   (default 1800 60 1)
#   scripts/check-debian-kernel.sh --full    the tier-3 boot test (init reached etc.) instead
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
guest-image/build.sh debian-kernel initramfs-tiny
eval "$(guest-image/build.sh paths)"
: "${DEBIAN_VMLINUZ:?guest-image/build.sh paths did not name DEBIAN_VMLINUZ}"
if [ "${1:-}" = --full ]; then
  echo "[check] tier-3 boot test on $DEBIAN_VMLINUZ (timeout ${VPMU_TEST_TIMEOUT:=3600} s)"
  VPMU_TEST_KERNEL="$DEBIAN_VMLINUZ" VPMU_TEST_INITRD="$INITRAMFS_TINY" VPMU_TEST_TIMEOUT="$VPMU_TEST_TIMEOUT" \
    VPMU_TEST_MODE_SLICE_SECS="${VPMU_TEST_MODE_SLICE_SECS:-60}" \
    exec cargo test --release -p vmm --test linux_boot -- --ignored --nocapture
fi
timeout=${1:-1800} slice=${2:-60} cpus=${3:-1}
cargo build --release -p vmm
out=$(mktemp -d /tmp/vpmu-debian-XXXXXX)
echo "[check] booting $DEBIAN_VMLINUZ on $cpus vCPU(s), cpu-switch and domain-switch alternating every ${slice} s, stop at ${timeout} s; logs in $out"
set +e
target/release/vpmu-vmm run --kernel "$DEBIAN_VMLINUZ" --initrd "$INITRAMFS_TINY" --cpus "$cpus" \
  --vpmu domain-switch --vpmu-schedule "cpu-switch:$slice,domain-switch:$slice,repeat" \
  --cmdline "nmi_watchdog=1 watchdog_thresh=1" --timeout "$timeout" \
  --console "$out/console.log" 2> "$out/vmm.log"
code=$?
set -e
echo "[check] exit code $code (7 = the timeout: expected here, the kernel does not reach init in time)"
echo "[check] RDPMC sites:"; grep "RDPMC at" "$out/vmm.log" || echo "  none"
echo "[check] guest log:"
grep -E "Performance Events:|NMI watchdog|Run /init|Brought up" "$out/console.log" || true
echo "[check] last guest line: $(tail -n 1 "$out/console.log")"
echo "[check] vPMU:"; grep -E "vPMU \(|accounting modes|   in (cpu|domain)-switch" "$out/vmm.log" || true
bad=$(grep -E "unknown reason|irq loop stuck|general protection|Oops|unchecked MSR|Broken PMU" "$out/console.log" || true)
if [ -n "$bad" ]; then echo "[check] PROBLEMS:"; echo "$bad"; exit 1; fi
echo "[check] no PMU-related errors in the guest log"
