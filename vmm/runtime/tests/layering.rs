//! The runtime crate's layers point one way (docs/architecture.md, "Layers"). Between crates
//! Cargo keeps the arrows (vmm -> runtime -> analysis -> vpmu); inside this crate [`ALLOWED`]
//! below is the table of which part of `vmm/runtime/src` may import which; the tests read the source (no KVM) and
//! fail on an import the table does not list, on a table entry that matches no file, and on a
//! cycle in the table that is not a known one ([`KNOWN_CYCLES`]).
//!
//! How to read and change the table:
//! * a *part* is a file (`end.rs`, `vcpu/kick.rs`) or a folder (`pmu/`); a source file belongs
//!   to the most specific part that contains it (`vcpu/kick.rs` is its own part, the other
//!   files of `vcpu/` are the part `vcpu/`);
//! * an import is a `crate::a::b::...` path outside the file's `#[cfg(test)] mod tests`; it
//!   points at the file that defines `a::b` (`a/b.rs` or `a/b/mod.rs`, else `a.rs` / `a/mod.rs`);
//! * the parts are listed from the top (the commands) down to the leaves; a part may import
//!   only the parts on its line. If you need a new import, first ask whether the item belongs
//!   lower down (move it, as `VmControl` went to `control.rs`); add it to the table only if the
//!   arrow still points down.
//!
//! `lib.rs` is the crate's root and may use anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Part -> the parts it may import.
const ALLOWED: &[(&str, &[&str])] = &[
    // One run of a VM: builds it and waits for its end.
    (
        "vm/",
        &[
            "merge.rs",
            "vcpu/",
            "vcpu_access/",
            "last_exits.rs",
            "trace/",
            "trace/recorder.rs",
            "host_quirks/",
            "exit/",
            "devices/",
            "net/",
            "pmu/",
            "boot/",
            "control.rs",
            "console.rs",
            "seccomp/",
            "end.rs",
            "arch/",
            "kvm_error.rs",
            "tsc.rs",
        ],
    ),
    // The vCPU thread: its loop, boot state and CPUID.
    (
        "vcpu/",
        &[
            "merge.rs",
            "vcpu_access/",
            "last_exits.rs",
            "trace/recorder.rs",
            "host_quirks/",
            "exit/",
            "pmu/",
            "devices/",
            "boot/",
            "control.rs",
            "end.rs",
            "kvm_error.rs",
            "arch/",
            "tsc.rs",
        ],
    ),
    // What the loop records: exit records and profile samples.
    (
        "trace/recorder.rs",
        &[
            "trace/",
            "profile/sampler.rs",
            "profile/guest_task/",
            "profile/call_stack.rs",
            "profile/btf_layout.rs",
            "exit/",
            "pmu/",
            "pmu/mode.rs",
            "vcpu_access/",
            "tsc.rs",
        ],
    ),
    // The `report` command and the symbol tables (read trace files).
    (
        "profile/",
        &["trace/", "pmu/mode.rs", "boot/", "profile/guest_task/"],
    ),
    (
        "profile/sampler.rs",
        &["trace/", "pmu/", "pmu/mode.rs", "vcpu_access/", "tsc.rs"],
    ),
    // What a sample reads of the guest (its task, its user stack): run on the vCPU thread by
    // the recorder, and their types written into the trace.
    ("profile/call_stack.rs", &["profile/guest_task/"]),
    // A task layout from the kernel image's BTF and kallsyms (read once at a run's start).
    ("profile/btf_layout.rs", &["profile/guest_task/", "boot/"]),
    // The trace writer (the format, readers and `trace summary` are the analysis crate's).
    ("trace/", &["exit/", "seccomp/", "profile/guest_task/"]),
    ("profile/guest_task/", &["vcpu_access/", "kvm_error.rs"]),
    // Host-specific fix-ups (emulation failures, the SYSCALL relay).
    (
        "host_quirks/",
        &[
            "exit/",
            "vcpu_access/",
            "arch/",
            "end.rs",
            "kvm_error.rs",
            "tsc.rs",
        ],
    ),
    // The vPMU's VMM side: MSR handler, backends, PMI routing.
    (
        "pmu/",
        &[
            "merge.rs",
            "exit/",
            "pmu/mode.rs",
            "arch/",
            "vcpu_access/",
            "seccomp/",
            "tsc.rs",
        ],
    ),
    // One exit -> what to do; its classification (exit/kind.rs).
    (
        "exit/",
        &[
            "merge.rs",
            "devices/",
            "vcpu_access/",
            "end.rs",
            "kvm_error.rs",
            "arch/",
        ],
    ),
    // Devices and the network's VMM end.
    ("devices/", &["net/", "boot/", "pmu/mode.rs", "seccomp/"]),
    ("net/", &["control.rs"]),
    // The control surface a run's threads share.
    (
        "control.rs",
        &[
            "pmu/mode.rs",
            "vcpu_access/",
            "last_exits.rs",
            "console.rs",
            "end.rs",
            "stop_signal.rs",
        ],
    ),
    // Each vCPU's last exits (the end-of-run diagnostic).
    ("last_exits.rs", &[]),
    // A vCPU as the other parts touch it: registers, MSRs and guest memory (the access layer),
    // kicks out of KVM_RUN, LAPIC registers.
    ("vcpu_access/", &["arch/", "kvm_error.rs", "tsc.rs"]),
    ("pmu/mode.rs", &["seccomp/", "tsc.rs"]),
    ("seccomp/", &["end.rs"]),
    ("end.rs", &["kvm_error.rs", "stop_signal.rs"]),
    ("boot/", &[]),
    // Leaves.
    ("kvm_error.rs", &[]),
    ("arch/", &[]),
    ("console.rs", &[]),
    ("stop_signal.rs", &[]),
    ("tsc.rs", &[]),
    ("merge.rs", &[]),
];

