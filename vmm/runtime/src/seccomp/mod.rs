//! Seccomp filters (`--seccomp on|off`, docs/security.md): before the guest runs, every thread
//! of a VM run confines itself to the system calls its kind of work needs ([`rules`]). A call
//! outside that list traps (SECCOMP_RET_TRAP): the SIGSYS handler writes
//! `vpmu-vmm: seccomp: thread <name> made a forbidden system call <name> (<nr>)` to stderr and
//! ends the process with exit code [`code::SECCOMP`](crate::end::code::SECCOMP).
//!
//! `vm::run` opens a [`Scope`] on its calling thread; each thread it starts takes a
//! [`Confine`] from that scope before it is spawned ([`for_new_thread`]) and applies it first
//! thing; the calling thread confines itself once everything is started, before it waits for
//! the end. Filters stack and are inherited, so each thread applies its kind's filters only, and
//! the calling thread applies its own last (threads it spawned earlier do not inherit them).

pub(crate) mod fds;
pub(crate) mod names;
pub(crate) mod rules;

use std::cell::{Cell, RefCell};
use std::sync::{Arc, OnceLock};

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

use crate::end::code;

/// `--seccomp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum SeccompSetting {
    /// Each thread of the run is confined to the system calls it needs.
    #[default]
    On,
    /// No filters (debugging: strace, gdb, experiments with new host calls).
    Off,
}

/// The kinds of thread a VM run has, each with its own filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// The thread that called `vm::run`: waits for the end, then reports.
    Main,
    /// One per vCPU: KVM_RUN, the exits, the devices, the vPMU.
    Vcpu,
    /// The trace/host-profile writer.
    TraceWriter,
    /// `--vpmu-schedule`.
    Schedule,
    /// `compare`'s controller.
    Controller,
    /// Feeds stdin to COM1.
    Stdin,
}

impl ThreadKind {
    pub const ALL: [ThreadKind; 6] = [
        ThreadKind::Main,
        ThreadKind::Vcpu,
        ThreadKind::TraceWriter,
        ThreadKind::Schedule,
        ThreadKind::Controller,
        ThreadKind::Stdin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Main => "main",
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::TraceWriter => "trace-writer",
            ThreadKind::Schedule => "vpmu-schedule",
            ThreadKind::Controller => "vm-controller",
            ThreadKind::Stdin => "stdin",
        }
    }
}

/// The KVM descriptors of a built VM, on which its vCPU threads may make KVM ioctls
/// (`rules::for_thread`). Empty before the VM is built: no KVM ioctl then.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KvmFds {
    pub vm: Option<std::os::fd::RawFd>,
    pub vcpus: Vec<std::os::fd::RawFd>,
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp filter for the {kind} thread: {source}")]
    Compile {
        kind: &'static str,
        source: seccompiler::BackendError,
    },
    #[error("this kernel has no seccomp ({0}); --seccomp off runs without the filters")]
    Unsupported(std::io::Error),
    #[error("cannot install the SIGSYS handler: {0}")]
    Handler(std::io::Error),
    #[error("cannot install the seccomp filter on thread {thread}: {source}")]
    Install {
        thread: String,
        source: seccompiler::Error,
    },
}

/// Every kind's compiled filters: the allow list (anything else traps) and, for some kinds,
/// calls answered EPERM.
pub struct Filters {
    programs: Vec<(ThreadKind, BpfProgram, Option<BpfProgram>)>,
}

impl Filters {
    fn compile(kvm: &KvmFds) -> Result<Filters, SeccompError> {
        let mut programs = Vec::new();
        for kind in ThreadKind::ALL {
            let err = |source| SeccompError::Compile {
                kind: kind.name(),
                source,
            };
            let filter = SeccompFilter::new(
                rules::for_thread(kind, kvm),
                SeccompAction::Trap,
                SeccompAction::Allow,
                TargetArch::x86_64,
            )
            .map_err(err)?;
            let refused = rules::refused(kind);
            let refuse = if refused.is_empty() {
                None
            } else {
                let f = SeccompFilter::new(
                    refused,
                    SeccompAction::Allow,
                    SeccompAction::Errno(libc::EPERM as u32),
                    TargetArch::x86_64,
                )
                .map_err(err)?;
                Some(BpfProgram::try_from(f).map_err(err)?)
            };
            programs.push((kind, BpfProgram::try_from(filter).map_err(err)?, refuse));
        }
        Ok(Filters { programs })
    }

