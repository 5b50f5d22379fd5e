//! The vCPU loop: KVM_RUN and everything the VMM does around it, in ONE place and one order.
//!
//! | # | hook                              | what it is for                                        | cpu-switch counts it | domain-switch counts it |
//! |---|-----------------------------------|-------------------------------------------------------|----------------------|-------------------------|
//! | 1 | `VcpuPmu::follow_mode`            | adopt a run-time accounting-mode switch               | no                   | yes                     |
//! | 2 | `VcpuRecorder::before_run`        | trace: last exit's record (re-entry TSC), clock record | no                   | yes                     |
//! | 3 | `Pmu::reprogram_dirty`            | the counters guest writes made dirty: one backend call each (KVM's `kvm_pmu_handle_event`) | no | yes |
//! | 4 | **gate opens**: `VcpuRecorder::enter_guest`, then `Pmu::enter_guest` | resume the profile counter, then the guest's counters | (from here) | yes |
//! | 5 | `VcpuFd::run` (KVM_RUN)           | the guest runs                                        | **yes**              | yes                     |
//! | 6 | **gate closes**: `Pmu::leave_guest`, then `VcpuRecorder::leave_guest` | pause them, first thing after KVM_RUN (nested: the guest's counters see the least) | (up to here) | yes |
//! | 7 | `exit::kind::classify`            | the exit's one classification                         | no                   | yes                     |
//! | 8 | `VcpuRecorder::after_run`         | trace: exit TSC, clock record                         | no                   | yes                     |
//! | 9 | `LastExits::push_event`, `ExitCounts::count` | diagnostic ring, counts                    | no                   | yes                     |
//! |10 | test hook (cold)                  | `VmConfig::panic_vcpu_at_exit` (guest_wrong.rs)       | no                   | yes                     |
//! |11 | `exit::handle` (+ `complete_instruction`) | devices, MSRs (the vPMU), host-quirk fix-ups  | no                   | yes                     |
//! |12 | `VcpuRecorder::after_exit`        | host-profile sample (RIP, CPL) when one is due; the vPMU leaves its work out (`VcpuPmu::host_work_begins`/`_ends`) and forgets its interruption (`forget_sampler_time`) | no | yes, then left out |
//! |13 | `VcpuRelay::after_exit`, `idt_trap::after_exit` | SYSCALL relay, RDPMC trap: install / re-check their int3s | no | yes |
//! |14 | `VcpuRunner::deliver_pmi`         | a due PMI through LVTPC (NMI queued through the access layer / vector / masked) | no | yes |
//! |15 | `KvmVcpu::commit`                 | write back registers (and a queued NMI) changed during this exit | no     | yes                     |
//! |16 | `Ticker::poll`                    | periodic device work (the pinger)                     | no                   | yes                     |
//!
//! Accounting modes (docs/accounting-modes.md): in **cpu-switch** the soft backend's counters
//! (and the host profile's cycles counter, `--host-profile-clock auto|cpu-switch`) count only
//! between the gate's two ends (steps 4-6: the toggles themselves and KVM_RUN); the hardware
//! backend gets the same from `exclude_host`. In **domain-switch** every step counts: the host
//! kernel's per-task perf context is the save/restore, so all the VMM's work on this thread is
//! charged to the guest. The gate is tight around KVM_RUN on purpose: the tracer's TSC and
//! clock reads, the backend's reprogramming and the exit's classification (steps 2, 3, 7, 8)
//! sit outside it, so none of them is charged to the guest in cpu-switch. (The trace's
//! in-KVM_RUN interval, entry TSC to exit TSC, therefore includes the gate's own toggles.)
//!
//! `wall` profile clocks and `--vpmu off` do not gate; the loop order is the same.

use std::os::fd::AsRawFd;

