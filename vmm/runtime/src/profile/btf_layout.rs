//! A task layout from the kernel image itself, for kernels this project did not build (issue
//! 19): most distribution kernels carry their types as BTF (`CONFIG_DEBUG_INFO_BTF`, a `.BTF`
//! section the bzImage keeps) and their symbols as kallsyms (`CONFIG_KALLSYMS_ALL`). From those
//! two this module writes the same `task-layout` text `guest-image/build.sh` writes from the
//! kernel build (`profile::guest_task`), so one parser checks both:
//!
//! * struct member offsets and sizes from BTF (the `btfparse` crate; members inside anonymous
//!   structs and unions, as `mm_struct`'s are, are found by name);
//! * `__per_cpu_offset`, `current_task` (6.1; from 6.2 `pcpu_hot` + `pcpu_hot.current_task`)
//!   and `linux_banner` from kallsyms, and the banner's bytes from the image at that address;
//! * NR_CPUS is not in BTF: the `__per_cpu_offset` array is taken to end at the next symbol
//!   (a vCPU beyond it reads nothing; one within it the kernel does not use reads values the
//!   sample checks refuse);
//! * `PF_KTHREAD` (a `#define`, not in BTF) is 0x00200000, its value since Linux 2.6.
//!
//! The memory-map lines (shared libraries) are written when the kernel has the 6.1 maple tree
//! (`mm_struct.mm_mt`); older kernels get a layout without them.

use std::path::Path;

use btfparse::{Offset, Readable, TypeInformation, TypeVariant};
use object::{Object, ObjectSection, ObjectSegment};

use super::guest_task::TaskLayout;
use analysis::bzimage;
use analysis::profile::kallsyms::{self, KSym};

/// PF_KTHREAD (include/linux/sched.h), unchanged since Linux 2.6.
const PF_KTHREAD: u64 = 0x0020_0000;
/// The most CPUs a layout allows (Linux's NR_CPUS maximum).
const MAX_CPUS: u64 = 8192;

#[derive(Debug, thiserror::Error)]
pub enum BtfLayoutError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    BzImage(#[from] bzimage::BzImageError),
    #[error("not an ELF vmlinux or a bzImage")]
    NotKernel,
    #[error(
        "the kernel has no BTF (.BTF section; CONFIG_DEBUG_INFO_BTF): give --task-layout FILE"
    )]
    NoBtf,
    #[error("the kernel's BTF cannot be read: {0}")]
    Btf(String),
    #[error("the kernel's BTF has no {0}")]
    Missing(String),
    #[error("kernel symbols: {0}")]
    Kallsyms(#[from] kallsyms::KallsymsError),
    #[error("kernel symbols: no {0} (needs CONFIG_KALLSYMS_ALL)")]
    NoSymbol(&'static str),
    #[error(
        "the banner at linux_banner ({0:#x}) is not in the image or is not \"Linux version ...\""
    )]
    Banner(u64),
}

/// `vpmu-vmm task-layout KERNEL [--out FILE]`.
#[derive(clap::Args, Debug)]
pub struct TaskLayoutArgs {
    /// The kernel image (bzImage or ELF vmlinux) the guest boots.
    #[arg(value_name = "KERNEL")]
    pub kernel: std::path::PathBuf,
    /// Write the layout to FILE (`run --task-layout FILE` reads it) instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
}