    fn programs(&self, kind: ThreadKind) -> (&BpfProgram, Option<&BpfProgram>) {
        let (_, allow, refuse) = self
            .programs
            .iter()
            .find(|(k, _, _)| *k == kind)
            .expect("programs per kind");
        (allow, refuse.as_ref())
    }

    /// Confines the calling thread with `kind`'s filters.
    pub fn apply(&self, kind: ThreadKind) -> Result<(), SeccompError> {
        remember_thread_name();
        let (allow, refuse) = self.programs(kind);
        let err = |source| SeccompError::Install {
            thread: thread_name(),
            source,
        };
        if let Some(p) = refuse {
            seccompiler::apply_filter(p).map_err(err)?;
        }
        seccompiler::apply_filter(allow).map_err(err)
    }
}

/// The filters for a run whose KVM descriptors are `kvm` (compiled anew: the descriptors differ
/// from run to run), with the SIGSYS handler installed.
pub(crate) fn filters_for(kvm: &KvmFds) -> Result<Arc<Filters>, SeccompError> {
    filters()?;
    Ok(Arc::new(Filters::compile(kvm)?))
}

/// The filters before a VM is built (no KVM ioctl for a vCPU thread; the same for every run),
/// with the SIGSYS handler installed.
pub fn filters() -> Result<Arc<Filters>, SeccompError> {
    static FILTERS: OnceLock<Arc<Filters>> = OnceLock::new();
    if let Some(f) = FILTERS.get() {
        return Ok(f.clone());
    }
    // SAFETY: PR_GET_SECCOMP takes no pointer; it fails with EINVAL without CONFIG_SECCOMP.
    if unsafe { libc::prctl(libc::PR_GET_SECCOMP) } < 0 {
        return Err(SeccompError::Unsupported(std::io::Error::last_os_error()));
    }
    let _ = IOCTL_NAMES.set(
        rules::known_ioctls()
            .into_iter()
            .map(|(n, r)| (r as u32, n))
            .collect(),
    );
    install_sigsys_handler()?;
    let f = Arc::new(Filters::compile(&KvmFds::default())?);
    Ok(FILTERS.get_or_init(|| f).clone())
}

thread_local! {
    /// The open [`Scope`] on this thread (set by `vm::run` for the threads it starts).
    static SCOPE: RefCell<Option<Arc<Filters>>> = const { RefCell::new(None) };
    /// This thread's name, kept for the SIGSYS report (read there without allocating).
    static NAME: Cell<[u8; 16]> = const { Cell::new([0; 16]) };
}

/// While alive, threads started from this thread (through [`for_new_thread`]) confine themselves.
pub(crate) struct Scope {
    on: bool,
}

impl Scope {
    pub(crate) fn enter(setting: SeccompSetting) -> Result<Scope, SeccompError> {
        let filters = match setting {
            SeccompSetting::On => Some(filters()?),
            SeccompSetting::Off => None,
        };
        let on = filters.is_some();
        SCOPE.with(|s| *s.borrow_mut() = filters);
        Ok(Scope { on })
    }

    /// Confines the calling thread as [`ThreadKind::Main`] (for the rest of its life), or ends
    /// the process like [`Confine::apply`] if it cannot.
    pub(crate) fn confine_caller(&self) {
        for_new_thread(ThreadKind::Main).apply()
    }

    pub(crate) fn is_on(&self) -> bool {
        self.on
    }

    /// Once the VM is built: the vCPU threads started from here on may make KVM ioctls on
    /// these descriptors (and no other).
    pub(crate) fn allow_kvm_fds(&self, kvm: &KvmFds) -> Result<(), SeccompError> {
        if self.on {
            let f = filters_for(kvm)?;
            SCOPE.with(|s| *s.borrow_mut() = Some(f));
        }
        Ok(())
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        SCOPE.with(|s| *s.borrow_mut() = None);
    }
}

/// A filter to apply on a thread about to be started (nothing when seccomp is off).
#[must_use = "apply it first thing in the new thread"]
pub(crate) struct Confine(Option<(Arc<Filters>, ThreadKind)>);

