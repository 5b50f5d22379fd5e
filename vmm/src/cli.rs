//! Command-line interface (`vpmu-vmm --help`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use runtime::end::EXIT_CODES_HELP;
// The `trace summary`, `report` and `compare` arguments live with their commands (lower layers
// take no types from the command line); re-exported here, where the command line is put
// together.
pub use crate::compare::args::{CompareArgs, Format, Profiler, Workload};
use crate::disk_arg::{disk_access_cost, parse_disk, DiskArg};
pub use analysis::profile::report::ReportArgs;
pub use analysis::trace::command::SummaryArgs;
use runtime::host_quirks::{HostKind, QuirkSetting};
use runtime::pmu::{BackendChoice, ModelChoice};
use runtime::seccomp::SeccompSetting;
use runtime::trace::{ProfileClock, ProfileConfig, RecordConfig};
use runtime::vm::{
    Boot, DiskConfig, RdpmcSetting, VmConfig, VpmuSetting, DEFAULT_CMDLINE, MAX_MEMORY_MIB,
    MAX_VCPUS, MIN_MEMORY_MIB,
};

#[derive(Parser, Debug)]
#[command(
    name = "vpmu-vmm",
    version,
    about = "A minimal KVM virtual machine monitor that gives guests a virtual PMU",
    long_about = "vpmu-vmm boots a Linux guest on /dev/kvm. The guest gets a virtual PMU whose \
counters charge the guest either only for its own execution (cpu-switch) or also for the VMM's \
work on its behalf (domain-switch), so stock profilers inside the guest see what virtualization costs."
)]
pub struct Cli {
    /// More log output (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Boot a guest kernel and run it until it powers off, reboots, panics or times out.
    #[command(after_help = EXIT_CODES_HELP)]
    Run(Box<RunArgs>),
    /// Profile one workload in cpu-switch and in domain-switch and show the profiles side by
    /// side (table, or with --format json one JSON document, on stdout; CSV and SVG chart in
    /// --out). If the guest goes wrong, the exit code is the run's own (as for `run`); 1 for
    /// bad input.
    Compare(CompareArgs),
    /// Read VM-exit traces written by `run --trace` (docs/tracing.md).
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Host-side guest profile (`run --host-profile`): samples per guest symbol, opreport-style;
    /// with exit records in the same file, the VMM's exit handling beside the guest symbols.
    Report(ReportArgs),
    /// Decode the result frames a guest sent over COM2 (the file of `run --serial2 FILE`):
    /// verify each frame's length and CRC-32, write its payload to DIR/<mode>/<name>, report
    /// damaged, truncated or missing frames (exit code 1 if any); --format json for scripts.
    Results(ResultsArgs),
    /// Write the task layout the host-side profile needs to name guest processes (`run
    /// --task-layout`), derived from a kernel image's own BTF and kallsyms: for kernels this
    /// project did not build (distribution kernels have both). `run --host-profile` does the same
    /// by itself when there is no `task-layout` file beside --kernel.
    TaskLayout(runtime::profile::btf_layout::TaskLayoutArgs),
}

#[derive(Subcommand, Debug)]
pub enum TraceCommand {
    /// Per-vCPU exit reasons (count, time, % of run, mean and p5/p50/p95 cycles), tables per
    /// I/O port, MSR and MMIO address, and the in-guest / in-VMM / halted split of wall time.
    Summary(SummaryArgs),
}

