//! The guest kernel's own symbols from the kallsyms tables inside its image (no debug package,
//! no System.map needed): what `/proc/kallsyms` is built from.
//!
//! Layout (Linux scripts/kallsyms.c, 6.1 to 6.3; the 6.1 stable series also has
//! `kallsyms_seqs_of_names`), each table 8-byte aligned in .rodata:
//! `kallsyms_offsets` (s32 x n), `kallsyms_relative_base` (u64), `kallsyms_num_syms` (u32),
//! `kallsyms_names` (per symbol: a length byte — two bytes, 7 bits each, if bit 7 is set — then
//! that many token indices; the first expanded character is the symbol type),
//! `kallsyms_markers` (u32 per 256 symbols: offset into names), [`kallsyms_seqs_of_names`
//! (3 bytes x n)], `kallsyms_token_table` (256 NUL-terminated strings),
//! `kallsyms_token_index` (u16 x 256). 6.4 and later move offsets and relative_base after the
//! token index; that order is tried too.
//! Addresses (kernel/kallsyms.c `kallsyms_sym_address`): with KALLSYMS_ABSOLUTE_PERCPU (x86-64
//! SMP) an offset >= 0 is absolute (per-CPU symbols) and a negative one is
//! `relative_base - 1 - offset`; otherwise `relative_base + (u32)offset`.
//!
//! The tables are found through the ELF symbol table when the image has one, else by a scan:
//! the token table is the one place holding the single-character tokens "0".."9" back to back
//! (unused byte values become multi-character tokens; digits are always used), and every other
//! table is checked against it (markers against the parsed names, the token index against the
//! token table) before it is believed.

use crate::bzimage;

#[derive(Debug, thiserror::Error)]
pub enum KallsymsError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    BzImage(#[from] bzimage::BzImageError),
    #[error("not an ELF vmlinux or a bzImage")]
    NotKernel,
    #[error("no kallsyms tables found in the kernel image (built without CONFIG_KALLSYMS, or a layout this reader does not know: use --system-map)")]
    NotFound,
    #[error("kallsyms tables are inconsistent: {0}")]
    Inconsistent(String),
}

/// One kallsyms entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KSym {
    pub addr: u64,
    /// `T`, `t`, `D`, ... as in System.map.
    pub kind: char,
    pub name: String,
}

/// Reads a kernel image file (ELF vmlinux or bzImage) and returns its kallsyms symbols.
pub fn from_file(path: &std::path::Path) -> Result<Vec<KSym>, KallsymsError> {
    let bytes = std::fs::read(path).map_err(|source| KallsymsError::Io {
        path: path.display().to_string(),
        source,
    })?;
    from_image(&bytes)
}

pub fn from_image(image: &[u8]) -> Result<Vec<KSym>, KallsymsError> {
    if image.starts_with(b"\x7fELF") {
        return from_vmlinux(image);
    }
    if bzimage::is_bzimage(image) {
        let x = bzimage::extract(image)?;
        return from_vmlinux(&x.vmlinux);
    }
    Err(KallsymsError::NotKernel)
}

/// File offsets of the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    num_syms: usize,
    names: usize,
    markers: usize,
    token_table: usize,
    token_index: usize,
    offsets: usize,
    relative_base: usize,
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(o..o.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(o..o.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(o..o.checked_add(8)?)?.try_into().ok()?,
    ))
}
fn align8(x: usize) -> usize {
    (x + 7) & !7
}

pub fn from_vmlinux(elf: &[u8]) -> Result<Vec<KSym>, KallsymsError> {
    let layout = match elf_layout(elf) {
        Some(l) => l,
        None => scan(elf).ok_or(KallsymsError::NotFound)?,
    };
    decode(elf, &layout)
}

