# vPMU guest experiments (busybox sh library): sourced by /init as /etc/vpmu/experiments.sh, and
# by host-side checks (guest-image/check-initramfs.sh) that run it in a chroot with a file in
# place of the serial port.
#
# vpmu_run_experiments LIST [MODES]
#   LIST: comma-separated experiments, or `all` (= perf-stat,perf-record,perf-record-io,ocount,operf,vector-regs,lib-chain):
#     perf-stat    perf stat -e $VPMU_STAT_EVENTS on cpu_split, syscall_heavy, io_heavy (CSV)
#     perf-record  perf record -e $VPMU_EVENT on cpu_split + perf report --stdio
#     perf-record-io  the same on io_heavy
#     ocount       ocount (the CPU's default event) on cpu_split; ophelp's view of the CPU
#     operf        operf on cpu_split + opreport (images) + opreport -l (symbols of cpu_split)
#     vector-regs  vector_regs (does the kernel keep each process's ymm registers?) beside a
#                  loop of busybox pipelines: exits 1 if a register changed
#     lib-chain    lib_chain on its own (no profiler in the guest): work two shared libraries
#                  deep, for the host-side profile's call stacks across libraries (--host-profile)
#     workloads    the three workloads on their own, timed (no profiler)
#     compare-perf      for `vpmu-vmm compare --profiler perf`: perf record -a (the whole
#                       system, e.g. the kernel answering the VMM's packets) for $VPMU_SECS s, and
#                       perf record on cpu_split (the CPU-bound control); perf report -n --sort
#                       symbol of each (the control: cpu_split's own symbols)
#     compare-oprofile  the same with operf --system-wide (stopped after $VPMU_SECS s) and operf
#                       on cpu_split; opreport -l of each (the control's: cpu_split's own
#                       symbols, --exclude-dependent)
#     compare-command-perf, compare-command-oprofile
#                       for `vpmu-vmm compare --workload command -- CMD`: as compare-perf and
#                       compare-oprofile, with `sh -c "$VPMU_WORKLOAD"` (CMD) in place of the
#                       packet window
#   MODES: optional comma-separated accounting modes (cpu-switch,domain-switch): the whole LIST
#     runs once per mode, after switching through the vPMU control port (see vpmu_set_mode).
#
# Results go to $VPMU_RESULTS_DEV (default /dev/ttyS1: the VMM's --serial2 FILE) as frames,
# decoded on the host by `vpmu-vmm results FILE --out DIR` (vmm/analysis/src/guest_results.rs):
#
#   VPMU-RESULTS-BEGIN v1 experiments=<LIST> modes=<MODES or ->\n
#   VPMU-FRAME v1 seq=<n> name=<name> mode=<tag> len=<bytes> crc32=<8 hex digits>\n
#   <exactly len bytes of payload>\n
#   VPMU-FRAME-END seq=<n>\n
#   ... (seq counts 0, 1, 2, ... with no gaps)
#   VPMU-RESULTS-END frames=<number of frames>\n
#
# crc32 is zlib's CRC-32 of the payload (busybox crc32). Names: [A-Za-z0-9._/-], no `..`.
# The mode tag is what the vPMU control port reads back (cpu-switch, domain-switch), or `-` when
# there is no port (vPMU off, or another VMM). Every command's exit status goes into the
# `<experiment>/status.txt` frame, so a failed step is a visible result, not a missing one.

