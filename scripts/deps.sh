#!/usr/bin/env bash
# Installs the host packages the build and tests need (Debian), only when missing. Rust comes with
# the machine. busybox-static: vmm/tests/guest_results.rs runs the guest init library with it.
# Prints one line per step; apt-get's output goes to a log ($VPMU_CACHE/logs/apt.log, the same
# one guest-image/build.sh uses), whose tail and path are printed if a step fails (exit 1).
set -euo pipefail
say() { printf '[deps] %s\n' "$*"; }
log=${VPMU_CACHE:-$HOME/.cache/vpmu}/logs/apt.log
SUDO=()
[ "$(id -u)" = 0 ] || SUDO=(sudo)

# step WHAT CMD...: one line, CMD's output appended to the log; on failure its tail, exit 1.
step() {
  local what=$1 t0=$SECONDS
  shift
  printf '[deps] %s... ' "$what"
  printf '\n==== %s: %s\n' "$(date -u '+%F %T')" "$what" >>"$log"
  if "$@" >>"$log" 2>&1; then
    printf 'done (%s s)\n' "$((SECONDS - t0))"
  else
    printf 'FAILED\n'
    say "last lines of $log:" >&2
    tail -n 30 "$log" >&2
    say "error: $what failed (full log: $log)" >&2
    exit 1
  fi
}

need=()
# xz-utils (xz, lzma), bzip2, lz4, zstd: the bzImage unit tests compress a payload with each.
for p in build-essential binutils busybox-static xz-utils bzip2 lz4 zstd; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  mkdir -p "$(dirname "$log")"
  say "installing ${need[*]} (apt-get output: $log)"
  step "apt-get update" "${SUDO[@]}" apt-get update -q
  step "apt-get install ${need[*]}" "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q "${need[@]}"
fi
command -v cargo >/dev/null || { say "cargo not found: install Rust (rustup) first" >&2; exit 1; }