use super::VcpuRunner;
use crate::end::{KvmFailure, VmEnd};
use crate::exit::{self, ExitContext, ExitCounts, NoMsrs, Outcome};
use crate::merge::Distinct;
use crate::pmu::PmuStats;
use crate::vcpu_access::{kick, KvmVcpu, VcpuAccess};

/// The test hook's panic, out of line: the loop pays one predictable compare per exit.
#[cold]
#[inline(never)]
fn test_hook_panic(vcpu: u32, exits: u64) -> ! {
    panic!("test hook: vCPU {vcpu} panics at exit {exits}")
}

impl VcpuRunner {
    /// Runs until the VM ends; returns this vCPU's exit counts and vPMU statistics.
    pub(crate) fn run(&mut self) -> (ExitCounts, PmuStats) {
        let mut counts = ExitCounts::default();
        let sync_run = self.begin();
        counts.sync_regs = sync_run.is_some();
        let mut no_msrs = NoMsrs;
        let mut const_msrs = exit::ConstMsrs;
        let mut ended_vm = false;
        // Exit number at which the test hook panics (never, unless a test armed it).
        let panic_at = self.control.panic_at(self.id).unwrap_or(u64::MAX);
        let raw_fd = self.fd.as_raw_fd();
        // The access layer borrows the guest memory for one exit while `self` is borrowed
        // mutably around it; a clone of the region list (Arcs) is one borrow that does not
        // tie up `self`.
        let mem = self.mem.clone();
        while !self.control.stopping() {
            // 1-2: outside the gate.
            if let Some(p) = &mut self.pmu {
                p.follow_mode();
            }
            if let Some(r) = &mut self.recorder {
                r.before_run();
            }
            // 3: the guest's writes since the last entry reach the backend, once per dirty
            // counter, outside the gate (an RDMSR before this is answered from the model).
            if let Some(p) = &mut self.pmu {
                p.pmu.reprogram_dirty();
            }
            // 4: the gate opens, right before KVM_RUN; the guest's own counters innermost.
            if let Some(r) = &mut self.recorder {
                r.enter_guest();
            }
            if let Some(p) = &mut self.pmu {
                p.pmu.enter_guest();
            }
            // 5
            let result = self.fd.run();
            // 6: the gate closes, right after.
            if let Some(p) = &mut self.pmu {
                p.pmu.leave_guest();
            }
            if let Some(r) = &mut self.recorder {
                r.leave_guest();
            }
            // 7-9: the one classification of this exit, shared by the trace, the ring and the
            // counts.
            let event = exit::kind::classify(&result);
            if let Some(r) = &mut self.recorder {
                r.after_run(event);
            }
            self.last_exits.push_event(event);
            counts.count(event);
            // 10
            if self.last_exits.total() == panic_at {
                test_hook_panic(self.id, panic_at);
            }
            // 11
            let mut cpu = match sync_run {
                // SAFETY: `run` is this vCPU's kvm_run mapping (it lives as long as `self.fd`),
                // kvm_valid_regs was set before the first KVM_RUN above, and nothing else
                // writes s.regs or kvm_dirty_regs (`cpu` is dropped before the next KVM_RUN).
                Some(run) => unsafe { KvmVcpu::with_sync_regs(raw_fd, run, &mem) },
                None => KvmVcpu::new(raw_fd, &mem),
            };
            let msrs: &mut dyn exit::MsrHandler = match &mut self.pmu {
                Some(p) => p,
                None if self.const_msrs => &mut const_msrs,
                None => &mut no_msrs,
            };
            let outcome = exit::handle(
                result,
                &mut ExitContext {
                    pio: &self.pio,
                    mmio: &self.mmio,
                    msrs,
                    cpu: &mut cpu,
                    counts: &mut counts,
                },
            );
            ended_vm |= self.follow_outcome(outcome, &mut cpu, &mut counts);
            // 12-14
            if let Some(r) = &mut self.recorder {
                r.after_exit(&mut cpu, self.pmu.as_mut());
            }
            if let Some(r) = &mut self.relay {
                r.after_exit(&mut cpu);
            }
            for (trap, poll) in [&mut self.gp_trap, &mut self.ud_trap].into_iter().flatten() {
                crate::host_quirks::idt_trap::after_exit(trap, poll, &mut cpu);
            }
            // 14
            self.deliver_pmi(&mut cpu);
            // 15
            if let Err(error) = cpu.commit() {
                ended_vm |= self
                    .control
                    .request_end(VmEnd::KvmFailure(KvmFailure::GuestState {
                        vcpu: self.id,
                        what: "writing back registers".into(),
                        error,
                    }));
            }
            counts.access_ioctls += u64::from(cpu.ioctls());
            // 16
            if let Some(t) = &mut self.ticker {
                t.poll();
            }
        }
        (counts, self.end(ended_vm))
    }

