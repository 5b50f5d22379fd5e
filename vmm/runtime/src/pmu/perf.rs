//! The thin layer over `perf_event_open(2)` that counter backends use, as a trait so the
//! backends are unit-tested against a fake (the hardware-event path cannot run on hosts
//! without a PMU).

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use perf_event_open_sys as sys;

// fcntl(2) constants and struct from <fcntl.h> that the libc crate does not export.
const F_SETSIG: libc::c_int = 10;
const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_TID: libc::c_int = 0;
#[repr(C)]
struct FOwnerEx {
    type_: libc::c_int,
    pid: libc::pid_t,
}

/// What to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PerfEvent {
    /// Thread CPU time in nanoseconds (PERF_TYPE_SOFTWARE / PERF_COUNT_SW_TASK_CLOCK).
    TaskClock,
    /// PERF_TYPE_HARDWARE with a generic id (PERF_COUNT_HW_*).
    Hardware(u64),
    /// PERF_TYPE_RAW with a model-specific event encoding.
    Raw(u64),
    /// Counts nothing; writes a PERF_RECORD_SWITCH each time the host scheduler switches the
    /// thread out or in (PERF_COUNT_SW_DUMMY with `context_switch`), for [`PerfSys::switch_seq`].
    SwitchRecords,
}

/// One `perf_event_open` request, always for the calling thread on any CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PerfRequest {
    pub event: PerfEvent,
    /// Notify (signal the calling thread) every this many counts; None = count only.
    pub sample_period: Option<u64>,
    pub exclude_user: bool,
    pub exclude_kernel: bool,
    /// Count only in guest mode (hardware virtualization only).
    pub exclude_host: bool,
    /// Count only outside guest mode.
    pub exclude_guest: bool,
    /// Open disabled (enable later).
    pub disabled: bool,
    /// Read with perf's time totals (PERF_FORMAT_TOTAL_TIME_ENABLED | _RUNNING), so a
    /// multiplexed event can be noticed and scaled ([`PerfSys::read_count`]).
    pub read_times: bool,
}

/// One `read(2)` of an event: its count and, if it was opened with
/// [`PerfRequest::read_times`], how long it was enabled and how long it really had a hardware
/// counter (ns; both 0 otherwise). When events outnumber the host's counters perf multiplexes
/// them: each counts only part of the time (`time_running < time_enabled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PerfCount {
    pub value: u64,
    pub time_enabled: u64,
    pub time_running: u64,
}

impl PerfCount {
    /// Whether the event missed part of its enabled time.
    pub(crate) fn multiplexed(&self) -> bool {
        self.time_running < self.time_enabled
    }

    /// The count extrapolated to the whole enabled time (perf's own estimate, as `perf stat`
    /// prints it); the count itself if it was not multiplexed or never ran.
    pub(crate) fn scaled(&self) -> u64 {
        if !self.multiplexed() || self.time_running == 0 {
            return self.value;
        }
        let v =
            u128::from(self.value) * u128::from(self.time_enabled) / u128::from(self.time_running);
        u64::try_from(v).unwrap_or(u64::MAX)
    }
}

impl PerfRequest {
    /// `event` counting everything the calling thread does, enabled, no sampling.
    pub(crate) fn counting(event: PerfEvent) -> Self {
        PerfRequest {
            event,
            sample_period: None,
            exclude_user: false,
            exclude_kernel: false,
            exclude_host: false,
            exclude_guest: false,
            disabled: false,
            read_times: false,
        }
    }
}

