//! Which guest task a host-side sample interrupted: pid, tgid and comm read from guest memory
//! at sample time (issue 19, "who was running"), so a passive profile can name the guest process
//! instead of one `[guest user space]` row.
//!
//! Linux 6.1 keeps the running task in the per-CPU variable `current_task`; CPU `n`'s per-CPU
//! area starts at `__per_cpu_offset[n]`. So, for vCPU `n` (the guest numbers its CPUs in the
//! MADT's order, which is the VMM's vCPU order):
//!
//! ```text
//! task = *(u64 *)(__per_cpu_offset[n] + &current_task)
//! pid = task->pid, tgid = task->tgid, comm = task->comm, kernel thread = task->flags & PF_KTHREAD
//! ```
//!
//! The symbol addresses and struct offsets come from a [`TaskLayout`] file made when the kernel
//! was built (`guest-image/build.sh default-kernel` writes `task-layout` beside the bzImage:
//! `guest-image/kernel/task-layout.c`), not from one kernel build's numbers in this code. The
//! layout names the kernel's banner; samples are resolved only after the banner was read at
//! `linux_banner` in guest memory, so a layout never applies to another kernel (and nothing is
//! read while the bzImage's decompressor still runs).
//!
//! The guest is not trusted: every read goes through the vCPU access layer's bounded page walk,
//! every pointer must be a canonical kernel address, every value is range-checked, and a sample
//! that fails any check is recorded as [`Unresolved`] with the reason. There is no loop over
//! guest data (a fixed number of reads per sample).

use std::path::{Path, PathBuf};

use crate::kvm_error::AccessError;
use crate::vcpu::access::VcpuAccess;

/// The file name `build.sh` gives the layout, beside the kernel image.
pub const LAYOUT_FILE: &str = "task-layout";
/// Linux's PID_MAX_LIMIT on 64-bit: no pid or tgid is larger.
const PID_MAX_LIMIT: u32 = 4 * 1024 * 1024;
/// The most comm bytes a task record keeps (TASK_COMM_LEN 16 includes the NUL).
pub const COMM_MAX: usize = 15;
/// Longest banner a layout may name (Linux's are ~150 bytes).
const BANNER_MAX: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("cannot read the task layout {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("task layout line {line}: {what}")]
    Bad { line: usize, what: String },
    #[error("task layout: no {0} (a file from an older guest-image/build.sh?)")]
    Missing(&'static str),
}

/// What the VMM needs to know of a guest kernel to name the running task (module comment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskLayout {
    pub banner: String,
    pub linux_banner: u64,
    pub per_cpu_offset: u64,
    pub current_task: u64,
    pub nr_cpus: u64,
    pub task_pid: u64,
    pub task_tgid: u64,
    pub task_comm: u64,
    pub task_flags: u64,
    pub task_size: u64,
    pub pf_kthread: u64,
}

impl TaskLayout {
    /// Parses `banner TEXT`, `symbol NAME 0xADDR` and `value NAME NUMBER` lines (`#` comments);
    /// names this VMM does not use are ignored.
    pub fn parse(text: &str) -> Result<TaskLayout, LayoutError> {
        let mut banner = None;
        let mut get: std::collections::HashMap<String, u64> = Default::default();
        for (i, line) in text.lines().enumerate() {
            let bad = |what: String| LayoutError::Bad { line: i + 1, what };
            let line = line.trim_end();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
            match word {
                "banner" => {
                    if rest.is_empty() || rest.len() > BANNER_MAX {
                        return Err(bad(format!(
                            "a banner of 1 to {BANNER_MAX} bytes, not {}",
                            rest.len()
                        )));
                    }
                    banner = Some(rest.to_string());
                }
                "symbol" | "value" => {
                    let mut f = rest.split_whitespace();
                    let (Some(name), Some(num), None) = (f.next(), f.next(), f.next()) else {
                        return Err(bad(format!("expected `{word} NAME NUMBER`, got {line:?}")));
                    };
                    let parsed = match num.strip_prefix("0x") {
                        Some(hex) => u64::from_str_radix(hex, 16),
                        None => num.parse::<u64>(),
                    };
                    let n = parsed.map_err(|e| bad(format!("{num:?} is not a number: {e}")))?;
                    get.insert(name.to_string(), n);
                }
                other => return Err(bad(format!("unknown line kind {other:?}"))),
            }
        }
        let need = |name: &'static str| get.get(name).copied().ok_or(LayoutError::Missing(name));
        let layout = TaskLayout {
            banner: banner.ok_or(LayoutError::Missing("banner"))?,
            linux_banner: need("linux_banner")?,
            per_cpu_offset: need("__per_cpu_offset")?,
            current_task: need("current_task")?,
            nr_cpus: need("nr_cpus")?,
            task_pid: need("task_struct_pid")?,
            task_tgid: need("task_struct_tgid")?,
            task_comm: need("task_struct_comm")?,
            task_flags: need("task_struct_flags")?,
            task_size: need("task_struct_size")?,
            pf_kthread: need("pf_kthread")?,
        };
        let fields = [
            layout.task_pid + 4,
            layout.task_tgid + 4,
            layout.task_comm + COMM_MAX as u64,
            layout.task_flags + 4,
        ];
        if layout.task_size > 1 << 16 || fields.iter().any(|&end| end > layout.task_size) {
            return Err(LayoutError::Bad {
                line: 0,
                what: format!(
                    "a field lies outside task_struct ({} bytes)",
                    layout.task_size
                ),
            });
        }
        if layout.nr_cpus == 0 || layout.nr_cpus > 8192 {
            return Err(LayoutError::Bad {
                line: 0,
                what: format!("nr_cpus {} is not 1..=8192", layout.nr_cpus),
            });
        }
        Ok(layout)
    }

