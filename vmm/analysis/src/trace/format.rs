//! The trace file: layout, encoding, and a reader that refuses corrupt or truncated files with
//! an error that says where and what.
//!
//! All integers little-endian. A file is a header, then blocks, one per buffer a vCPU handed to
//! the writer, then one end block per vCPU:
//!
//! ```text
//! header (48 bytes + kernel path)
//!   0 magic "VPMUTRAC"        8 version u16 (1)     10 header_len u16   12 vcpus u16
//!  14 contents u16 (bit 0 exits, bit 1 samples)     16 tsc_khz u32
//!  20 sample_clock u8 (0 none, 1 cpu-switch, 2 domain-switch, 3 wall)   21..24 reserved
//!  24 start_tsc u64           32 sample_period_ns u64
//!  40 kernel_path_len u16     42..48 reserved       48 kernel path (UTF-8), the image booted
//! block header (24 bytes)
//!   0 tag "VBLK"   4 vcpu u16   6 kind u16 (1 records, 2 end)   8 count u32
//!  12 dropped u32: records this vCPU dropped (no free buffer) just before this block
//!  16 checksum u32: FNV-1a of the block's records   20 reserved u32
//! record (32 bytes), `count` of them after a records block; an end block has exactly one
//!   0 kind u8 (1 exit, 2 sample, 3 clock, 4 task, 5 exe, 6 user frames, 7 stack top, 8 mapping)
//!   1 reason u8  2 flags u8  3 cpl u8  4 detail u32
//!   8 addr u64   16 tsc_a u64   24 tsc_b u64
//! ```
//! * exit: `tsc_a` = TSC when KVM_RUN returned, `tsc_b` = TSC just before the next KVM_RUN
//!   (0: the vCPU never re-entered); `detail` = port or MSR index, `addr` = MMIO address;
//!   `flags` bit 0 = write/out, bits 1..=4 = access size in bytes.
//! * sample: `addr` = guest RIP, `cpl`, `tsc_a` = when taken; `flags` bit 0 = the overflow
//!   arrived while the VMM handled an exit, described by `reason`/`detail`/`tsc_b`=that exit's TSC;
//!   `flags` bits 5..=6 = the accounting mode the sampling counter counted in (0 none: wall
//!   clock; 1 cpu-switch; 2 domain-switch), which follows run-time mode switches.
//! * task (kind 4; follows the sample it belongs to, on the same vCPU, when the run knew the guest
//!   kernel's task layout: `profile::guest_task`): `1` status (0 resolved, else why not:
//!   `Unresolved::code`), `2` flags (bit 0 kernel thread), `3` the step that failed, `4` pid u32,
//!   `8` tgid u32, `12` CR3 >> 12 (5 bytes: the page-table root, the address space), `17` comm
//!   (15 bytes, NUL-padded; Linux's TASK_COMM_LEN 16 holds 15 and a NUL).
//! * exe (kind 5; follows the task record of a user-space sample whose task has an mm): `1`
//!   status (as task's), `2` the name's whole length, `3` the step that failed, `4` end_code -
//!   start_code u32, `8` start_code u64, `16` the executable's file name (first 16 bytes,
//!   NUL-padded).
//! * user frames (kind 6; after the exe record, as many as the stack needs): `1` how many of the
//!   three return addresses at `8`, `16`, `24` are set (1-3): the user call stack by frame
//!   pointers, innermost first (`profile::call_stack`).
//! * user stack top (kind 7; with the user frames): the words at RSP and RSP + 8, where a
//!   frameless leaf's return address is (resolved offline, `profile::user_symbols`).
//! * mapping (kind 8; after the exe record, when the RIP lies outside the executable's code and
//!   the layout describes the memory map: `profile::guest_task::maps`): `1` status (as task's), `2`
//!   the file name's length (0: anonymous memory), `3` the step that failed, `4` vm_pgoff u32,
//!   `8` vm_start u64, `16` the file's name (first 16 bytes, NUL-padded).
//! * clock: `addr` = the vCPU thread's CPU time (ns) at `tsc_a` (rate-limited; for the split of
//!   KVM_RUN time into running and halted/off-CPU).
//! * end: `tsc_a` = end TSC, `addr` = records dropped in total, `tsc_b` = thread CPU ns at the end.

