//! How a VM run ends, and the process exit code for each ending (documented in `--help`).

use std::time::Duration;

use crate::kvm_error::{AccessError, KvmVcpuError};

/// Why an instruction the host failed to emulate ended the run (exit code 6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmulationEnd {
    /// No fix-up could complete it (`host_quirks::emulate`).
    NotCompleted {
        vcpu: u32,
        failure: EmulationFailure,
    },
    /// `--host-quirks off`: no fix-up may run.
    FixupsOff { vcpu: u32, rip: u64 },
    /// Fix-ups completed it again and again at one RIP with no other exit in between
    /// (`last_exits::NO_PROGRESS_LIMIT`): the guest does not move on.
    NoProgress {
        vcpu: u32,
        in_a_row: u32,
        rip: u64,
        fixup: &'static str,
    },
}

impl std::fmt::Display for EmulationEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmulationEnd::NotCompleted { vcpu, failure } => write!(f, "vCPU {vcpu}: {failure}"),
            EmulationEnd::FixupsOff { vcpu, rip } => write!(
                f,
                "vCPU {vcpu}: the host could not emulate the guest instruction at RIP {rip:#x} (--host-quirks off: no fix-up)"
            ),
            EmulationEnd::NoProgress {
                vcpu,
                in_a_row,
                rip,
                fixup,
            } => write!(
                f,
                "vCPU {vcpu}: no progress: {in_a_row} emulation failures in a row at RIP {rip:#x}, each completed as `{fixup}`, with no other exit in between"
            ),
        }
    }
}

/// An instruction we could not complete: enough for the user to see what the guest was doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmulationFailure {
    pub rip: u64,
    pub bytes: Vec<u8>,
    pub text: String,
    pub reason: String,
}

impl std::fmt::Display for EmulationFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "guest instruction at RIP {:#x} [{:02x?}] `{}`: {}",
            self.rip, self.bytes, self.text, self.reason
        )
    }
}

/// Exit codes of `vpmu-vmm run`.
pub mod code {
    /// The guest powered off or rebooted.
    pub const CLEAN: i32 = 0;
    /// Bad input (unreadable or invalid kernel/initrd, ...) or a VMM setup failure.
    pub const ERROR: i32 = 1;
    /// Command-line usage error.
    pub const USAGE: i32 = 2;
    /// The guest kernel panicked.
    pub const GUEST_PANIC: i32 = 3;
    /// The guest triple-faulted (KVM_EXIT_SHUTDOWN).
    pub const TRIPLE_FAULT: i32 = 4;
    /// A KVM ioctl failed or KVM reported an exit the VMM cannot handle.
    pub const KVM_FAILURE: i32 = 5;
    /// The host could not emulate a guest instruction and the VMM had no fix-up for it.
    pub const EMULATION_FAILURE: i32 = 6;
    /// `--timeout` expired before the guest ended.
    pub const TIMEOUT: i32 = 7;
    /// A VMM bug: a vCPU thread panicked (the run was ended, its outputs closed).
    pub const VMM_BUG: i32 = 8;
    /// SIGINT / SIGTERM ended the run: 128 + the signal number (130, 143), as a shell reports.
    pub const SIGNAL_BASE: i32 = 128;
    /// A VMM thread made a system call its seccomp filter forbids (`--seccomp`,
    /// docs/security.md); the process ends at once with a line naming the thread and the call.
    pub const SECCOMP: i32 = 9;
    /// A vCPU exited to the VMM on HLT (KVM_EXIT_HLT). With the in-kernel irqchip KVM handles
    /// HLT itself (the vCPU sleeps in KVM until an interrupt), so this exit means something is
    /// wrong in KVM or in the VMM's setup, not in the guest.
    pub const UNEXPECTED_HLT: i32 = 10;
    /// The guest wrote 0 to the isa-debug-exit port (0xf4): kvm-unit-tests' "no test failed"
    /// (QEMU's status would be 1). Its own code, so no existing one changes meaning.
    pub const DEBUG_EXIT_ZERO: i32 = 11;
    /// The guest wrote a non-zero value to the isa-debug-exit port: kvm-unit-tests' "some test
    /// failed" (QEMU: `(value << 1) | 1`). The value is in the report (`end.debug_exit`).
    pub const DEBUG_EXIT_NONZERO: i32 = 12;
}

