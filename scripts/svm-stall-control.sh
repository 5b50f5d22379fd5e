#!/usr/bin/env bash
# svm-stall-control.sh: is the stall of nested guests on the SVM host (issue 32) vpmu-vmm's doing?
# A control experiment: in one L1 (scripts/svm-host.sh, one CPU), boot the same kernel, initramfs
# and workload on 2 vCPUs under QEMU -accel kvm and under vpmu-vmm --vpmu off, alternating. A boot
# that has not powered off within LIMIT s of the host's wall clock is sampled from QEMU's monitor
# outside L1 and judged by scripts/svm-stall.py (the known stall: a vCPU spinning with IF=0 in a
# lock slow path), then killed. Not part of scripts/test.sh (20-60 min); see docs/guest.md.
#
#   scripts/svm-stall-control.sh [ROUNDS [LIMIT]]      defaults: 3 rounds, 420 s a boot
#
# Output: one RESULT line a boot, then the tally; the consoles and samples stay in the printed
# directory. Exit 0 when every boot ran (whatever it showed), 1 on a setup failure.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
limit=${2:-420}
say() { printf '[svm-stall-control] %s\n' "$*" >&2; }
eval "$(guest-image/build.sh paths)"
cargo build --release --quiet -p vmm --bin vpmu-vmm
out=$(mktemp -d "${TMPDIR:-/tmp}/svm-stall-control.XXXXXX")
say "results in $out"

# The in-L1 runner. The host's wall clock ($out/wall, which svm-host.sh writes) is the
# limit's: L1's own clock crawls while a nested vCPU spins (every PAUSE leaves the emulator's
# translated code).
cat >"$out/run.sh" <<'EOF'
D=$1; ROUNDS=$2; LIMIT=$3; K=$4; I=$5
W='for j in 1 2 3 4; do (i=0; while [ $i -lt 150 ]; do cat /proc/interrupts /proc/stat >/dev/null; i=$((i+1)); done) & done; wait; echo WORKDONE'
CL="console=ttyS0 panic=-1 vpmu.cmd=\"$W\""
wall() { cat "$D/wall" 2>/dev/null || date +%s; }
one() { # NAME CMD...
  name=$1; shift
  log=$D/$name.console
  t0=$(wall)
  "$@" >"$log" 2>&1 </dev/null &
  pid=$!
  while kill -0 $pid 2>/dev/null; do
    if [ $(( $(wall) - t0 )) -gt "$LIMIT" ]; then
      echo "$name" >"$D/sample-request"
      n=0; while [ ! -s "$D/cpu-samples.$name" ] && [ $n -lt 120 ]; do sleep 1; n=$((n+1)); done
      kill -9 $pid; wait $pid 2>/dev/null
      echo "RESULT $name HUNG $(( $(wall) - t0 )) s"
      return
    fi
    sleep 2
  done
  wait $pid; rc=$?
  if grep -q WORKDONE "$log"; then res=DONE; else res=NODONE; fi
  echo "RESULT $name $res rc=$rc $(( $(wall) - t0 )) s"
}
for r in $(seq 1 "$ROUNDS"); do
  one "qemu$r" qemu-system-x86_64 -accel kvm -cpu host -smp 2 -m 512 -nographic -no-reboot \
    -kernel "$K" -initrd "$I" -append "$CL" -monitor none
  one "vmm$r" target/release/vpmu-vmm run --kernel "$K" --initrd "$I" --cpus 2 --memory 512 \
    --vpmu off --cmdline "$CL"
done
EOF
# A stalled boot is seen late: L1's own clock crawls while a nested vCPU spins (a 90-s limit
# took 406 s of wall time to act on).
budget=$((rounds * 2 * (limit + 420) + 300))
scripts/svm-host.sh run --cpus 1 --timeout "$budget" --share "$out" -- \
  sh "$out/run.sh" "$out" "$rounds" "$limit" "$DEFAULT_BZIMAGE" "$INITRAMFS_TINY" | tee "$out/results"
map=$(dirname "$DEFAULT_BZIMAGE")/System.map
for f in "$out"/cpu-samples.*; do
  [ -e "$f" ] || continue
  printf '%s: %s\n' "${f##*.}" "$(python3 scripts/svm-stall.py "$f" "$map" || true)"
done | tee -a "$out/results"
for who in qemu vmm; do
  printf '%s: %s of %s boots hung\n' "$who" "$(grep -c "^RESULT $who[0-9]* HUNG" "$out/results" || true)" \
    "$(grep -c "^RESULT $who[0-9]* " "$out/results" || true)"
done
