//! Once-per-VM and once-per-vCPU vPMU setup: choosing the model and backend, the MSR filter
//! that sends exactly the model's MSRs to user space, the guest CPUID edits, and the RDPMC rewrite.

use std::ops::RangeInclusive;

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_enable_cap, KVM_CAP_PMU_CAPABILITY, KVM_CAP_X86_USER_SPACE_MSR,
    KVM_MSR_EXIT_REASON_FILTER, KVM_PMU_CAP_DISABLE,
};
use kvm_ioctls::{MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VmFd};
use vpmu::{CpuidEdit, CpuidEntry, PmuConfig};

use vm_memory::GuestMemoryMmap;

use super::{rdpmc, BackendChoice, ModelChoice};

/// Why the host's PMU cannot back the hw backend.
#[derive(Debug, thiserror::Error)]
pub enum HostPmuError {
    #[error(
        "this host's PMU cannot count: perf_event_open(PERF_TYPE_HARDWARE, instructions) failed: \
         {0} (a host without a hardware PMU, or one perf cannot use; --vpmu-backend soft counts \
         cycle events from thread CPU time)"
    )]
    CannotOpen(std::io::Error),
    #[error(
        "this host's PMU cannot count: a hardware instructions event opened but counted 0 over \
         10,000 loop iterations (--vpmu-backend soft counts cycle events from thread CPU time)"
    )]
    CountsNothing,
}

/// Whether the host's hardware PMU really counts for this process: a `perf_event_open` of
/// PERF_TYPE_HARDWARE / INSTRUCTIONS on the calling thread opens and counts some instructions
/// (what `perf stat -e instructions true` needs; a sysfs `cpu` directory alone does not say it
/// counts). The hw backend is chosen (`auto`) or accepted (`hw`) only where this holds; the
/// tests run it for real here, and over the simulated host PMU (`--vpmu-backend sim`) elsewhere.
pub(crate) fn host_pmu_counts() -> Result<(), HostPmuError> {
    use super::perf::{HostPerf, PerfEvent, PerfRequest, PerfSys};
    const PERF_COUNT_HW_INSTRUCTIONS: u64 = 1;
    let mut perf = HostPerf {
        signal: crate::vcpu_access::kick::kick_signal(),
    };
    let req = PerfRequest {
        exclude_kernel: true,
        ..PerfRequest::counting(PerfEvent::Hardware(PERF_COUNT_HW_INSTRUCTIONS))
    };
    let fd = perf.open(&req).map_err(HostPmuError::CannotOpen)?;
    let work: u64 = (0..10_000u64).map(std::hint::black_box).sum();
    std::hint::black_box(work);
    let n = perf.read(fd);
    perf.close(fd);
    if n == 0 {
        return Err(HostPmuError::CountsNothing);
    }
    Ok(())
}

/// [`host_pmu_counts`] as a yes or no.
pub fn host_counts_instructions() -> bool {
    host_pmu_counts().is_ok()
}

/// Resolves `--vpmu-backend auto` (hw where the host's PMU counts, else soft) and refuses `hw`
/// on a host whose PMU does not count, at start, instead of a guest whose counters stay 0.
pub fn resolve_backend(choice: BackendChoice) -> Result<BackendChoice, HostPmuError> {
    match choice {
        BackendChoice::Auto => match host_pmu_counts() {
            Ok(()) => Ok(BackendChoice::Hw),
            Err(e) => {
                log::info!("--vpmu-backend auto: soft ({e})");
                Ok(BackendChoice::Soft)
            }
        },
        BackendChoice::Hw => host_pmu_counts().map(|()| BackendChoice::Hw),
        c => Ok(c),
    }
}

/// The PMU model for `--pmu-model`, following the CPUID vendor string for `auto`.
pub(crate) fn model_config(choice: ModelChoice, supported: &[kvm_cpuid_entry2]) -> PmuConfig {
    let intel = match choice {
        ModelChoice::Intel => true,
        ModelChoice::Amd => false,
        ModelChoice::Auto => supported
            .iter()
            .find(|e| e.function == 0)
            .map(|e| e.ebx == u32::from_le_bytes(*b"Genu"))
            .unwrap_or(false),
    };
    if intel {
        PmuConfig::Intel(vpmu::IntelConfig {
            tsx: has_tsx(supported),
            ..vpmu::IntelConfig::default()
        })
    } else {
        PmuConfig::amd()
    }
}

