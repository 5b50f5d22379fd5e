use super::*;
use std::time::Duration;

fn report() -> RunReport {
    let exits = ExitCounts {
        io_in: 3,
        io_out: 40,
        msr: 7,
        interrupted: 2,
        internal_error: 5,
        ..Default::default()
    };
    let mut pmu = runtime::pmu::PmuStats {
        msr_reads: 11,
        msr_writes: 12,
        pmis_raised: 30,
        pmis_nmi: 20,
        pmis_vector: 1,
        pmis_masked: 2,
        pmis_throttled: 6,
        pmis_merged: 6,
        pmis_held_at_end: 1,
        signals: 99,
        rdpmc_trapped: 5,
        gp_delivered: 4,
        rdpmc_gp: 3,
        ..Default::default()
    };
    pmu.by_mode[0].pmis = 8;
    pmu.by_mode[1].pmis = 13;
    let switch = |secs: u64, mode, by| runtime::pmu::mode::Switch {
        at: Duration::from_secs(secs),
        tsc: 0,
        mode,
        by,
    };
    RunReport {
        host: runtime::vm::HostReport {
            kvm: "kvm_amd",
            quirks: false,
            backend: Some(runtime::pmu::BackendChoice::Soft),
            exit_cost_ns: 41_500,
            kvm_answers_rdpmc: Some(true),
            notify_cost_ns: 60_000,
        },
        end: runtime::end::VmEnd::Timeout(Duration::from_secs(4)),
        exits: vec![exits.clone(), exits],
        pmu,
        vpmu: runtime::vm::VpmuSetting::CpuSwitch,
        pmu_event_filter: None,
        mode_history: vec![
            switch(0, vpmu::AccountingMode::CpuSwitch, "start"),
            switch(1, vpmu::AccountingMode::DomainSwitch, "schedule"),
        ],
        mode_switches_unlogged: 3,
        fixups: vec![("clac/stac", 4), ("popcnt", 1)],
        syscall_relay: Some((17, 2.5)),
        console_tail: vec!["last line".into()],
        hints: vec!["a hint".into()],
        vcpu_states: Vec::new(),
        cmdline: None,
        guest_log: vec![vpmu::guest_log::GuestLogTotal {
            kind: "packet-gate-ignored-write",
            seen: 25,
            suppressed: 15,
        }],
        net: None,
        disks: vec![runtime::vm::DiskReport {
            path: "/img/root.img".into(),
            readonly: true,
            sectors: 2048,
            counts: runtime::devices::virtio::blk::BlkCounts {
                reads: 40,
                flushes: 2,
                writes: 3,
                bytes_read: 81920,
                io_errors: 3,
                unsupported: 1,
                ..Default::default()
            },
            status: 0xf,
            interrupts: 45,
            bad_accesses: 0,
            fault: None,
        }],
        setup_time: Duration::from_millis(20),
        run_time: Duration::from_secs(4),
    }
}

