#!/usr/bin/env bash
# The project's test command (README, .ci/run): the toolchain's version, rustfmt and clippy
# (-D warnings), then all four tiers.
#   1. unit tests (no KVM)            cargo test --workspace
#   2. tiny guests on /dev/kvm        (same run; they fail loudly without /dev/kvm)
#   3. stock Linux on /dev/kvm        two boots of the default guest kernel: 2 vCPUs with the perf
#                                     NMI watchdog on the vPMU in both modes; packet receive compared
#                                     in both modes (vpmu-vmm compare --workload packet-rx); stock
#                                     perf and OProfile in the guest (guest_profilers: one boot for
#                                     both modes, compare --profiler perf, one driving its shell,
#                                     one profiled from the host alone (cpu_split as init: processes
#                                     and user symbols), two at a time; root filesystem on a
#                                     read-only virtio-blk disk; compare --profiler oprofile with
#                                     VPMU_COMPARE_OPROFILE=1; VPMU_GUEST_PROFILERS=0 skips them,
#                                     said loudly); and kvm-unit-tests' x86/pmu, unmodified, booted
#                                     as a Multiboot kernel (AMD model, cpu-switch;
#                                     scripts/kvm-unit-tests.sh runs the other configurations), its
#                                     results compared with guest-image/kvm-unit-tests/*.expected
#                                     for the host's vendor
#   4. the SVM host                   tiers 2 and 3 again (tiny guests; linux_boot; the guest
#                                     profilers with VPMU_SVM_PROFILERS=1) on a real kvm_amd, host
#                                     quirks off, nested under QEMU's emulator (scripts/svm-tier.sh;
#                                     VPMU_SVM_TIER=0 skips it, said loudly; =tiny or =linux runs
#                                     a part)
# Tiers 1 and 2 run first, alone. Then two lanes run side by side, each keeping about one core
# busy: lane A (this shell) tier 3's Linux boots and guest profilers; lane B (background, lines
# marked "[lane B]") tier 4, then kvm-unit-tests. The stock-Linux test binaries run directly,
# not through cargo (cargo holds its build directory's lock while tests run).
# Guest images are built by guest-image/build.sh and cached outside the clone.
# VPMU_SKIP_LINUX=1 skips tier 3 (said loudly).
# A failing step does not stop the others (cargo runs with --no-fail-fast): the script ends with
# the list of failed steps and a summary of every check that was NOT CHECKED on this host
# (collected from all tiers through $VPMU_NOT_CHECKED_LOG, vmm/testkit), and exits 1 if any step
# failed.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\n[test] %s\n' "$*"; }

# What was not checked, from every tier: the tests append to this file (vmm/testkit), so their
# lines reach the summary even where cargo hides a passing test's stderr.
VPMU_NOT_CHECKED_LOG=$(mktemp "${TMPDIR:-/tmp}/vpmu-not-checked.XXXXXX")
export VPMU_NOT_CHECKED_LOG
not_checked() { printf '[scripts/test.sh] %s\n' "$*" >>"$VPMU_NOT_CHECKED_LOG"; say "*** NOT CHECKED: $* ***"; }
# The failed steps, one a line: a file, so that the steps of the background lane count too.
VPMU_FAILED_LOG=$(mktemp "${TMPDIR:-/tmp}/vpmu-failed.XXXXXX")
t_start=$SECONDS
# step NAME CMD...: runs CMD; a failure is recorded and the run goes on.
step() {
  local name=$1 t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  if [ "$rc" != 0 ]; then
    printf '%s\n' "$name (exit code $rc, after $((SECONDS - t0)) s)" >>"$VPMU_FAILED_LOG"
    say "*** FAILED: $name (exit code $rc) ***"
  else
    say "passed in $((SECONDS - t0)) s: $name"
  fi
}
summary() {
  local n
  n=$(sort -u "$VPMU_NOT_CHECKED_LOG" | grep -c . || true)
  say "summary after $(((SECONDS - t_start) / 60))m$(((SECONDS - t_start) % 60))s"
  printf 'NOT CHECKED on this host: %s\n' "$n"
  sort -u "$VPMU_NOT_CHECKED_LOG" | sed 's/^/  - /'
  if [ -s "$VPMU_FAILED_LOG" ]; then
    printf 'FAILED steps: %s\n' "$(grep -c . "$VPMU_FAILED_LOG")"
    sed 's/^/  - /' "$VPMU_FAILED_LOG"
    exit 1
  fi
  printf 'all steps passed\n'
  exit 0
}

