//! The collective calls scopetree needs, behind a small trait, and the
//! world of one process that implements them as the identity.

use super::pipeline::{Pipeline, in_turn};
use crate::ranks::error::Error;

/// The size of a digest that ranks all-gather: 16 bytes.
///
/// ```
/// assert_eq!(scopetree::ranks::DIGEST_BYTES, 16);
/// ```
pub const DIGEST_BYTES: usize = 16;

/// A small fixed-size digest that ranks exchange to check that they agree
/// (a manifest's, or the parameters' bytes').
///
/// ```
/// let d: scopetree::ranks::Digest = [0; scopetree::ranks::DIGEST_BYTES];
/// assert_eq!(d.len(), 16);
/// ```
pub type Digest = [u8; DIGEST_BYTES];

/// The collective operations the ranks layer runs: every rank of the world
/// calls the same operation, in the same order, with buffers of the same
/// lengths (the layer checks the last part with a manifest digest before it
/// sends anything that depends on it).
///
/// Implemented by [`SingleProcess`] (a world of one, where every collective
/// is the identity) and, with the `mpi` feature, by MPI's
/// `SimpleCommunicator`. A GPU library (NCCL) would implement it the same
/// way. Errors are for local misuse (buffers whose lengths do not fit); a
/// transport failure is the library's to report (MPI aborts the job).
///
/// ```
/// use scopetree::ranks::{Collective, SingleProcess};
/// let world = SingleProcess;
/// let mut sum = [0.0_f32; 3];
/// world.all_reduce_sum_f32(&[1.0, 2.0, 3.0], &mut sum)?;
/// assert_eq!(sum, [1.0, 2.0, 3.0]); // one rank: the sum is its own value
/// assert_eq!((world.rank(), world.size()), (0, 1));
/// # Ok::<(), scopetree::ranks::Error>(())
/// ```
pub trait Collective {
    /// This process's rank, `0..size()`. O(1).
    fn rank(&self) -> usize;

    /// The number of ranks in the world. O(1).
    fn size(&self) -> usize;

    /// Sums `send` element-wise over all ranks into `recv` on every rank.
    /// O(len) per rank, plus the transport's cost.
    ///
    /// # Errors
    /// [`Error::BadBuffers`] when `recv` and `send` differ in length.
    fn all_reduce_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error>;

    /// As [`all_reduce_sum_f32`](Self::all_reduce_sum_f32), for `f64`.
    ///
    /// # Errors
    /// [`Error::BadBuffers`] when `recv` and `send` differ in length.
    fn all_reduce_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error>;

    /// Sums `send` element-wise over all ranks and scatters the sum in
    /// blocks: `send` holds `size()` blocks of `recv.len()` elements, and
    /// rank `r` receives the sum of every rank's block `r` (the first half
    /// of a ZeRO exchange). O(len of `send`) per rank, plus the transport.
    ///
    /// # Errors
    /// [`Error::BadBuffers`] when `send.len()` is not `size() × recv.len()`.
    fn reduce_scatter_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error>;

    /// As [`reduce_scatter_sum_f32`](Self::reduce_scatter_sum_f32), for
    /// `f64`.
    ///
    /// # Errors
    /// [`Error::BadBuffers`] when `send.len()` is not `size() × recv.len()`.
    fn reduce_scatter_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error>;

    /// Sums `send` element-wise over all ranks into `recv` on rank `root`:
    /// there `recv` has `send`'s length; the other ranks pass any `recv`
    /// (an empty one) and it stays as it is. ZeRO's reduce of a variable
    /// to the rank that owns it, from the variable's own buffer. The
    /// default all-reduces, through a scratch buffer that it allocates on
    /// the other ranks; MPI's is `MPI_Reduce`. O(len) per rank, plus the
    /// transport.
    ///
    /// ```
    /// use scopetree::ranks::{Collective, SingleProcess};
    /// let mut sum = [0.0_f32; 2];
    /// SingleProcess.reduce_sum_f32(0, &[1.5, 2.5], &mut sum)?;
    /// assert_eq!(sum, [1.5, 2.5]);
    /// # Ok::<(), scopetree::ranks::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::BadRank`] when `root` is not a rank of the world;
    /// [`Error::BadBuffers`] on `root` when `recv` and `send` differ in
    /// length.
    fn reduce_sum_f32(&self, root: usize, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        check_root_of(root, self.size(), "root of a reduce")?;
        if self.rank() == root {
            self.all_reduce_sum_f32(send, recv)
        } else {
            self.all_reduce_sum_f32(send, &mut vec![0.0; send.len()])
        }
    }

