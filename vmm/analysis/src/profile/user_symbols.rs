//! User-space symbols for the host-side profile (issue 19, "where in user space"): a sample's
//! executable (its file name and where its code was loaded, read from guest memory by
//! `profile::guest_task`) is found among the guest's files on the host, and the RIP resolved
//! with that ELF's own symbol table.
//!
//! The guest's files come as a directory that mirrors the guest's root (`report --guest-files
//! DIR`; `guest-image/build.sh rootfs` keeps one, `files/` beside the image, holding its ELF
//! files). A sample names only the executable's file name (the first 16 bytes and its length),
//! so the candidates are the files of that name; the one whose executable segments span
//! exactly `end_code - start_code` is taken (binfmt_elf sets start_code/end_code to the lowest
//! `p_vaddr` and the highest `p_vaddr + p_filesz` of the PF_X PT_LOAD segments, plus the load
//! bias), and a PIE's RIP is moved back by that bias. No candidate, or several that fit: the
//! sample stays unresolved and says which.
//!
//! Shared libraries: a sample whose RIP lies outside the executable's code also records the
//! mapping it lies in (`profile::guest_task::maps`: the VMA's start, page offset and file name); the
//! file of that name whose executable segments hold the RIP's file offset gives the function
//! ([`GuestFiles::resolve_mapping`]). Static and PIE executables both work. A return address
//! on the stack is resolved in the executable, or in the sampled RIP's library when it lies in
//! the same executable segment of it ([`GuestFiles::caller_in_mapping`]); a caller in another
//! library is not (the sample records only its RIP's mapping): it shows as its address.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use object::read::elf::{ElfFile64, ProgramHeader};
use object::{LittleEndian, Object, ObjectSymbol, SymbolKind};

use crate::guest_task::GuestMapping;
use crate::guest_task::{printable, GuestExe, EXE_NAME_MAX};

#[derive(Debug, thiserror::Error)]
pub enum UserSymbolsError {
    #[error("--guest-files {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// How deep the guest-files walk goes (a root filesystem's paths are short).
const MAX_DEPTH: usize = 16;
/// Most files indexed (a guard against pointing at `/`).
const MAX_FILES: usize = 200_000;

/// One ELF file of the guest: its code span and function symbols.
struct Elf {
    guest_path: String,
    /// Lowest PF_X p_vaddr, and highest p_vaddr + p_filesz - that.
    code_start: u64,
    code_size: u64,
    /// (address, size, name), sorted by address.
    functions: Vec<(u64, u64, String)>,
    /// The executable PT_LOAD segments' bytes: (p_vaddr, the file bytes it loads).
    code: Vec<(u64, Vec<u8>)>,
    /// The executable PT_LOAD segments as (p_offset, p_vaddr, p_filesz): where a file offset
    /// is loaded (for libraries, found by the mapping's offset).
    segments: Vec<(u64, u64, u64)>,
}

impl Elf {
    /// Which executable segment holds file offset `off` (its index).
    fn segment_of_offset(&self, off: u64) -> Option<usize> {
        self.segments
            .iter()
            .position(|&(o, _, n)| off.checked_sub(o).is_some_and(|d| d < n))
    }

    /// The link-time address a file offset inside an executable segment is loaded at.
    fn address_of_offset(&self, off: u64) -> Option<u64> {
        self.segments.iter().find_map(|&(o, v, n)| {
            let d = off.checked_sub(o)?;
            (d < n).then(|| v.wrapping_add(d))
        })
    }

    /// `n` bytes of code at link-time address `at`, if a PF_X segment holds them.
    fn code_at(&self, at: u64, n: usize) -> Option<&[u8]> {
        self.code.iter().find_map(|(start, bytes)| {
            let off = usize::try_from(at.checked_sub(*start)?).ok()?;
            bytes.get(off..off.checked_add(n)?)
        })
    }

