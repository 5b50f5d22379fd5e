//! RDPMC service.
//!
//! A guest kernel's perf driver reads its counters with RDPMC. KVM executes RDPMC itself (from
//! KVM's own PMU, or, on this workplace's host, by injecting #GP): a user-space vPMU never sees
//! it. So, after the kernel is in guest memory and before the first KVM_RUN, the VMM
//!
//! 1. finds every RDPMC (`0F 33`) in the kernel's executable sections with a real x86 decoder
//!    ([`find_sites`]) and checks each is an instruction of a function (decoded from the
//!    function's first byte when the ELF has symbols);
//! 2. rewrites it to RDMSR (`0F 32`): same length, same registers (ECX in, EDX:EAX out) — [`patch`];
//! 3. lets the MSR filter send the RDPMC index encodings (as MSR numbers) to user space, where
//!    [`RdpmcSites::is_site`] tells a rewritten RDPMC (answered from the vPMU) from a genuine RDMSR
//!    of the same MSR number (answered by KVM as before, through KVM_GET_MSRS).
//!
//! Not covered: RDPMC executed by guest *user* code (CR4.PCE; perf's self-monitoring mmap page)
//! and code the guest writes or loads later (modules): `--rdpmc trap` ([`super::rdpmc_trap`])
//! serves those, with no patching, through the guest's #GP handler; `--rdpmc auto` uses it when
//! this module refuses a site.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;

use iced_x86::{Code, Decoder, DecoderOptions, Instruction};
use object::elf;
use object::read::elf::{ElfFile64, ProgramHeader};
use object::{Endianness, Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub const RDPMC: [u8; 2] = [0x0f, 0x33];
pub const RDMSR: [u8; 2] = [0x0f, 0x32];

/// More RDPMC sites than this means the search is looking at something that is not a kernel.
const MAX_SITES: usize = 64;
/// Without symbols: how many bytes before a site decoding is restarted from (one start per byte).
const RESYNC_WINDOW: u64 = 48;

/// One RDPMC in the guest kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// Where the guest executes it (the RIP of its exit).
    pub vaddr: u64,
    /// Where it is in guest memory.
    pub paddr: u64,
    /// The function it belongs to, when the ELF has symbols.
    pub function: Option<String>,
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.vaddr)?;
        if let Some(name) = &self.function {
            write!(f, " ({name})")?;
        }
        Ok(())
    }
}

/// Why an RDPMC the decoder found cannot be proven to be an instruction the guest executes
/// (so rewriting its bytes could corrupt something else).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotProvable {
    #[error("the decoder found an RDPMC with a prefix (not rewritable in place)")]
    Prefixed,
    #[error("{0} starts outside its section")]
    FunctionOutsideSection(String),
    #[error("decoding {0} from its start does not reach it as an instruction")]
    NotReachedFrom(String),
    #[error("no symbols, and only {hits} of {starts} decodings from the bytes before it reach it")]
    FewDecodingsReach { hits: u64, starts: u64 },
}

#[derive(Debug, thiserror::Error)]
pub enum RdpmcError {
    #[error("reading the kernel ELF: {0}")]
    Elf(#[from] object::Error),
    #[error("the kernel is not a 64-bit x86 ELF")]
    NotX86_64,
    #[error("RDPMC at {site} cannot be patched safely: {why}. Run with --rdpmc trap (every guest RDPMC served through its #GP handler, no patching) or --rdpmc off (the guest's RDPMC then faults on hosts whose KVM does not serve it)")]
    Unsafe { site: Site, why: NotProvable },
    #[error("{0} RDPMC instructions found (more than {MAX_SITES}): this does not look like a kernel's text; run with --rdpmc trap or --rdpmc off")]
    TooMany(usize),
    #[error("code at {vaddr:#x} ({len:#x} bytes) wraps past the top of the address space")]
    WrapsAddressSpace { vaddr: u64, len: usize },
    #[error("RDPMC at {site}: its address is in no loadable segment")]
    NoSegment { site: Site },
    #[error(
        "guest memory at {paddr:#x} holds {found:02x?}, not the RDPMC the kernel ELF has there"
    )]
    NotLoaded { paddr: u64, found: [u8; 2] },
    #[error("guest memory at {paddr:#x}: {source}")]
    Memory {
        paddr: u64,
        source: vm_memory::GuestMemoryError,
    },
}

