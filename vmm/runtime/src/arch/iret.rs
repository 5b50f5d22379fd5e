//! Returning from an exception the VMM completed for the guest (a trapped handler, see
//! `host_quirks::idt_trap`): what IRETQ would load from the 64-bit exception frame. Pure
//! functions of the frame, the handler's segment registers and the guest's GDT descriptors
//! (kvm-bindings' plain register structs; no KVM calls), unit-tested on hostile frames: the
//! frame is the guest's, so every field gets a defined answer.

use kvm_bindings::{kvm_segment, kvm_sregs};

use super::x86::{
    canonical, ExceptionFrame, CR4_LA57, RFLAGS_FIXED, RFLAGS_LOADABLE, RFLAGS_RF, RFLAGS_VM,
};

/// Why IRETQ would fault on a frame (the guest's handler then takes the exception).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BadFrame(pub &'static str);

/// Where the guest resumes: what IRETQ would load from the frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Return {
    pub rip: u64,
    pub rsp: u64,
    pub rflags: u64,
    /// The segments to load, when they differ from the handler's (a return to CPL3).
    pub segments: Option<(kvm_segment, kvm_segment)>,
}

/// A segment register loaded from a GDT descriptor (`raw`, the 8 bytes) for `selector`.
pub(crate) fn segment_from_descriptor(selector: u16, raw: u64) -> kvm_segment {
    let limit = ((raw & 0xffff) | ((raw >> 32) & 0xf_0000)) as u32;
    let g = ((raw >> 55) & 1) as u8;
    kvm_segment {
        base: ((raw >> 16) & 0xff_ffff) | (((raw >> 56) & 0xff) << 24),
        limit: if g == 1 { (limit << 12) | 0xfff } else { limit },
        selector,
        type_: ((raw >> 40) & 0xf) as u8,
        s: ((raw >> 44) & 1) as u8,
        dpl: ((raw >> 45) & 3) as u8,
        present: ((raw >> 47) & 1) as u8,
        avl: ((raw >> 52) & 1) as u8,
        l: ((raw >> 53) & 1) as u8,
        db: ((raw >> 54) & 1) as u8,
        g,
        unusable: 0,
        padding: 0,
    }
}

