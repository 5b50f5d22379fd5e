//! [`Segments`]: the guest-memory pieces a request's or a frame's data is spread over (from a
//! [`super::queue::CheckedChain`]), and copies to and from them.

use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

/// Guest-memory pieces in order, as (address, length).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Segments(Vec<(GuestAddress, u64)>);

impl Segments {
    pub(crate) fn new(pieces: Vec<(GuestAddress, u64)>) -> Self {
        Segments(pieces)
    }

    /// The address of the first byte (of a non-empty list).
    pub(crate) fn first(&self) -> GuestAddress {
        self.0[0].0
    }

    pub(crate) fn len(&self) -> u64 {
        self.0.iter().fold(0u64, |n, s| n.saturating_add(s.1))
    }

    /// The longest piece (0 for none).
    pub(crate) fn longest(&self) -> u64 {
        self.0.iter().map(|s| s.1).max().unwrap_or(0)
    }

    /// The pieces from byte `from` on, at most `n` bytes of them.
    pub(crate) fn range(&self, from: u64, n: u64) -> Segments {
        let mut out = Vec::new();
        let (mut skip, mut left) = (from, n);
        for &(a, l) in &self.0 {
            if left == 0 {
                break;
            }
            if skip >= l {
                skip -= l;
                continue;
            }
            let take = (l - skip).min(left);
            // Checked chains lie in guest memory, so this cannot wrap; saturated, a piece that
            // did would fail its copy with a memory error.
            out.push((GuestAddress(a.0.saturating_add(skip)), take));
            left -= take;
            skip = 0;
        }
        Segments(out)
    }

    /// Copies the first `buf.len()` bytes of the pieces into `buf` (which must not be longer).
    pub(crate) fn read(
        &self,
        mem: &GuestMemoryMmap,
        buf: &mut [u8],
    ) -> Result<(), GuestMemoryError> {
        let mut at = 0;
        for &(a, l) in &self.0 {
            let n = (l as usize).min(buf.len() - at);
            mem.read_slice(&mut buf[at..at + n], a)?;
            at += n;
            if at == buf.len() {
                break;
            }
        }
        Ok(())
    }

    /// Copies `buf` over the first `buf.len()` bytes of the pieces.
    pub(crate) fn write(&self, mem: &GuestMemoryMmap, buf: &[u8]) -> Result<(), GuestMemoryError> {
        let mut at = 0;
        for &(a, l) in &self.0 {
            let n = (l as usize).min(buf.len() - at);
            mem.write_slice(&buf[at..at + n], a)?;
            at += n;
            if at == buf.len() {
                break;
            }
        }
        Ok(())
    }
}