VPMU_RESULTS_DEV=${VPMU_RESULTS_DEV:-/dev/ttyS1}
VPMU_PORT_DEV=${VPMU_PORT_DEV:-/dev/port}
VPMU_WORK=${VPMU_WORK:-/tmp/vpmu}
VPMU_EVENT=${VPMU_EVENT:-cycles}
VPMU_STAT_EVENTS=${VPMU_STAT_EVENTS:-cycles,instructions,task-clock}
VPMU_ROUNDS=${VPMU_ROUNDS:-200}
VPMU_SECS=${VPMU_SECS:-30}
# Sizes that fit a host whose KVM emulates guest kernel code (kvm_pvm: each guest kernel entry
# costs ~1000x, the emulated PMI handler ~2-3 ms; docs/guest.md, "Sizes and periods") and still
# mean something on a VT-x/SVM host:
#   VPMU_PERIOD: fixed sampling period (events) for perf record -c and operf EVENT:PERIOD. With
#     perf's default frequency mode the guest kernel throttles itself to 100 Hz (its PMI handler
#     is slow) and nearly every sample lands in tick code. The period must also be well above
#     the cycles the emulated PMI handler itself takes (it counts too): 2-3 ms on an idle host,
#     ~37 ms wall on a busy one, where 50M cycles (~19 ms) made the guest sample its own handler
#     (perf record -a of `sleep 20` took 436 s). 200M cycles is ~13 samples/s at 2.6 GHz.
#   VPMU_PROFILE_ROUNDS: cpu_split rounds for the sampled runs (perf record, operf): ~11.7M
#     cycles a round, so ~350 samples at 200M, ~260 of them in cpu_split's own code (the rest is
#     the emulated timer tick); ~2 min of guest time here.
#   VPMU_CONTROL_PERIOD: the sampling period of the CPU-bound control of `compare --profiler`
#     (cpu_split, compare passes 4000 rounds). 50M cycles (~19 ms) leaves the emulated PMI
#     handler (2-3 ms, ~6-8M cycles; a few times that on a busy host) well inside the period
#     while user code runs, and gives the control ~900 samples of cpu_split, so its sampling
#     noise (3 sd) is ~6 pp instead of the ~24 pp of the 60 samples 1000 rounds at 200M gave
#     (issue 31). Each sample costs the guest's profiler ~0.1 s of emulated kernel work here
#     (its ring buffer, its writes), so more samples cost minutes. The system-wide profiles keep
#     VPMU_PERIOD: an idle guest's emulated ticks are kernel code that a shorter period samples
#     over and over.
#   VPMU_SYSCALL_ITERS: syscall_heavy iterations (1M took ~1000 s here on an idle host; 20000
#     took 139 s under perf stat on a busy one: each relayed SYSCALL costs ~0.5-3 ms of emulated
#     kernel code).
#   VPMU_IO_ARGS: io_heavy's arguments: `all 4` = 4 MiB through a file and from /dev/zero, 4 port
#     writes (`all`, 32 MiB each and 100000 writes, took 755 s here under perf stat).
#   VPMU_OP_EVENT: OProfile's name of the cycles event (the same on the Intel and AMD models).
#   VPMU_VECTOR_ITERS: vector_regs checks (each after a sched_yield) beside a loop of busybox
#     pipelines; 2000 take about a minute here.
VPMU_PERIOD=${VPMU_PERIOD:-200000000}
VPMU_PROFILE_ROUNDS=${VPMU_PROFILE_ROUNDS:-6000}
VPMU_CONTROL_PERIOD=${VPMU_CONTROL_PERIOD:-50000000}
VPMU_SYSCALL_ITERS=${VPMU_SYSCALL_ITERS:-5000}
VPMU_IO_ARGS=${VPMU_IO_ARGS:-all 4}
VPMU_OP_EVENT=${VPMU_OP_EVENT:-CPU_CLK_UNHALTED}
VPMU_VECTOR_ITERS=${VPMU_VECTOR_ITERS:-2000}
#   VPMU_CHAIN_ROUNDS: lib_chain rounds (1M loop iterations each, ~1 ms natively; user code runs
#     natively on every host, so ~1000 host-side samples at 1 kHz).
VPMU_CHAIN_ROUNDS=${VPMU_CHAIN_ROUNDS:-1000}
VPMU_MODE_TAG=-
VPMU_SEQ=0
VPMU_ALL_EXPERIMENTS=perf-stat,perf-record,perf-record-io,ocount,operf,vector-regs,lib-chain,perf-user-read

# --- Frames -----------------------------------------------------------------------------------

# vpmu_results_open: fd 3 = the results port, in raw mode (no \n -> \r\n, no echo) if a tty.
vpmu_results_open() {
	exec 3>"$VPMU_RESULTS_DEV" || return 1
	if [ -c "$VPMU_RESULTS_DEV" ]; then
		stty -F "$VPMU_RESULTS_DEV" raw -echo 115200 2>/dev/null
	fi
	return 0
}