    /// The function containing link-time address `at`: (start, name).
    fn function_at(&self, at: u64) -> Option<(u64, &str)> {
        let i = self.functions.partition_point(|f| f.0 <= at);
        let (start, size, name) = &self.functions[i.checked_sub(1)?];
        // start <= at (partition_point); both from the file: no `start + size`.
        (at - start < (*size).max(1)).then_some((*start, name.as_str()))
    }

    /// Where the return address of the function running at `at` is, when that function has no
    /// frame of its own (yet): `Some(0)` at [rsp] (a leaf without a `push rbp; mov rbp, rsp`
    /// prologue, or at its first instruction), `Some(8)` at [rsp + 8] (between the push and the
    /// mov). None: RBP is the function's own frame (the walk from RBP finds its caller).
    fn return_slot(&self, at: u64) -> Option<u64> {
        let (start, _) = self.function_at(at)?;
        let mut p = start;
        if self.code_at(p, 4) == Some(&[0xf3, 0x0f, 0x1e, 0xfa]) {
            p = p.checked_add(4)?; // endbr64
        }
        let framed = self.code_at(p, 4) == Some(&[0x55, 0x48, 0x89, 0xe5]);
        match (framed, at.checked_sub(p)) {
            (false, _) => Some(0),
            (true, Some(0)) | (true, None) => Some(0),
            (true, Some(1..=3)) => Some(8),
            (true, _) => None,
        }
    }

    /// Whether `ret` (link-time) follows a call instruction: `call rel32` (e8) or an indirect
    /// `call` through a register or memory (ff /2, 2 to 7 bytes long).
    fn follows_call(&self, ret: u64) -> bool {
        if self.code_at(ret.wrapping_sub(5), 1) == Some(&[0xe8]) {
            return true;
        }
        (2..=7u64).any(|len| {
            self.code_at(ret.wrapping_sub(len), 2)
                .is_some_and(|b| b[0] == 0xff && (b[1] >> 3) & 7 == 2)
        })
    }
}

/// Where a user-space RIP is: the executable's guest path and the function, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserFrame {
    Resolved {
        object: String,
        function: String,
    },
    /// The executable was found, but no function covers the RIP.
    NoSymbol {
        object: String,
    },
    /// No file of that name and code size among the guest files (or several).
    NoFile {
        name: String,
        why: &'static str,
    },
}

/// The guest's files, indexed by file name; ELF files parsed on first use.
pub struct GuestFiles {
    root: PathBuf,
    by_name: HashMap<String, Vec<PathBuf>>,
    parsed: HashMap<PathBuf, Option<Elf>>,
}

impl GuestFiles {
    /// Indexes the regular files under `root` (symlinks are not followed).
    pub fn open(root: &Path) -> Result<GuestFiles, UserSymbolsError> {
        let mut by_name: HashMap<String, Vec<PathBuf>> = HashMap::new();
        let mut stack = vec![(root.to_path_buf(), 0usize)];
        let mut n = 0;
        while let Some((dir, depth)) = stack.pop() {
            let entries = std::fs::read_dir(&dir).map_err(|source| UserSymbolsError::Io {
                path: dir.clone(),
                source,
            })?;
            for e in entries.flatten() {
                let Ok(t) = e.file_type() else { continue };
                if t.is_dir() && depth < MAX_DEPTH {
                    stack.push((e.path(), depth + 1));
                } else if t.is_file() && n < MAX_FILES {
                    n += 1;
                    let name = e.file_name().to_string_lossy().into_owned();
                    by_name.entry(name).or_default().push(e.path());
                }
            }
        }
        Ok(GuestFiles {
            root: root.to_path_buf(),
            by_name,
            parsed: HashMap::new(),
        })
    }

    /// The files whose name a sample's (possibly truncated) file name matches: its first
    /// bytes `name` and its whole length `len`.
    fn candidates(&self, name: &str, len: u8) -> Vec<PathBuf> {
        if usize::from(len) <= EXE_NAME_MAX {
            return self.by_name.get(name).cloned().unwrap_or_default();
        }
        let mut v: Vec<PathBuf> = self
            .by_name
            .iter()
            .filter(|(n, _)| n.len() == usize::from(len) && n.starts_with(name))
            .flat_map(|(_, v)| v.iter().cloned())
            .collect();
        v.sort();
        v
    }

