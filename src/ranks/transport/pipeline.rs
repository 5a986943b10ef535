//! [`Pipeline`]: the buckets of one all-reduce as a [`Collective`] runs
//! them, each filled into a send buffer, summed over the ranks into a
//! receive buffer, and drained, so that an implementation can overlap one
//! bucket's transfer with the copies of its neighbours.
//!
//! [`Collective`]: crate::ranks::Collective

use crate::ranks::error::Error;

/// The buckets of one all-reduce: how long each is, how to fill its send
/// buffer, and how to take its sums. A
/// [`Collective`](crate::ranks::Collective)'s pipelined sums call `fill` and
/// `drain` once per bucket, fills in bucket order and drains in bucket
/// order, each bucket's fill before its transfer and its drain after; MPI's
/// overlaps them with other buckets' transfers.
///
/// ```
/// use scopetree::ranks::{Collective, Error, Pipeline, SingleProcess};
/// /// Two buckets of 2 elements, summed into `out`.
/// struct Two { out: Vec<f32> }
/// impl Pipeline<f32> for Two {
///     fn buckets(&self) -> usize { 2 }
///     fn len(&self, _: usize) -> usize { 2 }
///     fn fill(&mut self, k: usize, send: &mut [f32]) -> Result<(), Error> {
///         send.fill(k as f32 + 1.0);
///         Ok(())
///     }
///     fn drain(&mut self, _: usize, recv: &mut [f32]) -> Result<(), Error> {
///         self.out.extend_from_slice(recv);
///         Ok(())
///     }
/// }
/// let mut pipe = Two { out: Vec::new() };
/// let mut bufs = vec![(vec![0.0; 2], vec![0.0; 2])];
/// SingleProcess.all_reduce_sum_f32_pipelined(&mut pipe, &mut bufs)?;
/// assert_eq!(pipe.out, [1.0, 1.0, 2.0, 2.0]);
/// # Ok::<(), Error>(())
/// ```
pub trait Pipeline<F> {
    /// The number of buckets. O(1).
    fn buckets(&self) -> usize;

    /// Bucket `k`'s length in elements. O(1).
    fn len(&self, k: usize) -> usize;

    /// Writes bucket `k`'s elements into `send` (exactly
    /// [`len(k)`](Self::len) long). O(its length).
    ///
    /// # Errors
    /// The pipeline's own (reading its values failed).
    fn fill(&mut self, k: usize, send: &mut [F]) -> Result<(), Error>;

    /// Takes bucket `k`'s sums from `recv` (exactly [`len(k)`](Self::len)
    /// long; the pipeline may change them in place). O(its length).
    ///
    /// # Errors
    /// The pipeline's own (writing its values failed).
    fn drain(&mut self, k: usize, recv: &mut [F]) -> Result<(), Error>;
}

/// Checks that every buffer of `bufs` holds the longest bucket of `pipe`.
/// O(buckets + buffers).
pub(crate) fn check_buffers<F>(
    pipe: &dyn Pipeline<F>,
    bufs: &[(Vec<F>, Vec<F>)],
) -> Result<(), Error> {
    let longest = (0..pipe.buckets()).map(|k| pipe.len(k)).max().unwrap_or(0);
    let shortest = bufs.iter().map(|(s, r)| s.len().min(r.len())).min();
    match shortest {
        None if longest > 0 => Err(Error::BadBuffers {
            op: "all-reduce",
            reason: "no buffer pair for a pipelined all-reduce; pass at least one".into(),
        }),
        Some(n) if n < longest => Err(Error::BadBuffers {
            op: "all-reduce",
            reason: format!("buffers of {n} elements for a bucket of {longest}"),
        }),
        _ => Ok(()),
    }
}

/// Runs `pipe` one bucket at a time through `sum`, with the first buffer
/// pair: fill, sum, drain. O(bytes) plus the sums.
///
/// # Errors
/// [`Error::BadBuffers`] when the buffers are missing or short; `sum`'s
/// and the pipeline's errors.
pub(crate) fn in_turn<F>(
    pipe: &mut dyn Pipeline<F>,
    bufs: &mut [(Vec<F>, Vec<F>)],
    mut sum: impl FnMut(&[F], &mut [F]) -> Result<(), Error>,
) -> Result<(), Error> {
    check_buffers(pipe, bufs)?;
    let Some((send, recv)) = bufs.first_mut() else {
        return Ok(()); // no bucket
    };
    for k in 0..pipe.buckets() {
        let len = pipe.len(k);
        pipe.fill(k, &mut send[..len])?;
        sum(&send[..len], &mut recv[..len])?;
        pipe.drain(k, &mut recv[..len])?;
    }
    Ok(())
}
