#!/usr/bin/env bash
# The test tiers on the second kind of host: a real kvm_amd with host quirks off, nested under
# QEMU's emulator (scripts/svm-host.sh; shared/HOST-FACTS.md, "A real kvm_amd"). Called by
# scripts/test.sh (VPMU_SVM_TIER=0 skips it, said loudly); runnable alone:
#   scripts/svm-tier.sh [tiny|linux|all]      (default all)
# - tiny: the vmm test binaries that boot tiny guests (tier 2), each run whole inside L1;
# - linux: stock Linux and kvm-unit-tests on that host: x86/pmu on both models (cpu-switch),
#   linux_boot (the perf NMI watchdog on both vendors' models,
#   on 1 vCPU there, see below; the xz bzImage; the no-PCI kernel) and, with VPMU_SVM_PROFILERS=1, the
#   guest-profiler tests (perf and OProfile in the guest in both modes, compare --profiler, the
#   shell, the host-side profile; sized for kvm_pvm hosts so far: NOT CHECKED by default), over
#   the cached images guest-image/build.sh made (scripts/test.sh builds them first).
# Each test binary's whole output is kept in $VPMU_SVM_OUT (default target/svm-tier/) and its
# summary printed with its wall time and L1 time; a binary still running after its limit in
# wall time (900 s for a tiny-guest binary, VPMU_SVM_TINY_LIMIT) is a hang: QEMU's monitor is
# read ten times from outside L1 (where the CPU is), its threads' stacks (gdb) go into its log,
# their top frames are printed, and it fails -- except a linux_boot hang whose monitor readings
# show the known stall of the nested guest (scripts/svm-stall.py: its vCPU spinning with IF=0 in
# the kernel's spinlock slow path; issue 32): that one is printed as STALLED and listed NOT
# CHECKED with the readings' summary, with the boots after it. L1 runs on the emulator's
# instruction clock (VPMU_SVM_CLOCK=icount, the default; `host` for the wall clock: see
# scripts/svm-host.sh); linux_boot gets VPMU_SVM_LINUX_LIMIT (1200 s) and L1 as a whole
# VPMU_SVM_TIMEOUT (3600 s) of wall time (scripts/test.sh runs this tier beside tier 3, which
# takes about one of the host's cores: these are hang limits, not speed checks; the whole tier
# took 1770-2019 s in rehearsals, and a linux_boot hang adds its limit).
# Checks that cannot run there are named in $VPMU_NOT_CHECKED_LOG, as on the first host. Exit
# status: 0 when every binary passed, 1 otherwise, 124 when L1 ran out of time, 125 when L1
# failed.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[svm-tier] %s\n' "$*" >&2; }
what=${1:-all}
case $what in tiny | linux | all) ;; *) say "usage: scripts/svm-tier.sh [tiny|linux|all]"; exit 2 ;; esac

# Tier-2 binaries that boot guests. Left out, each for its reason (NOT CHECKED below):
# host_profile_perturbation times nine rotations of three runs each at 1000 Hz; on this host
# each sample's exits cost ~0.1-0.5 ms of the emulator's time and the test took over 8 minutes
# without finishing.
TINY=(tiny_guests vpmu_tiny vpmu_gating vpmu_filter rdpmc_trap multiboot_tiny syscall_relay
  trace_tiny trace_gating compare_tiny guest_wrong blk_tiny virtio_tiny seccomp stop_signal
  vcpu_access cli)
