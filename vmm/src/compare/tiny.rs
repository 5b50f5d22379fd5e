//! The tiny-guest comparison (guest-image/tiny/asm/compare64.S): no Linux needed, seconds on
//! /dev/kvm. The guest samples itself with the vPMU's counter in its NMI handler, as a
//! driver-based profiler does, running an I/O-heavy workload and a CPU-bound control in
//! cpu-switch and then in domain-switch (switching through the vPMU control port), and sends the
//! four histograms over COM2.

use std::path::Path;
use std::time::Duration;

use runtime::end::VmEnd;
use runtime::pmu::{BackendChoice, ModelChoice};
use runtime::vm::{self, Boot, RunReport, VmConfig, VpmuSetting};

use super::table::{Comparison, Profile};
use super::CompareError;

/// The functions the guest files samples under, in its histogram order.
pub const FUNCTIONS: [&str; 4] = ["io_heavy", "cpu_a", "cpu_b", "(other)"];
/// The guest's mean sampling period in cycles (each period is drawn from this +- 1M, so the
/// samples do not alias with the workload's rounds), and rounds of each workload in each mode
/// (`PERIOD` and `ROUNDS` in guest-image/tiny/asm/compare64.S; a test holds them equal).
pub const SAMPLE_PERIOD_CYCLES: u64 = 2_600_000;
pub const ROUNDS: u32 = 480;
/// Emulation time of each port write to the delay device (VMM work on the guest's behalf).
pub const DEFAULT_IO_DELAY_US: u32 = 300;

pub struct TinyComparison {
    /// The I/O-heavy workload.
    pub io: Comparison,
    /// The CPU-bound control (no exits).
    pub control: Comparison,
    pub run: RunReport,
}

/// Boots the comparison guest once; its console and raw COM2 bytes are kept in `out`.
pub fn run(out: &Path, io_delay_us: u32) -> Result<TinyComparison, CompareError> {
    let guest = tiny_guests::COMPARE64;
    let serial2 = out.join("tiny-guest-com2.bin");
    let mut cfg = VmConfig::new(Boot::tiny(&guest));
    cfg.memory_mib = 64;
    cfg.vpmu = VpmuSetting::CpuSwitch;
    cfg.pmu_model = ModelChoice::Amd;
    cfg.pmu_backend = BackendChoice::Auto;
    cfg.io_delay_us = io_delay_us;
    cfg.serial2 = Some(serial2.clone());
    cfg.console_out = Some(out.join("tiny-guest-console.log"));
    cfg.timeout = Some(Duration::from_secs(300));
    let report = vm::run(&cfg)?;
    if report.end != VmEnd::PowerOff {
        return Err(CompareError::guest_end(&report, ""));
    }
    let bytes = std::fs::read(&serial2).map_err(|source| CompareError::Io {
        path: serial2.clone(),
        source,
    })?;
    let hists = parse(&bytes)?;
    let profile =
        |h: &[u64; 4]| Profile::from_pairs(FUNCTIONS.iter().copied().zip(h.iter().copied()));
    Ok(TinyComparison {
        io: Comparison::new("tiny-io", &profile(&hists[0]), &profile(&hists[2])),
        control: Comparison::new("tiny-control", &profile(&hists[1]), &profile(&hists[3])),
        run: report,
    })
}

/// The guest's report: 4 histograms x 4 little-endian u64 (cpu/io, cpu/control, domain/io,
/// domain/control).
pub fn parse(bytes: &[u8]) -> Result<[[u64; 4]; 4], CompareError> {
    if bytes.len() != 128 {
        return Err(CompareError::GuestReport(format!(
            "expected 128 bytes (4 histograms of 4 counts) on COM2, got {}",
            bytes.len()
        )));
    }
    let mut h = [[0u64; 4]; 4];
    for (i, c) in bytes.chunks_exact(8).enumerate() {
        h[i / 4][i % 4] = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The report's parameters say what the guest does.
    #[test]
    fn period_and_rounds_are_the_guests() {
        let asm = include_str!("../../../guest-image/tiny/asm/compare64.S");
        let define = |name: &str| {
            asm.lines()
                .find_map(|l| l.strip_prefix("#define ")?.strip_prefix(name))
                .and_then(|rest| rest.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("compare64.S: no numeric #define {name}"))
        };
        assert_eq!(define("PERIOD "), SAMPLE_PERIOD_CYCLES);
        assert_eq!(define("ROUNDS "), u64::from(ROUNDS));
    }

    #[test]
    fn parse_reads_four_histograms_and_rejects_short_reports() {
        let mut b = Vec::new();
        for i in 0..16u64 {
            b.extend_from_slice(&i.to_le_bytes());
        }
        let h = parse(&b).unwrap();
        assert_eq!(h[0], [0, 1, 2, 3]);
        assert_eq!(h[3], [12, 13, 14, 15]);
        assert!(matches!(
            parse(&b[..120]),
            Err(CompareError::GuestReport(_))
        ));
    }
}
