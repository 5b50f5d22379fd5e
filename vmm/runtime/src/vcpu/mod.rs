//! vCPUs: creation and boot state ([`regs`], [`cpuid`]) and the per-vCPU thread that runs
//! KVM_RUN ([`run_loop`]: the loop and the order of its hooks), hands each exit to
//! [`crate::exit::handle`], and acts on the outcome.

pub(crate) mod cpuid;
pub(crate) mod identity;
pub(crate) mod regs;
pub(crate) mod run_loop;
pub(crate) mod ticker;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use kvm_ioctls::{VcpuFd, VmFd};
use vm_memory::GuestMemoryMmap;

use vpmu::guest_log::GuestLog;
use vpmu::guest_warn;

use crate::arch::x86::ExceptionFrame;
use crate::control::VmControl;
use crate::devices::{MmioBus, PioBus};
use crate::end::{EmulationEnd, KvmFailure, VmEnd};
use crate::exit::ExitCounts;
use crate::host_quirks::idt_trap::{Stopped, TrapError};
use crate::host_quirks::{self, FixupCounts};
use crate::last_exits;
use crate::pmu::rdpmc_trap::GpOutcome;
use crate::pmu::{pmi, PmuStats, VcpuPmu};
use crate::vcpu_access::{self as access, kick, lapic, AccessError, KvmVcpu, VcpuAccess};

/// Whether this host's KVM copies registers, special registers and vCPU events through
/// `kvm_run` (KVM_CAP_SYNC_REGS with all three: [`access::SYNC_REGS_WANTED`]).
pub(crate) fn sync_regs_available(vm: &VmFd) -> bool {
    access::sync_regs_usable(vm.check_extension_raw(u64::from(kvm_bindings::KVM_CAP_SYNC_REGS)))
}

/// Everything one vCPU thread owns or shares.
pub(crate) struct VcpuRunner {
    pub id: u32,
    pub fd: VcpuFd,
    pub mem: GuestMemoryMmap,
    pub pio: PioBus,
    pub mmio: MmioBus,
    /// Periodic device work done on this thread (the network pinger, on vCPU 0 with `--net`).
    pub ticker: Option<ticker::Ticker>,
    pub control: Arc<VmControl>,
    pub fixups: Arc<FixupCounts>,
    /// The kind of host: with the quirks off, the first emulation failure turns the fix-ups on
    /// (a log line says so) unless `--host-quirks off` forbids them.
    pub host: host_quirks::HostKind,
    /// The vPMU (None with `--vpmu=off`).
    pub pmu: Option<VcpuPmu>,
    /// For MSIs (PMIs with a fixed LVTPC vector).
    pub vm: Arc<VmFd>,
    /// Answer filtered MSRs with 0 when there is no vPMU (`VmConfig::const_msrs`).
    pub const_msrs: bool,
    /// `--trace` / `--host-profile` (None: neither).
    pub recorder: Option<crate::trace::recorder::VcpuRecorder>,
    /// The last exits, for the diagnostic of a bad end, and the no-progress check.
    pub last_exits: last_exits::LastExits,
    /// The SYSCALL relay (host quirks only: guest user space on hosts that emulate guest
    /// kernel code).
    pub relay: Option<host_quirks::syscall_relay::VcpuRelay>,
    /// `--rdpmc trap`: the int3 over the guest's #GP handler (shared), and when this vCPU looks
    /// at the guest's IDT next.
    pub gp_trap: Option<(
        Arc<host_quirks::idt_trap::VectorTrap>,
        host_quirks::idt_trap::TrapPoll,
    )>,
    /// The XBEGIN trap: the int3 over the guest's #UD handler (host quirks, Multiboot guests
    /// whose CPUID offers RTM; `host_quirks::xbegin_abort`).
    pub ud_trap: Option<(
        Arc<host_quirks::idt_trap::VectorTrap>,
        host_quirks::idt_trap::TrapPoll,
    )>,
    /// Read and write registers through `kvm_run` (KVM_CAP_SYNC_REGS; set by the VM builder
    /// when the host has regs, sregs and events and the run allows it).
    pub sync_regs: bool,
}

