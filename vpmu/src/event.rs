//! What a counter counts: the decoded event select, as a backend sees it.

use crate::msr::*;
use crate::Vendor;

/// A decoded event: the vendor's event code and qualifiers, or a fixed counter's built-in
/// event. Built by the model from IA32_PERFEVTSELx / PERF_CTLx or IA32_FIXED_CTR_CTRL and handed
/// to [`CounterBackend`](crate::CounterBackend) to decide whether and how it can count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event {
    /// Whose event codes `code`/`umask` are.
    pub vendor: Vendor,
    /// Event select: 8 bits on Intel; 12 bits on AMD (EventSelect\[11:8\] from bits 35:32).
    pub code: u16,
    /// Unit mask.
    pub umask: u8,
    /// Count at CPL > 0.
    pub usr: bool,
    /// Count at CPL 0.
    pub os: bool,
    /// Edge detect.
    pub edge: bool,
    /// Invert the counter-mask comparison.
    pub inv: bool,
    /// Counter mask (0 = count every event).
    pub cmask: u8,
    /// `Some(i)` for Intel fixed counter i (its event is built in: see [`Event::intel_fixed`]).
    pub fixed: Option<u8>,
    /// Intel IN_TX: only inside TSX transactional regions.
    pub in_tx: bool,
    /// Intel IN_TXCP: aborted transactions' events left out.
    pub in_tx_cp: bool,
}

/// The architectural events of Intel's CPUID leaf 0xA (SDM Vol. 3B, "Pre-defined Architectural
/// Performance Events"), in EBX bit order, plus their common AMD counterparts. Backends use it to
/// recognise the events they can count without knowing event-code tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArchEvent {
    /// UnHalted Core Cycles (Intel 0x3C/0x00, fixed counter 1; AMD 0x76).
    CoreCycles,
    /// Instructions Retired (Intel 0xC0/0x00, fixed counter 0; AMD 0xC0).
    Instructions,
    /// UnHalted Reference Cycles (Intel 0x3C/0x01, and fixed counter 2's pseudo-event 0x00/0x03).
    RefCycles,
    /// LLC References (Intel 0x2E/0x4F).
    LlcReferences,
    /// LLC Misses (Intel 0x2E/0x41).
    LlcMisses,
    /// Branch Instructions Retired (Intel 0xC4/0x00; AMD 0xC2).
    Branches,
    /// Branch Misses Retired (Intel 0xC5/0x00; AMD 0xC3).
    BranchMisses,
}

impl ArchEvent {
    /// The seven events of CPUID.0AH:EBX, bit 0 first.
    pub const INTEL_CPUID_ORDER: [ArchEvent; 7] = [
        ArchEvent::CoreCycles,
        ArchEvent::Instructions,
        ArchEvent::RefCycles,
        ArchEvent::LlcReferences,
        ArchEvent::LlcMisses,
        ArchEvent::Branches,
        ArchEvent::BranchMisses,
    ];

    /// Intel (event select, unit mask) of the general-purpose-counter form.
    pub const fn intel_code(self) -> (u8, u8) {
        match self {
            ArchEvent::CoreCycles => (0x3c, 0x00),
            ArchEvent::Instructions => (0xc0, 0x00),
            ArchEvent::RefCycles => (0x3c, 0x01),
            ArchEvent::LlcReferences => (0x2e, 0x4f),
            ArchEvent::LlcMisses => (0x2e, 0x41),
            ArchEvent::Branches => (0xc4, 0x00),
            ArchEvent::BranchMisses => (0xc5, 0x00),
        }
    }

    /// AMD event select (unit mask 0) where Linux's AMD driver has a generic mapping.
    pub const fn amd_code(self) -> Option<u16> {
        match self {
            ArchEvent::CoreCycles => Some(0x76),
            ArchEvent::Instructions => Some(0xc0),
            ArchEvent::Branches => Some(0xc2),
            ArchEvent::BranchMisses => Some(0xc3),
            _ => None,
        }
    }
}

/// Fixed counter i's event (SDM "Fixed-Function Performance Counters"; KVM's
/// `fixed_pmc_events`): instructions retired, core cycles, reference cycles (the TSC-rate
/// pseudo-event 0x00/0x03).
const INTEL_FIXED_EVENTS: [(u8, u8); 3] = [(0xc0, 0x00), (0x3c, 0x00), (0x00, 0x03)];

impl Event {
    /// Decodes IA32_PERFEVTSELx (SDM Vol. 3B, "IA32_PERFEVTSELx MSRs").
    pub fn from_intel_evtsel(sel: u64) -> Event {
        Event {
            vendor: Vendor::Intel,
            code: (sel & EVTSEL_EVENT) as u16,
            in_tx: sel & INTEL_EVTSEL_IN_TX != 0,
            in_tx_cp: sel & INTEL_EVTSEL_IN_TXCP != 0,
            ..Event::common_fields(Vendor::Intel, sel)
        }
    }

    /// Decodes AMD PERF_CTLx (APM Vol. 2, "Performance Event-Select Registers").
    pub fn from_amd_evtsel(sel: u64) -> Event {
        Event {
            vendor: Vendor::Amd,
            code: ((sel & EVTSEL_EVENT) | ((sel & AMD_EVTSEL_EVENT_HI) >> 24)) as u16,
            ..Event::common_fields(Vendor::Amd, sel)
        }
    }

