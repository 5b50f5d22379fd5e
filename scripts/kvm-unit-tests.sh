#!/usr/bin/env bash
# kvm-unit-tests' x86/pmu (unmodified upstream, ../shared/third_party/kvm-unit-tests-*.tar.gz) on
# vpmu-vmm, in the configurations scripts/test.sh does not boot (docs/kvm-unit-tests.md).
# Each configuration is one boot of up to ~25 minutes here (the test's CPL 0 code is
# emulated), run one after the other by the tier-3 test vmm/tests/kvm_unit_tests.rs, which
# compares the guest's result lines with
# guest-image/kvm-unit-tests/pmu.MODEL.VPMU.BACKEND.HOST-host.expected (HOST: the host's vendor).
#
# Usage: scripts/kvm-unit-tests.sh [MODEL:VPMU:BACKEND ...]
#   default: amd:cpu-switch:soft intel:cpu-switch:soft amd:domain-switch:soft
#            intel:domain-switch:soft intel:cpu-switch:sim intel:domain-switch:sim
#            amd:cpu-switch:sim amd:domain-switch:sim, and where the host has a PMU
#            (perf stat -e instructions counts) amd:cpu-switch:hw intel:domain-switch:hw
#   (scripts/test.sh boots the AMD model in cpu-switch; this runs them all)
#   MODEL amd|intel (--pmu-model), VPMU cpu-switch|domain-switch (--vpmu), BACKEND soft|hw|sim
#   (--vpmu-backend; hw needs a host PMU and VT-x/SVM; sim is the hw backend's code over the
#   simulated host PMU, which runs anywhere: see docs/kvm-unit-tests.md).
# What each run observed is written to $OUT/pmu.MODEL.VPMU.BACKEND.HOST-host.observed (OUT defaults to
# ./kvm-unit-tests-results), in the expected file's format: a configuration without an expected
# file fails and leaves its observed lines there, to be given reasons and checked in.
# Exit status: 0 when every configuration matched its expected file, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
say() { printf '\n[kvm-unit-tests] %s\n' "$*"; }

OUT=${OUT:-kvm-unit-tests-results}
if [ $# -eq 0 ]; then
	set -- amd:cpu-switch:soft intel:cpu-switch:soft amd:domain-switch:soft \
		intel:domain-switch:soft intel:cpu-switch:sim intel:domain-switch:sim \
		amd:cpu-switch:sim amd:domain-switch:sim
	if perf stat -x, -e instructions true 2>&1 | grep -q '^[0-9]'; then
		set -- "$@" amd:cpu-switch:hw intel:domain-switch:hw
	else
		say "no host PMU (perf stat -e instructions does not count): the hw backend's configurations are NOT RUN"
	fi
fi

# Every configuration is checked before anything is built or booted.
for config in "$@"; do
	IFS=: read -r model vpmu backend <<<"$config"
	ok=1
	case $model in amd | intel) ;; *) ok=0 ;; esac
	case $vpmu in cpu-switch | domain-switch) ;; *) ok=0 ;; esac
	case $backend in soft | hw | sim) ;; *) ok=0 ;; esac
	if [ "$ok" = 0 ]; then
		say "bad configuration '$config' (MODEL:VPMU:BACKEND: amd|intel, cpu-switch|domain-switch, soft|hw|sim)"
		exit 2
	fi
done

guest-image/build.sh kvm-unit-tests || exit 1
eval "$(guest-image/build.sh paths)"
: "${KUT_PMU_FLAT:?guest-image/build.sh paths did not name KUT_PMU_FLAT}"
mkdir -p "$OUT"
cargo build --release -p vmm --tests || exit 1

failed=()
for config in "$@"; do
	IFS=: read -r model vpmu backend <<<"$config"
	host=amd
	grep -q GenuineIntel /proc/cpuinfo && host=intel
	name=pmu.$model.$vpmu.$backend.$host-host
	say "$name: booting x86/pmu ($(date +%T); up to ~25 minutes)"
	if VPMU_TEST_KUT_PMU="$KUT_PMU_FLAT" VPMU_TEST_KUT_MODEL="$model" VPMU_TEST_KUT_VPMU="$vpmu" \
		VPMU_TEST_KUT_BACKEND="$backend" VPMU_TEST_KUT_OUT="$OUT/$name.observed" \
		cargo test --release -p vmm --test kvm_unit_tests -- --ignored --nocapture \
		>"$OUT/$name.log" 2>&1; then
		say "$name: matches guest-image/kvm-unit-tests/$name.expected"
	else
		say "$name: DIFFERS (or failed); log: $OUT/$name.log, observed: $OUT/$name.observed"
		grep -E '^(#[0-9]+ |the run ended|.*expected|thread .* panicked)' "$OUT/$name.log" | head -n 20
		failed+=("$name")
	fi
done
if [ ${#failed[@]} -gt 0 ]; then
	say "differ from their expected files: ${failed[*]}"
	exit 1
fi
say "all configurations match their expected files"
