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

#[cfg(test)]
mod fake;
pub(crate) mod maps;

use crate::kvm_error::AccessError;
use crate::vcpu_access::VcpuAccess;
pub use analysis::guest_task::{
    printable, FileName, GuestExe, GuestMapping, GuestTask, Step, Unresolved, COMM_MAX,
    EXE_NAME_MAX,
};
use maps::{mapping_at, MapLayout};

/// The file name `build.sh` gives the layout, beside the kernel image.
pub(crate) const LAYOUT_FILE: &str = "task-layout";
/// Linux's PID_MAX_LIMIT on 64-bit: no pid or tgid is larger.
const PID_MAX_LIMIT: u32 = 4 * 1024 * 1024;
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
    /// The executable's chain: task->mm->exe_file->f_path.dentry->d_name.name, and
    /// mm->start_code/end_code.
    pub task_mm: u64,
    pub mm_exe_file: u64,
    pub mm_start_code: u64,
    pub mm_end_code: u64,
    /// f_path.dentry: the `struct file` offset of f_path plus the `struct path` offset of dentry.
    pub file_dentry: u64,
    /// d_name.name: the `struct dentry` offset of d_name plus the `struct qstr` offset of name.
    pub dentry_name: u64,
    /// The task's memory map (shared libraries); None in layouts from older builds.
    pub maps: Option<MapLayout>,
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
                    // Offsets, sizes, counts and flags: far below 2^32, so that no sum of
                    // two of them below can wrap.
                    if word == "value" && n > u64::from(u32::MAX) {
                        return Err(bad(format!("value {name} {n} is not below 2^32")));
                    }
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
            task_mm: need("task_struct_mm")?,
            mm_exe_file: need("mm_struct_exe_file")?,
            mm_start_code: need("mm_struct_start_code")?,
            mm_end_code: need("mm_struct_end_code")?,
            file_dentry: need("file_f_path")? + need("path_dentry")?,
            dentry_name: need("dentry_d_name")? + need("qstr_name")?,
            maps: MapLayout::from_values(&|n| get.get(n).copied()).map_err(|what| {
                LayoutError::Bad {
                    line: 0,
                    what: what.into(),
                }
            })?,
        };
        let fields = [
            layout.task_pid + 4,
            layout.task_tgid + 4,
            layout.task_comm + COMM_MAX as u64,
            layout.task_flags + 4,
            layout.task_mm + 8,
        ];
        let small = [
            layout.mm_exe_file,
            layout.mm_start_code,
            layout.mm_end_code,
            layout.file_dentry,
            layout.dentry_name,
        ];
        if small.iter().any(|&o| o > 1 << 16) {
            return Err(LayoutError::Bad {
                line: 0,
                what: "an mm/file/dentry offset beyond 64 KiB".into(),
            });
        }
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

/// Guest-virtual reads, as the vCPU access layer does them (a trait so tests can serve them from
/// a map).
pub trait GuestRead {
    fn read_virt(&mut self, gva: u64, buf: &mut [u8]) -> Result<(), AccessError>;
}

impl<T: VcpuAccess + ?Sized> GuestRead for T {
    /// Through the vCPU's address space; for kernel data the running address space does not
    /// map, through the kernel's own: under page-table isolation (PTI) a task in user mode runs
    /// on the user half of an 8 KiB pair of top-level tables, which maps almost nothing of the
    /// kernel, and the kernel's table is the other half (Linux's PTI_USER_PGTABLE_MASK, bit 12
    /// of CR3).
    fn read_virt(&mut self, gva: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        match VcpuAccess::read_virt(self, gva, buf) {
            Err(AccessError::NotMapped(a)) if gva >= KERNEL_HALF => {
                let cr3 = self.sregs()?.cr3;
                if cr3 & PTI_USER_PGTABLE_BIT == 0 {
                    return Err(AccessError::NotMapped(a));
                }
                self.read_virt_at(cr3 & !PTI_USER_PGTABLE_BIT, gva, buf)
            }
            r => r,
        }
    }
}

