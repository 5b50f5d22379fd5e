//! Multiboot v1 kernels (kvm-unit-tests' `x86/*.flat`: ELF32 files with a Multiboot header):
//! finding the header, loading the ELF32 segments, and the Multiboot information block with one
//! module, the kernel's environment (`NR_CPUS`, `MEMSIZE`, `MEMLIMIT` as `KEY=VALUE` lines:
//! kvm-unit-tests then never reads fw_cfg at ports 0x510/0x511, where this VMM has its own
//! devices). The vCPU enters in 32-bit protected mode with paging off, EAX = [`BOOTLOADER_MAGIC`]
//! and EBX = the information block (`vcpu::regs::setup_multiboot`), as the Multiboot
//! specification 0.6.96, section 3.2, says.
//!
//! The file is hostile input: every offset and size is checked against the file and against
//! guest RAM before a byte is copied, and each refusal is a [`MultibootError`] naming the field.

use std::path::{Path, PathBuf};

use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::layout::{
    CMDLINE_ADDR, CMDLINE_MAX_SIZE, EBDA_START, HIMEM_START, MULTIBOOT_INFO_ADDR,
    MULTIBOOT_MODULE_ADDR, MULTIBOOT_MODULE_MAX,
};

/// The header's magic (spec 3.1.1).
pub(crate) const HEADER_MAGIC: u32 = 0x1BAD_B002;
/// What the loader leaves in EAX (spec 3.2).
pub const BOOTLOADER_MAGIC: u32 = 0x2BAD_B002;
/// The header must sit, 4-byte aligned, within the file's first 8 KiB.
pub(crate) const SEARCH_LEN: usize = 8192;

/// Header flags (spec 3.1.2). Bits 0-15 are requirements: a loader that cannot meet one must
/// refuse the kernel.
pub(crate) mod header_flags {
    /// Modules page-aligned (they are: one module at a page boundary).
    pub(crate) const PAGE_ALIGN: u32 = 1 << 0;
    /// mem_* fields (always given).
    pub(crate) const MEMORY_INFO: u32 = 1 << 1;
    /// A video mode table: not supported (no video; the tests ask for it).
    #[cfg(test)]
    pub(crate) const VIDEO_MODE: u32 = 1 << 2;
    /// The requirement bits this loader meets.
    pub(crate) const SUPPORTED_REQUIREMENTS: u32 = PAGE_ALIGN | MEMORY_INFO;
}

/// Information-block flags (spec 3.3): which fields are valid.
pub(crate) mod info_flags {
    pub(crate) const MEMORY: u32 = 1 << 0;
    pub(crate) const CMDLINE: u32 = 1 << 2;
    pub(crate) const MODS: u32 = 1 << 3;
    pub(crate) const MMAP: u32 = 1 << 6;
    pub(crate) const LOADER_NAME: u32 = 1 << 9;
}

/// The boot loader name the information block gives.
pub(crate) const LOADER_NAME: &str = "vpmu-vmm";
/// The module's string (kvm-unit-tests ignores it; GRUB gives the module's command line).
pub(crate) const MODULE_STRING: &str = "env";

// Offsets inside the information page at MULTIBOOT_INFO_ADDR.
const MODS_OFFSET: u64 = 0x100;
const MMAP_OFFSET: u64 = 0x200;
const LOADER_NAME_OFFSET: u64 = 0x300;
const MODULE_STRING_OFFSET: u64 = 0x340;
const INFO_SIZE: usize = 92;
const MMAP_ENTRY_SIZE: u32 = 20;
const MMAP_RAM: u32 = 1;
const MMAP_RESERVED: u32 = 2;

const ELF_HEADER_LEN: usize = 52;
const ELF_PHDR_LEN: usize = 32;
const PT_LOAD: u32 = 1;
const ET_EXEC: u16 = 2;
const EM_386: u16 = 3;
/// More program headers than any real kernel has; a corrupt count is refused before looping.
const MAX_PHDRS: u16 = 64;

