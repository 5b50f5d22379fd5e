#!/usr/bin/env bash
# vPMU guest images: builds the guest kernels and initramfs and caches them outside the repo.
#
# Usage: guest-image/build.sh [TARGET...]
#   all              (default) initramfs, initramfs-tiny, spin-initramfs, debian-kernel, default-kernel,
#                    rootfs, kvm-unit-tests
#   default-kernel   minimal kernel from Debian's unmodified linux-source-6.1:
#                    tinyconfig + guest-image/kernel/minimal.config (4-6 min on 2 cores)
#   nopci-kernel     the default kernel's fragment with CONFIG_PCI=n (no DSDT in 6.1: legacy UARTs,
#                    no \_S5), bzImage only; tier 3 boots it to user space (4-6 min on 2 cores)
#   debian-kernel    the prebuilt linux-image-6.1.*-cloud-amd64 (downloaded, never installed;
#                    its real System.map comes from the matching -dbg package)
#   initramfs        the default image, an uncompressed newc cpio (a guest kernel whose code is
#                    emulated spends ~170 s inflating a 1 MB gzip one) of: busybox-static,
#                    guest-image/initramfs/{init,experiments.sh}, Debian's perf (linux-perf) with
#                    the shared libraries it needs (from the .debs, nothing installed), OProfile
#                    (operf, ocount, opreport, ophelp, events) built statically from
#                    ../shared/third_party/oprofile-*.tar.gz (OPROFILE_TARBALL overrides), and the
#                    workloads guest-image/workloads/*.c compiled statically; at most 60 MB
#   initramfs-tiny   busybox-static + init + experiments.sh only (~2 MB): faster boots
#   rootfs           what `initramfs` holds, as an uncompressed ext4 disk image for `run --disk`
#                    (mke2fs -d: no root privileges, no loop mount), with the default kernel's
#                    symbols for its profilers and a manifest (guest path, build-id) beside it
#   spin-initramfs   only /init = guest-image/initramfs/spin-init.S: never makes a system call, so
#                    the kernel stays up where guest user space cannot run (docs/virtio-net.md)
#   kvm-unit-tests   x86/pmu.flat (a Multiboot v1 ELF32) built from the unmodified
#                    ../shared/third_party/kvm-unit-tests-*.tar.gz (KVM_UNIT_TESTS_TARBALL overrides):
#                    ./configure --arch=x86_64 && make x86/pmu.flat (docs/kvm-unit-tests.md)
#   paths            print NAME=PATH lines for the built artifacts: eval "$(build.sh paths)"
#   -h, --help       this text
#
# Cache: ${VPMU_CACHE:-$HOME/.cache/vpmu}. Each artifact lives in its own directory named after
# a key: a hash of everything it is made from (the text of the functions here that make it, the
# config fragment or /init script, the Debian package version used). Unchanged inputs: the
# target prints "cached: ..." and returns at once. Changed inputs: a new key, a new build. An
# entry is built in a .tmp-* directory and renamed into place only when complete, so a partial
# build never looks finished. $CACHE/current/ holds links to the newest build of each file.
# Kernel build output goes to $CACHE/logs/ (and build.log next to the artifacts).
# Environment: VPMU_CACHE (cache root), JOBS (make -j, default: nproc).
# Needs Debian (bookworm); installs missing build packages with apt-get (as root, or via sudo).
set -euo pipefail

SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")
HERE=$(dirname "$SCRIPT")
CACHE=${VPMU_CACHE:-$HOME/.cache/vpmu}
FRAGMENT=$HERE/kernel/minimal.config
TASK_LAYOUT_C=$HERE/kernel/task-layout.c
INIT_SCRIPT=$HERE/initramfs/init
SPIN_INIT=$HERE/initramfs/spin-init.S
EXPERIMENTS=$HERE/initramfs/experiments.sh
JOBS=${JOBS:-$(nproc)}

# Fragment options allowed to come out differently from what the fragment asks, with the reason.
# (Empty: with linux-source-6.1 6.1.192-2 every option of the fragment comes out as written.)
declare -A CONFIG_MAY_DIFFER=()

# ---------------------------------------------------------------------------------------------
# Helpers (not part of any cache key)

say() { printf '[guest-image %4ss] %s\n' "$SECONDS" "$*" >&2; }
die() { say "error: $*"; exit 1; }

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$SCRIPT"; }

SUDO=()
[ "$(id -u)" = 0 ] || SUDO=(sudo)
APT_UPDATED=0

# need_pkgs PKG...: install whatever of PKG... is missing (one dpkg -s call when all are there).
# apt-get's output goes to $APT_LOG (a progress line per step here; its tail on failure).
APT_LOG=$CACHE/logs/apt.log
need_pkgs() {
	dpkg -s "$@" >/dev/null 2>&1 && return 0
	local p missing=()
	for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
	apt_update
	run_logged "$APT_LOG" "installing ${missing[*]} (apt-get)" \
		"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends "${missing[@]}"
}

apt_update() {
	[ "$APT_UPDATED" = 1 ] && return 0
	mkdir -p "$(dirname "$APT_LOG")"
	say "apt-get's output goes to $APT_LOG"
	run_logged "$APT_LOG" "apt-get update" "${SUDO[@]}" apt-get update -q
	APT_UPDATED=1
}

pkg_version() { dpkg-query -W -f '${Version}' "$1"; }

# key TEXT...: 16 hex digits of sha256 over the arguments (files are passed as their contents).
key() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }

# lock NAME: serialise builds of one artifact (another run of this script waits for the first).
lock() {
	mkdir -p "$CACHE"
	exec {LOCK_FD}>"$CACHE/.lock-$1"
	if ! flock -n "$LOCK_FD"; then
		say "waiting for another build of $1 to finish"
		flock "$LOCK_FD"
	fi
}
unlock() { exec {LOCK_FD}>&-; }

