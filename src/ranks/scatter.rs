//! The buffers and copies of the partitioned exchange (ZeRO stage 1): the
//! reduce-scatter of each float type into this rank's slice, and the
//! all-gather of every rank's slice, for [`SyncPlan`](super::SyncPlan)'s
//! `reduce_scatter` and `all_gather`.

use super::collective::Collective;
use super::error::Error;
use super::options::Reduce;
use super::partition::Partition;
use super::values::{Float, Slot, cast, cast_mut};
use crate::ScopeTree;

/// The buffers of one float type's reduce-scatter: `size` blocks of `block`
/// elements to send, one block to receive.
#[derive(Default)]
struct Scatter<F> {
    block: usize,
    send: Vec<F>,
    recv: Vec<F>,
}

/// A plan's buffers for the partitioned exchange, made by its first call
/// and reused after.
#[derive(Default)]
pub(crate) struct ZeroBuffers {
    f32s: Option<Scatter<f32>>,
    f64s: Option<Scatter<f64>>,
    /// The all-gather: this rank's block of bytes, and every rank's.
    gather: Option<(Vec<u8>, Vec<u8>)>,
}

/// The bytes of one element of `slot`.
fn elem_size(slot: &Slot) -> usize {
    slot.access.dtype.bitsize() / 8
}

impl<F: Float> Scatter<F> {
    /// Buffers for `part`, whose largest slice of `F` sets the block.
    fn new(part: &Partition, slots: &[Slot]) -> Self {
        let block = (0..part.ranks())
            .map(|r| {
                part.pieces(r)
                    .iter()
                    .filter(|p| slots[p.var].access.dtype == F::DTYPE)
                    .map(|p| p.len)
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        Self {
            block,
            send: vec![F::zeroed(); block * part.ranks()],
            recv: vec![F::zeroed(); block],
        }
    }

    /// Reduce-scatters the `F` variables: every rank's slice goes into its
    /// block, and this rank's reduced block back into its pieces.
    fn run<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        part: &Partition,
        slots: &[Slot],
        op: Reduce,
    ) -> Result<(), Error> {
        if self.block == 0 {
            return Ok(()); // the same on every rank: no variable of this type
        }
        for r in 0..part.ranks() {
            let mut at = r * self.block;
            for p in part.pieces(r) {
                let slot = slots[p.var];
                if slot.access.dtype != F::DTYPE {
                    continue;
                }
                let elems: &[F] = cast((slot.access.bytes)(tree, slot.id)?)?;
                self.send[at..at + p.len].copy_from_slice(&elems[p.elems()]);
                at += p.len;
            }
        }
        F::scatter(comm, &self.send, &mut self.recv)?;
        if op == Reduce::Mean {
            let ranks = F::of_count(comm.size());
            for x in &mut self.recv {
                *x = *x / ranks;
            }
        }
        let mut at = 0;
        for p in part.pieces(comm.rank()) {
            let slot = slots[p.var];
            if slot.access.dtype != F::DTYPE {
                continue;
            }
            let elems: &mut [F] = cast_mut((slot.access.bytes_mut)(tree, slot.id)?)?;
            elems[p.elems()].copy_from_slice(&self.recv[at..at + p.len]);
            at += p.len;
        }
        Ok(())
    }
}

impl ZeroBuffers {
    /// Reduce-scatters the `f32` then the `f64` variables of `slots`, cut
    /// by `part`. The first call allocates the buffers; later calls
    /// allocate nothing. O(bytes) per rank.
    pub(super) fn reduce_scatter<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        part: &Partition,
        slots: &[Slot],
        op: Reduce,
    ) -> Result<(), Error> {
        self.f32s
            .get_or_insert_with(|| Scatter::new(part, slots))
            .run(comm, tree, part, slots, op)?;
        self.f64s
            .get_or_insert_with(|| Scatter::new(part, slots))
            .run(comm, tree, part, slots, op)
    }

    /// All-gathers every rank's slice of `slots` (cut by `part`), each
    /// padded to `block` bytes, the largest slice's. The first call
    /// allocates the buffers; later calls allocate nothing. O(bytes) per
    /// rank.
    pub(super) fn all_gather<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        part: &Partition,
        slots: &[Slot],
        block: usize,
    ) -> Result<(), Error> {
        let (send, recv) = self
            .gather
            .get_or_insert_with(|| (vec![0; block], vec![0; block * part.ranks()]));
        let me = comm.rank();
        let mut at = 0;
        for p in part.pieces(me) {
            let slot = slots[p.var];
            let e = elem_size(&slot);
            let bytes = (slot.access.bytes)(tree, slot.id)?;
            send[at..at + p.len * e].copy_from_slice(&bytes[p.start * e..(p.start + p.len) * e]);
            at += p.len * e;
        }
        comm.all_gather_bytes(send, recv)?;
        for r in (0..part.ranks()).filter(|&r| r != me) {
            let mut at = r * block;
            for p in part.pieces(r) {
                let slot = slots[p.var];
                let e = elem_size(&slot);
                let bytes = (slot.access.bytes_mut)(tree, slot.id)?;
                bytes[p.start * e..(p.start + p.len) * e]
                    .copy_from_slice(&recv[at..at + p.len * e]);
                at += p.len * e;
            }
        }
        Ok(())
    }
}