    /// The function of a shared library (or any mapped ELF file) at user RIP `rip`, from the
    /// mapping the sample recorded: the file offset of `rip` is found in the file's executable
    /// segments. Files of the same name: the first (by path) whose executable segments hold
    /// that offset.
    pub fn resolve_mapping(&mut self, m: &GuestMapping, rip: u64) -> UserFrame {
        let off = m.file_offset(rip);
        let Some(e) = self.mapped_elf(m, off) else {
            return UserFrame::NoFile {
                name: m.name(),
                why: "no ELF file of that name among the guest files with code at that offset",
            };
        };
        let at = e.address_of_offset(off);
        match at.and_then(|at| e.function_at(at)) {
            Some((_, f)) => UserFrame::Resolved {
                object: e.guest_path.clone(),
                function: f.to_string(),
            },
            None => UserFrame::NoSymbol {
                object: e.guest_path.clone(),
            },
        }
    }

    /// The caller at return address `ret` in the file mapping `m` names (the sample recorded
    /// `m` as the mapping holding `ret`: its RIP's, or a caller's in another library): its
    /// function, or `[file+offset]` where the file has no symbol (a stripped library's static
    /// function). None when the call's offset in that file lies in no executable segment (so
    /// not in this mapping: a VMA maps one segment contiguously) or no such file is found.
    pub fn caller_in_mapping(&mut self, m: &GuestMapping, ret: u64) -> Option<String> {
        let off = m.file_offset(ret.wrapping_sub(1));
        let e = self.mapped_elf(m, off)?;
        let at = e.address_of_offset(off)?;
        Some(match e.function_at(at) {
            Some((_, f)) => f.to_string(),
            None => {
                let file = e.guest_path.rsplit('/').next().unwrap_or(&e.guest_path);
                format!("[{file}+{off:#x}]")
            }
        })
    }

    /// The ELF file mapping `m` names (a file of that name; several: the first by path) whose
    /// executable segments hold file offset `off`.
    fn mapped_elf(&mut self, m: &GuestMapping, off: u64) -> Option<&Elf> {
        let mut candidates = self.candidates(&m.name(), m.name_len);
        candidates.sort();
        let path = candidates.into_iter().find(|p| {
            self.elf(p)
                .is_some_and(|e| e.segment_of_offset(off).is_some())
        })?;
        self.elf(&path)
    }

    fn elf(&mut self, path: &Path) -> Option<&Elf> {
        if !self.parsed.contains_key(path) {
            let guest_path = format!(
                "/{}",
                path.strip_prefix(&self.root)
                    .unwrap_or(path)
                    .display()
                    .to_string()
                    .trim_start_matches('/')
            );
            let elf = std::fs::read(path)
                .ok()
                .and_then(|b| parse_elf(&b, guest_path));
            self.parsed.insert(path.to_path_buf(), elf);
        }
        self.parsed.get(path).and_then(|e| e.as_ref())
    }

    /// The function of the executable `exe` at user RIP `rip`.
    pub fn resolve(&mut self, exe: &GuestExe, rip: u64) -> UserFrame {
        // Copies of one file (the same code span) are the same program: the first is taken.
        let Some(path) = self.matching_file(exe) else {
            return UserFrame::NoFile {
                name: exe.name(),
                why: "no ELF file of that name and code size among the guest files",
            };
        };
        let e = self.elf(&path).expect("parsed above");
        let at = rip.wrapping_sub(exe.start_code.wrapping_sub(e.code_start));
        match e.function_at(at) {
            Some((_, f)) => UserFrame::Resolved {
                object: e.guest_path.clone(),
                function: f.to_string(),
            },
            None => UserFrame::NoSymbol {
                object: e.guest_path.clone(),
            },
        }
    }

