//! Guest CPU identity: which vendor and CPU the guest believes it runs on.
//!
//! `--pmu-model intel` on a host that is not Intel gives the guest a whole Intel CPU, not only
//! Intel PMU MSRs: with the host's AuthenticAMD vendor string a Linux guest keeps its AMD perf
//! driver and never looks at CPUID leaf 0xA. [`intel`] rewrites KVM's supported CPUID table
//! (once per VM, before the per-vCPU normalisation in [`super::cpuid::for_vcpu`]) into a generic
//! Intel CPU with architectural performance monitoring:
//! - vendor "GenuineIntel", family 6 model [`INTEL_MODEL`], a model number no Linux release
//!   lists, so Linux takes its generic paths everywhere: `intel_pmu_init` prints "generic
//!   architected perfmon" and sets up no model-specific LBR/PEBS/uncore/topdown support, and
//!   no model-specific errata work-around or vulnerability list applies;
//! - CPUID.1 without the Intel features nothing here backs (DS/BTS/PEBS, DTES64, DS-CPL, VMX,
//!   SMX, EST, TM/TM2, PBE, xTPR, DCA, MONITOR/MWAIT, PDCM: the vPMU sets PDCM again when it
//!   answers IA32_PERF_CAPABILITIES);
//! - the leaves an Intel guest reads that an AMD host's table leaves empty: leaf 2 (no
//!   descriptors, "see leaf 4"), leaf 4 (the host's caches, from AMD's 0x8000001D, which has the
//!   same layout), leaf 0xB subleaves 0-2 (filled per vCPU by `for_vcpu`);
//! - the extended range cut to 0x80000008 with only the bits Intel defines there, and a brand
//!   string that says what the CPU is.
//!
//! Leaf 0xA itself is the vPMU's (`pmu::setup`); leaf 7 and the XSAVE leaves stay the host's.
//! Pure functions over the entries, unit-tested without /dev/kvm.