/// Writes the layout of `args.kernel`, checked by the parser `run` uses.
pub fn command(args: &TaskLayoutArgs) -> Result<(), BtfLayoutError> {
    let text = from_kernel(&args.kernel)?;
    let layout = TaskLayout::parse(&text).map_err(|e| BtfLayoutError::Btf(e.to_string()))?;
    eprintln!(
        "task layout of {}: {}; {}",
        args.kernel.display(),
        layout.banner,
        if layout.maps.is_some() {
            "with the memory map (shared libraries)"
        } else {
            "without the memory map (no 6.1 maple tree)"
        }
    );
    match &args.out {
        Some(path) => std::fs::write(path, &text).map_err(|source| BtfLayoutError::Io {
            path: path.display().to_string(),
            source,
        }),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// The `task-layout` text for the kernel image at `path` (ELF vmlinux or bzImage).
pub fn from_kernel(path: &Path) -> Result<String, BtfLayoutError> {
    let bytes = std::fs::read(path).map_err(|source| BtfLayoutError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let vmlinux = if bytes.starts_with(b"\x7fELF") {
        bytes
    } else if bzimage::is_bzimage(&bytes) {
        bzimage::extract(&bytes)?.vmlinux
    } else {
        return Err(BtfLayoutError::NotKernel);
    };
    from_vmlinux(&vmlinux)
}

/// The layout text from an ELF vmlinux's `.BTF` and kallsyms.
pub fn from_vmlinux(elf: &[u8]) -> Result<String, BtfLayoutError> {
    let file = object::File::parse(elf).map_err(|_| BtfLayoutError::NotKernel)?;
    let btf = file
        .section_by_name(".BTF")
        .and_then(|s| s.data().ok())
        .ok_or(BtfLayoutError::NoBtf)?;
    let types = Types::new(btf)?;
    let syms = kallsyms::from_vmlinux(elf)?;
    let sym = |name: &'static str| {
        syms.iter()
            .find(|s| s.name == name)
            .map(|s| s.addr)
            .ok_or(BtfLayoutError::NoSymbol(name))
    };
    let linux_banner = sym("linux_banner")?;
    let banner = banner_at(&file, linux_banner).ok_or(BtfLayoutError::Banner(linux_banner))?;
    let per_cpu_offset = sym("__per_cpu_offset")?;
    let current_task = match sym("current_task") {
        Ok(a) => a,
        Err(_) => sym("pcpu_hot")?
            .checked_add(types.offset("pcpu_hot", "current_task")?)
            .ok_or(BtfLayoutError::Btf(
                "pcpu_hot + pcpu_hot.current_task passes the top of the address space".into(),
            ))?,
    };
    let mut out = String::from(
        "# vpmu task layout v1: from the kernel's BTF and kallsyms (vpmu-vmm task-layout)\n",
    );
    out.push_str(&format!("banner {banner}\n"));
    for (name, addr) in [
        ("__per_cpu_offset", per_cpu_offset),
        ("current_task", current_task),
        ("linux_banner", linux_banner),
    ] {
        out.push_str(&format!("symbol {name} {addr:#x}\n"));
    }
    let mut value = |name: &str, v: u64| out.push_str(&format!("value {name} {v}\n"));
    for (key, ty, member) in FIELDS {
        value(key, types.offset(ty, member)?);
    }
    value("task_struct_size", types.size("task_struct")?);
    value("task_comm_len", types.count("task_struct", "comm")?);
    value("pf_kthread", PF_KTHREAD);
    value("nr_cpus", nr_cpus(&syms, per_cpu_offset));
    if types.offset("mm_struct", "mm_mt").is_ok() {
        for (key, ty, member) in MAP_FIELDS {
            value(key, types.offset(ty, member)?);
        }
        value(
            "maple_range64_slots",
            types.count("maple_range_64", "slot")?,
        );
        value(
            "maple_arange64_slots",
            types.count("maple_arange_64", "slot")?,
        );
    }
    Ok(out)
}

/// (layout name, struct, member) of the task's fields.
const FIELDS: [(&str, &str, &str); 14] = [
    ("task_struct_pid", "task_struct", "pid"),
    ("task_struct_tgid", "task_struct", "tgid"),
    ("task_struct_comm", "task_struct", "comm"),
    ("task_struct_flags", "task_struct", "flags"),
    ("task_struct_mm", "task_struct", "mm"),
    ("task_struct_stack", "task_struct", "stack"),
    ("task_struct_group_leader", "task_struct", "group_leader"),
    ("mm_struct_pgd", "mm_struct", "pgd"),
    ("mm_struct_exe_file", "mm_struct", "exe_file"),
    ("mm_struct_start_code", "mm_struct", "start_code"),
    ("mm_struct_end_code", "mm_struct", "end_code"),
    ("file_f_path", "file", "f_path"),
    ("path_dentry", "path", "dentry"),
    ("dentry_d_name", "dentry", "d_name"),
];

/// The memory map's fields (6.1's maple tree), and qstr.name.
const MAP_FIELDS: [(&str, &str, &str); 13] = [
    ("mm_struct_mm_mt", "mm_struct", "mm_mt"),
    ("maple_tree_ma_root", "maple_tree", "ma_root"),
    ("maple_range_64_pivot", "maple_range_64", "pivot"),
    ("maple_range_64_slot", "maple_range_64", "slot"),
    ("maple_range_64_meta", "maple_range_64", "meta"),
    ("maple_arange_64_pivot", "maple_arange_64", "pivot"),
    ("maple_arange_64_slot", "maple_arange_64", "slot"),
    ("maple_arange_64_meta", "maple_arange_64", "meta"),
    ("vm_area_struct_vm_start", "vm_area_struct", "vm_start"),
    ("vm_area_struct_vm_end", "vm_area_struct", "vm_end"),
    ("vm_area_struct_vm_file", "vm_area_struct", "vm_file"),
    ("vm_area_struct_vm_pgoff", "vm_area_struct", "vm_pgoff"),
    ("qstr_name", "qstr", "name"),
];

/// The kernel's types, by name.
struct Types(TypeInformation);

/// The `.BTF` bytes as btfparse reads them.
struct Bytes<'a>(&'a [u8]);

impl Readable for Bytes<'_> {
    fn read(&self, offset: u64, buffer: &mut [u8]) -> btfparse::Result<()> {
        let src = usize::try_from(offset)
            .ok()
            .and_then(|o| self.0.get(o..o.checked_add(buffer.len())?))
            .ok_or_else(|| {
                btfparse::Error::new(btfparse::ErrorKind::IOError, "read past the .BTF section")
            })?;
        buffer.copy_from_slice(src);
        Ok(())
    }
}