/// The perf syscalls a backend needs.
pub(crate) trait PerfSys: Send {
    /// Opens an event on the calling thread; overflow notifications (if sampling) go to that
    /// thread as the vCPU kick signal.
    fn open(&mut self, req: &PerfRequest) -> io::Result<RawFd>;
    fn read(&mut self, fd: RawFd) -> u64;
    /// `read(2)` with the time totals, for an event opened with [`PerfRequest::read_times`]
    /// (the default: the count alone, times 0).
    fn read_count(&mut self, fd: RawFd) -> PerfCount {
        PerfCount {
            value: self.read(fd),
            ..PerfCount::default()
        }
    }
    fn close(&mut self, fd: RawFd);
    /// Sets a sampling event's period; the next notification comes `period` counts from now
    /// (PERF_EVENT_IOC_PERIOD restarts the event's period).
    fn set_period(&mut self, fd: RawFd, period: u64);
    /// For a [`PerfEvent::SwitchRecords`] event: a number that moves whenever the host
    /// scheduler switches the thread out or in (the ring buffer's `data_head`, advanced by each
    /// switch record; the buffer is mapped read-only, so the kernel overwrites old records).
    /// Read with a plain load: no system call. (The control page's `lock` word is no use here:
    /// measured, it moves when the thread sleeps but not when it is preempted.)
    fn switch_seq(&mut self, fd: RawFd) -> io::Result<SwitchSeq>;
    /// Whether this layer wants [`guest_entry`](Self::guest_entry) and
    /// [`guest_exit`](Self::guest_exit) (the simulated host). Asked once: the backend makes the
    /// two calls on every exit only then (each is an indirect call on the exit path, where the
    /// host's kernel has just left the branch predictors cold).
    fn sees_guest_transitions(&self) -> bool {
        false
    }
    /// Just before KVM_RUN, inside the cpu-switch gate. A host's hardware sees VM entry by
    /// itself (nothing to do); the simulated host (`backend/sim_host.rs`) is told here.
    fn guest_entry(&mut self) {}
    /// Just after KVM_RUN returns (see [`guest_entry`](Self::guest_entry)).
    fn guest_exit(&mut self) {}
}

/// See [`PerfSys::switch_seq`]: a u64 the host moves on every switch of the thread, read with
/// one load (no system call, and no indirect call: the gate reads it on every exit). It keeps
/// what it points into alive (the event's mapping, or a test's counter); valid while the
/// event's fd is open.
pub(crate) struct SwitchSeq {
    at: *const AtomicU64,
    _keep: Box<dyn Send>,
}

// SAFETY: `at` points into `_keep`'s memory (a mapping or an Arc'd atomic), which moves with
// the value and is only read, atomically.
unsafe impl Send for SwitchSeq {}

impl SwitchSeq {
    /// The `data_head` of a perf event's mapped control page.
    fn of_page(page: ControlPage) -> SwitchSeq {
        // SAFETY: `page.page` is a live mapping of at least one page; `data_head` is an aligned
        // u64 inside it.
        let at = unsafe { std::ptr::addr_of!((*page.page).data_head) }.cast::<AtomicU64>();
        SwitchSeq {
            at,
            _keep: Box::new(page),
        }
    }

    /// A counter its owner moves (simulated and fake hosts).
    pub(crate) fn of_counter(counter: Arc<AtomicU64>) -> SwitchSeq {
        SwitchSeq {
            at: Arc::as_ptr(&counter),
            _keep: Box::new(counter),
        }
    }

    #[inline]
    pub(crate) fn get(&self) -> u64 {
        // SAFETY: `at` is valid while `_keep` lives (see the type); the kernel or the counter's
        // owner updates it concurrently, hence an atomic load (a plain MOV on x86-64).
        unsafe { (*self.at).load(Ordering::Relaxed) }
    }
}

/// The first page of an event's perf mmap (`perf_event_mmap_page`), unmapped on drop.
struct ControlPage {
    page: *mut sys::bindings::perf_event_mmap_page,
    len: usize,
}

// SAFETY: the mapping belongs to this value alone; it is only read (atomic loads of a u64 the
// kernel updates), which is safe from any thread.
unsafe impl Send for ControlPage {}

impl Drop for ControlPage {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping this value made, once.
        unsafe { libc::munmap(self.page.cast(), self.len) };
    }
}

/// The real syscalls.
pub(crate) struct HostPerf {
    /// Signal sent to the opening thread on each sample-period overflow.
    pub signal: i32,
}

