//! Delivering a PMI the way the local APIC would: through LVTPC (offset 0x340) of the in-kernel
//! LAPIC. NMI delivery mode -> KVM_NMI; fixed mode -> an MSI to this vCPU's APIC with the vector;
//! masked -> dropped (the overflow status bit stays set for the guest to find). Intel-compatible
//! guests expect LVTPC masked after a PMI; the guest unmasks it. A per-vCPU limit keeps a guest
//! from turning a tiny sampling period into an interrupt storm on the host.

use std::time::{Duration, Instant};

use crate::vcpu::lapic::{delivery_mode, DELIVERY_FIXED, DELIVERY_NMI, LVT_MASKED};

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
    match delivery_mode(lvtpc) {
        DELIVERY_NMI => Route::Nmi,
        DELIVERY_FIXED => Route::Vector(lvtpc as u8),
        m => Route::Unsupported(m),
    }
}

pub fn masked(lvtpc: u32) -> u32 {
    lvtpc | LVT_MASKED
}

/// At most `limit` PMIs per fixed one-second window per vCPU (0 = no limit).
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