pub const MAGIC: &[u8; 8] = b"VPMUTRAC";
pub const VERSION: u16 = 1;
pub(crate) const HEADER_FIXED: usize = 48;
pub const BLOCK_HEADER: usize = 24;
pub const RECORD_SIZE: usize = 32;
pub(crate) const BLOCK_TAG: &[u8; 4] = b"VBLK";
/// Largest block a reader accepts (writers use far smaller buffers).
pub(crate) const MAX_BLOCK_RECORDS: u32 = 1 << 20;
pub const CONTENTS_EXITS: u16 = 1;
pub const CONTENTS_SAMPLES: u16 = 2;

pub(crate) const BLOCK_RECORDS: u16 = 1;
pub(crate) const BLOCK_END: u16 = 2;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("not a vpmu-vmm trace file (bad magic; expected \"VPMUTRAC\")")]
    BadMagic,
    #[error("trace format version {0} is not supported (this build reads version {VERSION})")]
    Version(u16),
    #[error("truncated trace file: {what} at byte {offset} needs {need} bytes, {have} left{hint}")]
    Truncated {
        what: &'static str,
        offset: usize,
        need: usize,
        have: usize,
        hint: &'static str,
    },
    #[error("corrupt trace file at byte {offset}: {what}")]
    Corrupt { offset: usize, what: String },
    #[error("corrupt trace file at byte {offset}: {source}")]
    BadRecord { offset: usize, source: DecodeError },
    #[error("truncated trace file: no end block for vCPU {0} (the run did not close the trace; was it killed?)")]
    NoEnd(u16),
}

/// What is wrong with one record ([`Record::decode`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown record kind {0}")]
    Kind(u8),
    #[error("unknown exit reason {0}")]
    Reason(u8),
    #[error("exit re-entered (TSC {entry}) before it exited ({exit})")]
    EntryBeforeExit { exit: u64, entry: u64 },
    #[error("sample with CPL {0}")]
    Cpl(u8),
    #[error("sample with accounting mode code {0}")]
    Mode(u8),
    #[error("user frames record with {0} addresses")]
    FrameCount(u8),
    /// A task, exe or mapping record (`what`) whose status and step name no failure.
    #[error("{what} record with status {status}, step {step}")]
    Status {
        what: &'static str,
        status: u8,
        step: u8,
    },
    #[error("caller mapping record with status {0}")]
    CallerStatus(u8),
}

/// A task, exe or mapping record's failure from its status and step bytes.
fn unresolved(what: &'static str, status: u8, step: u8) -> Result<Unresolved, DecodeError> {
    Unresolved::from_code(status, step).ok_or(DecodeError::Status { what, status, step })
}

// The exit's reason and detail are the exit classification's types (one classification per
// exit, shared by this file format, the last-exits ring and the exit counts); the numbers
// `Reason` carries (`#[repr(u8)]`) are this format's encoding.
pub use crate::exit_reason::{ExitEvent, Reason};
use crate::guest_task::GuestMapping;
use crate::guest_task::{GuestExe, GuestTask, Unresolved, COMM_MAX, EXE_NAME_MAX};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    Exit {
        event: ExitEvent,
        exit_tsc: u64,
        /// 0: the vCPU never re-entered the guest after this exit.
        entry_tsc: u64,
    },
    Sample {
        rip: u64,
        cpl: u8,
        tsc: u64,
        /// The exit the VMM was handling when the overflow arrived (None: it interrupted the guest).
        during: Option<(ExitEvent, u64)>,
        /// The accounting mode the sampling counter counted in (None: wall clock).
        mode: Option<vpmu::AccountingMode>,
    },
    Clock {
        tsc: u64,
        thread_cpu_ns: u64,
    },
    /// The guest task the sample before it interrupted.
    Task {
        /// CR3 with its low 12 bits cleared.
        cr3: u64,
        task: Result<GuestTask, Unresolved>,
    },
    /// The executable of the user task the sample before it interrupted (after its task record).
    Exe(Result<GuestExe, Unresolved>),
    /// Up to three return addresses of the user stack (after the exe record; innermost first).
    CallFrames {
        count: u8,
        addrs: [u64; 3],
    },
    /// The words at the user RSP and RSP + 8 (after the exe record).
    UserStackTop([u64; 2]),
    /// The mapping a user RIP outside the executable's code lies in (after the exe record).
    Mapping(Result<GuestMapping, Unresolved>),
    /// A file mapped at one of the user stack's return addresses that neither the executable's
    /// code nor the RIP's mapping holds: a caller in another library (after the frames).
    CallerMapping(GuestMapping),
}

