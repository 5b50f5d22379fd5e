//! The system calls each VMM thread may make (docs/security.md lists them). Everything else
//! traps (SIGSYS, see the parent module).

use std::collections::BTreeMap;
use std::os::fd::RawFd;

use super::{KvmFds, ThreadKind};
use seccompiler::{
    SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompRule,
};

/// Rules per system call number; an empty list allows the call with any arguments.
pub(crate) type Rules = BTreeMap<i64, Vec<SeccompRule>>;

/// KVM vCPU (and VM) ioctls the vCPU thread makes, defined as in kvm-ioctls.
mod kvm {
    use kvm_bindings::*;
    use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iow_nr, ioctl_iowr_nr};
    const KVMIO: std::os::raw::c_uint = 0xAE;
    ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
    ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
    ioctl_iow_nr!(KVM_SET_REGS, KVMIO, 0x82, kvm_regs);
    ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_sregs);
    ioctl_iow_nr!(KVM_SET_SREGS, KVMIO, 0x84, kvm_sregs);
    ioctl_iowr_nr!(KVM_TRANSLATE, KVMIO, 0x85, kvm_translation);
    ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_msrs);
    ioctl_iow_nr!(KVM_SET_MSRS, KVMIO, 0x89, kvm_msrs);
    ioctl_ior_nr!(KVM_GET_FPU, KVMIO, 0x8c, kvm_fpu);
    ioctl_iow_nr!(KVM_SET_FPU, KVMIO, 0x8d, kvm_fpu);
    ioctl_ior_nr!(KVM_GET_LAPIC, KVMIO, 0x8e, kvm_lapic_state);
    ioctl_iow_nr!(KVM_SET_LAPIC, KVMIO, 0x8f, kvm_lapic_state);
    ioctl_ior_nr!(KVM_GET_MP_STATE, KVMIO, 0x98, kvm_mp_state);
    ioctl_io_nr!(KVM_NMI, KVMIO, 0x9a);
    ioctl_ior_nr!(KVM_GET_VCPU_EVENTS, KVMIO, 0x9f, kvm_vcpu_events);
    ioctl_iow_nr!(KVM_SET_VCPU_EVENTS, KVMIO, 0xa0, kvm_vcpu_events);
    ioctl_io_nr!(KVM_GET_TSC_KHZ, KVMIO, 0xa3);
    ioctl_iow_nr!(KVM_SIGNAL_MSI, KVMIO, 0xa5, kvm_msi);
    // Named in a forbidden call's report only (no VMM thread may make them after setup).
    ioctl_io_nr!(KVM_CREATE_VM, KVMIO, 0x01);
    ioctl_io_nr!(KVM_CHECK_EXTENSION, KVMIO, 0x03);
    ioctl_io_nr!(KVM_GET_VCPU_MMAP_SIZE, KVMIO, 0x04);
    ioctl_iowr_nr!(KVM_GET_SUPPORTED_CPUID, KVMIO, 0x05, kvm_cpuid2);
    ioctl_io_nr!(KVM_CREATE_VCPU, KVMIO, 0x41);
    ioctl_iow_nr!(
        KVM_SET_USER_MEMORY_REGION,
        KVMIO,
        0x46,
        kvm_userspace_memory_region
    );
    ioctl_io_nr!(KVM_CREATE_IRQCHIP, KVMIO, 0x60);
    ioctl_iow_nr!(KVM_IRQ_LINE, KVMIO, 0x61, kvm_irq_level);
    ioctl_iowr_nr!(KVM_IRQ_LINE_STATUS, KVMIO, 0x67, kvm_irq_level);
    ioctl_iow_nr!(KVM_IRQFD, KVMIO, 0x76, kvm_irqfd);
    ioctl_iow_nr!(KVM_IOEVENTFD, KVMIO, 0x79, kvm_ioeventfd);
    ioctl_iow_nr!(KVM_SET_CLOCK, KVMIO, 0x7b, kvm_clock_data);
    ioctl_ior_nr!(KVM_GET_CLOCK, KVMIO, 0x7c, kvm_clock_data);
    ioctl_iow_nr!(KVM_SET_CPUID2, KVMIO, 0x90, kvm_cpuid2);
    ioctl_iowr_nr!(KVM_GET_CPUID2, KVMIO, 0x91, kvm_cpuid2);
    ioctl_iow_nr!(KVM_SET_MP_STATE, KVMIO, 0x99, kvm_mp_state);
    ioctl_iow_nr!(KVM_SET_GUEST_DEBUG, KVMIO, 0x9b, kvm_guest_debug);
    ioctl_ior_nr!(KVM_GET_DEBUGREGS, KVMIO, 0xa1, kvm_debugregs);
    ioctl_io_nr!(KVM_SET_TSC_KHZ, KVMIO, 0xa2);
    ioctl_ior_nr!(KVM_GET_XSAVE, KVMIO, 0xa4, kvm_xsave);
    ioctl_iow_nr!(KVM_SET_XSAVE, KVMIO, 0xa5, kvm_xsave);
    ioctl_io_nr!(KVM_KVMCLOCK_CTRL, KVMIO, 0xad);
    ioctl_iow_nr!(KVM_ENABLE_CAP, KVMIO, 0xa3, kvm_enable_cap);
    ioctl_iow_nr!(KVM_SET_PMU_EVENT_FILTER, KVMIO, 0xb2, kvm_pmu_event_filter);
    ioctl_iow_nr!(KVM_X86_SET_MSR_FILTER, KVMIO, 0xc6, kvm_msr_filter);
    ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);
}