#[derive(Debug, thiserror::Error)]
pub enum MultibootError {
    #[error("cannot read kernel {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("an ELF32 file without a valid Multiboot header (magic {HEADER_MAGIC:#x}, flags, checksum) in its first {SEARCH_LEN} bytes: not a kernel this VMM can boot")]
    NoHeader,
    #[error("a Multiboot header but not an ELF32 file: the a.out kludge (header flag 16) is not supported, give an ELF32 kernel")]
    NotElf32,
    #[error("the Multiboot header requires flags {0:#x} this loader cannot meet (it meets {SUPPORTED:#x}: page-aligned modules, memory information; no video mode)", SUPPORTED = header_flags::SUPPORTED_REQUIREMENTS)]
    UnsupportedFlags(u32),
    #[error("bad ELF32 header: {0}")]
    BadElf(&'static str),
    #[error("ELF32 program header {index}: file bytes {offset:#x}+{filesz:#x} lie outside the {file_len}-byte file")]
    SegmentOutsideFile {
        index: usize,
        offset: u64,
        filesz: u64,
        file_len: usize,
    },
    #[error("ELF32 program header {index}: file size {filesz:#x} is larger than its memory size {memsz:#x}")]
    SegmentFileLargerThanMemory {
        index: usize,
        filesz: u64,
        memsz: u64,
    },
    #[error("ELF32 program header {index}: guest-physical {start:#x}..{end:#x} is outside the kernel's RAM {HIMEM_START:#x}..{ram_end:#x} (give more --memory if the kernel is just big)")]
    SegmentOutsideRam {
        index: usize,
        start: u64,
        end: u64,
        ram_end: u64,
    },
    #[error("the ELF32 file has no loadable (PT_LOAD) segment")]
    NoLoadSegment,
    #[error("the entry point {0:#x} is in no loaded segment")]
    EntryOutsideSegments(u32),
    #[error("the command line is {0} bytes; the limit is {CMDLINE_MAX_SIZE}")]
    CmdlineTooLong(usize),
    #[error("--initrd is for Linux kernels: a Multiboot kernel gets one module, its environment (built from --cpus and --memory)")]
    Initrd,
    #[error("the environment module is {0} bytes; the limit is {MULTIBOOT_MODULE_MAX}")]
    ModuleTooLarge(usize),
    #[error("writing guest memory: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
}

/// A Multiboot header found in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Where in the file it starts.
    pub offset: usize,
    pub flags: u32,
}

/// The first valid Multiboot header (magic, then flags and a checksum that make the three
/// words sum to 0) at a 4-byte aligned offset in the first [`SEARCH_LEN`] bytes.
pub(crate) fn find_header(image: &[u8]) -> Option<Header> {
    let end = image.len().min(SEARCH_LEN);
    (0..end.saturating_sub(11)).step_by(4).find_map(|offset| {
        let word = |i: usize| le32(image, offset + 4 * i);
        let (magic, flags, checksum) = (word(0)?, word(1)?, word(2)?);
        let valid = magic == HEADER_MAGIC && magic.wrapping_add(flags).wrapping_add(checksum) == 0;
        valid.then_some(Header { offset, flags })
    })
}

/// Whether the file is for this loader rather than the Linux one: an ELF32 (whether or not it
/// has a header: without one it is refused here, with a message), or any non-ELF file with a
/// Multiboot header (refused: the a.out kludge). ELF64 and bzImage files go to the Linux loader.
pub(crate) fn is_multiboot(image: &[u8]) -> bool {
    if image.starts_with(b"\x7fELF") {
        return image.get(4) == Some(&1);
    }
    !image.starts_with(b"MZ") && find_header(image).is_some()
}

/// What a Multiboot kernel needs besides the file: its command line and its environment.
#[derive(Debug, Clone)]
pub struct BootInfo<'a> {
    /// The whole command line (by convention the kernel's name first, as QEMU gives it).
    pub cmdline: &'a str,
    /// The module's bytes (kvm-unit-tests: the environment, `KEY=VALUE` lines).
    pub module: &'a [u8],
}

/// Where the kernel went, and what vCPU 0 is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    /// 32-bit protected-mode entry (physical; paging is off).
    pub entry: u32,
    /// The information block's address (EBX).
    pub info: u32,
    /// First byte after the highest loaded segment.
    pub kernel_end: u64,
}