# vpmu_results_close: wait until the UART has sent everything (tcsetattr(TCSADRAIN) in stty),
# then close fd 3.
vpmu_results_close() {
	if [ -c "$VPMU_RESULTS_DEV" ]; then
		stty -F "$VPMU_RESULTS_DEV" raw 2>/dev/null
	fi
	exec 3>&-
}

# vpmu_frame NAME FILE: send the regular file FILE as one frame (a missing FILE is sent as an
# empty payload, so the host still sees the name).
vpmu_frame() {
	local name=$1 file=$2 len crc
	[ -f "$file" ] || file=/dev/null
	len=$(stat -c %s "$file")
	crc=$(crc32 "$file")
	crc=${crc%% *}
	printf 'VPMU-FRAME v1 seq=%d name=%s mode=%s len=%d crc32=%s\n' \
		"$VPMU_SEQ" "$name" "$VPMU_MODE_TAG" "$len" "$crc" >&3
	cat "$file" >&3
	printf '\nVPMU-FRAME-END seq=%d\n' "$VPMU_SEQ" >&3
	VPMU_SEQ=$((VPMU_SEQ + 1))
}

# vpmu_frame_text NAME TEXT: send TEXT (plus a newline) as one frame.
vpmu_frame_text() {
	local f="$VPMU_WORK/.frame-text"
	mkdir -p "$VPMU_WORK"
	printf '%s\n' "$2" >"$f"
	vpmu_frame "$1" "$f"
	rm -f "$f"
}

# --- Steps ------------------------------------------------------------------------------------

# vpmu_step EXP FILE CMD...: run CMD (stdout+stderr to $dir/FILE), note its exit status and
# wall time in $dir/status.txt (`exit=RC<TAB>secs=S<TAB>log=FILE<TAB>CMD`: the VMM shows the end
# of FILE when the step failed), send FILE as frame EXP/FILE, print one line on the console.
vpmu_step() {
	local exp=$1 file=$2 rc t0 t1
	shift 2
	t0=$(date +%s)
	(cd "$dir" && "$@") >"$dir/$file" 2>&1
	rc=$?
	t1=$(date +%s)
	printf 'exit=%d\tsecs=%d\tlog=%s\t%s\n' "$rc" "$((t1 - t0))" "$file" "$*" >>"$dir/status.txt"
	echo "vpmu: [$VPMU_MODE_TAG] $exp: $* -> exit $rc ($((t1 - t0)) s)"
	vpmu_frame "$exp/$file" "$dir/$file"
	return "$rc"
}

# cpu_split runs under perf stat inside `sh -c "$VPMU_STEAL_WRAP"`, which reads the guest's
# /proc/stat cpu line (a shell builtin, no extra process) just before and after it: the difference
# of its steal column is the time the host kept the vCPU from running, which the guest's
# task-clock counts and no cycle does (docs/guest.md, "cycles / task-clock"). Sent as
# perf-stat/cpu_split.proc-stat.
VPMU_STEAL_WRAP='read -r a </proc/stat; "$@"; rc=$?; read -r b </proc/stat; printf "%s\n%s\n" "$a" "$b" >"$VPMU_PROC_STAT"; exit $rc'
exp_perf_stat() {
	local w
	for w in "cpu_split $VPMU_ROUNDS" "syscall_heavy $VPMU_SYSCALL_ITERS" "io_heavy $VPMU_IO_ARGS"; do
		set -- $w
		if [ "$1" = cpu_split ]; then
			export VPMU_PROC_STAT="$dir/$1.proc-stat"
			vpmu_step perf-stat "$1.log" perf stat -x, -e "$VPMU_STAT_EVENTS" -o "$dir/$1.csv" -- \
				sh -c "$VPMU_STEAL_WRAP" sh "$@"
			vpmu_frame "perf-stat/$1.proc-stat" "$VPMU_PROC_STAT"
		else
			vpmu_step perf-stat "$1.log" perf stat -x, -e "$VPMU_STAT_EVENTS" -o "$dir/$1.csv" -- "$@"
		fi
		vpmu_frame "perf-stat/$1.csv" "$dir/$1.csv"
	done
}