    /// As [`reduce_sum_f32`](Self::reduce_sum_f32), for `f64`.
    ///
    /// ```
    /// use scopetree::ranks::{Collective, SingleProcess};
    /// let mut sum = [0.0_f64; 1];
    /// SingleProcess.reduce_sum_f64(0, &[4.0], &mut sum)?;
    /// assert_eq!(sum, [4.0]);
    /// # Ok::<(), scopetree::ranks::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`reduce_sum_f32`](Self::reduce_sum_f32).
    fn reduce_sum_f64(&self, root: usize, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        check_root_of(root, self.size(), "root of a reduce")?;
        if self.rank() == root {
            self.all_reduce_sum_f64(send, recv)
        } else {
            self.all_reduce_sum_f64(send, &mut vec![0.0; send.len()])
        }
    }

    /// Gathers every rank's `send` into `recv` on every rank: `recv` holds
    /// `size()` blocks of `send.len()` bytes, block `r` receiving rank `r`'s
    /// `send` (the second half of a ZeRO exchange). O(len of `recv`) per
    /// rank, plus the transport.
    ///
    /// # Errors
    /// [`Error::BadBuffers`] when `recv.len()` is not `size() × send.len()`.
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), Error>;

    /// Copies `buf` of rank `root` into `buf` of every rank (every rank
    /// passes a buffer of the same length). O(len).
    ///
    /// # Errors
    /// [`Error::BadRank`] when `root` is not a rank of the world.
    fn broadcast_bytes(&self, root: usize, buf: &mut [u8]) -> Result<(), Error>;

    /// Gathers every rank's digest: `all[r]` receives rank `r`'s `mine`.
    /// O(size).
    ///
    /// # Errors
    /// [`Error::BadBuffers`] when `all.len()` is not the world's size.
    fn all_gather_digest(&self, mine: &Digest, all: &mut [Digest]) -> Result<(), Error>;

    /// Returns once every rank has called it. O(1) here, plus the
    /// transport's cost.
    ///
    /// # Errors
    /// None from the crate's implementations; a transport may report one.
    fn barrier(&self) -> Result<(), Error>;

    /// Sums every bucket of `pipe` over the ranks: each bucket filled into
    /// a send buffer, summed into a receive buffer, then drained, with the
    /// buffer pairs `bufs` (each buffer at least the longest bucket). The
    /// default runs one bucket at a time through
    /// [`all_reduce_sum_f32`](Self::all_reduce_sum_f32) with `bufs[0]`;
    /// MPI's overlaps each transfer with the copies of the buckets around it
    /// (non-blocking `MPI_Iallreduce`), given two pairs or more. O(bytes)
    /// per rank, plus the transport.
    ///
    /// # Errors
    /// [`Error::BadBuffers`] when `bufs` is empty or holds a buffer shorter
    /// than a bucket; the sums' and the pipeline's errors.
    fn all_reduce_sum_f32_pipelined(
        &self,
        pipe: &mut dyn Pipeline<f32>,
        bufs: &mut [(Vec<f32>, Vec<f32>)],
    ) -> Result<(), Error> {
        in_turn(pipe, bufs, |s, r| self.all_reduce_sum_f32(s, r))
    }

    /// As [`all_reduce_sum_f32_pipelined`](Self::all_reduce_sum_f32_pipelined),
    /// for `f64`.
    ///
    /// # Errors
    /// As [`all_reduce_sum_f32_pipelined`](Self::all_reduce_sum_f32_pipelined).
    fn all_reduce_sum_f64_pipelined(
        &self,
        pipe: &mut dyn Pipeline<f64>,
        bufs: &mut [(Vec<f64>, Vec<f64>)],
    ) -> Result<(), Error> {
        in_turn(pipe, bufs, |s, r| self.all_reduce_sum_f64(s, r))
    }
}