    /// The caller of a frameless function a sample interrupted (a leaf compiled without its
    /// own frame, or one still in its prologue), which a walk from RBP misses: the return
    /// address at [rsp] or [rsp + 8] (`stack_top`, read at sample time), taken only if the
    /// function at `rip` has no frame there and the address follows a call instruction in the
    /// executable. None otherwise.
    pub fn frameless_caller(
        &mut self,
        exe: &GuestExe,
        rip: u64,
        stack_top: [u64; 2],
    ) -> Option<u64> {
        let path = self.matching_file(exe)?;
        let e = self.elf(&path)?;
        let bias = exe.start_code.wrapping_sub(e.code_start);
        let slot = e.return_slot(rip.wrapping_sub(bias))?;
        let ret = stack_top[(slot / 8) as usize];
        e.follows_call(ret.wrapping_sub(bias)).then_some(ret)
    }

    /// The one file a sample's executable is (as `resolve` picks it), if any.
    fn matching_file(&mut self, exe: &GuestExe) -> Option<PathBuf> {
        let mut fits: Vec<PathBuf> = Vec::new();
        for p in self.candidates(&exe.name(), exe.name_len) {
            if self
                .elf(&p)
                .is_some_and(|e| e.code_size == u64::from(exe.code_size))
            {
                fits.push(p);
            }
        }
        fits.sort();
        fits.into_iter().next()
    }
}

