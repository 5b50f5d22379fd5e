//! The AMD identity: `--pmu-model amd` on a host that is not AMD.
//!
//! With the host's GenuineIntel vendor string a guest never takes its AMD PMU code: Linux
//! starts its Intel perf driver (which finds no leaf 0xA), and kvm-unit-tests' x86/pmu chooses
//! its tests by the vendor (`is_intel()`), so on an Intel host it skipped every AMD sub-test
//! ("No Intel Arch PMU is detected!"). [`amd`] rewrites KVM's supported table into a generic
//! AMD CPU, the mirror of [`super::intel`]:
//! - vendor "AuthenticAMD" (leaf 0 and, as AMD parts do, leaf 0x80000000), family 0x19 model
//!   0x11 stepping 1, the signature of the AMD EPYC hosts ../shared/HOST-FACTS.md describes
//!   (Linux's "Fam17h+ core perfctr" path, PerfCtrExtCore's six counters). Unlike the Intel
//!   identity's this is a model Linux lists: for a family-0x17/0x19 model it does not know, 6.1
//!   prints a WARNING splat at boot (`bsp_init_amd`, the Zen generation); the model-specific
//!   work-arounds of that generation check the hypervisor bit first;
//! - CPUID.1 without the Intel-only features (the same list the Intel identity hides, VMX
//!   among them); leaves 2 and 4 (Intel's cache descriptors) dropped, as AMD leaves them
//!   reserved: an AMD guest reads its caches from 0x80000005/6 (0x80000006 has the same L2
//!   layout on both vendors and is kept);
//! - 0x80000001 with the family signature in EAX and the host's LAHF/LZCNT/PREFETCHW and
//!   SYSCALL/NX/1 GiB/RDTSCP/long-mode bits; 0x80000008 EBX says XSAVEERPTR (FXSAVE saves the
//!   x87 error pointers, as every Intel CPU does): without it Linux assumes AMD's old pointer
//!   leak and clears the x87 state with FNCLEX on every FPU restore, an instruction this host's
//!   emulator of guest CPL 0 cannot run; the PMU bits (PerfCtrExtCore, leaf 0x80000022
//!   for PerfMonV2) are the vPMU's edits (`pmu::setup`), applied after this;
//! - a brand string that says what the CPU is.
//!
//! Leaf 7 stays the host's but for TSX (HLE, RTM: no AMD CPU has it; kvm_pvm ignores leaf 7 of
//! KVM_SET_CPUID2, so there the guest still sees the host's RTM), and so do the XSAVE leaves.

use kvm_bindings::kvm_cpuid_entry2;

use super::{brand_regs, has_vendor, leaf, set_vendor_and_signature};

/// CPU family of the AMD identity (Zen 3/4: base family 0xF + extended family 0xA).
pub(crate) const AMD_FAMILY: u32 = 0x19;
/// Model number of the AMD identity (EPYC 9004, Zen 4: what the AMD build hosts report).
pub(crate) const AMD_MODEL: u32 = 0x11;
/// Stepping of the AMD identity.
pub(super) const AMD_STEPPING: u32 = 1;
/// Brand string (CPUID 0x80000002-4).
pub(crate) const AMD_BRAND: &str = "vPMU virtual AMD CPU (PerfCtrExtCore)";
/// CPUID.7.0:EBX: HLE and RTM (Intel TSX).
const LEAF7_EBX_TSX: u32 = 1 << 4 | 1 << 11;
/// Fn8000_0008_EBX: FXSAVE/XSAVE always save the x87 error pointers.
const EXT8_EBX_XSAVEERPTR: u32 = 1 << 2;

/// The vendor string as CPUID.0 returns it (EBX, EDX, ECX).
const AUTHENTIC_AMD: [u32; 3] = [
    u32::from_le_bytes(*b"Auth"),
    u32::from_le_bytes(*b"enti"),
    u32::from_le_bytes(*b"cAMD"),
];

/// Highest extended leaf kept at least (AMD's core count lives in 0x80000008; the vPMU's
/// PerfMonV2 leaf raises it to 0x80000022).
const EXT_MIN_MAX: u32 = 0x8000_0008;