/// (name, request) of the vCPU ioctls a vCPU thread makes, on the run's vCPU descriptors only.
fn vcpu_fd_ioctls() -> Vec<(&'static str, u64)> {
    vec![
        ("KVM_RUN", kvm::KVM_RUN()),
        ("KVM_GET_REGS", kvm::KVM_GET_REGS()),
        ("KVM_SET_REGS", kvm::KVM_SET_REGS()),
        ("KVM_GET_SREGS", kvm::KVM_GET_SREGS()),
        ("KVM_SET_SREGS", kvm::KVM_SET_SREGS()),
        ("KVM_GET_MSRS", kvm::KVM_GET_MSRS()),
        ("KVM_SET_MSRS", kvm::KVM_SET_MSRS()),
        ("KVM_GET_FPU", kvm::KVM_GET_FPU()),
        ("KVM_SET_FPU", kvm::KVM_SET_FPU()),
        ("KVM_GET_LAPIC", kvm::KVM_GET_LAPIC()),
        ("KVM_SET_LAPIC", kvm::KVM_SET_LAPIC()),
        ("KVM_NMI", kvm::KVM_NMI()),
        ("KVM_GET_VCPU_EVENTS", kvm::KVM_GET_VCPU_EVENTS()),
        ("KVM_SET_VCPU_EVENTS", kvm::KVM_SET_VCPU_EVENTS()),
        ("KVM_GET_TSC_KHZ", kvm::KVM_GET_TSC_KHZ()),
    ]
}

/// (name, request) of the VM ioctls a vCPU thread makes, on the run's VM descriptor only.
fn vm_fd_ioctls() -> Vec<(&'static str, u64)> {
    vec![("KVM_SIGNAL_MSI", kvm::KVM_SIGNAL_MSI())]
}

/// (name, request) of the perf-event ioctls a vCPU thread makes: on any descriptor, since its
/// perf events are opened while it runs (a request of another type is refused all the same).
fn perf_ioctls() -> Vec<(&'static str, u64)> {
    use perf_event_open_sys::bindings as perf;
    vec![
        ("PERF_EVENT_IOC_ENABLE", perf::ENABLE.into()),
        ("PERF_EVENT_IOC_DISABLE", perf::DISABLE.into()),
        ("PERF_EVENT_IOC_RESET", perf::RESET.into()),
        ("PERF_EVENT_IOC_REFRESH", perf::REFRESH.into()),
        ("PERF_EVENT_IOC_PERIOD", perf::PERIOD.into()),
        ("PERF_EVENT_IOC_ID", perf::ID.into()),
    ]
}