/// Checks that a reduction's buffers have one length. O(1).
pub(crate) fn same_len(op: &'static str, send: usize, recv: usize) -> Result<(), Error> {
    if send == recv {
        Ok(())
    } else {
        Err(Error::BadBuffers {
            op,
            reason: format!("send buffer of {send} elements, receive buffer of {recv}"),
        })
    }
}

/// Checks that a block exchange's buffers fit a world of `size`: `all`
/// holds `size` blocks of `block` elements. O(1).
pub(crate) fn blocks(op: &'static str, size: usize, block: usize, all: usize) -> Result<(), Error> {
    if block.checked_mul(size) == Some(all) {
        Ok(())
    } else {
        Err(Error::BadBuffers {
            op,
            reason: format!(
                "a buffer of {all} elements for {size} block(s) of {block}; pass {size} x {block}"
            ),
        })
    }
}

/// Checks that `root` is a rank of a world of `size`, as the root of a
/// broadcast. O(1).
pub(crate) fn check_root(root: usize, size: usize) -> Result<(), Error> {
    check_root_of(root, size, "root of a broadcast")
}

/// Checks that `root` is a rank of a world of `size`; `what` names its
/// role in the error. O(1).
pub(crate) fn check_root_of(root: usize, size: usize, what: &'static str) -> Result<(), Error> {
    if root < size {
        Ok(())
    } else {
        Err(Error::BadRank {
            rank: root,
            size,
            what,
        })
    }
}

/// A world of one process: rank 0 of size 1, where a sum is the rank's own
/// value, a broadcast from rank 0 changes nothing and a barrier returns at
/// once. Code written against [`Collective`] runs unchanged in one process,
/// without MPI.
///
/// ```
/// use scopetree::ranks::{Collective, SingleProcess};
/// let mut all = [[0_u8; 16]; 1];
/// SingleProcess.all_gather_digest(&[7; 16], &mut all)?;
/// assert_eq!(all, [[7; 16]]);
/// SingleProcess.barrier()?;
/// # Ok::<(), scopetree::ranks::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    /// Always 0. O(1).
    fn rank(&self) -> usize {
        0
    }

    /// Always 1. O(1).
    fn size(&self) -> usize {
        1
    }

    /// Copies `send` into `recv`. O(len).
    fn all_reduce_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        same_len("all-reduce", send.len(), recv.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }

    /// Copies `send` into `recv`. O(len).
    fn all_reduce_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        same_len("all-reduce", send.len(), recv.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }

    /// Copies `send` into `recv` (one block). O(len).
    fn reduce_scatter_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        blocks("reduce-scatter", 1, recv.len(), send.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }

    /// Copies `send` into `recv` (one block). O(len).
    fn reduce_scatter_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        blocks("reduce-scatter", 1, recv.len(), send.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }

    /// Copies `send` into `recv` (rank 0 is the only root). O(len).
    fn reduce_sum_f32(&self, root: usize, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        check_root_of(root, 1, "root of a reduce")?;
        self.all_reduce_sum_f32(send, recv)
    }

    /// Copies `send` into `recv` (rank 0 is the only root). O(len).
    fn reduce_sum_f64(&self, root: usize, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        check_root_of(root, 1, "root of a reduce")?;
        self.all_reduce_sum_f64(send, recv)
    }

    /// Copies `send` into `recv` (one block). O(len).
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), Error> {
        blocks("all-gather", 1, send.len(), recv.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }

    /// Leaves `buf` as it is (rank 0 is the only root). O(1).
    fn broadcast_bytes(&self, root: usize, _buf: &mut [u8]) -> Result<(), Error> {
        check_root(root, 1)
    }

    /// Copies `mine` into `all[0]`. O(1).
    fn all_gather_digest(&self, mine: &Digest, all: &mut [Digest]) -> Result<(), Error> {
        match all {
            [one] => {
                *one = *mine;
                Ok(())
            }
            _ => Err(Error::BadBuffers {
                op: "all-gather",
                reason: format!("{} receive slots for a world of 1 rank", all.len()),
            }),
        }
    }

    /// Returns at once. O(1).
    fn barrier(&self) -> Result<(), Error> {
        Ok(())
    }
}