/// The environment kvm-unit-tests reads from its module instead of fw_cfg: the vCPU count, the
/// RAM size and the highest RAM address it may allocate from, in MiB (lib/x86/fwcfg.c).
pub(crate) fn kvm_unit_tests_env(vcpus: u32, memory_mib: u64) -> String {
    format!("NR_CPUS={vcpus}\nMEMSIZE={memory_mib}\nMEMLIMIT={memory_mib}\n")
}

/// Reads the kernel file at `path`: its bytes when it is for this loader ([`is_multiboot`]),
/// None when it is for the Linux one.
pub fn probe(path: &Path) -> Result<Option<Vec<u8>>, MultibootError> {
    let image = std::fs::read(path).map_err(|source| MultibootError::Read {
        path: path.into(),
        source,
    })?;
    Ok(is_multiboot(&image).then_some(image))
}

/// Checks the header and the ELF32, copies its segments, writes the command line, the module
/// and the information block.
pub fn load(
    mem: &GuestMemoryMmap,
    image: &[u8],
    info: &BootInfo<'_>,
) -> Result<Loaded, MultibootError> {
    let ram_end = mem.last_addr().raw_value() + 1;
    let segments = check(image, ram_end)?;
    if info.cmdline.len() >= CMDLINE_MAX_SIZE {
        return Err(MultibootError::CmdlineTooLong(info.cmdline.len()));
    }
    if info.module.len() > MULTIBOOT_MODULE_MAX {
        return Err(MultibootError::ModuleTooLarge(info.module.len()));
    }
    for s in &segments.load {
        let bytes = &image[s.offset as usize..(s.offset + s.filesz) as usize];
        mem.write_slice(bytes, GuestAddress(s.paddr))?;
        let zeros = vec![0u8; (s.memsz - s.filesz) as usize];
        mem.write_slice(&zeros, GuestAddress(s.paddr + s.filesz))?;
    }
    write_info(mem, info, ram_end)?;
    Ok(Loaded {
        entry: segments.entry,
        info: MULTIBOOT_INFO_ADDR as u32,
        kernel_end: segments.end,
    })
}

/// One PT_LOAD segment, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    offset: u64,
    filesz: u64,
    memsz: u64,
    vaddr: u64,
    paddr: u64,
}

#[derive(Debug)]
struct Segments {
    load: Vec<Segment>,
    /// Physical entry point.
    entry: u32,
    end: u64,
}

/// Everything about the file that can be refused, before guest memory is touched.
fn check(image: &[u8], ram_end: u64) -> Result<Segments, MultibootError> {
    let elf32 = image.starts_with(b"\x7fELF") && image.get(4) == Some(&1);
    let header = find_header(image);
    let header = match (header, elf32) {
        (Some(h), true) => h,
        (Some(_), false) => return Err(MultibootError::NotElf32),
        (None, _) => return Err(MultibootError::NoHeader),
    };
    let required = header.flags & 0xffff & !header_flags::SUPPORTED_REQUIREMENTS;
    if required != 0 {
        return Err(MultibootError::UnsupportedFlags(required));
    }
    let h = ElfHeader::parse(image)?;
    let mut load = Vec::new();
    for index in 0..usize::from(h.phnum) {
        let at = h.phoff as usize + index * ELF_PHDR_LEN;
        let word = |i: usize| le32(image, at + 4 * i).map(u64::from);
        let (Some(kind), Some(offset), Some(vaddr), Some(paddr), Some(filesz), Some(memsz)) =
            (word(0), word(1), word(2), word(3), word(4), word(5))
        else {
            return Err(MultibootError::BadElf(
                "program headers run past the end of the file",
            ));
        };
        if kind != u64::from(PT_LOAD) || memsz == 0 {
            continue;
        }
        if offset + filesz > image.len() as u64 {
            return Err(MultibootError::SegmentOutsideFile {
                index,
                offset,
                filesz,
                file_len: image.len(),
            });
        }
        if filesz > memsz {
            return Err(MultibootError::SegmentFileLargerThanMemory {
                index,
                filesz,
                memsz,
            });
        }
        // u32 fields: the sums fit in u64.
        let end = paddr + memsz;
        if paddr < HIMEM_START || end > ram_end {
            return Err(MultibootError::SegmentOutsideRam {
                index,
                start: paddr,
                end,
                ram_end,
            });
        }
        load.push(Segment {
            offset,
            filesz,
            memsz,
            vaddr,
            paddr,
        });
    }
    if load.is_empty() {
        return Err(MultibootError::NoLoadSegment);
    }
    // e_entry is virtual: translate it through the segment that holds it (GRUB does the same).
    let entry = u64::from(h.entry);
    let entry = load
        .iter()
        .find(|s| (s.vaddr..s.vaddr + s.memsz).contains(&entry))
        .map(|s| entry - s.vaddr + s.paddr)
        .ok_or(MultibootError::EntryOutsideSegments(h.entry))?;
    let end = load.iter().map(|s| s.paddr + s.memsz).max().unwrap_or(0);
    Ok(Segments {
        load,
        entry: entry as u32,
        end,
    })
}

