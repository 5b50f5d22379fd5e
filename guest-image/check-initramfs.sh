#!/usr/bin/env bash
# Checks the default initramfs ON THE HOST, for machines where guest user space cannot run
# (shared/HOST-FACTS.md): what is in it, that every program finds its libraries, that the
# programs start (chroot into the unpacked tree), and that /init's experiments produce result
# frames the host decodes. The experiments use perf SOFTWARE events here (cpu-clock, task-clock),
# because the host has no PMU; in a guest they use cycles on the vPMU.
#
# Usage: guest-image/check-initramfs.sh [CPIO] [VPMU_VMM]
#   CPIO      default: the INITRAMFS of `guest-image/build.sh paths`
#   VPMU_VMM  default: target/release/vpmu-vmm (for `vpmu-vmm results`)
# Needs root for the chroot (and mounts proc, sysfs, /dev inside the unpacked tree for the run).
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
say() { printf '[check-initramfs] %s\n' "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }

CPIO=${1:-}
if [ -z "$CPIO" ]; then
	eval "$("$HERE/build.sh" paths)"
	CPIO=${INITRAMFS:-}
fi
[ -f "$CPIO" ] || die "no initramfs (build it: guest-image/build.sh initramfs)"
VMM=${2:-$HERE/../target/release/vpmu-vmm}
[ -x "$VMM" ] || die "$VMM not found: cargo build --release"
[ "$(id -u)" = 0 ] || die "needs root (chroot, mounts)"

ROOT=$(mktemp -d /tmp/vpmu-initramfs-XXXXXX)
cleanup() {
	for m in dev sys proc; do mountpoint -q "$ROOT/$m" && umount "$ROOT/$m"; done
	rm -rf "$ROOT"
}
trap cleanup EXIT

size=$(stat -c %s "$CPIO")
say "$CPIO: $((size / 1048576)) MB ($size bytes)"
[ "$size" -le $((60 * 1048576)) ] || die "more than 60 MB"
(cd "$ROOT" && cpio -idm --quiet) <"$CPIO"

# Every program: static, or each DT_NEEDED library is in the tree (what ldd would say).
PROGRAMS=(bin/busybox usr/bin/perf usr/bin/operf usr/bin/ocount usr/bin/opreport usr/bin/ophelp
	usr/bin/cpu_split usr/bin/syscall_heavy usr/bin/io_heavy usr/bin/vector_regs usr/bin/lib_chain)
for p in "${PROGRAMS[@]}"; do
	[ -x "$ROOT/$p" ] || die "/$p missing"
	interp=$(readelf -l "$ROOT/$p" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
	if [ -z "$interp" ]; then
		say "/$p: static"
		continue
	fi
	[ -e "$ROOT$interp" ] || die "/$p: interpreter $interp missing"
	n=0
	todo=("$ROOT/$p")
	declare -A seen=()
	while [ ${#todo[@]} -gt 0 ]; do
		f=${todo[0]}
		todo=("${todo[@]:1}")
		for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
			[ -n "${seen[$lib]:-}" ] && continue
			seen[$lib]=1
			[ -f "$ROOT/lib/x86_64-linux-gnu/$lib" ] || die "/$p needs $lib, not in the image"
			todo+=("$ROOT/lib/x86_64-linux-gnu/$lib")
			n=$((n + 1))
		done
	done
	unset seen
	say "/$p: dynamic, interpreter $interp, all $n libraries present"
done
[ -d "$ROOT/usr/share/oprofile" ] || die "/usr/share/oprofile (event files) missing"
say "OProfile event files: $(find "$ROOT/usr/share/oprofile" -type f | wc -l) files"
for w in cpu_split syscall_heavy io_heavy vector_regs; do
	nm "$ROOT/usr/bin/$w" | grep ' main$' >/dev/null || die "$w has no symbols"
done
nm "$ROOT/usr/bin/cpu_split" | grep ' T hot_75$' >/dev/null || die "cpu_split: no hot_75 symbol"
nm "$ROOT/lib/x86_64-linux-gnu/libchain_b.so" | grep ' T b_spin$' >/dev/null || die "libchain_b.so: no b_spin symbol"

# The programs start (chroot: the image's own ld.so and libraries, nothing from the host).
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/bin:/bin:/usr/sbin:/sbin HOME=/root "$@"; }
say "chroot: $(in_root perf --version)"
say "chroot: $(in_root opreport --version | head -n 1)"
say "chroot: $(in_root ophelp --version | head -n 1)"
out=$(in_root ocount --help 2>&1 || true)
say "chroot: ocount --help: $out"
case "$out" in *"not found"* | *"error while loading"*) die "ocount does not start" ;; esac
say "chroot: $(in_root cpu_split 20)"
say "chroot: $(in_root lib_chain 20)"
say "chroot: $(in_root syscall_heavy 1000)"
say "chroot: $(in_root io_heavy file 1 | tr '\n' ' ')"

# /init's experiments, as in the guest but with software events, both modes through a file that
# stands in for /dev/port's control-port byte; results to a file instead of ttyS1.
mount -t proc proc "$ROOT/proc"
mount -t sysfs sysfs "$ROOT/sys"
mount --bind /dev "$ROOT/dev"
dd if=/dev/zero of="$ROOT/tmp/port" bs=1 count=2048 status=none
say "running the experiments (all, cpu-switch,domain-switch) with cpu-clock/task-clock, a 1 ms period..."
in_root VPMU_RESULTS_DEV=/tmp/results.bin VPMU_PORT_DEV=/tmp/port VPMU_EVENT=cpu-clock \
	VPMU_STAT_EVENTS=task-clock,cpu-clock VPMU_ROUNDS=${VPMU_ROUNDS:-100} \
	VPMU_PERIOD=1000000 VPMU_PROFILE_ROUNDS=1000 \
	sh -c '. /etc/vpmu/experiments.sh; vpmu_run_experiments all cpu-switch,domain-switch' >&2
OUT=$ROOT/decoded
"$VMM" results "$ROOT/tmp/results.bin" --out "$OUT" | tail -n 1 >&2 || die "result stream incomplete"
for mode in cpu-switch domain-switch; do
	r=$OUT/$mode/perf-record/report-cpu_split-symbols.txt
	[ -f "$r" ] || die "$mode: no perf report"
	hot=$(awk '{ for (i = 1; i < NF; i++) if ($i == "[.]" && $(i + 1) == "hot_75") { sub("%", "", $1); print $1 } }' "$r")
	[ -n "$hot" ] || die "$mode: no hot_75 line in the perf report"
	awk -v h="$hot" 'BEGIN { exit !(h >= 73 && h <= 77) }' ||
		die "$mode: hot_75 has $hot% of cpu_split's samples, not 75 +- 2"
	say "$mode: perf report: hot_75 = $hot% of cpu_split's cpu-clock samples (want 75 +- 2)"
	grep -q 'task-clock' "$OUT/$mode/perf-stat/cpu_split.csv" || die "$mode: no perf stat CSV"
	[ "$(grep -c '^cpu ' "$OUT/$mode/perf-stat/cpu_split.proc-stat")" = 2 ] ||
		die "$mode: no /proc/stat lines around cpu_split"
	v=$OUT/$mode/vector-regs
	grep -q $'^exit=0\t.*vector_regs' "$v/status.txt" ||
		die "$mode: vector_regs failed: $(cat "$v/status.txt" "$v/vector_regs.txt")"
	say "$mode: $(tr '\n' ' ' <"$v/vector_regs.txt")"
done
# compare-perf (what `vpmu-vmm compare --profiler perf` boots), the same way: the real perf
# must accept its options and print reports with sample counts.
rm -f "$ROOT/tmp/results.bin"
# A 1 ms period: at the guest's 200M (200 ms of cpu-clock) an idle host's 2 s system-wide profile
# held 0-2 kernel samples, and the check below failed on 1 of 2 quiet runs.
say "running compare-perf (cpu-switch,domain-switch) with cpu-clock, a 1 ms period, 2 s system-wide..."
in_root VPMU_RESULTS_DEV=/tmp/results.bin VPMU_PORT_DEV=/tmp/port VPMU_EVENT=cpu-clock \
	VPMU_SECS=2 VPMU_ROUNDS=${VPMU_ROUNDS:-100} VPMU_PERIOD=1000000 \
	sh -c '. /etc/vpmu/experiments.sh; vpmu_run_experiments compare-perf cpu-switch,domain-switch' >&2
rm -rf "$OUT"
"$VMM" results "$ROOT/tmp/results.bin" --out "$OUT" | tail -n 1 >&2 || die "compare-perf result stream incomplete"
for mode in cpu-switch domain-switch; do
	d=$OUT/$mode/compare-perf
	grep -q $'^exit=[1-9]' "$d/status.txt" && die "$mode: compare-perf steps failed: $(cat "$d/status.txt")"
	n=$(grep -cE '^ +[0-9.]+% +[0-9]+ +\[k\] ' "$d/report-system.txt" || true)
	[ "$n" -gt 0 ] || die "$mode: perf report -n of the system-wide profile has no kernel symbol rows"
	grep -qE '^ +[0-9.]+% +[0-9]+ +\[\.\] hot_75' "$d/report-control.txt" ||
		die "$mode: the control's perf report -n has no hot_75 row"
	# The profiled shell opened and closed the packet gate (/tmp/port stands in for /dev/port).
	grep -q 'packet gate open' "$d/record-system.log" && grep -q 'packet gate closed' "$d/record-system.log" ||
		die "$mode: perf record -a did not open and close the packet gate: $(cat "$d/record-system.log")"
	say "$mode: compare-perf: $n kernel symbols in the system-wide report; hot_75 in the control's"
done
say "OK (operf/ocount need a PMU: here they stop with the message above, in a guest on the vPMU they count)"
