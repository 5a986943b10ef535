//! [`Collective`] over MPI (feature `mpi`): the `mpi` crate's
//! `SimpleCommunicator`, through its safe API.

use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Equivalence, Root};

use super::collective::{Collective, Digest, blocks, check_root, same_len};
use super::error::Error;

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
}