#[test]
fn json_report_says_what_the_text_report_says() {
    let r = report();
    let text = lines(&RunDoc::new(&r)).join("\n");
    let j: serde_json::Value = serde_json::from_str(&to_json(&r).to_string()).unwrap();
    assert_eq!(j["schema"], RUN_SCHEMA);
    assert_eq!(j["end"]["kind"], "timeout");
    assert_eq!(j["vpmu"]["setting"], "cpu-switch");
    assert_eq!(j["end"]["exit_code"], 7);
    assert_eq!(j["end"]["clean"], false);
    let h = &j["host"];
    assert_eq!(
        (&h["kvm"], &h["quirks"], &h["kind"], &h["vpmu_backend"]),
        (
            &serde_json::json!("kvm_amd"),
            &serde_json::json!(false),
            &serde_json::json!("vt-x/svm"),
            &serde_json::json!("soft")
        )
    );
    assert_eq!(h["cpu_switch_exit_cost_ns"], 41_500);
    assert_eq!(h["notify_cost_ns"], 60_000);
    let g = &j["guest_log"][0];
    assert_eq!(
        (&g["kind"], &g["seen"], &g["suppressed"]),
        (
            &serde_json::json!("packet-gate-ignored-write"),
            &serde_json::json!(25),
            &serde_json::json!(15)
        )
    );
    assert!(text.contains(
        "guest-triggered warnings, first 10 of each kind logged: packet-gate-ignored-write 25 (15 not logged)"
    ));
    assert_eq!(h["min_soft_period_ns"], 600_000);
    assert!(text.contains(
        "host: kvm_amd (VT-x/SVM, host quirks off); vPMU backend soft, cpu-switch leaves \
         41.5 us of KVM's exit path out of each KVM_RUN"
    ));
    assert!(text.contains(&format!(
        "{} after 4.00 s (exit code 7)",
        j["end"]["text"].as_str().unwrap()
    )));
    let e = &j["exits"];
    assert_eq!(e["total"], 114);
    // The schema's keys (vpmu-run/1), now derived from ExitCounts.
    let keys: Vec<&str> = e.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "access_ioctls",
            "hlt",
            "internal_error",
            "interrupted",
            "io_in",
            "io_out",
            "mmio",
            "msr",
            "other",
            "sync_regs",
            "total",
            "unclaimed_io",
            "unclaimed_mmio"
        ]
    );
    assert!(text.contains(&format!(
        "exits: {} total: {} port in, {} port out",
        e["total"], e["io_in"], e["io_out"]
    )));
    assert!(text.contains(&format!("{} emulation failures", e["internal_error"])));
    assert_eq!(j["exits_by_vcpu"].as_array().unwrap().len(), 2);
    let p = &j["vpmu"]["pmis"];
    assert!(text.contains(&format!(
        "{} PMIs raised = {} delivered + {} dropped (masked) + {} merged",
        p["raised"], p["delivered"], p["dropped_masked"], p["merged"]
    )));
    assert!(text.contains(&format!("{} held back by the rate limit", p["throttled"])));
    let t = &j["vpmu"]["rdpmc_trap"];
    assert_eq!(
        (t["served"].as_u64(), t["gp_delivered"].as_u64()),
        (Some(5), Some(4))
    );
    assert!(text.contains(&format!(
        "RDPMC trap: {} RDPMCs served through the guest's #GP handler; {} #GPs passed to the \
         guest ({} of them RDPMCs",
        t["served"], t["gp_delivered"], t["rdpmc_gp"]
    )));
    let m = &j["vpmu"]["by_mode"];
    assert_eq!(m[0]["mode"], "cpu-switch");
    assert_eq!(m[0]["secs"], 1.0);
    assert!(text.contains(&format!(
        "in domain-switch (3.0 s): {} PMIs delivered",
        m[1]["pmis_delivered"]
    )));
    let s = j["vpmu"]["mode_switches"].as_array().unwrap();
    assert_eq!((s.len(), &s[1]["by"]), (2, &serde_json::json!("schedule")));
    assert!(text.contains("domain-switch at 1.0 s (schedule) (and 3 later switches, not logged)"));
    assert_eq!(j["vpmu"]["mode_switches_unlogged"], 3);
    assert_eq!(j["host_quirk_fixups"]["clac/stac"], 4);
    assert!(text.contains("host-quirk fix-ups: clac/stac: 4, popcnt: 1"));
    assert_eq!(j["syscall_relay"]["calls"], 17);
    assert!(text.contains("syscall relay: 17 guest system calls"));
    assert_eq!(j["console_tail"][0], "last line");
    assert_eq!(j["hints"][0], "a hint");
    assert!(text.contains("[vpmu-vmm] hint: a hint"));
    assert!(j["net"].is_null());
    let d = &j["disks"][0];
    assert_eq!(
        (&d["readonly"], &d["sectors"]),
        (&true.into(), &2048.into())
    );
    assert!(text.contains(&format!(
        "virtio-blk vda (/img/root.img, read-only): status 0xf; requests: {} read, {} write, {} flush",
        d["requests"]["read"], d["requests"]["write"], d["requests"]["flush"]
    )), "{text}");
    assert!(text.contains(&format!(
        "{} bytes read, 0 written; {} I/O errors, {} unsupported",
        d["bytes_read"], d["errors"]["io_error"], d["errors"]["unsupported"]
    )));
}

#[test]
fn json_report_of_a_run_without_the_vpmu() {
    let mut r = report();
    r.vpmu = runtime::vm::VpmuSetting::Off;
    r.end = runtime::end::VmEnd::PowerOff;
    r.syscall_relay = None;
    let j = to_json(&r);
    assert!(j["vpmu"].is_null() && j["syscall_relay"].is_null());
    assert_eq!(
        (&j["end"]["kind"], &j["end"]["exit_code"]),
        (&"power-off".into(), &0.into())
    );
    assert!(j["console_tail"].as_array().unwrap().is_empty());
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("r.json");
    write_json(&f, &r).unwrap();
    let back: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    assert_eq!(back, j);
}

