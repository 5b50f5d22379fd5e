//! The crate's layers point one way (docs/architecture.md, "Layers"): only the top of the crate
//! (the command line, `compare`, the end-of-run report) may use `crate::vm`; the code a run is
//! made of (vCPU threads, devices, network, vPMU, tracing) and the control surface it shares
//! (`control.rs`) import nothing from `vm`. Reads the source, so it needs no KVM.

use std::path::{Path, PathBuf};

/// Files (relative to vmm/src, `/` separated) allowed to import from `crate::vm`.
fn may_use_vm(rel: &str) -> bool {
    rel.starts_with("vm/")
        || rel.starts_with("compare/")
        || matches!(rel, "cli.rs" | "report.rs" | "main.rs" | "lib.rs")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read vmm/src") {
        let p = e.expect("directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The lines of `src` that name `crate::vm` as a module (not `crate::vmm...` or the like).
fn vm_uses(src: &str) -> Vec<String> {
    src.lines()
        .filter(|l| {
            l.match_indices("crate::vm").any(|(i, m)| {
                let next = l[i + m.len()..].chars().next();
                !matches!(next, Some(c) if c.is_alphanumeric() || c == '_')
            })
        })
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn finds_a_vm_import() {
    // The check below must be able to fail.
    assert_eq!(vm_uses("use crate::vm::VmControl;").len(), 1);
    assert_eq!(vm_uses("x: crate::vm::{Latch, Boot}").len(), 1);
    assert_eq!(vm_uses("use crate::vm;").len(), 1);
    assert!(vm_uses("use crate::vmx::Foo; // crate::vm_state").is_empty());
}

#[test]
fn lower_layers_do_not_import_vm() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("vcpu/mod.rs")),
        "the source tree was not found under {}",
        src.display()
    );
    let mut bad = Vec::new();
    for f in &files {
        let rel = f
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        if may_use_vm(&rel) {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("read a source file");
        for l in vm_uses(&text) {
            bad.push(format!("{rel}: {l}"));
        }
    }
    assert!(
        bad.is_empty(),
        "lower layers import from crate::vm (move the shared item down, e.g. to control.rs \
         or pmu/):\n{}",
        bad.join("\n")
    );
}
