//! The RDPMC search on the real default guest kernel (built by guest-image/build.sh; the test
//! says loudly when the cached kernel is absent). The vmlinux (with symbols: each site is checked
//! from its function's first byte) and the bzImage's stripped vmlinux (no symbols: the
//! re-synchronisation check) must give the same sites.

use std::path::PathBuf;

fn cached(var: &str) -> Option<PathBuf> {
    testkit::built_images().remove(var)
}

#[test]
fn default_kernel_sites_agree_with_and_without_symbols() {
    let (Some(vmlinux), Some(bzimage)) = (cached("DEFAULT_VMLINUX"), cached("DEFAULT_BZIMAGE"))
    else {
        testkit::input_missing(
            "default_kernel_sites_agree_with_and_without_symbols",
            "the default kernel (guest-image/build.sh default-kernel)",
        );
        return;
    };
    let with_syms = runtime::pmu::rdpmc::find_sites(&std::fs::read(&vmlinux).unwrap()).unwrap();
    let stripped = runtime::boot::kernel::read_kernel(&bzimage).unwrap().elf;
    let without = runtime::pmu::rdpmc::find_sites(&stripped).unwrap();
    for s in &with_syms {
        eprintln!("site {s} at physical {:#x}", s.paddr);
        assert!(s.function.is_some(), "{s}: not inside a function symbol");
    }
    assert!(
        !with_syms.is_empty(),
        "the perf driver's RDPMC was not found"
    );
    let addrs =
        |v: &[runtime::pmu::rdpmc::Site]| v.iter().map(|s| (s.vaddr, s.paddr)).collect::<Vec<_>>();
    assert_eq!(addrs(&with_syms), addrs(&without));
}