/// The tables through the ELF symbol table (an unstripped vmlinux), read with `object`: a
/// damaged or hostile header gives `None` (and then the scan), never a panic.
fn elf_layout(b: &[u8]) -> Option<Layout> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    use object::{LittleEndian, Object, ObjectSymbol};
    let file = ElfFile64::<LittleEndian>::parse(b).ok()?;
    let endian = file.endian();
    // Virtual address -> file offset through the PT_LOAD program headers.
    let vaddr_to_off = |va: u64| -> Option<usize> {
        file.elf_program_headers().iter().find_map(|p| {
            if p.p_type(endian) != object::elf::PT_LOAD {
                return None;
            }
            let (off, vaddr, filesz) = (p.p_offset(endian), p.p_vaddr(endian), p.p_filesz(endian));
            let inside = va >= vaddr && va - vaddr < filesz;
            inside
                .then(|| off.checked_add(va - vaddr))
                .flatten()
                .and_then(|o| usize::try_from(o).ok())
        })
    };
    let mut want: [(&str, Option<usize>); 7] = [
        ("kallsyms_num_syms", None),
        ("kallsyms_names", None),
        ("kallsyms_markers", None),
        ("kallsyms_token_table", None),
        ("kallsyms_token_index", None),
        ("kallsyms_offsets", None),
        ("kallsyms_relative_base", None),
    ];
    for sym in file.symbols() {
        let Ok(name) = sym.name_bytes() else {
            continue;
        };
        if let Some(w) = want.iter_mut().find(|(n, _)| n.as_bytes() == name) {
            w.1 = vaddr_to_off(sym.address());
        }
    }
    let v: Vec<usize> = want.iter().map(|(_, o)| *o).collect::<Option<_>>()?;
    if v.iter().any(|&o| o >= b.len()) {
        return None;
    }
    Some(Layout {
        num_syms: v[0],
        names: v[1],
        markers: v[2],
        token_table: v[3],
        token_index: v[4],
        offsets: v[5],
        relative_base: v[6],
    })
}

/// Walks the 256 tokens from `start`; returns their offsets and the end of the table.
fn tokens_from(b: &[u8], start: usize) -> Option<(Vec<u16>, usize)> {
    let mut offs = Vec::with_capacity(256);
    let mut p = start;
    for _ in 0..256 {
        offs.push(u16::try_from(p - start).ok()?);
        let len = b.get(p..)?.iter().take(64).position(|&c| c == 0)?;
        if len == 0 {
            return None;
        }
        p += len + 1;
    }
    Some((offs, p))
}