# new_tmp NAME: an empty build directory next to the final one (same file system: rename works).
# Left-overs of killed builds are removed first (we hold the lock, so nobody else uses them).
TMP=""
cleanup() { if [ -n "$TMP" ]; then rm -rf "$TMP"; fi; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
new_tmp() {
	rm -rf "$CACHE"/.tmp-"$1"-*
	TMP=$(mktemp -d "$CACHE/.tmp-$1-XXXXXX")
}
# publish FINAL: rename the finished $TMP to FINAL (atomic). Called under the artifact's lock
# after finding FINAL incomplete, so whatever is at FINAL is a damaged left-over.
publish() {
	chmod 755 "$TMP"
	rm -rf "$1"
	mv -T "$TMP" "$1" || die "cannot rename $TMP to $1"
	TMP=""
}

# link NAME TARGET: $CACHE/current/NAME -> TARGET (relative, replaced atomically).
link() {
	mkdir -p "$CACHE/current"
	ln -sfn "../${2#"$CACHE"/}" "$CACHE/current/.$1.new"
	mv -T "$CACHE/current/.$1.new" "$CACHE/current/$1"
}

# run_logged LOG WHAT CMD...: run CMD with output appended to LOG; on failure show LOG's tail.
run_logged() {
	local log=$1 what=$2 t0=$SECONDS
	shift 2
	say "$what..."
	if ! "$@" >>"$log" 2>&1; then
		say "FAILED: $what; last lines of $log:"
		tail -n 40 "$log" >&2
		die "$what failed (full log: $log)"
	fi
	say "$what: done in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------------------------------------
# default-kernel

KERNEL_PKGS=(linux-source-6.1 build-essential bc bison flex libelf-dev libssl-dev lz4 xz-utils)

# check_config CONFIG FRAGMENT: every CONFIG_X=V of FRAGMENT must be in CONFIG as written
# (V = n: not set). Prints each mismatch; fails on any not excused by CONFIG_MAY_DIFFER.
check_config() {
	local config=$1 fragment=$2 line opt want got bad=0
	while IFS= read -r line || [ -n "$line" ]; do
		case "$line" in CONFIG_*=*) ;; *) continue ;; esac
		opt=${line%%=*}
		want=${line#*=}
		got=$(grep -E "^$opt=" "$config" || true)
		got=${got#*=}
		[ -n "$got" ] || got=n
		[ "$got" = "$want" ] && continue
		if [ -n "${CONFIG_MAY_DIFFER[$opt]:-}" ]; then
			say "config: $opt=$got, not $want (allowed: ${CONFIG_MAY_DIFFER[$opt]})"
		else
			say "config: $opt=$got, but the fragment asks for $want"
			bad=1
		fi
	done <"$fragment"
	return "$bad"
}

# kernel_xz_bzimage SRC STAMP: switches the built tree's compression to xz and remakes bzImage.
kernel_xz_bzimage() {
	"$1/scripts/config" --file "$1/.config" --disable KERNEL_LZ4 --enable KERNEL_XZ
	kernel_make "$1" "$2" olddefconfig
	grep -q '^CONFIG_KERNEL_XZ=y' "$1/.config" || return 1
	kernel_make "$1" "$2" -j"$JOBS" bzImage
}

kernel_make() {
	make -C "$1" KBUILD_BUILD_USER=vpmu KBUILD_BUILD_HOST=guest-image \
		KBUILD_BUILD_TIMESTAMP="$2" "${@:3}"
}

# write_task_layout SRC: the built tree's VPMU_ offsets (kernel/task-layout.c), the addresses of
# the symbols they start from, and the kernel's banner, as vmm/runtime/src/profile/guest_task/mod.rs reads
# them: `banner TEXT`, `symbol NAME ADDR`, `value NAME NUMBER` lines.
write_task_layout() {
	local sym addr banner
	echo "# vpmu task layout v1: guest-image/build.sh default-kernel (kernel/task-layout.c)"
	# The bytes at linux_banner, up to its newline: what the VMM compares with guest memory.
	addr=$(awk '$3 == "linux_banner" { print $1; exit }' "$1/System.map")
	[ -n "$addr" ] || return 1
	banner=$(objdump -s --start-address="0x$addr" \
		--stop-address="$(printf '0x%x' $((0x$addr + 512)))" "$1/vmlinux" |
		awk 'NR > 4 { for (i = 2; i <= 5; i++) if ($i ~ /^[0-9a-f]+$/) printf "%s", $i }' |
		perl -ne 'chomp; $h .= $_; END { $s = pack("H*", $h); $s =~ s/[\n\0].*//s; print $s }')
	case $banner in "Linux version "*) ;; *) return 1 ;; esac
	printf 'banner %s\n' "$banner"
	for sym in __per_cpu_offset current_task linux_banner; do
		addr=$(awk -v s="$sym" '$3 == s { print $1; exit }' "$1/System.map")
		[ -n "$addr" ] || return 1
		printf 'symbol %s 0x%s\n' "$sym" "$addr"
	done
	grep -E '^#define VPMU_' "$1/include/generated/asm-offsets.h" |
		awk '{ sub(/^VPMU_/, "", $2); print "value", $2, $3 }'
	[ "$(grep -c '^#define VPMU_' "$1/include/generated/asm-offsets.h")" -ge 35 ]
}

build_default_kernel() {
	need_pkgs "${KERNEL_PKGS[@]}"
	local ver kver k name final log stamp
	ver=$(pkg_version linux-source-6.1)
	kver=${ver%%-*}
	k=$(key default-kernel "$ver" "$(cat "$FRAGMENT" "$TASK_LAYOUT_C")" \
		"$(declare -p KERNEL_PKGS CONFIG_MAY_DIFFER)" \
		"$(declare -f build_default_kernel check_config kernel_make write_task_layout kernel_xz_bzimage)")
	name=default-kernel-$kver-$k
	final=$CACHE/$name
	if [ ! -f "$final/vmlinux" ]; then
		lock default-kernel
		if [ ! -f "$final/vmlinux" ]; then
			new_tmp default-kernel
			mkdir -p "$CACHE/logs"
			log=$CACHE/logs/$name.log
			: >"$log"
			say "default kernel: linux-source-6.1 $ver, key $k; log: $log"
			run_logged "$log" "unpacking /usr/src/linux-source-6.1.tar.xz" \
				tar -C "$TMP" -xf /usr/src/linux-source-6.1.tar.xz
			local src=$TMP/linux-source-6.1
			stamp=$(date -u -r /usr/src/linux-source-6.1.tar.xz)
			run_logged "$log" "make tinyconfig" kernel_make "$src" "$stamp" tinyconfig
			run_logged "$log" "merging kernel/minimal.config (merge_config.sh -m)" \
				env -C "$src" scripts/kconfig/merge_config.sh -m .config "$FRAGMENT"
			run_logged "$log" "make olddefconfig" kernel_make "$src" "$stamp" olddefconfig
			check_config "$src/.config" "$FRAGMENT" ||
				die "the kernel configuration differs from $FRAGMENT (see above)"
			say "config: all $(grep -c '^CONFIG_' "$FRAGMENT") options of the fragment came out as asked"
			cat "$TASK_LAYOUT_C" >>"$src/arch/x86/kernel/asm-offsets.c"
			run_logged "$log" "make -j$JOBS vmlinux bzImage (4-6 min with -j2)" \
				kernel_make "$src" "$stamp" -j"$JOBS" vmlinux bzImage
			cp "$src/vmlinux" "$src/arch/x86/boot/bzImage" "$src/System.map" "$TMP/"
			write_task_layout "$src" >"$TMP/task-layout" ||
				die "task-layout: the kernel build did not give every offset (see $log)"
			cp "$src/.config" "$TMP/config"
			kernel_make "$src" "$stamp" -s kernelrelease >"$TMP/kernelrelease"
			# The same kernel with an xz payload (tinyconfig's own default compression; only the
			# boot stub and payload are rebuilt): tier 3 boots it, the xz path of
			# vmm/analysis/src/bzimage.rs on a bzImage as the kernel's build lays it out.
			run_logged "$log" "bzImage with an xz payload (KERNEL_XZ)" \
				kernel_xz_bzimage "$src" "$stamp"
			cp "$src/arch/x86/boot/bzImage" "$TMP/bzImage.xz"
			cp "$log" "$TMP/build.log"
			say "removing the build tree"
			rm -rf "$src"
			publish "$final"
			say "built: default kernel $(cat "$final/kernelrelease") in $final"
		fi
		unlock
	else
		say "cached: default kernel $kver (key $k): $final"
	fi
	link default-vmlinux "$final/vmlinux"
	link default-bzImage "$final/bzImage"
	link default-System.map "$final/System.map"
	link default-config "$final/config"
	link default-task-layout "$final/task-layout"
	link default-bzImage-xz "$final/bzImage.xz"
}

