//! The host's time-stamp counter: the one clock that exit records, profile samples, mode
//! switches and `compare`'s slices share, so they can be cut against each other.

/// RDTSC now.
#[inline]
pub fn now() -> u64 {
    // SAFETY: RDTSC has no preconditions.
    unsafe { core::arch::x86_64::_rdtsc() }
}