fn scan(b: &[u8]) -> Option<Layout> {
    const DIGITS: &[u8] = b"0\x001\x002\x003\x004\x005\x006\x007\x008\x009\x00";
    let mut from = 0;
    while let Some(i) = find(&b[from..], DIGITS) {
        let digits = from + i;
        from = digits + 1;
        // Token 0x30 is "0": walk back over tokens 0x2f..0x00.
        let mut p = digits;
        let mut ok = true;
        for _ in 0..0x30 {
            if p < 2 || b[p - 1] != 0 || b[p - 2] == 0 {
                ok = false;
                break;
            }
            p -= 1;
            while p > 0 && b[p - 1] != 0 {
                p -= 1;
            }
        }
        if !ok {
            continue;
        }
        let token_table = p;
        let Some((offs, end)) = tokens_from(b, token_table) else {
            continue;
        };
        let token_index = align8(end);
        if (0..256).any(|i| u16_at(b, token_index + 2 * i) != Some(offs[i])) {
            continue;
        }
        if let Some(l) = find_names(b, token_table, token_index) {
            return Some(l);
        }
    }
    None
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Given the token table, finds num_syms/names/markers before it and the offsets.
fn find_names(b: &[u8], token_table: usize, token_index: usize) -> Option<Layout> {
    let lowest = token_table.saturating_sub(64 << 20);
    let mut p = token_table & !7;
    while p >= lowest + 8 {
        p -= 8;
        let n = u32_at(b, p)? as usize;
        if !(16..=4_000_000).contains(&n) || u32_at(b, p + 4)? != 0 {
            continue;
        }
        let names = p + 8;
        let k = n.div_ceil(256);
        // markers end at the token table, or at kallsyms_seqs_of_names (3 bytes per symbol).
        let seqs = token_table.checked_sub(3 * n).map(|s| s & !7);
        for markers_end in [Some(token_table), seqs].into_iter().flatten() {
            let Some(markers) = markers_end.checked_sub(4 * k).map(|m| m & !7) else {
                continue;
            };
            if markers <= names || u32_at(b, markers) != Some(0) {
                continue;
            }
            if check_names(b, names, n, markers, k).is_none() {
                continue;
            }
            // Offsets: before relative_base before num_syms (<= 6.3), or after the token index.
            // (Tables near the start of the image have no room for the first layout: only
            // that candidate is dropped.)
            let after_offsets = align8(token_index + 512);
            let after = Layout {
                num_syms: p,
                names,
                markers,
                token_table,
                token_index,
                offsets: after_offsets,
                relative_base: align8(after_offsets + 4 * n),
            };
            let before = p.checked_sub(8).and_then(|relative_base| {
                Some(Layout {
                    relative_base,
                    offsets: relative_base.checked_sub(4 * n)? & !7,
                    ..after
                })
            });
            for l in before.into_iter().chain([after]) {
                if plausible_base(b, l.relative_base) {
                    return Some(l);
                }
            }
        }
    }
    None
}

fn plausible_base(b: &[u8], at: usize) -> bool {
    u64_at(b, at).is_some_and(|v| v >= 0xffff_8000_0000_0000)
}

/// Walks the names, checking every marker; returns the end of the names.
fn check_names(b: &[u8], names: usize, n: usize, markers: usize, k: usize) -> Option<usize> {
    let mut off = 0usize;
    for i in 0..n {
        if i % 256 == 0 && u32_at(b, markers + 4 * (i / 256))? as usize != off {
            return None;
        }
        let (len, hdr) = name_len(b, names + off)?;
        off += hdr + len;
        if names + off > markers {
            return None;
        }
    }
    let _ = k;
    (markers - (names + off) < 8).then_some(names + off)
}

/// A name's length and the size of its length field.
fn name_len(b: &[u8], at: usize) -> Option<(usize, usize)> {
    let l0 = usize::from(*b.get(at)?);
    if l0 & 0x80 != 0 {
        Some(((l0 & 0x7f) | (usize::from(*b.get(at + 1)?) << 7), 2))
    } else if l0 == 0 {
        None
    } else {
        Some((l0, 1))
    }
}

fn decode(b: &[u8], l: &Layout) -> Result<Vec<KSym>, KallsymsError> {
    let bad = |what: &str| KallsymsError::Inconsistent(what.to_string());
    let n = u32_at(b, l.num_syms).ok_or_else(|| bad("num_syms out of the image"))? as usize;
    let base = u64_at(b, l.relative_base).ok_or_else(|| bad("relative_base out of the image"))?;
    let mut tokens: Vec<&[u8]> = Vec::with_capacity(256);
    for i in 0..256 {
        let o = l.token_table
            + usize::from(u16_at(b, l.token_index + 2 * i).ok_or_else(|| bad("token index"))?);
        let t = b.get(o..).ok_or_else(|| bad("token table"))?;
        let end = t
            .iter()
            .position(|&c| c == 0)
            .ok_or_else(|| bad("token table"))?;
        tokens.push(&t[..end]);
    }
    let offsets: Vec<i32> = (0..n)
        .map(|i| u32_at(b, l.offsets + 4 * i).map(|v| v as i32))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("offsets out of the image"))?;
    let absolute_percpu = offsets.iter().any(|&o| o < 0);
    let mut out = Vec::with_capacity(n);
    let mut pos = l.names;
    for (i, &off) in offsets.iter().enumerate() {
        if i % 256 == 0
            && u32_at(b, l.markers + 4 * (i / 256)).map(|m| m as usize) != Some(pos - l.names)
        {
            return Err(bad(&format!("marker {} does not match the names", i / 256)));
        }
        let (len, hdr) = name_len(b, pos).ok_or_else(|| bad("name length"))?;
        let codes = b
            .get(pos + hdr..pos + hdr + len)
            .ok_or_else(|| bad("names run past the image"))?;
        pos += hdr + len;
        let mut full = Vec::with_capacity(len * 3);
        for &c in codes {
            full.extend_from_slice(tokens[usize::from(c)]);
        }
        let (&kind, name) = full.split_first().ok_or_else(|| bad("empty name"))?;
        let addr = if absolute_percpu {
            if off >= 0 {
                off as u64
            } else {
                base.wrapping_sub(1).wrapping_sub(i64::from(off) as u64)
            }
        } else {
            base.wrapping_add(u64::from(off as u32))
        };
        out.push(KSym {
            addr,
            kind: char::from(kind),
            name: String::from_utf8_lossy(name).into_owned(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built kallsyms image in the 6.1 order, with 300 symbols (two markers).
    fn image(seqs: bool) -> (Vec<u8>, Vec<KSym>) {
        // Tokens: byte values used by names stand for themselves; 0x80 = "func_", others "x".
        let mut tokens: Vec<Vec<u8>> = (0..256u32)
            .map(|i| match i {
                0x80 => b"func_".to_vec(),
                0x20..=0x7e => vec![i as u8],
                _ => vec![b'x', (i % 26) as u8 + b'a'],
            })
            .collect();
        tokens[0] = b"zz".to_vec();
        let n = 300usize;
        let base = 0xffff_ffff_8100_0000u64;
        let syms: Vec<KSym> = (0..n)
            .map(|i| KSym {
                addr: if i == 0 {
                    0x1000
                } else {
                    base + 0x10 * i as u64
                },
                kind: if i == 0 { 'D' } else { 'T' },
                name: format!("func_{i}"),
            })
            .collect();
        let mut b = vec![0xeeu8; 64];
        let offsets_at = b.len();
        for (i, s) in syms.iter().enumerate() {
            let off: i32 = if i == 0 {
                s.addr as i32
            } else {
                -((s.addr - base + 1) as i32)
            };
            b.extend_from_slice(&off.to_le_bytes());
        }
        b.resize(align8(b.len()), 0);
        let _ = offsets_at;
        b.extend_from_slice(&base.to_le_bytes());
        b.extend_from_slice(&(n as u32).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        let mut names = Vec::new();
        let mut markers = Vec::new();
        for (i, s) in syms.iter().enumerate() {
            if i % 256 == 0 {
                markers.push(names.len() as u32);
            }
            let mut codes = vec![s.kind as u8, 0x80];
            codes.extend_from_slice(s.name.strip_prefix("func_").unwrap().as_bytes());
            names.push(codes.len() as u8);
            names.extend_from_slice(&codes);
        }
        b.extend_from_slice(&names);
        b.resize(align8(b.len()), 0);
        for m in markers {
            b.extend_from_slice(&m.to_le_bytes());
        }
        b.resize(align8(b.len()), 0);
        if seqs {
            b.extend(std::iter::repeat_n(0x55, 3 * n));
            b.resize(align8(b.len()), 0);
        }
        let mut index = Vec::new();
        let table_at = b.len();
        for t in &tokens {
            index.push((b.len() - table_at) as u16);
            b.extend_from_slice(t);
            b.push(0);
        }
        b.resize(align8(b.len()), 0);
        for i in index {
            b.extend_from_slice(&i.to_le_bytes());
        }
        b.extend_from_slice(&[0xee; 64]);
        (b, syms)
    }

    #[test]
    fn scan_finds_and_decodes_the_tables() {
        for seqs in [false, true] {
            let (img, want) = image(seqs);
            let l = scan(&img).expect("tables found");
            assert_eq!(decode(&img, &l).unwrap(), want, "seqs {seqs}");
        }
    }

    /// `tables` wrapped in an ELF64 vmlinux: one PT_LOAD at `VA` holding them, and a symbol
    /// table naming each table of `l` (file offsets inside `tables`).
    fn elf_around(tables: &[u8], l: &Layout) -> Vec<u8> {
        const VA: u64 = 0xffff_ffff_8200_0000;
        const DATA: usize = 0x1000;
        let u16le = |v: u16| v.to_le_bytes();
        let u32le = |v: u32| v.to_le_bytes();
        let u64le = |v: u64| v.to_le_bytes();
        let named = [
            ("kallsyms_num_syms", l.num_syms),
            ("kallsyms_names", l.names),
            ("kallsyms_markers", l.markers),
            ("kallsyms_token_table", l.token_table),
            ("kallsyms_token_index", l.token_index),
            ("kallsyms_offsets", l.offsets),
            ("kallsyms_relative_base", l.relative_base),
        ];
        let mut strtab = vec![0u8];
        let mut symtab = vec![0u8; 24]; // the null symbol
        for (name, off) in named {
            symtab.extend_from_slice(&u32le(strtab.len() as u32));
            symtab.extend_from_slice(&[0x11, 0]); // GLOBAL OBJECT, default visibility
            symtab.extend_from_slice(&u16le(1));
            symtab.extend_from_slice(&u64le(VA + off as u64));
            symtab.extend_from_slice(&u64le(0));
            strtab.extend_from_slice(name.as_bytes());
            strtab.push(0);
        }
        let sym_at = align8(DATA + tables.len());
        let str_at = sym_at + symtab.len();
        let sh_at = align8(str_at + strtab.len());
        let mut e = Vec::new();
        e.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
        e.extend_from_slice(&u16le(2)); // ET_EXEC
        e.extend_from_slice(&u16le(62)); // x86-64
        e.extend_from_slice(&u32le(1));
        e.extend_from_slice(&u64le(VA)); // entry
        e.extend_from_slice(&u64le(64)); // phoff
        e.extend_from_slice(&u64le(sh_at as u64));
        e.extend_from_slice(&u32le(0));
        for v in [64u16, 56, 1, 64, 3, 2] {
            // ehsize, phentsize, phnum, shentsize, shnum, shstrndx (section names: "")
            e.extend_from_slice(&u16le(v));
        }
        e.extend_from_slice(&u32le(1)); // PT_LOAD
        e.extend_from_slice(&u32le(4));
        for v in [
            DATA as u64,
            VA,
            VA,
            tables.len() as u64,
            tables.len() as u64,
            0x1000,
        ] {
            e.extend_from_slice(&u64le(v));
        }
        e.resize(DATA, 0);
        e.extend_from_slice(tables);
        e.resize(sym_at, 0);
        e.extend_from_slice(&symtab);
        e.extend_from_slice(&strtab);
        e.resize(sh_at, 0);
        e.extend_from_slice(&[0; 64]); // section 0
        let section = |e: &mut Vec<u8>, kind: u32, off: usize, size: usize, link: u32, ent: u64| {
            e.extend_from_slice(&u32le(0));
            e.extend_from_slice(&u32le(kind));
            for v in [0, 0, off as u64, size as u64] {
                e.extend_from_slice(&u64le(v));
            }
            e.extend_from_slice(&u32le(link));
            e.extend_from_slice(&u32le(1)); // first global symbol
            e.extend_from_slice(&u64le(8));
            e.extend_from_slice(&u64le(ent));
        };
        section(&mut e, 2, sym_at, symtab.len(), 2, 24); // SHT_SYMTAB, strings in section 2
        section(&mut e, 3, str_at, strtab.len(), 0, 0); // SHT_STRTAB
        e
    }

    #[test]
    fn elf_symbols_locate_the_tables() {
        for seqs in [false, true] {
            let (tables, want) = image(seqs);
            let l = scan(&tables).unwrap();
            let elf = elf_around(&tables, &l);
            let found = elf_layout(&elf).expect("tables found through the ELF symbols");
            let shift = |o: usize| o + 0x1000;
            assert_eq!(
                found,
                Layout {
                    num_syms: shift(l.num_syms),
                    names: shift(l.names),
                    markers: shift(l.markers),
                    token_table: shift(l.token_table),
                    token_index: shift(l.token_index),
                    offsets: shift(l.offsets),
                    relative_base: shift(l.relative_base),
                }
            );
            assert_eq!(from_vmlinux(&elf).unwrap(), want, "seqs {seqs}");
            // A symbol table that misses one table: no layout from it (the scan takes over).
            let mut partial = elf.clone();
            let at = find(&partial, b"kallsyms_markers").unwrap();
            partial[at] = b'K';
            assert_eq!(elf_layout(&partial), None);
            assert_eq!(from_vmlinux(&partial).unwrap(), want);
            // Cut anywhere: errors or the scan's answer, never a panic.
            for cut in (0..elf.len()).step_by(97) {
                let _ = from_vmlinux(&elf[..cut]);
            }
        }
    }

    #[test]
    fn damaged_tables_are_not_believed() {
        let (mut img, _) = image(false);
        // Break the second marker: the scan must not accept these names.
        let l = scan(&img).unwrap();
        img[l.markers + 4] ^= 1;
        assert!(scan(&img).is_none());
        assert!(matches!(from_vmlinux(&img), Err(KallsymsError::NotFound)));
        assert!(matches!(
            from_image(b"garbage"),
            Err(KallsymsError::NotKernel)
        ));
    }
}
