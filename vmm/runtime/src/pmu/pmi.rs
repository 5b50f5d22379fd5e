//! Delivering a PMI the way the local APIC would: through LVTPC (offset 0x340) of the in-kernel
//! LAPIC. NMI delivery mode -> an NMI queued through the vCPU access layer; fixed mode -> an MSI
//! to this vCPU's APIC with the vector; masked -> dropped (the overflow status bit stays set for
//! the guest to find). Intel-compatible guests expect LVTPC masked after a PMI; the guest
//! unmasks it. That mask is kept by the VMM (`VcpuPmu::lvtpc_masked_by_pmi`): writing it into
//! the in-kernel LAPIC would rewrite its IRR and lose interrupts (docs/vpmu.md). A per-vCPU rate limit keeps a guest from turning a tiny sampling period into an
//! interrupt storm on the host: a PMI over it waits (the vCPU's kick timer brings it back when it
//! may go).

use std::time::{Duration, Instant};

use crate::vcpu_access::lapic::{delivery_mode, DELIVERY_FIXED, DELIVERY_NMI, LVT_MASKED};

/// What LVTPC says to do with a PMI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Nmi,
    Vector(u8),
    Masked,
    /// A delivery mode that makes no sense for LVTPC (SMI, INIT, ExtINT): dropped.
    Unsupported(u32),
}

pub(crate) fn route(lvtpc: u32) -> Route {
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

/// At most `limit` PMIs per second per vCPU on average, in bursts of at most a tenth of that
/// (0 = no limit): a generic cell-rate limiter. A PMI over the limit is not dropped but held
/// back until [`check`](Self::check) says when it may go — a guest whose sampling driver re-arms
/// its counter in the PMI handler would otherwise stop sampling for good.
#[derive(Debug)]
pub struct PmiLimiter {
    /// Time between PMIs at the limit rate.
    interval: Duration,
    /// How far ahead of `now` the theoretical arrival time may run (the burst).
    tolerance: Duration,
    /// Theoretical arrival time of the next PMI.
    tat: Instant,
    unlimited: bool,
}

impl PmiLimiter {
    /// `limit` PMIs per second; 0 = no limit.
    pub fn new(limit: u32, now: Instant) -> Self {
        let interval = Duration::from_secs(1) / limit.max(1);
        let burst = (limit / 10).max(1);
        PmiLimiter {
            interval,
            tolerance: interval * (burst - 1),
            tat: now,
            unlimited: limit == 0,
        }
    }

    /// Ok if one more PMI may be delivered at `now` (and counts it); otherwise the time from
    /// which it may.
    pub fn check(&mut self, now: Instant) -> Result<(), Instant> {
        if self.unlimited {
            return Ok(());
        }
        let tat = self.tat.max(now);
        if tat > now + self.tolerance {
            return Err(tat - self.tolerance);
        }
        self.tat = tat + self.interval;
        Ok(())
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
    fn limiter_caps_the_rate_and_says_when_to_retry() {
        let t0 = Instant::now();
        // 100/s: interval 10 ms, bursts of 10.
        let mut l = PmiLimiter::new(100, t0);
        let allowed = (0..50).filter(|_| l.check(t0).is_ok()).count();
        assert_eq!(allowed, 10, "burst");
        let retry = l.check(t0).unwrap_err();
        assert_eq!(retry, t0 + Duration::from_millis(10));
        assert!(l.check(retry).is_ok());
        assert!(l.check(retry).is_err());
        // Over one second at most burst + rate.
        let mut l = PmiLimiter::new(100, t0);
        let mut n = 0;
        for ms in 0..1000 {
            let now = t0 + Duration::from_millis(ms);
            while l.check(now).is_ok() {
                n += 1;
            }
        }
        assert!((100..=110).contains(&n), "{n}");
        let mut unlimited = PmiLimiter::new(0, t0);
        assert!((0..10_000).all(|_| unlimited.check(t0).is_ok()));
    }
}