# ---------------------------------------------------------------------------------------------
# nopci-kernel

# The default kernel's fragment with CONFIG_PCI=n (common in microVM configs): such a 6.1 kernel
# loads no DSDT (ACPICA has no PCI_Config region handler), so it finds the UARTs only as its
# built-in legacy ports (IRQ 4 and 3) and has no \_S5. Tier 3 boots it to check that its user
# space reaches the console (the VMM's fixed-hardware ACPI keeps ISA IRQs; boot/acpi.rs).
# bzImage only (no task layout, no xz copy).
build_nopci_kernel() {
	need_pkgs "${KERNEL_PKGS[@]}"
	local ver kver k name final log stamp src
	ver=$(pkg_version linux-source-6.1)
	kver=${ver%%-*}
	k=$(key nopci-kernel "$ver" "$(cat "$FRAGMENT")" "$(declare -p KERNEL_PKGS CONFIG_MAY_DIFFER)" \
		"$(declare -f build_nopci_kernel check_config kernel_make)")
	name=nopci-kernel-$kver-$k
	final=$CACHE/$name
	if [ ! -f "$final/bzImage" ]; then
		lock nopci-kernel
		if [ ! -f "$final/bzImage" ]; then
			new_tmp nopci-kernel
			mkdir -p "$CACHE/logs"
			log=$CACHE/logs/$name.log
			: >"$log"
			say "no-PCI kernel: linux-source-6.1 $ver, key $k; log: $log"
			grep -q '^CONFIG_PCI=y$' "$FRAGMENT" || die "$FRAGMENT has no CONFIG_PCI=y line to turn off"
			# DEVPORT (/dev/port) depends on ISA || PCI: it goes with PCI.
			sed -e 's/^CONFIG_PCI=y$/CONFIG_PCI=n/' -e '/^CONFIG_DEVPORT=y$/d' \
				"$FRAGMENT" >"$TMP/nopci.config"
			run_logged "$log" "unpacking /usr/src/linux-source-6.1.tar.xz" \
				tar -C "$TMP" -xf /usr/src/linux-source-6.1.tar.xz
			src=$TMP/linux-source-6.1
			stamp=$(date -u -r /usr/src/linux-source-6.1.tar.xz)
			run_logged "$log" "make tinyconfig" kernel_make "$src" "$stamp" tinyconfig
			run_logged "$log" "merging kernel/minimal.config with CONFIG_PCI=n (merge_config.sh -m)" \
				env -C "$src" scripts/kconfig/merge_config.sh -m .config "$TMP/nopci.config"
			run_logged "$log" "make olddefconfig" kernel_make "$src" "$stamp" olddefconfig
			check_config "$src/.config" "$TMP/nopci.config" ||
				die "the no-PCI kernel configuration differs from $TMP/nopci.config (see above)"
			run_logged "$log" "make -j$JOBS bzImage (4-6 min with -j2)" \
				kernel_make "$src" "$stamp" -j"$JOBS" bzImage
			cp "$src/arch/x86/boot/bzImage" "$src/System.map" "$TMP/"
			cp "$src/.config" "$TMP/config"
			cp "$log" "$TMP/build.log"
			say "removing the build tree"
			rm -rf "$src"
			publish "$final"
			say "built: no-PCI kernel in $final"
		fi
		unlock
	else
		say "cached: no-PCI kernel $kver (key $k): $final"
	fi
	link nopci-bzImage "$final/bzImage"
	link nopci-config "$final/config"
}

# ---------------------------------------------------------------------------------------------
# debian-kernel

# The newest linux-image-6.1.*-cloud-amd64: what the metapackage depends on, else the highest
# version-sorted name apt knows.
debian_kernel_pkg() {
	local pkg
	pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
		sed -n 's/^ *Depends: \(linux-image-6\.1\.[0-9.-]*-cloud-amd64\)$/\1/p' | head -n 1)
	if [ -z "$pkg" ]; then
		pkg=$(apt-cache pkgnames linux-image-6.1 2>/dev/null |
			grep -E '^linux-image-6\.1\.[0-9.]+-[0-9]+-cloud-amd64$' | sort -V | tail -n 1 || true)
	fi
	printf '%s\n' "$pkg"
}

# apt_download PKG=VERSION: fetch the .deb into $TMP (no installation; no root needed).
apt_download() {
	(cd "$TMP" && apt-get download "$1") >"$TMP/download.log" 2>&1 || {
		tail -n 20 "$TMP/download.log" >&2
		die "apt-get download $1 failed"
	}
}

