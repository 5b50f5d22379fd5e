//! What this host's KVM does that the VMM must know and cannot read anywhere, measured once per
//! process on a throwaway VM ([`probe`]):
//! * what one exit to user space costs inside KVM_RUN ([`HostProbe::exit_cost_ns`]): the soft
//!   backend's cpu-switch gate takes it off each KVM_RUN interval, so the guest is charged its
//!   own time and not KVM's entry and exit path (issue 32 item 4);
//! * what taking one notification costs the vCPU thread ([`HostProbe::notify_cost_ns`]): the
//!   exit above and a signal's delivery to the thread, as a counter's overflow or a sample's
//!   timer comes; the soft backend arms no notification sooner than ten of those
//!   (`pmu::backend::min_soft_period_ns`), or the thread would do nothing but take them;
//! * whether KVM answers a guest RDPMC itself although its own PMU is off for the VM
//!   ([`HostProbe::kvm_answers_rdpmc`]): then no #GP comes for the RDPMC trap to serve (Linux
//!   6.1's kvm_amd reads its never-programmed counter, 0, where VT-x and later kernels inject
//!   #GP), and the guest's RDPMCs outside the rewritten kernel sites read 0.
//!
//! The soft gate charges the vCPU thread's CPU time between the two sides of KVM_RUN. Besides
//! the guest's own instructions that time holds the world switch and KVM's handling of the exit
//! that ends it: ~8 µs here on kvm_pvm, 40-60 µs on a kvm_amd nested under QEMU's emulator,
//! 1-3 µs on hardware. A guest that exits often (port I/O) was charged mostly that in
//! cpu-switch. The hardware backend needs none of this: `exclude_host` stops counting at the
//! world switch.
//!
//! The measurement: a throwaway VM whose one page of 64-bit code is nothing but
//! `out %al, $0x80`, so each KVM_RUN runs one guest instruction and returns with a port-I/O
//! exit. The interval is taken with the TSC, as the gate takes it; the cost is a low percentile
//! of [`SAMPLES`] intervals, after as many over the same instructions to warm up (the machine may be busy: preemption only lengthens intervals, so
//! a low percentile is the cost without it, and charging the guest a little more than its own
//! time is the safe side).

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::boot::layout::{HIMEM_START, KVM_TSS_ADDR};
use crate::kvm_error::{on_vcpu, KvmSetupError, KvmVcpuError};
use crate::vcpu::regs::{self, BootEntry};

/// Intervals measured.
pub(super) const SAMPLES: usize = 200;
/// Runs before them, over the same instructions: an emulator that translates guest code (QEMU's,
/// under the SVM host) pays a translation the first time each `out` runs, ten times an exit.
const WARM_UP: usize = 300;
/// The percentile taken of them.
pub(super) const PERCENTILE: usize = 10;

/// The calibration VM's RAM: page tables and GDT low, the code page at 1 MiB.
const RAM: usize = 4 << 20;
/// One page of `out %al, $0x80` (E6 80) at HIMEM_START, run in 64-bit mode as guests' kernels
/// and the tiny guests run (the real-mode version of this cost 488 us an exit on the SVM host
/// under QEMU's emulator, ten times a long-mode exit there).
const PAGE: usize = 0x1000;