#[derive(clap::Args, Debug)]
pub struct ResultsArgs {
    /// The COM2 output file (`vpmu-vmm run --serial2 FILE`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Directory for the decoded payloads (created if missing).
    #[arg(long, value_name = "DIR", default_value = "vpmu-results")]
    pub out: PathBuf,
    /// What goes to stdout: text = one line per frame; json = one JSON document (schema
    /// vpmu-results/1: the begin line, each frame's seq, name, mode, bytes and file, the
    /// problems, complete or not; docs/guest.md). The exit code is the same either way.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Guest kernel: an ELF vmlinux, or a bzImage (its vmlinux is extracted; gzip, xz, lz4, zstd),
    /// or a Multiboot v1 ELF32 kernel such as kvm-unit-tests' x86/*.flat (entered in 32-bit
    /// protected mode; its environment module gives NR_CPUS, MEMSIZE, MEMLIMIT from --cpus and
    /// --memory; it may end the run through the isa-debug-exit port 0xf4: exit code 11 or 12).
    #[arg(long, value_name = "PATH")]
    pub kernel: PathBuf,
    /// initramfs (cpio, optionally compressed) placed at the top of guest memory.
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,
    /// Extra kernel command line, appended to the defaults
    #[arg(long, value_name = "STR", default_value = "", long_help = format!(
        "Extra kernel command line, appended to the defaults \"{DEFAULT_CMDLINE}\" (and, on hosts that \
emulate guest kernel code, \"{}\"); a later option overrides an earlier one. A Multiboot kernel gets \
its file name followed by this text alone (kvm-unit-tests reads it as its arguments).", runtime::host_quirks::KERNEL_OPTIONS))]
    pub cmdline: String,
    /// Guest memory in MiB.
    #[arg(long, value_name = "MiB", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(MIN_MEMORY_MIB..=MAX_MEMORY_MIB))]
    pub memory: u64,
    /// Number of vCPUs.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=MAX_VCPUS as i64))]
    pub cpus: u32,
    /// Virtual PMU and how the guest is charged.
    #[arg(long, value_enum, default_value_t = VpmuSetting::Off)]
    pub vpmu: VpmuSetting,
    /// PMU the guest sees (auto: the host CPU's vendor). intel on a host that is not Intel makes
    /// the whole guest CPU Intel, not only its PMU MSRs: vendor GenuineIntel, family 6 model
    /// 0x6b (a model no Linux lists, so the guest takes its generic Intel paths and its Intel PMU
    /// driver), Intel-only features hidden, Intel cache/topology leaves. amd on a host that is
    /// not AMD does the mirror: vendor AuthenticAMD, family 0x19 model 0x11 (an EPYC 9004),
    /// Intel-only features and cache leaves hidden, so the guest takes its AMD PMU code.
    #[arg(long, value_enum, default_value_t = ModelChoice::Auto)]
    pub pmu_model: ModelChoice,
    /// Where virtual counts come from: soft = perf software task-clock (runs anywhere; only cycle
    /// events count), hw = perf raw hardware events (needs a host PMU and VT-x/SVM).
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub vpmu_backend: BackendChoice,
    /// At most N PMIs per second per vCPU are delivered (0 = no limit); the rest are counted.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub pmi_limit: u32,
    /// How guest RDPMC reaches the vPMU (docs/vpmu.md, "RDPMC"): patch = rewrite each RDPMC in
    /// the guest kernel to RDMSR before boot (logged per site; refuses a site it cannot prove
    /// safe); trap = no patching: an int3 over the guest's #GP handler brings every faulting
    /// RDPMC (kernel, or user with CR4.PCE) to the VMM, which answers it and passes every other
    /// #GP on; auto = patch, or trap when patching is refused (the log says which); off = leave
    /// it to KVM (it faults on hosts without a PMU).
    #[arg(long, value_enum, default_value_t = RdpmcSetting::Auto)]
    pub rdpmc: RdpmcSetting,
    /// Switch the accounting mode at run time: MODE:SECONDS,... (e.g.
    /// cpu-switch:60,domain-switch:60), each in turn from the start, the last one staying; end
    /// the list with `,repeat` to go round it for the whole run (e.g.
    /// cpu-switch:5,domain-switch:5,repeat interleaves the modes over a boot). The guest can also
    /// switch through the vPMU control port (0x511: 1 = cpu-switch, 2 = domain-switch). Needs
    /// --vpmu cpu-switch or domain-switch.
    #[arg(long, value_name = "LIST")]
    pub vpmu_schedule: Option<runtime::pmu::mode::Schedule>,
    /// Keep the guest's counters from counting some events, as KVM_SET_PMU_EVENT_FILTER: SPEC is
    /// allow:LIST or deny:LIST (e.g. allow:0x3c,0xc0/0x00,fixed=0x3), or a file holding one.
    #[arg(long, value_name = "SPEC", value_parser = parse_event_filter, long_help = EVENT_FILTER_HELP)]
    pub pmu_event_filter: Option<vpmu::EventFilter>,
    /// Write what the guest sends to its second serial port (ttyS1) to FILE.
    #[arg(long, value_name = "FILE")]
    pub serial2: Option<PathBuf>,
    /// Work-arounds for hosts that emulate guest kernel code instead of running it on VT-x/SVM.
    #[arg(long, value_enum, default_value_t = QuirkSetting::Auto)]
    pub host_quirks: QuirkSetting,
    /// Stop the guest after SECS seconds (exit code 7).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Write the guest console to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub console: Option<PathBuf>,
    /// The most the guest may write into the --console and --serial2 files, each, in MiB:
    /// then one line says so and the rest is dropped (counted in the end-of-run report), so a
    /// guest cannot fill the host's disk. 0: no limit.
    #[arg(long, value_name = "MIB", default_value_t = runtime::vm::DEFAULT_OUTPUT_FILE_CAP_MIB)]
    pub output_file_cap_mib: u64,
    /// Record every VM exit that reaches the VMM (reason, port/MSR/MMIO, TSC at exit and
    /// re-entry) to FILE; read it with `vpmu-vmm trace summary FILE`.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Sample each vCPU's guest RIP and CPL from the VMM into FILE (no profiler in the guest);
    /// read it with `vpmu-vmm report FILE`. May be the same FILE as --trace (one file, both).
    #[arg(long, value_name = "FILE")]
    pub host_profile: Option<PathBuf>,
    /// Also write the end-of-run report (exits by kind, PMIs raised/delivered/throttled, mode
    /// switches, network and relay counts, host-quirk fix-ups, the end and the exit code) to FILE
    /// as one JSON document (schema vpmu-run/1; docs/tracing.md). A file, not stdout: stdout
    /// carries the guest console, which a JSON document would run into. The text report still
    /// goes to stderr.
    #[arg(long, value_name = "FILE")]
    pub report_json: Option<PathBuf>,
    /// Host profile samples per second of the sampled clock, per vCPU.
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=20_000))]
    pub host_profile_hz: u32,
    /// What drives the host profile: auto = a cycles counter gated like --vpmu (cpu-switch:
    /// guest time only; domain-switch or off: the VMM's exit handling is charged to the guest).
    #[arg(long, value_enum, default_value_t = ProfileClock::Auto)]
    pub host_profile_clock: ProfileClock,
    /// The guest kernel's task layout (symbol addresses and struct offsets; `guest-image/build.sh
    /// default-kernel` writes `task-layout` beside the kernel), so each host profile sample also
    /// names the guest task it interrupted (pid, tgid, comm). Default: `task-layout` beside
    /// --kernel, if there is one.
    #[arg(long, value_name = "FILE", requires = "host_profile")]
    pub task_layout: Option<PathBuf>,
    /// A virtio-net card (virtio-mmio) whose other end is the VMM: it sends the guest ICMP echo
    /// requests, answers its ARP and checks its replies (docs/virtio-net.md). Appends `ip=` to
    /// the kernel command line.
    #[arg(long)]
    pub net: bool,
    /// With --net: echo requests per second sent to the guest (0: none).
    #[arg(long, value_name = "N", default_value_t = 10, requires = "net",
          value_parser = clap::value_parser!(u32).range(0..=i64::from(runtime::net::MAX_RX_PPS)))]
    pub net_rx_pps: u32,
    /// With --net: extra device-model work per access to the card's registers, busy-waited on
    /// the vCPU thread (stands for a heavyweight device model; docs/accounting-modes.md).
    #[arg(long, value_name = "US", default_value_t = 0, requires = "net",
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub net_access_cost_us: u32,
    /// A virtio-blk disk over a raw image file (repeatable: the first is the guest's /dev/vda,
    /// the next /dev/vdb, ...; at most 8). The image is locked while the VM runs (a second
    /// user is refused); its size must be a whole number of 512-byte sectors. `readonly=on`:
    /// the guest sees a read-only disk and cannot write the file (docs/virtio-blk.md).
    #[arg(long, value_name = "PATH[,readonly=on]", value_parser = parse_disk)]
    pub disk: Vec<DiskArg>,
    /// With --disk: extra device-model work per access to a disk's registers, busy-waited on
    /// the vCPU thread, as --net-access-cost-us. Default: 0 on a VT-x/SVM host; 4000 where
    /// guest kernel code is emulated (host quirks on), scaled like that code
    /// (docs/accounting-modes.md).
    #[arg(long, value_name = "US", requires = "disk",
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub disk_access_cost_us: Option<u32>,
    /// Seccomp filters: on = every VMM thread (vCPUs, main, trace writer, schedule, stdin) is
    /// confined to the system calls it needs; a forbidden call ends the run with a line naming
    /// the thread and the call (exit code 9). off = no filters, for debugging (docs/security.md).
    #[arg(long, value_enum, default_value_t = SeccompSetting::On)]
    pub seccomp: SeccompSetting,
    /// Read and write vCPU registers with ioctls even where the host has KVM_CAP_SYNC_REGS
    /// (for A/B measurements of the exit path).
    #[arg(long, hide = true)]
    pub no_sync_regs: bool,
    /// Nanoseconds of KVM's exit path taken off each KVM_RUN interval the soft backend's
    /// cpu-switch charges, instead of the cost measured at start (0: charge whole intervals;
    /// for A/B measurements).
    #[arg(long, hide = true)]
    pub exit_cost_ns: Option<u64>,
}

