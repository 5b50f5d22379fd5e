//! The network the guest's virtio-net device is plugged into: frames ([`packet`]) and the VMM's
//! end of the wire, a pinger that sends echo requests and checks replies ([`pinger`]).

pub mod packet;
pub mod pinger;

use std::time::Duration;

use crate::net::pinger::{GUEST_IP, HOST_IP};

/// `--net`: a virtio-net card whose other end is the VMM's pinger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetConfig {
    /// Echo requests per second sent to the guest (0: none; ARP is still answered).
    pub rx_pps: u32,
    /// Device-model work per access to the card's registers, in microseconds (busy-waited on
    /// the vCPU thread). 0 = only what the VMM really does (microseconds).
    pub access_cost_us: u32,
    /// The pinger holds its requests until the guest opens the packet gate port
    /// ([`crate::devices::packet_gate`]); without it the requests start with the guest's driver.
    pub guest_gate: bool,
}

/// The card's interrupt: IOAPIC pin (GSI) 5, free on this VMM (COM1 is 4, COM2 3).
pub(crate) const NET_GSI: u32 = 5;
/// Highest `--net-rx-pps`: the vCPU thread's tick runs at most every millisecond and sends at
/// most a few requests per tick.
pub const MAX_RX_PPS: u32 = 4000;

/// What `--net` appends to a Linux guest's command line: static IP autoconfiguration of eth0,
/// done by the kernel itself during boot (no user space needed).
pub(crate) fn kernel_cmdline() -> String {
    format!("ip={GUEST_IP}::{HOST_IP}:255.255.255.0::eth0:off")
}

/// How often vCPU 0 runs the pinger: once per request, but not more than once a millisecond.
pub(crate) fn tick_period(rx_pps: u32) -> Duration {
    Duration::from_secs_f64(1.0 / f64::from(rx_pps.max(1))).max(Duration::from_millis(1))
}