/// What every vCPU of a VM shares, handed to [`VcpuRunner::new`] by the VM builder.
#[derive(Clone)]
pub(crate) struct VcpuShared {
    pub mem: GuestMemoryMmap,
    pub pio: PioBus,
    pub mmio: MmioBus,
    pub vm: Arc<VmFd>,
    pub control: Arc<VmControl>,
    pub fixups: Arc<FixupCounts>,
    /// [`VcpuRunner::host`].
    pub host: host_quirks::HostKind,
    /// [`VcpuRunner::const_msrs`].
    pub const_msrs: bool,
}

impl VcpuRunner {
    /// vCPU `id` over `fd`; `pmu`, `ticker` and `relay` are its own (None: not in this run).
    /// No recorder yet (the trace/profile streams are handed out after all vCPUs exist).
    pub(crate) fn new(
        id: u32,
        fd: VcpuFd,
        shared: VcpuShared,
        pmu: Option<VcpuPmu>,
        ticker: Option<ticker::Ticker>,
        relay: Option<host_quirks::syscall_relay::VcpuRelay>,
    ) -> Self {
        VcpuRunner {
            id,
            fd,
            mem: shared.mem,
            pio: shared.pio,
            mmio: shared.mmio,
            ticker,
            control: shared.control,
            fixups: shared.fixups,
            host: shared.host,
            pmu,
            vm: shared.vm,
            const_msrs: shared.const_msrs,
            recorder: None,
            last_exits: Default::default(),
            relay,
            gp_trap: None,
            ud_trap: None,
            sync_regs: false,
        }
    }
}