# dwarf_offsets VMLINUX: `NAME VALUE` lines of what a task layout holds (vmm/runtime/src/profile/
# btf_layout.rs), read by gdb from the vmlinux's DWARF: an independent reference for the BTF.
DWARF_FIELDS=(
	task_struct_pid:task_struct:pid task_struct_tgid:task_struct:tgid
	task_struct_comm:task_struct:comm task_struct_flags:task_struct:flags
	task_struct_mm:task_struct:mm task_struct_stack:task_struct:stack
	task_struct_group_leader:task_struct:group_leader mm_struct_pgd:mm_struct:pgd
	mm_struct_exe_file:mm_struct:exe_file mm_struct_start_code:mm_struct:start_code
	mm_struct_end_code:mm_struct:end_code file_f_path:file:f_path path_dentry:path:dentry
	dentry_d_name:dentry:d_name qstr_name:qstr:name mm_struct_mm_mt:mm_struct:mm_mt
	maple_tree_ma_root:maple_tree:ma_root maple_range_64_pivot:maple_range_64:pivot
	maple_range_64_slot:maple_range_64:slot maple_range_64_meta:maple_range_64:meta
	maple_arange_64_pivot:maple_arange_64:pivot maple_arange_64_slot:maple_arange_64:slot
	maple_arange_64_meta:maple_arange_64:meta vm_area_struct_vm_start:vm_area_struct:vm_start
	vm_area_struct_vm_end:vm_area_struct:vm_end vm_area_struct_vm_file:vm_area_struct:vm_file
	vm_area_struct_vm_pgoff:vm_area_struct:vm_pgoff
)
dwarf_offsets() {
	local f name ty member out args=() names=()
	for f in "${DWARF_FIELDS[@]}"; do
		IFS=: read -r name ty member <<<"$f"
		names+=("$name")
		args+=(-ex "print (unsigned long)&((struct $ty *)0)->$member")
	done
	names+=(task_struct_size task_comm_len maple_range64_slots maple_arange64_slots)
	args+=(-ex 'print sizeof(struct task_struct)'
		-ex 'print sizeof(((struct task_struct *)0)->comm)'
		-ex 'print sizeof(((struct maple_range_64 *)0)->slot) / 8'
		-ex 'print sizeof(((struct maple_arange_64 *)0)->slot) / 8')
	out=$(gdb -batch -nx "${args[@]}" "$1" 2>/dev/null | sed -n 's/^\$[0-9]* = //p')
	[ "$(printf '%s\n' "$out" | grep -c .)" -eq "${#names[@]}" ] || return 1
	paste -d' ' <(printf '%s\n' "${names[@]}") <(printf '%s\n' "$out")
}

build_debian_kernel() {
	local pkg ver k name final
	pkg=$(debian_kernel_pkg)
	if [ -z "$pkg" ]; then
		apt_update
		pkg=$(debian_kernel_pkg)
	fi
	[ -n "$pkg" ] || die "apt knows no linux-image-6.1.*-cloud-amd64 package"
	ver=$(apt-cache show --no-all-versions "$pkg" | sed -n 's/^Version: //p' | head -n 1)
	[ -n "$ver" ] || die "no version for $pkg"
	need_pkgs gdb
	k=$(key debian-kernel "$pkg" "$ver" "$(declare -f build_debian_kernel debian_kernel_pkg apt_download dwarf_offsets)" "${DWARF_FIELDS[*]}")
	name=debian-kernel-${pkg#linux-image-}-$ver-$k
	final=$CACHE/$name
	if [ ! -f "$final/vmlinuz" ]; then
		lock debian-kernel
		if [ ! -f "$final/vmlinuz" ]; then
			new_tmp debian-kernel
			local t0=$SECONDS f
			say "downloading $pkg $ver (apt-get download; not installed)..."
			apt_download "$pkg=$ver"
			dpkg-deb -x "$TMP"/*.deb "$TMP/deb"
			for f in vmlinuz System.map config; do
				set -- "$TMP"/deb/boot/"$f"-*
				[ -f "$1" ] || die "$pkg has no /boot/$f-*"
				cp "$1" "$TMP/$f"
			done
			echo "${1##*/config-}" >"$TMP/kernelrelease"
			rm -rf "$TMP/deb" "$TMP"/*.deb
			# Debian ships a one-line placeholder System.map ("The real System.map is in the
			# linux-image-<version>-dbg package"). Take the real one from $pkg-dbg, and its
			# vmlinux with DWARF: the struct offsets gdb reads from it (dwarf-offsets) are the
			# reference vmm/tests/btf_layout_kernel.rs checks the BTF-derived task layout
			# against (vpmu-vmm task-layout). A big download (~280 MB; seconds here).
			say "downloading $pkg-dbg $ver (System.map, and DWARF struct offsets)..."
			apt_download "$pkg-dbg=$ver"
			dpkg-deb --fsys-tarfile "$TMP"/*.deb |
				tar -x -C "$TMP" --wildcards './usr/lib/debug/boot/System.map-*' './usr/lib/debug/boot/vmlinux-*'
			set -- "$TMP"/usr/lib/debug/boot/System.map-*
			[ -s "$1" ] || die "$pkg-dbg has no /usr/lib/debug/boot/System.map-*"
			mv "$1" "$TMP/System.map"
			set -- "$TMP"/usr/lib/debug/boot/vmlinux-*
			[ -s "$1" ] || die "$pkg-dbg has no /usr/lib/debug/boot/vmlinux-*"
			dwarf_offsets "$1" >"$TMP/dwarf-offsets" ||
				die "gdb could not read the struct offsets from $pkg-dbg's vmlinux"
			rm -rf "${TMP:?}/usr" "$TMP"/*.deb
			rm -f "$TMP/download.log"
			publish "$final"
			say "got: Debian kernel $pkg $ver in $((SECONDS - t0)) s: $final"
		fi
		unlock
	else
		say "cached: Debian kernel $pkg $ver: $final"
	fi
	link debian-vmlinuz "$final/vmlinuz"
	link debian-System.map "$final/System.map"
	link debian-config "$final/config"
	link debian-dwarf-offsets "$final/dwarf-offsets"
}

# ---------------------------------------------------------------------------------------------
# initramfs (default: busybox + perf + OProfile + workloads) and initramfs-tiny (busybox only)

OPROFILE_PKGS=(build-essential autoconf automake libtool pkg-config libpopt-dev binutils-dev
	libiberty-dev zlib1g-dev libzstd-dev)
# OProfile's source: unmodified upstream (see its README there); OPROFILE_TARBALL overrides.
OPROFILE_TARBALL_DEFAULT=$HERE/../../shared/third_party/oprofile-1.4.0-48651c00.tar.gz
WORKLOADS=$HERE/workloads
WORKLOAD_NAMES=(cpu_split syscall_heavy io_heavy vector_regs)
# Largest initramfs the guest kernel is asked to copy (it is uncompressed, see above).
INITRAMFS_MAX_MB=60

oprofile_tarball() {
	local t=${OPROFILE_TARBALL:-$OPROFILE_TARBALL_DEFAULT}
	[ -f "$t" ] || die "OProfile source not found: $t (set OPROFILE_TARBALL to the oprofile-*.tar.gz)"
	readlink -f "$t"
}

# OProfile (operf, ocount, opreport, ophelp and the event files), statically linked, built from
# the tarball with the recipe of shared/HOST-FACTS.md; installed under $final/root (usr/...).
build_oprofile() {
	need_pkgs "${OPROFILE_PKGS[@]}"
	local tarball sum k final log
	tarball=$(oprofile_tarball)
	sum=$(sha256sum "$tarball" | cut -d' ' -f1)
	# Static binaries carry libbfd & co: their versions are inputs too.
	k=$(key oprofile "$sum" "$(pkg_version binutils-dev) $(pkg_version libpopt-dev) $(pkg_version libc6-dev)" \
		"$(declare -f build_oprofile)")
	final=$CACHE/oprofile-$k
	OPROFILE_DIR=$final
	if [ -x "$final/root/usr/bin/operf" ]; then
		say "cached: OProfile (key $k): $final"
		return 0
	fi
	lock oprofile
	if [ ! -x "$final/root/usr/bin/operf" ]; then
		new_tmp oprofile
		mkdir -p "$CACHE/logs"
		log=$CACHE/logs/oprofile-$k.log
		: >"$log"
		say "OProfile from ${tarball##*/} (static), key $k; log: $log"
		tar -C "$TMP" -xzf "$tarball"
		local src
		src=$(find "$TMP" -mindepth 1 -maxdepth 1 -type d -name 'oprofile*' | head -n 1)
		[ -n "$src" ] || die "${tarball##*/} holds no oprofile* directory"
		run_logged "$log" "OProfile: autogen.sh" env -C "$src" ./autogen.sh
		run_logged "$log" "OProfile: configure" env -C "$src" ./configure --prefix=/usr \
			--disable-werror --disable-account-check LDFLAGS=-static LIBS="-lsframe -lzstd -lz"
		run_logged "$log" "OProfile: make -j$JOBS (about a minute)" make -C "$src" -j"$JOBS" \
			LDFLAGS=-all-static LIBS="-lpopt -lbfd -liberty -ldl -lsframe -lzstd -lz"
		run_logged "$log" "OProfile: make install (staging)" make -C "$src" install \
			DESTDIR="$TMP/stage"
		local b
		mkdir -p "$TMP/root/usr/bin" "$TMP/root/usr/share"
		for b in operf ocount opreport ophelp; do
			[ -x "$TMP/stage/usr/bin/$b" ] || die "OProfile built no $b"
			# Static, not a dynamic executable: the guest has no libraries for it.
			if readelf -l "$TMP/stage/usr/bin/$b" | grep -q 'Requesting program interpreter'; then
				die "OProfile's $b is not statically linked"
			fi
			install -m 0755 -s "$TMP/stage/usr/bin/$b" "$TMP/root/usr/bin/$b"
		done
		cp -a "$TMP/stage/usr/share/oprofile" "$TMP/root/usr/share/"
		cp "$log" "$TMP/build.log"
		rm -rf "$src" "$TMP/stage"
		publish "$final"
		say "built: OProfile ($(du -sh "$final/root" | cut -f1)): $final"
	fi
	unlock
}