impl Record {
    /// Whether this record annotates the sample before it (task, exe, user stack): it has no
    /// time of its own, and per-exit or per-sample counts skip it.
    pub(crate) fn is_sample_note(&self) -> bool {
        matches!(
            self,
            Record::Task { .. }
                | Record::Exe(_)
                | Record::CallFrames { .. }
                | Record::UserStackTop(_)
                | Record::Mapping(_)
                | Record::CallerMapping(_)
        )
    }

    /// The record's time (exit, sample or clock TSC; a task record has none of its own: 0).
    pub fn tsc(&self) -> u64 {
        match *self {
            Record::Exit { exit_tsc, .. } => exit_tsc,
            Record::Sample { tsc, .. } => tsc,
            Record::Clock { tsc, .. } => tsc,
            Record::Task { .. }
            | Record::Exe(_)
            | Record::CallFrames { .. }
            | Record::UserStackTop(_)
            | Record::Mapping(_)
            | Record::CallerMapping(_) => 0,
        }
    }

    fn encode_exe(exe: &Result<GuestExe, Unresolved>, out: &mut [u8; RECORD_SIZE]) {
        out.fill(0);
        out[0] = 5;
        match exe {
            Ok(e) => {
                out[2] = e.name_len;
                out[4..8].copy_from_slice(&e.code_size.to_le_bytes());
                out[8..16].copy_from_slice(&e.start_code.to_le_bytes());
                out[16..32].copy_from_slice(&e.name);
            }
            Err(u) => (out[1], out[3]) = u.code(),
        }
    }

    fn decode_exe(b: &[u8; RECORD_SIZE]) -> Result<Record, DecodeError> {
        Ok(Record::Exe(match b[1] {
            0 => {
                let mut name = [0u8; EXE_NAME_MAX];
                name.copy_from_slice(&b[16..32]);
                Ok(GuestExe {
                    name,
                    name_len: b[2],
                    start_code: u64_at(b, 8),
                    code_size: u32_at(b, 4),
                })
            }
            s => Err(unresolved("exe", s, b[3])?),
        }))
    }

    /// Kind 8 (the RIP's mapping) or 9 (a caller's): the same fields.
    fn encode_mapping(kind: u8, m: &Result<GuestMapping, Unresolved>, out: &mut [u8; RECORD_SIZE]) {
        out.fill(0);
        out[0] = kind;
        match m {
            Ok(m) => {
                out[2] = m.name_len;
                out[4..8].copy_from_slice(&m.pgoff.to_le_bytes());
                out[8..16].copy_from_slice(&m.vm_start.to_le_bytes());
                out[16..32].copy_from_slice(&m.name);
            }
            Err(u) => (out[1], out[3]) = u.code(),
        }
    }

    fn decode_mapping(b: &[u8; RECORD_SIZE]) -> Result<Record, DecodeError> {
        Ok(Record::Mapping(match b[1] {
            0 => {
                let mut name = [0u8; EXE_NAME_MAX];
                name.copy_from_slice(&b[16..32]);
                Ok(GuestMapping {
                    name,
                    name_len: b[2],
                    vm_start: u64_at(b, 8),
                    pgoff: u32_at(b, 4),
                })
            }
            s => Err(unresolved("mapping", s, b[3])?),
        }))
    }

    fn encode_task(cr3: u64, task: &Result<GuestTask, Unresolved>, out: &mut [u8; RECORD_SIZE]) {
        out.fill(0);
        out[0] = 4;
        out[12..17].copy_from_slice(&(cr3 >> 12).to_le_bytes()[..5]);
        match task {
            Ok(t) => {
                out[2] = u8::from(t.kernel_thread);
                out[4..8].copy_from_slice(&t.pid.to_le_bytes());
                out[8..12].copy_from_slice(&t.tgid.to_le_bytes());
                out[17..32].copy_from_slice(&t.comm);
            }
            Err(u) => (out[1], out[3]) = u.code(),
        }
    }

