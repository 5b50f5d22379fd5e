//! The runtime of vpmu-vmm: a minimal KVM virtual machine monitor with a virtual PMU.
//!
//! Map of the crate (see docs/architecture.md). The command line, `compare` and the
//! end-of-run report are the `vmm` crate's (the `vpmu-vmm` binary); what reads a run's files
//! back is the `analysis` crate's; the PMU model is `vpmu`'s.
//! * [`vm`]: builds the VM (memory, irqchip, devices, vCPUs) and waits for its end
//!   ([`vm::config`]: what a run is given); [`end`]: how a run ended and its exit codes;
//! * [`control`]: the VM's control surface its threads share (end, kicks, latches, controller);
//! * [`arch`]: x86-64 architectural constants and the guest page-table walk;
//! * [`boot`]: memory layout, kernel/bzImage/initramfs loading, ACPI tables;
//! * [`vcpu`]: CPUID, boot registers, the per-vCPU thread and its KVM_RUN loop;
//! * [`vcpu_access`]: a vCPU as the other parts touch it: registers and guest memory (the one
//!   access layer), kicks out of KVM_RUN, LAPIC registers; [`last_exits`]: each vCPU's last
//!   exits, for the end-of-run diagnostic;
//! * [`exit`]: one VM exit -> what to do (a plain function, unit-tested without KVM);
//! * [`devices`]: port-I/O and MMIO buses, UARTs, i8042 reset, ACPI power-off register,
//!   virtio-mmio network card and disk;
//! * [`net`]: the VMM's end of the guest's network: frames and the pinger;
//! * [`pmu`]: the VMM side of the vPMU (backends over perf, MSR filter, PMI delivery);
//! * [`host_quirks`]: everything specific to hosts that emulate guest kernel code;
//! * [`console`]: guest console tee, last lines, panic detection;
//! * [`trace`]: VM-exit tracing (`run --trace`): the recorder and writer;
//! * [`profile`]: host-side guest profiles (`run --host-profile`): the sampler and what a
//!   sample reads of the guest;
//! * [`seccomp`]: the system-call filters of the VMM's threads; [`merge`]: how statistics
//!   add up (per vCPU into the VM's totals).

pub mod arch;
pub mod boot;
mod console;
mod control;
pub mod devices;
pub mod end;
pub mod exit;
pub mod host_quirks;
pub mod kvm_error;
pub mod last_exits;
pub mod merge;
pub mod net;
pub mod pmu;
pub mod profile;
pub mod seccomp;
pub mod stop_signal;
pub mod trace;
pub mod tsc;
mod vcpu;
pub mod vcpu_access;
pub mod vm;