/// The code span and function symbols of a 64-bit little-endian ELF (None: not one).
fn parse_elf(bytes: &[u8], guest_path: String) -> Option<Elf> {
    let f = ElfFile64::<LittleEndian>::parse(bytes).ok()?;
    let endian = LittleEndian;
    let (mut lo, mut hi) = (u64::MAX, 0u64);
    for p in f.elf_program_headers() {
        if p.p_type(endian) == object::elf::PT_LOAD && p.p_flags(endian) & object::elf::PF_X != 0 {
            lo = lo.min(p.p_vaddr(endian));
            hi = hi.max(p.p_vaddr(endian).saturating_add(p.p_filesz(endian)));
        }
    }
    if lo > hi {
        return None;
    }
    let code: Vec<(u64, Vec<u8>)> = f
        .elf_program_headers()
        .iter()
        .filter(|p| {
            p.p_type(endian) == object::elf::PT_LOAD && p.p_flags(endian) & object::elf::PF_X != 0
        })
        .filter_map(|p| Some((p.p_vaddr(endian), p.data(endian, bytes).ok()?.to_vec())))
        .collect();
    let segments = f
        .elf_program_headers()
        .iter()
        .filter(|p| {
            p.p_type(endian) == object::elf::PT_LOAD && p.p_flags(endian) & object::elf::PF_X != 0
        })
        .map(|p| (p.p_offset(endian), p.p_vaddr(endian), p.p_filesz(endian)))
        .collect();
    let mut functions: Vec<(u64, u64, String)> = f
        .symbols()
        .chain(f.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
        .filter_map(|s| Some((s.address(), s.size(), printable(s.name().ok()?))))
        .collect();
    functions.sort();
    functions.dedup_by_key(|f| f.0);
    Some(Elf {
        guest_path,
        code_start: lo,
        code_size: hi - lo,
        functions,
        code,
        segments,
    })
}

/// The first [`EXE_NAME_MAX`] bytes of a file name, as a sample records it (for tests).
pub fn exe_name_bytes(name: &str) -> ([u8; EXE_NAME_MAX], u8) {
    let mut b = [0u8; EXE_NAME_MAX];
    let n = name.len().min(EXE_NAME_MAX);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    (b, name.len().min(255) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary itself stands in for a guest executable: a real ELF with symbols.
    fn exe_dir() -> (tempfile::TempDir, PathBuf, Elf) {
        let me = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&me).unwrap();
        let elf = parse_elf(&bytes, "/usr/bin/prog".into()).expect("the test binary is an ELF");
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        std::fs::write(dir.path().join("usr/bin/prog"), &bytes).unwrap();
        // A different file of the same name elsewhere: not an ELF, never chosen.
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/prog"), b"#!/bin/sh\n").unwrap();
        (dir, me, elf)
    }

    #[test]
    fn a_pie_rip_resolves_to_its_function_in_the_right_file() {
        let (dir, _, elf) = exe_dir();
        let mut files = GuestFiles::open(dir.path()).unwrap();
        let (start, size, name) = elf
            .functions
            .iter()
            .find(|f| f.1 > 16)
            .cloned()
            .expect("a sized function");
        let (n, len) = exe_name_bytes("prog");
        // Loaded with a PIE bias, as the guest kernel would.
        let bias = 0x5555_0000_0000u64;
        let exe = GuestExe {
            name: n,
            name_len: len,
            start_code: elf.code_start + bias,
            code_size: elf.code_size as u32,
        };
        assert_eq!(
            files.resolve(&exe, start + bias + size / 2),
            UserFrame::Resolved {
                object: "/usr/bin/prog".into(),
                function: name
            }
        );
        // The code size must match: another build of the program is not used.
        let other = GuestExe {
            code_size: exe.code_size + 0x1000,
            ..exe
        };
        assert!(matches!(
            files.resolve(&other, start + bias),
            UserFrame::NoFile { .. }
        ));
        // A name no file has.
        let (n, len) = exe_name_bytes("nothere");
        let none = GuestExe {
            name: n,
            name_len: len,
            ..exe
        };
        assert!(matches!(files.resolve(&none, 0), UserFrame::NoFile { .. }));
        // Below the first function: the object, no symbol.
        assert_eq!(
            files.resolve(&exe, bias),
            UserFrame::NoSymbol {
                object: "/usr/bin/prog".into()
            }
        );
    }

    /// Code at 0x1000: a framed function (endbr64; push rbp; mov rbp, rsp; ...), a frameless
    /// leaf at 0x1010, and at 0x1020 a caller whose `call rel32` returns to 0x1025.
    fn hand_made() -> Elf {
        let mut code = vec![0x90u8; 0x40];
        code[..8].copy_from_slice(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5]);
        code[0x10..0x13].copy_from_slice(&[0x48, 0x89, 0xf8]);
        code[0x20] = 0xe8;
        code[0x30..0x32].copy_from_slice(&[0xff, 0xd0]); // call *%rax, returns to 0x1032
        Elf {
            guest_path: "/x".into(),
            code_start: 0x1000,
            code_size: 0x40,
            functions: vec![
                (0x1000, 0x10, "framed".into()),
                (0x1010, 0x10, "leaf".into()),
                (0x1020, 0x20, "caller".into()),
            ],
            code: vec![(0x1000, code)],
            segments: vec![(0, 0x1000, 0x40)],
        }
    }

    #[test]
    fn a_library_rip_resolves_through_its_mapping() {
        // The test binary stands in for a shared library mapped at a page-aligned start.
        let (dir, _, elf) = exe_dir();
        let lib = dir.path().join("lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::copy(dir.path().join("usr/bin/prog"), lib.join("libprog.so.1")).unwrap();
        let mut files = GuestFiles::open(dir.path()).unwrap();
        let (start, size, name) = elf
            .functions
            .iter()
            .find(|f| f.1 > 16)
            .cloned()
            .expect("a sized function");
        let &(p_offset, p_vaddr, _) = elf
            .segments
            .iter()
            .find(|&&(_, v, n)| v <= start && start < v + n)
            .expect("the function is in an executable segment");
        let off = start + size / 2 - p_vaddr + p_offset;
        // The VMA maps the segment's pages from their page-aligned file offset.
        let pgoff = p_offset >> 12;
        let vm_start = 0x7f12_3456_0000u64;
        let rip = vm_start + off - (pgoff << 12);
        let (n, len) = exe_name_bytes("libprog.so.1");
        let m = GuestMapping {
            name: n,
            name_len: len,
            vm_start,
            pgoff: pgoff as u32,
        };
        assert_eq!(
            files.resolve_mapping(&m, rip),
            UserFrame::Resolved {
                object: "/lib/x86_64-linux-gnu/libprog.so.1".into(),
                function: name
            }
        );
        // A return address into the library's executable segment is a caller in it; one
        // outside (another mapping) is not resolved through this one.
        let (f2, _, name2) = elf
            .functions
            .iter()
            .find(|f| f.0 != start && f.1 > 16 && p_vaddr <= f.0 && f.0 < p_vaddr + 0x10_0000)
            .cloned()
            .expect("a second function");
        let ret = vm_start + (f2 + 4 - p_vaddr + p_offset) - (pgoff << 12);
        assert_eq!(files.caller_in_mapping(&m, ret), Some(name2));
        assert_eq!(files.caller_in_mapping(&m, vm_start - (1 << 30)), None);
        // In the segment but before its first function: the file and offset.
        let before = vm_start + (p_offset - (pgoff << 12)) + 1;
        let first = elf.functions.iter().map(|f| f.0).min().unwrap();
        if first > p_vaddr {
            assert_eq!(
                files.caller_in_mapping(&m, before),
                Some(format!("[libprog.so.1+{:#x}]", p_offset))
            );
        }
        // An offset no executable segment holds, and a name no file has.
        assert!(matches!(
            files.resolve_mapping(&m, vm_start - (1 << 40)),
            UserFrame::NoFile { .. }
        ));
        let (n, len) = exe_name_bytes("libnone.so");
        let none = GuestMapping {
            name: n,
            name_len: len,
            ..m
        };
        assert!(matches!(
            files.resolve_mapping(&none, rip),
            UserFrame::NoFile { .. }
        ));
    }

    #[test]
    fn a_frameless_leafs_return_address_is_found_where_the_prologue_left_it() {
        let e = hand_made();
        assert_eq!(
            e.return_slot(0x1010 + 5),
            Some(0),
            "a leaf without a frame: [rsp]"
        );
        assert_eq!(e.return_slot(0x1004), Some(0), "at push rbp: [rsp]");
        assert_eq!(e.return_slot(0x1005), Some(8), "after push rbp: [rsp + 8]");
        assert_eq!(
            e.return_slot(0x1009),
            None,
            "framed: the walk from RBP finds the caller"
        );
        assert!(e.follows_call(0x1025), "after call rel32");
        assert!(e.follows_call(0x1032), "after call *%rax");
        assert!(!e.follows_call(0x1013), "not after a call");
        assert!(!e.follows_call(0x9000), "outside the code");
    }

    #[test]
    fn a_truncated_name_matches_by_prefix_and_length() {
        let (dir, _, elf) = exe_dir();
        let long = "prog_with_a_long_file_name";
        std::fs::copy(dir.path().join("usr/bin/prog"), dir.path().join(long)).unwrap();
        let mut files = GuestFiles::open(dir.path()).unwrap();
        let (n, len) = exe_name_bytes(long);
        let exe = GuestExe {
            name: n,
            name_len: len,
            start_code: elf.code_start,
            code_size: elf.code_size as u32,
        };
        assert!(exe.truncated());
        let f = &elf.functions[elf.functions.len() / 2];
        assert_eq!(
            files.resolve(&exe, f.0),
            UserFrame::Resolved {
                object: format!("/{long}"),
                function: f.2.clone()
            }
        );
    }

    /// Regression (issue 33): a function symbol near the top of the address space with a large
    /// size overflowed `start + size` (a panic in debug builds), and a framed function there
    /// overflowed the prologue step.
    #[test]
    fn symbols_at_the_top_of_the_address_space_are_no_panic() {
        let top = u64::MAX - 2;
        let elf = Elf {
            guest_path: "/bin/x".into(),
            code_start: top,
            code_size: 3,
            functions: vec![(top, u64::MAX, "f".into())],
            code: vec![(top, vec![0xf3, 0x0f, 0x1e])],
            segments: vec![(0, top, 3)],
        };
        assert_eq!(elf.function_at(u64::MAX), Some((top, "f")));
        assert_eq!(elf.function_at(top - 1), None);
        assert_eq!(elf.return_slot(u64::MAX), Some(0));
        assert!(!elf.follows_call(u64::MAX));
    }
}