const EVENT_FILTER_HELP: &str = "\
Keep the guest's counters from counting some events, as KVM_SET_PMU_EVENT_FILTER does. A \
refused counter is still programmed as far as the guest can tell (its select register reads back \
what it wrote, its value stays where it was: 0 or what the guest wrote), it just never counts. \
The run's summary says how many programmings the filter refused per vCPU. Needs --vpmu \
cpu-switch or domain-switch.

SPEC is inline (it starts with allow: or deny:) or the name of a file holding the same text, \
where newlines also separate items and # starts a comment:
  allow:ITEM,...   only the listed events (and fixed counters) count
  deny:ITEM,...    the listed events (and fixed counters) do not count
  ITEM = EVENT[/UMASK] | fixed=BITMAP
EVENT is an event select (Intel 8 bits, AMD 12 bits: up to 0xfff); without /UMASK it stands for \
every unit mask of that select. fixed=BITMAP: bit i is Intel fixed counter i (0x1 instructions, \
0x2 core cycles, 0x4 reference cycles); fixed counters follow the bitmap alone, so an allow \
list without fixed= stops them all. Numbers are 0x hex or decimal; at most 300 events.
Examples: allow:0x3c,0xc0/0x00,fixed=0x3   deny:0x76,0xc0";

/// Largest `--pmu-event-filter` file read.
const MAX_EVENT_FILTER_FILE: u64 = 1 << 20;