/// Why KVM failed the run (exit code 5): typed, so a caller can tell the cases apart; the text
/// is what `VmEnd`'s Display prints after "KVM failure: ".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvmFailure {
    /// A vCPU ioctl failed (KVM_RUN included); `vcpu` when the caller knew which vCPU.
    Vcpu {
        vcpu: Option<u32>,
        error: KvmVcpuError,
    },
    /// Reading or writing a vCPU's guest state failed while `what` was being done.
    GuestState {
        vcpu: u32,
        what: String,
        error: AccessError,
    },
    /// KVM_EXIT_INTERNAL_ERROR other than an emulation failure.
    InternalError { suberror: u32, data: Vec<u64> },
    /// KVM_EXIT_FAIL_ENTRY.
    FailEntry { reason: u64, cpu: u32 },
    /// KVM_EXIT_SYSTEM_EVENT of a type the VMM does not know.
    UnknownSystemEvent(u32),
    /// An exit the VMM does not handle (its debug text).
    UnexpectedExit(String),
    /// Periodic device work on a vCPU thread could not start.
    DeviceTicker(String),
}

impl std::fmt::Display for KvmFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvmFailure::Vcpu { vcpu: None, error } => write!(f, "{error}"),
            KvmFailure::Vcpu {
                vcpu: Some(v),
                error,
            } => write!(f, "vCPU {v}: {error}"),
            KvmFailure::GuestState { vcpu, what, error } => {
                write!(f, "vCPU {vcpu}: {what}: {error}")
            }
            KvmFailure::InternalError { suberror, data } => {
                write!(f, "internal error, suberror {suberror} data {data:x?}")
            }
            KvmFailure::FailEntry { reason, cpu } => {
                write!(
                    f,
                    "VM entry failed: hardware reason {reason:#x} on CPU {cpu}"
                )
            }
            KvmFailure::UnknownSystemEvent(k) => write!(f, "unknown KVM system event {k}"),
            KvmFailure::UnexpectedExit(e) => write!(f, "unexpected VM exit {e}"),
            KvmFailure::DeviceTicker(e) => write!(f, "device ticker: {e}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmEnd {
    PowerOff,
    Reboot,
    /// The kernel's panic line.
    GuestPanic(String),
    TripleFault,
    KvmFailure(KvmFailure),
    EmulationFailure(EmulationEnd),
    Timeout(Duration),
    /// A run-time controller (e.g. `vpmu-vmm compare`) ended the run when its experiment was done.
    Stopped(String),
    /// A vCPU thread panicked (a VMM bug): which one, and the panic message.
    VmmPanic(String),
    /// SIGINT or SIGTERM stopped the run (its number).
    Signal(i32),
    /// KVM_EXIT_HLT reached the VMM (see [`code::UNEXPECTED_HLT`]).
    UnexpectedHlt,
    /// The guest wrote this value to the isa-debug-exit port (`devices::debug_exit`).
    DebugExit(u32),
}

impl VmEnd {
    pub fn exit_code(&self) -> i32 {
        match self {
            VmEnd::PowerOff | VmEnd::Reboot | VmEnd::Stopped(_) => code::CLEAN,
            VmEnd::GuestPanic(_) => code::GUEST_PANIC,
            VmEnd::TripleFault => code::TRIPLE_FAULT,
            VmEnd::KvmFailure(_) => code::KVM_FAILURE,
            VmEnd::EmulationFailure(_) => code::EMULATION_FAILURE,
            VmEnd::Timeout(_) => code::TIMEOUT,
            VmEnd::VmmPanic(_) => code::VMM_BUG,
            VmEnd::Signal(s) => code::SIGNAL_BASE + s,
            VmEnd::UnexpectedHlt => code::UNEXPECTED_HLT,
            VmEnd::DebugExit(0) => code::DEBUG_EXIT_ZERO,
            VmEnd::DebugExit(_) => code::DEBUG_EXIT_NONZERO,
        }
    }

    pub fn is_clean(&self) -> bool {
        self.exit_code() == code::CLEAN
    }

    /// Whether the report explains the end with each vCPU's RIP and last exits and the console's
    /// last lines: on every end but a clean one and the guest's own isa-debug-exit (the guest
    /// chose to end there, and its console already says why).
    pub fn needs_diagnostic(&self) -> bool {
        !self.is_clean() && !matches!(self, VmEnd::DebugExit(_))
    }
}