    /// Before the loop: this thread receives kicks and is known to the control surface, the
    /// periodic device work starts, and kvm_run carries the registers if sync registers are on
    /// (then its pointer).
    fn begin(&mut self) -> Option<std::ptr::NonNull<kvm_bindings::kvm_run>> {
        kick::bind(self.fd.get_kvm_run());
        // SAFETY: pthread_self has no preconditions.
        self.control
            .register_thread(unsafe { libc::pthread_self() });
        if let Some(t) = &mut self.ticker {
            if let Err(e) = t.start() {
                log::error!("vCPU {}: periodic device work cannot start: {e}", self.id);
                self.control
                    .request_end(VmEnd::KvmFailure(KvmFailure::DeviceTicker(e.to_string())));
            }
        }
        // Sync registers: KVM copies regs/sregs/events into kvm_run at every exit (the mask
        // stays set; KVM never clears it) and applies the sets marked dirty at the next
        // KVM_RUN, clearing their bits.
        self.sync_regs.then(|| {
            let run = self.fd.get_kvm_run();
            run.kvm_valid_regs = crate::vcpu_access::SYNC_REGS_WANTED;
            run.kvm_dirty_regs = 0;
            std::ptr::NonNull::from(run)
        })
    }

    /// Step 11's second half: what the exit's outcome asks of the vCPU (completing an
    /// instruction, a trap's mark, the end). Whether this vCPU ended the VM.
    #[inline]
    fn follow_outcome(
        &mut self,
        outcome: Outcome,
        cpu: &mut KvmVcpu<'_>,
        counts: &mut ExitCounts,
    ) -> bool {
        match outcome {
            Outcome::Continue => false,
            Outcome::Interrupted => {
                self.fd.set_kvm_immediate_exit(0);
                false
            }
            Outcome::InternalError => match self.complete_instruction(cpu) {
                Ok(()) => false,
                Err(end) => self.control.request_end(end),
            },
            Outcome::TrapMark => match self.on_trap_mark(cpu) {
                Ok(true) => false,
                Ok(false) => {
                    counts.unclaimed_io += 1;
                    false
                }
                Err(end) => self.control.request_end(end),
            },
            Outcome::Stop(end) => self.control.request_end(end),
        }
    }

    /// After the loop: the trace finished, the end state reported, the vPMU's statistics.
    fn end(&mut self, ended_vm: bool) -> PmuStats {
        self.ticker = None;
        if let Some(r) = self.recorder.take() {
            r.finish();
        }
        self.report_end_state(ended_vm, None);
        kick::unbind();
        let mut stats = self
            .pmu
            .take()
            .map(|p| PmuStats {
                pmis_held_at_end: u64::from(p.held.is_some()),
                // The model's own tallies, taken once at the end (a mode switch re-arms
                // counters too, not only guest writes).
                filter_blocked: p.pmu.filter_blocked(),
                filter_blocked_by_vcpu: vec![p.pmu.filter_blocked()],
                uncounted: Distinct(p.pmu.uncounted().to_vec()),
                ..p.stats
            })
            .unwrap_or_default();
        stats.signals = kick::signals();
        stats
    }
}
