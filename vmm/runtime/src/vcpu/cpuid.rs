//! Guest CPUID: KVM's supported table, normalised per vCPU (APIC ids, topology, hypervisor bit),
//! with the host-quirk adjustments applied. (The PMU leaves are the vPMU's: `pmu::setup`; the
//! vendor identity, when it differs from the host's, is [`super::identity`], applied before.)
//! A pure function over the entries so it is unit-tested without /dev/kvm.

use kvm_bindings::kvm_cpuid_entry2;

/// What to change, besides topology.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuidPolicy {
    /// Hide CMPXCHG16B (the host emulator hangs on `lock cmpxchg16b`).
    pub hide_cx16: bool,
    /// Clear KVM paravirt features that are used through hypercalls (VMCALL never returns on
    /// hosts that emulate guest kernel code).
    pub hide_hypercall_features: bool,
}

const LEAF1_ECX_CX16: u32 = 1 << 13;
const LEAF1_ECX_X2APIC: u32 = 1 << 21;
const LEAF1_ECX_HYPERVISOR: u32 = 1 << 31;
const LEAF1_EDX_HTT: u32 = 1 << 28;
const EXT1_ECX_TOPOEXT: u32 = 1 << 22;
const KVM_FEATURE_PV_UNHALT: u32 = 1 << 7;
const KVM_FEATURE_PV_SEND_IPI: u32 = 1 << 11;
const KVM_FEATURE_PV_SCHED_YIELD: u32 = 1 << 13;
const KVM_FEATURE_HC_MAP_GPA_RANGE: u32 = 1 << 16;

/// Number of bits needed to hold `n - 1` (ids of n threads).
fn id_bits(n: u32) -> u32 {
    32 - n.saturating_sub(1).leading_zeros()
}

/// Returns vCPU `id`'s CPUID table (of `n` vCPUs, one core each in one package).
pub(crate) fn for_vcpu(
    supported: &[kvm_cpuid_entry2],
    id: u32,
    n: u32,
    policy: CpuidPolicy,
) -> Vec<kvm_cpuid_entry2> {
    let intel = super::identity::is_intel(supported);
    let mut out = Vec::with_capacity(supported.len());
    for e in supported {
        let mut e = *e;
        match (e.function, e.index) {
            (1, _) => {
                e.ebx = (e.ebx & 0x0000_ffff) | (id << 24) | (n.next_power_of_two().max(1) << 16);
                e.ecx |= LEAF1_ECX_HYPERVISOR;
                e.ecx &= !LEAF1_ECX_X2APIC; // the in-kernel LAPIC is used in xAPIC mode
                if n > 1 {
                    e.edx |= LEAF1_EDX_HTT;
                }
                if policy.hide_cx16 {
                    e.ecx &= !LEAF1_ECX_CX16;
                }
            }
            (4, _) if e.eax & 0x1f != 0 => {
                // Intel deterministic cache parameters: cores per package in EAX[31:26]; the
                // threads sharing the cache in EAX[25:14]: one per core for L1/L2, the whole
                // package for L3 and beyond (a null entry, which ends the list, is left alone).
                let level = (e.eax >> 5) & 0x7;
                let sharing = if level >= 3 {
                    n.next_power_of_two() - 1
                } else {
                    0
                };
                e.eax =
                    (e.eax & 0x0000_3fff) | (sharing << 14) | ((n.next_power_of_two() - 1) << 26);
            }
            (0xb, sub) | (0x1f, sub) => {
                // Extended topology: one thread per core, n cores.
                e.edx = id;
                match sub {
                    0 => {
                        e.eax = 0;
                        e.ebx = 1;
                        e.ecx = 1 << 8;
                    }
                    1 => {
                        e.eax = id_bits(n);
                        e.ebx = n;
                        e.ecx = (2 << 8) | 1;
                    }
                    _ => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = sub;
                    }
                }
            }
            (0x4000_0001, _) if policy.hide_hypercall_features => {
                e.eax &= !(KVM_FEATURE_PV_UNHALT
                    | KVM_FEATURE_PV_SEND_IPI
                    | KVM_FEATURE_PV_SCHED_YIELD
                    | KVM_FEATURE_HC_MAP_GPA_RANGE);
            }
            (0x8000_0001, _) => {
                // No TOPOEXT: Linux then takes the core count from 0x80000008.
                e.ecx &= !EXT1_ECX_TOPOEXT;
            }
            // AMD's core count (Intel leaves ECX reserved).
            (0x8000_0008, _) if !intel => {
                e.ecx = (e.ecx & !0xf0ff) | (id_bits(n) << 12) | (n - 1);
            }
            (0x8000_001e, _) => continue,
            _ => {}
        }
        out.push(e);
    }
    out
}

