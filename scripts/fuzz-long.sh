#!/usr/bin/env bash
# Long fuzzing run of every guest-facing surface (docs/fuzzing.md): the property tests that
# `cargo test` runs in seconds, with many more cases (a few minutes on 2 cores). Prints the cases
# and operations per surface and the run time of each suite; a failure prints the minimal failing
# input (full log in target/fuzz-long-*.log) and makes the script exit non-zero.
#   MODEL_CASES   sequences per vPMU vendor (default 20000: ~7x10^6 MSR/RDPMC/counter operations each)
#   VIRTIO_CASES  virtio-net driver sequences (default 100000)
#   READER_CASES  damaged or random files per reader (default 200000)
#   EXIT_CASES    sequences of port I/O, MMIO and MSR exits (default 30000)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_CASES=${MODEL_CASES:-20000}
VIRTIO_CASES=${VIRTIO_CASES:-100000}
READER_CASES=${READER_CASES:-200000}
EXIT_CASES=${EXIT_CASES:-30000}

cargo test --release -p vpmu --test fuzz_model --no-run
cargo test --release -p vmm --test fuzz_virtio --test fuzz_readers --test fuzz_exits --no-run

failed=0
suite() { # name cases cargo-args...
  local name=$1 cases=$2 log status t0=$SECONDS
  shift 2
  log="target/fuzz-long-${name// /-}.log"
  set +e
  VPMU_FUZZ_CASES=$cases cargo test --release "$@" -- --nocapture --test-threads=2 >"$log" 2>&1
  status=$?
  set -e
  grep -E '^fuzz surface=|^test result' "$log" || true
  if [ "$status" != 0 ]; then
    grep -E -A30 '^Test failed|minimal failing input' "$log" | head -60 || true
    echo "[fuzz-long] $name: FAILED (log: $log)"
    failed=1
  fi
  echo "[fuzz-long] $name: $((SECONDS - t0)) s"
}

t0=$SECONDS
suite "vpmu model" "$MODEL_CASES" -p vpmu --test fuzz_model
suite "virtio-net" "$VIRTIO_CASES" -p vmm --test fuzz_virtio
suite "file readers" "$READER_CASES" -p vmm --test fuzz_readers
suite "exits" "$EXIT_CASES" -p vmm --test fuzz_exits
echo "[fuzz-long] total: $((SECONDS - t0)) s"
exit "$failed"