impl RdpmcError {
    /// The error came before any byte of guest memory was rewritten (the sites were refused or
    /// could not be found), so the guest can still be served another way (`--rdpmc auto`).
    pub(crate) fn nothing_patched(&self) -> bool {
        !matches!(
            self,
            RdpmcError::NotLoaded { .. } | RdpmcError::Memory { .. }
        )
    }
}

/// A run of executable bytes at a guest-virtual address.
struct CodeRegion<'a> {
    vaddr: u64,
    bytes: &'a [u8],
}

impl CodeRegion<'_> {
    /// Its addresses must not wrap past 2^64 (the decoder's would, and the offsets with them).
    fn fits(&self) -> Result<(), RdpmcError> {
        match self.vaddr.checked_add(self.bytes.len() as u64) {
            Some(_) => Ok(()),
            None => Err(RdpmcError::WrapsAddressSpace {
                vaddr: self.vaddr,
                len: self.bytes.len(),
            }),
        }
    }
}

/// A function symbol.
struct Function {
    start: u64,
    end: u64,
    name: String,
}

/// Finds the RDPMC instructions in a kernel ELF (vmlinux, or the one extracted from a bzImage).
pub fn find_sites(elf_bytes: &[u8]) -> Result<Vec<Site>, RdpmcError> {
    let file = ElfFile64::<Endianness>::parse(elf_bytes)?;
    if file.architecture() != object::Architecture::X86_64 {
        return Err(RdpmcError::NotX86_64);
    }
    let mut code = Vec::new();
    for s in file.sections() {
        if s.kind() == SectionKind::Text && s.size() > 0 {
            code.push(CodeRegion {
                vaddr: s.address(),
                bytes: s.data()?,
            });
        }
    }
    let endian = file.endian();
    let segments: Vec<(u64, u64, u64)> = file
        .elf_program_headers()
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD)
        .map(|p| (p.p_vaddr(endian), p.p_memsz(endian), p.p_paddr(endian)))
        .collect();
    if code.is_empty() {
        // No section headers: fall back to the executable segments.
        for p in file.elf_program_headers() {
            if p.p_type(endian) == elf::PT_LOAD && p.p_flags(endian) & elf::PF_X != 0 {
                let off = p.p_offset(endian) as usize;
                let len = p.p_filesz(endian) as usize;
                if let Some(bytes) = off.checked_add(len).and_then(|end| elf_bytes.get(off..end)) {
                    code.push(CodeRegion {
                        vaddr: p.p_vaddr(endian),
                        bytes,
                    });
                }
            }
        }
    }
    let mut functions: Vec<Function> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .filter_map(|s| {
            Some(Function {
                start: s.address(),
                end: s.address().checked_add(s.size())?,
                name: s.name().ok()?.to_string(),
            })
        })
        .collect();
    functions.sort_by_key(|f| f.start);

    let mut sites = Vec::new();
    for region in &code {
        region.fits()?;
        for vaddr in scan(region.bytes, region.vaddr) {
            let function = containing(&functions, vaddr);
            let mut site = Site {
                vaddr,
                paddr: 0,
                function: function.map(|f| f.name.clone()),
            };
            check(region, function, vaddr).map_err(|why| RdpmcError::Unsafe {
                site: site.clone(),
                why,
            })?;
            site.paddr = segments
                .iter()
                .find(|(v, len, _)| vaddr >= *v && vaddr - v < *len)
                .and_then(|(v, _, p)| p.checked_add(vaddr - v))
                .ok_or_else(|| RdpmcError::NoSegment { site: site.clone() })?;
            sites.push(site);
        }
    }
    if sites.len() > MAX_SITES {
        return Err(RdpmcError::TooMany(sites.len()));
    }
    Ok(sites)
}