/// Whether the CPUID table has Intel TSX: RTM (leaf 7.0 EBX bit 11) or HLE (bit 4).
fn has_tsx(cpuid: &[kvm_cpuid_entry2]) -> bool {
    const HLE: u32 = 1 << 4;
    const RTM: u32 = 1 << 11;
    cpuid
        .iter()
        .find(|e| e.function == 7 && e.index == 0)
        .is_some_and(|e| e.ebx & (HLE | RTM) != 0)
}

/// Makes KVM send accesses to the MSRs in `ranges`, and reads of those in `read_only`, to user
/// space (KVM_EXIT_X86_RDMSR/WRMSR); every other MSR stays with KVM.
pub(crate) fn install_msr_filter(
    vm: &VmFd,
    ranges: &[RangeInclusive<u32>],
    read_only: &[RangeInclusive<u32>],
) -> Result<(), kvm_ioctls::Error> {
    let cap = kvm_enable_cap {
        cap: KVM_CAP_X86_USER_SPACE_MSR,
        args: [u64::from(KVM_MSR_EXIT_REASON_FILTER), 0, 0, 0],
        ..Default::default()
    };
    vm.enable_cap(&cap)?;
    let all: Vec<(&RangeInclusive<u32>, MsrFilterRangeFlags)> = ranges
        .iter()
        .map(|r| (r, MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE))
        .chain(read_only.iter().map(|r| (r, MsrFilterRangeFlags::READ)))
        .collect();
    let bitmaps: Vec<Vec<u8>> = all
        .iter()
        .map(|(r, _)| vec![0u8; (r.end() - r.start() + 1).div_ceil(8) as usize])
        .collect();
    let filter: Vec<MsrFilterRange<'_>> = all
        .iter()
        .zip(&bitmaps)
        .map(|((r, flags), bitmap)| MsrFilterRange {
            flags: *flags,
            base: *r.start(),
            msr_count: r.end() - r.start() + 1,
            bitmap,
        })
        .collect();
    vm.set_msr_filter(MsrFilterDefaultAction::ALLOW, &filter)
}

/// Applies the vPMU's CPUID edits to a KVM CPUID table.
pub fn apply_cpuid(table: &mut Vec<kvm_cpuid_entry2>, edits: &[CpuidEdit]) {
    let mut entries: Vec<CpuidEntry> = table
        .iter()
        .map(|e| CpuidEntry {
            function: e.function,
            index: e.index,
            eax: e.eax,
            ebx: e.ebx,
            ecx: e.ecx,
            edx: e.edx,
        })
        .collect();
    vpmu::cpuid::apply(edits, &mut entries);
    let flags_of = |f: u32, i: u32| {
        table
            .iter()
            .find(|e| e.function == f && e.index == i)
            .map(|e| e.flags)
    };
    let new: Vec<kvm_cpuid_entry2> = entries
        .iter()
        .map(|e| kvm_cpuid_entry2 {
            function: e.function,
            index: e.index,
            flags: flags_of(e.function, e.index).unwrap_or(0),
            eax: e.eax,
            ebx: e.ebx,
            ecx: e.ecx,
            edx: e.edx,
            ..Default::default()
        })
        .collect();
    *table = new;
}

/// The guest code the RDPMC search looks at.
pub(crate) enum GuestCode<'a> {
    /// A kernel ELF (as loaded: no KASLR, so its addresses are the guest's).
    Elf(Vec<u8>),
    /// A flat binary at an identity-mapped address (tiny guests).
    Flat { image: &'a [u8], base: u64 },
    /// Code run exactly as given (Multiboot kernels: kvm-unit-tests checks the unmodified
    /// instructions): nothing is looked for, nothing rewritten.
    Unpatched,
}

