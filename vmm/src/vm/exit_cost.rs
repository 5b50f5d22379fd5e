//! What one exit to user space costs inside KVM_RUN on this host, measured once per run: the
//! soft backend's cpu-switch gate takes it off each KVM_RUN interval, so the guest is charged
//! its own time and not KVM's entry and exit path (issue 32 item 4).
//!
//! The soft gate charges the vCPU thread's CPU time between the two sides of KVM_RUN. Besides
//! the guest's own instructions that time holds the world switch and KVM's handling of the exit
//! that ends it: ~8 µs here on kvm_pvm, 40-60 µs on a kvm_amd nested under QEMU's emulator,
//! 1-3 µs on hardware. A guest that exits often (port I/O) was charged mostly that in
//! cpu-switch. The hardware backend needs none of this: `exclude_host` stops counting at the
//! world switch.
//!
//! The measurement: a throwaway VM whose one page of real-mode code is nothing but
//! `out %al, $0x80`, so each KVM_RUN runs one guest instruction and returns with a port-I/O
//! exit. The interval is taken with the TSC, as the gate takes it; the cost is a low percentile
//! of [`SAMPLES`] intervals (the machine may be busy: preemption only lengthens intervals, so
//! a low percentile is the cost without it, and charging the guest a little more than its own
//! time is the safe side).

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit};

/// Intervals measured.
pub const SAMPLES: usize = 200;
/// The percentile taken of them.
pub const PERCENTILE: usize = 10;

/// Why the cost could not be measured (the gate then charges whole intervals, as before).
#[derive(Debug, thiserror::Error)]
pub enum ExitCostError {
    #[error("{what}: {source}")]
    Kvm {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("cannot map the calibration VM's page: {0}")]
    Mmap(std::io::Error),
    #[error("the calibration guest did not exit with port I/O ({0})")]
    UnexpectedExit(String),
}

/// One page of `out %al, $0x80` (E6 80), executed from guest-physical 0 in real mode.
const PAGE: usize = 0x1000;

/// Nanoseconds of one KVM_RUN that runs a single `out` instruction and returns with its exit:
/// the [`PERCENTILE`]th percentile of [`SAMPLES`] runs (timed with the TSC, converted at the
/// vCPU's TSC rate).
pub fn measure_ns(kvm: &Kvm) -> Result<u64, ExitCostError> {
    let err = |what| move |source| ExitCostError::Kvm { what, source };
    let page = Page::new()?;
    let vm = kvm.create_vm().map_err(err("KVM_CREATE_VM"))?;
    // Real mode on VT-x needs the TSS KVM uses to emulate it (as the run's own VM has).
    vm.set_tss_address(crate::boot::layout::KVM_TSS_ADDR as usize)
        .map_err(err("KVM_SET_TSS_ADDR"))?;
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: PAGE as u64,
        userspace_addr: page.addr as u64,
        flags: 0,
    };
    // SAFETY: the region is `page`'s anonymous mapping of PAGE bytes, which outlives `vm` (both
    // are dropped at the end of this function, `vm` first).
    unsafe { vm.set_user_memory_region(region) }.map_err(err("KVM_SET_USER_MEMORY_REGION"))?;
    let mut vcpu = vm.create_vcpu(0).map_err(err("KVM_CREATE_VCPU"))?;
    let mut sregs = vcpu.get_sregs().map_err(err("KVM_GET_SREGS"))?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs).map_err(err("KVM_SET_SREGS"))?;
    let mut regs = vcpu.get_regs().map_err(err("KVM_GET_REGS"))?;
    regs.rip = 0;
    regs.rflags = 2;
    vcpu.set_regs(&regs).map_err(err("KVM_SET_REGS"))?;
    let mut samples = Vec::with_capacity(SAMPLES);
    const {
        assert!(
            SAMPLES < PAGE / 2,
            "each run executes one 2-byte `out` of the page"
        )
    };
    for _ in 0..SAMPLES {
        let t0 = crate::tsc::now();
        let exit = vcpu.run();
        let t1 = crate::tsc::now();
        match exit {
            Ok(VcpuExit::IoOut(0x80, _)) => samples.push(t1.wrapping_sub(t0)),
            Ok(other) => return Err(ExitCostError::UnexpectedExit(format!("{other:?}"))),
            Err(source) => {
                return Err(ExitCostError::Kvm {
                    what: "KVM_RUN",
                    source,
                })
            }
        }
    }
    let khz = u64::from(vcpu.get_tsc_khz().map_err(err("KVM_GET_TSC_KHZ"))?).max(1);
    drop(vcpu);
    drop(vm);
    drop(page);
    let tsc = percentile(&mut samples, PERCENTILE);
    Ok(u64::try_from(u128::from(tsc) * 1_000_000 / u128::from(khz)).unwrap_or(u64::MAX))
}

/// The `p`th percentile of `v` (sorted in place), 0 for none.
pub fn percentile(v: &mut [u64], p: usize) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[(v.len() - 1) * p.min(100) / 100]
}

/// The calibration guest's page: anonymous, filled with `out %al, $0x80`.
struct Page {
    addr: *mut libc::c_void,
}

impl Page {
    fn new() -> Result<Page, ExitCostError> {
        // SAFETY: an anonymous private mapping of PAGE bytes at an address the kernel picks;
        // the result is checked before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(ExitCostError::Mmap(std::io::Error::last_os_error()));
        }
        // SAFETY: `addr` is a fresh writable mapping of PAGE bytes owned by nothing else.
        let bytes = unsafe { std::slice::from_raw_parts_mut(addr.cast::<u8>(), PAGE) };
        for pair in bytes.chunks_exact_mut(2) {
            pair.copy_from_slice(&[0xe6, 0x80]);
        }
        Ok(Page { addr })
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: `addr` is the PAGE-byte mapping made in `new`, unmapped once, here.
        unsafe { libc::munmap(self.addr, PAGE) };
    }
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