impl PerfSys for HostPerf {
    fn open(&mut self, req: &PerfRequest) -> io::Result<RawFd> {
        let mut attr = sys::bindings::perf_event_attr {
            size: std::mem::size_of::<sys::bindings::perf_event_attr>() as u32,
            ..Default::default()
        };
        let (type_, config) = match req.event {
            PerfEvent::TaskClock => (
                sys::bindings::PERF_TYPE_SOFTWARE,
                u64::from(sys::bindings::PERF_COUNT_SW_TASK_CLOCK),
            ),
            PerfEvent::Hardware(id) => (sys::bindings::PERF_TYPE_HARDWARE, id),
            PerfEvent::Raw(c) => (sys::bindings::PERF_TYPE_RAW, c),
            PerfEvent::SwitchRecords => {
                attr.set_context_switch(1);
                (
                    sys::bindings::PERF_TYPE_SOFTWARE,
                    u64::from(sys::bindings::PERF_COUNT_SW_DUMMY),
                )
            }
        };
        attr.type_ = type_;
        attr.config = config;
        attr.set_disabled(u64::from(req.disabled));
        attr.set_exclude_user(u64::from(req.exclude_user));
        attr.set_exclude_kernel(u64::from(req.exclude_kernel));
        attr.set_exclude_hv(1);
        attr.set_exclude_host(u64::from(req.exclude_host));
        attr.set_exclude_guest(u64::from(req.exclude_guest));
        if req.read_times {
            attr.read_format = u64::from(
                sys::bindings::PERF_FORMAT_TOTAL_TIME_ENABLED
                    | sys::bindings::PERF_FORMAT_TOTAL_TIME_RUNNING,
            );
        }
        if let Some(p) = req.sample_period {
            attr.__bindgen_anon_1.sample_period = p;
            attr.__bindgen_anon_2.wakeup_events = 1;
        }
        // SAFETY: attr is a valid, fully initialised perf_event_attr; pid 0 / cpu -1 = this thread.
        let fd = unsafe {
            sys::perf_event_open(
                &mut attr,
                0,
                -1,
                -1,
                sys::bindings::PERF_FLAG_FD_CLOEXEC as _,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        crate::seccomp::fds::note(fd, crate::seccomp::fds::FdKind::Perf);
        if req.sample_period.is_some() {
            // SAFETY: plain fcntls on the fd we just opened; f_owner_ex is initialised.
            unsafe {
                let own = FOwnerEx {
                    type_: F_OWNER_TID,
                    pid: libc::gettid(),
                };
                if libc::fcntl(fd, F_SETOWN_EX, &own as *const FOwnerEx) < 0
                    || libc::fcntl(fd, F_SETSIG, self.signal) < 0
                    || libc::fcntl(fd, libc::F_SETFL, libc::O_ASYNC | libc::O_NONBLOCK) < 0
                {
                    let e = io::Error::last_os_error();
                    libc::close(fd);
                    return Err(e);
                }
            }
        }
        Ok(fd)
    }

    fn read(&mut self, fd: RawFd) -> u64 {
        self.read_count(fd).value
    }

    fn read_count(&mut self, fd: RawFd) -> PerfCount {
        // The default read_format gives 8 bytes, with read_times 24 (value, enabled, running).
        let mut v = [0u64; 3];
        // SAFETY: reading at most 24 bytes into a [u64; 3].
        let n = unsafe { libc::read(fd, v.as_mut_ptr().cast::<libc::c_void>(), 24) };
        match n {
            24 => PerfCount {
                value: v[0],
                time_enabled: v[1],
                time_running: v[2],
            },
            8 => PerfCount {
                value: v[0],
                ..PerfCount::default()
            },
            _ => PerfCount::default(),
        }
    }

    fn close(&mut self, fd: RawFd) {
        // SAFETY: closing a perf fd we own, once.
        unsafe { libc::close(fd) };
    }

    fn set_period(&mut self, fd: RawFd, period: u64) {
        // SAFETY: PERF_EVENT_IOC_PERIOD reads one u64 through the pointer, which is valid for
        // the call. (perf_event_open_sys's wrapper takes the u64 by value, not its address.)
        unsafe {
            libc::ioctl(
                fd,
                sys::bindings::PERIOD as libc::c_ulong,
                &period as *const u64,
            )
        };
    }

    fn switch_seq(&mut self, fd: RawFd) -> io::Result<SwitchSeq> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        // The control page and one data page (the ring buffer must be 2^n pages).
        let len = 2 * page;
        // SAFETY: a fresh read-only shared mapping of the perf fd's control page and ring
        // buffer; checked for MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SwitchSeq::of_page(ControlPage {
            page: p.cast(),
            len,
        }))
    }
}
