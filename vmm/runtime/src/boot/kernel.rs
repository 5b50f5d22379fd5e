//! Loading the guest kernel (ELF vmlinux, or the vmlinux inside a bzImage), the initramfs and
//! the command line, and writing the zero page (boot_params) for the 64-bit boot protocol.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::loader::{elf::Elf, KernelLoader};
use vm_memory::{Address, ByteValued, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::layout::*;
use analysis::bzimage::{self, BzImageError};

const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448; // "HdrS"
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT: u32 = 0x0100_0000;
/// Highest address the initramfs may end at when the kernel does not say (boot protocol < 2.03).
const DEFAULT_INITRD_ADDR_MAX: u64 = 0x37ff_ffff;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("cannot read kernel {path}: {source}")]
    ReadKernel {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read initrd {path}: {source}")]
    ReadInitrd {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a kernel: neither an ELF vmlinux nor a bzImage")]
    NotAKernel { path: PathBuf },
    #[error("{path}: {source}")]
    BzImage { path: PathBuf, source: BzImageError },
    #[error("{path}: cannot load the ELF kernel: {source}")]
    Elf {
        path: PathBuf,
        source: linux_loader::loader::Error,
    },
    #[error("initrd {path} ({size} bytes) does not fit in guest memory between the kernel end {kernel_end:#x} and {limit:#x}; give more --memory")]
    InitrdTooLarge {
        path: PathBuf,
        size: u64,
        kernel_end: u64,
        limit: u64,
    },
    #[error("kernel command line is {0} bytes; the limit is {CMDLINE_MAX_SIZE}")]
    CmdlineTooLong(usize),
    #[error("writing guest memory: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
}

/// Where things ended up in guest memory.
#[derive(Debug, Clone)]
pub struct LoadedKernel {
    /// 64-bit entry point (physical).
    pub entry: GuestAddress,
    /// First byte after the highest loaded segment.
    pub kernel_end: u64,
    /// The ELF image as loaded (kept for symbol lookup and text patching by later stages).
    pub elf: Vec<u8>,
    /// Which compression the bzImage payload used, if the kernel was a bzImage.
    pub compression: Option<&'static str>,
    pub initrd: Option<(GuestAddress, u64)>,
}

/// A kernel file as read: the vmlinux ELF, plus what the bzImage wrapper said if there was one.
pub struct KernelImage {
    pub elf: Vec<u8>,
    /// The bzImage's setup header bytes (from 0x1f1).
    pub setup_header: Option<Vec<u8>>,
    /// The payload compression undone, for a bzImage.
    pub compression: Option<&'static str>,
}

/// Reads the kernel file; a bzImage's vmlinux is extracted and decompressed.
pub fn read_kernel(path: &Path) -> Result<KernelImage, KernelError> {
    let image = std::fs::read(path).map_err(|source| KernelError::ReadKernel {
        path: path.into(),
        source,
    })?;
    if image.starts_with(b"\x7fELF") {
        return Ok(KernelImage {
            elf: image,
            setup_header: None,
            compression: None,
        });
    }
    if bzimage::is_bzimage(&image) {
        let t = std::time::Instant::now();
        let x = bzimage::extract(&image).map_err(|source| KernelError::BzImage {
            path: path.into(),
            source,
        })?;
        log::info!(
            "extracted {} bytes of vmlinux from {} ({} payload) in {:.1} ms",
            x.vmlinux.len(),
            path.display(),
            x.compression,
            t.elapsed().as_secs_f64() * 1e3
        );
        return Ok(KernelImage {
            elf: x.vmlinux,
            setup_header: Some(x.setup_header),
            compression: Some(x.compression),
        });
    }
    Err(KernelError::NotAKernel { path: path.into() })
}

/// Loads kernel, initrd and command line into guest memory and writes the zero page.
pub fn load(
    mem: &GuestMemoryMmap,
    kernel_path: &Path,
    initrd_path: Option<&Path>,
    cmdline: &str,
    rsdp: Option<GuestAddress>,
) -> Result<LoadedKernel, KernelError> {
    let KernelImage {
        elf,
        setup_header: setup,
        compression,
    } = read_kernel(kernel_path)?;
    let res = Elf::load(
        mem,
        None,
        &mut Cursor::new(&elf),
        Some(GuestAddress(HIMEM_START)),
    )
    .map_err(|source| KernelError::Elf {
        path: kernel_path.into(),
        source,
    })?;
    let kernel_end = res.kernel_end;

    let mut params = boot_params::default();
    if let Some(raw) = &setup {
        // Start from the kernel's own setup header (as a boot loader does), then fill ours in.
        let n = raw.len().min(std::mem::size_of::<setup_header>());
        params.hdr.as_mut_slice()[..n].copy_from_slice(&raw[..n]);
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    params.hdr.header = KERNEL_HDR_MAGIC;
    params.hdr.kernel_alignment = params.hdr.kernel_alignment.max(KERNEL_MIN_ALIGNMENT);

    if cmdline.len() >= CMDLINE_MAX_SIZE {
        return Err(KernelError::CmdlineTooLong(cmdline.len()));
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))?;
    params.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    params.hdr.cmdline_size = bytes.len() as u32;

    let ram_end = mem.last_addr().raw_value() + 1;
    let mut initrd = None;
    if let Some(path) = initrd_path {
        let data = std::fs::read(path).map_err(|source| KernelError::ReadInitrd {
            path: path.into(),
            source,
        })?;
        let size = data.len() as u64;
        let max = match params.hdr.initrd_addr_max {
            0 => DEFAULT_INITRD_ADDR_MAX,
            m => m as u64,
        };
        let limit = ram_end.min(max + 1);
        let addr = limit
            .checked_sub(size)
            .map(|a| a & !0xfff)
            .filter(|&a| a >= kernel_end.next_multiple_of(0x1000));
        let Some(addr) = addr else {
            return Err(KernelError::InitrdTooLarge {
                path: path.into(),
                size,
                kernel_end,
                limit,
            });
        };
        mem.write_slice(&data, GuestAddress(addr))?;
        params.hdr.ramdisk_image = addr as u32;
        params.hdr.ramdisk_size = size as u32;
        initrd = Some((GuestAddress(addr), size));
    }

    let e820 = [
        (0, EBDA_START, E820_RAM),
        (EBDA_START, HIMEM_START - EBDA_START, E820_RESERVED),
        (HIMEM_START, ram_end - HIMEM_START, E820_RAM),
    ];
    for (i, (addr, size, kind)) in e820.into_iter().enumerate() {
        params.e820_table[i] = boot_e820_entry {
            addr,
            size,
            r#type: kind,
        };
    }
    params.e820_entries = e820.len() as u8;
    if let Some(rsdp) = rsdp {
        params.acpi_rsdp_addr = rsdp.raw_value();
    }
    mem.write_obj(params, GuestAddress(ZERO_PAGE_ADDR))?;

    Ok(LoadedKernel {
        entry: res.kernel_load,
        kernel_end,
        elf,
        compression,
        initrd,
    })
}