/// Set in CR3 while a PTI kernel runs user code (the user half of its top-level table pair).
const PTI_USER_PGTABLE_BIT: u64 = 1 << 12;

/// One vCPU's task reader: the layout, the vCPU's number, and whether the kernel was verified.
pub struct TaskReader {
    layout: std::sync::Arc<TaskLayout>,
    cpu: u64,
    verified: bool,
}

/// The x86-64 kernel half: canonical addresses from here up.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;
/// User addresses lie below this.
const USER_TOP: u64 = 0x0000_8000_0000_0000;

pub(super) fn kernel_pointer(p: u64, align: u64) -> bool {
    p >= KERNEL_HALF && p.is_multiple_of(align)
}

/// Most memory-map lookups for one sample (the RIP's and its callers'): each walks the maple
/// tree (2-4 nodes of 256 bytes here) and reads a VMA and its file's name.
pub(crate) const MAX_MAP_LOOKUPS: u8 = 4;

/// What [`TaskReader::current_user`] found of a task: the task, its executable (None: a kernel
/// thread or a task without mm) and the mapping of a RIP outside the executable's code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserView {
    pub task: GuestTask,
    pub exe: Option<Result<GuestExe, Unresolved>>,
    pub mapping: Option<Result<GuestMapping, Unresolved>>,
    /// For callers' lookups (None: no executable, or a layout without the memory map).
    lookups: Option<MapLookups>,
}

/// The memory map a sample's lookups search and what they have already covered.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MapLookups {
    mm: u64,
    /// User address ranges already named: the executable's code, mappings found.
    known: Vec<std::ops::Range<u64>>,
    /// Lookups this sample may still make.
    left: u8,
}