impl Types {
    fn new(btf: &[u8]) -> Result<Types, BtfLayoutError> {
        TypeInformation::new(&Bytes(btf))
            .map(Types)
            .map_err(|e| BtfLayoutError::Btf(format!("{e:?}")))
    }

    fn id(&self, ty: &str) -> Result<u32, BtfLayoutError> {
        self.0
            .id_of(ty)
            .ok_or_else(|| BtfLayoutError::Missing(format!("struct {ty}")))
    }

    /// The byte offset of `member` (a path: `a.b`) in struct `ty`.
    fn offset(&self, ty: &str, member: &str) -> Result<u64, BtfLayoutError> {
        match self.0.offset_of(self.id(ty)?, member) {
            Ok((_, Offset::ByteOffset(o))) => Ok(u64::from(o)),
            _ => Err(BtfLayoutError::Missing(format!("{ty}.{member}"))),
        }
    }

    fn size(&self, ty: &str) -> Result<u64, BtfLayoutError> {
        self.0
            .size_of(self.id(ty)?)
            .map(|s| s as u64)
            .map_err(|_| BtfLayoutError::Missing(format!("the size of struct {ty}")))
    }

    /// The element count of array member `member` of `ty`.
    fn count(&self, ty: &str, member: &str) -> Result<u64, BtfLayoutError> {
        let missing = || BtfLayoutError::Missing(format!("{ty}.{member} as an array"));
        let (tid, _) = self
            .0
            .offset_of(self.id(ty)?, member)
            .map_err(|_| missing())?;
        match self.0.from_id(tid) {
            Some(TypeVariant::Array(a)) => Ok(u64::from(*a.element_count())),
            _ => Err(missing()),
        }
    }
}

/// The bytes at `addr` in the image's loadable segments, up to the banner's newline.
fn banner_at(file: &object::File, addr: u64) -> Option<String> {
    let seg = file
        .segments()
        .find(|s| s.address() <= addr && addr - s.address() < s.size())?;
    let data = seg.data().ok()?;
    let start = usize::try_from(addr - seg.address()).ok()?;
    let tail = data.get(start..)?;
    let end = tail.iter().take(512).position(|&b| b == b'\n' || b == 0)?;
    let text = std::str::from_utf8(&tail[..end]).ok()?;
    text.starts_with("Linux version ").then(|| text.to_string())
}

/// NR_CPUS, as far as the symbols tell: `__per_cpu_offset` holds one pointer per CPU up to the
/// next symbol.
fn nr_cpus(syms: &[KSym], per_cpu_offset: u64) -> u64 {
    let next = syms
        .iter()
        .map(|s| s.addr)
        .filter(|&a| a > per_cpu_offset)
        .min()
        .unwrap_or(per_cpu_offset.saturating_add(8 * MAX_CPUS));
    ((next - per_cpu_offset) / 8).clamp(1, MAX_CPUS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nr_cpus_ends_at_the_next_symbol() {
        let s = |addr, name: &str| KSym {
            addr,
            kind: 'D',
            name: name.into(),
        };
        let syms = [
            s(0x1000, "__per_cpu_offset"),
            s(0x1040, "next"),
            s(0x10, "x"),
        ];
        assert_eq!(nr_cpus(&syms, 0x1000), 8);
        assert_eq!(nr_cpus(&syms[..1], 0x1000), MAX_CPUS);
    }

    #[test]
    fn an_image_without_btf_says_so() {
        // This test binary is an ELF without a .BTF section.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(matches!(from_vmlinux(&me), Err(BtfLayoutError::NoBtf)));
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"not a kernel").unwrap();
        assert!(matches!(from_kernel(&junk), Err(BtfLayoutError::NotKernel)));
    }

    /// Regression (issue 33): `__per_cpu_offset` at the top of the address space (a crafted
    /// kernel's symbol table) overflowed the end of the array (a panic in debug builds).
    #[test]
    fn nr_cpus_of_a_symbol_at_the_top_of_the_address_space() {
        let at = u64::MAX - 8;
        let only = [KSym {
            addr: at,
            kind: 'D',
            name: "__per_cpu_offset".into(),
        }];
        assert_eq!(nr_cpus(&only, at), 1);
    }
}