    fn decode_task(b: &[u8; RECORD_SIZE]) -> Result<Record, DecodeError> {
        let mut pfn = [0u8; 8];
        pfn[..5].copy_from_slice(&b[12..17]);
        let cr3 = u64::from_le_bytes(pfn) << 12;
        let task = match b[1] {
            0 => {
                let mut comm = [0u8; COMM_MAX];
                comm.copy_from_slice(&b[17..32]);
                Ok(GuestTask {
                    pid: u32_at(b, 4),
                    tgid: u32_at(b, 8),
                    comm,
                    kernel_thread: b[2] & 1 == 1,
                })
            }
            s => Err(unresolved("task", s, b[3])?),
        };
        Ok(Record::Task { cr3, task })
    }

    pub fn encode(&self, out: &mut [u8; RECORD_SIZE]) {
        let (kind, ev, cpl, addr, a, b) = match *self {
            Record::Task { cr3, ref task } => return Self::encode_task(cr3, task, out),
            Record::Exe(ref exe) => return Self::encode_exe(exe, out),
            Record::Mapping(ref m) => return Self::encode_mapping(8, m, out),
            Record::CallerMapping(m) => return Self::encode_mapping(9, &Ok(m), out),
            Record::UserStackTop(words) => {
                out.fill(0);
                out[0] = 7;
                out[8..16].copy_from_slice(&words[0].to_le_bytes());
                out[16..24].copy_from_slice(&words[1].to_le_bytes());
                return;
            }
            Record::CallFrames { count, addrs } => {
                out.fill(0);
                out[0] = 6;
                out[1] = count;
                for (i, a) in addrs.iter().enumerate() {
                    out[8 + 8 * i..16 + 8 * i].copy_from_slice(&a.to_le_bytes());
                }
                return;
            }
            Record::Exit {
                event,
                exit_tsc,
                entry_tsc,
            } => (1u8, event, 0u8, event.addr, exit_tsc, entry_tsc),
            Record::Sample {
                rip,
                cpl,
                tsc,
                during,
                mode,
            } => {
                let (mut ev, at) = match during {
                    Some((e, at)) => (
                        ExitEvent {
                            flags: 1,
                            addr: 0,
                            ..e
                        },
                        at,
                    ),
                    None => (ExitEvent::new(Reason::Interrupted), 0),
                };
                ev.flags |= encode_mode(mode) << 5;
                (2, ev, cpl, rip, tsc, at)
            }
            Record::Clock { tsc, thread_cpu_ns } => {
                (3, ExitEvent::new(Reason::Other), 0, thread_cpu_ns, tsc, 0)
            }
        };
        out[0] = kind;
        out[1] = ev.reason as u8;
        out[2] = ev.flags;
        out[3] = cpl;
        out[4..8].copy_from_slice(&ev.detail.to_le_bytes());
        out[8..16].copy_from_slice(&addr.to_le_bytes());
        out[16..24].copy_from_slice(&a.to_le_bytes());
        out[24..32].copy_from_slice(&b.to_le_bytes());
    }

    /// Decodes one record; `Err` says what is wrong with it.
    pub fn decode(b: &[u8; RECORD_SIZE]) -> Result<Record, DecodeError> {
        match b[0] {
            4 => return Self::decode_task(b),
            5 => return Self::decode_exe(b),
            8 => return Self::decode_mapping(b),
            9 => {
                return match Self::decode_mapping(b)? {
                    Record::Mapping(Ok(m)) => Ok(Record::CallerMapping(m)),
                    _ => Err(DecodeError::CallerStatus(b[1])),
                }
            }
            7 => return Ok(Record::UserStackTop([u64_at(b, 8), u64_at(b, 16)])),
            6 => {
                if !(1..=3).contains(&b[1]) {
                    return Err(DecodeError::FrameCount(b[1]));
                }
                return Ok(Record::CallFrames {
                    count: b[1],
                    addrs: [u64_at(b, 8), u64_at(b, 16), u64_at(b, 24)],
                });
            }
            _ => {}
        }
        let detail = u32_at(b, 4);
        let addr = u64_at(b, 8);
        let a = u64_at(b, 16);
        let c = u64_at(b, 24);
        let reason = Reason::from_u8(b[1]).ok_or(DecodeError::Reason(b[1]))?;
        match b[0] {
            1 => {
                if c != 0 && c < a {
                    return Err(DecodeError::EntryBeforeExit { exit: a, entry: c });
                }
                Ok(Record::Exit {
                    event: ExitEvent {
                        reason,
                        detail,
                        addr,
                        flags: b[2],
                    },
                    exit_tsc: a,
                    entry_tsc: c,
                })
            }
            2 => {
                if b[3] > 3 {
                    return Err(DecodeError::Cpl(b[3]));
                }
                let during = (b[2] & 1 == 1).then_some((
                    ExitEvent {
                        reason,
                        detail,
                        addr: 0,
                        flags: 0,
                    },
                    c,
                ));
                let mode = decode_mode((b[2] >> 5) & 3)?;
                Ok(Record::Sample {
                    rip: addr,
                    cpl: b[3],
                    tsc: a,
                    during,
                    mode,
                })
            }
            3 => Ok(Record::Clock {
                tsc: a,
                thread_cpu_ns: addr,
            }),
            k => Err(DecodeError::Kind(k)),
        }
    }
}