/// Cycles the table may have, at this granularity (each pair may import the other): none. A new
/// one fails the test; list it here only with the reason it cannot be untied.
const KNOWN_CYCLES: &[(&str, &str)] = &[];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read vmm/runtime/src") {
        let p = e.expect("directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The part a file (relative to src, `/` separated) belongs to.
fn part_of(rel: &str) -> Option<&'static str> {
    ALLOWED
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| rel == *p || (p.ends_with('/') && rel.starts_with(p)))
        .max_by_key(|p| p.len())
}

/// The file that defines `crate::a::b::...` (the longest prefix that is a module file).
fn module_file(src: &Path, segments: &[&str]) -> Option<String> {
    (1..=segments.len()).rev().find_map(|n| {
        let p = segments[..n].join("/");
        [format!("{p}.rs"), format!("{p}/mod.rs")]
            .into_iter()
            .find(|c| src.join(c).is_file())
    })
}

/// The text of a file without its `#[cfg(test)] mod tests` and comment lines.
fn code(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    let end = text[..end]
        .find("#[cfg(test)]\npub(super) mod tests")
        .unwrap_or(end);
    text[..end]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `crate::` paths in `code`, as segment lists (`use crate::{a, b::c}` gives two).
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        if i > 0 && code[..i].ends_with(ident) {
            continue; // e.g. `mycrate::`
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for item in inner.split(',') {
                let segs: Vec<String> = item
                    .trim()
                    .split("::")
                    .map(|s| s.chars().take_while(|c| ident(*c)).collect::<String>())
                    .take_while(|s| !s.is_empty())
                    .collect();
                if !segs.is_empty() {
                    out.push(segs);
                }
            }
            continue;
        }
        let mut segs = Vec::new();
        let mut r = rest;
        loop {
            let name: String = r.chars().take_while(|c| ident(*c)).collect();
            if name.is_empty() {
                break;
            }
            r = &r[name.len()..];
            segs.push(name);
            match r.strip_prefix("::") {
                Some(more) => r = more,
                None => break,
            }
        }
        if !segs.is_empty() {
            out.push(segs);
        }
    }
    out
}