LEFT_OUT="host_profile_perturbation: nine rotations of three 1000 Hz host-profiled runs take over 8 minutes under QEMU's emulator"
# Single tests left out there, each for its reason (NOT CHECKED below; open in issue 32):
SKIP_TESTS=(
  "trace_tiny host_profile_follows_the_accounting_mode|its guest's compute phase is sized for hosts that emulate guest kernel code: on this host it runs ~180x faster and took 0 of 73 host-profile samples"
  "trace_tiny vpmu_overflows_and_profile_samples_share_the_signal|guest PMIs and 2000 Hz host samples under QEMU's emulator: the guest did not finish within the test's 120 s"
)
# linux_boot's vPMU boots run on 1 vCPU here (VPMU_TEST_LINUX_CPUS=1; VPMU_SVM_TWO_VCPUS=1 runs
# them on 2): on 2 vCPUs sharing L1's one CPU (an L1 with two CPUs on the instruction clock did
# not reach its own init within 3 minutes, 2026-11-28) they stalled, in 2 of 3 runs before and
# in CI (9838138, 900 s). QEMU's monitor (scripts/svm-host.sh) shows where: the nested guest's
# vCPU spinning with IF=0 in the spinlock slow path (queued_spin_lock_slowpath; with the guest's
# PV spinlocks, __pv_queued_spin_lock_slowpath, 1 boot of 4, during "Booting SMP
# configuration"), the same RIP for minutes. Under the emulator every PAUSE of a spin loop
# leaves the translated code, so L1's instruction clock, and L1's scheduler tick with it,
# crawls while a vCPU spins; this host has no pause-loop exiting (the emulator offers no pause
# filter). The spinning vCPU was on its IRQ stack (an interrupt handler), and 2-vCPU boots with
# --vpmu off stalled the same way (1 of 2): not the vPMU. The lead, from a 1-vCPU guest found
# spinning on its own hrtimer lock in its timer interrupt: an interrupt taken inside an
# interrupts-off section (docs/accounting-modes.md; issue 32, open). 1 vCPU is not immune:
# the xz boot hung so in a rehearsal (2026-11-29, at native_queued_spin_lock_slowpath+0x5c,
# RFLAGS 0x2), hence the monitor readings and scripts/svm-stall.py at a hang (above).
# Not the VMM's alone: 2-vCPU boots under QEMU -accel kvm in the same L1 stalled the same way
# (3 of 4, vpmu-vmm 3 of 4; scripts/svm-stall-control.sh, 2026-11-29; docs/guest.md).
if [ "${VPMU_SVM_TWO_VCPUS:-0}" = 1 ]; then
  linux_cpus=2
else
  linux_cpus=1
  LINUX_NOTE="linux_boot's vPMU boots on 2 vCPUs (run on 1 here; VPMU_SVM_TWO_VCPUS=1 runs them on 2): a nested guest vCPU stalls spinning in the spinlock slow path with both vCPUs on L1's one CPU (issue 32, open; scripts/svm-tier.sh)"
fi
# Whether test binary $1 runs in this invocation.
runs() { if [ "$1" = linux_boot ]; then [ "$what" != tiny ]; else [ "$what" != linux ]; fi; }
# " --skip TEST" for each test of binary $1 left out above.
skips_for() {
  local e sb st
  for e in "${SKIP_TESTS[@]}"; do
    read -r sb st <<<"${e%%|*}"
    [ "$sb" != "$1" ] || printf ' --skip %s' "$st"
  done
}

out=${VPMU_SVM_OUT:-$PWD/target/svm-tier}
rm -rf "$out" && mkdir -p "$out"
export VPMU_NOT_CHECKED_LOG=${VPMU_NOT_CHECKED_LOG:-$out/not-checked.log}
touch "$VPMU_NOT_CHECKED_LOG"
# L1 writes only into $out (the --share): its tests' lines come back there, and are added to
# $VPMU_NOT_CHECKED_LOG marked as the SVM host's.
inner_log=$out/l1-not-checked.log

scripts/svm-host.sh setup
# The hang classifier below must work before its verdict can count.
python3 scripts/svm-stall.py --self-test >&2

# The test executables, built here (L1 runs them from the shared tree).
say "building the test binaries (cargo test --release -p vmm --no-run)"
scripts/test-bins.sh >"$out/binaries"
bin() { awk -v n="$1" '$1 == n { print $2 }' "$out/binaries"; }