/// Takes the filter for a thread of `kind` that the calling thread is about to start.
pub(crate) fn for_new_thread(kind: ThreadKind) -> Confine {
    Confine(SCOPE.with(|s| s.borrow().clone()).map(|f| (f, kind)))
}

impl Confine {
    pub(crate) fn try_apply(self) -> Result<(), SeccompError> {
        match self.0 {
            Some((filters, kind)) => filters.apply(kind),
            None => Ok(()),
        }
    }

    /// Applies the filter on the calling (new) thread. A thread that cannot be confined ends
    /// the process (exit code [`code::SECCOMP`]): with `--seccomp on`, nothing runs unconfined.
    pub(crate) fn apply(self) {
        if let Err(e) = self.try_apply() {
            eprintln!("vpmu-vmm: seccomp: {e}");
            std::process::exit(code::SECCOMP);
        }
    }
}

fn remember_thread_name() {
    let mut buf = [0u8; 16];
    let cur = std::thread::current();
    let name = cur.name().unwrap_or("unnamed");
    let n = name.len().min(buf.len());
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    NAME.with(|c| c.set(buf));
}

fn thread_name() -> String {
    let buf = NAME.with(|c| c.get());
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// `siginfo_t` for SIGSYS (the `_sigsys` member of the kernel's union).
#[repr(C)]
struct SigsysInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    _pad: libc::c_int,
    call_addr: *mut libc::c_void,
    syscall: libc::c_int,
    arch: libc::c_uint,
}