    fn common_fields(vendor: Vendor, sel: u64) -> Event {
        Event {
            vendor,
            code: 0,
            umask: ((sel & EVTSEL_UMASK) >> 8) as u8,
            usr: sel & EVTSEL_USR != 0,
            os: sel & EVTSEL_OS != 0,
            edge: sel & EVTSEL_EDGE != 0,
            inv: sel & EVTSEL_INV != 0,
            cmask: (sel >> EVTSEL_CMASK_SHIFT) as u8,
            fixed: None,
            in_tx: false,
            in_tx_cp: false,
        }
    }

    /// Intel fixed counter `index` (0..3) counting at the given privilege levels.
    ///
    /// # Panics
    /// If `index` is 3 or more.
    pub fn intel_fixed(index: u8, usr: bool, os: bool) -> Event {
        let (code, umask) = INTEL_FIXED_EVENTS[index as usize];
        Event {
            vendor: Vendor::Intel,
            code: code.into(),
            umask,
            usr,
            os,
            edge: false,
            inv: false,
            cmask: 0,
            fixed: Some(index),
            in_tx: false,
            in_tx_cp: false,
        }
    }

    /// The general-purpose-counter form of an architectural event, counting at CPL 0 and 3.
    /// `None` where the vendor has no such event (AMD: only cycles, instructions, branches and
    /// branch misses).
    pub fn arch(vendor: Vendor, arch: ArchEvent) -> Option<Event> {
        let (code, umask) = match vendor {
            Vendor::Intel => {
                let (c, u) = arch.intel_code();
                (u16::from(c), u)
            }
            Vendor::Amd => (arch.amd_code()?, 0),
        };
        Some(Event {
            vendor,
            code,
            umask,
            usr: true,
            os: true,
            edge: false,
            inv: false,
            cmask: 0,
            fixed: None,
            in_tx: false,
            in_tx_cp: false,
        })
    }

    /// Which architectural event this is, if any (qualifiers such as edge, cmask or the TSX
    /// ones ignored, as KVM's event matching does).
    pub fn arch_event(&self) -> Option<ArchEvent> {
        if let Some(i) = self.fixed {
            return [
                ArchEvent::Instructions,
                ArchEvent::CoreCycles,
                ArchEvent::RefCycles,
            ]
            .get(usize::from(i))
            .copied();
        }
        match self.vendor {
            Vendor::Intel => ArchEvent::INTEL_CPUID_ORDER
                .into_iter()
                .find(|a| a.intel_code() == (self.code as u8, self.umask) && self.code < 0x100),
            Vendor::Amd if self.umask == 0 => ArchEvent::INTEL_CPUID_ORDER
                .into_iter()
                .find(|a| a.amd_code() == Some(self.code)),
            Vendor::Amd => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intel_evtsel_decodes_every_field() {
        // cmask 0x12, INV, EN, INT, E, OS, USR, umask 0x4f, event 0x2e
        let e = Event::from_intel_evtsel(0x12d7_4f2e);
        assert_eq!(e.code, 0x2e);
        assert_eq!(e.umask, 0x4f);
        assert!(e.usr && e.os && e.edge && e.inv);
        assert_eq!(e.cmask, 0x12);
        assert_eq!(e.fixed, None);
        assert_eq!(e.arch_event(), Some(ArchEvent::LlcReferences));
        assert!(!e.in_tx && !e.in_tx_cp);
        let tx = Event::from_intel_evtsel(0x3_0043_003c);
        assert!(tx.in_tx && tx.in_tx_cp);
        assert_eq!(tx.code, 0x3c, "bits 35:32 are not event bits on Intel");
    }

    #[test]
    fn amd_evtsel_takes_event_bits_11_8_from_35_32() {
        let e = Event::from_amd_evtsel(0x3_0052_00c0);
        assert_eq!(e.code, 0x3c0);
        let cycles = Event::from_amd_evtsel(0x0053_0076);
        assert_eq!(cycles.arch_event(), Some(ArchEvent::CoreCycles));
        assert!(cycles.usr && cycles.os);
        let hi = Event::from_amd_evtsel(0x1_0053_0076);
        assert_eq!(hi.code, 0x176);
        assert_eq!(hi.arch_event(), None);
    }

    #[test]
    fn fixed_counters_map_to_their_architectural_events() {
        let want = [
            ArchEvent::Instructions,
            ArchEvent::CoreCycles,
            ArchEvent::RefCycles,
        ];
        for (i, a) in want.into_iter().enumerate() {
            assert_eq!(
                Event::intel_fixed(i as u8, true, false).arch_event(),
                Some(a)
            );
        }
    }

    #[test]
    fn arch_round_trips_for_both_vendors() {
        for a in ArchEvent::INTEL_CPUID_ORDER {
            let e = Event::arch(Vendor::Intel, a).unwrap();
            assert_eq!(e.arch_event(), Some(a));
            if let Some(e) = Event::arch(Vendor::Amd, a) {
                assert_eq!(e.arch_event(), Some(a));
            }
        }
        assert_eq!(Event::arch(Vendor::Amd, ArchEvent::LlcMisses), None);
    }
}
