//! The task layout derived from a kernel's own BTF and kallsyms (`vpmu-vmm task-layout`,
//! `profile::btf_layout`) against independent references, on Debian's prebuilt cloud kernel
//! (`guest-image/build.sh debian-kernel`, which scripts/test.sh builds): every struct offset,
//! size and array length equals what gdb reads from the same kernel's DWARF (the -dbg package's
//! vmlinux: `dwarf-offsets`), and every symbol address what its System.map says. The default
//! kernel (no BTF) must be refused with a message that names the option to use. Without the
//! images the test says so loudly and checks nothing.

use std::collections::HashMap;
use std::path::PathBuf;

use runtime::profile::btf_layout::{from_kernel, BtfLayoutError};
use runtime::profile::guest_task::TaskLayout;

fn paths() -> HashMap<String, PathBuf> {
    testkit::built_images()
}

#[test]
fn the_btf_layout_of_debians_kernel_matches_its_dwarf_and_system_map() {
    let p = paths();
    let (Some(kernel), Some(dwarf), Some(map)) = (
        p.get("DEBIAN_VMLINUZ"),
        p.get("DEBIAN_DWARF_OFFSETS"),
        p.get("DEBIAN_SYSTEM_MAP"),
    ) else {
        testkit::input_missing(
            "the_btf_layout_of_debians_kernel_matches_its_dwarf_and_system_map",
            "Debian's kernel (guest-image/build.sh debian-kernel)",
        );
        return;
    };
    let text = from_kernel(kernel).expect("Debian's kernel has BTF and kallsyms");
    let layout = TaskLayout::parse(&text).expect("the derived layout parses");
    assert!(layout.banner.contains("Debian"), "{}", layout.banner);
    assert!(layout.maps.is_some(), "a 6.1 kernel has the maple tree");
    let mut values: HashMap<&str, u64> = HashMap::new();
    let mut symbols: HashMap<&str, u64> = HashMap::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["value", name, v] => {
                values.insert(name, v.parse().unwrap());
            }
            ["symbol", name, a] => {
                symbols.insert(name, u64::from_str_radix(&a[2..], 16).unwrap());
            }
            _ => {}
        }
    }
    let reference = std::fs::read_to_string(dwarf).unwrap();
    let mut checked = 0;
    for l in reference.lines() {
        let (name, v) = l.split_once(' ').unwrap();
        let want: u64 = v.trim().parse().unwrap();
        assert_eq!(
            values.get(name).copied(),
            Some(want),
            "{name}: BTF says {:?}, DWARF {want}",
            values.get(name)
        );
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} reference values");
    let system_map = std::fs::read_to_string(map).unwrap();
    for (name, addr) in &symbols {
        let want = system_map
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3 && f[2] == *name).then(|| u64::from_str_radix(f[0], 16).unwrap())
            })
            .unwrap_or_else(|| panic!("{name} is not in System.map"));
        assert_eq!(
            *addr, want,
            "{name}: kallsyms {addr:#x}, System.map {want:#x}"
        );
    }
    eprintln!(
        "Debian's kernel: {checked} offsets and sizes agree with DWARF, {} symbols with System.map",
        symbols.len()
    );
}

#[test]
fn a_kernel_without_btf_is_refused_with_what_to_do() {
    let p = paths();
    let Some(kernel) = p.get("DEFAULT_BZIMAGE") else {
        testkit::input_missing(
            "a_kernel_without_btf_is_refused_with_what_to_do",
            "the default kernel (guest-image/build.sh default-kernel)",
        );
        return;
    };
    let e = from_kernel(kernel).unwrap_err();
    assert!(matches!(e, BtfLayoutError::NoBtf), "{e}");
    assert!(e.to_string().contains("--task-layout"), "{e}");
}
