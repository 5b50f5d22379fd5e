#!/usr/bin/env bash
# svm-host.sh: a second kind of KVM host for the tests, a real kvm_amd (nested SVM) instead of
# kvm_pvm. L1 = Debian's generic 6.1 kernel booted under QEMU's emulator (TCG, `-cpu max` offers
# SVM, see ../../shared/HOST-FACTS.md "A real kvm_amd"); our binaries run in L1 against its /dev/kvm.
#
#   scripts/svm-host.sh setup        install qemu-system-x86 etc. if missing, fetch the newest
#                                    linux-image-6.1.0-NN-amd64-unsigned, build L1's initramfs
#   scripts/svm-host.sh run [--cpus N] [--memory MiB] [--timeout SECS] [--share DIR]
#                           [--clock icount|host] -- CMD ARGS...
#                                    boot L1 (setup first if needed), run CMD there; exit with its code;
#                                    --share DIR: the host's DIR is writable at DIR in L1 (results);
#                                    --clock: L1's clock (below; default icount)
#
# Design:
# - The host's / is exported read-only into L1 with virtio-9p (multidevs=remap: no inode clashes
#   across mounts). L1 puts an overlayfs on it whose upper layer is a tmpfs, so every host path
#   (target/, ~/.cache/vpmu, /usr/lib, /work/..., the cwd) reads the same, and writes anywhere
#   (/tmp, $TMPDIR, target/tmp) succeed but stay in L1's RAM and vanish at power-off: the host is
#   never written, and no mount list of "directories CMD writes to" needs keeping.
# - A second 9p export, writable, of a fresh host temp dir ($X) carries cmd.sh (the caller's
#   exported environment, cwd and argv, shell-quoted: too big for a kernel command line) in and the
#   exit code out. It appears in L1 at /run/svm-host.
# - CMD's stdout and stderr are pipes (not a terminal) that L1's init copies to ttyS1/ttyS2 (raw
#   mode); QEMU writes those to $X/out and $X/err, and `tail -f` streams them live to our
#   stdout/stderr (byte-exact; ~0.5 MB/s). ttyS0 is L1's console ($X/console.log):
#   init prints "svm-host: STAGE" markers there, turned into progress lines here, and its tail is
#   shown when L1 fails. CMD's stdin is /dev/null.
# - The initramfs holds static busybox and the modules, insmod-ed in dependency order (the .deb has
#   no modules.dep; the order comes from each .ko's modinfo "depends=" at setup time): virtio_pci,
#   9pnet_virtio, 9p, overlay, and kvm-amd (irqbypass kvm ccp kvm-amd).
# - L1's clock (--clock). `icount` (the default): QEMU's `-icount shift=0,sleep=on`, one ns of
#   L1 time per emulated instruction (idle time passes in real time). L1's time, and so every
#   count and timeout of the tests in it, no longer depends on the host's load: with `host` (the
#   emulator's clock is the host's wall clock), a host busy with two spinning loops preempts
#   QEMU for milliseconds at a time and L1 charges that time to whatever it was running (guest
#   counters, the VMM's exit handling, timers), and the hw-over-sim test got 1 sample of ~120
#   and trace_gating (then a ratio of boots) measured 1.06x against its 0.05 tolerance. With icount, four runs beside
#   the same loops counted the same (117 samples each, tracing 1.0000x). Its price: one
#   emulator thread (no multi-threaded TCG), and L1 time runs ~5-8x slower than the wall clock
#   when L1 is busy. Its exits cost what KVM's and the VMM's instructions cost, not the
#   emulator's time to emulate VMRUN and #VMEXIT.
# - QEMU's human monitor listens at $X/monitor while L1 runs (`info registers` shows where L1's
#   CPU is, in L1 or in a nested guest). Just before --timeout runs out, L1's registers are read
#   there three times, a second apart, and printed with the timeout: a RIP that stays put is a
#   CPU spinning, and its address says in what.
#   With --share, CMD may ask for the same: it writes a name to DIR/sample-request, and ten
#   readings a second apart land in DIR/cpu-samples.NAME (scripts/svm-tier.sh, on a hang).
# - With --share, DIR/wall holds the host's wall clock (seconds since the epoch), rewritten each
#   second while L1 runs: limits inside L1 should read it, since L1's own clock (the emulator's
#   instruction count) crawls while L1 is busy, most of all while a nested guest spins.
# - Exit codes: CMD's own; 124 on timeout; 125 when L1 fails (boot, kvm_amd, mounts); 130/143
#   when interrupted (QEMU is killed, $X removed).
# - Cache: ${VPMU_CACHE:-~/.cache/vpmu}/svm-host/<package>_<version>_<hash of this script>/
#   (vmlinuz, l1.cpio); other keys are pruned when a new one is built. apt output: logs/apt.log.
set -euo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cache=${VPMU_CACHE:-$HOME/.cache/vpmu}
log=$cache/logs/apt.log
# Progress goes to stderr, also from `setup`: in `run`, stdout is CMD's alone.
say() { printf '[svm-host] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 125; }
SUDO=()
[ "$(id -u)" = 0 ] || SUDO=(sudo)

# step WHAT CMD...: one line, CMD's output appended to the log; on failure its tail, exit 125.
step() {
  local what=$1 t0=$SECONDS
  shift
  printf '[svm-host] %s... ' "$what" >&2
  printf '\n==== %s: %s\n' "$(date -u '+%F %T')" "$what" >>"$log"
  if "$@" >>"$log" 2>&1; then
    printf 'done (%s s)\n' "$((SECONDS - t0))" >&2
  else
    printf 'FAILED\n' >&2
    tail -n 30 "$log" >&2
    die "$what failed (full log: $log)"
  fi
}

newest_kernel() {
  apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$' 2>/dev/null |
    awk '{print $1}' | sort -V | tail -n 1
}

# Sets $D to the cache directory holding vmlinuz and l1.cpio, building them if missing.
setup() {
  mkdir -p "$(dirname "$log")" "$cache/svm-host"
  local need=() p
  for p in qemu-system-x86 busybox-static cpio; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
  local name
  name=$(newest_kernel)
  if [ ${#need[@]} -gt 0 ] || [ -z "$name" ]; then
    step "apt-get update" "${SUDO[@]}" apt-get update -q
    name=$(newest_kernel)
  fi
  if [ ${#need[@]} -gt 0 ]; then
    step "apt-get install ${need[*]}" "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends "${need[@]}"
  fi
  [ -n "$name" ] || die "no linux-image-6.1.0-NN-amd64-unsigned package in apt's lists"
  local ver key
  ver=$(apt-cache show --no-all-versions "$name" | sed -n 's/^Version: //p' | head -n 1)
  key=${name}_${ver}_$(sha256sum "$self" | cut -c1-12)
  D=$cache/svm-host/$key
  if [ -s "$D/l1.cpio" ] && [ -s "$D/vmlinuz" ]; then say "setup: cached ($D)"; return; fi
  local T
  T=$(mktemp -d "$cache/svm-host/.tmp-XXXXXX")
  step "download $name $ver" bash -c 'cd "$1" && apt-get download "$2=$3"' _ "$T" "$name" "$ver"
  step "unpack $name" dpkg -x "$T"/*.deb "$T/k"
  rm -f "$T"/*.deb
  local kv R
  kv=$(ls "$T/k/lib/modules")
  R=$T/root
  mkdir -p "$R"/{bin,proc,sys,dev,mods,lower,x,rw,newroot} "$T/out"
  cp /bin/busybox "$R/bin/"
  # Module name -> .ko path ('-' and '_' are one in module names), then a depth-first walk of
  # "depends=" from modinfo gives an insmod order.
  declare -A ko=() seen=()
  local f order=()
  while IFS= read -r f; do p=${f##*/}; p=${p%.ko}; ko[${p//-/_}]=$f; done \
    < <(find "$T/k/lib/modules/$kv/kernel" -name '*.ko')
  add() {
    local m=${1//-/_} d
    [ -z "${seen[$m]:-}" ] || return 0
    seen[$m]=1
    [ -n "${ko[$m]:-}" ] || die "module $m not in $name"
    for d in $(tr '\0' '\n' <"${ko[$m]}" | sed -n 's/^depends=//p' | tr ',' ' '); do add "$d"; done
    cp "${ko[$m]}" "$R/mods/$m.ko"
    order+=("$m")
  }
  for p in virtio_pci 9pnet_virtio 9p overlay kvm_amd; do add "$p"; done
  echo "${order[*]}" >"$R/mods/order"
  cat >"$R/init" <<'EOI'
#!/bin/busybox sh
# L1's init: modules, /dev/kvm, host root (9p + overlay) at /newroot, then CMD chrooted there.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
say() { echo "svm-host: $*"; }
# Power off even if no program can run (only shell builtins here); if all else fails, PID 1
# exits: panic=-1 reboots, and -no-reboot turns that into QEMU exiting.
fail() { say "FAIL: $*"; dmesg | tail -n 40; poweroff -f; echo o >/proc/sysrq-trigger; exit 1; }
say "init"
read -r order </mods/order || fail "no /mods/order"
for m in $order; do
  err=$(insmod "/mods/$m.ko" 2>&1) || fail "insmod $m: $err"
done
[ -c /dev/kvm ] || fail "kvm_amd loaded but there is no /dev/kvm"
read -r nested </sys/module/kvm_amd/parameters/nested || fail "kvm_amd is not loaded"
say "kvm-up nested=$nested"
o=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$o,cache=loose,ro" hostroot /lower || fail "mount 9p hostroot"
mount -t 9p -o "$o" svmx /x || fail "mount 9p svmx"
mount -t tmpfs -o mode=755 rw /rw && mkdir /rw/u /rw/w
mount -t overlay -o lowerdir=/lower,upperdir=/rw/u,workdir=/rw/w root /newroot || fail "overlayfs"
cd /newroot || fail "cd /newroot"
mount -t proc proc proc && mount -t sysfs sys sys && mount -t devtmpfs dev dev || fail "proc/sys/dev"
mkdir -p dev/pts dev/shm run/svm-host
mount -t devpts devpts dev/pts; mount -t tmpfs shm dev/shm; mount --bind /x run/svm-host
# --share DIR: the host's DIR, writable, at DIR (its path is in /x/share).
if [ -s /x/share ]; then
  d=$(cat /x/share); mkdir -p /svmshare "/newroot$d"
  mount -t 9p -o "$o" svmshare /svmshare && mount --bind /svmshare "/newroot$d" || fail "mount 9p svmshare"
fi
stty -F /dev/ttyS1 raw -echo && stty -F /dev/ttyS2 raw -echo || fail "stty"
# CMD writes to pipes, not to the ttys themselves: it should not think it has a terminal.
mkfifo /o /e && { cat /o >/dev/ttyS1 & cat /e >/dev/ttyS2 & } || fail "fifos"
say "run"
chroot /newroot /bin/sh /run/svm-host/cmd.sh </dev/null >/o 2>/e
rc=$?
wait
echo $rc >/x/rc
say "done rc=$rc"
cd /; sync; poweroff -f; echo o >/proc/sysrq-trigger; exit 0
EOI
  chmod +x "$R/init"
  (cd "$R" && find . | cpio -o -H newc --quiet) >"$T/out/l1.cpio"
  cp "$T/k/boot/vmlinuz-$kv" "$T/out/vmlinuz"
  say "setup: L1 $kv, modules: ${order[*]}"
  find "$cache/svm-host" -mindepth 1 -maxdepth 1 -name '*_*_*' ! -name "$key" -exec rm -rf {} +
  mv "$T/out" "$D" 2>/dev/null || [ -s "$D/l1.cpio" ] || die "could not create $D"
  rm -rf "$T"
  say "setup: built $D"
}

# A value in single quotes, for cmd.sh (POSIX sh).
q() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }

run() {
  local cpus=2 mem=6144 tmo=3600 share='' clock=icount
  while [ $# -gt 0 ]; do
    case $1 in
      --share) share=$(cd "$2" && pwd) || die "run: --share $2: not a directory"; shift 2 ;;
      --cpus) cpus=$2; shift 2 ;;
      --memory) mem=$2; shift 2 ;;
      --timeout) tmo=$2; shift 2 ;;
      --clock) clock=$2; shift 2 ;;
      --) shift; break ;;
      *) die "run: unknown option $1 (usage: run [--cpus N] [--memory MiB] [--timeout SECS] [--share DIR] [--clock icount|host] -- CMD ARGS...)" ;;
    esac
  done
  local accel
  case $clock in
    icount) accel=(-accel tcg -icount shift=0,sleep=on) ;;
    host) accel=(-accel tcg,thread=multi) ;;
    *) die "run: --clock $clock: icount or host" ;;
  esac
  [ $# -gt 0 ] || die "run: no command (usage: run [options] -- CMD ARGS...)"
  setup
  X=$(mktemp -d "${TMPDIR:-/tmp}/svm-host.XXXXXX")
  qpid='' tails=()
  trap 'trap - EXIT; [ -z "$qpid" ] || kill "$qpid" 2>/dev/null; [ ${#tails[@]} -eq 0 ] || kill "${tails[@]}" 2>/dev/null; rm -rf "$X"' EXIT
  trap 'exit 130' INT; trap 'exit 143' TERM
  # cmd.sh: the caller's exported variables, cwd and argv.
  local n a
  {
    for n in $(compgen -e); do
      [[ $n =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
      printf 'export %s=%s\n' "$n" "$(q "${!n}")"
    done
    printf 'cd %s || exit 125\nexec' "$(q "$PWD")"
    for a in "$@"; do printf ' %s' "$(q "$a")"; done
    echo
  } >"$X/cmd.sh"
  : >"$X/out"; : >"$X/err"; : >"$X/console.log"
  local sharearg=()
  if [ -n "$share" ]; then
    printf '%s\n' "$share" >"$X/share"
    sharearg=(-virtfs "local,path=$share,mount_tag=svmshare,security_model=none,multidevs=remap")
  fi
  say "booting L1 ($cpus CPUs, $mem MiB, $clock clock, timeout $tmo s): $*"
  local t0=$EPOCHREALTIME
  timeout -k 10 "$tmo" qemu-system-x86_64 "${accel[@]}" -cpu max -smp "$cpus" -m "$mem" \
    -nodefaults -no-user-config -display none -no-reboot \
    -kernel "$D/vmlinuz" -initrd "$D/l1.cpio" \
    -append 'console=ttyS0 rdinit=/init panic=-1 mitigations=off nokaslr quiet' \
    -monitor "unix:$X/monitor,server=on,wait=off" \
    -serial "file:$X/console.log" -serial "file:$X/out" -serial "file:$X/err" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$X,mount_tag=svmx,security_model=none,multidevs=remap" "${sharearg[@]}" \
    </dev/null >"$X/qemu.log" 2>&1 &
  qpid=$!
  tail -c +1 -f --pid="$qpid" "$X/out" & tails+=($!)
  tail -c +1 -f --pid="$qpid" "$X/err" >&2 & tails+=($!)
  # Progress: each marker of L1's init, once, with the time since QEMU started.
  local -A shown=()
  local m line dumped='' wall_at=''
  while kill -0 "$qpid" 2>/dev/null; do
    # The host's wall clock for CMD's limits (see the header), once a second.
    if [ -n "$share" ] && [ "$EPOCHSECONDS" != "$wall_at" ]; then
      wall_at=$EPOCHSECONDS
      printf '%s\n' "$wall_at" >"$share/wall.new" && mv -f "$share/wall.new" "$share/wall"
    fi
    # Just before the timeout: where L1's CPU is, from QEMU's monitor, three times a second
    # apart (a RIP that does not move, IF=0 in a spin loop of a nested guest: see the svm-tier
    # notes in scripts/svm-tier.sh).
    if [ -z "$dumped" ] && [ "$(elapsed "$t0" | cut -d. -f1)" -ge $((tmo - 5)) ]; then
      dumped=1
      monitor "$X/monitor" 'info registers' 'info registers' 'info registers' >"$X/cpu-at-timeout" 2>&1 || true
    fi
    # On request from CMD (scripts/svm-tier.sh, when a test hangs): where L1's CPU is, ten
    # times a second apart, into the share (sample-request names the test).
    if [ -n "$share" ] && [ -s "$share/sample-request" ]; then
      local req i cmds=()
      req=$(tr -cd 'A-Za-z0-9_' <"$share/sample-request")
      rm -f "$share/sample-request"
      for i in 1 2 3 4 5 6 7 8 9 10; do cmds+=('info registers'); done
      monitor "$X/monitor" "${cmds[@]}" >"$share/cpu-samples.$req.tmp" 2>&1 || true
      mv -f "$share/cpu-samples.$req.tmp" "$share/cpu-samples.$req"
    fi
    for m in init kvm-up run; do
      [ -z "${shown[$m]:-}" ] || continue
      line=$(grep -a -m1 "^svm-host: $m" "$X/console.log" | tr -d '\r') || continue
      shown[$m]=1
      case $m in
        init) say "L1 init started after $(elapsed "$t0") s" ;;
        kvm-up) say "/dev/kvm up after $(elapsed "$t0") s (kvm_amd ${line#svm-host: kvm-up })" ;;
        run) say "running CMD after $(elapsed "$t0") s" ;;
      esac
    done
    sleep 0.3
  done
  local qrc=0
  wait "$qpid" || qrc=$?
  qpid=''
  wait "${tails[@]}" 2>/dev/null || true
  tails=()
  if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
    say "error: timeout: L1 still running after $tmo s; its CPU then (QEMU's monitor, 1 s apart):"
    grep -E '^(RIP|RAX|CR0)=' "$X/cpu-at-timeout" >&2 || cat "$X/cpu-at-timeout" >&2
    say "console tail:"
    tail -n 20 "$X/console.log" | tr -d '\r' >&2
    exit 124
  fi
  if [ -s "$X/rc" ]; then
    local rc
    rc=$(cat "$X/rc")
    say "CMD exited with $rc; L1 off after $(elapsed "$t0") s"
    exit "$rc"
  fi
  line=$(grep -a -m1 '^svm-host: FAIL' "$X/console.log" | tr -d '\r' || true)
  say "error: ${line:+${line#svm-host: }; }L1 did not run CMD to the end (QEMU exit $qrc). Console tail:"
  tail -n 40 "$X/console.log" | tr -d '\r' >&2
  [ ! -s "$X/qemu.log" ] || { say "QEMU said:"; tail -n 10 "$X/qemu.log" >&2; }
  exit 125
}

# monitor SOCKET CMD...: each CMD sent to QEMU's human monitor, its answer printed (escape
# sequences removed), one second between commands.
monitor() {
  python3 - "$@" <<'EOP'
import re, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(5)
def answer():
    out = b""
    try:
        while not out.endswith(b"(qemu) "):
            d = s.recv(65536)
            if not d:
                break
            out += d
    except socket.timeout:
        pass
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]|\r", "", out.decode(errors="replace"))
answer()
for i, c in enumerate(sys.argv[2:]):
    if i:
        time.sleep(1)
    s.sendall(c.encode() + b"\n")
    print(answer().split("\n", 1)[-1].rsplit("(qemu)", 1)[0], end="")
EOP
}

elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

case ${1:-} in
  setup) setup ;;
  run) shift; run "$@" ;;
  *) sed -n '2,10p' "$self" >&2; exit 2 ;;
esac