/// The return IRETQ would make from `frame` to `rip` (the VMM completed the faulting
/// instruction: past it, or where it jumps), given the handler's segment registers and a reader
/// of GDT descriptors (None: outside the GDT, or an LDT selector). Err: IRETQ would fault, so
/// the exception goes to the guest's handler after all.
pub(crate) fn iret_return(
    frame: &ExceptionFrame,
    rip: u64,
    sregs: &kvm_sregs,
    descriptor: &mut dyn FnMut(u16) -> Option<u64>,
) -> Result<Return, BadFrame> {
    if !canonical(rip, sregs.cr4 & CR4_LA57 != 0) {
        return Err(BadFrame("return RIP not canonical"));
    }
    let rflags = (frame.rflags & RFLAGS_LOADABLE & !RFLAGS_RF & !RFLAGS_VM) | RFLAGS_FIXED;
    let cs_sel = frame.cs as u16;
    let ss_sel = frame.ss as u16;
    let rpl = cs_sel & 3;
    let same = cs_sel == sregs.cs.selector && ss_sel == sregs.ss.selector;
    let ret = |segments| Return {
        rip,
        rsp: frame.rsp,
        rflags,
        segments,
    };
    if same && rpl == u16::from(sregs.cs.dpl) {
        return Ok(ret(None));
    }
    if rpl == 1 || rpl == 2 {
        return Err(BadFrame("return to ring 1 or 2"));
    }
    let cs = descriptor(cs_sel)
        .map(|raw| segment_from_descriptor(cs_sel, raw))
        .ok_or(BadFrame("CS outside the GDT"))?;
    let code = cs.s == 1 && cs.type_ & 0x8 != 0;
    if !code || cs.present == 0 || u16::from(cs.dpl) != rpl || (cs.l == 1 && cs.db == 1) {
        return Err(BadFrame("CS is not a present code segment of its RPL"));
    }
    let ss = if ss_sel & !3 == 0 {
        if rpl != 0 {
            return Err(BadFrame("null SS at CPL3"));
        }
        kvm_segment {
            selector: ss_sel,
            unusable: 1,
            ..Default::default()
        }
    } else {
        let ss = descriptor(ss_sel)
            .map(|raw| segment_from_descriptor(ss_sel, raw))
            .ok_or(BadFrame("SS outside the GDT"))?;
        let writable_data = ss.s == 1 && ss.type_ & 0xa == 0x2;
        if !writable_data || ss.present == 0 || ss.dpl != cs.dpl || ss_sel & 3 != rpl {
            return Err(BadFrame(
                "SS is not a present writable data segment of its RPL",
            ));
        }
        ss
    };
    Ok(ret(Some((cs, ss))))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A frame from CPL `cs & 3` (Linux's selectors: SS 0x2b at CPL 3, 0x18 at CPL 0).
    pub(crate) fn frame(cs: u64, rip: u64) -> ExceptionFrame {
        ExceptionFrame {
            error: 0,
            rip,
            cs,
            rflags: 0x10246,
            rsp: 0x7fff_f000,
            ss: if cs & 3 == 3 { 0x2b } else { 0x18 },
        }
    }

    fn flat(dpl: u64, code: bool) -> u64 {
        // Base 0, limit 0xfffff, G; code: type 0xb, L; data: type 3, D/B.
        let ty: u64 = if code { 0xb } else { 0x3 };
        let flags: u64 = if code { 1 << 53 } else { 1 << 54 };
        0xffff | (0xf << 48) | (ty << 40) | (1 << 44) | (dpl << 45) | (1 << 47) | flags | (1 << 55)
    }

    /// Linux's GDT layout: 0x10 kernel CS, 0x18 kernel DS, 0x2b user DS, 0x33 user CS.
    fn gdt(sel: u16) -> Option<u64> {
        match sel & !3 {
            0x10 => Some(flat(0, true)),
            0x18 => Some(flat(0, false)),
            0x28 => Some(flat(3, false)),
            0x30 => Some(flat(3, true)),
            _ => None,
        }
    }

    fn handler_sregs() -> kvm_sregs {
        kvm_sregs {
            cs: segment_from_descriptor(0x10, flat(0, true)),
            ss: segment_from_descriptor(0x18, flat(0, false)),
            ..Default::default()
        }
    }

    #[test]
    fn a_kernel_return_keeps_the_segments() {
        let k = frame(0x10, 0xffff_ffff_8100_0000);
        let r = iret_return(&k, k.rip + 2, &handler_sregs(), &mut gdt).unwrap();
        assert_eq!(r.rip, 0xffff_ffff_8100_0002);
        assert_eq!(r.rsp, 0x7fff_f000);
        assert_eq!(r.rflags, 0x246, "RF cleared: the instruction completed");
        assert_eq!(r.segments, None);
    }

    #[test]
    fn a_user_return_loads_cs_and_ss_from_the_gdt() {
        let u = frame(0x33, 0x40_1000);
        let r = iret_return(&u, u.rip + 2, &handler_sregs(), &mut gdt).unwrap();
        let (cs, ss) = r.segments.unwrap();
        assert_eq!((cs.selector, cs.dpl, cs.l, cs.type_), (0x33, 3, 1, 0xb));
        assert_eq!((ss.selector, ss.dpl, ss.db, ss.type_), (0x2b, 3, 1, 0x3));
        assert_eq!((cs.limit, cs.base, cs.present), (0xffff_ffff, 0, 1));
    }

    #[test]
    fn hostile_frames_are_refused_not_a_panic() {
        let s = handler_sregs();
        let cases: &[(u64, u64, u64)] = &[
            // (cs, ss, rip)
            (0x33, 0x2b, 0x7fff_ffff_ffff), // RIP + 2 not canonical
            (0x31, 0x29, 0x1000),           // ring 1
            (0x43, 0x2b, 0x1000),           // CS outside the GDT
            (0x1b, 0x2b, 0x1000),           // a data segment as CS
            (0x13, 0x2b, 0x1000),           // DPL 0 code with RPL 3
            (0x33, 0x0, 0x1000),            // null SS at CPL3
            (0x33, 0x33, 0x1000),           // code as SS
            (0x33, 0x18, 0x1000),           // SS RPL 0 for CPL3
            (0x37, 0x2f, 0x1000),           // LDT selectors
            (0xffff_ffff_ffff_ffff, !0, !0 - 1), // all ones
        ];
        for &(cs, ss, rip) in cases {
            let f = ExceptionFrame {
                cs,
                ss,
                rip,
                ..frame(0x33, 0)
            };
            let mut look = |sel: u16| if sel & 4 != 0 { None } else { gdt(sel) };
            assert!(
                matches!(
                    iret_return(&f, f.rip.wrapping_add(2), &s, &mut look),
                    Err(BadFrame(_))
                ),
                "{f:x?}"
            );
        }
        // Any RFLAGS: only the loadable bits come back, bit 1 set, VM and RF clear.
        let f = ExceptionFrame {
            rflags: !0,
            ..frame(0x10, 0x1000)
        };
        let r = iret_return(&f, f.rip.wrapping_add(2), &s, &mut gdt).unwrap();
        assert_eq!(r.rflags, (RFLAGS_LOADABLE & !RFLAGS_RF & !RFLAGS_VM) | 2);
    }

    #[test]
    fn descriptors_decode() {
        let cs = segment_from_descriptor(0x10, 0x00af_9b00_0000_ffff);
        assert_eq!(
            (cs.type_, cs.s, cs.dpl, cs.present, cs.l, cs.db, cs.g),
            (0xb, 1, 0, 1, 1, 0, 1)
        );
        assert_eq!((cs.base, cs.limit), (0, 0xffff_ffff));
        let ds = segment_from_descriptor(0x2b, 0x00cf_f300_0000_ffff);
        assert_eq!((ds.type_, ds.dpl, ds.db), (0x3, 3, 1));
    }
}