# Tier 4: the same tests on the second kind of host, a real kvm_amd with host quirks off
# (nested under QEMU's emulator: scripts/svm-host.sh, scripts/svm-tier.sh). VPMU_SVM_TIER picks
# what runs there: tiny (the tiny-guest binaries), linux (stock Linux: linux_boot and the
# guest profilers), all (both; the default), 0 (nothing, said loudly).
svm_tier() {
  local what=${VPMU_SVM_TIER:-all}
  if [ "$what" = 0 ]; then
    not_checked "tier 4 (the SVM host: kvm_amd nested under QEMU's emulator, host quirks off): VPMU_SVM_TIER=0"
    return
  fi
  if [ "$what" != tiny ] && [ "${VPMU_SKIP_LINUX:-0}" = 1 ]; then
    not_checked "tier 4: stock Linux on the SVM host: VPMU_SKIP_LINUX=1"
    what=tiny
  fi
  say "tier 4: on a real kvm_amd nested under QEMU's emulator, host quirks off (scripts/svm-tier.sh $what; logs in target/svm-tier/)"
  step "tier 4: the SVM host ($what)" scripts/svm-tier.sh "$what"
}

say "installing build dependencies if missing"
scripts/deps.sh

say "toolchain: $(rustc --version), $(cargo --version)"

say "formatting: cargo fmt --all -- --check"
step "cargo fmt --check" cargo fmt --all -- --check

say "lints: cargo clippy --workspace --all-targets -- -D warnings (workspace lints: Cargo.toml)"
step "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings

if [ "${VPMU_SKIP_LINUX:-0}" != 1 ]; then
  # Before tier 1, so that kallsyms_kernel (a tier-1 test that reads the default kernel) runs on a
  # fresh machine too. initramfs-tiny: busybox + /init only. The default initramfs (perf,
  # OProfile: 48 MB) makes the kernel spend minutes more copying it in emulated code here
  # (docs/guest.md, "Boot time").
  say "building (or reusing) the guest images: the default kernel (read by tiers 1 and 3), the no-PCI kernel, initramfs-tiny, spin-initramfs, kvm-unit-tests x86/pmu.flat, Debian's cloud kernel with its DWARF offsets (tier 1 checks the BTF task layout against them)"
  guest-image/build.sh default-kernel nopci-kernel initramfs-tiny spin-initramfs kvm-unit-tests debian-kernel
  # The tests that read these images now fail if one is missing instead of saying NOT CHECKED.
  export VPMU_IMAGES_BUILT=1
fi

say "tiers 1 and 2: cargo test --workspace --release --no-fail-fast (unit tests, tiny guests on /dev/kvm, CLI)"
step "tiers 1 and 2 (cargo test --workspace)" cargo test --workspace --release --no-fail-fast
say "the fuzzers again in a debug build (overflow checks on: a guest value that wraps panics there)"
step "fuzzers, debug build" cargo test -p vmm -p vpmu --no-fail-fast --test fuzz_virtio --test fuzz_readers --test fuzz_exits --test fuzz_model

if [ "${VPMU_SKIP_LINUX:-0}" = 1 ]; then
  not_checked "tier 3 (stock Linux, kvm-unit-tests, the guest profilers): VPMU_SKIP_LINUX=1"
  svm_tier
  summary
fi

