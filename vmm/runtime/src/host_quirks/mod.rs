//! Work-arounds for hosts whose KVM does not run guest kernel code on hardware but emulates it
//! (the `kvm_pvm` pagetable-based virtualization on this project's build machines; see
//! shared/HOST-FACTS.md). Everything host-specific lives here, and none of it is on the normal
//! path of a VT-x/SVM host:
//!
//! * before boot, when the host is detected: CPUID hides CMPXCHG16B and hypercall-based KVM PV
//!   features (`vcpu::cpuid::CpuidPolicy`), and the kernel command line gets options that keep
//!   Linux off instructions the host's emulator lacks (see [`KERNEL_OPTIONS`]);
//! * at run time, only on `KVM_EXIT_INTERNAL_ERROR` / emulation failure: [`emulate`] decodes the
//!   guest instruction and does what the CPU would have done, where that is simple and safe.
//!   Each kind of fix-up is logged once and counted; the counts are printed when the VM ends;
//! * guest user space: [`syscall_relay`] completes the guest's SYSCALLs, which these hosts leave
//!   half done (an int3 over the guest's #PF handler brings each #PF to the VMM);
//! * [`idt_trap`]: that int3 over an exception vector's handler, shared by the relay (#PF), the
//!   RDPMC trap (#GP, `pmu::rdpmc_trap`) and [`xbegin_abort`] (#UD: XBEGIN at guest CPL 0,
//!   which these hosts' emulator refuses, completed as a transaction abort; Multiboot guests).
//!
//! Elsewhere, one decision follows the detection: the host profile forgets its interruptions
//! of guest *kernel* code only when the quirks are off (`trace::recorder`, `guest_kernel_emulated`:
//! emulated kernel code runs on for the PMI skid after the sampler's notification).

pub(crate) mod emulate;
pub(crate) mod idt_trap;
pub mod syscall_relay;
pub mod xbegin_abort;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

pub use crate::end::EmulationFailure;

/// Kernel options that keep Linux off instructions this host's emulator cannot run:
/// * `noxsave`: XSAVE stays visible in CPUID.1:ECX whatever the VMM writes, and `xrstor64` hangs;
/// * `clearcpuid=popcnt,smap` + `nosmap`: POPCNT cannot be hidden in CPUID; CLAC/STAC fail to emulate;
/// * `nofsgsbase`: with FSGSBASE the NMI entry reads the CPU number with LSL, which fails to emulate;
/// * `clearcpuid=ssse3,sse4_1,...`: keeps kernel SIMD users (crypto, checksums; they run between
///   kernel_fpu_begin/end) on their scalar code: the emulator fails on SSE register moves such
///   as `movd xmm15, ecx` (seen in the Debian cloud kernel after its network initcalls). AVX is
///   already off through `noxsave`.
/// * `GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX,...`: no kernel option; the kernel hands it to init as
///   environment, and every process inherits it. With `noxsave` the kernel keeps no AVX state
///   (FXSAVE covers x87 and the low halves of xmm0-15 only), but CPUID at guest CPL3 runs natively
///   here and offers the host's AVX and AVX-512, so glibc's string functions would use ymm
///   registers and ymm16-31, which processes then overwrite for each other (freshly exec'd ones
///   crashed in `__ctype_init`; docs/guest.md, "AVX state"). On the command line, glibc in init
///   complies from its first instruction; `GLIBC_TUNABLES=` in `--cmdline` undoes it.
/// * `vpmu.kallsyms=snapshot`: for the project's /init (guest-image/initramfs/init; the kernel
///   ignores it). Emulated, the kernel takes ~45 s to format /proc/kallsyms, and perf reads it
///   several times per command (`perf record -e cycles -- cpu_split 200` took 170 s, 27 s with the
///   snapshot); /init
///   reads it once before the profilers run and bind-mounts the copy over it.
///   `vpmu.kallsyms=live` in `--cmdline` undoes it.
/// * `vpmu.perf_cpu_time_max_percent=0`: for the project's /init, which writes it to
///   /proc/sys/kernel/perf_cpu_time_max_percent. Emulated, the guest's PMI handler takes
///   milliseconds, so the kernel lowers perf_event_max_sample_rate step by step to 100/s ("perf:
///   interrupt took too long"), i.e. one sample per tick at HZ=100; and its ticks come late here,
///   so a fixed-period event that overflows twice between two processed ticks is throttled. In
///   domain-switch the VMM's device work is charged in bursts: the system-wide profiles of
///   `compare --profiler` lost most of their domain-switch samples that way (docs/guest.md).
///   0 stops the lowering; the experiments' fixed periods (~13 samples/s) need no throttle.
pub const KERNEL_OPTIONS: &str =
    "noxsave clearcpuid=popcnt,smap,ssse3,sse4_1,sse4_2,pclmulqdq,aes,sha_ni nosmap nofsgsbase \
     GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX,-AVX2,-FMA,-AVX512F,-AVX512VL,-AVX512BW,-AVX_Fast_Unaligned_Load \
     vpmu.kallsyms=snapshot vpmu.perf_cpu_time_max_percent=0";

