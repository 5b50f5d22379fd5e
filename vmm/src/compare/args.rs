//! `compare`'s arguments (part of the command line in `cli.rs`), and the output format it
//! shares with `results`.

use std::path::PathBuf;

use crate::disk_arg::{parse_disk, DiskArg};
use runtime::pmu::ModelChoice;

/// Workloads of `vpmu-vmm compare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// A bare-metal tiny guest that samples itself with the vPMU: an I/O-heavy function (port
    /// writes to a device whose emulation takes --io-delay-us on the vCPU thread) and a
    /// CPU-bound control. One boot, seconds.
    Tiny,
    /// Packet receive on a stock Linux guest (needs --kernel and --initrd): the VMM's virtio-net
    /// card feeds it ICMP echo requests, the guest kernel answers them; profiled from the host
    /// in both modes, plus a CPU-bound control (no packets). One boot, minutes.
    PacketRx,
    /// Your command in a stock Linux guest (needs --kernel and --disk: the root filesystem, then
    /// any disks your command uses): `compare --workload command -- CMD [ARGS]` runs CMD in the
    /// guest once per mode, profiled system-wide by the guest's own perf (the default here) or
    /// OProfile, plus the CPU-bound control. The words of CMD are joined with spaces and run by
    /// the guest's `sh -c`, as ssh runs a remote command. One boot, minutes.
    Command,
}

/// Who takes the samples in `vpmu-vmm compare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profiler {
    /// The VMM samples the guest RIP with a cycles counter that follows the accounting mode
    /// (no profiler in the guest; runs on any host).
    Host,
    /// The guest's own `perf record` (packet-rx only; --initrd must be the default initramfs
    /// with perf; guest user space: a VT-x/SVM host, or this project's SYSCALL relay). The
    /// packets flow only while the guest profiles the whole system: it opens the VMM's packet
    /// gate (port 0x512) for those seconds.
    Perf,
    /// The guest's own OProfile `operf` (as perf).
    Oprofile,
}

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// What to profile.
    #[arg(long, value_enum, default_value_t = Workload::Tiny)]
    pub workload: Workload,
    /// Who samples: the VMM from the host, or the guest's own stock profiler. Default: host,
    /// but perf for --workload command (the host-side comparison runs only its own packet-rx
    /// guest; `run --host-profile` and `report --guest-files` profile your program from the host).
    #[arg(long, value_enum)]
    pub profiler: Option<Profiler>,
    /// Directory for the CSV and SVG files (created if missing).
    #[arg(long, value_name = "DIR", default_value = "vpmu-compare")]
    pub out: PathBuf,
    /// packet-rx: the guest kernel (ELF vmlinux or bzImage; its kallsyms name the functions).
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// packet-rx: the initramfs: with --profiler host one whose /init keeps running
    /// (guest-image's spin-initramfs); with --profiler perf|oprofile the default initramfs (or
    /// --disk instead).
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,
    /// --profiler perf|oprofile, --workload command: the guest's disks, as `run --disk`
    /// (repeatable). The first is the root filesystem instead of --initrd (guest-image's rootfs:
    /// `eval "$(guest-image/build.sh paths)"`, then --disk "$ROOTFS"), always attached read-only
    /// as /dev/vda (`root=/dev/vda ro`; compare never writes it, so several runs can share it;
    /// the guest's work files go to its tmpfs); the next are /dev/vdb, ... for your command's
    /// data (read-write unless `readonly=on`). The guest kernel no longer copies a 49 MB
    /// initramfs in at boot (minutes where its code is emulated).
    #[arg(long, value_name = "PATH[,readonly=on]", value_parser = parse_disk,
          conflicts_with = "initrd")]
    pub disk: Vec<DiskArg>,
    /// With --disk: extra device-model work per access to the disk's registers, as
    /// `run --disk-access-cost-us` (default: 0 on a VT-x/SVM host, scaled where guest kernel code
    /// is emulated).
    #[arg(long, value_name = "US", requires = "disk",
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub disk_access_cost_us: Option<u32>,
    /// packet-rx: seconds of each of the four phases (packets and the CPU-bound control, each in
    /// cpu-switch and in domain-switch); each phase runs as --rounds interleaved slices. With
    /// --profiler perf|oprofile: seconds of the guest's system-wide profile in each mode.
    /// command: the longest the command may run in each mode (the run's time limit follows).
    #[arg(long, value_name = "SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub phase_secs: u64,
    /// packet-rx: the phases are interleaved in N rounds (the order of the modes swapped every
    /// other round), so drift in the guest's own activity falls on both modes alike.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// packet-rx: echo requests per second in the packet phases.
    #[arg(long, value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(runtime::net::MAX_RX_PPS)))]
    pub net_rx_pps: u32,
    /// packet-rx: extra device-model work per access to the virtio-net card's registers
    /// (busy-wait on the vCPU thread). Default: 0 on a VT-x/SVM host; 4000 where guest kernel
    /// code is emulated (~1000x slower: this project's build hosts), where the VMM's real
    /// per-access work, microseconds, would be lost next to the guest's emulated driver code:
    /// 4000 stands for a 4 us user-space device-model round trip scaled alike
    /// (docs/accounting-modes.md).
    #[arg(long, value_name = "US",
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub net_access_cost_us: Option<u32>,
    /// --profiler perf|oprofile: the guest profiler's sampling period, in cycles, while it
    /// profiles the whole system (perf record -c, operf EVENT:PERIOD). Default: 200000000 where
    /// guest kernel code is emulated (this project's build hosts: each emulated PMI handler
    /// takes milliseconds), 5000000 on a VT-x/SVM host. The CPU-bound control keeps its own.
    #[arg(long, value_name = "CYCLES",
          value_parser = clap::value_parser!(u64).range(100_000..=10_000_000_000))]
    pub guest_period: Option<u64>,
    /// packet-rx: host-profile samples per second of the sampled clock.
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=20_000))]
    pub hz: u32,
    /// packet-rx: give up when the guest's network is not up after SECS.
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    pub boot_timeout: u64,
    /// packet-rx: the PMU the guest sees, as for `run --pmu-model` (intel on a host that is not
    /// Intel makes the whole guest CPU a generic Intel one, so the guest runs its Intel PMU
    /// driver).
    #[arg(long, value_enum, default_value_t = ModelChoice::Auto)]
    pub pmu_model: ModelChoice,
    /// Rows of each table (0 = all).
    #[arg(long, value_name = "N", default_value_t = 25)]
    pub top: usize,
    /// tiny: emulation time of each I/O access, in microseconds.
    #[arg(long, value_name = "US", default_value_t = crate::compare::tiny::DEFAULT_IO_DELAY_US,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub io_delay_us: u32,
    /// --workload command: the command and its arguments, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
    /// What goes to stdout: text = the tables for people; json = one JSON document (schema
    /// vpmu-compare/1: the run's parameters, every row of each comparison, the summary and the
    /// run's end-of-run report; docs/accounting-modes.md, "Results a script can read") and
    /// nothing else. The CSV and SVG files are written either way; progress goes to stderr.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// Output of `compare` and `results`: tables for people, or one JSON document for scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}