# The packages whose shared libraries Debian's perf may need: lib* and zlib* among its recursive
# Depends (copy_needed then takes only the libraries perf really loads).
perf_lib_pkgs() {
	apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
		--no-replaces --no-enhances linux-perf 2>/dev/null | grep -E '^(lib|zlib)' |
		grep -vE -- '-(stdlib|minimal|common|modules.*)$' | sort -u
}

# copy_needed FROM TO FILE: copy the ELF interpreter and every DT_NEEDED library of FILE,
# recursively, from the unpacked packages FROM to TO/lib/x86_64-linux-gnu (like ldd, without
# running anything). Fails naming the library when one is not there.
copy_needed() {
	local from=$1 to=$2 file=$3 lib found d
	for lib in $(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
		[ -e "$to/lib/x86_64-linux-gnu/$lib" ] && continue
		found=""
		for d in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu; do
			if [ -e "$from/$d/$lib" ]; then found=$from/$d/$lib; break; fi
		done
		[ -n "$found" ] || die "perf: $lib (needed by ${file##*/}) is in none of the downloaded packages"
		cp -L "$found" "$to/lib/x86_64-linux-gnu/$lib"
		copy_needed "$from" "$to" "$to/lib/x86_64-linux-gnu/$lib"
	done
}

# Debian's perf (linux-perf, same version as the kernel source) and exactly the shared
# libraries it needs, taken from the .debs (apt-get download + dpkg-deb -x; nothing installed).
build_perf() {
	local ver pkgs vers k final
	ver=$(apt-cache show --no-all-versions linux-perf 2>/dev/null | sed -n 's/^Version: //p' | head -n 1)
	if [ -z "$ver" ]; then
		apt_update
		ver=$(apt-cache show --no-all-versions linux-perf | sed -n 's/^Version: //p' | head -n 1)
	fi
	[ -n "$ver" ] || die "apt knows no linux-perf package"
	mapfile -t pkgs < <(perf_lib_pkgs)
	[ ${#pkgs[@]} -gt 0 ] || die "apt-cache depends linux-perf gave no libraries"
	vers=$(apt-cache show --no-all-versions "${pkgs[@]}" | sed -n 's/^\(Package\|Version\): //p' | paste -sd' ')
	k=$(key perf "$ver" "$vers" "$(declare -f build_perf perf_lib_pkgs copy_needed)")
	final=$CACHE/perf-$ver-$k
	PERF_DIR=$final
	if [ -x "$final/root/usr/bin/perf" ]; then
		say "cached: perf $ver (key $k): $final"
		return 0
	fi
	lock perf
	if [ ! -x "$final/root/usr/bin/perf" ]; then
		new_tmp perf
		local t0=$SECONDS deb interp
		say "downloading linux-perf $ver and ${#pkgs[@]} library packages (apt-get download; not installed)..."
		mkdir -p "$TMP/debs" "$TMP/x" "$TMP/root/usr/bin" "$TMP/root/lib/x86_64-linux-gnu" "$TMP/root/lib64"
		(cd "$TMP/debs" && apt-get download "linux-perf=$ver" "${pkgs[@]}") >"$TMP/download.log" 2>&1 || {
			tail -n 20 "$TMP/download.log" >&2
			die "apt-get download linux-perf and its libraries failed"
		}
		for deb in "$TMP"/debs/*.deb; do dpkg-deb -x "$deb" "$TMP/x"; done
		[ -x "$TMP/x/usr/bin/perf" ] || die "linux-perf $ver has no /usr/bin/perf"
		install -m 0755 "$TMP/x/usr/bin/perf" "$TMP/root/usr/bin/perf"
		interp=$(readelf -l "$TMP/x/usr/bin/perf" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
		[ "$interp" = /lib64/ld-linux-x86-64.so.2 ] || die "perf: unexpected ELF interpreter '$interp'"
		cp -L "$TMP/x/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$TMP/root/lib/x86_64-linux-gnu/"
		ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$TMP/root/lib64/ld-linux-x86-64.so.2"
		copy_needed "$TMP/x" "$TMP/root" "$TMP/x/usr/bin/perf"
		printf '%s\n' "linux-perf=$ver" "${pkgs[@]}" >"$TMP/packages"
		rm -rf "$TMP/debs" "$TMP/x" "$TMP/download.log"
		publish "$final"
		say "got: perf $ver + $(($(find "$final/root/lib" -type f | wc -l) - 1)) libraries + ld.so" \
			"($(du -sh "$final/root" | cut -f1)) in $((SECONDS - t0)) s: $final"
	fi
	unlock
}

# Workloads: compiled when the image is built; static, frame pointers, symbols kept.
build_workloads() {
	local to=$1 w
	need_pkgs build-essential
	for w in "${WORKLOAD_NAMES[@]}"; do
		gcc -static -O2 -g -fno-omit-frame-pointer -Wall -Wextra -Werror \
			-o "$to/$w" "$WORKLOADS/$w.c" || die "compiling workload $w failed"
	done
}

# build_lib_chain BIN LIB: lib_chain (dynamic, no libc: only ld.so) into BIN and its two
# libraries into LIB (ld.so's default directory, where perf's libraries are), frame pointers in
# every function and no tail calls, symbols kept.
build_lib_chain() {
	local bin=$1 lib=$2 src=$WORKLOADS/lib_chain
	local flags=(-O2 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer
		-fno-optimize-sibling-calls -fno-stack-protector -ffreestanding
		-fno-tree-loop-distribute-patterns -nostdlib -Wall -Wextra -Werror)
	mkdir -p "$lib"
	gcc "${flags[@]}" -shared -fPIC -o "$lib/libchain_b.so" "$src/libchain_b.c" &&
		gcc "${flags[@]}" -shared -fPIC -o "$lib/libchain_a.so" "$src/libchain_a.c" \
			-L"$lib" -lchain_b &&
		gcc "${flags[@]}" -o "$bin/lib_chain" "$src/lib_chain.c" -L"$lib" \
			-Wl,-rpath-link="$lib" -lchain_a ||
		die "compiling lib_chain failed"
}

# initramfs_root ROOT: busybox-static with all applet links, /init, and the experiment library.
initramfs_root() {
	local root=$1 app
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,root,etc/vpmu,mnt}
	chmod 1777 "$root/tmp"
	chmod 700 "$root/root"
	case "$(dpkg -S /bin/busybox 2>/dev/null)" in
	busybox-static:*) ;;
	*) die "/bin/busybox is not busybox-static's (static) binary" ;;
	esac
	install -m 0755 /bin/busybox "$root/bin/busybox"
	# All applets, at the paths busybox itself gives (bin/sh, usr/bin/nproc, sbin/poweroff...).
	while IFS= read -r app; do
		[ -e "$root/$app" ] || ln -s /bin/busybox "$root/$app"
	done < <(/bin/busybox --list-full)
	install -m 0755 "$INIT_SCRIPT" "$root/init"
	install -m 0644 "$EXPERIMENTS" "$root/etc/vpmu/experiments.sh"
	# The console must exist before /init runs (the kernel opens it for fds 0-2).
	if [ "$(id -u)" = 0 ]; then
		mknod -m 600 "$root/dev/console" c 5 1
		mknod -m 666 "$root/dev/null" c 1 3
	fi
	printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
	printf 'root:x:0:\n' >"$root/etc/group"
}

# pack_cpio ROOT OUT: uncompressed newc cpio, reproducible (sorted, mtime 0, owner root).
pack_cpio() {
	find "$1" -exec touch -h -d @0 {} +
	(cd "$1" && find . -mindepth 1 | LC_ALL=C sort |
		cpio -o -H newc -R 0:0 --reproducible --quiet) >"$2"
}

# default_root ROOT: what the default initramfs and the rootfs image hold: busybox, /init,
# perf + libraries, OProfile, the workloads (needs build_perf and build_oprofile first).
default_root() {
	initramfs_root "$1"
	cp -a "$PERF_DIR/root/." "$1/"
	cp -a "$OPROFILE_DIR/root/." "$1/"
	say "compiling workloads (${WORKLOAD_NAMES[*]} lib_chain)"
	build_workloads "$1/usr/bin"
	build_lib_chain "$1/usr/bin" "$1/lib/x86_64-linux-gnu"
}

# default_root_inputs: the cache-key inputs of default_root's contents.
default_root_inputs() {
	printf '%s\n' "$(pkg_version busybox-static)" "$(cat "$INIT_SCRIPT" "$EXPERIMENTS")" \
		"${OPROFILE_DIR##*/} ${PERF_DIR##*/}" \
		"$(for w in "${WORKLOAD_NAMES[@]}"; do cat "$WORKLOADS/$w.c"; done)" "$(pkg_version libc6-dev)" \
		"$(cat "$WORKLOADS"/lib_chain/*.c)" "$(pkg_version gcc)" \
		"$(declare -f default_root initramfs_root build_workloads build_lib_chain)"
}

# The default initramfs: busybox, /init, perf + libraries, OProfile, workloads.
build_initramfs() {
	need_pkgs busybox-static cpio binutils
	build_oprofile
	build_perf
	local ver k final
	ver=$(pkg_version busybox-static)
	k=$(key initramfs "$(default_root_inputs)" "$(declare -f build_initramfs pack_cpio)")
	final=$CACHE/initramfs-$k
	if [ ! -f "$final/initramfs.cpio" ]; then
		lock initramfs
		if [ ! -f "$final/initramfs.cpio" ]; then
			new_tmp initramfs
			local root=$TMP/root size
			say "initramfs: busybox $ver, perf, OProfile, workloads (key $k)"
			default_root "$root"
			pack_cpio "$root" "$TMP/initramfs.cpio"
			rm -rf "$root"
			size=$(stat -c %s "$TMP/initramfs.cpio")
			[ "$size" -le $((INITRAMFS_MAX_MB * 1024 * 1024)) ] ||
				die "initramfs is $((size / 1048576)) MB, more than the $INITRAMFS_MAX_MB MB allowed"
			publish "$final"
			say "built: initramfs ($((size / 1048576)) MB uncompressed): $final"
		fi
		unlock
	else
		say "cached: initramfs (busybox $ver, perf, OProfile, workloads; key $k): $final"
	fi
	link initramfs.cpio "$final/initramfs.cpio"
}

# The default root filesystem: what the default initramfs holds, as an ext4 image for
# `vpmu-vmm run --disk` (the guest mounts it as /dev/vda; docs/virtio-blk.md). Made by
# `mke2fs -d` from a staging directory: no root privileges, no loop mount. Uncompressed and
# without a journal (a guest kernel whose code is emulated pays for every journal commit). Also:
#   /sbin/init -> /init (the kernel starts /sbin/init on a disk root);
#   /etc/vpmu/interactive: /init starts a shell on the console when nothing else is asked;
#   /etc/vpmu/kallsyms/<sha256 of the kernel's .notes> = the default kernel's System.map, which
#     /init bind-mounts over /proc/kallsyms when the running kernel's /sys/kernel/notes hashes to
#     that name (the same build: same build-id), so the profilers do not make the emulated kernel
#     format its ~25,000 symbols; any other kernel falls back to reading /proc/kallsyms once;
#   manifest.tsv beside the image: guest path, ELF build-id (or -), size, of every regular file;
#   files/ beside it: the image's ELF files at their guest paths (report --guest-files).
ROOTFS_FREE_MB=64
build_rootfs() {
	need_pkgs busybox-static e2fsprogs binutils
	build_default_kernel
	build_oprofile
	build_perf
	local ver k final kernel_dir notes_sum
	ver=$(pkg_version busybox-static)
	kernel_dir=$(readlink -f "$CACHE/current/default-vmlinux")
	kernel_dir=${kernel_dir%/*}
	notes_sum=$(kernel_notes_sha256 "$kernel_dir/vmlinux")
	k=$(key rootfs "$(default_root_inputs)" "$notes_sum" "$(pkg_version e2fsprogs)" "$ROOTFS_FREE_MB" \
		"$(declare -f build_rootfs kernel_notes_sha256 write_manifest keep_elf_files)")
	final=$CACHE/rootfs-$k
	if [ ! -f "$final/rootfs.ext4" ]; then
		lock rootfs
		if [ ! -f "$final/rootfs.ext4" ]; then
			new_tmp rootfs
			local root=$TMP/root mb
			say "rootfs: busybox $ver, perf, OProfile, workloads, kallsyms of the default kernel (key $k)"
			default_root "$root"
			ln -sfn /init "$root/sbin/init"
			: >"$root/etc/vpmu/interactive"
			mkdir -p "$root/etc/vpmu/kallsyms"
			install -m 0400 "$kernel_dir/System.map" "$root/etc/vpmu/kallsyms/$notes_sum"
			write_manifest "$root" >"$TMP/manifest.tsv"
			keep_elf_files "$root" "$TMP/manifest.tsv" "$TMP/files"
			mb=$(($(du -sm "$root" | cut -f1) + ROOTFS_FREE_MB))
			run_logged "$TMP/mke2fs.log" "mke2fs -t ext4 -d (${mb} MB, no journal)" \
				mke2fs -q -F -t ext4 -O ^has_journal -L vpmu-root -E root_owner=0:0 \
				-d "$root" "$TMP/rootfs.ext4" "${mb}M"
			rm -rf "$root"
			publish "$final"
			say "built: rootfs ($(du -h --apparent-size "$final/rootfs.ext4" | cut -f1), ext4): $final"
		fi
		unlock
	else
		say "cached: rootfs (busybox $ver, perf, OProfile, workloads; key $k): $final"
	fi
	link rootfs.ext4 "$final/rootfs.ext4"
	link rootfs-manifest.tsv "$final/manifest.tsv"
	link rootfs-files "$final/files"
}

# keep_elf_files ROOT MANIFEST DEST: copies the image's ELF files (those with a build-id in the
# manifest) to DEST at their guest paths, for the host-side profile's user-space symbols
# (`vpmu-vmm report --guest-files DEST`).
keep_elf_files() {
	local f
	awk -F'\t' 'NR > 1 && $2 != "-" { print $1 }' "$2" | while IFS= read -r f; do
		mkdir -p "$3${f%/*}"
		cp -p "$1$f" "$3$f"
	done
}

# kernel_notes_sha256 VMLINUX: sha256 of the ELF's .notes section, the bytes the running kernel
# shows in /sys/kernel/notes (its build-id among them).
kernel_notes_sha256() {
	local t
	t=$(mktemp)
	objcopy -O binary --only-section=.notes "$1" "$t" || die "objcopy .notes of $1 failed"
	[ -s "$t" ] || die "$1 has no .notes section"
	sha256sum "$t" | cut -d' ' -f1
	rm -f "$t"
}

# write_manifest ROOT: "guest-path<TAB>build-id<TAB>bytes" for every regular file under ROOT,
# sorted; the build-id is the ELF's GNU build-id note, or - for other files.
write_manifest() {
	local f id
	printf '# guest path\tbuild-id\tbytes\n'
	(cd "$1" && find . -type f | LC_ALL=C sort) | while IFS= read -r f; do
		id=$(readelf -n "$1/$f" 2>/dev/null | sed -n 's/^ *Build ID: //p' | head -n 1 || true)
		printf '%s\t%s\t%s\n' "${f#.}" "${id:--}" "$(stat -c %s "$1/$f")"
	done
}

# The tiny initramfs: busybox and /init only (~2 MB): the quick boot when no profiler is needed.
build_initramfs_tiny() {
	need_pkgs busybox-static cpio
	local ver k final
	ver=$(pkg_version busybox-static)
	k=$(key initramfs-tiny "$ver" "$(cat "$INIT_SCRIPT" "$EXPERIMENTS")" \
		"$(declare -f build_initramfs_tiny initramfs_root pack_cpio)")
	final=$CACHE/initramfs-tiny-$k
	if [ ! -f "$final/initramfs.cpio" ]; then
		lock initramfs-tiny
		if [ ! -f "$final/initramfs.cpio" ]; then
			new_tmp initramfs-tiny
			initramfs_root "$TMP/root"
			pack_cpio "$TMP/root" "$TMP/initramfs.cpio"
			rm -rf "$TMP/root"
			publish "$final"
			say "built: initramfs-tiny ($(du -h "$final/initramfs.cpio" | cut -f1)): $final"
		fi
		unlock
	else
		say "cached: initramfs-tiny (busybox $ver, key $k): $final"
	fi
	link initramfs-tiny.cpio "$final/initramfs.cpio"
}

# ---------------------------------------------------------------------------------------------
# spin-initramfs

build_spin_initramfs() {
	need_pkgs build-essential cpio
	local k final
	k=$(key spin-initramfs "$(cat "$SPIN_INIT")" "$(gcc --version | head -n 1)" \
		"$(declare -f build_spin_initramfs)")
	final=$CACHE/spin-initramfs-$k
	if [ ! -f "$final/spin-initramfs.cpio" ]; then
		lock spin-initramfs
		if [ ! -f "$final/spin-initramfs.cpio" ]; then
			new_tmp spin-initramfs
			local root=$TMP/root
			mkdir -p "$root/dev"
			gcc -nostdlib -static -o "$root/init" "$SPIN_INIT" || die "cannot assemble $SPIN_INIT"
			if [ "$(id -u)" = 0 ]; then
				mknod -m 600 "$root/dev/console" c 5 1
			fi
			find "$root" -exec touch -h -d @0 {} +
			(cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
				cpio -o -H newc -R 0:0 --reproducible --quiet) >"$TMP/spin-initramfs.cpio"
			rm -rf "$root"
			publish "$final"
			say "built: spin initramfs: $final"
		fi
		unlock
	else
		say "cached: spin initramfs (key $k): $final"
	fi
	link spin-initramfs.cpio "$final/spin-initramfs.cpio"
}

# ---------------------------------------------------------------------------------------------
# kvm-unit-tests

KUT_PKGS=(build-essential)
# kvm-unit-tests' source: unmodified upstream (see the README there); KVM_UNIT_TESTS_TARBALL overrides.
KUT_TARBALL_GLOB=$HERE/../../shared/third_party/kvm-unit-tests-*.tar.gz
# The tests built (x86/NAME.flat); the VMM boots them with `run --kernel` (Multiboot v1).
KUT_TESTS=(pmu)

kut_tarball() {
	local t=${KVM_UNIT_TESTS_TARBALL:-}
	if [ -z "$t" ]; then
		local glob=$KUT_TARBALL_GLOB common
		# In a git worktree elsewhere, ../shared is beside the main clone.
		common=$(git -C "$HERE" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
		if ! compgen -G "$glob" >/dev/null && [ -n "$common" ]; then
			glob=$(dirname "$common")/../shared/third_party/kvm-unit-tests-*.tar.gz
		fi
		# shellcheck disable=SC2086 # the glob is meant to expand
		set -- $glob
		[ $# -eq 1 ] || die "expected one kvm-unit-tests-*.tar.gz in ${glob%/*}, found $#: $*"
		t=$1
	fi
	[ -f "$t" ] || die "kvm-unit-tests source not found: $t (set KVM_UNIT_TESTS_TARBALL to the kvm-unit-tests-*.tar.gz)"
	readlink -f "$t"
}

build_kvm_unit_tests() {
	need_pkgs "${KUT_PKGS[@]}"
	local tarball sum k final log t
	tarball=$(kut_tarball)
	sum=$(sha256sum "$tarball" | cut -d' ' -f1)
	k=$(key kvm-unit-tests "$sum" "${KUT_TESTS[*]}" "$(gcc --version | head -n 1)" \
		"$(pkg_version binutils)" "$(declare -f build_kvm_unit_tests kut_tarball)")
	final=$CACHE/kvm-unit-tests-$k
	if [ ! -f "$final/pmu.flat" ]; then
		lock kvm-unit-tests
		if [ ! -f "$final/pmu.flat" ]; then
			new_tmp kvm-unit-tests
			mkdir -p "$CACHE/logs"
			log=$CACHE/logs/kvm-unit-tests-$k.log
			: >"$log"
			say "kvm-unit-tests from ${tarball##*/}, key $k; log: $log"
			tar -C "$TMP" -xzf "$tarball"
			local src
			src=$(find "$TMP" -mindepth 1 -maxdepth 1 -type d -name 'kvm-unit-tests*' | head -n 1)
			[ -n "$src" ] || die "${tarball##*/} holds no kvm-unit-tests* directory"
			run_logged "$log" "kvm-unit-tests: configure --arch=x86_64" env -C "$src" ./configure --arch=x86_64
			local targets=()
			for t in "${KUT_TESTS[@]}"; do targets+=("x86/$t.flat"); done
			run_logged "$log" "kvm-unit-tests: make ${targets[*]}" make -C "$src" -j"$JOBS" "${targets[@]}"
			for t in "${KUT_TESTS[@]}"; do
				# Multiboot v1 wants a 32-bit ELF: the Makefile objcopies to elf32-i386.
				readelf -h "$src/x86/$t.flat" | grep -q 'Class:.*ELF32' || die "x86/$t.flat is not an ELF32"
				cp "$src/x86/$t.flat" "$TMP/$t.flat"
			done
			cp "$log" "$TMP/build.log"
			rm -rf "$src"
			publish "$final"
			say "built: kvm-unit-tests ${KUT_TESTS[*]}: $final"
		fi
		unlock
	else
		say "cached: kvm-unit-tests (key $k): $final"
	fi
	for t in "${KUT_TESTS[@]}"; do link "kvm-unit-tests-$t.flat" "$final/$t.flat"; done
}

# ---------------------------------------------------------------------------------------------

print_paths() {
	local var file
	for var in DEFAULT_VMLINUX:default-vmlinux DEFAULT_BZIMAGE:default-bzImage \
		DEFAULT_SYSTEM_MAP:default-System.map DEFAULT_CONFIG:default-config \
		DEFAULT_TASK_LAYOUT:default-task-layout DEFAULT_BZIMAGE_XZ:default-bzImage-xz \
		NOPCI_BZIMAGE:nopci-bzImage NOPCI_CONFIG:nopci-config \
		DEBIAN_VMLINUZ:debian-vmlinuz DEBIAN_SYSTEM_MAP:debian-System.map DEBIAN_CONFIG:debian-config \
		DEBIAN_DWARF_OFFSETS:debian-dwarf-offsets \
		INITRAMFS:initramfs.cpio INITRAMFS_TINY:initramfs-tiny.cpio SPIN_INITRAMFS:spin-initramfs.cpio \
		ROOTFS:rootfs.ext4 ROOTFS_MANIFEST:rootfs-manifest.tsv ROOTFS_FILES:rootfs-files \
		KUT_PMU_FLAT:kvm-unit-tests-pmu.flat; do
		file=$CACHE/current/${var#*:}
		[ -e "$file" ] || continue
		printf '%s=%q\n' "${var%%:*}" "$(readlink -f "$file")"
	done
}

[ $# -gt 0 ] || set -- all
for target in "$@"; do
	case "$target" in
	-h | --help | help) usage ;;
	paths) print_paths ;;
	all)
		build_initramfs
		build_initramfs_tiny
		build_spin_initramfs
		build_debian_kernel
		build_default_kernel
		build_rootfs
		build_kvm_unit_tests
		;;
	default-kernel) build_default_kernel ;;
	nopci-kernel) build_nopci_kernel ;;
	debian-kernel) build_debian_kernel ;;
	initramfs) build_initramfs ;;
	rootfs) build_rootfs ;;
	initramfs-tiny) build_initramfs_tiny ;;
	spin-initramfs) build_spin_initramfs ;;
	kvm-unit-tests) build_kvm_unit_tests ;;
	*)
		usage >&2
		die "unknown target: $target"
		;;
	esac
done