/// The ELF32 file header fields the loader uses, checked.
struct ElfHeader {
    entry: u32,
    phoff: u32,
    phnum: u16,
}

impl ElfHeader {
    fn parse(image: &[u8]) -> Result<Self, MultibootError> {
        let bad = MultibootError::BadElf;
        if image.len() < ELF_HEADER_LEN {
            return Err(bad("shorter than an ELF32 header"));
        }
        if image[5] != 1 {
            return Err(bad("not little-endian"));
        }
        let half = |at: usize| u16::from_le_bytes([image[at], image[at + 1]]);
        let word = |at: usize| le32(image, at).unwrap_or(0);
        if half(16) != ET_EXEC {
            return Err(bad("not an executable (e_type is not ET_EXEC)"));
        }
        if half(18) != EM_386 {
            return Err(bad("not an i386 file (e_machine is not EM_386)"));
        }
        let (entry, phoff, phentsize, phnum) = (word(24), word(28), half(42), half(44));
        if phentsize as usize != ELF_PHDR_LEN {
            return Err(bad("e_phentsize is not 32"));
        }
        if phnum == 0 || phnum > MAX_PHDRS {
            return Err(bad("no program headers, or more than 64"));
        }
        let table_end = u64::from(phoff) + u64::from(phnum) * ELF_PHDR_LEN as u64;
        if table_end > image.len() as u64 {
            return Err(bad("program headers run past the end of the file"));
        }
        Ok(ElfHeader {
            entry,
            phoff,
            phnum,
        })
    }
}