runner=$out/run-in-l1.sh
{
  echo 'set -u'
  echo "export VPMU_NOT_CHECKED_LOG='$inner_log'"
  echo 'rc=0'
  # one NAME LIMIT BIN ARGS...: a test binary, its output kept, its summary shown; LIMIT s at most.
  cat <<'EOF'
# The host's wall clock, which scripts/svm-host.sh writes into the share each second: L1's own
# clock is the emulator's (its --clock), which runs slower than the wall clock.
wall() { cat "$OUT/wall" 2>/dev/null || date +%s; }
# PID and its descendants (a test binary runs the VMM as a child process).
tree() { echo "$1"; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do tree "$c"; done; }
# Where each thread of PID's tree is: state, kernel stack (quick, from /proc), then user stacks
# (gdb, bounded: it is slow under the emulator).
stacks() {
  for p in $(tree "$1"); do
    echo "== pid $p: $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | cut -c1-200)"
    for t in /proc/"$p"/task/*; do
      echo "task ${t##*/} $(cat "$t"/comm 2>/dev/null) state $(awk '{print $3}' "$t"/stat 2>/dev/null) wchan $(cat "$t"/wchan 2>/dev/null)"
      sed 's/^/    /' "$t"/stack 2>/dev/null | head -n 12
    done
  done
  if command -v gdb >/dev/null; then
    for p in $(tree "$1"); do
      echo "== gdb, pid $p"
      timeout 120 gdb -p "$p" -batch -ex 'thread apply all bt 20' 2>&1 | grep -E '^Thread |^#'
    done
  fi
}
one() {
  name=$1; limit=$2; shift 2
  t0=$(date +%s) w0=$(wall)
  "$@" >"$OUT/$name.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && [ $(( $(wall) - w0 )) -lt "$limit" ]; do sleep 1; done
  hung=''
  if kill -0 "$pid" 2>/dev/null; then
    # A hang: where the CPU is, from QEMU's monitor outside L1 (scripts/svm-host.sh: ten
    # readings, while the guest still runs), then every thread's stack goes into the log (the
    # vCPU threads' also here), then the binary is killed.
    hung=1
    echo "$name" >"$OUT/sample-request"
    w1=$(wall)
    while [ ! -e "$OUT/cpu-samples.$name" ] && [ $(( $(wall) - w1 )) -lt 120 ]; do sleep 1; done
    # Stopped first: a nested vCPU spinning in the known stall starves all of L1 (its clock
    # and scheduler crawl), so gdb under a `timeout 120` of L1's time ran past L1's own
    # timeout in a rehearsal (2026-11-29) and the tier ended 124 instead of judging the hang.
    # A stopped vCPU thread has left KVM_RUN: L1 is itself again, the stacks are as they were.
    kill -STOP $(tree "$pid") 2>/dev/null
    echo "[svm-tier] $name: still running after $limit s of wall time: HUNG; its threads' stacks follow" >>"$OUT/$name.log"
    stacks "$pid" >"$OUT/$name.stacks" 2>&1
    cat "$OUT/$name.stacks" >>"$OUT/$name.log"
    grep -E '^== |^task |^#[0-3] ' "$OUT/$name.stacks" | cut -c1-160 | head -n 60
    kill -9 $(tree "$pid") 2>/dev/null
    echo "[svm-tier] $name: HUNG after $limit s of wall time (stacks in $OUT/$name.log)"
  fi
  wait "$pid"
  r=$?
  echo "[svm-tier] $name: exit $r after $(( $(wall) - w0 )) s ($(( $(date +%s) - t0 )) s of L1 time): $(grep -E '^test result' "$OUT/$name.log" | tail -n 1)"
  grep -E '^test .* FAILED$|panicked at' "$OUT/$name.log" | head -n 20
  if [ -n "$hung" ]; then
    echo "$name hung" >>"$OUT/failures"
  elif [ "$r" != 0 ]; then
    echo "$name exit $r" >>"$OUT/failures"
  fi
  [ "$r" = 0 ] || rc=1
}
EOF
  echo "OUT='$out'"
  if [ "$what" != linux ]; then
    for t in "${TINY[@]}"; do
      b=$(bin "$t")
      [ -n "$b" ] || { say "no test binary $t"; exit 1; }
      echo "one $t ${VPMU_SVM_TINY_LIMIT:-900} '$b' --test-threads 1$(skips_for "$t")"
    done
  fi
  if [ "$what" != tiny ]; then
    eval "$(guest-image/build.sh paths)"
    : "${DEFAULT_BZIMAGE:?guest-image/build.sh paths did not name DEFAULT_BZIMAGE: build the images first}"
    echo "export VPMU_TEST_KERNEL='$DEFAULT_BZIMAGE' VPMU_TEST_XZ_KERNEL='$DEFAULT_BZIMAGE_XZ'"
    echo "export VPMU_TEST_NOPCI_KERNEL='$NOPCI_BZIMAGE' VPMU_TEST_INITRD='$INITRAMFS_TINY'"
    echo "export VPMU_TEST_LINUX_CPUS=$linux_cpus"
    # kvm-unit-tests' x86/pmu, both models, cpu-switch, soft backend (seconds of guest time
    # here, where its CPL 0 code runs at the emulator's speed), before linux_boot so that a
    # stall there does not cost it; compared with pmu.MODEL.cpu-switch.soft.amd-svm-host.expected
    # (NOT CHECKED, said so, where none is recorded). What each run observed is kept in the
    # share, in the expected file's format.
    : "${KUT_PMU_FLAT:?guest-image/build.sh paths did not name KUT_PMU_FLAT: build the images first}"
    for model in amd intel; do
      echo "export VPMU_TEST_KUT_PMU='$KUT_PMU_FLAT' VPMU_TEST_KUT_MODEL=$model VPMU_TEST_KUT_VPMU=cpu-switch VPMU_TEST_KUT_BACKEND=soft VPMU_TEST_KUT_OUT='$out/kut-$model.observed'"
      echo "one kvm_unit_tests_$model ${VPMU_SVM_KUT_LIMIT:-600} '$(bin kvm_unit_tests)' --ignored --test-threads 1 --nocapture"
    done
    echo "one linux_boot ${VPMU_SVM_LINUX_LIMIT:-1200} '$(bin linux_boot)' --ignored --test-threads 1 --nocapture$(skips_for linux_boot)"
    if [ "${VPMU_GUEST_PROFILERS:-1}" = 0 ]; then
      printf '[SVM host] [svm-tier] %s\n' "the guest-profiler tests: VPMU_GUEST_PROFILERS=0" >>"$VPMU_NOT_CHECKED_LOG"
    elif [ "${VPMU_SVM_PROFILERS:-0}" != 1 ]; then
      printf '[SVM host] [svm-tier] %s\n' "the guest-profiler tests (VPMU_SVM_PROFILERS=1 runs them): in cpu-switch with packets flowing and guest PMIs, guests on this host stalled (compare at 1M-cycle periods or 1000 packets/s, 2 of 9 run boots at 1M; issue 32, open: docs/accounting-modes.md); compare --profiler is sized for this host (5M-cycle period, 200 packets/s), the other workloads for hosts that emulate guest kernel code" >>"$VPMU_NOT_CHECKED_LOG"
    elif [ -n "${ROOTFS:-}" ] && [ -e "$ROOTFS" ]; then
      echo "export VPMU_TEST_ROOTFS='$ROOTFS' VPMU_TEST_TIMEOUT=1800"
      echo "one guest_profilers ${VPMU_SVM_PROFILERS_LIMIT:-2400} '$(bin guest_profilers)' --ignored --test-threads 1 --nocapture"
    else
      printf '[SVM host] [svm-tier] %s\n' "the guest-profiler tests: no root filesystem image (guest-image/build.sh rootfs)" >>"$VPMU_NOT_CHECKED_LOG"
    fi
  fi
  echo 'exit $rc'
} >"$runner"

