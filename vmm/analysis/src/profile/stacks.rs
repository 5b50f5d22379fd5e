//! The host-side profile by guest process, and the formats other tools read (issue 19):
//!
//! * [`by_process`]: samples per (process, object, symbol) — the process is the guest task the
//!   sample interrupted (`comm[tgid]`, from the trace's task records: `profile::guest_task`), the
//!   object a user-space sample's executable, the symbol its function when the guest's files are
//!   given (`profile::user_symbols`);
//! * [`folded`]: one line per distinct stack, `process;[object;callers...;]symbol[;[vmm] exit]
//!   COUNT`, the input of
//!   flame-graph tools (Brendan Gregg's flamegraph.pl, inferno, speedscope). Kernel symbols carry
//!   the `_[k]` suffix those tools colour as kernel code. A sample that arrived while the VMM
//!   handled an exit (domain-switch) gets the exit as its leaf frame: the VMM's work shows on top
//!   of the guest code that caused it;
//! * [`flame_graph`]: that folded profile drawn as an SVG flame graph (the inferno crate);
//! * [`json`]: the per-(process, symbol) rows as one JSON document (schema `vpmu-profile/1`).
//!
//! Stacks: the process, the executable, the callers by frame pointers (`profile::call_stack`:
//! user-space ones resolved with the guest's files, kernel ones with the kernel's symbols), the
//! sampled symbol, and the VMM's exit on top.

use std::collections::HashMap;

use super::symbols::{bucket, SymbolTable, USER_BUCKET_NAMED};
use super::user_symbols::{GuestFiles, UserFrame};
use crate::guest_task::GuestMapping;
use crate::guest_task::{printable, GuestExe, GuestTask, Unresolved};
use crate::trace::format::{FormatError, Header, Record};
use crate::trace::read::{for_each_sample, Records};

/// A sample with no task record (the run knew no task layout).
pub(crate) const NO_PROCESS: &str = "[no process information]";
/// The object of a user-space sample in memory no file backs (JIT code, the vDSO's data).
pub(crate) const ANONYMOUS: &str = "[no file: anonymous memory or vDSO]";

#[derive(Debug, thiserror::Error)]
pub enum StacksError {
    #[error("drawing the flame graph: {0}")]
    FlameGraph(std::io::Error),
}

/// The process a sample names: `comm[tgid]`, or why it names none.
pub fn process_label(task: Option<&Result<GuestTask, Unresolved>>) -> String {
    match task {
        Some(Ok(t)) => t.label(),
        Some(Err(u)) => format!("[unresolved: {}]", u.describe()),
        None => NO_PROCESS.to_string(),
    }
}

/// One sample as the views see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frames {
    pub process: String,
    /// The executable a user-space sample ran in (its guest path with the guest's files, else
    /// its file name); empty for kernel samples and samples that name none.
    pub object: String,
    pub symbol: String,
    /// The user-space callers (outermost first), resolved with the guest's files; empty
    /// without them or without a stack.
    pub callers: Vec<String>,
    pub kernel: bool,
    /// The exit the VMM was handling when the sample came (None: the guest was running).
    pub vmm: Option<String>,
}

/// Every sample of `t` (counted in `mode`; None: all), with the task and exe records after it;
/// user-space RIPs resolved with the guest's files when given.
pub fn samples(
    t: &dyn Records,
    syms: Option<&SymbolTable>,
    mode: Option<vpmu::AccountingMode>,
    mut files: Option<&mut GuestFiles>,
) -> Result<HashMap<Frames, u64>, FormatError> {
    let mut out: HashMap<Frames, u64> = HashMap::new();
    for_each_sample(t, &mut |_, r, notes| {
        let Record::Sample {
            rip,
            cpl,
            during,
            mode: m,
            ..
        } = *r
        else {
            return;
        };
        if mode.is_some() && m != mode {
            return;
        }
        let (task, exe) = (notes.task.as_ref(), notes.exe.as_ref());
        let callers = match (exe, files.as_deref_mut()) {
            _ if cpl != 3 => kernel_callers(&notes.frames, syms),
            (Some(Ok(e)), Some(f)) => {
                // A frameless leaf's caller (at [rsp]) comes before the walk's frames.
                let leaf_caller = notes
                    .stack_top
                    .and_then(|top| f.frameless_caller(e, rip, top));
                // The files mapped at the sample's addresses: the RIP's, then its callers'.
                let mapped: Vec<&GuestMapping> = match &notes.mapping {
                    Some(Ok(m)) if !m.anonymous() => Some(m),
                    _ => None,
                }
                .into_iter()
                .chain(&notes.caller_mappings)
                .collect();
                leaf_caller
                    .iter()
                    .chain(&notes.frames)
                    .rev()
                    .map(|&ret| caller(f, e, &mapped, ret))
                    .collect()
            }
            _ => Vec::new(),
        };
        let (object, symbol) = match (cpl, task, exe) {
            (3, _, Some(Ok(e))) => match &notes.mapping {
                Some(m) => mapped_frame(m, rip, files.as_deref_mut()),
                None => user_frame(e, rip, files.as_deref_mut()),
            },
            (3, _, Some(Err(u))) => (
                format!("[unresolved: {}]", u.describe()),
                USER_BUCKET_NAMED.to_string(),
            ),
            (3, Some(_), None) => (String::new(), USER_BUCKET_NAMED.to_string()),
            _ => (String::new(), bucket(rip, cpl, syms)),
        };
        let f = Frames {
            process: process_label(task),
            object,
            symbol,
            callers,
            kernel: cpl != 3,
            vmm: during.map(|(e, _)| format!("[vmm] {}", e.describe())),
        };
        *out.entry(f).or_default() += 1;
    })?;
    Ok(out)
}