exp_perf_record() {
	vpmu_step perf-record record-cpu_split.log \
		perf record -N -e "$VPMU_EVENT" -c "$VPMU_PERIOD" -o "$dir/cpu_split.data" -- \
		cpu_split "$VPMU_PROFILE_ROUNDS"
	vpmu_step perf-record report-cpu_split.txt \
		perf report -i "$dir/cpu_split.data" --stdio --sort comm,dso,symbol
	# Only cpu_split's own functions, as shares of cpu_split's samples (with their sample counts,
	# which say how close to 75% hot_75 can be expected to come).
	vpmu_step perf-record report-cpu_split-symbols.txt \
		perf report -i "$dir/cpu_split.data" --stdio -n --sort symbol --dsos cpu_split \
		--percentage relative
}

exp_perf_record_io() {
	vpmu_step perf-record-io record-io_heavy.log \
		perf record -N -e "$VPMU_EVENT" -c "$VPMU_PERIOD" -o "$dir/io_heavy.data" -- io_heavy $VPMU_IO_ARGS
	vpmu_step perf-record-io report-io_heavy.txt \
		perf report -i "$dir/io_heavy.data" --stdio --sort comm,dso,symbol
}

exp_ocount() {
	vpmu_step ocount ophelp-default.txt ophelp -r -d
	vpmu_step ocount ocount-cpu_split.log ocount -f "$dir/ocount-cpu_split.txt" cpu_split "$VPMU_ROUNDS"
	vpmu_frame ocount/ocount-cpu_split.txt "$dir/ocount-cpu_split.txt"
}

exp_operf() {
	mkdir -p "$dir/oprofile_data"
	vpmu_step operf operf-cpu_split.log operf -e "$VPMU_OP_EVENT:$VPMU_PERIOD" \
		-d "$dir/oprofile_data" cpu_split "$VPMU_PROFILE_ROUNDS"
	vpmu_step operf opreport.txt opreport --session-dir="$dir/oprofile_data"
	vpmu_step operf opreport-symbols.txt opreport -l --session-dir="$dir/oprofile_data" \
		image:/usr/bin/cpu_split
	vpmu_frame operf/operf.log "$dir/oprofile_data/samples/operf.log"
}

# The two reports `vpmu-vmm compare --profiler` reads (vmm/src/compare/in_guest.rs): the
# system-wide profile while the host drives the workload (packets), and the CPU-bound control.
# The VMM holds its packets until the guest opens the packet gate (vpmu_packets): perf record -a
# profiles `sh -c "$VPMU_PACKET_WINDOW" sh SECS`, which opens it for SECS seconds, so the packets
# arrive while perf records, not during its start-up, its report or the control.
VPMU_PACKET_WINDOW='. /etc/vpmu/experiments.sh && vpmu_packets on; sleep "$1"; rc=$?; vpmu_packets off; exit $rc'
exp_compare_perf() {
	vpmu_step compare-perf record-system.log \
		perf record -a -N -e "$VPMU_EVENT" -c "$VPMU_PERIOD" -o "$dir/system.data" -- \
		sh -c "$VPMU_PACKET_WINDOW" sh "$VPMU_SECS"
	vpmu_window_interrupts compare-perf
	vpmu_step compare-perf report-system.txt \
		perf report -i "$dir/system.data" --stdio -n --sort symbol
	vpmu_step compare-perf record-control.log \
		perf record -N -e "$VPMU_EVENT" -c "$VPMU_CONTROL_PERIOD" -o "$dir/control.data" -- \
		cpu_split "$VPMU_PROFILE_ROUNDS"
	# The control is cpu_split's own code (hot_75, cold_25): what the VMM does for the packets that
	# arrive meanwhile is not part of it.
	vpmu_step compare-perf report-control.txt \
		perf report -i "$dir/control.data" --stdio -n --sort symbol --dsos cpu_split
}