    pub fn load(path: &Path) -> Result<TaskLayout, LayoutError> {
        let text = std::fs::read_to_string(path).map_err(|source| LayoutError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        TaskLayout::parse(&text)
    }

    /// `task-layout` beside `kernel`, if there is one.
    pub fn beside(kernel: &Path) -> Option<PathBuf> {
        let p = kernel.canonicalize().ok()?.parent()?.join(LAYOUT_FILE);
        p.is_file().then_some(p)
    }
}

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

    /// `comm[tgid]`, as the reports show a process.
    pub fn label(&self) -> String {
        format!("{}[{}]", self.comm(), self.tgid)
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

/// Guest-virtual reads, as the vCPU access layer does them (a trait so tests can serve them from
/// a map).
pub trait GuestRead {
    fn read_virt(&mut self, gva: u64, buf: &mut [u8]) -> Result<(), AccessError>;
}

impl<T: VcpuAccess + ?Sized> GuestRead for T {
    fn read_virt(&mut self, gva: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        VcpuAccess::read_virt(self, gva, buf)
    }
}

/// One vCPU's task reader: the layout, the vCPU's number, and whether the kernel was verified.
pub struct TaskReader {
    layout: std::sync::Arc<TaskLayout>,
    cpu: u64,
    verified: bool,
}

/// The x86-64 kernel half: canonical addresses from here up.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

fn kernel_pointer(p: u64, align: u64) -> bool {
    p >= KERNEL_HALF && p.is_multiple_of(align)
}

impl TaskReader {
    pub fn new(layout: std::sync::Arc<TaskLayout>, cpu: u32) -> TaskReader {
        TaskReader {
            layout,
            cpu: u64::from(cpu),
            verified: false,
        }
    }

    /// The task running on this vCPU now (see the module comment for the chain).
    pub fn current<M: GuestRead + ?Sized>(&mut self, mem: &mut M) -> Result<GuestTask, Unresolved> {
        let l = &*self.layout;
        if !self.verified {
            let mut b = vec![0u8; l.banner.len()];
            mem.read_virt(l.linux_banner, &mut b)
                .map_err(|_| Unresolved::NotThisKernel)?;
            if b != l.banner.as_bytes() {
                return Err(Unresolved::NotThisKernel);
            }
            self.verified = true;
        }
        if self.cpu >= l.nr_cpus {
            return Err(Unresolved::CpuBeyondNrCpus);
        }
        let pcpu = read_u64(mem, l.per_cpu_offset + 8 * self.cpu, Step::PerCpuOffset)?;
        // A per-CPU offset is added to the per-CPU symbol's value: with
        // KALLSYMS_ABSOLUTE_PERCPU the symbol is an offset, the area a kernel address.
        let slot = pcpu.wrapping_add(l.current_task);
        if !kernel_pointer(slot, 8) {
            return Err(Unresolved::BadPointer(Step::PerCpuOffset));
        }
        let task = read_u64(mem, slot, Step::CurrentTask)?;
        if !kernel_pointer(task, 8) || task.checked_add(l.task_size).is_none() {
            return Err(Unresolved::BadPointer(Step::CurrentTask));
        }
        let pid = read_u32(mem, task + l.task_pid)?;
        let tgid = read_u32(mem, task + l.task_tgid)?;
        let flags = read_u32(mem, task + l.task_flags)?;
        let mut comm = [0u8; COMM_MAX];
        mem.read_virt(task + l.task_comm, &mut comm)
            .map_err(|_| Unresolved::NotMapped(Step::TaskFields))?;
        if pid > PID_MAX_LIMIT || tgid > PID_MAX_LIMIT || !comm_is_text(&comm) {
            return Err(Unresolved::BadValue(Step::TaskFields));
        }
        Ok(GuestTask {
            pid,
            tgid,
            comm,
            kernel_thread: u64::from(flags) & l.pf_kthread != 0,
        })
    }
}

fn read_u64<M: GuestRead + ?Sized>(mem: &mut M, gva: u64, step: Step) -> Result<u64, Unresolved> {
    let mut b = [0u8; 8];
    mem.read_virt(gva, &mut b)
        .map_err(|_| Unresolved::NotMapped(step))?;
    Ok(u64::from_le_bytes(b))
}

fn read_u32<M: GuestRead + ?Sized>(mem: &mut M, gva: u64) -> Result<u32, Unresolved> {
    let mut b = [0u8; 4];
    mem.read_virt(gva, &mut b)
        .map_err(|_| Unresolved::NotMapped(Step::TaskFields))?;
    Ok(u32::from_le_bytes(b))
}

/// A comm as the kernel keeps it: printable bytes, then NULs (set_task_comm pads with NULs; the
/// 16th byte, always NUL, is not read).
fn comm_is_text(comm: &[u8; COMM_MAX]) -> bool {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_MAX);
    comm[..end].iter().all(|&b| (0x20..0x7f).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    const LAYOUT: &str = "# test\n\
        banner Linux version 6.1.0 (t@t) #1\n\
        symbol __per_cpu_offset 0xffffffff82000000\n\
        symbol current_task 0x1fc40\n\
        symbol linux_banner 0xffffffff81e00100\n\
        value task_struct_pid 1000\n\
        value task_struct_tgid 1004\n\
        value task_struct_comm 1800\n\
        value task_struct_flags 44\n\
        value task_struct_size 4096\n\
        value task_comm_len 16\n\
        value pf_kthread 2097152\n\
        value nr_cpus 8\n\
        value mm_struct_pgd 80\n";

    /// Guest memory by virtual address: bytes at addresses (unlisted addresses are unmapped).
    #[derive(Default)]
    struct Mem(HashMap<u64, u8>);

    impl Mem {
        fn put(&mut self, at: u64, bytes: &[u8]) {
            for (i, b) in bytes.iter().enumerate() {
                self.0.insert(at + i as u64, *b);
            }
        }
    }

    impl GuestRead for Mem {
        fn read_virt(&mut self, gva: u64, buf: &mut [u8]) -> Result<(), AccessError> {
            for (i, b) in buf.iter_mut().enumerate() {
                let a = gva.wrapping_add(i as u64);
                *b = *self.0.get(&a).ok_or(AccessError::NotMapped(a))?;
            }
            Ok(())
        }
    }

    const TASK: u64 = 0xffff_8880_0123_4000;
    const PCPU1: u64 = 0xffff_8880_3fc0_0000;

    fn guest(l: &TaskLayout) -> Mem {
        let mut m = Mem::default();
        m.put(l.linux_banner, l.banner.as_bytes());
        m.put(l.per_cpu_offset + 8, &PCPU1.to_le_bytes());
        m.put(PCPU1 + l.current_task, &TASK.to_le_bytes());
        m.put(TASK + l.task_pid, &321u32.to_le_bytes());
        m.put(TASK + l.task_tgid, &300u32.to_le_bytes());
        m.put(TASK + l.task_flags, &0u32.to_le_bytes());
        m.put(TASK + l.task_comm, b"cpu_split\0\0\0\0\0\0");
        m
    }

    #[test]
    fn the_running_task_is_read_through_the_per_cpu_area() {
        let l = Arc::new(TaskLayout::parse(LAYOUT).unwrap());
        let mut m = guest(&l);
        let mut r = TaskReader::new(l.clone(), 1);
        let t = r.current(&mut m).unwrap();
        assert_eq!(
            (t.pid, t.tgid, t.comm(), t.kernel_thread),
            (321, 300, "cpu_split".into(), false)
        );
        assert_eq!(t.label(), "cpu_split[300]");
        m.put(TASK + l.task_flags, &0x0020_0000u32.to_le_bytes());
        assert!(r.current(&mut m).unwrap().kernel_thread);
    }

    #[test]
    fn a_hostile_or_unready_guest_gets_a_reason_not_a_fault() {
        let l = Arc::new(TaskLayout::parse(LAYOUT).unwrap());
        let fresh = |cpu| TaskReader::new(l.clone(), cpu);
        // Before the kernel runs (nothing at linux_banner), or another kernel.
        assert_eq!(
            fresh(1).current(&mut Mem::default()),
            Err(Unresolved::NotThisKernel)
        );
        let mut m = guest(&l);
        m.put(l.linux_banner, b"Linux version 5");
        assert_eq!(fresh(1).current(&mut m), Err(Unresolved::NotThisKernel));
        // A vCPU the kernel has no slot for.
        assert_eq!(
            fresh(8).current(&mut guest(&l)),
            Err(Unresolved::CpuBeyondNrCpus)
        );
        // current_task pointing into user space, misaligned, or unmapped.
        for (bad, why) in [
            (
                0x7fff_0000_0000u64,
                Unresolved::BadPointer(Step::CurrentTask),
            ),
            (TASK + 3, Unresolved::BadPointer(Step::CurrentTask)),
            (u64::MAX - 7, Unresolved::BadPointer(Step::CurrentTask)),
            (TASK + 0x10_0000, Unresolved::NotMapped(Step::TaskFields)),
        ] {
            let mut m = guest(&l);
            m.put(PCPU1 + l.current_task, &bad.to_le_bytes());
            assert_eq!(fresh(1).current(&mut m), Err(why), "task pointer {bad:#x}");
        }
        // A per-CPU offset that leads outside the kernel half.
        let mut m = guest(&l);
        m.put(l.per_cpu_offset + 8, &0x1000u64.to_le_bytes());
        assert_eq!(
            fresh(1).current(&mut m),
            Err(Unresolved::BadPointer(Step::PerCpuOffset))
        );
        // Values out of range: a pid beyond PID_MAX_LIMIT, a comm of control bytes.
        let mut m = guest(&l);
        m.put(TASK + l.task_pid, &u32::MAX.to_le_bytes());
        assert_eq!(
            fresh(1).current(&mut m),
            Err(Unresolved::BadValue(Step::TaskFields))
        );
        let mut m = guest(&l);
        m.put(TASK + l.task_comm, b"a\x01b\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(
            fresh(1).current(&mut m),
            Err(Unresolved::BadValue(Step::TaskFields))
        );
        // Every reason survives the trace record's two bytes.
        for u in [
            Unresolved::NotThisKernel,
            Unresolved::NotMapped(Step::CurrentTask),
            Unresolved::BadPointer(Step::PerCpuOffset),
            Unresolved::BadValue(Step::TaskFields),
            Unresolved::CpuBeyondNrCpus,
        ] {
            let (s, st) = u.code();
            assert_eq!(Unresolved::from_code(s, st), Some(u));
            assert!(!u.describe().is_empty());
        }
        assert_eq!(Unresolved::from_code(9, 1), None);
    }

    #[test]
    fn a_layout_file_is_checked_line_by_line() {
        let l = TaskLayout::parse(LAYOUT).unwrap();
        assert_eq!(l.current_task, 0x1fc40);
        assert_eq!(l.task_comm, 1800);
        let missing = LAYOUT.replace("value task_struct_tgid 1004\n", "");
        assert!(matches!(
            TaskLayout::parse(&missing),
            Err(LayoutError::Missing("task_struct_tgid"))
        ));
        let outside = LAYOUT.replace("value task_struct_comm 1800", "value task_struct_comm 4090");
        assert!(
            TaskLayout::parse(&outside).is_err(),
            "comm beyond task_struct"
        );
        let junk = format!("{LAYOUT}offset x 1\n");
        assert!(matches!(
            TaskLayout::parse(&junk),
            Err(LayoutError::Bad { line: 15, .. })
        ));
        let nan = LAYOUT.replace("0x1fc40", "0xzz");
        assert!(TaskLayout::parse(&nan).is_err());
    }
}
