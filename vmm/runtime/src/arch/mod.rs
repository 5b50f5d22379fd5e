//! Architecture facts the VMM needs by number: x86-64 control-register, EFER and RFLAGS bits,
//! MSR numbers, and the guest page-table walk ([`x86`]); what IRETQ does with an exception frame
//! ([`iret`]). No KVM calls and no VMM types (kvm-bindings' plain register structs only): every
//! other module may use it (it sits at the bottom of the layer table in `tests/layering.rs`).

pub(crate) mod iret;
pub mod x86;