/// Why a `--pmu-event-filter` value was refused (a usage error, clap: exit 2).
#[derive(Debug, thiserror::Error)]
pub enum EventFilterArgError {
    #[error(transparent)]
    Inline(vpmu::FilterError),
    #[error(
        "{spec:?} is neither an inline filter (allow:... or deny:...) nor a filter file: {source}"
    )]
    NotAFile {
        spec: String,
        source: std::io::Error,
    },
    #[error("{spec:?} is neither an inline filter (allow:... or deny:...) nor a filter file: not a regular file")]
    NotRegular { spec: String },
    #[error("{spec}: {len} bytes; a filter file holds at most {MAX_EVENT_FILTER_FILE}")]
    TooBig { spec: String, len: u64 },
    #[error("{spec}: {source}")]
    InFile {
        spec: String,
        source: vpmu::FilterError,
    },
}

/// `--pmu-event-filter SPEC`: inline when it starts with `allow:`/`deny:`, else a file of that
/// syntax. Errors are usage errors (clap: exit 2) naming the bad item.
pub fn parse_event_filter(spec: &str) -> Result<vpmu::EventFilter, EventFilterArgError> {
    let head = spec.trim_start().to_ascii_lowercase();
    if head.starts_with("allow:") || head.starts_with("deny:") {
        return spec.parse().map_err(EventFilterArgError::Inline);
    }
    let not_file = |source| EventFilterArgError::NotAFile {
        spec: spec.to_string(),
        source,
    };
    let meta = std::fs::metadata(spec).map_err(not_file)?;
    if !meta.is_file() {
        return Err(EventFilterArgError::NotRegular {
            spec: spec.to_string(),
        });
    }
    if meta.len() > MAX_EVENT_FILTER_FILE {
        return Err(EventFilterArgError::TooBig {
            spec: spec.to_string(),
            len: meta.len(),
        });
    }
    let text = std::fs::read_to_string(spec).map_err(not_file)?;
    text.parse().map_err(|source| EventFilterArgError::InFile {
        spec: spec.to_string(),
        source,
    })
}

