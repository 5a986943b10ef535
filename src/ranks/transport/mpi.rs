//! [`Collective`] over MPI (feature `mpi`): the `mpi` crate's
//! `SimpleCommunicator`, through its safe API.

use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Equivalence, Root};

use super::collective::{Collective, Digest, blocks, check_root, check_root_of, same_len};
use super::pipeline::{Pipeline, check_buffers, in_turn};
use crate::ranks::error::Error;

/// Checks that `len` elements fit MPI's count (`i32`). O(1).
fn count(op: &'static str, len: usize) -> Result<(), Error> {
    if i32::try_from(len).is_ok() {
        Ok(())
    } else {
        Err(Error::BadBuffers {
            op,
            reason: format!("{len} elements, more than MPI counts in one call (2^31 - 1)"),
        })
    }
}

/// `MPI_Allreduce` with `MPI_SUM`, after the local checks. O(len) per rank.
fn all_reduce_sum<T: Equivalence>(
    comm: &SimpleCommunicator,
    send: &[T],
    recv: &mut [T],
) -> Result<(), Error> {
    same_len("all-reduce", send.len(), recv.len())?;
    count("all-reduce", send.len())?;
    comm.all_reduce_into(send, recv, SystemOperation::sum());
    Ok(())
}

/// `MPI_Reduce_scatter_block` with `MPI_SUM`, after the local checks.
/// O(len of `send`) per rank.
fn reduce_scatter_sum<T: Equivalence>(
    comm: &SimpleCommunicator,
    send: &[T],
    recv: &mut [T],
) -> Result<(), Error> {
    blocks(
        "reduce-scatter",
        Collective::size(comm),
        recv.len(),
        send.len(),
    )?;
    count("reduce-scatter", send.len())?;
    comm.reduce_scatter_block_into(send, recv, SystemOperation::sum());
    Ok(())
}

/// `MPI_Reduce` with `MPI_SUM` to `root`, after the local checks: `recv`
/// is read only on `root`. O(len) per rank.
fn reduce_sum<T: Equivalence>(
    comm: &SimpleCommunicator,
    root: usize,
    send: &[T],
    recv: &mut [T],
) -> Result<(), Error> {
    check_root_of(root, Collective::size(comm), "root of a reduce")?;
    count("reduce", send.len())?;
    let at = comm.process_at_rank(i32::try_from(root).unwrap_or_default());
    if Collective::rank(comm) == root {
        same_len("reduce", send.len(), recv.len())?;
        at.reduce_into_root(send, recv, SystemOperation::sum());
    } else {
        at.reduce_into(send, SystemOperation::sum());
    }
    Ok(())
}

/// The pipelined all-reduce over MPI: with `2·W` buffer pairs (`W` ≥ 1, at
/// most 4), windows of `W` buckets each, the windows taking turns between
/// two sets of `W` pairs. Within a window, every bucket's non-blocking
/// `MPI_Iallreduce` starts as soon as its send buffer is filled, so each
/// fill but the window's first overlaps the transfers already started; the
/// previous window's drains, and the next window's first fill, run while
/// this window's transfers fly. The safe API's request scopes borrow a
/// buffer until the scope ends, hence one scope per window and the two
/// sets. With one pair, one bucket at a time. O(bytes) per rank, plus the
/// transport; allocates nothing.
fn overlapped<T: Equivalence + Copy>(
    comm: &SimpleCommunicator,
    pipe: &mut dyn Pipeline<T>,
    bufs: &mut [(Vec<T>, Vec<T>)],
) -> Result<(), Error> {
    check_buffers(pipe, bufs)?;
    let n = pipe.buckets();
    for k in 0..n {
        count("all-reduce", pipe.len(k))?;
    }
    if bufs.len() < 2 {
        return in_turn(pipe, bufs, |s, r| all_reduce_sum(comm, s, r));
    }
    if n == 0 {
        return Ok(());
    }
    let w = (bufs.len() / 2).min(4);
    let (a, rest) = bufs.split_at_mut(w);
    let b = &mut rest[..w];
    let mut sets = [a, b];
    let len0 = pipe.len(0);
    pipe.fill(0, &mut sets[0][0].0[..len0])?;
    let windows = n.div_ceil(w);
    for win in 0..windows {
        let first = win * w;
        let here = w.min(n - first);
        let before = if win > 0 { w } else { 0 };
        let [s0, s1] = &mut sets;
        let (cur, prev) = if win % 2 == 0 { (s0, s1) } else { (s1, s0) };
        let mut done: Result<(), Error> = Ok(());
        mpi::request::scope(|scope| {
            let mut flying: smallvec::SmallVec<[_; 4]> = smallvec::SmallVec::new();
            for (i, (send, recv)) in cur.iter_mut().take(here).enumerate() {
                let k = first + i;
                let len = pipe.len(k);
                if i > 0 && done.is_ok() {
                    done = pipe.fill(k, &mut send[..len]);
                }
                flying.push(comm.immediate_all_reduce_into(
                    scope,
                    &send[..len],
                    &mut recv[..len],
                    SystemOperation::sum(),
                ));
                if i < before && done.is_ok() {
                    let pk = first - w + i;
                    let plen = pipe.len(pk);
                    done = pipe.drain(pk, &mut prev[i].1[..plen]);
                }
            }
            for (i, (_, recv)) in prev.iter_mut().enumerate().take(before).skip(here) {
                let pk = first - w + i;
                let plen = pipe.len(pk);
                if done.is_ok() {
                    done = pipe.drain(pk, &mut recv[..plen]);
                }
            }
            if first + here < n && done.is_ok() {
                let k = first + here;
                let len = pipe.len(k);
                done = pipe.fill(k, &mut prev[0].0[..len]);
            }
            for request in flying {
                request.wait();
            }
        });
        done?;
    }
    let last = windows - 1;
    let first = last * w;
    for (i, (_, recv)) in sets[last % 2].iter_mut().take(n - first).enumerate() {
        let len = pipe.len(first + i);
        pipe.drain(first + i, &mut recv[..len])?;
    }
    Ok(())
}