# vpmu_operf_system_wide DIR CMD...: `operf --system-wide -d DIR` while CMD runs (the packet
# window, or the user's workload). operf runs until SIGINT, and where guest kernel code is
# emulated its start-up alone takes longer than a window of seconds (a plain
# `timeout -s INT 20 operf ...` killed it before it profiled anything, exit 130): CMD starts at
# its "Press Ctl-c" line, then SIGINT stops it as a user at the console would. Prints operf's
# output; returns its exit status (an operf that died during its start-up fails its step:
# nothing runs a step twice).
#
# While operf starts, no process may start or exit in the guest: OProfile 1.4's system-wide
# start-up reads /proc/PID/status and then /proc/PID/task of every process, and a process that
# exits in between makes it give up ("Unexpected error in operf_record setup", operf exit 2;
# libperf_events/operf_utils.cpp, _get_one_process_info). A CI run lost its domain-switch phase
# to that when this function polled the log with `grep` and `sleep` once a second. So operf's
# output comes through a FIFO that the shell reads with its own `read` (no child process) until
# the ready line; only then does `cat` take over the rest.
vpmu_operf_system_wide() {
	local d=$1 log="$1.out" fifo="$1.fifo" pid rc line ready=0 drain
	shift
	rm -f "$fifo" "$log"
	mkfifo "$fifo" || return 1
	operf --system-wide -e "$VPMU_OP_EVENT:$VPMU_PERIOD" -d "$d" >"$fifo" 2>&1 &
	pid=$!
	exec 3<"$fifo"
	# At most 20 minutes for the start-up; EOF if operf died first.
	while IFS= read -r -t 1200 line <&3; do
		printf '%s\n' "$line" >>"$log"
		case $line in *'Press Ctl-c'*)
			ready=1
			break
			;;
		esac
	done
	cat <&3 >>"$log" &
	drain=$!
	exec 3<&-
	if [ "$ready" = 1 ]; then
		echo "vpmu: operf ready; profiling: $*"
		"$@"
		kill -INT "$pid" 2>/dev/null
	else
		kill -INT "$pid" 2>/dev/null
	fi
	wait "$pid"
	rc=$?
	wait "$drain"
	rm -f "$fifo"
	cat "$log"
	return "$rc"
}

# vpmu_operf_diagnostics EXP DIR: send operf's own log of session DIR (lost and throttled
# samples, the records it could not attribute) and its per-event statistics as frames
# EXP/operf-internal.log and EXP/operf-stats.txt: what the system-wide profile kept is only read
# with them (docs/guest.md, "OProfile's domain-switch window").
vpmu_operf_diagnostics() {
	vpmu_frame "$1/operf-internal.log" "$2/samples/operf.log"
	vpmu_frame_text "$1/operf-stats.txt" "$(cd "$2/samples/current/stats" 2>/dev/null && grep -r . .)"
}

exp_compare_oprofile() {
	mkdir -p "$dir/op_system" "$dir/op_control"
	vpmu_step compare-oprofile operf-system.log \
		vpmu_operf_system_wide "$dir/op_system" vpmu_packet_window "$VPMU_SECS"
	vpmu_window_interrupts compare-oprofile
	vpmu_step compare-oprofile report-system.txt opreport -l --session-dir="$dir/op_system"
	vpmu_operf_diagnostics compare-oprofile "$dir/op_system"
	vpmu_step compare-oprofile operf-control.log \
		operf -e "$VPMU_OP_EVENT:$VPMU_CONTROL_PERIOD" -d "$dir/op_control" cpu_split "$VPMU_PROFILE_ROUNDS"
	# --exclude-dependent: cpu_split's own symbols only (its kernel samples are an image of their
	# own, kallsyms, which opreport would list with it), as perf report --dsos cpu_split does.
	vpmu_step compare-oprofile report-control.txt opreport -l --exclude-dependent \
		--session-dir="$dir/op_control" image:/usr/bin/cpu_split
}

# vpmu_packet_window SECS: the VMM's packets flow for SECS seconds (the packet gate open).
vpmu_packet_window() {
	local rc
	vpmu_packets on
	sleep "$1"
	rc=$?
	vpmu_packets off
	return "$rc"
}