impl MapLookups {
    fn is_known(&self, addr: u64) -> bool {
        self.known.iter().any(|r| r.contains(&addr))
    }
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
        self.current_at(mem).map(|(t, _)| t)
    }

    #[cfg(test)]
    /// The running task and, for a user task, its executable (`Ok(None)`: a kernel thread, or a
    /// task with no mm).
    #[allow(clippy::type_complexity)]
    pub(crate) fn current_with_exe<M: GuestRead + ?Sized>(
        &mut self,
        mem: &mut M,
    ) -> Result<(GuestTask, Option<Result<GuestExe, Unresolved>>), Unresolved> {
        let (task, at) = self.current_at(mem)?;
        if task.kernel_thread {
            return Ok((task, None));
        }
        Ok((task, self.exe(mem, at).map(|r| r.map(|(e, _)| e))))
    }

    /// task->mm->exe_file->f_path.dentry->d_name.name, and mm->start_code/end_code: a fixed
    /// number of reads, each pointer checked; with the (checked) mm they came from. None: the
    /// task has no mm.
    fn exe<M: GuestRead + ?Sized>(
        &self,
        mem: &mut M,
        task: u64,
    ) -> Option<Result<(GuestExe, u64), Unresolved>> {
        let l = &*self.layout;
        let step = Step::Executable;
        // A struct pointer: kernel, aligned, and room for the <= 64 KiB of offsets after it.
        let checked = |p: u64| {
            (kernel_pointer(p, 8) && p.checked_add(1 << 16).is_some())
                .then_some(p)
                .ok_or(Unresolved::BadPointer(step))
        };
        let read_ptr = |mem: &mut M, at: u64| read_u64(mem, at, step).and_then(checked);
        let mm = match read_u64(mem, task + l.task_mm, step) {
            Ok(0) => return None,
            other => other.and_then(checked),
        };
        let exe = (|| {
            let mm = mm?;
            let start = read_u64(mem, mm + l.mm_start_code, step)?;
            let end = read_u64(mem, mm + l.mm_end_code, step)?;
            if end < start {
                return Err(Unresolved::BadValue(step));
            }
            let file = read_ptr(mem, mm + l.mm_exe_file)?;
            let (name, len) = self.file_name(mem, file, step)?;
            let exe = GuestExe {
                name,
                name_len: len,
                start_code: start,
                code_size: u32::try_from(end - start).unwrap_or(u32::MAX),
            };
            Ok((exe, mm))
        })();
        Some(exe)
    }

    /// A `struct file`'s name: file->f_path.dentry->d_name.name, its first [`EXE_NAME_MAX`]
    /// bytes and its length (1..=255; no '/').
    fn file_name<M: GuestRead + ?Sized>(
        &self,
        mem: &mut M,
        file: u64,
        step: Step,
    ) -> Result<FileName, Unresolved> {
        let l = &*self.layout;
        let dentry = read_u64(mem, file + l.file_dentry, step)?;
        if !(kernel_pointer(dentry, 8) && dentry.checked_add(1 << 16).is_some()) {
            return Err(Unresolved::BadPointer(step));
        }
        let name_at = read_u64(mem, dentry + l.dentry_name, step)?;
        if !kernel_pointer(name_at, 1) {
            return Err(Unresolved::BadPointer(step));
        }
        // The name: up to EXE_NAME_MAX bytes, then how long it really is (bounded: 255).
        let mut name = [0u8; EXE_NAME_MAX];
        let mut len = 0usize;
        let mut chunk = [0u8; 64];
        let mut at = name_at;
        'outer: for _ in 0..8 {
            // Never past the page the name is on until its NUL is not there.
            let n = (0x1000 - (at & 0xfff)).min(64) as usize;
            mem.read_virt(at, &mut chunk[..n])
                .map_err(|_| Unresolved::NotMapped(step))?;
            at = at.wrapping_add(n as u64);
            for &b in &chunk[..n] {
                if b == 0 {
                    break 'outer;
                }
                if len < EXE_NAME_MAX {
                    name[len] = b;
                }
                len += 1;
            }
        }
        if len == 0 || len > 255 || !name.iter().take(len.min(EXE_NAME_MAX)).all(|&b| b != b'/') {
            return Err(Unresolved::BadValue(step));
        }
        Ok((name, len as u8))
    }

    /// The running task; for a user task also its executable, and, when `rip` lies outside the
    /// executable's code and the layout describes the memory map, the mapping holding `rip`.
    pub fn current_user<M: GuestRead + ?Sized>(
        &mut self,
        mem: &mut M,
        rip: u64,
    ) -> Result<UserView, Unresolved> {
        let (task, at) = self.current_at(mem)?;
        let mut view = UserView {
            task,
            exe: None,
            mapping: None,
            lookups: None,
        };
        if task.kernel_thread {
            return Ok(view);
        }
        let exe = self.exe(mem, at);
        if let (Some(maps), Some(Ok((e, mm)))) = (&self.layout.maps, &exe) {
            let code = e.start_code..e.start_code.saturating_add(u64::from(e.code_size));
            let mut lookups = MapLookups {
                mm: *mm,
                known: vec![code],
                left: MAX_MAP_LOOKUPS,
            };
            // A user address outside the executable's code (a CPL 3 sample can also stand at
            // a kernel address: the host's SYSCALL relay enters the kernel's entry code in
            // user mode), looked up in the memory map of the mm the executable was read from.
            if rip < USER_TOP && !lookups.is_known(rip) {
                view.mapping = Some(self.look_up(mem, maps, &mut lookups, rip));
            }
            view.lookups = Some(lookups);
        }
        view.exe = exe.map(|r| r.map(|(e, _)| e));
        Ok(view)
    }

    /// The files mapped at a user sample's return addresses `frames` that neither the
    /// executable's code nor the RIP's mapping holds: callers in other shared libraries. At most
    /// [`MAX_MAP_LOOKUPS`] lookups a sample (the RIP's included), each address's VMA searched
    /// once; an address in no mapping, anonymous memory or a lookup that fails names nothing
    /// (its frame shows as an address).
    pub fn caller_mappings<M: GuestRead + ?Sized>(
        &self,
        mem: &mut M,
        view: &mut UserView,
        frames: &[u64],
    ) -> Vec<GuestMapping> {
        let (Some(maps), Some(lookups)) = (&self.layout.maps, &mut view.lookups) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for &ret in frames {
            // The call instruction's last byte: a return address may be the first byte past
            // its function's mapping.
            let at = ret.wrapping_sub(1);
            if lookups.left == 0 {
                break;
            }
            if at >= USER_TOP || lookups.is_known(at) {
                continue;
            }
            match self.look_up(mem, maps, lookups, at) {
                Ok(mapping) if !mapping.anonymous() => found.push(mapping),
                _ => {}
            }
        }
        found
    }

    /// One of a sample's lookups: the mapping holding user address `addr` in `lookups`' memory
    /// map, its range then known (counted against `lookups.left`, which must be > 0).
    fn look_up<M: GuestRead + ?Sized>(
        &self,
        mem: &mut M,
        maps: &MapLayout,
        lookups: &mut MapLookups,
        addr: u64,
    ) -> Result<GuestMapping, Unresolved> {
        lookups.left -= 1;
        let (mapping, end) = mapping_at(mem, maps, lookups.mm, addr, &|m: &mut M, f| {
            self.file_name(m, f, Step::Mapping)
        })?;
        lookups.known.push(mapping.vm_start..end);
        Ok(mapping)
    }

    fn current_at<M: GuestRead + ?Sized>(
        &mut self,
        mem: &mut M,
    ) -> Result<(GuestTask, u64), Unresolved> {
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
        // (Checked: the symbol's value comes from a file, the layout's.)
        let entry = l
            .per_cpu_offset
            .checked_add(8 * self.cpu)
            .ok_or(Unresolved::BadPointer(Step::PerCpuOffset))?;
        let pcpu = read_u64(mem, entry, Step::PerCpuOffset)?;
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
        Ok((
            GuestTask {
                pid,
                tgid,
                comm,
                kernel_thread: u64::from(flags) & l.pf_kthread != 0,
            },
            task,
        ))
    }
}