fn encode_mode(mode: Option<vpmu::AccountingMode>) -> u8 {
    match mode {
        None => 0,
        Some(vpmu::AccountingMode::CpuSwitch) => 1,
        Some(vpmu::AccountingMode::DomainSwitch) => 2,
    }
}

fn decode_mode(bits: u8) -> Result<Option<vpmu::AccountingMode>, DecodeError> {
    match bits {
        0 => Ok(None),
        1 => Ok(Some(vpmu::AccountingMode::CpuSwitch)),
        2 => Ok(Some(vpmu::AccountingMode::DomainSwitch)),
        b => Err(DecodeError::Mode(b)),
    }
}

pub(super) fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
}
pub(super) fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
pub(super) fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// How profile samples were triggered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleClock {
    None,
    /// The VMM's cycles counter, counting only inside KVM_RUN.
    CpuSwitch,
    /// The VMM's cycles counter, counting all the vCPU thread's time (exit handling included).
    DomainSwitch,
    /// Wall-clock timer.
    Wall,
}

impl SampleClock {
    fn code(self) -> u8 {
        match self {
            SampleClock::None => 0,
            SampleClock::CpuSwitch => 1,
            SampleClock::DomainSwitch => 2,
            SampleClock::Wall => 3,
        }
    }
    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => SampleClock::None,
            1 => SampleClock::CpuSwitch,
            2 => SampleClock::DomainSwitch,
            3 => SampleClock::Wall,
            _ => return None,
        })
    }
    pub fn describe(self) -> &'static str {
        match self {
            SampleClock::None => "none",
            SampleClock::CpuSwitch => "cycles counter, cpu-switch (guest time only)",
            SampleClock::DomainSwitch => {
                "cycles counter, domain-switch (guest time + VMM work for the guest)"
            }
            SampleClock::Wall => "wall-clock timer",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub vcpus: u16,
    pub contents: u16,
    pub tsc_khz: u32,
    pub start_tsc: u64,
    pub sample_clock: SampleClock,
    pub sample_period_ns: u64,
    /// The kernel image the VMM booted (empty for flat tiny guests).
    pub kernel: String,
}

