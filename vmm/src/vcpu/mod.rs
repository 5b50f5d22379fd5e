//! vCPUs: creation and boot state ([`regs`], [`cpuid`]) and the per-vCPU thread that runs
//! KVM_RUN, hands each exit to [`crate::exit::handle`], and acts on the outcome.

pub mod cpuid;
pub mod guest_cpu;
pub mod kick;
pub mod regs;

use std::sync::Arc;

use kvm_ioctls::VcpuFd;
use vm_memory::GuestMemoryMmap;

use crate::devices::PioBus;
use crate::end::VmEnd;
use crate::exit::{self, ExitContext, ExitCounts, NoMsrs, Outcome};
use crate::host_quirks::{self, FixupCounts};
use crate::vm::VmControl;

/// Everything one vCPU thread owns or shares.
pub struct VcpuRunner {
    pub id: u32,
    pub fd: VcpuFd,
    pub mem: GuestMemoryMmap,
    pub pio: PioBus,
    pub control: Arc<VmControl>,
    pub fixups: Arc<FixupCounts>,
    /// Whether host quirks were detected before boot (otherwise the first emulation failure
    /// turns the fix-ups on, with a log line saying so).
    pub quirks_expected: bool,
}

impl VcpuRunner {
    /// Runs until the VM ends; returns this vCPU's exit counts.
    pub fn run(mut self) -> ExitCounts {
        let mut counts = ExitCounts::default();
        kick::bind(self.fd.get_kvm_run());
        // SAFETY: pthread_self has no preconditions.
        self.control
            .register_thread(unsafe { libc::pthread_self() });
        let mut msrs = NoMsrs;
        while !self.control.stopping() {
            let result = self.fd.run();
            let outcome = exit::handle(
                result,
                &mut ExitContext {
                    pio: &self.pio,
                    msrs: &mut msrs,
                    counts: &mut counts,
                },
            );
            match outcome {
                Outcome::Continue => {}
                Outcome::Interrupted => self.fd.set_kvm_immediate_exit(0),
                Outcome::InternalError => {
                    if let Err(end) = self.complete_instruction() {
                        self.control.request_end(end);
                    }
                }
                Outcome::Stop(end) => self.control.request_end(end),
            }
        }
        kick::unbind();
        counts
    }

    /// KVM_EXIT_INTERNAL_ERROR: on an emulation failure, let the host-quirk code complete the
    /// guest instruction; anything else ends the VM with a report.
    fn complete_instruction(&mut self) -> Result<(), VmEnd> {
        const KVM_INTERNAL_ERROR_EMULATION: u32 = 1;
        // SAFETY: the exit reason was KVM_EXIT_INTERNAL_ERROR, so `internal` is the union member
        // KVM filled in.
        let internal = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal };
        if internal.suberror != KVM_INTERNAL_ERROR_EMULATION {
            let n = (internal.ndata as usize).min(internal.data.len());
            return Err(VmEnd::KvmFailure(format!(
                "internal error, suberror {} data {:x?}",
                internal.suberror,
                &internal.data[..n]
            )));
        }
        let mut cpu = guest_cpu::KvmGuestCpu::new(&self.fd, &self.mem)
            .map_err(|e| VmEnd::KvmFailure(format!("reading vCPU {} registers: {e}", self.id)))?;
        let rip = host_quirks::GuestCpu::rip(&cpu);
        match host_quirks::emulate::emulate(&mut cpu) {
            Ok(kind) => {
                if self.fixups.record(kind) {
                    if !self.quirks_expected && self.fixups.snapshot().len() == 1 {
                        log::warn!("the host failed to emulate a guest instruction: enabling host-quirk fix-ups");
                    }
                    log::info!("host quirk: completed `{kind}` for the guest (first at RIP {rip:#x}, vCPU {})", self.id);
                }
                Ok(())
            }
            Err(failure) => Err(VmEnd::EmulationFailure(format!(
                "vCPU {}: {failure}",
                self.id
            ))),
        }
    }
}