/// CPUID.1:EAX (and 0x80000001:EAX) of the AMD identity.
pub(super) const fn amd_signature() -> u32 {
    let ext_family = AMD_FAMILY - 0xf;
    let ext_model = AMD_MODEL >> 4;
    let model = AMD_MODEL & 0xf;
    ext_family << 20 | ext_model << 16 | 0xf << 8 | model << 4 | AMD_STEPPING
}

/// Whether a CPUID table says AuthenticAMD.
pub(crate) fn is_amd(table: &[kvm_cpuid_entry2]) -> bool {
    has_vendor(table, AUTHENTIC_AMD)
}

/// KVM's supported table `host` as a generic family-0x19 AMD CPU (see the module docs). A
/// table that already says AuthenticAMD is returned unchanged: the guest keeps the host's own
/// AMD identity.
pub(crate) fn amd(host: &[kvm_cpuid_entry2]) -> Vec<kvm_cpuid_entry2> {
    if is_amd(host) {
        return host.to_vec();
    }
    let max_ext = host
        .iter()
        .find(|e| e.function == 0x8000_0000 && e.index == 0)
        .map_or(0, |e| e.eax)
        .max(EXT_MIN_MAX);
    let brand = brand_regs(AMD_BRAND);
    let [vb, vd, vc] = AUTHENTIC_AMD;

    let mut out = Vec::with_capacity(host.len() + 4);
    for e in host {
        let mut e = *e;
        set_vendor_and_signature(&mut e, AUTHENTIC_AMD, amd_signature());
        match e.function {
            2 | 4 => continue,
            7 if e.index == 0 => e.ebx &= !LEAF7_EBX_TSX,
            0x8000_0008 => e.ebx |= EXT8_EBX_XSAVEERPTR,
            // Added below, whatever the host has.
            0x8000_0000..=0x8000_0004 => continue,
            _ => {}
        }
        out.push(e);
    }
    let ext1 = host
        .iter()
        .find(|e| e.function == 0x8000_0001 && e.index == 0);
    out.push(leaf(0x8000_0000, 0, [max_ext, vb, vc, vd], 0));
    out.push(leaf(
        0x8000_0001,
        0,
        [
            amd_signature(),
            0,
            ext1.map_or(0, |e| e.ecx),
            ext1.map_or(0, |e| e.edx),
        ],
        0,
    ));
    for (i, f) in (0x8000_0002..=0x8000_0004).enumerate() {
        let r = &brand[i * 4..i * 4 + 4];
        out.push(leaf(f, 0, [r[0], r[1], r[2], r[3]], 0));
    }
    // The leaves up to 0x80000008 an AMD guest reads, zero where the host has none.
    for f in 0x8000_0005..=EXT_MIN_MAX {
        if !out.iter().any(|e| e.function == f) {
            out.push(leaf(f, 0, [0; 4], 0));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests_support::{entry, intel_host};
    use super::super::{intel, is_intel, LEAF1_ECX_HIDDEN, LEAF1_EDX_HIDDEN};
    use super::*;

    use crate::vcpu::cpuid::find;

    fn string(regs: &[u32]) -> String {
        regs.iter()
            .flat_map(|r| r.to_le_bytes())
            .take_while(|&b| b != 0)
            .map(char::from)
            .collect()
    }

    #[test]
    fn vendor_and_signature_are_the_amd_hosts() {
        let t = amd(&intel_host());
        assert!(is_amd(&t));
        assert!(!is_intel(&t));
        let v = find(&t, 0, 0).unwrap();
        assert_eq!(string(&[v.ebx, v.edx, v.ecx]), "AuthenticAMD");
        // The max basic leaf stays the host's.
        assert_eq!(v.eax, 0x24);
        let eax = find(&t, 1, 0).unwrap().eax;
        // Linux: family = base + extended when base is 0xF; model = ext << 4 | model.
        let family = ((eax >> 8) & 0xf) + ((eax >> 20) & 0xff);
        let model = ((eax >> 16) & 0xf) << 4 | (eax >> 4) & 0xf;
        assert_eq!((family, model, eax & 0xf), (0x19, 0x11, AMD_STEPPING));
        // The AMD EPYC hosts' own signature.
        let host = super::super::tests_support::amd_host();
        assert_eq!(eax, find(&host, 1, 0).unwrap().eax);
        assert_eq!(find(&t, 0x8000_0001, 0).unwrap().eax, eax);
        let e0 = find(&t, 0x8000_0000, 0).unwrap();
        assert_eq!(string(&[e0.ebx, e0.edx, e0.ecx]), "AuthenticAMD");
    }

    #[test]
    fn the_model_is_a_zen_generation_linux_knows() {
        // Linux 6.1's bsp_init_amd, family 0x19: Zen 3 0x00-0x0f, 0x20-0x5f; Zen 4 0x10-0x1f,
        // 0x60-0xaf; any other model is a WARNING at boot.
        let known = [(0x00, 0x0f), (0x20, 0x5f), (0x10, 0x1f), (0x60, 0xaf)];
        assert!(known
            .iter()
            .any(|(lo, hi)| (*lo..=*hi).contains(&AMD_MODEL)));
    }

    #[test]
    fn fxsave_saves_the_error_pointers() {
        let t = amd(&intel_host());
        assert_ne!(
            find(&t, 0x8000_0008, 0).unwrap().ebx & EXT8_EBX_XSAVEERPTR,
            0
        );
    }

    #[test]
    fn intel_only_features_and_leaves_are_gone() {
        let mut host = intel_host();
        host[1].ecx |= LEAF1_ECX_HIDDEN;
        host[1].edx |= LEAF1_EDX_HIDDEN;
        let t = amd(&host);
        let l1 = find(&t, 1, 0).unwrap();
        assert_eq!(l1.ecx & LEAF1_ECX_HIDDEN, 0);
        assert_eq!(l1.edx & LEAF1_EDX_HIDDEN, 0);
        // What both vendors have stays: SSE3.., x2APIC, TSC deadline, hypervisor; FPU..SSE2.
        assert_eq!(l1.ecx, 0x8120_2000 & !LEAF1_ECX_HIDDEN);
        assert_eq!(l1.edx, 0x0f8b_fbff & !LEAF1_EDX_HIDDEN);
        assert!(t.iter().all(|e| e.function != 2 && e.function != 4));
        // Leaf 7 stays but for TSX (this host's has RTM); the KVM leaves stay.
        assert_eq!(find(&t, 7, 0).unwrap().ebx, 0x0180_2042);
        assert!(find(&t, 0x4000_0000, 0).is_some());
    }

    #[test]
    fn extended_leaves_are_what_an_amd_guest_reads() {
        let t = amd(&intel_host());
        let e1 = find(&t, 0x8000_0001, 0).unwrap();
        assert_eq!((e1.ecx, e1.edx), (0x101, 0x2010_0800));
        assert_eq!(find(&t, 0x8000_0006, 0).unwrap().ecx, 0x0800_7040);
        assert_eq!(find(&t, 0x8000_0008, 0).unwrap().eax, 0x3930);
        assert_eq!(find(&t, 0x8000_0000, 0).unwrap().eax, 0x8000_0008);
        for f in 0x8000_0000..=0x8000_0008 {
            let n = t.iter().filter(|e| e.function == f).count();
            assert_eq!(n, 1, "{f:#x} once");
        }
        let brand: Vec<u32> = (0x8000_0002..=0x8000_0004)
            .flat_map(|f| {
                let e = find(&t, f, 0).unwrap();
                [e.eax, e.ebx, e.ecx, e.edx]
            })
            .collect();
        assert_eq!(string(&brand), AMD_BRAND);
    }

    #[test]
    fn a_short_extended_range_is_filled_to_0x80000008() {
        let host: Vec<_> = intel_host()
            .into_iter()
            .filter(|e| e.function < 0x8000_0000 || e.function > 0x8000_0001)
            .filter(|e| e.function < 0x8000_0005 || e.function > 0x8000_0008)
            .chain([entry(0x8000_0000, 0, [0x8000_0001, 0, 0, 0])])
            .collect();
        let t = amd(&host);
        assert_eq!(find(&t, 0x8000_0000, 0).unwrap().eax, 0x8000_0008);
        assert_eq!(find(&t, 0x8000_0008, 0).unwrap().eax, 0);
        assert_eq!(find(&t, 0x8000_0001, 0).unwrap().edx, 0);
    }

    #[test]
    fn an_amd_host_keeps_its_own_identity_and_the_two_identities_invert() {
        let t = amd(&intel_host());
        assert_eq!(amd(&t), t);
        // The Intel identity of the AMD identity is an Intel CPU again.
        assert!(is_intel(&intel(&t)));
    }
}