impl std::fmt::Display for VmEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmEnd::PowerOff => write!(f, "guest powered off"),
            VmEnd::Reboot => write!(f, "guest rebooted"),
            VmEnd::GuestPanic(line) => write!(f, "guest kernel panic: {line}"),
            VmEnd::TripleFault => write!(f, "guest triple fault (KVM_EXIT_SHUTDOWN)"),
            VmEnd::KvmFailure(what) => write!(f, "KVM failure: {what}"),
            VmEnd::EmulationFailure(what) => write!(f, "unhandled emulation failure: {what}"),
            VmEnd::Timeout(d) => write!(f, "--timeout of {:.1} s expired", d.as_secs_f64()),
            VmEnd::Stopped(why) => write!(f, "stopped: {why}"),
            VmEnd::VmmPanic(what) => write!(f, "VMM bug: {what}"),
            VmEnd::Signal(s) => write!(f, "stopped by {}", crate::stop_signal::name(*s)),
            VmEnd::UnexpectedHlt => write!(
                f,
                "unexpected HLT exit (KVM_EXIT_HLT): with the in-kernel irqchip KVM handles HLT \
                 itself, so KVM or the VMM's vCPU setup is wrong (not the guest)"
            ),
            VmEnd::DebugExit(v) => write!(
                f,
                "guest wrote {v:#x} to the isa-debug-exit port (QEMU would exit with status {})",
                qemu_status(*v)
            ),
        }
    }
}

/// The exit status QEMU gives when the guest writes `value` to its isa-debug-exit device:
/// `(value << 1) | 1` (an int: bit 31 of the value is lost). Reported beside this VMM's own code.
pub fn qemu_status(value: u32) -> u32 {
    (value << 1) | 1
}

pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  the guest powered off or rebooted
  1  bad input (kernel, initrd, ...) or VMM setup failure
  2  command-line usage error
  3  the guest kernel panicked
  4  the guest triple-faulted
  5  KVM failure
  6  a guest instruction the host could not emulate and the VMM could not complete
  7  --timeout expired
  8  VMM bug (a vCPU thread panicked)
  9  a VMM thread made a system call its seccomp filter forbids (see --seccomp)
  10  a vCPU exited on HLT, which the in-kernel irqchip should have handled (KVM or VMM bug)
  11  the guest wrote 0 to the isa-debug-exit port 0xf4 (kvm-unit-tests: no test failed)
  12  the guest wrote a non-zero value to port 0xf4 (kvm-unit-tests: a test failed; see the report)
  130, 143  stopped by SIGINT (Ctrl-C) / SIGTERM (a second one kills at once)
On any end but 0, 11 and 12 a line per vCPU names its RIP and its last exits.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_exit_has_its_own_codes_and_no_diagnostic() {
        assert_eq!(VmEnd::DebugExit(0).exit_code(), code::DEBUG_EXIT_ZERO);
        assert_eq!(VmEnd::DebugExit(1).exit_code(), code::DEBUG_EXIT_NONZERO);
        assert_eq!(VmEnd::DebugExit(u32::MAX).exit_code(), 12);
        assert!(!VmEnd::DebugExit(0).is_clean());
        assert!(!VmEnd::DebugExit(0).needs_diagnostic());
        assert!(VmEnd::TripleFault.needs_diagnostic());
        assert!(!VmEnd::PowerOff.needs_diagnostic());
        let text = VmEnd::DebugExit(1).to_string();
        assert!(text.contains("0x1") && text.contains("status 3"), "{text}");
        // No other ending shares the two codes.
        let others = [
            VmEnd::PowerOff,
            VmEnd::Reboot,
            VmEnd::GuestPanic(String::new()),
            VmEnd::TripleFault,
            VmEnd::EmulationFailure(EmulationEnd::FixupsOff { vcpu: 0, rip: 0 }),
            VmEnd::Timeout(Duration::ZERO),
            VmEnd::Stopped(String::new()),
            VmEnd::VmmPanic(String::new()),
            VmEnd::Signal(2),
            VmEnd::Signal(15),
            VmEnd::UnexpectedHlt,
        ];
        for e in others {
            assert!(![11, 12].contains(&e.exit_code()), "{e}");
        }
    }

    #[test]
    fn qemu_status_is_value_shifted_with_bit_0_set() {
        assert_eq!(qemu_status(0), 1);
        assert_eq!(qemu_status(1), 3);
        assert_eq!(qemu_status(0x8000_0001), 3);
    }
}