/// Why the host could not be probed (the gate then charges whole intervals, as before).
#[derive(Debug, thiserror::Error)]
pub(super) enum ProbeError {
    #[error(transparent)]
    Kvm(#[from] KvmSetupError),
    #[error("the calibration VM's memory: {0}")]
    Memory(String),
    #[error("the calibration vCPU's registers: {0}")]
    Regs(#[from] regs::RegsError),
    #[error("the calibration guest did not exit with port I/O ({0})")]
    UnexpectedExit(String),
}

/// What [`probe`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HostProbe {
    /// ns of one KVM_RUN that runs a single `out` instruction in 64-bit mode and returns with
    /// its exit: the [`PERCENTILE`]th percentile of [`SAMPLES`] runs (timed with the TSC, as
    /// the gate times intervals, converted at the vCPU's TSC rate).
    pub exit_cost_ns: u64,
    /// Whether a guest RDPMC at CPL 0 returns (KVM answered it) rather than faulting, with
    /// KVM's own PMU turned off for the VM where KVM offers that (as the RDPMC trap does).
    pub kvm_answers_rdpmc: bool,
    /// ns of thread CPU time one signal's delivery to the calling thread takes (the kick
    /// signal, raised with tgkill, through the VMM's handler and back): the
    /// [`PERCENTILE`]th percentile of [`SAMPLES`].
    pub signal_cost_ns: u64,
}

impl HostProbe {
    /// What one notification (a counter's overflow signal, the profile sampler's) costs the
    /// vCPU thread at least: the signal's delivery and the exit from KVM_RUN it forces.
    pub(super) fn notify_cost_ns(&self) -> u64 {
        self.exit_cost_ns.saturating_add(self.signal_cost_ns)
    }
}

/// The host probed once per process (the first call measures; later ones return the same).
pub(super) fn probe(kvm: &Kvm) -> Result<HostProbe, &'static ProbeError> {
    static PROBE: std::sync::OnceLock<Result<HostProbe, ProbeError>> = std::sync::OnceLock::new();
    PROBE.get_or_init(|| measure(kvm)).as_ref().copied()
}

/// Where the RDPMC probe's code starts: `rdpmc; out %al, $0x81` after the page of `out`s.
const RDPMC_AT: u64 = HIMEM_START + PAGE as u64;

fn measure(kvm: &Kvm) -> Result<HostProbe, ProbeError> {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM)])
        .map_err(|e| ProbeError::Memory(e.to_string()))?;
    let code: Vec<u8> = [0xe6, 0x80].repeat(PAGE / 2);
    mem.write_slice(&code, GuestAddress(HIMEM_START))
        .map_err(|e| ProbeError::Memory(e.to_string()))?;
    mem.write_slice(&[0x0f, 0x33, 0xe6, 0x81], GuestAddress(RDPMC_AT))
        .map_err(|e| ProbeError::Memory(e.to_string()))?;
    let vm = kvm.create_vm().map_err(KvmSetupError::CreateVm)?;
    vm.set_tss_address(KVM_TSS_ADDR as usize)
        .map_err(KvmSetupError::SetTssAddr)?;
    // As the run's VM: the LAPIC is KVM's (the boot state programs its LINTs), and KVM's own PMU
    // is off where KVM offers that (as for the RDPMC trap: pmu::setup::disable_kvm_pmu).
    vm.create_irq_chip().map_err(KvmSetupError::CreateIrqchip)?;
    crate::pmu::setup::disable_kvm_pmu(&vm).map_err(KvmSetupError::DisablePmu)?;
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: RAM as u64,
        userspace_addr: mem
            .get_host_address(GuestAddress(0))
            .map_err(|e| ProbeError::Memory(e.to_string()))? as u64,
        flags: 0,
    };
    // SAFETY: the region is `mem`'s mapping of RAM bytes, which outlives `vm` (both are dropped
    // at the end of this function, `vm` first: declared after `mem`).
    unsafe { vm.set_user_memory_region(region) }.map_err(KvmSetupError::SetUserMemoryRegion)?;
    let mut vcpu = vm.create_vcpu(0).map_err(KvmSetupError::CreateVcpu)?;
    regs::setup_common(&vcpu)?;
    regs::setup_boot_entry(&vcpu, &mem, BootEntry::LongMode { rip: HIMEM_START })?;
    const {
        assert!(
            WARM_UP < PAGE / 2,
            "each run executes one 2-byte `out` of the page"
        )
    };
    const { assert!(SAMPLES <= WARM_UP, "the measured runs are warmed-up ones") };
    timed_outs(&mut vcpu, WARM_UP)?;
    jump(&mut vcpu, HIMEM_START, 0)?;
    let mut samples = timed_outs(&mut vcpu, SAMPLES)?;
    let khz = u64::from(vcpu.get_tsc_khz().map_err(KvmSetupError::GetTscKhz)?).max(1);
    let tsc = percentile(&mut samples, PERCENTILE);
    let exit_cost_ns =
        u64::try_from(u128::from(tsc) * 1_000_000 / u128::from(khz)).unwrap_or(u64::MAX);
    // RDPMC of counter 0 with no IDT: a #GP ends in a triple fault (a shutdown exit).
    jump(&mut vcpu, RDPMC_AT, 0)?;
    let kvm_answers_rdpmc = match vcpu.run() {
        Ok(VcpuExit::IoOut(0x81, _)) => true,
        Ok(VcpuExit::Shutdown) => false,
        Ok(other) => return Err(ProbeError::UnexpectedExit(format!("{other:?}"))),
        Err(source) => return Err(KvmSetupError::from(KvmVcpuError::Run(source)).into()),
    };
    Ok(HostProbe {
        exit_cost_ns,
        kvm_answers_rdpmc,
        signal_cost_ns: signal_cost_ns(),
    })
}