/// (name, request) of every ioctl the vCPU thread may make (each on its kind of descriptor:
/// [`vcpu_ioctl_rules`]).
pub(crate) fn vcpu_ioctls() -> Vec<(&'static str, u64)> {
    let mut all = vcpu_fd_ioctls();
    all.extend(vm_fd_ioctls());
    all.extend(perf_ioctls());
    all
}

/// (name, request) of every ioctl a forbidden call's report can name: those some thread may
/// make, and the KVM ioctls of setup, which none may.
pub(crate) fn known_ioctls() -> Vec<(&'static str, u64)> {
    let mut all = vcpu_ioctls();
    all.extend(main_ioctls());
    all.extend([
        // Nothing calls these (vcpu_access/mod.rs walks the page tables itself).
        ("KVM_TRANSLATE", kvm::KVM_TRANSLATE()),
        ("KVM_GET_MP_STATE", kvm::KVM_GET_MP_STATE()),
        ("KVM_CREATE_VM", kvm::KVM_CREATE_VM()),
        ("KVM_CHECK_EXTENSION", kvm::KVM_CHECK_EXTENSION()),
        ("KVM_GET_VCPU_MMAP_SIZE", kvm::KVM_GET_VCPU_MMAP_SIZE()),
        ("KVM_GET_SUPPORTED_CPUID", kvm::KVM_GET_SUPPORTED_CPUID()),
        ("KVM_CREATE_VCPU", kvm::KVM_CREATE_VCPU()),
        (
            "KVM_SET_USER_MEMORY_REGION",
            kvm::KVM_SET_USER_MEMORY_REGION(),
        ),
        ("KVM_CREATE_IRQCHIP", kvm::KVM_CREATE_IRQCHIP()),
        ("KVM_IRQ_LINE", kvm::KVM_IRQ_LINE()),
        ("KVM_IRQ_LINE_STATUS", kvm::KVM_IRQ_LINE_STATUS()),
        ("KVM_IRQFD", kvm::KVM_IRQFD()),
        ("KVM_IOEVENTFD", kvm::KVM_IOEVENTFD()),
        ("KVM_SET_CLOCK", kvm::KVM_SET_CLOCK()),
        ("KVM_GET_CLOCK", kvm::KVM_GET_CLOCK()),
        ("KVM_SET_CPUID2", kvm::KVM_SET_CPUID2()),
        ("KVM_GET_CPUID2", kvm::KVM_GET_CPUID2()),
        ("KVM_SET_MP_STATE", kvm::KVM_SET_MP_STATE()),
        ("KVM_SET_GUEST_DEBUG", kvm::KVM_SET_GUEST_DEBUG()),
        ("KVM_GET_DEBUGREGS", kvm::KVM_GET_DEBUGREGS()),
        ("KVM_SET_TSC_KHZ", kvm::KVM_SET_TSC_KHZ()),
        ("KVM_GET_XSAVE", kvm::KVM_GET_XSAVE()),
        ("KVM_SET_XSAVE", kvm::KVM_SET_XSAVE()),
        ("KVM_KVMCLOCK_CTRL", kvm::KVM_KVMCLOCK_CTRL()),
        ("KVM_ENABLE_CAP", kvm::KVM_ENABLE_CAP()),
        ("KVM_SET_PMU_EVENT_FILTER", kvm::KVM_SET_PMU_EVENT_FILTER()),
        ("KVM_X86_SET_MSR_FILTER", kvm::KVM_X86_SET_MSR_FILTER()),
        ("KVM_GET_STATS_FD", kvm::KVM_GET_STATS_FD()),
    ]);
    all
}