impl Header {
    /// A header for hand-made traces (unit tests here and in the VMM's crate): 1 vCPU, 1 MHz
    /// TSC from 0, 1 ms samples of a domain-switch clock.
    pub fn for_tests(contents: u16) -> Header {
        Header {
            vcpus: 1,
            contents,
            tsc_khz: 1000,
            start_tsc: 0,
            sample_clock: SampleClock::DomainSwitch,
            sample_period_ns: 1_000_000,
            kernel: String::new(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let path = self.kernel.as_bytes();
        let path = &path[..path.len().min(u16::MAX as usize - HEADER_FIXED)];
        let mut h = vec![0u8; HEADER_FIXED];
        h[0..8].copy_from_slice(MAGIC);
        h[8..10].copy_from_slice(&VERSION.to_le_bytes());
        h[10..12].copy_from_slice(&((HEADER_FIXED + path.len()) as u16).to_le_bytes());
        h[12..14].copy_from_slice(&self.vcpus.to_le_bytes());
        h[14..16].copy_from_slice(&self.contents.to_le_bytes());
        h[16..20].copy_from_slice(&self.tsc_khz.to_le_bytes());
        h[20] = self.sample_clock.code();
        h[24..32].copy_from_slice(&self.start_tsc.to_le_bytes());
        h[32..40].copy_from_slice(&self.sample_period_ns.to_le_bytes());
        h[40..42].copy_from_slice(&(path.len() as u16).to_le_bytes());
        h.extend_from_slice(path);
        h
    }

    pub fn decode(b: &[u8]) -> Result<(Header, usize), FormatError> {
        if b.len() < 8 || &b[..8] != MAGIC {
            return Err(if b.len() < 8 && MAGIC.starts_with(b) {
                truncated("header", 0, HEADER_FIXED, b.len())
            } else {
                FormatError::BadMagic
            });
        }
        need(b, 0, HEADER_FIXED, "header")?;
        let version = u16_at(b, 8);
        if version != VERSION {
            return Err(FormatError::Version(version));
        }
        let len = usize::from(u16_at(b, 10));
        let path_len = usize::from(u16_at(b, 40));
        if len != HEADER_FIXED + path_len {
            return Err(corrupt(
                10,
                format!("header length {len} does not match its kernel path length {path_len}"),
            ));
        }
        need(b, 0, len, "header")?;
        let vcpus = u16_at(b, 12);
        if vcpus == 0 {
            return Err(corrupt(12, "0 vCPUs".into()));
        }
        let tsc_khz = u32_at(b, 16);
        if tsc_khz == 0 {
            return Err(corrupt(16, "TSC frequency 0 kHz".into()));
        }
        let sample_clock = SampleClock::from_code(b[20])
            .ok_or_else(|| corrupt(20, format!("unknown sample clock {}", b[20])))?;
        let kernel = String::from_utf8(b[HEADER_FIXED..len].to_vec())
            .map_err(|_| corrupt(HEADER_FIXED, "kernel path is not UTF-8".into()))?;
        Ok((
            Header {
                vcpus,
                contents: u16_at(b, 14),
                tsc_khz,
                start_tsc: u64_at(b, 24),
                sample_clock,
                sample_period_ns: u64_at(b, 32),
                kernel,
            },
            len,
        ))
    }

    /// TSC ticks -> seconds.
    pub fn secs(&self, ticks: u64) -> f64 {
        ticks as f64 / (f64::from(self.tsc_khz) * 1e3)
    }
}

/// 32-bit FNV-1a: catches damaged record bytes that would still decode.
pub fn checksum(body: &[u8]) -> u32 {
    body.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Encodes a block header for `body` (its `count` records).
pub fn block_header(
    vcpu: u16,
    end: bool,
    count: u32,
    dropped: u32,
    body: &[u8],
) -> [u8; BLOCK_HEADER] {
    let mut h = [0u8; BLOCK_HEADER];
    h[16..20].copy_from_slice(&checksum(body).to_le_bytes());
    h[0..4].copy_from_slice(BLOCK_TAG);
    h[4..6].copy_from_slice(&vcpu.to_le_bytes());
    h[6..8].copy_from_slice(&(if end { BLOCK_END } else { BLOCK_RECORDS }).to_le_bytes());
    h[8..12].copy_from_slice(&count.to_le_bytes());
    h[12..16].copy_from_slice(&dropped.to_le_bytes());
    h
}

/// The end block's one record.
pub fn end_record(end_tsc: u64, dropped_total: u64, thread_cpu_ns: u64) -> [u8; RECORD_SIZE] {
    let mut r = [0u8; RECORD_SIZE];
    r[0] = 4;
    r[8..16].copy_from_slice(&dropped_total.to_le_bytes());
    r[16..24].copy_from_slice(&end_tsc.to_le_bytes());
    r[24..32].copy_from_slice(&thread_cpu_ns.to_le_bytes());
    r
}

/// One vCPU's part of a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VcpuTrace {
    pub records: Vec<Record>,
    /// Records dropped because the writer fell behind (no free buffer).
    pub dropped: u64,
    pub end_tsc: u64,
    pub end_thread_cpu_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
/// A whole trace in memory (`Trace::read_file`, `Trace::parse`: `super::read`).
pub struct Trace {
    pub header: Header,
    pub vcpus: Vec<VcpuTrace>,
}

fn need(b: &[u8], off: usize, len: usize, what: &'static str) -> Result<(), FormatError> {
    let have = b.len().saturating_sub(off);
    if have < len {
        return Err(truncated(what, off, len, have));
    }
    Ok(())
}

pub(super) fn truncated(
    what: &'static str,
    offset: usize,
    need: usize,
    have: usize,
) -> FormatError {
    FormatError::Truncated {
        what,
        offset,
        need,
        have,
        hint: " (the file was cut short: disk full, copy interrupted, or the run was killed)",
    }
}

pub(super) fn corrupt(offset: usize, what: String) -> FormatError {
    FormatError::Corrupt { offset, what }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            vcpus: 2,
            contents: CONTENTS_EXITS | CONTENTS_SAMPLES,
            tsc_khz: 2_600_000,
            start_tsc: 1000,
            sample_clock: SampleClock::CpuSwitch,
            sample_period_ns: 1_000_000,
            kernel: "/k/bzImage".into(),
        }
    }

    fn records() -> Vec<Record> {
        vec![
            Record::Exit {
                event: ExitEvent {
                    reason: Reason::IoOut,
                    detail: 0x2f8,
                    addr: 0,
                    flags: 1 | (1 << 1),
                },
                exit_tsc: 2000,
                entry_tsc: 2100,
            },
            Record::Exit {
                event: ExitEvent {
                    reason: Reason::MmioWrite,
                    detail: 0,
                    addr: 0xfee0_00b0,
                    flags: 1 | (4 << 1),
                },
                exit_tsc: 2200,
                entry_tsc: 0,
            },
            Record::Sample {
                rip: 0xffff_ffff_8100_0000,
                cpl: 0,
                tsc: 2150,
                during: Some((
                    ExitEvent {
                        reason: Reason::MsrRead,
                        detail: 0xc001_0004,
                        addr: 0,
                        flags: 0,
                    },
                    2140,
                )),
                mode: Some(vpmu::AccountingMode::CpuSwitch),
            },
            Record::Sample {
                rip: 0x40_1000,
                cpl: 3,
                tsc: 2160,
                during: None,
                mode: None,
            },
            Record::Task {
                // The largest page-table root 52 physical address bits allow.
                cr3: 0x000f_ffff_ffff_f000,
                task: Ok(GuestTask {
                    pid: 4_194_304,
                    tgid: 77,
                    comm: *b"fifteen_chars_x",
                    kernel_thread: true,
                }),
            },
            Record::Exe(Ok(GuestExe {
                name: *b"a_long_program_n",
                name_len: 40,
                start_code: 0x5555_5555_4000,
                code_size: 0x1234,
            })),
            Record::CallFrames {
                count: 2,
                addrs: [0x40_1234, 0x40_2000, 0],
            },
            Record::UserStackTop([0x40_1111, 0x7ffc_0000_0010]),
            Record::Mapping(Ok(GuestMapping {
                name: *b"libc.so.6\0\0\0\0\0\0\0",
                name_len: 9,
                vm_start: 0x7f00_0000_1000,
                pgoff: 0x26,
            })),
            Record::Mapping(Err(Unresolved::BadValue(crate::guest_task::Step::Mapping))),
            Record::CallerMapping(GuestMapping {
                name: *b"libstdc++.so.6.0",
                name_len: 19,
                vm_start: 0x7f00_1000_0000,
                pgoff: 0x9a,
            }),
            Record::Exe(Err(Unresolved::NotMapped(
                crate::guest_task::Step::Executable,
            ))),
            Record::Task {
                cr3: 0x1234_5000,
                task: Err(Unresolved::BadPointer(crate::guest_task::Step::CurrentTask)),
            },
            Record::Clock {
                tsc: 2170,
                thread_cpu_ns: 12345,
            },
        ]
    }

    /// A well-formed two-vCPU file: records for vCPU 0, and both end blocks.
    fn file() -> Vec<u8> {
        let mut f = header().encode();
        let recs = records();
        let mut body = Vec::new();
        for r in &recs {
            let mut b = [0u8; RECORD_SIZE];
            r.encode(&mut b);
            body.extend_from_slice(&b);
        }
        f.extend_from_slice(&block_header(0, false, recs.len() as u32, 3, &body));
        f.extend_from_slice(&body);
        for v in 0..2 {
            let end = end_record(5000, 3 * u64::from(1 - v), 42);
            f.extend_from_slice(&block_header(v, true, 1, 0, &end));
            f.extend_from_slice(&end);
        }
        f
    }

    #[test]
    fn round_trip() {
        let t = Trace::parse(&file()).unwrap();
        assert_eq!(t.header, header());
        assert_eq!(t.vcpus[0].records, records());
        assert_eq!(t.vcpus[0].dropped, 3);
        assert_eq!(t.vcpus[1].records, vec![]);
        assert_eq!(super::super::read::Records::end_tsc(&t), 5000);
        assert_eq!(t.vcpus[1].end_thread_cpu_ns, 42);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let f = file();
        for cut in 0..f.len() {
            let err = Trace::parse(&f[..cut]).expect_err("a cut file must not parse");
            let msg = err.to_string();
            assert!(
                msg.contains("truncated"),
                "cut at {cut} of {}: unexpected error {msg}",
                f.len()
            );
        }
    }

    #[test]
    fn corrupt_files_give_clear_errors() {
        let f = file();
        let h = HEADER_FIXED + "/k/bzImage".len();
        let mut bad = f.clone();
        bad[0] = b'X';
        assert!(matches!(Trace::parse(&bad), Err(FormatError::BadMagic)));
        let mut bad = f.clone();
        bad[8] = 9;
        assert!(matches!(Trace::parse(&bad), Err(FormatError::Version(9))));
        let cases: [(usize, u8, &str); 6] = [
            (h, b'Z', "block tag"),
            (h + 4, 7, "vCPU 7"),
            (h + 6, 9, "unknown block kind"),
            (h + 16, 0x5a, "checksum mismatch"),
            // A damaged TSC decodes fine; the checksum catches it.
            (h + BLOCK_HEADER + 20, 0x77, "checksum mismatch"),
            (f.len() - 3, 0x77, "checksum mismatch"),
        ];
        for (at, v, want) in cases {
            let mut bad = f.clone();
            bad[at] = v;
            let msg = Trace::parse(&bad).unwrap_err().to_string();
            assert!(msg.contains(want), "byte {at}: {msg}");
            assert!(msg.contains("corrupt"), "byte {at}: {msg}");
        }
        // Garbage, and random bytes after a good header, never panic.
        let mut seed = 0x1234_5678_u64;
        for len in [0, 7, 47, 100, 1000] {
            let mut g = header().encode();
            for _ in 0..len {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                g.push((seed >> 33) as u8);
            }
            assert!(Trace::parse(&g).is_err());
        }
    }

    #[test]
    fn bad_records_are_refused() {
        let mut b = [0u8; RECORD_SIZE];
        records()[2].encode(&mut b);
        let cases: [(usize, u8, &str); 3] = [
            (0, 10, "unknown record kind"),
            (1, 99, "unknown exit reason"),
            (3, 5, "CPL 5"),
        ];
        for (at, v, want) in cases {
            let mut bad = b;
            bad[at] = v;
            let e = Record::decode(&bad).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let mut back = [0u8; RECORD_SIZE];
        records()[0].encode(&mut back);
        back[24..32].copy_from_slice(&1u64.to_le_bytes());
        assert_eq!(
            Record::decode(&back),
            Err(DecodeError::EntryBeforeExit {
                exit: 2000,
                entry: 1
            })
        );
    }

    #[test]
    fn missing_end_block_is_reported_as_truncation() {
        let f = file();
        let cut = f.len() - BLOCK_HEADER - RECORD_SIZE;
        let e = Trace::parse(&f[..cut]).unwrap_err();
        assert!(matches!(e, FormatError::NoEnd(1)), "{e}");
        assert!(e.to_string().contains("truncated"));
    }

    #[test]
    fn describe_names_the_detail() {
        let mut e = ExitEvent::new(Reason::IoOut);
        e.detail = 0x2f8;
        e.flags = 1 | (1 << 1);
        assert_eq!(e.describe(), "pio 0x2f8 out 1");
        e.reason = Reason::MsrRead;
        e.detail = 0xc001_0004;
        assert_eq!(e.describe(), "msr 0xc0010004 rd");
        assert_eq!(ExitEvent::new(Reason::Hlt).describe(), "hlt");
        for r in Reason::ALL {
            assert_eq!(Reason::from_u8(r as u8), Some(r));
        }
        assert_eq!(Reason::from_u8(0), None);
        assert_eq!(Reason::from_u8(17), None);
    }
}
