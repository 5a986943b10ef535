//! [`Mirror`]: a stand-in world for unit tests (compiled for tests only),
//! `n` ranks that hold the same values, seen from one of them: every
//! collective's result is known exactly without other processes.

use super::collective::{Collective, Digest};
use crate::ranks::error::Error;

/// `n` ranks that hold the same values, seen from rank `r`
/// (`Mirror(n, r)`): every sum is `n` times this rank's value, every
/// gather `n` copies of it.
pub(crate) struct Mirror(pub(crate) usize, pub(crate) usize);

impl Collective for Mirror {
    fn rank(&self) -> usize {
        self.1
    }
    fn size(&self) -> usize {
        self.0
    }
    fn all_reduce_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        for (r, s) in recv.iter_mut().zip(send) {
            *r = *s * self.0 as f32;
        }
        Ok(())
    }
    fn all_reduce_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        for (r, s) in recv.iter_mut().zip(send) {
            *r = *s * self.0 as f64;
        }
        Ok(())
    }
    fn reduce_scatter_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        let n = recv.len();
        self.all_reduce_sum_f32(&send[..n], recv)
    }
    fn reduce_scatter_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        let n = recv.len();
        self.all_reduce_sum_f64(&send[..n], recv)
    }
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), Error> {
        for c in recv.chunks_mut(send.len().max(1)) {
            c.copy_from_slice(&send[..c.len()]);
        }
        Ok(())
    }
    fn broadcast_bytes(&self, _root: usize, _buf: &mut [u8]) -> Result<(), Error> {
        Ok(())
    }
    fn all_gather_digest(&self, mine: &Digest, all: &mut [Digest]) -> Result<(), Error> {
        all.fill(*mine);
        Ok(())
    }
    fn barrier(&self) -> Result<(), Error> {
        Ok(())
    }
}