/// Whether any of the samples names its guest task (the run knew the kernel's task layout).
pub(crate) fn names_tasks(samples: &HashMap<Frames, u64>) -> bool {
    samples.keys().any(|f| f.process != NO_PROCESS)
}

/// A user-space sample outside its executable's code: (object, symbol) of the mapping it lies
/// in — a library's function with the guest's files, else the file's name.
fn mapped_frame(
    m: &Result<GuestMapping, Unresolved>,
    rip: u64,
    files: Option<&mut GuestFiles>,
) -> (String, String) {
    let m = match m {
        Ok(m) if m.anonymous() => {
            return (ANONYMOUS.to_string(), USER_BUCKET_NAMED.to_string());
        }
        Ok(m) => m,
        Err(u) => {
            return (
                format!("[unresolved: {}]", u.describe()),
                USER_BUCKET_NAMED.to_string(),
            )
        }
    };
    let name = shown_name(m.name(), m.truncated());
    named_frame(name, files.map(|f| f.resolve_mapping(m, rip)))
}

/// A user-space sample's (object, symbol): the function with the guest's files, else the
/// executable's name and the user-space bucket.
fn user_frame(exe: &GuestExe, rip: u64, files: Option<&mut GuestFiles>) -> (String, String) {
    let name = shown_name(exe.name(), exe.truncated());
    named_frame(name, files.map(|f| f.resolve(exe, rip)))
}

/// A file name as a sample recorded it (its first bytes; `...` when it was longer).
fn shown_name(name: String, truncated: bool) -> String {
    let name = printable(&name);
    if truncated {
        format!("{name}...")
    } else {
        name
    }
}

/// (object, symbol) of a user frame: what the guest's files resolved (None: no files given),
/// with `name` (the recorded file name) where no file was found. A file found without a symbol
/// there is named by its own (full) file name.
fn named_frame(name: String, resolved: Option<UserFrame>) -> (String, String) {
    match resolved {
        Some(UserFrame::Resolved { object, function }) => (object, function),
        Some(UserFrame::NoSymbol { object }) => {
            let file = object.rsplit('/').next().unwrap_or(&object).to_string();
            (object, format!("[{file}, no symbol]"))
        }
        Some(UserFrame::NoFile { why, .. }) => (name, format!("[{why}]")),
        None => (name, USER_BUCKET_NAMED.to_string()),
    }
}

/// A kernel sample's callers (outermost first), from its return addresses, with the kernel's
/// symbols (a return address no symbol covers: its hex value).
pub fn kernel_callers(frames: &[u64], syms: Option<&SymbolTable>) -> Vec<String> {
    frames
        .iter()
        .rev()
        .map(
            |&ret| match syms.and_then(|t| t.resolve(ret.wrapping_sub(1))) {
                Some((name, _)) => name.to_string(),
                None => format!("[{ret:#x}]"),
            },
        )
        .collect()
}

/// A return address's function (looked up at `ret - 1`: the call instruction, which a
/// tail-position call would otherwise put in the next function): in the executable, else in
/// the recorded mapping holding it (`mapped`: the RIP's and the callers' in other libraries)
/// by that file's symbols, else its address.
fn caller(files: &mut GuestFiles, exe: &GuestExe, mapped: &[&GuestMapping], ret: u64) -> String {
    if let UserFrame::Resolved { function, .. } = files.resolve(exe, ret.wrapping_sub(1)) {
        return function;
    }
    // Mappings do not overlap: the one holding the call, if recorded, starts closest below it.
    let at = ret.wrapping_sub(1);
    mapped
        .iter()
        .filter(|m| m.vm_start <= at)
        .max_by_key(|m| m.vm_start)
        .and_then(|m| files.caller_in_mapping(m, ret))
        .unwrap_or_else(|| format!("[{ret:#x}]"))
}