/// Finds the guest's RDPMC sites, rewrites them to RDMSR in guest memory, and logs each.
pub(crate) fn patch_rdpmc(
    mem: &GuestMemoryMmap,
    code: &GuestCode<'_>,
) -> Result<Vec<rdpmc::Site>, rdpmc::RdpmcError> {
    let sites = match code {
        GuestCode::Elf(elf) => rdpmc::find_sites(elf)?,
        GuestCode::Flat { image, base } => rdpmc::find_sites_flat(image, *base)?,
        GuestCode::Unpatched => {
            log::info!("RDPMC: the guest's code is run unmodified (no RDPMC rewritten)");
            return Ok(Vec::new());
        }
    };
    rdpmc::patch(mem, &sites)?;
    for s in &sites {
        log::info!("RDPMC at {s}: rewritten to RDMSR, served by the vPMU");
    }
    if sites.is_empty() {
        log::info!("RDPMC: the guest code has no RDPMC instruction");
    }
    Ok(sites)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32, ebx: u32, ecx: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            ebx,
            ecx,
            flags: 7,
            ..Default::default()
        }
    }

    #[test]
    fn model_follows_the_vendor_string() {
        let amd = [entry(0, 0, u32::from_le_bytes(*b"Auth"), 0)];
        let intel = [entry(0, 0, u32::from_le_bytes(*b"Genu"), 0)];
        assert_eq!(
            model_config(ModelChoice::Auto, &amd).vendor(),
            vpmu::Vendor::Amd
        );
        assert_eq!(
            model_config(ModelChoice::Auto, &intel).vendor(),
            vpmu::Vendor::Intel
        );
        assert_eq!(
            model_config(ModelChoice::Intel, &amd).vendor(),
            vpmu::Vendor::Intel
        );
    }

    #[test]
    fn the_intel_model_has_the_tsx_qualifiers_where_cpuid_has_rtm_or_hle() {
        let tsx = |ebx: u32| {
            let t = [
                entry(0, 0, u32::from_le_bytes(*b"Genu"), 0),
                entry(7, 0, ebx, 0),
            ];
            match model_config(ModelChoice::Auto, &t) {
                PmuConfig::Intel(c) => c.tsx,
                PmuConfig::Amd(_) => panic!("an Intel vendor string"),
            }
        };
        assert!(tsx(1 << 11), "RTM");
        assert!(tsx(1 << 4), "HLE");
        assert!(!tsx(!(1 << 11 | 1 << 4)));
    }

    #[test]
    fn cpuid_edits_keep_kvm_flags_and_hide_the_pmu() {
        let mut t = vec![
            entry(0x8000_0000, 0, 0, 0),
            entry(0x8000_0001, 0, 0, 1 << 23),
            entry(1, 0, 0, 1 << 15),
        ];
        t[0].eax = 0x8000_0022;
        apply_cpuid(&mut t, &vpmu::cpuid::hide_pmu());
        let ext = t.iter().find(|e| e.function == 0x8000_0001).unwrap();
        assert_eq!(ext.ecx & (1 << 23), 0);
        assert_eq!(ext.flags, 7);
        assert_eq!(
            t.iter().find(|e| e.function == 1).unwrap().ecx & (1 << 15),
            0
        );
    }
}

/// Whether KVM can be told to turn its own vPMU off for this VM: KVM_CHECK_EXTENSION
/// (KVM_CAP_PMU_CAPABILITY) returns the flags KVM_ENABLE_CAP accepts, 0 when the host's KVM has
/// no PMU at all (`enable_pmu=N`, as on this workplace's host: RDPMC then faults already).
pub(crate) fn can_disable_kvm_pmu(pmu_capability: i32) -> bool {
    pmu_capability > 0 && pmu_capability as u32 & KVM_PMU_CAP_DISABLE != 0
}

/// For `--rdpmc trap`: KVM must not answer RDPMC from its own PMU (then it injects #GP, which
/// the trap serves: `kvm_pmu_rdpmc` fails for a PMU of version 0). Must run before the first
/// vCPU is created. Returns whether KVM's PMU was turned off (false: it has none).
pub(crate) fn disable_kvm_pmu(vm: &VmFd) -> Result<bool, kvm_ioctls::Error> {
    if !can_disable_kvm_pmu(vm.check_extension_raw(KVM_CAP_PMU_CAPABILITY.into())) {
        return Ok(false);
    }
    let cap = kvm_enable_cap {
        cap: KVM_CAP_PMU_CAPABILITY,
        args: [u64::from(KVM_PMU_CAP_DISABLE), 0, 0, 0],
        ..Default::default()
    };
    vm.enable_cap(&cap)?;
    Ok(true)
}

#[cfg(test)]
mod trap_tests {
    use super::*;

    #[test]
    fn kvm_pmu_is_turned_off_only_where_kvm_offers_it() {
        assert!(
            !can_disable_kvm_pmu(0),
            "enable_pmu=N (this host): nothing to turn off"
        );
        assert!(!can_disable_kvm_pmu(-22), "an error is not an offer");
        assert!(can_disable_kvm_pmu(KVM_PMU_CAP_DISABLE as i32));
        assert!(!can_disable_kvm_pmu(2), "a flag that is not DISABLE");
    }
}