impl VcpuRunner {
    /// Runs the vCPU ([`Self::run`]); if the thread panics (a VMM bug), the run is ended with
    /// [`VmEnd::VmmPanic`] instead of leaving the other threads running and the VMM waiting.
    /// Unwinding closes this vCPU's trace and profile streams (the recorder closes on drop).
    pub(crate) fn run_catching_panics(mut self) -> (ExitCounts, PmuStats) {
        let payload = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run())) {
            Ok(r) => return r,
            Err(p) => p,
        };
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        log::error!(
            "vCPU {}: the vCPU thread panicked (a VMM bug): {msg}",
            self.id
        );
        // Close the trace/profile streams first: they must end whole whatever follows.
        self.recorder = None;
        self.ticker = None;
        let first = self.control.request_end(VmEnd::VmmPanic(format!(
            "vCPU {} thread panicked: {msg}",
            self.id
        )));
        self.report_end_state(first, Some(msg));
        kick::unbind();
        Default::default()
    }

    /// At the end of the thread: this vCPU's RIP and last exits, for the diagnostic.
    pub(crate) fn report_end_state(&self, ended_vm: bool, panicked: Option<String>) {
        let mut cpu = KvmVcpu::new(self.fd.as_raw_fd(), &self.mem);
        let rip = cpu.rip().ok();
        let cpl = cpu.cpl().ok();
        self.control.report_vcpu_state(last_exits::VcpuEndState {
            vcpu: self.id,
            rip,
            cpl,
            last: self.last_exits.last(),
            exits: self.last_exits.total(),
            ended_vm,
            panicked,
        });
    }

    /// After an exit: if the vPMU has a PMI due (its status bit already set), deliver it the
    /// way LVTPC says, within the storm limit. An NMI is queued through `cpu` (with sync
    /// registers no ioctl: KVM injects it at the next KVM_RUN), so this comes before the exit's
    /// `commit`.
    pub(crate) fn deliver_pmi(&mut self, cpu: &mut dyn VcpuAccess) {
        let Some(p) = &mut self.pmu else { return };
        let was_held = p.held.is_some();
        let raised = p.pmu.service_overflow();
        if raised.is_some() {
            p.stats.pmis_raised += 1;
        }
        let due = match (p.held.take(), raised) {
            (None, None) => return,
            (Some(a), Some(b)) => {
                p.stats.pmis_merged += 1;
                vpmu::Pmi {
                    counters: a.counters | b.counters,
                    mask_lvtpc: a.mask_lvtpc || b.mask_lvtpc,
                }
            }
            (a, b) => a.or(b).expect("one is Some"),
        };
        let now = Instant::now();
        if let Err(at) = p.limiter.check(now) {
            // Over the rate limit: hold the PMI and come back when it may go.
            if !was_held {
                p.stats.pmis_throttled += 1;
            }
            p.held = Some(due);
            if p.timer.is_none() {
                match kick::KickTimer::for_this_thread() {
                    Ok(t) => p.timer = Some(t),
                    Err(e) => log::warn!(
                        "vCPU {}: no kick timer ({e}): a held PMI waits for the next exit",
                        self.id
                    ),
                }
            }
            if let Some(t) = &p.timer {
                t.kick_after(at - now);
            }
            return;
        }
        let lapic_state = match self.fd.get_lapic() {
            Ok(l) => l,
            Err(e) => {
                static FAILED: GuestLog = GuestLog::new("pmi-get-lapic-failed");
                guest_warn!(
                    FAILED,
                    "vCPU {}: KVM_GET_LAPIC failed, PMI dropped: {e}",
                    self.id
                );
                return;
            }
        };
        let lvtpc = lapic::reg(&lapic_state.regs, lapic::LVT_PERFCNT);
        let lvtpc = match p.lvtpc_masked_by_pmi {
            true => pmi::masked(lvtpc),
            false => lvtpc,
        };
        match pmi::route(lvtpc) {
            pmi::Route::Nmi => {
                if let Err(e) = cpu.queue_nmi() {
                    static FAILED: GuestLog = GuestLog::new("pmi-nmi-not-queued");
                    guest_warn!(FAILED, "vCPU {}: PMI as NMI not queued: {e}", self.id);
                    return;
                }
                p.stats.pmis_nmi += 1;
                if p.stats.pmi_signal_tsc.len() < crate::pmu::MAX_PMI_TSCS {
                    let on_guest_tsc = |t: u64| match t {
                        0 => 0,
                        t => t.wrapping_add_signed(p.guest_tsc_offset),
                    };
                    let signal = on_guest_tsc(kick::last_signal_tsc());
                    let queued = on_guest_tsc(crate::tsc::now());
                    p.stats.pmi_signal_tsc.push(signal);
                    p.stats.pmi_inject_tsc.push(queued);
                }
            }
            pmi::Route::Vector(v) => {
                let msi = kvm_bindings::kvm_msi {
                    address_lo: 0xfee0_0000 | (self.id << 12),
                    data: u32::from(v),
                    ..Default::default()
                };
                if let Err(e) = self.vm.signal_msi(msi) {
                    static FAILED: GuestLog = GuestLog::new("pmi-vector-not-sent");
                    guest_warn!(FAILED, "vCPU {}: PMI as vector {v} not sent: {e}", self.id);
                    return;
                }
                p.stats.pmis_vector += 1;
            }
            pmi::Route::Masked => {
                p.stats.pmis_masked += 1;
                return;
            }
            pmi::Route::Unsupported(mode) => {
                static UNUSABLE: GuestLog = GuestLog::new("pmi-lvtpc-mode-unusable");
                guest_warn!(
                    UNUSABLE,
                    "vCPU {}: LVTPC delivery mode {mode} is not usable for a PMI; dropped",
                    self.id
                );
                return;
            }
        }
        p.in_mode().pmis += 1;
        p.lvtpc_masked_by_pmi |= due.mask_lvtpc;
    }

    /// KVM_EXIT_INTERNAL_ERROR: on an emulation failure, let the host-quirk code complete the
    /// guest instruction; anything else ends the VM with a report.
    pub(crate) fn complete_instruction(&mut self, cpu: &mut dyn VcpuAccess) -> Result<(), VmEnd> {
        const KVM_INTERNAL_ERROR_EMULATION: u32 = 1;
        // SAFETY: the exit reason was KVM_EXIT_INTERNAL_ERROR, so `internal` is the union member
        // KVM filled in.
        let internal = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal };
        if internal.suberror != KVM_INTERNAL_ERROR_EMULATION {
            let n = (internal.ndata as usize).min(internal.data.len());
            return Err(VmEnd::KvmFailure(KvmFailure::InternalError {
                suberror: internal.suberror,
                data: internal.data[..n].to_vec(),
            }));
        }
        if self.on_trapped_exception(cpu)? {
            return Ok(());
        }
        let rip = cpu.rip().map_err(|error| {
            VmEnd::KvmFailure(KvmFailure::GuestState {
                vcpu: self.id,
                what: "reading registers".into(),
                error,
            })
        })?;
        let in_a_row = self.last_exits.emulation_failure_at(rip);
        if !self.host.fixups() {
            return Err(VmEnd::EmulationFailure(EmulationEnd::FixupsOff {
                vcpu: self.id,
                rip,
            }));
        }
        match host_quirks::emulate::emulate(cpu) {
            Ok(fixup) if in_a_row >= last_exits::NO_PROGRESS_LIMIT => {
                Err(VmEnd::EmulationFailure(EmulationEnd::NoProgress {
                    vcpu: self.id,
                    in_a_row,
                    rip,
                    fixup,
                }))
            }
            Ok(kind) => {
                if self.fixups.record(kind) {
                    if !self.host.quirks() && self.fixups.snapshot().len() == 1 {
                        log::warn!("the host failed to emulate a guest instruction: enabling host-quirk fix-ups");
                    }
                    log::info!("host quirk: completed `{kind}` for the guest (first at RIP {rip:#x}, vCPU {})", self.id);
                }
                Ok(())
            }
            Err(failure) => Err(VmEnd::EmulationFailure(EmulationEnd::NotCompleted {
                vcpu: self.id,
                failure,
            })),
        }
    }

    /// A write to the trap port ([`crate::exit::Outcome::TrapMark`], the port mark of VT-x/SVM
    /// hosts): the pending port write is completed first (RIP then just past the mark), then
    /// handled as an emulation failure at an int3 mark is. Returns false if the write was not
    /// a trapped handler's (the guest wrote the port itself: ignored, as an unclaimed write).
    pub(crate) fn on_trap_mark(&mut self, cpu: &mut dyn VcpuAccess) -> Result<bool, VmEnd> {
        self.complete_pending_io()?;
        self.on_trapped_exception(cpu)
    }

    /// Finishes the port write KVM is waiting to complete, without running the guest: KVM_RUN
    /// with `immediate_exit` set completes pending I/O and returns EINTR (KVM's API: "to
    /// complete pending operations without allowing any further instructions to be executed").
    /// A kick that arrives meanwhile is kept for the loop's next KVM_RUN.
    fn complete_pending_io(&mut self) -> Result<(), VmEnd> {
        let signals = kick::signals();
        self.fd.set_kvm_immediate_exit(1);
        let interrupted = match self.fd.run() {
            Err(e) if e.errno() == libc::EINTR => Ok(()),
            Err(e) => Err(e),
            Ok(exit) => Err(kvm_ioctls::Error::new(libc::EPROTO)).inspect_err(|_| {
                log::error!(
                    "vCPU {}: completing a trap-port write ran the guest: {exit:?}",
                    self.id
                )
            }),
        };
        self.fd.set_kvm_immediate_exit(0);
        if kick::signals() != signals {
            self.fd.set_kvm_immediate_exit(1);
        }
        interrupted.map_err(|error| {
            VmEnd::KvmFailure(KvmFailure::Vcpu {
                vcpu: Some(self.id),
                error: crate::kvm_error::KvmVcpuError::Run(error),
            })
        })
    }

    /// A mark the VMM put over a guest exception handler (the RDPMC trap's #GP, the XBEGIN
    /// trap's #UD, the SYSCALL relay's #PF): handled here (true), or not one of them (false).
    fn on_trapped_exception(&mut self, cpu: &mut dyn VcpuAccess) -> Result<bool, VmEnd> {
        if self.on_gp_trap(cpu)? || self.on_ud_trap(cpu)? {
            return Ok(true);
        }
        if let Some(relay) = &mut self.relay {
            use host_quirks::syscall_relay::{Handled, RelayError};
            match relay.on_emulation_failure(cpu) {
                Ok(Handled::Done(_)) => return Ok(true),
                Ok(Handled::NotOurs) => {}
                Err(e) => {
                    let (what, error) = match e {
                        RelayError::Access(error) => ("syscall relay".to_string(), error),
                        RelayError::Frame { rsp, source } => (
                            format!("syscall relay: reading the #PF frame at RSP {rsp:#x}"),
                            source,
                        ),
                    };
                    return Err(VmEnd::KvmFailure(KvmFailure::GuestState {
                        vcpu: self.id,
                        what,
                        error,
                    }));
                }
            }
        }
        Ok(false)
    }

    /// `--rdpmc trap`: a #GP at the trapped handler is served (an RDPMC the vPMU answers) or
    /// given to the guest's handler. True if this was the trap's mark.
    fn on_gp_trap(&mut self, cpu: &mut dyn VcpuAccess) -> Result<bool, VmEnd> {
        let Some((trap, _)) = &self.gp_trap else {
            return Ok(false);
        };
        let pmu = &mut self.pmu;
        let outcome = on_vector_trap(self.id, trap, cpu, "rdpmc trap", |stopped, cpu| match pmu {
            // on_gp counts what it delivers.
            Some(p) => crate::pmu::rdpmc_trap::on_gp(p, &stopped.frame, stopped.regs, cpu)
                .map(|o| matches!(o, GpOutcome::Served)),
            None => Ok(false),
        })?;
        if outcome == Trapped::DeliveredWithoutFrame {
            if let Some(p) = &mut self.pmu {
                p.stats.gp_delivered += 1;
            }
        }
        Ok(outcome != Trapped::NotOurs)
    }

    /// The XBEGIN trap (host quirks, Multiboot guests with RTM): a #UD at the trapped handler
    /// from an XBEGIN at CPL 0 is completed as an abort, any other goes to the guest's handler.
    /// True if this was the trap's mark.
    fn on_ud_trap(&mut self, cpu: &mut dyn VcpuAccess) -> Result<bool, VmEnd> {
        let Some((trap, _)) = &self.ud_trap else {
            return Ok(false);
        };
        let outcome = on_vector_trap(self.id, trap, cpu, "xbegin trap", |stopped, cpu| {
            host_quirks::xbegin_abort::on_ud(trap, stopped, cpu)
        })?;
        Ok(outcome != Trapped::NotOurs)
    }
}

