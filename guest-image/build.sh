#!/usr/bin/env bash
# vPMU guest images: builds the guest kernels and initramfs and caches them outside the repo.
#
# Usage: guest-image/build.sh [TARGET...]
#   all              (default) initramfs, spin-initramfs, debian-kernel, default-kernel
#   default-kernel   minimal kernel from Debian's unmodified linux-source-6.1:
#                    tinyconfig + guest-image/kernel/minimal.config (4-6 min on 2 cores)
#   debian-kernel    the prebuilt linux-image-6.1.*-cloud-amd64 (downloaded, never installed;
#                    its real System.map comes from the matching -dbg package)
#   initramfs        busybox-static + guest-image/initramfs/init, uncompressed newc cpio (a guest
#                    kernel whose code is emulated spends ~170 s inflating a 1 MB gzip one)
#   spin-initramfs   only /init = guest-image/initramfs/spin-init.S: never makes a system call, so
#                    the kernel stays up where guest user space cannot run (docs/virtio-net.md)
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
INIT_SCRIPT=$HERE/initramfs/init
SPIN_INIT=$HERE/initramfs/spin-init.S
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
need_pkgs() {
	dpkg -s "$@" >/dev/null 2>&1 && return 0
	local p missing=()
	for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
	say "installing ${missing[*]} (apt-get)"
	apt_update
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		"${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
}

apt_update() {
	[ "$APT_UPDATED" = 1 ] && return 0
	say "apt-get update"
	"${SUDO[@]}" apt-get update -q >&2 || die "apt-get update failed"
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

kernel_make() {
	make -C "$1" KBUILD_BUILD_USER=vpmu KBUILD_BUILD_HOST=guest-image \
		KBUILD_BUILD_TIMESTAMP="$2" "${@:3}"
}

build_default_kernel() {
	need_pkgs "${KERNEL_PKGS[@]}"
	local ver kver k name final log stamp
	ver=$(pkg_version linux-source-6.1)
	kver=${ver%%-*}
	k=$(key default-kernel "$ver" "$(cat "$FRAGMENT")" "$(declare -p KERNEL_PKGS CONFIG_MAY_DIFFER)" \
		"$(declare -f build_default_kernel check_config kernel_make)")
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
			run_logged "$log" "make -j$JOBS vmlinux bzImage (4-6 min with -j2)" \
				kernel_make "$src" "$stamp" -j"$JOBS" vmlinux bzImage
			cp "$src/vmlinux" "$src/arch/x86/boot/bzImage" "$src/System.map" "$TMP/"
			cp "$src/.config" "$TMP/config"
			kernel_make "$src" "$stamp" -s kernelrelease >"$TMP/kernelrelease"
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
	k=$(key debian-kernel "$pkg" "$ver" "$(declare -f build_debian_kernel debian_kernel_pkg apt_download)")
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
			# linux-image-<version>-dbg package"). Take the real one from $pkg-dbg: a big
			# download, but System.map is near the start of its data.tar, so tar stops early.
			if [ "$(wc -c <"$TMP/System.map")" -lt 4096 ]; then
				say "its System.map is a placeholder; downloading $pkg-dbg $ver for the real one..."
				apt_download "$pkg-dbg=$ver"
				{ dpkg-deb --fsys-tarfile "$TMP"/*.deb 2>/dev/null || true; } |
					tar -x -C "$TMP" --occurrence=1 --wildcards './usr/lib/debug/boot/System.map-*'
				set -- "$TMP"/usr/lib/debug/boot/System.map-*
				[ -s "$1" ] || die "$pkg-dbg has no /usr/lib/debug/boot/System.map-*"
				mv "$1" "$TMP/System.map"
				rm -rf "${TMP:?}/usr" "$TMP"/*.deb
			fi
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
}

# ---------------------------------------------------------------------------------------------
# initramfs

build_initramfs() {
	need_pkgs busybox-static cpio
	local ver k final
	ver=$(pkg_version busybox-static)
	k=$(key initramfs "$ver" "$(cat "$INIT_SCRIPT")" "$(declare -f build_initramfs)")
	final=$CACHE/initramfs-$k
	if [ ! -f "$final/initramfs.cpio" ]; then
		lock initramfs
		if [ ! -f "$final/initramfs.cpio" ]; then
			new_tmp initramfs
			local root=$TMP/root app
			mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,root,etc,mnt}
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
			# The console must exist before /init runs (the kernel opens it for fds 0-2).
			if [ "$(id -u)" = 0 ]; then
				mknod -m 600 "$root/dev/console" c 5 1
				mknod -m 666 "$root/dev/null" c 1 3
			fi
			printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
			printf 'root:x:0:\n' >"$root/etc/group"
			find "$root" -exec touch -h -d @0 {} +
			(cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
				cpio -o -H newc -R 0:0 --reproducible --quiet) >"$TMP/initramfs.cpio"
			rm -rf "$root"
			publish "$final"
			say "built: initramfs ($(du -h "$final/initramfs.cpio" | cut -f1)): $final"
		fi
		unlock
	else
		say "cached: initramfs (busybox $ver, key $k): $final"
	fi
	link initramfs.cpio "$final/initramfs.cpio"
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

print_paths() {
	local var file
	for var in DEFAULT_VMLINUX:default-vmlinux DEFAULT_BZIMAGE:default-bzImage \
		DEFAULT_SYSTEM_MAP:default-System.map DEFAULT_CONFIG:default-config \
		DEBIAN_VMLINUZ:debian-vmlinuz DEBIAN_SYSTEM_MAP:debian-System.map DEBIAN_CONFIG:debian-config \
		INITRAMFS:initramfs.cpio SPIN_INITRAMFS:spin-initramfs.cpio; do
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
		build_spin_initramfs
		build_debian_kernel
		build_default_kernel
		;;
	default-kernel) build_default_kernel ;;
	debian-kernel) build_debian_kernel ;;
	initramfs) build_initramfs ;;
	spin-initramfs) build_spin_initramfs ;;
	*)
		usage >&2
		die "unknown target: $target"
		;;
	esac
done
