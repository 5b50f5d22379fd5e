//! Command-line interface (`vpmu-vmm --help`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::end::EXIT_CODES_HELP;
use crate::host_quirks::QuirkSetting;
use crate::pmu::{BackendChoice, ModelChoice};
use crate::vm::{
    Boot, VmConfig, VpmuSetting, DEFAULT_CMDLINE, MAX_MEMORY_MIB, MAX_VCPUS, MIN_MEMORY_MIB,
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
    Run(RunArgs),
    /// Decode the result frames a guest sent over COM2 (the file of `run --serial2 FILE`):
    /// verify each frame's length and CRC-32, write its payload to DIR/<mode>/<name>, report
    /// damaged, truncated or missing frames (exit code 1 if any).
    Results(ResultsArgs),
}

#[derive(clap::Args, Debug)]
pub struct ResultsArgs {
    /// The COM2 output file (`vpmu-vmm run --serial2 FILE`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Directory for the decoded payloads (created if missing).
    #[arg(long, value_name = "DIR", default_value = "vpmu-results")]
    pub out: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Guest kernel: an ELF vmlinux, or a bzImage (its vmlinux is extracted; gzip, xz, lz4, zstd).
    #[arg(long, value_name = "PATH")]
    pub kernel: PathBuf,
    /// initramfs (cpio, optionally compressed) placed at the top of guest memory.
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,
    /// Extra kernel command line, appended to the defaults
    #[arg(long, value_name = "STR", default_value = "", long_help = format!(
        "Extra kernel command line, appended to the defaults \"{DEFAULT_CMDLINE}\" (and, on hosts that \
emulate guest kernel code, \"{}\"); a later option overrides an earlier one.", crate::host_quirks::KERNEL_OPTIONS))]
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
    /// PMU the guest sees (auto: the host CPU's vendor).
    #[arg(long, value_enum, default_value_t = ModelChoice::Auto)]
    pub pmu_model: ModelChoice,
    /// Where virtual counts come from: soft = perf software task-clock (runs anywhere; only cycle
    /// events count), hw = perf raw hardware events (needs a host PMU and VT-x/SVM).
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub vpmu_backend: BackendChoice,
    /// At most N PMIs per second per vCPU are delivered (0 = no limit); the rest are counted.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub pmi_limit: u32,
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
}

impl RunArgs {
    pub fn to_config(&self, started: std::time::Instant) -> Result<VmConfig, String> {
        let timeout = match self.timeout {
            Some(t) if !(t.is_finite() && t > 0.0) => {
                return Err(format!(
                    "--timeout {t}: must be a positive number of seconds"
                ))
            }
            t => t.map(Duration::from_secs_f64),
        };
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
            io_delay_us: 0,
            const_msrs: Vec::new(),
            serial2: self.serial2.clone(),
            host_quirks: self.host_quirks,
            timeout,
            console_out: self.console.clone(),
            console_in: true,
            started: Some(started),
        })
    }
}