/// Why a `run` command line makes no VM configuration (a usage error, exit 2).
#[derive(Debug, thiserror::Error)]
pub enum RunArgsError {
    #[error("--timeout {0}: must be a positive number of seconds")]
    Timeout(f64),
    #[error("--report-json {}: {} is not a directory", .file.display(), .dir.display())]
    ReportJsonDir { file: PathBuf, dir: PathBuf },
    #[error("{0} needs the vPMU: add --vpmu cpu-switch or domain-switch")]
    NeedsVpmu(&'static str),
}

impl RunArgs {
    pub fn to_config(&self, started: std::time::Instant) -> Result<VmConfig, RunArgsError> {
        let timeout = match self.timeout {
            Some(t) if !(t.is_finite() && t > 0.0) => return Err(RunArgsError::Timeout(t)),
            t => t.map(Duration::from_secs_f64),
        };
        if let Some(f) = &self.report_json {
            // Found out now, not after a run whose report would then be lost.
            let dir = match f.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => std::path::Path::new("."),
            };
            if !dir.is_dir() {
                return Err(RunArgsError::ReportJsonDir {
                    file: f.clone(),
                    dir: dir.to_path_buf(),
                });
            }
        }
        if self.vpmu_schedule.is_some() && self.vpmu == VpmuSetting::Off {
            return Err(RunArgsError::NeedsVpmu("--vpmu-schedule"));
        }
        if self.pmu_event_filter.is_some() && self.vpmu == VpmuSetting::Off {
            return Err(RunArgsError::NeedsVpmu("--pmu-event-filter"));
        }
        let host = HostKind::decide(self.host_quirks);
        Ok(VmConfig {
            boot: Boot::Linux {
                kernel: self.kernel.clone(),
                initrd: self.initrd.clone(),
                cmdline: self.cmdline.clone(),
            },
            memory_mib: self.memory,
            vcpus: self.cpus,
            vpmu: self.vpmu,
            pmu_model: self.pmu_model,
            pmu_backend: self.vpmu_backend,
            pmi_limit: self.pmi_limit,
            rdpmc: self.rdpmc,
            controller: None,
            vpmu_schedule: self.vpmu_schedule.clone(),
            pmu_event_filter: self.pmu_event_filter.clone(),
            io_delay_us: 0,
            const_msrs: Vec::new(),
            net: self.net.then_some(runtime::net::NetConfig {
                rx_pps: self.net_rx_pps,
                access_cost_us: self.net_access_cost_us,
                guest_gate: false,
            }),
            disks: self
                .disk
                .iter()
                .map(|d| DiskConfig {
                    path: d.path.clone(),
                    readonly: d.readonly,
                    access_cost_us: disk_access_cost(self.disk_access_cost_us, host),
                })
                .collect(),
            serial2: self.serial2.clone(),
            host,
            timeout,
            console_out: self.console.clone(),
            output_file_cap_mib: self.output_file_cap_mib,
            console_in: true,
            started: Some(started),
            record: RecordConfig {
                trace: self.trace.clone(),
                profile: self.host_profile.as_ref().map(|p| ProfileConfig {
                    path: p.clone(),
                    hz: self.host_profile_hz,
                    clock: self.host_profile_clock,
                    task_layout: self.task_layout.clone(),
                }),
                pool: Default::default(),
                keep_sampler_time: false,
            },
            panic_vcpu_at_exit: None,
            seccomp: self.seccomp,
            sync_regs: !self.no_sync_regs,
            exit_cost_ns: self.exit_cost_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_filter_is_inline_or_a_file() {
        let f = parse_event_filter("allow:0x3c,fixed=0x3").unwrap();
        assert_eq!(f.to_string(), "allow:0x3c,fixed=0x3");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy");
        std::fs::write(
            &path,
            "# no cycles\ndeny:\n  0x3c   # any unit mask\n  fixed=0x2\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        assert_eq!(
            parse_event_filter(p).unwrap().to_string(),
            "deny:0x3c,fixed=0x2"
        );
        std::fs::write(&path, "deny: 0x3c, 0xzz").unwrap();
        let e = parse_event_filter(p).unwrap_err().to_string();
        assert!(e.starts_with(p) && e.contains("\"0xzz\""), "{e}");
        let e = parse_event_filter("0x3c").unwrap_err().to_string();
        assert!(e.contains("neither an inline filter"), "{e}");
        let e = parse_event_filter(dir.path().to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn disk_given_twice_is_two_disks() {
        let cli = Cli::try_parse_from([
            "vpmu-vmm",
            "run",
            "--kernel",
            "k",
            "--disk",
            "a.img",
            "--disk",
            "b.img,readonly=on",
            "--disk-access-cost-us",
            "7",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        let cfg = run.to_config(std::time::Instant::now()).unwrap();
        let disks: Vec<_> = cfg
            .disks
            .iter()
            .map(|d| (d.path.to_str().unwrap(), d.readonly, d.access_cost_us))
            .collect();
        assert_eq!(disks, [("a.img", false, 7), ("b.img", true, 7)]);
        assert!(
            Cli::try_parse_from([
                "vpmu-vmm",
                "run",
                "--kernel",
                "k",
                "--disk-access-cost-us",
                "7"
            ])
            .is_err(),
            "the cost needs a disk"
        );
    }
}