/// A world of MPI ranks: usually `universe.world()`. Every collective is
/// the MPI one of the same name (`MPI_Allreduce` with `MPI_SUM`,
/// `MPI_Bcast`, `MPI_Allgather`, `MPI_Reduce_scatter_block`, `MPI_Barrier`); the sums are MPI's, whose
/// grouping of additions the MPI library picks.
///
/// A failure of the transport (a rank killed) is MPI's to handle: Open MPI
/// aborts the whole job.
///
/// ```
/// use scopetree::ranks::Collective;
/// // Without `mpirun`, Open MPI starts a world of one rank.
/// let universe = mpi::initialize().expect("MPI initialises once per process");
/// let world = universe.world();
/// let mut sum = [0.0_f64; 2];
/// Collective::all_reduce_sum_f64(&world, &[1.5, 2.5], &mut sum)?;
/// assert_eq!(sum.map(|x| x / Collective::size(&world) as f64), [1.5, 2.5]);
/// # Ok::<(), scopetree::ranks::Error>(())
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "mpi")))]
impl Collective for SimpleCommunicator {
    /// `MPI_Comm_rank`. O(1).
    fn rank(&self) -> usize {
        usize::try_from(Communicator::rank(self)).unwrap_or_default()
    }

    /// `MPI_Comm_size`. O(1).
    fn size(&self) -> usize {
        usize::try_from(Communicator::size(self)).unwrap_or_default()
    }

    /// `MPI_Allreduce` with `MPI_SUM` from `send` into `recv`. O(len) per
    /// rank, plus the transport.
    fn all_reduce_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        all_reduce_sum(self, send, recv)
    }

    /// `MPI_Allreduce` with `MPI_SUM` from `send` into `recv`. O(len) per
    /// rank, plus the transport.
    fn all_reduce_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        all_reduce_sum(self, send, recv)
    }

    /// `MPI_Reduce_scatter_block` with `MPI_SUM` from `send` into `recv`.
    /// O(len of `send`) per rank, plus the transport.
    fn reduce_scatter_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        reduce_scatter_sum(self, send, recv)
    }

    /// `MPI_Reduce_scatter_block` with `MPI_SUM` from `send` into `recv`.
    /// O(len of `send`) per rank, plus the transport.
    fn reduce_scatter_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        reduce_scatter_sum(self, send, recv)
    }

    /// `MPI_Reduce` with `MPI_SUM` into `recv` on `root`. O(len) per rank,
    /// plus the transport.
    fn reduce_sum_f32(&self, root: usize, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        reduce_sum(self, root, send, recv)
    }

    /// As for `f32`.
    fn reduce_sum_f64(&self, root: usize, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        reduce_sum(self, root, send, recv)
    }

    /// `MPI_Allgather` of `send`'s bytes into `recv`. O(len of `recv`) per
    /// rank, plus the transport.
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), Error> {
        blocks("all-gather", Collective::size(self), send.len(), recv.len())?;
        count("all-gather", recv.len())?;
        self.all_gather_into(send, recv);
        Ok(())
    }

    /// `MPI_Bcast` of `buf` from `root`. O(len) per rank, plus the transport.
    fn broadcast_bytes(&self, root: usize, buf: &mut [u8]) -> Result<(), Error> {
        check_root(root, Collective::size(self))?;
        count("broadcast", buf.len())?;
        let root = i32::try_from(root).unwrap_or_default();
        self.process_at_rank(root).broadcast_into(buf);
        Ok(())
    }

    /// `MPI_Allgather` of 16 bytes per rank. O(size).
    fn all_gather_digest(&self, mine: &Digest, all: &mut [Digest]) -> Result<(), Error> {
        let size = Collective::size(self);
        if all.len() != size {
            return Err(Error::BadBuffers {
                op: "all-gather",
                reason: format!("{} receive slots for a world of {size} ranks", all.len()),
            });
        }
        self.all_gather_into(&mine[..], all.as_flattened_mut());
        Ok(())
    }

    /// `MPI_Barrier`. O(1) here, plus the transport.
    fn barrier(&self) -> Result<(), Error> {
        CommunicatorCollectives::barrier(self);
        Ok(())
    }

    /// Non-blocking `MPI_Iallreduce`s with `MPI_SUM`, each bucket's
    /// transfer overlapping the copies of the buckets around it (two buffer
    /// pairs or more; see the ranks layer's docs). O(bytes) per rank, plus
    /// the transport.
    fn all_reduce_sum_f32_pipelined(
        &self,
        pipe: &mut dyn Pipeline<f32>,
        bufs: &mut [(Vec<f32>, Vec<f32>)],
    ) -> Result<(), Error> {
        overlapped(self, pipe, bufs)
    }

    /// As for `f32`.
    fn all_reduce_sum_f64_pipelined(
        &self,
        pipe: &mut dyn Pipeline<f64>,
        bufs: &mut [(Vec<f64>, Vec<f64>)],
    ) -> Result<(), Error> {
        overlapped(self, pipe, bufs)
    }
}
