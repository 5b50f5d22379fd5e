//! The kallsyms reader against the default guest kernel: every code symbol of its System.map
//! must resolve to the same name through the kallsyms tables found in the bzImage (by scanning)
//! and in the vmlinux (through its ELF symbol table). Needs the cached kernel
//! (`guest-image/build.sh default-kernel`); without it the test says so loudly and does nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;

use analysis::profile::kallsyms;
use analysis::profile::symbols::{is_code, SymbolTable};

/// DEFAULT_BZIMAGE, DEFAULT_VMLINUX, DEFAULT_SYSTEM_MAP from `guest-image/build.sh paths`.
fn kernel_paths() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let images = testkit::built_images();
    let get = |k: &str| images.get(k).cloned();
    Some((
        get("DEFAULT_BZIMAGE")?,
        get("DEFAULT_VMLINUX")?,
        get("DEFAULT_SYSTEM_MAP")?,
    ))
}

#[test]
fn kallsyms_agree_with_system_map() {
    let Some((bzimage, vmlinux, map)) = kernel_paths() else {
        testkit::input_missing(
            "kallsyms_agree_with_system_map",
            "the default kernel (guest-image/build.sh default-kernel)",
        );
        return;
    };
    let text = std::fs::read_to_string(&map).unwrap();
    let mut by_addr: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() == 3 && is_code(f[1].chars().next().unwrap()) {
            by_addr
                .entry(u64::from_str_radix(f[0], 16).unwrap())
                .or_default()
                .push(f[2].to_string());
        }
    }
    assert!(by_addr.len() > 1000, "System.map has few code symbols");
    for image in [&bzimage, &vmlinux] {
        let syms = kallsyms::from_file(image).unwrap();
        let table = SymbolTable::from_kallsyms(&syms, "k");
        let mut bad = Vec::new();
        for (addr, names) in &by_addr {
            match table.resolve(*addr) {
                Some((n, 0)) if names.iter().any(|m| m == n) => {}
                got => bad.push(format!("{addr:#x} {names:?} -> {got:?}")),
            }
        }
        eprintln!(
            "{}: {} kallsyms entries, {} code addresses in System.map, {} mismatches",
            image.display(),
            syms.len(),
            by_addr.len(),
            bad.len()
        );
        assert!(
            bad.is_empty(),
            "{}: {} of {} System.map code symbols resolve differently, e.g. {:#?}",
            image.display(),
            bad.len(),
            by_addr.len(),
            &bad[..bad.len().min(10)]
        );
    }
}