/// (name, request) of the ioctls the main thread may make after setup: terminal queries only
/// (`isatty` on the report's output).
pub(crate) fn main_ioctls() -> Vec<(&'static str, u64)> {
    vec![("TCGETS", libc::TCGETS), ("FIONBIO", libc::FIONBIO)]
}

fn condition(arg: u8, len: Len, op: Op, value: u64) -> Cond {
    Cond::new(arg, len, op, value).expect("argument index < 6")
}

fn cond(arg: u8, len: Len, op: Op, value: u64) -> SeccompRule {
    SeccompRule::new(vec![condition(arg, len, op, value)]).expect("one condition")
}

/// ioctl(fd, request, ...) with request in `allowed` (compared as the kernel does: 32 bits).
fn ioctl_rules(allowed: &[(&'static str, u64)]) -> Vec<SeccompRule> {
    allowed
        .iter()
        .map(|&(_, r)| cond(1, Len::Dword, Op::Eq, r))
        .collect()
}

/// ioctl(fd, request, ...) with fd one of `fds` and request in `allowed` (both compared as the
/// kernel does: 32 bits). Request-major, in `allowed`'s order: the filter runs on every
/// KVM_RUN, which comes first, so any vCPU's KVM_RUN matches within as many rules as there are
/// vCPUs (fd-major, the last vCPU's would pass every other vCPU's whole list first).
fn ioctl_on_fds_rules(fds: &[RawFd], allowed: &[(&'static str, u64)]) -> Vec<SeccompRule> {
    let mut rules = Vec::new();
    for &(_, r) in allowed {
        for &fd in fds {
            let conds = vec![
                condition(0, Len::Dword, Op::Eq, fd as u32 as u64),
                condition(1, Len::Dword, Op::Eq, r),
            ];
            rules.push(SeccompRule::new(conds).expect("two conditions"));
        }
    }
    rules
}

/// A vCPU thread's ioctls: the vCPU ioctls on the run's vCPU descriptors, KVM_SIGNAL_MSI on its
/// VM descriptor, the perf-event ioctls on any. Not /dev/kvm, not another VM's descriptors.
/// Before the VM is built (`kvm` without descriptors) no KVM ioctl is allowed.
fn vcpu_ioctl_rules(kvm: &KvmFds) -> Vec<SeccompRule> {
    let mut rules = ioctl_on_fds_rules(&kvm.vcpus, &vcpu_fd_ioctls());
    rules.extend(ioctl_on_fds_rules(kvm.vm.as_slice(), &vm_fd_ioctls()));
    rules.extend(ioctl_rules(&perf_ioctls()));
    rules
}

/// mmap/mprotect without PROT_EXEC: no thread makes new code.
fn no_exec(arg: u8) -> Vec<SeccompRule> {
    vec![cond(
        arg,
        Len::Dword,
        Op::MaskedEq(libc::PROT_EXEC as u64),
        0,
    )]
}

fn allow(rules: &mut Rules, calls: &[libc::c_long]) {
    for &c in calls {
        rules.insert(c, Vec::new());
    }
}

/// What every thread needs: memory (the allocator), locks and condition variables, its own
/// signals (the kick, and the SIGSYS report), time, logging to stderr, and ending.
fn common() -> Rules {
    let mut r = Rules::new();
    allow(
        &mut r,
        &[
            libc::SYS_brk,
            libc::SYS_munmap,
            libc::SYS_mremap,
            libc::SYS_madvise,
            libc::SYS_futex,
            libc::SYS_sched_yield,
            libc::SYS_sched_getaffinity,
            libc::SYS_rt_sigreturn,
            libc::SYS_rt_sigprocmask,
            libc::SYS_sigaltstack,
            libc::SYS_clock_gettime,
            libc::SYS_clock_nanosleep,
            libc::SYS_nanosleep,
            libc::SYS_gettid,
            libc::SYS_getpid,
            libc::SYS_getrandom,
            libc::SYS_write,
            libc::SYS_writev,
            libc::SYS_close,
            libc::SYS_exit,
            libc::SYS_exit_group,
        ],
    );
    r.insert(libc::SYS_mmap, no_exec(2));
    r.insert(libc::SYS_mprotect, no_exec(2));
    // Closing an fd (a file, an eventfd) in a debug build: the standard library first checks
    // the fd is open with fcntl(fd, F_GETFD). Kinds that need more fcntl replace this rule
    // with [`fcntl_rules`], which includes it.
    r.insert(
        libc::SYS_fcntl,
        vec![cond(1, Len::Dword, Op::Eq, libc::F_GETFD as u64)],
    );
    r
}

/// fcntl(fd, cmd, ...) for the perf fds: owner thread, signal, O_ASYNC | O_NONBLOCK.
fn fcntl_rules() -> Vec<SeccompRule> {
    [
        libc::F_GETFL,
        libc::F_SETFL,
        15, // F_SETOWN_EX
        10, // F_SETSIG
        libc::F_GETFD,
        libc::F_SETFD,
    ]
    .iter()
    .map(|&c| cond(1, Len::Dword, Op::Eq, c as u64))
    .collect()
}

/// fallocate(fd, mode, ...) as the block device makes it: punch a hole (DISCARD) or zero a
/// range (WRITE_ZEROES), both keeping the file's size.
pub(crate) fn disk_fallocate_rules() -> Vec<SeccompRule> {
    [
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
    ]
    .iter()
    .map(|&m| cond(1, Len::Dword, Op::Eq, m as u64))
    .collect()
}

/// tgkill(tgid, tid, sig) to a thread of this process only (kicking a vCPU, raising a signal
/// on itself).
fn own_tgkill() -> Vec<SeccompRule> {
    vec![cond(0, Len::Dword, Op::Eq, u64::from(std::process::id()))]
}

/// perf_event_open(attr, pid, cpu, group_fd, flags) as the VMM makes it (`pmu/perf.rs`): on
/// the calling thread (pid 0) on any CPU (-1), no group (-1), flags FD_CLOEXEC. (The event in
/// `attr` is behind a pointer, which seccomp cannot read.)
fn own_perf_event_open() -> Vec<SeccompRule> {
    let minus_one = u64::from(u32::MAX);
    let flags = u64::from(perf_event_open_sys::bindings::PERF_FLAG_FD_CLOEXEC);
    vec![SeccompRule::new(vec![
        Cond::new(1, Len::Dword, Op::Eq, 0).expect("argument index < 6"),
        Cond::new(2, Len::Dword, Op::Eq, minus_one).expect("argument index < 6"),
        Cond::new(3, Len::Dword, Op::Eq, minus_one).expect("argument index < 6"),
        Cond::new(4, Len::Qword, Op::Eq, flags).expect("argument index < 6"),
    ])
    .expect("four conditions")]
}

/// File-system look-ups refused with EPERM on the threads other than the main one.
const REFUSED: &[libc::c_long] = &[
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_getcwd,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_stat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
];

/// Calls a thread other than the main one may make but that fail with EPERM instead of
/// running (a second filter; seccomp takes the strictest answer of all filters): opening and
/// looking up files. glibc's malloc opens /proc/sys/vm/overcommit_memory once, on whichever
/// thread first trims an arena, and copes with a failure; a panic's backtrace (RUST_BACKTRACE)
/// looks for the binary's debug information, and without it still prints the panic.
pub(crate) fn refused(kind: ThreadKind) -> Rules {
    let mut r = Rules::new();
    if kind != ThreadKind::Main {
        allow(&mut r, REFUSED);
    }
    r
}

/// The rules for one kind of thread of a run whose KVM descriptors are `kvm`.
pub(crate) fn for_thread(kind: ThreadKind, kvm: &KvmFds) -> Rules {
    let mut r = common();
    if kind != ThreadKind::Main {
        // Refused by the second filter (see [`refused`]).
        allow(&mut r, REFUSED);
    }
    match kind {
        ThreadKind::Vcpu => {
            // KVM_RUN and the exits (devices run here: UART output, irqfd writes, COM2 file),
            // the vPMU's and profiler's perf events, POSIX timers (KickTimer, ticker, sampler),
            // kicking the other vCPUs when the VM ends.
            r.insert(libc::SYS_ioctl, vcpu_ioctl_rules(kvm));
            r.insert(libc::SYS_fcntl, fcntl_rules());
            // virtio-blk requests run here (on the thread whose notify asked for them):
            // pread64/pwrite64 for reads and writes, fdatasync for FLUSH, fallocate in the two
            // modes DISCARD and WRITE_ZEROES use.
            allow(
                &mut r,
                &[libc::SYS_pread64, libc::SYS_pwrite64, libc::SYS_fdatasync],
            );
            r.insert(libc::SYS_fallocate, disk_fallocate_rules());
            allow(
                &mut r,
                &[
                    libc::SYS_read,
                    libc::SYS_timer_create,
                    libc::SYS_timer_settime,
                    libc::SYS_timer_gettime,
                    libc::SYS_timer_delete,
                ],
            );
            r.insert(libc::SYS_perf_event_open, own_perf_event_open());
            r.insert(libc::SYS_tgkill, own_tgkill());
        }
        ThreadKind::TraceWriter => {
            // Writes blocks to the trace file it was given open.
            allow(&mut r, &[libc::SYS_fsync, libc::SYS_lseek]);
        }
        ThreadKind::Schedule | ThreadKind::Controller => {
            // Sleeps, sets the mode, kicks the vCPUs (pthread_kill) and may stop the VM.
            r.insert(libc::SYS_tgkill, own_tgkill());
        }
        ThreadKind::Stdin => {
            // Reads stdin into COM1 (whose interrupt is an irqfd write).
            allow(&mut r, &[libc::SYS_read]);
        }
        ThreadKind::Main => {
            // Waits for the end, kicks, joins; then reports: reads and writes files (trace
            // header, compare tables and charts, the caller's own files), no new processes,
            // threads, sockets or KVM objects.
            r.insert(libc::SYS_ioctl, ioctl_rules(&main_ioctls()));
            r.insert(libc::SYS_fcntl, fcntl_rules());
            allow(
                &mut r,
                &[
                    libc::SYS_read,
                    libc::SYS_pread64,
                    libc::SYS_pwrite64,
                    libc::SYS_readv,
                    libc::SYS_lseek,
                    libc::SYS_open,
                    libc::SYS_openat,
                    libc::SYS_fstat,
                    libc::SYS_newfstatat,
                    libc::SYS_statx,
                    libc::SYS_access,
                    libc::SYS_faccessat,
                    libc::SYS_faccessat2,
                    libc::SYS_getdents64,
                    libc::SYS_getcwd,
                    libc::SYS_readlink,
                    libc::SYS_readlinkat,
                    libc::SYS_mkdir,
                    libc::SYS_mkdirat,
                    libc::SYS_unlink,
                    libc::SYS_unlinkat,
                    libc::SYS_rmdir,
                    libc::SYS_rename,
                    libc::SYS_renameat,
                    libc::SYS_renameat2,
                    libc::SYS_ftruncate,
                    libc::SYS_fsync,
                    libc::SYS_fdatasync,
                    libc::SYS_fchmod,
                    libc::SYS_dup,
                    libc::SYS_poll,
                    libc::SYS_prlimit64,
                    libc::SYS_getrusage,
                ],
            );
            r.insert(libc::SYS_tgkill, own_tgkill());
        }
    }
    r
}
