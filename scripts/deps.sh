#!/usr/bin/env bash
# Installs the host packages the build and tests need (Debian), only when missing. Rust comes with
# the machine. busybox-static: vmm/tests/guest_results.rs runs the guest init library with it.
set -euo pipefail
need=()
for p in build-essential binutils busybox-static; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "[deps] installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "[deps] cargo not found: install Rust (rustup) first" >&2; exit 1; }