use kvm_bindings::{kvm_cpuid_entry2, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

mod amd;
pub(crate) use amd::{amd, is_amd, AMD_BRAND, AMD_FAMILY, AMD_MODEL};

/// CPU family of the Intel identity (P6 family: every arch-perfmon Core/Atom CPU).
pub(crate) const INTEL_FAMILY: u32 = 6;
/// Model number of the Intel identity: listed nowhere in Linux (6.1's intel-family.h lists
/// 0x09..0xCF with gaps; 0x6B is one of the gaps), so no model-specific code runs.
pub(crate) const INTEL_MODEL: u32 = 0x6b;
// >= 0xE: init_intel takes the constant-TSC, fast-string and PAT paths of a modern CPU.
const _: () = assert!(INTEL_MODEL >= 0x0e && INTEL_MODEL <= 0xff);
/// Stepping of the Intel identity.
pub(crate) const INTEL_STEPPING: u32 = 1;
/// Brand string (CPUID 0x80000002-4), NUL-padded to 48 bytes.
pub(crate) const INTEL_BRAND: &str = "vPMU virtual Intel CPU (arch perfmon)";

/// The vendor string as CPUID.0 returns it (EBX, EDX, ECX).
const GENUINE_INTEL: [u32; 3] = [
    u32::from_le_bytes(*b"Genu"),
    u32::from_le_bytes(*b"ineI"),
    u32::from_le_bytes(*b"ntel"),
];

// CPUID.1:ECX features this VMM cannot back for an Intel guest.
const ECX_DTES64: u32 = 1 << 2;
const ECX_MONITOR: u32 = 1 << 3;
const ECX_DS_CPL: u32 = 1 << 4;
const ECX_VMX: u32 = 1 << 5;
const ECX_SMX: u32 = 1 << 6;
const ECX_EST: u32 = 1 << 7;
const ECX_TM2: u32 = 1 << 8;
const ECX_CNXT_ID: u32 = 1 << 10;
const ECX_SDBG: u32 = 1 << 11;
const ECX_XTPR: u32 = 1 << 14;
const ECX_PDCM: u32 = 1 << 15;
const ECX_DCA: u32 = 1 << 18;
const LEAF1_ECX_HIDDEN: u32 = ECX_DTES64
    | ECX_MONITOR
    | ECX_DS_CPL
    | ECX_VMX
    | ECX_SMX
    | ECX_EST
    | ECX_TM2
    | ECX_CNXT_ID
    | ECX_SDBG
    | ECX_XTPR
    | ECX_PDCM
    | ECX_DCA;
// CPUID.1:EDX: processor serial number, debug store, ACPI thermal MSRs, TM, PBE.
const LEAF1_EDX_HIDDEN: u32 = 1 << 18 | 1 << 21 | 1 << 22 | 1 << 29 | 1 << 31;

/// Highest extended leaf of the Intel identity.
const EXT_MAX: u32 = 0x8000_0008;
/// Fn8000_0001_ECX bits Intel defines: LAHF/SAHF, LZCNT, PREFETCHW.
const EXT1_ECX_INTEL: u32 = 1 << 0 | 1 << 5 | 1 << 8;
/// Fn8000_0001_EDX bits Intel defines: SYSCALL, NX, 1 GiB pages, RDTSCP, long mode.
const EXT1_EDX_INTEL: u32 = 1 << 11 | 1 << 20 | 1 << 26 | 1 << 27 | 1 << 29;
/// Fn8000_0007_EDX: invariant TSC (the only bit Intel defines).
const EXT7_EDX_INVARIANT_TSC: u32 = 1 << 8;
/// Fn8000_0008_EBX: WBNOINVD (the only bit Intel defines).
const EXT8_EBX_WBNOINVD: u32 = 1 << 9;
/// AMD's cache topology leaf, laid out like Intel's leaf 4.
const AMD_CACHE_LEAF: u32 = 0x8000_001d;
/// Leaf 4 subleaves taken over at most (Linux stops at the first null one).
const MAX_CACHE_LEVELS: u32 = 8;

/// CPUID.1:EAX of the Intel identity.
pub(crate) const fn intel_signature() -> u32 {
    let ext_model = INTEL_MODEL >> 4;
    let model = INTEL_MODEL & 0xf;
    ext_model << 16 | INTEL_FAMILY << 8 | model << 4 | INTEL_STEPPING
}

/// Whether a CPUID table says GenuineIntel.
pub(crate) fn is_intel(table: &[kvm_cpuid_entry2]) -> bool {
    has_vendor(table, GENUINE_INTEL)
}

/// Whether leaf 0 of a CPUID table holds `vendor` (EBX, EDX, ECX).
fn has_vendor(table: &[kvm_cpuid_entry2], vendor: [u32; 3]) -> bool {
    table
        .iter()
        .find(|e| e.function == 0 && e.index == 0)
        .is_some_and(|e| [e.ebx, e.edx, e.ecx] == vendor)
}

fn leaf(function: u32, index: u32, regs: [u32; 4], flags: u32) -> kvm_cpuid_entry2 {
    kvm_cpuid_entry2 {
        function,
        index,
        flags,
        eax: regs[0],
        ebx: regs[1],
        ecx: regs[2],
        edx: regs[3],
        ..Default::default()
    }
}

/// A brand string as the 12 registers of 0x80000002-4 (NUL-padded, at most 47 bytes kept).
fn brand_regs(brand: &str) -> [u32; 12] {
    let mut bytes = [0u8; 48];
    let b = brand.as_bytes();
    bytes[..b.len().min(47)].copy_from_slice(&b[..b.len().min(47)]);
    let mut regs = [0u32; 12];
    for (r, chunk) in regs.iter_mut().zip(bytes.chunks_exact(4)) {
        *r = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
    regs
}

/// Leaves 0 and 1 of an identity: the vendor string (EBX, EDX, ECX), the signature, and CPUID.1
/// without the Intel-only features nothing here backs (both identities hide the same list).
/// Other leaves are left alone.
fn set_vendor_and_signature(e: &mut kvm_cpuid_entry2, vendor: [u32; 3], signature: u32) {
    match e.function {
        0 => [e.ebx, e.edx, e.ecx] = vendor,
        1 => {
            e.eax = signature;
            e.ecx &= !LEAF1_ECX_HIDDEN;
            e.edx &= !LEAF1_EDX_HIDDEN;
        }
        _ => {}
    }
}

/// KVM's supported table `host` as a generic Intel arch-perfmon CPU (see the module docs).
/// A table that already says GenuineIntel is returned unchanged: the guest keeps the host's
/// own Intel identity.
pub(crate) fn intel(host: &[kvm_cpuid_entry2]) -> Vec<kvm_cpuid_entry2> {
    if is_intel(host) {
        return host.to_vec();
    }
    let max_basic = host
        .iter()
        .find(|e| e.function == 0 && e.index == 0)
        .map_or(0, |e| e.eax);
    let max_ext = host
        .iter()
        .find(|e| e.function == 0x8000_0000 && e.index == 0)
        .map_or(0, |e| e.eax)
        .min(EXT_MAX);
    let amd_caches: Vec<&kvm_cpuid_entry2> = (0..MAX_CACHE_LEVELS)
        .map_while(|i| {
            host.iter()
                .find(|e| e.function == AMD_CACHE_LEAF && e.index == i && e.eax & 0x1f != 0)
        })
        .collect();
    let brand = brand_regs(INTEL_BRAND);

    let mut out = Vec::with_capacity(host.len() + 8);
    for e in host {
        let mut e = *e;
        set_vendor_and_signature(&mut e, GENUINE_INTEL, intel_signature());
        match e.function {
            // Added below.
            2 | 4 | 0xb => continue,
            0x8000_0000 => {
                e.eax = max_ext;
                (e.ebx, e.ecx, e.edx) = (0, 0, 0);
            }
            0x8000_0001 => {
                (e.eax, e.ebx) = (0, 0);
                e.ecx &= EXT1_ECX_INTEL;
                e.edx &= EXT1_EDX_INTEL;
            }
            f @ 0x8000_0002..=0x8000_0004 => {
                let i = (f - 0x8000_0002) as usize * 4;
                [e.eax, e.ebx, e.ecx, e.edx] = [brand[i], brand[i + 1], brand[i + 2], brand[i + 3]];
            }
            0x8000_0005 => (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0),
            // L2 cache in ECX (the same layout on both vendors).
            0x8000_0006 => (e.eax, e.ebx, e.edx) = (0, 0, 0),
            0x8000_0007 => {
                (e.eax, e.ebx, e.ecx) = (0, 0, 0);
                e.edx &= EXT7_EDX_INVARIANT_TSC;
            }
            0x8000_0008 => {
                e.ebx &= EXT8_EBX_WBNOINVD;
                (e.ecx, e.edx) = (0, 0);
            }
            f if (0x8000_0000..=0x8fff_ffff).contains(&f) && f > max_ext => continue,
            _ => {}
        }
        out.push(e);
    }
    if max_basic >= 2 {
        // AL = 1 (one CPUID.2 call), one descriptor 0xFF: "no cache descriptors, use leaf 4".
        out.push(leaf(2, 0, [0x0000_ff01, 0, 0, 0], 0));
    }
    if max_basic >= 4 {
        // Leaf 4 has the layout of AMD's Fn8000_001D (cache type, level, sharing, ways, sets);
        // EAX[31:26] (cores per package) and the sharing field are set per vCPU count.
        let sig = KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
        for (i, c) in amd_caches.iter().enumerate() {
            out.push(leaf(4, i as u32, [c.eax, c.ebx, c.ecx, c.edx], sig));
        }
        out.push(leaf(4, amd_caches.len() as u32, [0; 4], sig));
    }
    if max_basic >= 0xb {
        // Subleaf 0 SMT, 1 core, 2 invalid: the values are the vCPU's (`for_vcpu`).
        for i in 0..3 {
            out.push(leaf(0xb, i, [0; 4], KVM_CPUID_FLAG_SIGNIFCANT_INDEX));
        }
    }
    for f in 0x8000_0002..=0x8000_0004 {
        if f <= max_ext && !out.iter().any(|e| e.function == f) {
            let i = (f - 0x8000_0002) as usize * 4;
            out.push(leaf(
                f,
                0,
                [brand[i], brand[i + 1], brand[i + 2], brand[i + 3]],
                0,
            ));
        }
    }
    out
}

/// Host tables for the tests here and in `super::cpuid`.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    pub(crate) fn entry(function: u32, index: u32, regs: [u32; 4]) -> kvm_cpuid_entry2 {
        leaf(function, index, regs, 0)
    }

    /// An Intel Xeon build host as kvm_pvm reports it (KVM_GET_SUPPORTED_CPUID, abridged: the
    /// zero leaves 3, 5, 8-0x24 but 0xa and 0xb left out; 0x80000002-4 are zero in KVM's table).
    pub(crate) fn intel_host() -> Vec<kvm_cpuid_entry2> {
        vec![
            entry(0, 0, [0x24, 0x756e_6547, 0x6c65_746e, 0x4965_6e69]),
            entry(1, 0, [0x000a_0671, 0x0002_0800, 0x8120_2000, 0x0f8b_fbff]),
            entry(2, 0, [0x00fe_ff01, 0xf0, 0, 0]),
            entry(4, 0, [0x0400_0121, 0x02c0_003f, 0x3f, 0]),
            entry(4, 1, [0x0400_0122, 0x03c0_003f, 0x3f, 0]),
            entry(4, 2, [0x0400_0143, 0x03c0_003f, 0x7ff, 0]),
            entry(4, 3, [0x0400_4163, 0x03c0_003f, 0x0007_7fff, 0]),
            entry(4, 4, [0; 4]),
            entry(6, 0, [4, 0, 0, 0]),
            entry(7, 0, [2, 0x0180_2852, 0x1a01_0104, 0x2001_0000]),
            entry(0xa, 0, [0; 4]),
            entry(0xb, 0, [0; 4]),
            entry(0xd, 0, [0xe7, 0xa80, 0xa80, 0]),
            entry(
                0x4000_0000,
                0,
                [0x4000_0001, 0x4b4d_564b, 0x564b_4d56, 0x4d],
            ),
            entry(0x4000_0001, 0, [0x0100_7efb, 0, 0, 0]),
            entry(0x8000_0000, 0, [0x8000_0008, 0, 0, 0]),
            entry(0x8000_0001, 0, [0, 0, 0x101, 0x2010_0800]),
            entry(0x8000_0002, 0, [0; 4]),
            entry(0x8000_0003, 0, [0; 4]),
            entry(0x8000_0004, 0, [0; 4]),
            entry(0x8000_0005, 0, [0; 4]),
            entry(0x8000_0006, 0, [0, 0, 0x0800_7040, 0]),
            entry(0x8000_0007, 0, [0, 0, 0, 0x100]),
            entry(0x8000_0008, 0, [0x3930, 0, 0, 0]),
        ]
    }

    /// This project's AMD EPYC build host as kvm_pvm reports it (KVM_GET_SUPPORTED_CPUID,
    /// abridged).
    pub(crate) fn amd_host() -> Vec<kvm_cpuid_entry2> {
        let v = |s: &[u8; 4]| u32::from_le_bytes(*s);
        vec![
            entry(0, 0, [0x1c, v(b"Auth"), v(b"cAMD"), v(b"enti")]),
            entry(1, 0, [0x00a1_0f11, 0x0002_0800, 0x8120_2000, 0x078b_fbff]),
            entry(2, 0, [0; 4]),
            entry(4, 0, [0; 4]),
            entry(6, 0, [4, 0, 0, 0]),
            entry(7, 0, [1, 0x0180_0002, 0x104, 0x2000_0000]),
            entry(0xa, 0, [0; 4]),
            entry(0xb, 0, [0; 4]),
            entry(
                0x4000_0000,
                0,
                [0x4000_0001, 0x4b4d_564b, 0x564b_4d56, 0x4d],
            ),
            entry(
                0x8000_0000,
                0,
                [0x8000_0021, v(b"Auth"), v(b"cAMD"), v(b"enti")],
            ),
            entry(
                0x8000_0001,
                0,
                [0x00a1_0f11, 0x4000_0000, 0x0040_0393, 0x23d3_fbff],
            ),
            entry(0x8000_0002, 0, [0; 4]),
            entry(
                0x8000_0005,
                0,
                [0xff48_ff40, 0xff48_ff40, 0x2008_0140, 0x2008_0140],
            ),
            entry(
                0x8000_0006,
                0,
                [0x5c00_2200, 0x6c00_4200, 0x0400_6140, 0x0a00_9140],
            ),
            entry(0x8000_0007, 0, [0, 0, 0, 0x100]),
            entry(0x8000_0008, 0, [0x3030, 0x5002_0005, 0x7001, 0]),
            entry(0x8000_000a, 0, [0; 4]),
            entry(0x8000_001d, 0, [0x121, 0x01c0_003f, 0x3f, 0]),
            entry(0x8000_001d, 1, [0x122, 0x01c0_003f, 0x3f, 0]),
            entry(0x8000_001d, 2, [0x143, 0x01c0_003f, 0x7ff, 2]),
            entry(0x8000_001d, 3, [0x4163, 0x03c0_003f, 0x7fff, 1]),
            entry(0x8000_001d, 4, [0; 4]),
            entry(0x8000_001e, 0, [0; 4]),
            entry(0x8000_0021, 0, [0x204, 0, 6, 0]),
            entry(0x8000_0022, 0, [1, 6, 0, 0]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::tests_support::amd_host;

    use crate::vcpu::cpuid::find;

    fn vendor(t: &[kvm_cpuid_entry2]) -> String {
        let e = find(t, 0, 0).unwrap();
        [e.ebx, e.edx, e.ecx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .map(char::from)
            .collect()
    }

    #[test]
    fn vendor_and_signature_are_intel_family_6() {
        let t = intel(&amd_host());
        assert_eq!(vendor(&t), "GenuineIntel");
        assert!(is_intel(&t));
        assert!(!is_intel(&amd_host()));
        let eax = find(&t, 1, 0).unwrap().eax;
        let family = (eax >> 8) & 0xf;
        let model = ((eax >> 16) & 0xf) << 4 | (eax >> 4) & 0xf;
        assert_eq!((family, model, eax & 0xf), (6, INTEL_MODEL, INTEL_STEPPING));
        // Family 6 needs no extended family.
        assert_eq!(eax >> 20, 0);
        // The max basic leaf stays the host's.
        assert_eq!(find(&t, 0, 0).unwrap().eax, 0x1c);
    }

    #[test]
    fn the_model_is_not_one_linux_lists() {
        // Every family-6 model number in Linux 6.1's arch/x86/include/asm/intel-family.h, and
        // the ones later kernels added up to 6.12.
        let listed: &[u32] = &[
            0x09, 0x0e, 0x0f, 0x16, 0x17, 0x1a, 0x1c, 0x1d, 0x1e, 0x1f, 0x25, 0x26, 0x27, 0x2a,
            0x2c, 0x2d, 0x2e, 0x2f, 0x35, 0x36, 0x37, 0x3a, 0x3c, 0x3d, 0x3e, 0x3f, 0x45, 0x46,
            0x47, 0x4a, 0x4c, 0x4d, 0x4e, 0x4f, 0x55, 0x56, 0x57, 0x5a, 0x5c, 0x5e, 0x5f, 0x66,
            0x6a, 0x6c, 0x75, 0x7a, 0x7d, 0x7e, 0x85, 0x86, 0x8a, 0x8c, 0x8d, 0x8e, 0x8f, 0x96,
            0x97, 0x9a, 0x9c, 0x9d, 0x9e, 0xa5, 0xa6, 0xa7, 0xaa, 0xac, 0xad, 0xae, 0xaf, 0xb5,
            0xb6, 0xb7, 0xba, 0xbd, 0xbe, 0xbf, 0xc5, 0xc6, 0xcc, 0xcf, 0xdd,
        ];
        assert!(!listed.contains(&INTEL_MODEL));
    }

    #[test]
    fn features_nothing_backs_are_hidden() {
        let mut host = amd_host();
        // As if the host table advertised every Intel-only bit.
        host[1].ecx |= LEAF1_ECX_HIDDEN;
        host[1].edx |= LEAF1_EDX_HIDDEN;
        let t = intel(&host);
        let l1 = find(&t, 1, 0).unwrap();
        assert_eq!(l1.ecx & LEAF1_ECX_HIDDEN, 0);
        assert_eq!(l1.edx & LEAF1_EDX_HIDDEN, 0);
        // What the host has is kept: CX16 (hidden by the host-quirk policy, not here), x2APIC,
        // TSC deadline, hypervisor; FPU..SSE2 in EDX.
        assert_eq!(l1.ecx, 0x8120_2000);
        assert_eq!(l1.edx, 0x078b_fbff);
        assert_eq!(l1.ebx, 0x0002_0800);
    }

    #[test]
    fn extended_range_is_intels() {
        let t = intel(&amd_host());
        let max = find(&t, 0x8000_0000, 0).unwrap();
        assert_eq!((max.eax, max.ebx, max.ecx, max.edx), (0x8000_0008, 0, 0, 0));
        assert!(t
            .iter()
            .all(|e| !(0x8000_0009..0x9000_0000).contains(&e.function)));
        let e1 = find(&t, 0x8000_0001, 0).unwrap();
        assert_eq!((e1.eax, e1.ebx), (0, 0));
        assert_eq!(e1.ecx, 0x101); // LAHF, PREFETCHW
                                   // SYSCALL, NX, long mode (this host's table has no 1 GiB pages or RDTSCP); not MMXEXT,
                                   // FXSR_OPT or the copies of CPUID.1:EDX.
        assert_eq!(e1.edx, 1 << 11 | 1 << 20 | 1 << 29);
        assert_eq!(find(&t, 0x8000_0005, 0).unwrap().ecx, 0);
        assert_eq!(find(&t, 0x8000_0006, 0).unwrap().ecx, 0x0400_6140);
        assert_eq!(find(&t, 0x8000_0007, 0).unwrap().edx, 0x100);
        let e8 = find(&t, 0x8000_0008, 0).unwrap();
        assert_eq!((e8.eax, e8.ebx, e8.ecx), (0x3030, 0, 0));
        // The KVM leaves stay.
        assert!(find(&t, 0x4000_0000, 0).is_some());
    }

    #[test]
    fn brand_string_spells_the_identity() {
        let t = intel(&amd_host());
        let bytes: Vec<u8> = (0x8000_0002..=0x8000_0004)
            .flat_map(|f| {
                let e = find(&t, f, 0).unwrap_or_else(|| panic!("{f:#x} missing"));
                [e.eax, e.ebx, e.ecx, e.edx]
            })
            .flat_map(|r| r.to_le_bytes())
            .collect();
        assert_eq!(bytes.len(), 48);
        let s: String = bytes
            .iter()
            .take_while(|&&b| b != 0)
            .map(|&b| char::from(b))
            .collect();
        assert_eq!(s, INTEL_BRAND);
        assert_eq!(bytes[47], 0);
    }

    #[test]
    fn cache_leaf_4_comes_from_amds_cache_leaf() {
        let t = intel(&amd_host());
        for (i, eax) in [0x121u32, 0x122, 0x143, 0x4163].iter().enumerate() {
            let e = find(&t, 4, i as u32).unwrap();
            assert_eq!(e.eax, *eax);
            assert_eq!(e.flags, KVM_CPUID_FLAG_SIGNIFCANT_INDEX);
        }
        assert_eq!(find(&t, 4, 2).unwrap().ecx, 0x7ff);
        let end = find(&t, 4, 4).unwrap();
        assert_eq!(end.eax & 0x1f, 0, "leaf 4 must end with a null cache type");
        assert_eq!(t.iter().filter(|e| e.function == 4).count(), 5);
        // Leaf 2: one call, "use leaf 4".
        let l2 = find(&t, 2, 0).unwrap();
        assert_eq!(l2.eax, 0xff01);
        assert_eq!(t.iter().filter(|e| e.function == 2).count(), 1);
    }

    #[test]
    fn without_amd_cache_leaf_leaf_4_is_just_the_terminator() {
        let host: Vec<_> = amd_host()
            .into_iter()
            .filter(|e| e.function != AMD_CACHE_LEAF)
            .collect();
        let t = intel(&host);
        let fours: Vec<_> = t.iter().filter(|e| e.function == 4).collect();
        assert_eq!(fours.len(), 1);
        assert_eq!(fours[0].eax, 0);
    }

    #[test]
    fn topology_leaf_has_its_three_subleaves() {
        let t = intel(&amd_host());
        for i in 0..3 {
            let e = find(&t, 0xb, i).unwrap();
            assert_eq!(e.flags, KVM_CPUID_FLAG_SIGNIFCANT_INDEX);
        }
        assert_eq!(t.iter().filter(|e| e.function == 0xb).count(), 3);
    }

    #[test]
    fn an_intel_table_is_left_alone() {
        let t = intel(&amd_host());
        assert_eq!(intel(&t), t);
    }
}