# `vpmu-vmm compare --workload command -- CMD` (vmm/src/compare/in_guest.rs): the user's command
# ($VPMU_WORKLOAD, run by `sh -c`) profiled system-wide, so the kernel's work for it (its disk
# and network interrupts, wherever they land) is in the profile, then the CPU-bound control as
# compare-perf / compare-oprofile have it. The same report names as those, under its own
# experiment name.
exp_compare_command_perf() {
	vpmu_step compare-command-perf record-system.log \
		perf record -a -N -e "$VPMU_EVENT" -c "$VPMU_PERIOD" -o "$dir/system.data" -- \
		sh -c "$VPMU_WORKLOAD"
	vpmu_step compare-command-perf report-system.txt \
		perf report -i "$dir/system.data" --stdio -n --sort symbol
	vpmu_step compare-command-perf record-control.log \
		perf record -N -e "$VPMU_EVENT" -c "$VPMU_CONTROL_PERIOD" -o "$dir/control.data" -- \
		cpu_split "$VPMU_PROFILE_ROUNDS"
	vpmu_step compare-command-perf report-control.txt \
		perf report -i "$dir/control.data" --stdio -n --sort symbol --dsos cpu_split
}

exp_compare_command_oprofile() {
	mkdir -p "$dir/op_system" "$dir/op_control"
	vpmu_step compare-command-oprofile operf-system.log \
		vpmu_operf_system_wide "$dir/op_system" sh -c "$VPMU_WORKLOAD"
	vpmu_step compare-command-oprofile report-system.txt opreport -l --session-dir="$dir/op_system"
	vpmu_operf_diagnostics compare-command-oprofile "$dir/op_system"
	vpmu_step compare-command-oprofile operf-control.log \
		operf -e "$VPMU_OP_EVENT:$VPMU_CONTROL_PERIOD" -d "$dir/op_control" cpu_split "$VPMU_PROFILE_ROUNDS"
	vpmu_step compare-command-oprofile report-control.txt opreport -l --exclude-dependent \
		--session-dir="$dir/op_control" image:/usr/bin/cpu_split
}

# Does the kernel keep each process's vector registers across task switches? vector_regs checks
# ymm1's upper half and ymm16 after each sched_yield while a loop of busybox pipelines (glibc's
# string functions in every process) takes turns with it on the CPU; it exits 1 if one changed.
# On hosts that emulate guest kernel code this holds only because /init keeps glibc off AVX
# (docs/guest.md, "AVX state").
exp_vector_regs() {
	local loop
	(while :; do x=$(echo x | tr x y); done) >/dev/null 2>&1 &
	loop=$!
	vpmu_step vector-regs vector_regs.txt vector_regs "$VPMU_VECTOR_ITERS"
	kill "$loop" 2>/dev/null
	wait "$loop" 2>/dev/null
}

exp_lib_chain() {
	vpmu_step lib-chain lib_chain.txt lib_chain "$VPMU_CHAIN_ROUNDS"
}

# A process reading its own counter with RDPMC through the perf mmap page (as PAPI and other
# self-monitoring tools do): perf's own test of it, after the PMU's sysfs switch that allows it
# (1: for processes with an event mmap'd). The VMM serves those user-space RDPMCs through its
# #GP trap (docs/vpmu.md, "RDPMC"). Five runs: the test wants each of five doubling loops to
# count more than the one before, and where guest kernel code is emulated a timer tick inside
# one of the short loops (milliseconds there) can make it fail without anything being wrong.
exp_perf_user_read() {
	vpmu_step perf-user-read rdpmc-sysfs.txt cat /sys/bus/event_source/devices/cpu/rdpmc
	vpmu_step perf-user-read perf-test.txt sh -c \
		'for i in 1 2 3 4 5; do perf test -v "User space counter reading of cycles" 2>&1; echo "perf test exit=$?"; done'
}