/// Samples per (process, object, symbol).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessRow {
    pub process: String,
    pub object: String,
    pub symbol: String,
    pub samples: u64,
    /// Of which taken while the VMM handled an exit.
    pub in_exit: u64,
}

/// Samples per (process, symbol), most first (ties by process, then symbol).
pub fn by_process(samples: &HashMap<Frames, u64>) -> Vec<ProcessRow> {
    let mut rows: HashMap<(&str, &str, &str), ProcessRow> = HashMap::new();
    for (f, &n) in samples {
        let row = rows
            .entry((&f.process, &f.object, &f.symbol))
            .or_insert_with(|| ProcessRow {
                process: f.process.clone(),
                object: f.object.clone(),
                symbol: f.symbol.clone(),
                ..Default::default()
            });
        row.samples += n;
        row.in_exit += if f.vmm.is_some() { n } else { 0 };
    }
    let mut rows: Vec<ProcessRow> = rows.into_values().collect();
    rows.sort_by(|a, b| {
        b.samples
            .cmp(&a.samples)
            .then_with(|| a.process.cmp(&b.process))
            .then_with(|| a.object.cmp(&b.object))
            .then_with(|| a.symbol.cmp(&b.symbol))
    });
    rows
}

/// Flame-graph tools split frames at `;` and the count at the last space: keep both out of names.
fn frame(name: &str) -> String {
    name.replace(';', ":").replace('\n', " ")
}

/// The folded profile (module comment), lines sorted so equal inputs give equal files.
pub fn folded(samples: &HashMap<Frames, u64>) -> String {
    let mut lines: Vec<String> = samples
        .iter()
        .map(|(f, n)| {
            let mut s = frame(&f.process);
            s.push(';');
            if !f.object.is_empty() && !f.kernel {
                s.push_str(&frame(&f.object));
                s.push(';');
            }
            for c in &f.callers {
                s.push_str(&frame(c));
                if f.kernel {
                    s.push_str("_[k]");
                }
                s.push(';');
            }
            s.push_str(&frame(&f.symbol));
            if f.kernel {
                s.push_str("_[k]");
            }
            if let Some(v) = &f.vmm {
                s.push(';');
                s.push_str(&frame(v));
            }
            format!("{s} {n}")
        })
        .collect();
    lines.sort();
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// The folded profile drawn as an SVG flame graph.
pub(crate) fn flame_graph(folded: &str, title: &str) -> Result<Vec<u8>, StacksError> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = "samples".into();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, folded.lines(), &mut svg)
        .map_err(StacksError::FlameGraph)?;
    Ok(svg)
}

/// A differential flame graph of two folded profiles (`before`, `after`): frames are drawn at
/// `after`'s width and coloured by how their share changed (red: grew, blue: shrank), with
/// `before` scaled to `after`'s total (inferno's differential mode, as Brendan Gregg's
/// difffolded.pl + flamegraph.pl).
pub fn differential_flame_graph(
    before: &str,
    after: &str,
    title: &str,
) -> Result<Vec<u8>, StacksError> {
    let mut diff = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options {
            normalize: true,
            strip_hex: false,
        },
        before.as_bytes(),
        after.as_bytes(),
        &mut diff,
    )
    .map_err(StacksError::FlameGraph)?;
    let text = String::from_utf8_lossy(&diff);
    flame_graph(&text, title)
}

/// The rows as JSON (schema `vpmu-profile/1`): the file's clock and period, and each
/// (process, symbol) row's samples, in-exit samples and share.
pub fn json(h: &Header, rows: &[ProcessRow], symbols: &str) -> serde_json::Value {
    let total: u64 = rows.iter().map(|r| r.samples).sum();
    let doc = ProfileDoc {
        schema: "vpmu-profile/1",
        vcpus: h.vcpus,
        clock: h.sample_clock.describe(),
        sample_period_ns: h.sample_period_ns,
        symbols,
        samples: total,
        rows: rows
            .iter()
            .map(|r| ProfileRowDoc {
                process: &r.process,
                object: &r.object,
                symbol: &r.symbol,
                samples: r.samples,
                in_exit: r.in_exit,
                percent: r.samples as f64 * 100.0 / total.max(1) as f64,
            })
            .collect(),
    };
    serde_json::to_value(doc).expect("plain values")
}

