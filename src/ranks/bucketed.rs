//! The bucketed collectives of a plan: the all-reduce of one float type
//! ([`Lane`]) and the broadcast of bytes, each copying the variables into
//! a bucket, moving it, and copying it back.

use super::buckets::Buckets;
use super::collective::Collective;
use super::error::Error;
use super::options::{PlanOptions, Reduce};
use super::values::{Float, Values};
use crate::checkpoint::Dtype;

/// The buckets and buffers of one float type.
#[derive(Default)]
pub(super) struct Lane<F> {
    buckets: Buckets,
    send: Vec<F>,
    recv: Vec<F>,
}

impl<F: Float> Lane<F> {
    /// The buckets of the variables of type `F` among `vars` (dtype and
    /// bytes, in plan order). O(variables + buckets); allocates the two
    /// buffers of one bucket.
    pub(super) fn new(vars: impl Iterator<Item = (Dtype, usize)>, opts: &PlanOptions) -> Self {
        let size = std::mem::size_of::<F>();
        let buckets = Buckets::cut(
            vars.enumerate()
                .filter(|(_, (dtype, _))| *dtype == F::DTYPE)
                .map(|(i, (_, nbytes))| (i, nbytes / size)),
            opts.cap(size),
        );
        let n = buckets.longest();
        Self {
            buckets,
            send: vec![F::zeroed(); n],
            recv: vec![F::zeroed(); n],
        }
    }

    /// How many all-reduce calls one reduction makes. O(1).
    pub(super) fn calls(&self) -> usize {
        self.buckets.buckets.len()
    }

    /// Sums (or averages) every bucket over the ranks, in place.
    /// Allocates nothing; O(bytes) of copies.
    pub(super) fn reduce<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        values: &mut impl Values,
        op: Reduce,
    ) -> Result<(), Error> {
        let ranks = F::of_count(comm.size());
        let size = std::mem::size_of::<F>();
        for (range, len) in &self.buckets.buckets {
            let segments = &self.buckets.segments[range.clone()];
            for s in segments {
                let into = bytemuck::cast_slice_mut(&mut self.send[s.at..s.at + s.len]);
                values.read(s.var, s.start * size, into)?;
            }
            let recv = &mut self.recv[..*len];
            F::sum(comm, &self.send[..*len], recv)?;
            if op == Reduce::Mean {
                for x in recv.iter_mut() {
                    *x = *x / ranks;
                }
            }
            for s in segments {
                let from = bytemuck::cast_slice(&recv[s.at..s.at + s.len]);
                values.write(s.var, s.start * size, from)?;
            }
        }
        Ok(())
    }
}

/// Copies every variable's bytes on rank `root` to every rank, one bucket
/// of at most `cap` bytes per broadcast; `nbytes` gives the variables'
/// sizes in plan order. Allocates one bucket. O(bytes) per rank.
pub(super) fn broadcast_values<C: Collective + ?Sized>(
    comm: &C,
    root: usize,
    nbytes: impl Iterator<Item = usize>,
    cap: usize,
    values: &mut impl Values,
) -> Result<(), Error> {
    let buckets = Buckets::cut(nbytes.enumerate(), cap);
    let mut buf = vec![0_u8; buckets.longest()];
    let me = comm.rank() == root;
    for (range, len) in &buckets.buckets {
        let segments = &buckets.segments[range.clone()];
        if me {
            for s in segments {
                values.read(s.var, s.start, &mut buf[s.at..s.at + s.len])?;
            }
        }
        comm.broadcast_bytes(root, &mut buf[..*len])?;
        if !me {
            for s in segments {
                values.write(s.var, s.start, &buf[s.at..s.at + s.len])?;
            }
        }
    }
    Ok(())
}