runs tiny_guests && printf '[SVM host] [svm-tier] %s\n' "$LEFT_OUT" >>"$VPMU_NOT_CHECKED_LOG"
if runs linux_boot && [ -n "${LINUX_NOTE:-}" ]; then
  printf '[SVM host] [svm-tier] %s\n' "$LINUX_NOTE" >>"$VPMU_NOT_CHECKED_LOG"
fi
for e in "${SKIP_TESTS[@]}"; do
  read -r sb st <<<"${e%%|*}"
  runs "$sb" || continue
  printf '[SVM host] [svm-tier] %s::%s: %s\n' "$sb" "$st" "${e#*|}" >>"$VPMU_NOT_CHECKED_LOG"
done
say "running in L1 (kvm_amd under QEMU's emulator): $what; logs in $out"
t0=$SECONDS
rc=0
# One CPU in L1 (VPMU_SVM_CPUS): with two, L1 as a whole stopped (its clock and every process)
# in 2 of 3 runs of the tiny tier, within a minute of a tiny guest's first busy loop; with one,
# three rounds of the same binaries passed (an emulator problem of nested SVM under QEMU's
# multi-threaded TCG, not chased further). The guests' own vCPUs are threads and share it.
scripts/svm-host.sh run --cpus "${VPMU_SVM_CPUS:-1}" --timeout "${VPMU_SVM_TIMEOUT:-3600}" \
  --clock "${VPMU_SVM_CLOCK:-icount}" --share "$out" -- sh "$runner" || rc=$?