eval "$(guest-image/build.sh paths)"
: "${DEFAULT_BZIMAGE:?guest-image/build.sh paths did not name DEFAULT_BZIMAGE}"
: "${DEFAULT_BZIMAGE_XZ:?guest-image/build.sh paths did not name DEFAULT_BZIMAGE_XZ}"
: "${NOPCI_BZIMAGE:?guest-image/build.sh paths did not name NOPCI_BZIMAGE}"
: "${INITRAMFS_TINY:?guest-image/build.sh paths did not name INITRAMFS_TINY}"
: "${SPIN_INITRAMFS:?guest-image/build.sh paths did not name SPIN_INITRAMFS}"
: "${KUT_PMU_FLAT:?guest-image/build.sh paths did not name KUT_PMU_FLAT}"

# What the two lanes below need from the network or apt is fetched first, one thing at a time
# (apt-get takes one lock): the root filesystem image of the guest-profiler boots, and the SVM
# host's QEMU and L1 kernel.
profilers=${VPMU_GUEST_PROFILERS:-1}
if [ "$profilers" != 0 ]; then
  say "building (or reusing) the root filesystem image of the guest-profiler boots (perf, OProfile; the guests boot from it, read-only)"
  guest-image/build.sh rootfs
  eval "$(guest-image/build.sh paths)"
  : "${ROOTFS:?guest-image/build.sh paths did not name ROOTFS}"
fi
if [ "${VPMU_SVM_TIER:-all}" != 0 ]; then
  say "setting up (or reusing) the SVM host: QEMU, the L1 kernel and its modules (scripts/svm-host.sh setup)"
  scripts/svm-host.sh setup
fi

# The stock-Linux tests run their binaries directly, not through cargo: cargo holds its build
# directory's lock while tests run, which would make the two lanes wait for each other.
say "building the test binaries once (cargo test --release -p vmm --no-run)"
bins=$(mktemp "${TMPDIR:-/tmp}/vpmu-test-bins.XXXXXX")
scripts/test-bins.sh >"$bins"
# run_test NAME [VAR=VALUE...] -- ARGS...: test binary NAME of vmm/tests with those variables
# set, from vmm/ as cargo would run it.
run_test() {
  local name=$1 exe vars=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  exe=$(awk -v n="$name" '$1 == n { print $2 }' "$bins")
  [ -n "$exe" ] || { echo "scripts/test.sh: no test binary $name (cargo test --no-run)" >&2; return 1; }
  (cd vmm && env "${vars[@]}" "$exe" "$@")
}

# Two lanes side by side (this host has few cores; each lane keeps about one busy): lane A, in
# this shell, boots stock Linux on /dev/kvm (the guest profilers, linux_boot); lane B, in the
# background, runs tier 4 (QEMU's emulator: one thread), then kvm-unit-tests' x86/pmu (one
# vCPU) and linux_compare. Lane B's lines are marked "[lane B]".
lane_b() {
  svm_tier
  # One boot of KVM's own vPMU conformance test here: the AMD model in cpu-switch (issue 20).
  # Its results depend on the host's CPU vendor (the guest's CPUID vendor): on an Intel host
  # x86/pmu runs the AMD sub-tests under the AMD CPU identity the model brings (3-12 min); on an
  # AMD host the same sub-tests, more slowly (~13 min). A configuration without an expected
  # file for this host's vendor is reported as NOT CHECKED before booting. The Intel model
  # (12-24 min a boot here) and domain-switch run from scripts/kvm-unit-tests.sh (README).
  # docs/kvm-unit-tests.md.
  say "tier 3: kvm-unit-tests x86/pmu, AMD model, cpu-switch (one boot), against guest-image/kvm-unit-tests/pmu.amd.cpu-switch.soft.<host vendor>-host.expected"
  step "tier 3: kvm_unit_tests" run_test kvm_unit_tests VPMU_TEST_KUT_PMU="$KUT_PMU_FLAT" VPMU_TEST_KUT_MODEL=amd \
    VPMU_TEST_KUT_VPMU=cpu-switch VPMU_TEST_KUT_BACKEND=soft -- --ignored --nocapture
  # Last, beside the end of the experiments boot only: its CPU-bound control's share moves with
  # the vCPU thread's share of the CPU, and with three boots on two cores it moved 3.9 pp
  # (42.6% vs 38.7%, bar 3 pp); beside one it stayed inside.
  say "tier 3: packet receive compared in both accounting modes (vpmu-vmm compare --workload packet-rx; one boot)"
  step "tier 3: linux_compare" run_test linux_compare VPMU_TEST_KERNEL="$DEFAULT_BZIMAGE" \
    VPMU_TEST_SPIN_INITRD="$SPIN_INITRAMFS" -- --ignored --nocapture
}
say "lane B starts: tier 4, then kvm-unit-tests and linux_compare (its lines are marked [lane B])"
(lane_b 2>&1 | sed -u 's/^/[lane B] /') &
lane_b_pid=$!