/// Finds RDPMC in a flat binary loaded at `base` (identity-mapped: tiny test guests). No symbols:
/// each site is checked by re-decoding from the bytes before it.
pub fn find_sites_flat(bytes: &[u8], base: u64) -> Result<Vec<Site>, RdpmcError> {
    let region = CodeRegion { vaddr: base, bytes };
    region.fits()?;
    let mut sites = Vec::new();
    for vaddr in scan(bytes, base) {
        let site = Site {
            vaddr,
            paddr: vaddr,
            function: None,
        };
        check(&region, None, vaddr).map_err(|why| RdpmcError::Unsafe {
            site: site.clone(),
            why,
        })?;
        sites.push(site);
    }
    Ok(sites)
}

/// Linear sweep: the addresses of the RDPMC instructions.
fn scan(bytes: &[u8], vaddr: u64) -> Vec<u64> {
    let mut decoder = Decoder::with_ip(64, bytes, vaddr, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    let mut found = Vec::new();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if instr.code() == Code::Rdpmc {
            found.push(instr.ip());
        }
    }
    found
}

fn containing(functions: &[Function], vaddr: u64) -> Option<&Function> {
    let i = functions.partition_point(|f| f.start <= vaddr);
    functions[..i].iter().rev().find(|f| vaddr < f.end)
}

/// Whether decoding from `start` lands on `target` as an instruction boundary.
fn lands_on(region: &CodeRegion<'_>, start: u64, target: u64) -> bool {
    let from = (start - region.vaddr) as usize;
    let mut decoder = Decoder::with_ip(64, &region.bytes[from..], start, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while decoder.can_decode() && decoder.ip() < target {
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            return false;
        }
    }
    decoder.ip() == target
}

/// Is the RDPMC at `vaddr` certainly an instruction? With a function symbol: decoding the function
/// from its first byte must reach it. Without (a bzImage's vmlinux has no symbol table): the
/// linear sweep from the start of its executable section reached it, and decoding restarted from
/// each of the [`RESYNC_WINDOW`] bytes before it must land on it at least half the time (x86
/// decoding re-synchronises within a few instructions; 64-bit immediates delay it).
fn check(
    region: &CodeRegion<'_>,
    function: Option<&Function>,
    vaddr: u64,
) -> Result<(), NotProvable> {
    let offset = vaddr - region.vaddr;
    let site_bytes = &region.bytes[offset as usize..];
    if !site_bytes.starts_with(&RDPMC) {
        return Err(NotProvable::Prefixed);
    }
    if let Some(f) = function {
        if f.start < region.vaddr {
            return Err(NotProvable::FunctionOutsideSection(f.name.clone()));
        }
        if !lands_on(region, f.start, vaddr) {
            return Err(NotProvable::NotReachedFrom(f.name.clone()));
        }
        return Ok(());
    }
    let first = vaddr.saturating_sub(RESYNC_WINDOW).max(region.vaddr);
    let starts = vaddr - first;
    if starts == 0 {
        return Ok(());
    }
    let hits = (first..vaddr)
        .filter(|&s| lands_on(region, s, vaddr))
        .count() as u64;
    if hits * 2 < starts {
        return Err(NotProvable::FewDecodingsReach { hits, starts });
    }
    Ok(())
}

/// Rewrites each site's RDPMC to RDMSR in guest memory (after checking the bytes are there).
pub fn patch(mem: &GuestMemoryMmap, sites: &[Site]) -> Result<(), RdpmcError> {
    for s in sites {
        let mut found = [0u8; 2];
        mem.read_slice(&mut found, GuestAddress(s.paddr))
            .map_err(|source| RdpmcError::Memory {
                paddr: s.paddr,
                source,
            })?;
        if found != RDPMC {
            return Err(RdpmcError::NotLoaded {
                paddr: s.paddr,
                found,
            });
        }
        mem.write_slice(&RDMSR, GuestAddress(s.paddr))
            .map_err(|source| RdpmcError::Memory {
                paddr: s.paddr,
                source,
            })?;
    }
    Ok(())
}

/// What the MSR path needs at run time: which MSR numbers are RDPMC indexes, and which RIPs are
/// rewritten RDPMCs.
#[derive(Debug, Clone, Default)]
pub struct RdpmcSites {
    indexes: Vec<RangeInclusive<u32>>,
    rips: BTreeSet<u64>,
}

impl RdpmcSites {
    pub fn new(indexes: Vec<RangeInclusive<u32>>, sites: &[Site]) -> Self {
        RdpmcSites {
            indexes,
            rips: sites.iter().map(|s| s.vaddr).collect(),
        }
    }

