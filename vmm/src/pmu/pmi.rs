//! Delivering a PMI the way the local APIC would: through LVTPC (offset 0x340) of the in-kernel
//! LAPIC. NMI delivery mode -> KVM_NMI; fixed mode -> an MSI to this vCPU's APIC with the vector;
//! masked -> dropped (the overflow status bit stays set for the guest to find). Intel-compatible
//! guests expect LVTPC masked after a PMI; the guest unmasks it. A per-vCPU limit keeps a guest
//! from turning a tiny sampling period into an interrupt storm on the host.

use std::time::{Duration, Instant};

pub const APIC_LVTPC: usize = 0x340;
const LVT_MASKED: u32 = 1 << 16;
const DELIVERY_FIXED: u32 = 0;
const DELIVERY_NMI: u32 = 4;

/// What LVTPC says to do with a PMI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Nmi,
    Vector(u8),
    Masked,
    /// A delivery mode that makes no sense for LVTPC (SMI, INIT, ExtINT): dropped.
    Unsupported(u32),
}

pub fn route(lvtpc: u32) -> Route {
    if lvtpc & LVT_MASKED != 0 {
        return Route::Masked;
    }
    match (lvtpc >> 8) & 7 {
        DELIVERY_NMI => Route::Nmi,
        DELIVERY_FIXED => Route::Vector(lvtpc as u8),
        m => Route::Unsupported(m),
    }
}

pub fn masked(lvtpc: u32) -> u32 {
    lvtpc | LVT_MASKED
}

/// Reads a 32-bit LAPIC register from KVM's register page.
pub fn lapic_reg(regs: &[std::os::raw::c_char; 1024], off: usize) -> u32 {
    let b = |i: usize| regs[off + i] as u8;
    u32::from_le_bytes([b(0), b(1), b(2), b(3)])
}

pub fn set_lapic_reg(regs: &mut [std::os::raw::c_char; 1024], off: usize, v: u32) {
    for (i, byte) in v.to_le_bytes().into_iter().enumerate() {
        regs[off + i] = byte as std::os::raw::c_char;
    }
}

/// At most `limit` PMIs per second per vCPU (0 = no limit).
#[derive(Debug)]
pub struct PmiLimiter {
    limit: u32,
    window_start: Instant,
    in_window: u32,
}

impl PmiLimiter {
    pub fn new(limit: u32, now: Instant) -> Self {
        PmiLimiter {
            limit,
            window_start: now,
            in_window: 0,
        }
    }

    /// Whether one more PMI may be delivered at `now`.
    pub fn allow(&mut self, now: Instant) -> bool {
        if self.limit == 0 {
            return true;
        }
        if now.duration_since(self.window_start) >= Duration::from_secs(1) {
            self.window_start = now;
            self.in_window = 0;
        }
        if self.in_window < self.limit {
            self.in_window += 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvtpc_routes() {
        assert_eq!(route(0x400), Route::Nmi);
        assert_eq!(route(0x10400), Route::Masked);
        assert_eq!(route(0xfe), Route::Vector(0xfe));
        assert_eq!(route(0x700), Route::Unsupported(7));
        assert_eq!(masked(0x400), 0x10400);
    }

    #[test]
    fn lapic_register_roundtrip() {
        let mut regs = [0 as std::os::raw::c_char; 1024];
        set_lapic_reg(&mut regs, APIC_LVTPC, 0x1_04fe);
        assert_eq!(lapic_reg(&regs, APIC_LVTPC), 0x1_04fe);
    }

    #[test]
    fn limiter_caps_per_second() {
        let t0 = Instant::now();
        let mut l = PmiLimiter::new(3, t0);
        let allowed = (0..10)
            .filter(|_| l.allow(t0 + Duration::from_millis(10)))
            .count();
        assert_eq!(allowed, 3);
        assert!(l.allow(t0 + Duration::from_millis(1100)));
        let mut unlimited = PmiLimiter::new(0, t0);
        assert!((0..10_000).all(|_| unlimited.allow(t0)));
    }
}
