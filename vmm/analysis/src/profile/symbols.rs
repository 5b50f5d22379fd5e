//! Guest address -> function name, from the kernel's kallsyms tables or a System.map. Only
//! code symbols (types t, T, w, W) are used: a RIP is resolved to the nearest code symbol at or
//! below it, within [`MAX_DISTANCE`].

use std::path::Path;

use super::kallsyms::{self, KSym};
use crate::guest_task::printable;

/// A RIP further than this past the nearest symbol is reported as unknown.
pub(crate) const MAX_DISTANCE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SymbolsError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: not a System.map line (want \"ADDRESS TYPE NAME\"): {text:?}")]
    BadLine {
        path: String,
        line: usize,
        text: String,
    },
    #[error("{0}: no code symbols in it")]
    Empty(String),
    #[error("{path}: {source}")]
    Kallsyms {
        path: String,
        source: kallsyms::KallsymsError,
    },
}

/// Where the names came from (for the report's header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Kallsyms(String),
    SystemMap(String),
}

#[derive(Debug, Clone)]
pub struct SymbolTable {
    /// Sorted by address; for equal addresses the first in the source wins.
    syms: Vec<(u64, String)>,
    pub origin: Origin,
}

pub fn is_code(kind: char) -> bool {
    matches!(kind, 't' | 'T' | 'w' | 'W')
}

impl SymbolTable {
    /// Names are kept as text output shows them (`guest_task::printable`): a System.map or
    /// vmlinux is the user's, but what it holds came from whoever built it.
    fn new(mut syms: Vec<(u64, String)>, origin: Origin) -> Self {
        for (_, name) in &mut syms {
            if name.chars().any(char::is_control) {
                *name = printable(name);
            }
        }
        syms.sort_by_key(|(a, _)| *a);
        syms.dedup_by_key(|(a, _)| *a);
        SymbolTable { syms, origin }
    }

    pub fn from_kallsyms(syms: &[KSym], origin: &str) -> Self {
        SymbolTable::new(
            syms.iter()
                .filter(|s| is_code(s.kind))
                .map(|s| (s.addr, s.name.clone()))
                .collect(),
            Origin::Kallsyms(origin.into()),
        )
    }

    pub fn from_kernel(path: &Path) -> Result<Self, SymbolsError> {
        let syms = kallsyms::from_file(path).map_err(|source| SymbolsError::Kallsyms {
            path: path.display().to_string(),
            source,
        })?;
        let t = SymbolTable::from_kallsyms(&syms, &path.display().to_string());
        if t.syms.is_empty() {
            return Err(SymbolsError::Empty(path.display().to_string()));
        }
        Ok(t)
    }

    /// Parses System.map text (`ffffffff81000000 T _text` per line).
    pub fn parse_system_map(text: &str, path: &str) -> Result<Self, SymbolsError> {
        let mut syms = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let mut f = line.split_whitespace();
            let parsed = (|| {
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                (kind.len() == 1).then(|| (addr, kind.chars().next().unwrap(), name))
            })();
            let Some((addr, kind, name)) = parsed else {
                return Err(SymbolsError::BadLine {
                    path: path.into(),
                    line: i + 1,
                    text: line.chars().take(80).collect(),
                });
            };
            if is_code(kind) {
                syms.push((addr, name.to_string()));
            }
        }
        if syms.is_empty() {
            return Err(SymbolsError::Empty(path.into()));
        }
        Ok(SymbolTable::new(syms, Origin::SystemMap(path.into())))
    }

    pub(crate) fn from_system_map(path: &Path) -> Result<Self, SymbolsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SymbolsError::Io {
            path: path.display().to_string(),
            source,
        })?;
        SymbolTable::parse_system_map(&text, &path.display().to_string())
    }

    /// The code symbol containing `addr` (nearest at or below it) and the offset into it.
    pub fn resolve(&self, addr: u64) -> Option<(&str, u64)> {
        let i = self.syms.partition_point(|(a, _)| *a <= addr);
        let (a, name) = self.syms.get(i.checked_sub(1)?)?;
        let off = addr - a;
        (off < MAX_DISTANCE).then_some((name.as_str(), off))
    }

    pub fn len(&self) -> usize {
        self.syms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }
}

/// The row of a user-space sample when nothing names its process.
pub(crate) const USER_BUCKET: &str = "[guest user space, CPL 3] (no process information)";
/// The user-space row of a sample whose process is known (`profile::stacks`).
pub const USER_BUCKET_NAMED: &str = "[guest user space, CPL 3]";
pub(crate) const UNKNOWN_KERNEL: &str = "[guest kernel, unknown]";

/// The bucket name for one sample.
pub fn bucket(rip: u64, cpl: u8, syms: Option<&SymbolTable>) -> String {
    if cpl == 3 {
        return USER_BUCKET.to_string();
    }
    match syms {
        Some(t) => match t.resolve(rip) {
            Some((name, _)) => name.to_string(),
            None => UNKNOWN_KERNEL.to_string(),
        },
        None => format!("[no symbols] {rip:#x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_map_resolves_to_the_enclosing_code_symbol() {
        let map = "ffffffff81000000 T _text\nffffffff81000000 T startup_64\n\
                   ffffffff81000100 t helper\nffffffff81800000 D some_data\n";
        let t = SymbolTable::parse_system_map(map, "m").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.resolve(0xffff_ffff_8100_0010), Some(("_text", 0x10)));
        assert_eq!(t.resolve(0xffff_ffff_8100_0180), Some(("helper", 0x80)));
        assert_eq!(t.resolve(0xffff_ffff_8000_0000), None);
        assert_eq!(t.resolve(0xffff_ffff_8100_0100 + MAX_DISTANCE), None);
    }

    #[test]
    fn control_characters_in_symbol_names_are_escaped() {
        let map = "ffffffff81000000 T evil\x1b[2J\x07\nffffffff81000100 T plain\n";
        let t = SymbolTable::parse_system_map(map, "m").unwrap();
        assert_eq!(
            t.resolve(0xffff_ffff_8100_0010),
            Some(("evil\\u{1b}[2J\\u{7}", 0x10))
        );
        assert_eq!(t.resolve(0xffff_ffff_8100_0110), Some(("plain", 0x10)));
    }

    #[test]
    fn bad_system_maps_are_refused_clearly() {
        let e = SymbolTable::parse_system_map("ffffffff81000000 T a\nhello\n", "m").unwrap_err();
        assert!(e.to_string().contains("m:2"), "{e}");
        let e = SymbolTable::parse_system_map("ffffffff81000000 D a\n", "m").unwrap_err();
        assert!(matches!(e, SymbolsError::Empty(_)));
    }
}
