//! What `vpmu-vmm run` prints (to stderr) when the VM ends.

use crate::exit::ExitCounts;
use crate::vm::RunReport;

pub fn print(r: &RunReport) {
    let mut total = ExitCounts::default();
    for c in &r.exits {
        total.add(c);
    }
    eprintln!();
    eprintln!(
        "[vpmu-vmm] {} after {:.2} s (exit code {})",
        r.end,
        r.run_time.as_secs_f64(),
        r.end.exit_code()
    );
    eprintln!(
        "[vpmu-vmm] exits: {} total: {} port in, {} port out ({} unclaimed), {} mmio, {} msr, {} interrupted, {} emulation failures",
        total.total(),
        total.io_in,
        total.io_out,
        total.unclaimed_io,
        total.mmio,
        total.msr,
        total.interrupted,
        total.internal_error
    );
    if r.vpmu != crate::vm::VpmuSetting::Off {
        let p = &r.pmu;
        eprintln!(
            "[vpmu-vmm] vPMU ({:?}): {} MSR reads, {} writes, {} RDPMC served, {} #GP; PMIs: {} NMI, {} vector, {} dropped (LVTPC masked), {} held back by the rate limit",
            r.vpmu, p.msr_reads, p.msr_writes, p.rdpmc_reads, p.gp_faults, p.pmis_nmi, p.pmis_vector, p.pmis_masked, p.pmis_throttled
        );
        if r.mode_history.len() > 1 {
            let steps: Vec<String> = r
                .mode_history
                .iter()
                .map(|s| {
                    format!(
                        "{} at {:.1} s ({})",
                        crate::pmu::mode::name(s.mode),
                        s.at.as_secs_f64(),
                        s.by
                    )
                })
                .collect();
            eprintln!("[vpmu-vmm] accounting modes: {}", steps.join(" -> "));
        }
        for (i, m) in [
            vpmu::AccountingMode::CpuSwitch,
            vpmu::AccountingMode::DomainSwitch,
        ]
        .into_iter()
        .enumerate()
        {
            let c = p.by_mode[i];
            if c.pmis + c.rdpmc_reads > 0 {
                eprintln!(
                    "[vpmu-vmm]   in {}: {} PMIs delivered, {} RDPMC served",
                    crate::pmu::mode::name(m),
                    c.pmis,
                    c.rdpmc_reads
                );
            }
        }
        if p.rdpmc_genuine_msr > 0 {
            eprintln!(
                "[vpmu-vmm] {} RDMSRs of RDPMC index numbers from unpatched code were left to KVM",
                p.rdpmc_genuine_msr
            );
        }
    }
    if !r.fixups.is_empty() {
        let list: Vec<String> = r.fixups.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        eprintln!("[vpmu-vmm] host-quirk fix-ups: {}", list.join(", "));
    }
    if !r.end.is_clean() && !r.console_tail.is_empty() {
        eprintln!("[vpmu-vmm] last guest console lines:");
        for l in &r.console_tail {
            eprintln!("  | {l}");
        }
    }
}