/// ns of thread CPU time one kick signal raised at the calling thread takes to deliver (the
/// handler runs before tgkill returns): the [`PERCENTILE`]th percentile of [`SAMPLES`], after
/// as many to warm up. 0 where the handler cannot be installed.
fn signal_cost_ns() -> u64 {
    if crate::vcpu_access::kick::install_handler().is_err() {
        return 0;
    }
    let thread_ns = crate::trace::recorder::thread_cpu_ns;
    // SAFETY: getpid/gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    let mut samples: Vec<u64> = (0..2 * SAMPLES)
        .map(|_| {
            let t0 = thread_ns();
            // SAFETY: tgkill sends this process's kick signal, whose handler
            // (vcpu_access::kick::install_handler) only counts it on threads that are not in KVM_RUN.
            unsafe {
                libc::syscall(
                    libc::SYS_tgkill,
                    pid,
                    tid,
                    crate::vcpu_access::kick::kick_signal(),
                )
            };
            thread_ns().saturating_sub(t0)
        })
        .skip(SAMPLES)
        .collect();
    percentile(&mut samples, PERCENTILE)
}

/// Moves the vCPU to `rip` with RCX = `rcx`, once the port write it stopped on is complete
/// (KVM_RUN with immediate_exit completes it and returns at once).
fn jump(vcpu: &mut kvm_ioctls::VcpuFd, rip: u64, rcx: u64) -> Result<(), ProbeError> {
    vcpu.set_kvm_immediate_exit(1);
    let _ = vcpu.run();
    vcpu.set_kvm_immediate_exit(0);
    let mut r = vcpu.get_regs().map_err(on_vcpu(KvmVcpuError::GetRegs))?;
    r.rip = rip;
    r.rcx = rcx;
    vcpu.set_regs(&r)
        .map_err(|e| KvmSetupError::from(KvmVcpuError::SetRegs(e)).into())
}

/// TSC cycles of each of `n` KVM_RUNs, each of which must end in the guest's `out`.
fn timed_outs(vcpu: &mut kvm_ioctls::VcpuFd, n: usize) -> Result<Vec<u64>, ProbeError> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = crate::tsc::now();
        let exit = vcpu.run();
        let t1 = crate::tsc::now();
        match exit {
            Ok(VcpuExit::IoOut(0x80, _)) => samples.push(t1.wrapping_sub(t0)),
            Ok(other) => return Err(ProbeError::UnexpectedExit(format!("{other:?}"))),
            Err(source) => return Err(KvmSetupError::from(KvmVcpuError::Run(source)).into()),
        }
    }
    Ok(samples)
}

/// The `p`th percentile of `v` (sorted in place), 0 for none.
pub(super) fn percentile(v: &mut [u64], p: usize) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[(v.len() - 1) * p.min(100) / 100]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_sorted_samples() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(percentile(&mut v, 10), 10);
        assert_eq!(percentile(&mut v, 0), 1);
        assert_eq!(percentile(&mut v, 100), 100);
        assert_eq!(percentile(&mut [], 10), 0);
        assert_eq!(percentile(&mut [7], 10), 7);
    }
}