# A hang of linux_boot is the known stall of the nested guest (issue 32) only when QEMU's
# monitor, read while it hung, shows the guest's vCPU spinning with IF=0 in the kernel's
# spinlock slow path (scripts/svm-stall.py): then it is listed as NOT CHECKED with that
# evidence, loudly, instead of failing the tier. Any other failure or hang still fails it.
if [ "$rc" = 1 ] && [ -s "$out/failures" ] && ! grep -qv '^linux_boot hung$' "$out/failures"; then
  maps=()
  for k in "${DEFAULT_BZIMAGE:-}" "${NOPCI_BZIMAGE:-}"; do
    [ -n "$k" ] && [ -f "$(dirname "$k")/System.map" ] && maps+=("$(dirname "$k")/System.map")
  done
  if [ ${#maps[@]} -gt 0 ] && [ -s "$out/cpu-samples.linux_boot" ] &&
    evidence=$(python3 scripts/svm-stall.py "$out/cpu-samples.linux_boot" "${maps[@]}"); then
    hung_test=$(grep -E '^test [a-z0-9_]+ \.\.\. ' "$out/linux_boot.log" | grep -v ' \.\.\. ok$' | tail -n 1 | awk '{print $2}')
    say "STALLED: linux_boot${hung_test:+::$hung_test} hung in the known stall of the nested guest (issue 32): $evidence; it and the boots after it are NOT CHECKED (log: $out/linux_boot.log)"
    printf '[SVM host] [svm-tier] linux_boot%s and the boots after it: STALLED, the nested guest spinning with interrupts off (issue 32, open): %s\n' \
      "${hung_test:+::$hung_test}" "$evidence" >>"$VPMU_NOT_CHECKED_LOG"
    rc=0
  else
    say "linux_boot hung, and not in the known stall: ${evidence:-no monitor samples}"
  fi
fi
if [ -s "$inner_log" ]; then
  sed 's/^/[SVM host] /' "$inner_log" >>"$VPMU_NOT_CHECKED_LOG"
fi
say "done in $((SECONDS - t0)) s, exit $rc"
exit "$rc"