exp_workloads() {
	vpmu_step workloads cpu_split.txt time cpu_split "$VPMU_ROUNDS"
	vpmu_step workloads syscall_heavy.txt time syscall_heavy "$VPMU_SYSCALL_ITERS"
	vpmu_step workloads io_heavy.txt time io_heavy $VPMU_IO_ARGS
}

# vpmu_run_one EXP: one experiment in its own work directory; its status frame last.
vpmu_run_one() {
	local exp=$1 dir
	dir=$VPMU_WORK/${VPMU_MODE_TAG#-}/$exp
	dir=$(echo "$dir" | sed 's://*:/:g')
	mkdir -p "$dir"
	: >"$dir/status.txt"
	case "$exp" in
	perf-stat) exp_perf_stat ;;
	perf-record) exp_perf_record ;;
	perf-record-io) exp_perf_record_io ;;
	ocount) exp_ocount ;;
	operf) exp_operf ;;
	vector-regs) exp_vector_regs ;;
	lib-chain) exp_lib_chain ;;
	perf-user-read) exp_perf_user_read ;;
	workloads) exp_workloads ;;
	compare-perf) exp_compare_perf ;;
	compare-oprofile) exp_compare_oprofile ;;
	compare-command-perf) exp_compare_command_perf ;;
	compare-command-oprofile) exp_compare_command_oprofile ;;
	*)
		echo "vpmu: unknown experiment '$exp' (known: $VPMU_ALL_EXPERIMENTS,workloads,compare-perf,compare-oprofile,compare-command-perf,compare-command-oprofile,all)"
		printf 'unknown experiment\n' >"$dir/status.txt"
		;;
	esac
	vpmu_frame "$exp/status.txt" "$dir/status.txt"
}

# --- Accounting modes ---------------------------------------------------------------------------
# HOOK (issue 4, guest-side mode switch): the VMM's vPMU control port 0x511
# (vmm/runtime/src/devices/vpmu_control.rs): write 1 = cpu-switch, 2 = domain-switch; a read returns the
# mode being counted in (1 or 2). There only with the vPMU on; an unclaimed port reads 0xff.
# Reached through /dev/port (kernel CONFIG_DEVPORT); VPMU_PORT_DEV replaces it in host checks.
VPMU_CONTROL_PORT=1297 # 0x511

# vpmu_mode_code MODE: the control port's byte for MODE.
vpmu_mode_code() {
	case "$1" in
	cpu-switch) echo 1 ;;
	domain-switch) echo 2 ;;
	*) return 1 ;;
	esac
}

# vpmu_port_put PORT CODE: write the byte CODE (0-7) to I/O port PORT.
vpmu_port_put() {
	printf "\\$2" | dd of="$VPMU_PORT_DEV" bs=1 seek="$1" count=1 conv=notrunc 2>/dev/null
}

# vpmu_port_get PORT: the byte at I/O port PORT, in decimal (empty if dd failed).
vpmu_port_get() {
	dd if="$VPMU_PORT_DEV" bs=1 skip="$1" count=1 2>/dev/null | od -An -tu1 | tr -d ' \n'
}

# vpmu_read_mode: the mode the port reports (cpu-switch, domain-switch), or `-`.
vpmu_read_mode() {
	[ -e "$VPMU_PORT_DEV" ] || { echo -; return 0; }
	case "$(vpmu_port_get "$VPMU_CONTROL_PORT")" in
	1) echo cpu-switch ;;
	2) echo domain-switch ;;
	*) echo - ;;
	esac
}

# vpmu_set_mode MODE: ask the VMM to count in MODE; fails unless the port then reports MODE.
vpmu_set_mode() {
	local code
	code=$(vpmu_mode_code "$1") || return 2
	# (dd would create a missing device as a plain file, and then read our own byte back.)
	[ -e "$VPMU_PORT_DEV" ] || return 1
	vpmu_port_put "$VPMU_CONTROL_PORT" "$code" && [ "$(vpmu_read_mode)" = "$1" ]
}
# --- end of HOOK ----------------------------------------------------------------------------------