#[test]
fn the_checker_finds_imports() {
    // The checks below must be able to fail.
    let p = crate_paths("use crate::vm::VmControl;\nlet x: crate::vcpu_access::kick::Kick;");
    assert_eq!(
        p,
        vec![vec!["vm", "VmControl"], vec!["vcpu_access", "kick", "Kick"]]
    );
    assert_eq!(
        crate_paths("use crate::{end::VmEnd, tsc};"),
        vec![vec!["end", "VmEnd"], vec!["tsc"]]
    );
    assert!(crate_paths("use mycrate::vm;").is_empty());
    let src = src_dir();
    assert_eq!(
        module_file(&src, &["vcpu_access", "kick", "KickTimer"]).as_deref(),
        Some("vcpu_access/kick.rs")
    );
    assert_eq!(
        module_file(&src, &["vm", "VmConfig"]).as_deref(),
        Some("vm/mod.rs")
    );
    assert_eq!(part_of("vcpu/run_loop.rs"), Some("vcpu/"));
    assert_eq!(part_of("pmu/mode.rs"), Some("pmu/mode.rs"));
    assert_eq!(part_of("pmu/rdpmc.rs"), Some("pmu/"));
    assert_eq!(part_of("exit/kind.rs"), Some("exit/"));
}

#[test]
fn every_import_is_in_the_table() {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("vcpu/mod.rs")),
        "the source tree was not found under {}",
        src.display()
    );
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut bad = Vec::new();
    let mut used_parts = BTreeSet::new();
    for f in &files {
        let rel = f
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        if rel == "lib.rs" {
            continue;
        }
        let Some(from) = part_of(&rel) else {
            bad.push(format!(
                "{rel}: in no part of the table (add it to ALLOWED)"
            ));
            continue;
        };
        used_parts.insert(from);
        let text = std::fs::read_to_string(f).expect("read a source file");
        for path in crate_paths(&code(&text)) {
            let segs: Vec<&str> = path.iter().map(String::as_str).collect();
            let Some(target) = module_file(&src, &segs) else {
                continue; // an item of the crate root (lib.rs)
            };
            let Some(to) = part_of(&target) else { continue };
            if to != from && !allowed[from].contains(&to) {
                bad.push(format!(
                    "{rel} ({from}) imports crate::{} ({to})",
                    path.join("::")
                ));
            }
        }
    }
    bad.sort();
    bad.dedup();
    let unused: Vec<&str> = ALLOWED
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| !used_parts.contains(p))
        .collect();
    assert!(unused.is_empty(), "table parts with no file: {unused:?}");
    assert!(
        bad.is_empty(),
        "imports the layer table (tests/layering.rs, ALLOWED) does not allow; move the shared \
         item down, or, if the arrow still points down, add it to the table:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_table_has_no_new_cycles() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    for (from, tos) in ALLOWED {
        for to in *tos {
            assert!(
                allowed.contains_key(to),
                "{from} lists {to}, which is not a part"
            );
        }
    }
    // Depth-first search for a path back to the start, ignoring the known cycles' edges.
    let known = |a: &str, b: &str| {
        KNOWN_CYCLES
            .iter()
            .any(|(x, y)| (a == *x && b == *y) || (a == *y && b == *x))
    };
    for (start, _) in ALLOWED {
        let mut stack: Vec<(&str, Vec<&str>)> = vec![(start, vec![start])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for to in allowed[at].iter().copied() {
                if known(at, to) {
                    continue;
                }
                if to == *start {
                    panic!("cycle in the layer table: {} -> {to}", path.join(" -> "));
                }
                if seen.insert(to) {
                    let mut p = path.clone();
                    p.push(to);
                    stack.push((to, p));
                }
            }
        }
    }
}

/// Files allowed to import from `crate::vm` (the table says the same; this message is the one
/// a newcomer most often needs).
fn may_use_vm(rel: &str) -> bool {
    rel.starts_with("vm/") || rel == "lib.rs"
}

#[test]
fn lower_layers_do_not_import_vm() {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
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
        if crate_paths(&text).iter().any(|p| p[0] == "vm") {
            bad.push(rel);
        }
    }
    assert!(
        bad.is_empty(),
        "lower layers import from crate::vm (move the shared item down, e.g. to control.rs \
         or pmu/): {bad:?}"
    );
}