/// Looks an entry up (the unit tests of the CPUID edits).
#[cfg(test)]
pub(crate) fn find(
    entries: &[kvm_cpuid_entry2],
    function: u32,
    index: u32,
) -> Option<&kvm_cpuid_entry2> {
    entries
        .iter()
        .find(|e| e.function == function && e.index == index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        function: u32,
        index: u32,
        eax: u32,
        ebx: u32,
        ecx: u32,
        edx: u32,
    ) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax,
            ebx,
            ecx,
            edx,
            ..Default::default()
        }
    }

    fn host() -> Vec<kvm_cpuid_entry2> {
        vec![
            entry(
                1,
                0,
                0xa10f11,
                0x0008_0800,
                LEAF1_ECX_CX16 | 1 << 15 | LEAF1_ECX_X2APIC,
                0,
            ),
            entry(0xa, 0, 0x0730_0402, 0, 0, 0x603),
            entry(0xb, 0, 1, 2, 0x100, 7),
            entry(0xb, 1, 4, 16, 0x201, 7),
            entry(0x4000_0001, 0, 0xffff_ffff, 0, 0, 0),
            entry(0x8000_0001, 0, 0, 0, EXT1_ECX_TOPOEXT | 1 << 23, 0),
            entry(0x8000_0008, 0, 0x3030, 0, 0x700f, 0),
            entry(0x8000_001e, 0, 0, 0, 0, 0),
            entry(0x8000_0022, 0, 1, 6, 0, 0),
        ]
    }

    #[test]
    fn topology_and_apic_ids_follow_vcpu_count() {
        for n in [1u32, 2, 3, 8] {
            for id in 0..n {
                let t = for_vcpu(&host(), id, n, CpuidPolicy::default());
                let l1 = find(&t, 1, 0).unwrap();
                assert_eq!(l1.ebx >> 24, id);
                assert_ne!(l1.ecx & LEAF1_ECX_HYPERVISOR, 0);
                assert_eq!(l1.ecx & LEAF1_ECX_X2APIC, 0);
                assert_eq!(l1.edx & LEAF1_EDX_HTT != 0, n > 1);
                assert_eq!(find(&t, 0xb, 1).unwrap().ebx, n);
                assert_eq!(find(&t, 0xb, 0).unwrap().edx, id);
                assert_eq!(find(&t, 0x8000_0008, 0).unwrap().ecx & 0xff, n - 1);
                assert!(find(&t, 0x8000_001e, 0).is_none());
                assert_eq!(find(&t, 0x8000_0001, 0).unwrap().ecx & EXT1_ECX_TOPOEXT, 0);
            }
        }
    }

    #[test]
    fn policy_hides_what_it_says() {
        let t = for_vcpu(&host(), 0, 1, CpuidPolicy::default());
        assert_ne!(find(&t, 1, 0).unwrap().ecx & LEAF1_ECX_CX16, 0);
        assert_ne!(
            find(&t, 0x4000_0001, 0).unwrap().eax & KVM_FEATURE_PV_UNHALT,
            0
        );
        let p = CpuidPolicy {
            hide_cx16: true,
            hide_hypercall_features: true,
        };
        let t = for_vcpu(&host(), 0, 1, p);
        assert_eq!(find(&t, 1, 0).unwrap().ecx & LEAF1_ECX_CX16, 0);
        assert_eq!(
            find(&t, 0x4000_0001, 0).unwrap().eax & KVM_FEATURE_PV_UNHALT,
            0
        );
        // PMU leaves are left alone here (the vPMU edits them).
        assert_eq!(find(&t, 0xa, 0).unwrap().eax, 0x0730_0402);
    }

    /// What Linux 6.1's Intel topology code (detect_extended_topology, intel_num_cpu_cores,
    /// init_intel_cacheinfo) makes of vCPU `id`'s table: (package, core, cores per package,
    /// threads sharing the LLC).
    fn linux_intel_view(t: &[kvm_cpuid_entry2]) -> (u32, u32, u32, u32) {
        let l0 = find(t, 0xb, 0).unwrap();
        assert_eq!((l0.ecx >> 8) & 0xff, 1, "subleaf 0 must be the SMT level");
        assert_ne!(l0.ebx, 0, "leaf 0xB must be valid");
        let apicid = l0.edx;
        let (mut core_shift, mut cores) = (l0.eax & 0x1f, l0.ebx & 0xffff);
        let mut sub = 1;
        loop {
            let e = find(t, 0xb, sub).unwrap_or_else(|| panic!("0xB subleaf {sub} missing"));
            match (e.ecx >> 8) & 0xff {
                0 => break,
                2 => (core_shift, cores) = (e.eax & 0x1f, e.ebx & 0xffff),
                _ => {}
            }
            assert_eq!(e.edx, apicid, "x2APIC id differs between subleaves");
            sub += 1;
            assert!(sub < 8, "leaf 0xB does not end");
        }
        let smt_shift = l0.eax & 0x1f;
        let package = apicid >> core_shift;
        let core = (apicid & ((1 << core_shift) - 1)) >> smt_shift;
        let llc = (0..)
            .map_while(|i| find(t, 4, i).filter(|e| e.eax & 0x1f != 0))
            .last()
            .map_or(0, |e| ((e.eax >> 14) & 0xfff) + 1);
        (package, core, cores, llc)
    }

    #[test]
    fn an_intel_identity_has_one_package_of_n_cores() {
        let amd = crate::vcpu::identity::tests_support::amd_host();
        let intel = crate::vcpu::identity::intel(&amd);
        for n in [1u32, 2, 3, 4] {
            for id in 0..n {
                let t = for_vcpu(&intel, id, n, CpuidPolicy::default());
                let (package, core, cores, llc) = linux_intel_view(&t);
                assert_eq!((package, core, cores), (0, id, n), "n={n} id={id}");
                assert!(llc >= n, "the L3 is shared by all {n} vCPUs: {llc}");
                let l1 = find(&t, 1, 0).unwrap();
                assert_eq!(l1.ebx >> 24, id, "initial APIC id");
                assert_eq!(l1.edx & LEAF1_EDX_HTT != 0, n > 1);
                // Intel's legacy core count (leaf 4 EAX[31:26] + 1) covers n.
                let l4 = find(&t, 4, 0).unwrap();
                assert!((l4.eax >> 26) + 1 >= n);
                // L1 is per core.
                assert_eq!((l4.eax >> 14) & 0xfff, 0);
                // Intel leaves 0x80000008 ECX reserved.
                assert_eq!(find(&t, 0x8000_0008, 0).unwrap().ecx, 0);
            }
        }
    }
}