    /// Is this MSR number also an RDPMC index (so its exits need the RIP check)?
    pub fn is_index(&self, msr: u32) -> bool {
        self.indexes.iter().any(|r| r.contains(&msr))
    }

    /// Is this RIP a rewritten RDPMC?
    pub(crate) fn is_site(&self, rip: u64) -> bool {
        self.rips.contains(&rip)
    }

    pub fn len(&self) -> usize {
        self.rips.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rips.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // mov ecx, 1; rdpmc; shl rdx, 32; or rax, rdx; ret
    const FUNC: &[u8] = &[
        0xb9, 0x01, 0x00, 0x00, 0x00, 0x0f, 0x33, 0x48, 0xc1, 0xe2, 0x20, 0x48, 0x09, 0xd0, 0xc3,
    ];

    fn nops(n: usize) -> Vec<u8> {
        vec![0x90; n]
    }

    #[test]
    fn flat_finds_the_rdpmc_after_code() {
        let mut code = nops(100);
        code.extend_from_slice(FUNC);
        let sites = find_sites_flat(&code, 0x1000).unwrap();
        assert_eq!(sites.len(), 1);
        assert_eq!(sites[0].vaddr, 0x1000 + 105);
        assert_eq!(sites[0].paddr, 0x1000 + 105);
    }

    #[test]
    fn rdpmc_bytes_inside_another_instruction_are_not_sites() {
        // mov eax, 0x00330f00: the bytes 0f 33 are an immediate, not an instruction.
        let mut code = nops(60);
        code.extend_from_slice(&[0xb8, 0x00, 0x0f, 0x33, 0x00, 0xc3]);
        assert!(find_sites_flat(&code, 0).unwrap().is_empty());
    }

    #[test]
    fn an_ambiguous_site_is_refused() {
        // Bytes before the RDPMC that decode differently from each start byte: movabs with
        // 8-byte immediates made of opcode bytes.
        let mut code = Vec::new();
        for _ in 0..12 {
            code.extend_from_slice(&[0x48, 0xb8, 0x48, 0xb8, 0x48, 0xb8, 0x48, 0xb8, 0x48, 0xb8]);
        }
        code.extend_from_slice(&RDPMC);
        code.push(0xc3);
        match find_sites_flat(&code, 0) {
            Err(RdpmcError::Unsafe { why, .. }) => {
                assert!(
                    matches!(why, NotProvable::FewDecodingsReach { .. }),
                    "{why}"
                )
            }
            other => {
                // Either refused, or every site found must decode from the start of the code.
                let sites = other.unwrap();
                let region = CodeRegion {
                    vaddr: 0,
                    bytes: &code,
                };
                for s in sites {
                    assert!(lands_on(&region, 0, s.vaddr));
                }
            }
        }
    }

    #[test]
    fn function_check_uses_the_symbol_start() {
        let mut code = nops(8);
        code.extend_from_slice(FUNC);
        let region = CodeRegion {
            vaddr: 0x100,
            bytes: &code,
        };
        let good = Function {
            start: 0x108,
            end: 0x108 + FUNC.len() as u64,
            name: "read_pmc".into(),
        };
        assert_eq!(check(&region, Some(&good), 0x10d), Ok(()));
        // A "function" starting inside the mov's immediate decodes to other instructions.
        let bad = Function {
            start: 0x10a,
            end: 0x108 + FUNC.len() as u64,
            name: "bogus".into(),
        };
        assert!(check(&region, Some(&bad), 0x10d).is_err());
    }

    #[test]
    fn sites_answer_by_index_and_rip() {
        let s = RdpmcSites::new(
            vec![0..=5],
            &[Site {
                vaddr: 0xffff_ffff_8100_0010,
                paddr: 0x100_0010,
                function: None,
            }],
        );
        assert!(s.is_index(0) && s.is_index(5) && !s.is_index(6));
        assert!(s.is_site(0xffff_ffff_8100_0010) && !s.is_site(0xffff_ffff_8100_0012));
    }

    #[test]
    fn not_an_elf_is_an_error() {
        assert!(matches!(
            find_sites(b"not an elf at all"),
            Err(RdpmcError::Elf(_))
        ));
    }
}