fn le32(image: &[u8], at: usize) -> Option<u32> {
    let bytes = image.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// The command line, the module, the memory map, the loader name and the information block.
fn write_info(
    mem: &GuestMemoryMmap,
    info: &BootInfo<'_>,
    ram_end: u64,
) -> Result<(), MultibootError> {
    let cstr = |s: &str| [s.as_bytes(), &[0]].concat();
    mem.write_slice(&cstr(info.cmdline), GuestAddress(CMDLINE_ADDR))?;
    mem.write_slice(info.module, GuestAddress(MULTIBOOT_MODULE_ADDR))?;
    let base = MULTIBOOT_INFO_ADDR;
    mem.write_slice(&cstr(LOADER_NAME), GuestAddress(base + LOADER_NAME_OFFSET))?;
    mem.write_slice(
        &cstr(MODULE_STRING),
        GuestAddress(base + MODULE_STRING_OFFSET),
    )?;
    // The module list: start, end (exclusive), string, reserved.
    let module_end = MULTIBOOT_MODULE_ADDR + info.module.len() as u64;
    let module = [
        MULTIBOOT_MODULE_ADDR as u32,
        module_end as u32,
        (base + MODULE_STRING_OFFSET) as u32,
        0,
    ];
    mem.write_slice(&words(&module), GuestAddress(base + MODS_OFFSET))?;
    let mmap = memory_map(ram_end);
    mem.write_slice(&mmap, GuestAddress(base + MMAP_OFFSET))?;

    let mut block = [0u32; INFO_SIZE / 4];
    block[0] = info_flags::MEMORY
        | info_flags::CMDLINE
        | info_flags::MODS
        | info_flags::MMAP
        | info_flags::LOADER_NAME;
    block[1] = (EBDA_START / 1024) as u32; // mem_lower, KiB from 0
    block[2] = ((ram_end - HIMEM_START) / 1024) as u32; // mem_upper, KiB from 1 MiB
    block[4] = CMDLINE_ADDR as u32;
    block[5] = 1; // mods_count
    block[6] = (base + MODS_OFFSET) as u32;
    block[11] = mmap.len() as u32; // mmap_length
    block[12] = (base + MMAP_OFFSET) as u32;
    block[16] = (base + LOADER_NAME_OFFSET) as u32;
    mem.write_slice(&words(&block), GuestAddress(base))?;
    Ok(())
}

/// The memory map (spec 3.3: each entry is size (20, not counting itself), base, length, type):
/// low RAM, the EBDA/ROM hole, RAM from 1 MiB — the same map the Linux boot gets as e820.
fn memory_map(ram_end: u64) -> Vec<u8> {
    let entries = [
        (0, EBDA_START, MMAP_RAM),
        (EBDA_START, HIMEM_START - EBDA_START, MMAP_RESERVED),
        (HIMEM_START, ram_end - HIMEM_START, MMAP_RAM),
    ];
    let mut out = Vec::new();
    for (base, len, kind) in entries {
        out.extend_from_slice(&MMAP_ENTRY_SIZE.to_le_bytes());
        out.extend_from_slice(&base.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
    }
    out
}

fn words(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAM: usize = 32 << 20;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM)]).unwrap()
    }

    fn header(flags: u32) -> [u8; 12] {
        let checksum = 0u32.wrapping_sub(HEADER_MAGIC).wrapping_sub(flags);
        let mut h = [0u8; 12];
        h[..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        h[4..8].copy_from_slice(&flags.to_le_bytes());
        h[8..].copy_from_slice(&checksum.to_le_bytes());
        h
    }

    /// An ELF32 i386 executable: one PT_LOAD of `code` (+ `bss` zero bytes) at `paddr`, the
    /// Multiboot header at the start of the code, entry 12 bytes in (after the header).
    fn elf(paddr: u32, code: &[u8], bss: u32, flags: u32) -> Vec<u8> {
        let mut f = vec![0u8; 0x100];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 1; // ELFCLASS32
        f[5] = 1; // little-endian
        f[6] = 1;
        f[16..18].copy_from_slice(&ET_EXEC.to_le_bytes());
        f[18..20].copy_from_slice(&EM_386.to_le_bytes());
        f[24..28].copy_from_slice(&(paddr + 12).to_le_bytes());
        f[28..32].copy_from_slice(&52u32.to_le_bytes()); // e_phoff
        f[42..44].copy_from_slice(&32u16.to_le_bytes());
        f[44..46].copy_from_slice(&1u16.to_le_bytes());
        let filesz = 12 + code.len() as u32;
        let ph = [
            PT_LOAD,
            0x100,
            paddr,
            paddr,
            filesz,
            filesz + bss,
            5,
            0x1000,
        ];
        f[52..84].copy_from_slice(&words(&ph));
        f.extend_from_slice(&header(flags));
        f.extend_from_slice(code);
        f
    }

    fn set_phdr_word(f: &mut [u8], i: usize, v: u32) {
        f[52 + 4 * i..56 + 4 * i].copy_from_slice(&v.to_le_bytes());
    }

    fn info() -> BootInfo<'static> {
        BootInfo {
            cmdline: "tiny.elf exit=3",
            module: b"NR_CPUS=1\nMEMSIZE=32\n",
        }
    }

    fn read32(m: &GuestMemoryMmap, a: u64) -> u32 {
        m.read_obj(GuestAddress(a)).unwrap()
    }

    #[test]
    fn the_header_is_found_only_with_a_good_checksum_and_alignment() {
        let mut f = vec![0u8; 64];
        f[16..28].copy_from_slice(&header(3));
        assert_eq!(
            find_header(&f),
            Some(Header {
                offset: 16,
                flags: 3
            })
        );
        f[24] ^= 1; // checksum off by one
        assert_eq!(find_header(&f), None);
        let mut g = vec![0u8; 64];
        g[18..30].copy_from_slice(&header(3)); // not 4-byte aligned
        assert_eq!(find_header(&g), None);
        let mut far = vec![0u8; SEARCH_LEN + 64];
        far[SEARCH_LEN..SEARCH_LEN + 12].copy_from_slice(&header(0));
        assert_eq!(find_header(&far), None, "beyond the first 8 KiB");
        assert_eq!(find_header(&header(0)[..11]), None, "truncated");
    }

    #[test]
    fn elf32_goes_here_elf64_and_bzimage_go_to_linux() {
        let f = elf(0x10_0000, &[0xf4], 0, 0);
        assert!(is_multiboot(&f));
        let mut elf64 = f.clone();
        elf64[4] = 2;
        assert!(!is_multiboot(&elf64));
        assert!(!is_multiboot(b"MZ\0\0 a bzImage"));
        assert!(!is_multiboot(b"nothing"));
        let mut raw = vec![0u8; 32];
        raw[..12].copy_from_slice(&header(1 << 16));
        assert!(
            is_multiboot(&raw),
            "a non-ELF with a header is refused here"
        );
        let m = mem();
        assert!(matches!(
            load(&m, &raw, &info()),
            Err(MultibootError::NotElf32)
        ));
    }

    #[test]
    fn a_good_kernel_is_loaded_with_its_info_block() {
        let m = mem();
        let f = elf(0x20_0000, &[0x90, 0xf4], 0x1000, 3);
        let l = load(&m, &f, &info()).unwrap();
        assert_eq!(l.entry, 0x20_000c);
        assert_eq!(l.info, MULTIBOOT_INFO_ADDR as u32);
        assert_eq!(l.kernel_end, 0x20_0000 + 14 + 0x1000);
        let b: u8 = m.read_obj(GuestAddress(0x20_000d)).unwrap();
        assert_eq!(b, 0xf4);
        let i = MULTIBOOT_INFO_ADDR;
        assert_eq!(
            read32(&m, i),
            0x24d,
            "mem, cmdline, mods, mmap, loader name"
        );
        assert_eq!(read32(&m, i + 4), 639);
        assert_eq!(read32(&m, i + 8), (RAM as u32 - 0x10_0000) / 1024);
        let cmdline = read32(&m, i + 16) as u64;
        let mut s = [0u8; 16];
        m.read_slice(&mut s, GuestAddress(cmdline)).unwrap();
        assert_eq!(&s, b"tiny.elf exit=3\0");
        assert_eq!(read32(&m, i + 20), 1, "one module");
        let mods = read32(&m, i + 24) as u64;
        let (start, end) = (read32(&m, mods), read32(&m, mods + 4));
        assert_eq!(start % 4096, 0, "page-aligned");
        let mut env = vec![0u8; (end - start) as usize];
        m.read_slice(&mut env, GuestAddress(start.into())).unwrap();
        assert_eq!(env, info().module);
        let (len, map) = (read32(&m, i + 44), read32(&m, i + 48) as u64);
        assert_eq!(len, 72, "three entries of 24 bytes");
        let last_len: u64 = m.read_obj(GuestAddress(map + 48 + 12)).unwrap();
        assert_eq!(last_len, RAM as u64 - 0x10_0000);
    }

    #[test]
    fn the_bss_is_zeroed() {
        let m = mem();
        m.write_slice(&[0xaa; 64], GuestAddress(0x20_0010)).unwrap();
        load(&m, &elf(0x20_0000, &[0xf4], 64, 0), &info()).unwrap();
        let mut bss = [0xffu8; 64];
        m.read_slice(&mut bss, GuestAddress(0x20_000d)).unwrap();
        assert_eq!(bss, [0; 64]);
    }

    #[test]
    fn env_names_cpus_and_memory_so_fw_cfg_is_never_read() {
        assert_eq!(
            kvm_unit_tests_env(2, 256),
            "NR_CPUS=2\nMEMSIZE=256\nMEMLIMIT=256\n"
        );
    }

    fn refused(f: &[u8]) -> MultibootError {
        let m = mem();
        let before = read32(&m, MULTIBOOT_INFO_ADDR);
        let err = load(&m, f, &info()).expect_err("must be refused");
        assert_eq!(read32(&m, MULTIBOOT_INFO_ADDR), before, "nothing written");
        err
    }

    #[test]
    fn hostile_files_are_refused_with_the_field_named() {
        let good = elf(0x20_0000, &[0xf4], 0, 0);
        let no_header = {
            let mut f = good.clone();
            f[0x100] ^= 0xff;
            f
        };
        assert!(matches!(refused(&no_header), MultibootError::NoHeader));
        let video = elf(0x20_0000, &[0xf4], 0, header_flags::VIDEO_MODE);
        assert!(matches!(
            refused(&video),
            MultibootError::UnsupportedFlags(4)
        ));
        let mut big_endian = good.clone();
        big_endian[5] = 2;
        assert!(matches!(refused(&big_endian), MultibootError::BadElf(_)));
        let mut x86_64 = good.clone();
        x86_64[18] = 62;
        assert!(matches!(refused(&x86_64), MultibootError::BadElf(_)));
        let mut many = good.clone();
        many[44..46].copy_from_slice(&5000u16.to_le_bytes());
        assert!(matches!(refused(&many), MultibootError::BadElf(_)));
        let mut past_end = good.clone();
        past_end[28..32].copy_from_slice(&(good.len() as u32 - 8).to_le_bytes());
        assert!(matches!(refused(&past_end), MultibootError::BadElf(_)));
        let mut outside_file = good.clone();
        set_phdr_word(&mut outside_file, 4, 0xffff_ff00);
        set_phdr_word(&mut outside_file, 5, 0xffff_ff00);
        assert!(matches!(
            refused(&outside_file),
            MultibootError::SegmentOutsideFile { index: 0, .. }
        ));
        let mut file_gt_mem = good.clone();
        set_phdr_word(&mut file_gt_mem, 5, 1);
        assert!(matches!(
            refused(&file_gt_mem),
            MultibootError::SegmentFileLargerThanMemory { .. }
        ));
        let beyond_ram = elf(RAM as u32 - 8, &[0xf4], 0, 0);
        assert!(matches!(
            refused(&beyond_ram),
            MultibootError::SegmentOutsideRam { .. }
        ));
        let wraps = elf(0xffff_fff0, &[0xf4], 0x100, 0);
        assert!(matches!(
            refused(&wraps),
            MultibootError::SegmentOutsideRam { .. }
        ));
        let low = elf(0x7000, &[0xf4], 0, 0);
        let err = refused(&low);
        assert!(
            err.to_string().contains("outside the kernel's RAM"),
            "{err}"
        );
        let mut bad_entry = good.clone();
        bad_entry[24..28].copy_from_slice(&0x1234u32.to_le_bytes());
        assert!(matches!(
            refused(&bad_entry),
            MultibootError::EntryOutsideSegments(0x1234)
        ));
        let mut no_load = good.clone();
        set_phdr_word(&mut no_load, 0, 4); // PT_NOTE
        assert!(matches!(refused(&no_load), MultibootError::NoLoadSegment));
        assert!(matches!(refused(&good[..40]), MultibootError::NoHeader));
    }

    #[test]
    fn oversized_cmdline_and_module_are_refused() {
        let m = mem();
        let f = elf(0x20_0000, &[0xf4], 0, 0);
        let long = "x".repeat(CMDLINE_MAX_SIZE);
        let i = BootInfo {
            cmdline: &long,
            module: b"",
        };
        assert!(matches!(
            load(&m, &f, &i),
            Err(MultibootError::CmdlineTooLong(_))
        ));
        let big = vec![b'a'; MULTIBOOT_MODULE_MAX + 1];
        let i = BootInfo {
            cmdline: "k",
            module: &big,
        };
        assert!(matches!(
            load(&m, &f, &i),
            Err(MultibootError::ModuleTooLarge(_))
        ));
    }
}