/// A mark at a trapped exception handler (vCPU `id`): not `trap`'s, or `serve` completed the
/// exception (true), or the guest's handler takes it (`serve` said false, or the frame
/// could not be read).
fn on_vector_trap(
    id: u32,
    trap: &host_quirks::idt_trap::VectorTrap,
    cpu: &mut dyn VcpuAccess,
    owner: &str,
    serve: impl FnOnce(&Stopped, &mut dyn VcpuAccess) -> Result<bool, AccessError>,
) -> Result<Trapped, VmEnd> {
    let failed = |what: String, error| {
        VmEnd::KvmFailure(KvmFailure::GuestState {
            vcpu: id,
            what,
            error,
        })
    };
    let exception = trap.names().exception;
    let deliver = |cpu: &mut dyn VcpuAccess, stopped: &Stopped| {
        trap.deliver(cpu, stopped)
            .map_err(|e| failed(format!("{owner}: giving the guest its {exception}"), e))
    };
    match trap.stopped_at_handler(cpu) {
        Ok(None) => Ok(Trapped::NotOurs),
        Ok(Some(stopped)) => {
            let completed = serve(&stopped, cpu)
                .map_err(|e| failed(format!("{owner}: completing the {exception}"), e))?;
            if completed {
                return Ok(Trapped::Completed);
            }
            deliver(cpu, &stopped)?;
            Ok(Trapped::Delivered)
        }
        Err(TrapError::Access(e)) => Err(failed(owner.into(), e)),
        Err(TrapError::Frame { rsp, source }) => {
            // No frame where the CPU pushes one (guest code jumped to the handler with a
            // bad RSP): nothing to complete; the guest's handler runs, as it would.
            log::debug!("{owner}: no {exception} frame at RSP {rsp:#x} ({source}): passed on");
            let regs = cpu.regs().map_err(|e| failed(owner.into(), e))?;
            let stopped = Stopped {
                handler: trap.installed_at().unwrap_or(regs.rip),
                regs,
                frame: ExceptionFrame::default(),
            };
            deliver(cpu, &stopped)?;
            Ok(Trapped::DeliveredWithoutFrame)
        }
    }
}

/// What became of a mark at a trapped exception handler ([`VcpuRunner::on_vector_trap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trapped {
    /// The vCPU was not on that trap's handler.
    NotOurs,
    /// The VMM completed the exception; the guest's handler does not run.
    Completed,
    /// The guest's handler takes it.
    Delivered,
    /// The guest's handler takes it; its frame could not be read.
    DeliveredWithoutFrame,
}