# Lane A. Stock perf and OProfile inside the guest (both modes in one boot: the longest boot of
# the run, so it starts first, in the background, its lines marked "[experiments]"), and beside
# it one after the other: `compare --profiler perf` on the Intel model, the console shell, the
# host-side profile, then linux_boot. On hosts whose KVM emulates guest kernel
# code (kvm_pvm) guest user space runs through the VMM's SYSCALL relay, and these boots are the
# longest part of the run (docs/guest.md, "Sizes and periods"). `compare --profiler oprofile`
# is one more such boot (25-30 min there): VPMU_COMPARE_OPROFILE=1 runs it; OProfile in the
# guest is checked by the experiments boot. VPMU_GUEST_PROFILERS=0 skips them all, loudly.
# VPMU_TEST_TIMEOUT (default 4500 s) bounds each of those boots: a hang detector, not a speed
# check.
experiments=stock_perf_and_oprofile_in_the_guest_in_both_modes
experiments_pid=''
if [ "$profilers" = 0 ]; then
  not_checked "tier 3: stock perf/OProfile in the guest (guest_profilers): VPMU_GUEST_PROFILERS=0"
else
  profile_env=(VPMU_TEST_KERNEL="$DEFAULT_BZIMAGE" VPMU_TEST_ROOTFS="$ROOTFS" VPMU_TEST_TIMEOUT="${VPMU_TEST_TIMEOUT:-4500}")
  say "tier 3: stock perf and OProfile in the guest, both modes, one boot from the root filesystem image, read-only (its lines are marked [experiments])"
  (step "tier 3: guest_profilers::$experiments" run_test guest_profilers "${profile_env[@]}" -- \
    --ignored --nocapture --exact "$experiments" 2>&1 | sed -u 's/^/[experiments] /') &
  experiments_pid=$!
  skip=(--skip "$experiments")
  if [ "${VPMU_COMPARE_OPROFILE:-0}" != 1 ]; then
    not_checked "tier 3: compare --profiler oprofile (guest_profilers::compare_with_the_guests_oprofile, one more 25-30 min boot where guest kernel code is emulated): VPMU_COMPARE_OPROFILE=1 runs it; operf/opreport/ocount in the guest are checked in both modes by the experiments boot"
    skip+=(--skip compare_with_the_guests_oprofile)
  fi
  say "tier 3: compare --profiler perf; the console shell; the host-side profile (one at a time)"
  step "tier 3: guest_profilers" run_test guest_profilers "${profile_env[@]}" -- --ignored --nocapture \
    --test-threads 1 "${skip[@]}"
fi

say "tier 3: booting the default kernel on 2 vCPUs (a few minutes on hosts that emulate guest kernel code), its xz bzImage and the no-PCI kernel to user space"
step "tier 3: linux_boot" run_test linux_boot VPMU_TEST_KERNEL="$DEFAULT_BZIMAGE" VPMU_TEST_XZ_KERNEL="$DEFAULT_BZIMAGE_XZ" \
  VPMU_TEST_NOPCI_KERNEL="$NOPCI_BZIMAGE" VPMU_TEST_INITRD="$INITRAMFS_TINY" -- --ignored --nocapture

if [ -n "$experiments_pid" ]; then
  say "waiting for the experiments boot"
  wait "$experiments_pid" || true
fi
t_wait=$SECONDS
say "lane A done; waiting for lane B (tier 4, kvm-unit-tests, linux_compare)"
wait "$lane_b_pid" || true
say "lane B done ($((SECONDS - t_wait)) s after lane A)"
summary
