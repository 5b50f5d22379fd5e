//! Tier 2: the virtio-mmio network card driven by a tiny guest (seconds): register identity,
//! feature negotiation, queue setup, and a real echo exchange with the VMM's pinger.

mod common;

use std::time::Duration;

use common::{kvm_available, run_tiny_with};
use runtime::end::VmEnd;
use runtime::net::NetConfig;

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn tiny_driver_negotiates_and_answers_echo_requests() {
    if !kvm_available() {
        return;
    }
    let r = run_tiny_with(&tiny_guests::VIRTIO_NET64, Duration::from_secs(60), |c| {
        c.net = Some(NetConfig {
            rx_pps: 50,
            access_cost_us: 0,
            guest_gate: false,
        });
    });
    assert_eq!(r.report.end, VmEnd::PowerOff, "console: {}", r.console);
    assert_eq!(r.console, "tiny: virtio-net answered 3 echo requests\n");
    assert_eq!(r.serial2.len(), 8 * 4 + 6, "serial2: {:x?}", r.serial2);
    let regs = u32s(&r.serial2[..32]);
    assert_eq!(regs[0], 0x7472_6976, "magic \"virt\"");
    assert_eq!(regs[1], 2, "virtio-mmio version 2 (modern)");
    assert_eq!(regs[2], 1, "device id: network card");
    assert_eq!(regs[3], runtime::devices::virtio::mmio::VENDOR_ID);
    assert_eq!(regs[4], 1, "features 63..32: VIRTIO_F_VERSION_1");
    assert_eq!(regs[5], 1 << 5, "features 31..0: VIRTIO_NET_F_MAC");
    assert_eq!(
        regs[6], 0xb,
        "FEATURES_OK stuck: the features were accepted"
    );
    assert_eq!(
        regs[7],
        u32::from(runtime::devices::virtio::net::QUEUE_SIZE)
    );
    assert_eq!(&r.serial2[32..], &runtime::net::pinger::GUEST_MAC);

    let net = r.report.net.as_ref().expect("a net report");
    assert_eq!(net.status, 0xf, "driver OK");
    let p = net.pinger.as_ref().expect("pinger stats");
    assert_eq!(p.replies_ok, 3, "{p:?}");
    assert_eq!(p.replies_bad, 0, "{p:?}");
    assert!(p.requests_pushed >= 3, "{p:?}");
    assert_eq!(net.card.tx_frames, 3, "{net:?}");
    assert_eq!(net.card.queue_errors, 0, "{net:?}");
    assert_eq!(net.bad_accesses, 0, "{net:?}");
    assert_eq!(
        net.interrupts, 0,
        "the tiny driver suppresses interrupts: {net:?}"
    );
}

#[test]
fn without_net_the_card_is_absent() {
    if !kvm_available() {
        return;
    }
    // The same guest without --net reads all ones where the card would be, so it cannot get
    // past its wait loop: it must still be waiting when the timeout ends the run. Half a
    // second: the guest writes its first read within milliseconds, and each turn of its loop
    // is an MMIO exit, which on tier 4's nested host costs milliseconds of the emulator's wall
    // time (2 s of the guest's clock took ~7 minutes there).
    let r = run_tiny_with(
        &tiny_guests::VIRTIO_NET64,
        Duration::from_millis(500),
        |_| {},
    );
    assert!(
        matches!(r.report.end, VmEnd::Timeout(_)),
        "{:?}",
        r.report.end
    );
    assert!(r.report.net.is_none());
    assert_eq!(
        &r.serial2[..4],
        &[0xff; 4],
        "unclaimed MMIO reads float high"
    );
    assert_eq!(r.console, "");
}