#[test]
fn a_debug_exit_is_reported_with_its_value_and_no_diagnostic() {
    let mut r = report();
    r.end = runtime::end::VmEnd::DebugExit(1);
    let j = to_json(&r);
    assert_eq!(j["end"]["kind"], "debug-exit");
    assert_eq!(j["end"]["exit_code"], 12);
    assert_eq!(j["end"]["debug_exit"]["value"], 1);
    assert_eq!(j["end"]["debug_exit"]["qemu_status"], 3);
    assert!(j["console_tail"].as_array().unwrap().is_empty());
    let text = lines(&RunDoc::new(&r)).join("\n");
    assert!(
        text.contains("guest wrote 0x1 to the isa-debug-exit port (QEMU would exit with status 3)"),
        "{text}"
    );
    assert!(!text.contains("last guest console lines"), "{text}");
    r.end = runtime::end::VmEnd::Timeout(Duration::from_secs(1));
    assert!(to_json(&r)["end"]["debug_exit"].is_null());
}

#[test]
fn the_document_keeps_every_key_of_vpmu_run_1() {
    // Every key the hand-written document of vpmu-run/1 had (fields may be added, none lost).
    const KEYS: &[&str] = &[
        "arp_answered",
        "at_secs",
        "bad_accesses",
        "bad_notify",
        "by",
        "by_mode",
        "bytes_read",
        "bytes_written",
        "calls",
        "clean",
        "console_tail",
        "cpu_switch_exit_cost_ns",
        "debug_exit",
        "delivered",
        "diagnostic",
        "discard",
        "disks",
        "dropped_masked",
        "end",
        "errors",
        "event_filter",
        "exit_code",
        "exits",
        "exits_by_vcpu",
        "flush",
        "get_id",
        "gp_delivered",
        "gp_faults",
        "guest_log",
        "held_at_end",
        "hints",
        "host",
        "host_quirk_fixups",
        "interrupts",
        "io_error",
        "kind",
        "kvm",
        "kvm_answers_rdpmc",
        "merged",
        "min_soft_period_ns",
        "mode",
        "mode_switches",
        "msr_reads",
        "msr_writes",
        "net",
        "nmi",
        "no_status",
        "notifies",
        "notify_cost_ns",
        "other",
        "other_frames",
        "path",
        "pinger",
        "pmis",
        "pmis_delivered",
        "qemu_status",
        "queue_errors",
        "queue_fault",
        "quirks",
        "raised",
        "rdpmc_fixed",
        "rdpmc_gp",
        "rdpmc_left_to_kvm",
        "rdpmc_served",
        "rdpmc_trap",
        "read",
        "readonly",
        "refused",
        "refused_by_vcpu",
        "replies_bad",
        "replies_ok",
        "requests",
        "requests_held",
        "requests_no_buffer",
        "requests_pushed",
        "requests_skipped_late",
        "run_secs",
        "rx_dropped",
        "rx_frames",
        "rx_notifies",
        "sampler_ns_forgotten",
        "sampler_work_ns_left_out",
        "samples_left_out",
        "schema",
        "secs",
        "sectors",
        "seen",
        "served",
        "setting",
        "setup_secs",
        "signals",
        "spec",
        "status",
        "suppressed",
        "syscall_relay",
        "text",
        "throttled",
        "tx_frames",
        "tx_notifies",
        "uncounted_events",
        "unsupported",
        "us_each",
        "value",
        "vector",
        "vpmu",
        "vpmu_backend",
        "write",
        "write_zeroes",
    ];
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    out.push(k.clone());
                    walk(x, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut r = report();
    r.pmu_event_filter = Some("allow:0x3c".parse::<vpmu::EventFilter>().unwrap());
    r.end = runtime::end::VmEnd::DebugExit(1);
    r.net = Some(runtime::devices::virtio::net::NetReport {
        pinger: Some(Default::default()),
        card: Default::default(),
        status: 0,
        interrupts: 0,
        bad_accesses: 0,
    });
    let mut out = Vec::new();
    walk(&to_json(&r), &mut out);
    let missing: Vec<&&str> = KEYS
        .iter()
        .filter(|k| !out.iter().any(|o| o == *k))
        .collect();
    assert!(
        missing.is_empty(),
        "keys gone from the document: {missing:?}"
    );
}