/// The `vpmu-profile/1` document.
#[derive(serde::Serialize)]
struct ProfileDoc<'a> {
    schema: &'static str,
    vcpus: u16,
    clock: &'static str,
    sample_period_ns: u64,
    /// Where the symbols came from.
    symbols: &'a str,
    samples: u64,
    rows: Vec<ProfileRowDoc<'a>>,
}

#[derive(serde::Serialize)]
struct ProfileRowDoc<'a> {
    process: &'a str,
    object: &'a str,
    symbol: &'a str,
    samples: u64,
    in_exit: u64,
    percent: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_task::{Step, COMM_MAX};
    use crate::trace::format::{ExitEvent, Reason, Trace, VcpuTrace, CONTENTS_SAMPLES};

    fn task(comm: &str, tgid: u32) -> Record {
        let mut c = [0u8; COMM_MAX];
        c[..comm.len()].copy_from_slice(comm.as_bytes());
        Record::Task {
            cr3: 0x1000,
            task: Ok(GuestTask {
                pid: tgid,
                tgid,
                comm: c,
                kernel_thread: false,
            }),
        }
    }

    fn sample(rip: u64, cpl: u8, during: bool) -> Record {
        Record::Sample {
            rip,
            cpl,
            tsc: 1,
            during: during.then_some((ExitEvent::new(Reason::IoOut), 1)),
            mode: None,
        }
    }

    fn trace() -> Trace {
        Trace {
            header: Header::for_tests(CONTENTS_SAMPLES),
            vcpus: vec![VcpuTrace {
                records: vec![
                    sample(0x40_0000, 3, false),
                    task("cpu_split", 42),
                    sample(0x40_0010, 3, false),
                    task("cpu_split", 42),
                    sample(0xffff_ffff_8100_0010, 0, true),
                    task("dd", 7),
                    sample(0xffff_ffff_8100_0010, 0, false),
                    Record::Task {
                        cr3: 0,
                        task: Err(Unresolved::NotMapped(Step::CurrentTask)),
                    },
                    // A file without task records: the sample names no process.
                    sample(0x40_0000, 3, false),
                ],
                dropped: 0,
                end_tsc: 10,
                end_thread_cpu_ns: 10,
            }],
        }
    }

    fn syms() -> SymbolTable {
        SymbolTable::parse_system_map("ffffffff81000000 T vm_notify\n", "m").unwrap()
    }

    #[test]
    fn samples_name_their_process_and_the_vmm_exit_on_top() {
        let s = samples(&trace(), Some(&syms()), None, None).unwrap();
        let rows = by_process(&s);
        assert_eq!(
            (
                rows[0].process.as_str(),
                rows[0].symbol.as_str(),
                rows[0].samples
            ),
            ("cpu_split[42]", USER_BUCKET_NAMED, 2)
        );
        let find = |p: &str| rows.iter().find(|r| r.process.starts_with(p)).unwrap();
        assert_eq!(
            (find("dd[7]").symbol.as_str(), find("dd[7]").in_exit),
            ("vm_notify", 1)
        );
        assert_eq!(
            find("[unresolved").process,
            "[unresolved: current_task not mapped]"
        );
        assert_eq!(
            find(NO_PROCESS).symbol,
            crate::profile::symbols::USER_BUCKET
        );
        let f = folded(&s);
        assert!(
            f.contains("cpu_split[42];[guest user space, CPL 3] 2\n"),
            "{f}"
        );
        assert!(
            f.contains("dd[7];vm_notify_[k];[vmm] pio 0x0 out 1\n")
                || f.contains("dd[7];vm_notify_[k];[vmm] "),
            "{f}"
        );
        assert_eq!(f.lines().count(), 4);
        let svg = flame_graph(&f, "test").unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(
            svg.starts_with("<?xml") && svg.contains("cpu_split[42]"),
            "an SVG naming the process"
        );
        let j = json(&trace().header, &rows, "m");
        assert_eq!(j["schema"], "vpmu-profile/1");
        assert_eq!(j["samples"], 5);
        assert_eq!(j["rows"][0]["process"], "cpu_split[42]");
    }

    /// A text function of this test binary (size > 16) and where a library mapping of it at
    /// `vm_start` puts it: (address + 4, name), and the mapping's page offset.
    fn function_in_mapping(nth: usize, vm_start: u64) -> (u64, u32) {
        use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let f = object::File::parse(&*bytes).unwrap();
        let seg = f
            .segments()
            .find(|s| {
                let flags = s.flags();
                matches!(flags, object::SegmentFlags::Elf { p_flags } if p_flags & 1 != 0)
            })
            .unwrap();
        let (p_offset, _) = seg.file_range();
        let sym = f
            .symbols()
            .filter(|s| {
                s.kind() == SymbolKind::Text
                    && s.size() > 16
                    && (seg.address()..seg.address() + seg.size()).contains(&s.address())
            })
            .nth(nth)
            .unwrap();
        let pgoff = p_offset >> 12;
        let addr = vm_start + (sym.address() + 4 - seg.address() + p_offset) - (pgoff << 12);
        (addr, pgoff as u32)
    }

    #[test]
    fn callers_in_another_library_are_named_with_that_librarys_mapping() {
        use crate::profile::user_symbols::exe_name_bytes;
        // The test binary stands in for two libraries and the executable.
        let me = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::copy(&me, lib.join("liba.so")).unwrap();
        std::fs::copy(&me, lib.join("libb.so")).unwrap();
        let mut files = GuestFiles::open(dir.path()).unwrap();
        let (a_start, b_start) = (0x7f00_0000_0000u64, 0x7e00_0000_0000u64);
        let (rip, pgoff) = function_in_mapping(0, a_start);
        let (ret_b, _) = function_in_mapping(1, b_start);
        let mapping = |name: &str, vm_start| {
            let (name, name_len) = exe_name_bytes(name);
            GuestMapping {
                name,
                name_len,
                vm_start,
                pgoff,
            }
        };
        let (liba, libb) = (mapping("liba.so", a_start), mapping("libb.so", b_start));
        let want_b = match files.resolve_mapping(&libb, ret_b - 1) {
            UserFrame::Resolved { function, .. } => function,
            other => panic!("{other:?}"),
        };
        let (name, name_len) = exe_name_bytes("prog");
        let exe = GuestExe {
            name,
            name_len,
            start_code: 0x40_1000,
            code_size: 0x1000,
        };
        let trace = |caller_mapping: bool| {
            let mut records = vec![
                sample(rip, 3, false),
                task("prog", 9),
                Record::Exe(Ok(exe)),
                Record::Mapping(Ok(liba)),
                Record::CallFrames {
                    count: 2,
                    addrs: [ret_b, 0x40_1100, 0],
                },
            ];
            if caller_mapping {
                records.push(Record::CallerMapping(libb));
            }
            let mut t = trace();
            t.vcpus[0].records = records;
            t
        };
        let callers = |t: &Trace, files: &mut GuestFiles| {
            let s = samples(t, None, None, Some(files)).unwrap();
            s.into_keys().next().unwrap().callers
        };
        // Outermost first: the executable's frame (no such file here: its address), then libb.
        assert_eq!(
            callers(&trace(true), &mut files),
            ["[0x401100]".to_string(), want_b]
        );
        // Without libb's record its frame is an address, never a guess from liba.
        assert_eq!(
            callers(&trace(false), &mut files),
            ["[0x401100]".to_string(), format!("[{ret_b:#x}]")]
        );
    }

    #[test]
    fn a_file_without_a_symbol_there_is_named_by_its_whole_name() {
        // ld.so's name is longer than a record keeps (16 bytes): the file found says it whole.
        let recorded = shown_name("ld-linux-x86-64.".into(), true);
        let object = "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2".to_string();
        assert_eq!(
            named_frame(recorded.clone(), Some(UserFrame::NoSymbol { object })),
            (
                "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2".to_string(),
                "[ld-linux-x86-64.so.2, no symbol]".to_string()
            )
        );
        // No files given: the recorded name, marked as cut.
        assert_eq!(
            named_frame(recorded, None),
            (
                "ld-linux-x86-64....".to_string(),
                USER_BUCKET_NAMED.to_string()
            )
        );
    }

    #[test]
    fn a_differential_flame_graph_shows_what_grew() {
        let before = "p;vm_interrupt_[k] 10\np;default_idle_[k] 990\n";
        let after = "p;vm_interrupt_[k] 100\np;vm_interrupt_[k];[vmm] mmio 0xd0000050 wr 400\n\
                     p;default_idle_[k] 500\n";
        let svg = String::from_utf8(differential_flame_graph(before, after, "t").unwrap()).unwrap();
        assert!(
            svg.starts_with("<?xml") && svg.contains("[vmm] mmio"),
            "the VMM's frame is drawn"
        );
    }

    #[test]
    fn names_cannot_break_the_folded_format() {
        let mut m = HashMap::new();
        m.insert(
            Frames {
                process: "a;b[1]".into(),
                object: String::new(),
                symbol: "x\ny".into(),
                callers: Vec::new(),
                kernel: false,
                vmm: None,
            },
            3,
        );
        assert_eq!(folded(&m), "a:b[1];x y 3\n");
    }
}