/// How the user asked quirks to be chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QuirkSetting {
    /// Enable when the host is detected (the `kvm_pvm` module is loaded); elsewhere, an
    /// instruction the host fails to emulate still gets a fix-up, with a warning.
    Auto,
    /// Every work-around, whatever the host.
    On,
    /// None at all: an instruction the host fails to emulate ends the run (exit code 6).
    Off,
}

/// Extra device-model work per access to a virtio card's registers where guest kernel code is
/// emulated (~1000x slower): it stands for a 4 us user-space device-model round trip scaled
/// alike, which would otherwise be lost next to the guest's emulated driver code
/// (docs/accounting-modes.md). `--net-access-cost-us` and `--disk-access-cost-us` default to it
/// there, to 0 on a VT-x/SVM host.
pub(crate) const EMULATED_ACCESS_COST_US: u32 = 4000;

/// The kind of host, decided once at start from `--host-quirks` and detection, and passed down:
/// everything host-specific asks it instead of looking again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    /// Guest kernel code is emulated by the host (kvm_pvm): the quirks are on (CPUID and
    /// command-line edits before boot, fix-ups, the SYSCALL relay). `why` is for the log.
    EmulatedKernel { why: &'static str },
    /// Hardware virtualization (VT-x/SVM): no quirk before boot. With `--host-quirks auto`, an
    /// emulation failure the host reports still gets a fix-up (logged: the host was not what
    /// detection said); with `off`, none runs and the failure ends the run.
    Hardware { fixups_on_failure: bool },
}

impl HostKind {
    pub fn decide(setting: QuirkSetting) -> HostKind {
        match setting {
            QuirkSetting::On => HostKind::EmulatedKernel {
                why: "forced with --host-quirks=on",
            },
            QuirkSetting::Off => HostKind::Hardware {
                fixups_on_failure: false,
            },
            QuirkSetting::Auto if Path::new("/sys/module/kvm_pvm").exists() => {
                HostKind::EmulatedKernel {
                    why: "the kvm_pvm module is loaded: guest kernel code is emulated by the host",
                }
            }
            QuirkSetting::Auto => HostKind::Hardware {
                fixups_on_failure: true,
            },
        }
    }

    /// The quirks are on: guest kernel code is emulated.
    pub fn quirks(self) -> bool {
        matches!(self, HostKind::EmulatedKernel { .. })
    }

    /// Whether an emulation failure may be completed by a fix-up.
    pub fn fixups(self) -> bool {
        match self {
            HostKind::EmulatedKernel { .. } => true,
            HostKind::Hardware { fixups_on_failure } => fixups_on_failure,
        }
    }

    /// The default extra work per access to a card's registers ([`EMULATED_ACCESS_COST_US`]).
    pub fn default_access_cost_us(self) -> u32 {
        if self.quirks() {
            EMULATED_ACCESS_COST_US
        } else {
            0
        }
    }
}

/// The KVM module that serves /dev/kvm here, as the run's report names the host kind: kvm_pvm
/// (guest kernel code emulated), kvm_amd (SVM), kvm_intel (VT-x), or "unknown".
pub(crate) fn kvm_module() -> &'static str {
    ["kvm_pvm", "kvm_amd", "kvm_intel"]
        .into_iter()
        .find(|m| Path::new("/sys/module").join(m).exists())
        .unwrap_or("unknown")
}

/// Fix-up counts per kind, shared by all vCPUs.
#[derive(Default)]
pub struct FixupCounts(Mutex<BTreeMap<&'static str, u64>>);

impl FixupCounts {
    /// Counts one fix-up; returns true the first time this kind is seen (so it is logged once).
    pub fn record(&self, kind: &'static str) -> bool {
        let mut m = self.0.lock().unwrap();
        let c = m.entry(kind).or_insert(0);
        *c += 1;
        *c == 1
    }

    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }
}
