//! The guest task, executable and mapping a host-side sample found, as a trace record keeps
//! them, and why a sample found none ([`Unresolved`]). The VMM reads them from guest memory
//! (`runtime::profile::guest_task`); the readers here know them only as data.

/// The most comm bytes a task record keeps (TASK_COMM_LEN 16 includes the NUL).
pub const COMM_MAX: usize = 15;

/// A guest task as a sample found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestTask {
    pub pid: u32,
    pub tgid: u32,
    /// NUL-padded.
    pub comm: [u8; COMM_MAX],
    pub kernel_thread: bool,
}

impl GuestTask {
    pub fn comm(&self) -> String {
        let end = self.comm.iter().position(|&b| b == 0).unwrap_or(COMM_MAX);
        String::from_utf8_lossy(&self.comm[..end]).into_owned()
    }

    /// `comm[tgid]`, as the reports show a process (control characters escaped).
    pub fn label(&self) -> String {
        format!("{}[{}]", printable(&self.comm()), self.tgid)
    }
}

/// A name the guest chose (a process's comm, a file's name), as text output shows it: control
/// characters (a terminal's escape sequences, line breaks) written as `\u{..}` escapes, so a
/// name cannot rewrite the reader's terminal or split a report line. Bytes that were not
/// UTF-8 are already U+FFFD (the names are read with `from_utf8_lossy`).
pub fn printable(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}

/// The most executable-name bytes an exe record keeps.
pub const EXE_NAME_MAX: usize = 16;

/// A file's name as a record keeps it: its first [`EXE_NAME_MAX`] bytes (NUL-padded) and its
/// whole length.
pub type FileName = ([u8; EXE_NAME_MAX], u8);

/// The executable a user-space sample ran in: its file name (the dentry's, not the path) and
/// where its code was loaded (`mm->start_code`, `end_code`: the executable's PF_X segments,
/// with the load bias of a PIE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestExe {
    /// NUL-padded; the first [`EXE_NAME_MAX`] bytes of the name.
    pub name: [u8; EXE_NAME_MAX],
    /// The name's whole length (longer than [`EXE_NAME_MAX`]: truncated).
    pub name_len: u8,
    pub start_code: u64,
    /// end_code - start_code (saturated to u32).
    pub code_size: u32,
}

impl GuestExe {
    pub fn name(&self) -> String {
        let n = usize::from(self.name_len).min(EXE_NAME_MAX);
        String::from_utf8_lossy(&self.name[..n]).into_owned()
    }

    pub fn truncated(&self) -> bool {
        usize::from(self.name_len) > EXE_NAME_MAX
    }
}

/// Which read of the chain failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    Banner = 1,
    PerCpuOffset = 2,
    CurrentTask = 3,
    TaskFields = 4,
    /// task->mm and the executable behind it.
    Executable = 5,
    /// The mapping (VMA, its file) a user RIP outside the executable lies in.
    Mapping = 6,
}

/// Why a sample names no task (the trace's task record carries it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unresolved {
    /// The guest memory at `linux_banner` does not hold the layout's banner (yet: the kernel
    /// may not run yet; or the guest runs another kernel).
    NotThisKernel,
    /// A virtual address of the chain is not mapped, or maps outside guest RAM.
    NotMapped(Step),
    /// A pointer is not a canonical kernel address (or is misaligned).
    BadPointer(Step),
    /// A value is out of range (pid, tgid, comm not text).
    BadValue(Step),
    /// The vCPU's number is beyond the kernel's NR_CPUS.
    CpuBeyondNrCpus,
}

impl Unresolved {
    /// (status, step) bytes of the task record; status 0 is "resolved".
    pub fn code(self) -> (u8, u8) {
        match self {
            Unresolved::NotThisKernel => (1, Step::Banner as u8),
            Unresolved::NotMapped(s) => (2, s as u8),
            Unresolved::BadPointer(s) => (3, s as u8),
            Unresolved::BadValue(s) => (4, s as u8),
            Unresolved::CpuBeyondNrCpus => (5, Step::PerCpuOffset as u8),
        }
    }

    pub fn from_code(status: u8, step: u8) -> Option<Unresolved> {
        let step = match step {
            1 => Step::Banner,
            2 => Step::PerCpuOffset,
            3 => Step::CurrentTask,
            4 => Step::TaskFields,
            5 => Step::Executable,
            6 => Step::Mapping,
            _ => return None,
        };
        Some(match status {
            1 => Unresolved::NotThisKernel,
            2 => Unresolved::NotMapped(step),
            3 => Unresolved::BadPointer(step),
            4 => Unresolved::BadValue(step),
            5 => Unresolved::CpuBeyondNrCpus,
            _ => return None,
        })
    }

    /// A short reason for the reports.
    pub fn describe(self) -> String {
        let step = |s: Step| match s {
            Step::Banner => "linux_banner",
            Step::PerCpuOffset => "__per_cpu_offset[cpu]",
            Step::CurrentTask => "current_task",
            Step::TaskFields => "the task's pid/tgid/comm",
            Step::Executable => "the task's executable (mm, exe_file)",
            Step::Mapping => "the mapping at the RIP (mm_mt, VMA, vm_file)",
        };
        match self {
            Unresolved::NotThisKernel => "kernel not verified (banner differs)".into(),
            Unresolved::NotMapped(s) => format!("{} not mapped", step(s)),
            Unresolved::BadPointer(s) => format!("{} not a kernel pointer", step(s)),
            Unresolved::BadValue(s) => format!("{} out of range", step(s)),
            Unresolved::CpuBeyondNrCpus => "vCPU beyond the kernel's NR_CPUS".into(),
        }
    }
}

/// The mapping a user-space RIP lies in: the VMA's start and file offset (in pages) and its
/// file's name (first [`EXE_NAME_MAX`] bytes and its length; length 0: anonymous memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestMapping {
    pub name: [u8; EXE_NAME_MAX],
    pub name_len: u8,
    pub vm_start: u64,
    /// vm_pgoff (saturated to u32: 16 TiB into a file).
    pub pgoff: u32,
}

impl GuestMapping {
    pub fn anonymous(&self) -> bool {
        self.name_len == 0
    }
    pub fn name(&self) -> String {
        let n = usize::from(self.name_len).min(EXE_NAME_MAX);
        String::from_utf8_lossy(&self.name[..n]).into_owned()
    }
    pub fn truncated(&self) -> bool {
        usize::from(self.name_len) > EXE_NAME_MAX
    }
    /// The offset in the file of user address `rip`.
    pub fn file_offset(&self, rip: u64) -> u64 {
        rip.wrapping_sub(self.vm_start)
            .wrapping_add(u64::from(self.pgoff) << 12)
    }
}