pub(super) fn read_u64<M: GuestRead + ?Sized>(
    mem: &mut M,
    gva: u64,
    step: Step,
) -> Result<u64, Unresolved> {
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
    use crate::profile::guest_task::fake::Mem;
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
        value mm_struct_pgd 80\n\
        value task_struct_mm 768\n\
        value mm_struct_exe_file 840\n\
        value mm_struct_start_code 240\n\
        value mm_struct_end_code 248\n\
        value file_f_path 16\n\
        value path_dentry 8\n\
        value dentry_d_name 32\n\
        value qstr_name 8\n";

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

    const MM: u64 = 0xffff_8880_0200_0000;
    const FILE: u64 = 0xffff_8880_0300_0000;
    const DENTRY: u64 = 0xffff_8880_0400_0000;
    const NAME: u64 = 0xffff_8880_0500_0ff8;

    /// `guest` plus a user task's mm, executable file, dentry and name (the name across a page
    /// boundary).
    fn user_guest(l: &TaskLayout, name: &[u8]) -> Mem {
        let mut m = guest(l);
        m.put(TASK + l.task_mm, &MM.to_le_bytes());
        m.put(MM + l.mm_start_code, &0x40_1000u64.to_le_bytes());
        m.put(MM + l.mm_end_code, &0x4b_2000u64.to_le_bytes());
        m.put(MM + l.mm_exe_file, &FILE.to_le_bytes());
        m.put(FILE + l.file_dentry, &DENTRY.to_le_bytes());
        m.put(DENTRY + l.dentry_name, &NAME.to_le_bytes());
        m.put(NAME, name);
        m.put(NAME + name.len() as u64, &[0]);
        m
    }

    #[test]
    fn a_user_task_names_its_executable_and_where_its_code_is() {
        let l = Arc::new(TaskLayout::parse(LAYOUT).unwrap());
        let mut r = TaskReader::new(l.clone(), 1);
        let (t, exe) = r
            .current_with_exe(&mut user_guest(&l, b"cpu_split"))
            .unwrap();
        assert_eq!(t.comm(), "cpu_split");
        let e = exe.unwrap().unwrap();
        assert_eq!(
            (e.name(), e.start_code, e.code_size),
            ("cpu_split".into(), 0x40_1000, 0xb_1000)
        );
        assert!(!e.truncated());
        // A long name keeps its first 16 bytes and says how long it was.
        let long = b"a_program_with_a_long_name";
        let (_, exe) = r.current_with_exe(&mut user_guest(&l, long)).unwrap();
        let e = exe.unwrap().unwrap();
        assert_eq!(
            (e.name(), e.name_len, e.truncated()),
            ("a_program_with_a".into(), 26, true)
        );
        // A task without mm has no executable.
        let mut m = user_guest(&l, b"x");
        m.put(TASK + l.task_mm, &0u64.to_le_bytes());
        assert_eq!(r.current_with_exe(&mut m).unwrap().1, None);
        // Hostile chains: a user-space mm, end before start, an unmapped file, a name of 300
        // bytes, a name with '/' in it.
        let mut bad = |m: &mut Mem| r.current_with_exe(m).unwrap().1.unwrap().unwrap_err();
        let mut m = user_guest(&l, b"x");
        m.put(TASK + l.task_mm, &0x7f00_0000_0000u64.to_le_bytes());
        assert_eq!(bad(&mut m), Unresolved::BadPointer(Step::Executable));
        let mut m = user_guest(&l, b"x");
        m.put(MM + l.mm_end_code, &0x1000u64.to_le_bytes());
        assert_eq!(bad(&mut m), Unresolved::BadValue(Step::Executable));
        let mut m = user_guest(&l, b"x");
        m.put(MM + l.mm_exe_file, &(FILE + 0x10_0000).to_le_bytes());
        assert_eq!(bad(&mut m), Unresolved::NotMapped(Step::Executable));
        assert_eq!(
            bad(&mut user_guest(&l, &[b'a'; 300])),
            Unresolved::BadValue(Step::Executable)
        );
        assert_eq!(
            bad(&mut user_guest(&l, b"../x")),
            Unresolved::BadValue(Step::Executable)
        );
        // A kernel thread: no executable is read.
        let mut m = user_guest(&l, b"x");
        m.put(TASK + l.task_flags, &0x0020_0000u32.to_le_bytes());
        let mut r = TaskReader::new(l.clone(), 1);
        assert_eq!(r.current_with_exe(&mut m).unwrap().1, None);
    }

    /// A guest with the executable "perf", libc.so.6 and libb.so mapped (fake::maple_tree).
    fn guest_with_libraries(l: &TaskLayout) -> Mem {
        let mut m = user_guest(l, b"perf");
        let libs = [(0x100, "libc.so.6"), (0x200, "libb.so")];
        for (off, name) in libs {
            let (file, dentry, at) = (FILE + off, DENTRY + off, NAME + 0x10 * off);
            m.put(file + l.file_dentry, &dentry.to_le_bytes());
            m.put(dentry + l.dentry_name, &at.to_le_bytes());
            m.put(at, format!("{name}\0").as_bytes());
        }
        crate::profile::guest_task::fake::maple_tree(&mut m, MM, FILE + 0x100, FILE + 0x200);
        m
    }

    #[test]
    fn a_rip_outside_the_executable_names_its_mapping() {
        use crate::profile::guest_task::fake::{LIBC_START, MAP_LAYOUT_LINES};
        let l = Arc::new(TaskLayout::parse(&format!("{LAYOUT}{MAP_LAYOUT_LINES}")).unwrap());
        let mut m = guest_with_libraries(&l);
        let mut r = TaskReader::new(l.clone(), 1);
        let view = r.current_user(&mut m, LIBC_START + 0x40).unwrap();
        assert_eq!(view.exe.unwrap().unwrap().name(), "perf");
        let lib = view.mapping.expect("outside the executable").unwrap();
        assert_eq!((lib.name(), lib.vm_start), ("libc.so.6".into(), LIBC_START));
        // Inside the executable's code: no mapping is read.
        assert_eq!(r.current_user(&mut m, 0x40_2000).unwrap().mapping, None);
        // A layout from an older build (no map lines): none either.
        let old = Arc::new(TaskLayout::parse(LAYOUT).unwrap());
        let mut r = TaskReader::new(old, 1);
        assert_eq!(
            r.current_user(&mut m, LIBC_START + 0x40).unwrap().mapping,
            None
        );
        // A hostile mm pointer swapped in between: a reason.
        let mut r = TaskReader::new(l.clone(), 1);
        let mut m2 = user_guest(&l, b"perf");
        m2.put(
            MM + l.maps.as_ref().unwrap().mm_root,
            &0x7000u64.to_le_bytes(),
        );
        assert_eq!(
            r.current_user(&mut m2, LIBC_START).unwrap().mapping,
            Some(Err(Unresolved::BadValue(Step::Mapping)))
        );
    }

    #[test]
    fn callers_in_other_libraries_name_their_mappings_each_looked_up_once() {
        use crate::profile::guest_task::fake::MAP_LAYOUT_LINES;
        use crate::profile::guest_task::fake::{ANON_START, LIBB_START, LIBC_START};
        let l = Arc::new(TaskLayout::parse(&format!("{LAYOUT}{MAP_LAYOUT_LINES}")).unwrap());
        let mut m = guest_with_libraries(&l);
        let mut r = TaskReader::new(l.clone(), 1);
        let names = |v: Vec<GuestMapping>| v.iter().map(|m| m.name()).collect::<Vec<_>>();
        // A sample in libc: its callers in libc and the executable need no lookup; two in libb
        // (one a return address just past libb's end: its call lies inside) name libb once;
        // anonymous memory and an unmapped address name nothing.
        let mut view = r.current_user(&mut m, LIBC_START + 0x40).unwrap();
        let frames = [
            LIBC_START + 0x800,
            LIBB_START + 0x123,
            0x40_2000,
            LIBB_START + 0x1_0000,
            ANON_START + 0x10,
            0x1000,
        ];
        assert_eq!(
            names(r.caller_mappings(&mut m, &mut view, &frames)),
            ["libb.so"]
        );
        // A sample in the executable: libc and libb, in the order of the stack.
        let mut view = r.current_user(&mut m, 0x40_2000).unwrap();
        let frames = [
            LIBB_START + 0x123,
            0x40_3000,
            LIBC_START + 0x99,
            LIBB_START + 8,
        ];
        assert_eq!(
            names(r.caller_mappings(&mut m, &mut view, &frames)),
            ["libb.so", "libc.so.6"]
        );
        // At most MAX_MAP_LOOKUPS a sample, the RIP's included: a stack of unmapped addresses
        // (each a lookup that finds nothing) stops the search before libb.
        let mut view = r.current_user(&mut m, LIBC_START + 0x40).unwrap();
        let frames = [0x1000, 0x2000, 0x3000, LIBB_START + 0x123];
        assert!(r.caller_mappings(&mut m, &mut view, &frames).is_empty());
        // Kernel addresses are never looked up; a hostile tree names nothing.
        let mut view = r.current_user(&mut m, 0x40_2000).unwrap();
        assert!(r
            .caller_mappings(&mut m, &mut view, &[0xffff_ffff_8100_0000])
            .is_empty());
        m.put(
            MM + l.maps.as_ref().unwrap().mm_root,
            &0x7000u64.to_le_bytes(),
        );
        assert!(r
            .caller_mappings(&mut m, &mut view, &[LIBB_START + 0x123])
            .is_empty());
        // No executable (a kernel thread): no lookups.
        let mut kthread = guest_with_libraries(&l);
        kthread.put(TASK + l.task_flags, &0x0020_0000u32.to_le_bytes());
        let mut view = r.current_user(&mut kthread, 0x40_2000).unwrap();
        assert!(r
            .caller_mappings(&mut kthread, &mut view, &[LIBB_START + 0x123])
            .is_empty());
    }

    /// Maps `va` to `pa` under the top-level table at `root` (4-level, 4 KiB pages; tables
    /// taken from `next`).
    fn map(mem: &vm_memory::GuestMemoryMmap, root: u64, va: u64, pa: u64, next: &mut u64) {
        use vm_memory::{Bytes, GuestAddress};
        let mut table = root;
        for level in (2..=4).rev() {
            let at = table + ((va >> (12 + 9 * (level - 1))) & 0x1ff) * 8;
            let mut e: u64 = mem.read_obj(GuestAddress(at)).unwrap();
            if e & 1 == 0 {
                *next += 0x1000;
                e = *next | 3;
                mem.write_obj(e, GuestAddress(at)).unwrap();
            }
            table = e & 0x000f_ffff_ffff_f000;
        }
        mem.write_obj(pa | 3, GuestAddress(table + ((va >> 12) & 0x1ff) * 8))
            .unwrap();
    }

    #[test]
    fn kernel_data_of_a_pti_kernel_is_read_through_its_own_tables() {
        use crate::arch::x86::{CR0_PG, CR4_PAE, EFER_LMA, EFER_LME};
        use crate::vcpu_access::fake::FakeVcpu;
        use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
        // The kernel's top-level table at 0x10000 (8 KiB aligned), the user's at 0x11000.
        let (kernel_root, user_root) = (0x1_0000u64, 0x1_1000u64);
        let mut next = 0x2_0000;
        let (kdata, udata) = (0xffff_8880_0010_0000u64, 0x40_0000u64);
        map(&mem, kernel_root, kdata, 0x30_0000, &mut next);
        map(&mem, user_root, udata, 0x31_0000, &mut next);
        mem.write_obj(0x1122_3344u64, GuestAddress(0x30_0000))
            .unwrap();
        let mut cpu = FakeVcpu::new(mem);
        cpu.sregs.cr0 = CR0_PG | 1;
        cpu.sregs.cr4 = CR4_PAE;
        cpu.sregs.efer = EFER_LMA | EFER_LME;
        // In user mode: CR3 is the user table (bit 12 set), with a PCID in its low bits.
        cpu.sregs.cr3 = user_root | 5;
        let mut b = [0u8; 8];
        assert!(
            VcpuAccess::read_virt(&mut cpu, kdata, &mut b).is_err(),
            "the CPU's view"
        );
        GuestRead::read_virt(&mut cpu, kdata, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), 0x1122_3344);
        // Without PTI (bit 12 clear) a kernel address the tables do not map stays unmapped.
        cpu.sregs.cr3 = kernel_root;
        assert!(GuestRead::read_virt(&mut cpu, kdata + 0x10_0000, &mut b).is_err());
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
        let junk_line = LAYOUT.lines().count() + 1;
        assert!(
            matches!(TaskLayout::parse(&junk), Err(LayoutError::Bad { line, .. }) if line == junk_line)
        );
        let nan = LAYOUT.replace("0x1fc40", "0xzz");
        assert!(TaskLayout::parse(&nan).is_err());
    }

    #[test]
    fn names_from_the_guest_reach_text_output_without_control_characters() {
        let mut comm = [0u8; COMM_MAX];
        comm[..9].copy_from_slice(b"a\x1b[2J\nb\xff\x7f");
        let t = GuestTask {
            pid: 7,
            tgid: 7,
            comm,
            kernel_thread: false,
        };
        let shown = t.label();
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(shown, "a\\u{1b}[2J\\u{a}b\u{fffd}\\u{7f}[7]");
    }

    #[test]
    fn no_value_in_a_layout_file_overflows_the_checks() {
        // A crafted task-layout file (read from beside the kernel): each value line in turn
        // set to numbers near 2^64, whose sums with other fields wrapped (a panic in a
        // debug build, offsets past task_struct taken in a release one).
        let maps = super::fake::MAP_LAYOUT_LINES;
        let text = format!("{LAYOUT}{maps}");
        for (i, line) in text.lines().enumerate() {
            let Some(name) = line
                .strip_prefix("value ")
                .and_then(|r| r.split(' ').next())
            else {
                continue;
            };
            for v in [u64::MAX, u64::MAX - 3, 1 << 63, 1 << 32] {
                let mut lines: Vec<String> = text.lines().map(String::from).collect();
                lines[i] = format!("value {name} {v}");
                let crafted = lines.join("\n");
                assert!(
                    TaskLayout::parse(&crafted).is_err(),
                    "value {name} {v} was taken"
                );
            }
        }
    }
}