/// The ioctl requests a forbidden call's report can name (as the kernel compares them: 32
/// bits), set before the handler is installed and only read by it.
static IOCTL_NAMES: OnceLock<Vec<(u32, &'static str)>> = OnceLock::new();

/// A fixed buffer the handler formats into (no allocation in a signal handler).
struct Line {
    buf: [u8; 320],
    len: usize,
}

impl Line {
    fn push(&mut self, s: &[u8]) {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
    }

    fn push_hex(&mut self, v: u64) {
        self.push(b"0x");
        let mut digits = [0u8; 16];
        let mut n = 0;
        let mut v = v;
        loop {
            digits[15 - n] = b"0123456789abcdef"[(v & 0xf) as usize];
            n += 1;
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[16 - n..]);
    }

    fn push_num(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

/// The report line for a forbidden call `nr` on thread `name`; for an ioctl, `args` are its fd
/// and request, which the line names (request by name where known, fd by kind: [`fds`]).
fn report_line(name: &[u8], nr: i64, args: (i64, u64)) -> Line {
    let mut l = Line {
        buf: [0; 320],
        len: 0,
    };
    l.push(b"vpmu-vmm: seccomp: thread ");
    let n = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    l.push(if n == 0 { b"unnamed" } else { &name[..n] });
    l.push(b" made a forbidden system call ");
    match names::name(nr) {
        Some(s) => {
            l.push(s.as_bytes());
            l.push(b" (");
            l.push_num(nr as u64);
            l.push(b")");
        }
        None => {
            l.push(b"number ");
            l.push_num(nr as u64);
        }
    }
    if nr == libc::SYS_ioctl {
        let (fd, request) = args;
        let request = request as u32;
        l.push(b": request ");
        match IOCTL_NAMES
            .get()
            .and_then(|t| t.iter().find(|(r, _)| *r == request))
        {
            Some((_, n)) => {
                l.push(n.as_bytes());
                l.push(b" (");
                l.push_hex(u64::from(request));
                l.push(b")");
            }
            None => {
                l.push_hex(u64::from(request));
                l.push(b" (type ");
                l.push_hex(u64::from((request >> 8) & 0xff));
                l.push(b", number ");
                l.push_hex(u64::from(request & 0xff));
                l.push(b")");
            }
        }
        l.push(b" on fd ");
        if fd < 0 {
            l.push(b"-");
        }
        l.push_num(fd.unsigned_abs());
        l.push(b", ");
        l.push(fds::kind_of(fd).name().as_bytes());
    }
    l.push(b"; exiting (exit code ");
    l.push_num(code::SECCOMP as u64);
    l.push(b"; --seccomp off disables the filters)\n");
    l
}

extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for SIGSYS, whose layout SigsysInfo mirrors
    // (x86_64); reading an int field is async-signal-safe.
    let nr = unsafe { (*(info as *const SigsysInfo)).syscall } as i64;
    // SAFETY: with SA_SIGINFO the third argument is the interrupted context, a ucontext_t whose
    // general registers hold the trapped call's arguments (x86_64: RDI, RSI, ...).
    let args = unsafe {
        let gregs = &(*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs;
        (
            gregs[libc::REG_RDI as usize],
            gregs[libc::REG_RSI as usize] as u64,
        )
    };
    // A const-initialised thread-local without destructor: a plain TLS load.
    let name = NAME.with(|c| c.get());
    let line = report_line(&name, nr, args);
    // SAFETY: write(2) and _exit(2) are async-signal-safe and allowed by every filter.
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::_exit(code::SECCOMP);
    }
}

fn install_sigsys_handler() -> Result<(), SeccompError> {
    // SAFETY: a zeroed sigaction is valid; we set a handler with the SA_SIGINFO signature.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigsys as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(libc::SIGSYS, &act, std::ptr::null_mut()) != 0 {
            return Err(SeccompError::Handler(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_filter_compiles() {
        let f = Filters::compile(&KvmFds::default()).unwrap();
        for kind in ThreadKind::ALL {
            assert!(!f.programs(kind).0.is_empty(), "{kind:?}");
            assert_eq!(f.programs(kind).1.is_some(), kind != ThreadKind::Main);
        }
    }

    #[test]
    fn report_line_names_the_thread_and_the_call() {
        let l = report_line(b"vcpu0\0\0\0", libc::SYS_socket, (0, 0));
        let s = std::str::from_utf8(&l.buf[..l.len]).unwrap();
        assert_eq!(
            s,
            "vpmu-vmm: seccomp: thread vcpu0 made a forbidden system call socket (41); \
             exiting (exit code 9; --seccomp off disables the filters)\n"
        );
        let l = report_line(b"", 9999, (0, 0));
        let s = std::str::from_utf8(&l.buf[..l.len]).unwrap();
        assert!(
            s.contains("thread unnamed made a forbidden system call number 9999;"),
            "{s}"
        );
    }

    #[test]
    fn names_table_knows_old_and_new_calls() {
        assert_eq!(names::name(libc::SYS_read), Some("read"));
        assert_eq!(names::name(libc::SYS_ioctl), Some("ioctl"));
        assert_eq!(names::name(libc::SYS_execve), Some("execve"));
        // Past the old hand-written table's end (450).
        assert_eq!(names::name(449), Some("futex_waitv"));
        assert_eq!(names::name(451), Some("cachestat"));
        assert_eq!(names::name(452), Some("fchmodat2"));
        assert_eq!(names::name(453), Some("map_shadow_stack"));
        assert_eq!(names::name(462), Some("mseal"));
        // Numbers no call has: the report falls back to the number.
        assert_eq!(names::name(-1), None);
        assert_eq!(names::name(9999), None);
        let l = report_line(b"vcpu1", 453, (0, 0));
        let s = std::str::from_utf8(&l.buf[..l.len]).unwrap();
        assert!(
            s.contains("thread vcpu1 made a forbidden system call map_shadow_stack (453);"),
            "{s}"
        );
    }

    #[test]
    fn vcpu_ioctl_numbers_match_kvm_ioctls_and_perf() {
        let all = rules::known_ioctls();
        let get = |n: &str| all.iter().find(|(k, _)| *k == n).unwrap().1;
        // Values from <linux/kvm.h> and <linux/perf_event.h> on x86_64.
        assert_eq!(get("KVM_RUN"), 0xae80);
        assert_eq!(get("KVM_GET_REGS"), 0x8090_ae81);
        assert_eq!(get("KVM_SET_SREGS"), 0x4138_ae84);
        assert_eq!(get("KVM_TRANSLATE"), 0xc018_ae85);
        assert_eq!(get("KVM_NMI"), 0xae9a);
        assert_eq!(get("KVM_SIGNAL_MSI"), 0x4020_aea5);
        assert_eq!(get("PERF_EVENT_IOC_ENABLE"), 0x2400);
        assert_eq!(get("PERF_EVENT_IOC_DISABLE"), 0x2401);
    }

    const CHILD_ENV: &str = "VPMU_SECCOMP_TEST_CHILD";

    /// Runs test `name` again in a child process (this test binary, `--exact`) with CHILD_ENV
    /// set to `tag`, so that it can apply a filter and die without taking the runner with it.
    fn rerun_in_child(name: &str, tag: &str) -> std::process::Output {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, tag)
            .output()
            .unwrap()
    }

    /// In a child process (this test binary again): confine the thread as a vCPU, make a call
    /// the vCPU filter forbids (socket), and see the report and the exit code.
    #[test]
    fn forbidden_call_on_a_vcpu_thread_ends_the_process_with_a_report() {
        if std::env::var(CHILD_ENV).as_deref() == Ok("1") {
            let f = filters().unwrap();
            std::thread::Builder::new()
                .name("vcpu7".into())
                .spawn(move || {
                    f.apply(ThreadKind::Vcpu).unwrap();
                    // Allowed calls still work.
                    // SAFETY: gettid has no preconditions.
                    assert!(unsafe { libc::gettid() } > 0);
                    // SAFETY: a plain socket(2) call; the filter traps it.
                    unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
                    eprintln!("UNREACHED: socket() returned");
                })
                .unwrap()
                .join()
                .unwrap();
            std::process::exit(0);
        }
        let out = rerun_in_child(
            "seccomp::tests::forbidden_call_on_a_vcpu_thread_ends_the_process_with_a_report",
            "1",
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code::SECCOMP), "stderr: {stderr}");
        assert!(
            stderr.contains(
                "vpmu-vmm: seccomp: thread vcpu7 made a forbidden system call socket (41)"
            ),
            "stderr: {stderr}"
        );
        assert!(!stderr.contains("UNREACHED"), "stderr: {stderr}");
    }

    /// tgkill and perf_event_open are allowed with the VMM's own arguments only: a vCPU
    /// thread may signal a thread of its own process and open a perf event on itself, not
    /// signal another process or watch another thread (the child reruns with tag 5 and 6).
    #[test]
    fn signals_and_perf_events_only_for_the_vmm_itself() {
        match std::env::var(CHILD_ENV).as_deref() {
            Ok("5") => {
                let f = filters().unwrap();
                std::thread::Builder::new()
                    .name("vcpu2".into())
                    .spawn(move || {
                        f.apply(ThreadKind::Vcpu).unwrap();
                        // SAFETY: signal 0 to this thread: a permission check, no signal.
                        let own = unsafe {
                            libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), 0)
                        };
                        eprintln!("own tgkill: {own}");
                        // SAFETY: signal 0 to pid 1's main thread: the filter traps it first.
                        unsafe { libc::syscall(libc::SYS_tgkill, 1, 1, 0) };
                        eprintln!("UNREACHED: tgkill to another process returned");
                    })
                    .unwrap()
                    .join()
                    .unwrap();
                std::process::exit(0);
            }
            Ok("6") => {
                let f = filters().unwrap();
                std::thread::Builder::new()
                    .name("vcpu4".into())
                    .spawn(move || {
                        f.apply(ThreadKind::Vcpu).unwrap();
                        let mut attr = perf_event_open_sys::bindings::perf_event_attr {
                            type_: perf_event_open_sys::bindings::PERF_TYPE_SOFTWARE,
                            config: perf_event_open_sys::bindings::PERF_COUNT_SW_TASK_CLOCK
                                as u64,
                            size: std::mem::size_of::<perf_event_open_sys::bindings::perf_event_attr>()
                                as u32,
                            ..Default::default()
                        };
                        let cloexec =
                            perf_event_open_sys::bindings::PERF_FLAG_FD_CLOEXEC as libc::c_ulong;
                        // SAFETY: a valid attr; this thread, any CPU: what the VMM opens.
                        let own = unsafe {
                            perf_event_open_sys::perf_event_open(&mut attr, 0, -1, -1, cloexec)
                        };
                        eprintln!("own perf event: {}", own >= 0 || own == -1);
                        // SAFETY: the same event on process 1: the filter traps it first.
                        unsafe { perf_event_open_sys::perf_event_open(&mut attr, 1, -1, -1, cloexec) };
                        eprintln!("UNREACHED: perf_event_open on another process returned");
                    })
                    .unwrap()
                    .join()
                    .unwrap();
                std::process::exit(0);
            }
            _ => {}
        }
        let name = "seccomp::tests::signals_and_perf_events_only_for_the_vmm_itself";
        for (tag, thread, call, allowed) in [
            ("5", "vcpu2", "tgkill (234)", "own tgkill: 0"),
            (
                "6",
                "vcpu4",
                "perf_event_open (298)",
                "own perf event: true",
            ),
        ] {
            let out = rerun_in_child(name, tag);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code::SECCOMP), "stderr: {stderr}");
            assert!(stderr.contains(allowed), "the VMM's own call: {stderr}");
            assert!(
                stderr.contains(&format!(
                    "thread {thread} made a forbidden system call {call}"
                )),
                "stderr: {stderr}"
            );
            assert!(!stderr.contains("UNREACHED"), "stderr: {stderr}");
        }
    }

    /// A panic on a filtered thread with RUST_BACKTRACE=1 still reports the panic (the
    /// backtrace's file access is refused, not trapped): bugs are not hidden behind exit 8.
    #[test]
    fn a_panic_with_backtrace_on_a_filtered_thread_is_reported() {
        if std::env::var(CHILD_ENV).as_deref() == Ok("3") {
            let f = filters().unwrap();
            let r = std::thread::Builder::new()
                .name("vcpu5".into())
                .spawn(move || {
                    f.apply(ThreadKind::Vcpu).unwrap();
                    panic!("boom on purpose");
                })
                .unwrap()
                .join();
            std::process::exit(if r.is_err() { 42 } else { 0 });
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "seccomp::tests::a_panic_with_backtrace_on_a_filtered_thread_is_reported",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "3")
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("boom on purpose"), "stderr: {stderr}");
        assert_eq!(out.status.code(), Some(42), "stderr: {stderr}");
    }

    /// The same with an ioctl request the vCPU filter does not list (KVM_CREATE_VM on a
    /// closed fd): ioctls are filtered by request number, not just allowed.
    #[test]
    fn unlisted_ioctl_request_is_forbidden_on_a_vcpu_thread() {
        if std::env::var(CHILD_ENV).as_deref() == Ok("2") {
            let f = filters().unwrap();
            std::thread::Builder::new()
                .name("vcpu3".into())
                .spawn(move || {
                    f.apply(ThreadKind::Vcpu).unwrap();
                    fds::note(3000, fds::FdKind::KvmVcpu);
                    // SAFETY: ioctl on an fd that is not open fails with EBADF if it gets that
                    // far.
                    unsafe { libc::ioctl(3000, 0xae01) }; // KVM_CREATE_VM
                    eprintln!("UNREACHED: ioctl returned");
                })
                .unwrap()
                .join()
                .unwrap();
            std::process::exit(0);
        }
        let out = rerun_in_child(
            "seccomp::tests::unlisted_ioctl_request_is_forbidden_on_a_vcpu_thread",
            "2",
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code::SECCOMP), "stderr: {stderr}");
        assert!(
            stderr.contains(
                "thread vcpu3 made a forbidden system call ioctl (16): request KVM_CREATE_VM \
                 (0xae01) on fd 3000, a KVM vCPU;"
            ),
            "stderr: {stderr}"
        );
    }

    /// A vCPU ioctl is allowed on the run's vCPU descriptors only, KVM_SIGNAL_MSI on its VM
    /// descriptor only: KVM_RUN on vCPU fd 3002 gets past the filter (and fails with EBADF:
    /// nothing is open there), KVM_SIGNAL_MSI on that vCPU fd traps (tag 7); KVM_RUN on fd
    /// 3003, not the run's, traps (tag 8).
    #[test]
    fn vcpu_ioctls_only_on_the_runs_own_kvm_descriptors() {
        let kvm = KvmFds {
            vm: Some(3001),
            vcpus: vec![3002],
        };
        let tag = std::env::var(CHILD_ENV);
        if let Ok(t @ ("7" | "8")) = tag.as_deref() {
            let f = filters_for(&kvm).unwrap();
            let second = if t == "7" {
                (
                    3002,
                    rules::known_ioctls()
                        .into_iter()
                        .find(|(n, _)| *n == "KVM_SIGNAL_MSI")
                        .unwrap()
                        .1,
                )
            } else {
                (3003, 0xae80)
            };
            std::thread::Builder::new()
                .name("vcpu5".into())
                .spawn(move || {
                    f.apply(ThreadKind::Vcpu).unwrap();
                    // SAFETY: ioctl on fds that are not open: EBADF if the filter lets it by.
                    let r = unsafe { libc::ioctl(3002, 0xae80) }; // KVM_RUN
                    let errno = std::io::Error::last_os_error().raw_os_error();
                    eprintln!("own vCPU fd: {r} {errno:?}");
                    // SAFETY: as above; the filter traps it first.
                    unsafe { libc::ioctl(second.0, second.1 as libc::c_ulong) };
                    eprintln!("UNREACHED: ioctl returned");
                })
                .unwrap()
                .join()
                .unwrap();
            std::process::exit(0);
        }
        let name = "seccomp::tests::vcpu_ioctls_only_on_the_runs_own_kvm_descriptors";
        for (tag, wanted) in [
            ("7", "request KVM_SIGNAL_MSI (0x4020aea5) on fd 3002"),
            ("8", "request KVM_RUN (0xae80) on fd 3003"),
        ] {
            let out = rerun_in_child(name, tag);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code::SECCOMP), "stderr: {stderr}");
            assert!(
                stderr.contains(&format!("own vCPU fd: -1 Some({})", libc::EBADF)),
                "stderr: {stderr}"
            );
            assert!(stderr.contains(wanted), "tag {tag}: stderr: {stderr}");
            assert!(!stderr.contains("UNREACHED"), "stderr: {stderr}");
        }
        // Before the VM is built no KVM ioctl is allowed at all.
        let before = rules::for_thread(ThreadKind::Vcpu, &KvmFds::default());
        let after = rules::for_thread(ThreadKind::Vcpu, &kvm);
        assert!(before[&libc::SYS_ioctl].len() < after[&libc::SYS_ioctl].len());
    }

    #[test]
    fn an_unknown_ioctl_request_is_named_by_its_type_and_number() {
        let _ = filters().unwrap();
        let l = report_line(b"vcpu0", libc::SYS_ioctl, (-1, 0xc008_ae77));
        let s = std::str::from_utf8(&l.buf[..l.len]).unwrap();
        assert!(
            s.contains(
                "ioctl (16): request 0xc008ae77 (type 0xae, number 0x77) on fd -1, of unknown kind;"
            ),
            "{s}"
        );
        let l = report_line(b"vcpu0", libc::SYS_ioctl, (7, 0x4048_ae9b));
        let s = std::str::from_utf8(&l.buf[..l.len]).unwrap();
        assert!(
            s.contains("request KVM_SET_GUEST_DEBUG (0x4048ae9b) on fd 7"),
            "{s}"
        );
    }

    /// A vCPU thread carries out block requests (docs/virtio-blk.md): every call a disk
    /// image needs is allowed there, and fallocate only in the block device's two modes.
    #[test]
    fn a_vcpu_thread_may_do_disk_io_and_nothing_more() {
        use crate::devices::virtio::blk::file::{DiskFile, RawFile};
        if std::env::var(CHILD_ENV).as_deref() == Ok("4") {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("d.img");
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .unwrap();
            file.set_len(1 << 20).unwrap();
            let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
            let mut disk = RawFile::new(file);
            let f = filters().unwrap();
            std::thread::Builder::new()
                .name("vcpu2".into())
                .spawn(move || {
                    f.apply(ThreadKind::Vcpu).unwrap();
                    let mut b = [7u8; 4096];
                    disk.write_at(&b, 8192).unwrap();
                    disk.read_at(&mut b, 0).unwrap();
                    disk.sync_data().unwrap();
                    disk.discard(0, 4096).unwrap();
                    disk.write_zeroes(4096, 4096).unwrap();
                    eprintln!("DISK I/O DONE");
                    // SAFETY: fallocate on an open fd; mode 0 (allocate) is not the device's.
                    unsafe { libc::fallocate(fd, 0, 0, 4096) };
                    eprintln!("UNREACHED: fallocate returned");
                })
                .unwrap()
                .join()
                .unwrap();
            std::process::exit(0);
        }
        let out = rerun_in_child(
            "seccomp::tests::a_vcpu_thread_may_do_disk_io_and_nothing_more",
            "4",
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("DISK I/O DONE"), "stderr: {stderr}");
        assert_eq!(out.status.code(), Some(code::SECCOMP), "stderr: {stderr}");
        assert!(
            stderr.contains("thread vcpu2 made a forbidden system call fallocate (285)"),
            "stderr: {stderr}"
        );
    }
}