# --- The VMM's packets --------------------------------------------------------------------------
# The packet gate port 0x512 (vmm/runtime/src/devices/packet_gate.rs): write 1 = the VMM sends its echo
# requests, 0 = it holds them; a read returns 1 or 0. There only when the VMM starts its packets
# gated (`vpmu-vmm compare --profiler`); elsewhere the port reads 0xff and the packets, if any,
# arrive all the time.
VPMU_PACKET_PORT=1298 # 0x512

# vpmu_packets on|off: open or close the gate, and say what the port then reports. Never fails:
# without the port the packets are simply not gated.
vpmu_packets() {
	local code=0 b
	[ "$1" = on ] && code=1
	[ -e "$VPMU_PORT_DEV" ] || return 0
	# The guest's interrupt counts (its PMIs and the card's interrupts among them) as the gate
	# opens and closes: what the window's profile could have sampled (vpmu_window_interrupts).
	{
		echo "# packet gate $1"
		cat /proc/interrupts
	} >>"$VPMU_WORK/window-interrupts.txt" 2>/dev/null
	vpmu_port_put "$VPMU_PACKET_PORT" "$code"
	b=$(vpmu_port_get "$VPMU_PACKET_PORT")
	case "$b" in
	0) echo "vpmu: packet gate closed: the VMM holds its echo requests" ;;
	1) echo "vpmu: packet gate open: the VMM sends its echo requests" ;;
	*) echo "vpmu: no packet gate port (read '$b'): the VMM's packets, if any, are not gated" ;;
	esac
	return 0
}

# vpmu_window_interrupts EXP: send the interrupt counts vpmu_packets took at the gate's last
# opening and closing as frame EXP/window-interrupts.txt, and start a new file.
vpmu_window_interrupts() {
	vpmu_frame "$1/window-interrupts.txt" "$VPMU_WORK/window-interrupts.txt"
	rm -f "$VPMU_WORK/window-interrupts.txt"
}

vpmu_run_list() {
	local exp
	for exp in $(echo "$1" | tr ',' ' '); do
		vpmu_run_one "$exp"
	done
}

# vpmu_run_experiments LIST [MODES]: see the top of this file.
vpmu_run_experiments() {
	local list=$1 modes=${2:-} mode
	[ "$list" = all ] && list=$VPMU_ALL_EXPERIMENTS
	export HOME=${HOME:-/root} PATH=${PATH:-/usr/bin:/bin:/usr/sbin:/sbin}
	# Never a pager on the console (perf report would wait for a key).
	export PAGER=cat PERF_PAGER=cat
	mkdir -p "$VPMU_WORK"
	if ! vpmu_results_open; then
		echo "vpmu: cannot open $VPMU_RESULTS_DEV: no results can be sent"
		return 1
	fi
	printf 'VPMU-RESULTS-BEGIN v1 experiments=%s modes=%s\n' "$list" "${modes:--}" >&3
	VPMU_MODE_TAG=-
	cat /proc/cmdline >"$VPMU_WORK/cmdline.txt" 2>&1
	vpmu_frame system/cmdline "$VPMU_WORK/cmdline.txt"
	if [ -z "$modes" ]; then
		VPMU_MODE_TAG=$(vpmu_read_mode)
		vpmu_run_list "$list"
	else
		for mode in $(echo "$modes" | tr ',' ' '); do
			if vpmu_set_mode "$mode"; then
				VPMU_MODE_TAG=$mode
				vpmu_run_list "$list"
			else
				VPMU_MODE_TAG=-
				echo "vpmu: cannot switch to $mode through port 0x511 (reads '$(vpmu_read_mode)'); skipped"
				vpmu_frame_text "mode-switch-failed/$mode" \
					"could not switch to $mode: the control port reads '$(vpmu_read_mode)'"
			fi
		done
	fi
	VPMU_MODE_TAG=-
	dmesg >"$VPMU_WORK/dmesg.txt" 2>&1
	vpmu_frame system/dmesg.txt "$VPMU_WORK/dmesg.txt"
	printf 'VPMU-RESULTS-END frames=%d\n' "$VPMU_SEQ" >&3
	vpmu_results_close
	echo "vpmu: sent $VPMU_SEQ result frames to $VPMU_RESULTS_DEV"
}
