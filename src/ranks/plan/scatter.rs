//! The buffers and copies of the partitioned exchange (ZeRO stage 1): the
//! reduce-scatter of each float type into this rank's slice, and the
//! all-gather of every rank's slice, for [`SyncPlan`](crate::ranks::SyncPlan)'s
//! `reduce_scatter` and `all_gather`.
//!
//! A piece of a slice of at least [`PlanOptions::direct_bytes`] moves from
//! its variable's own buffer: summed to its owner by one `MPI_Reduce` per
//! bucket-sized chunk into a spare buffer, which then takes the variable's
//! place (a whole variable) or is copied into it (part of one); sent back by
//! `MPI_Bcast` in place. The smaller pieces go through one padded buffer per
//! float type (`MPI_Reduce_scatter_block`) and one of bytes
//! (`MPI_Allgather`), as in one exchange.

use super::options::{PlanOptions, Reduce};
use crate::ScopeTree;
use crate::ranks::error::Error;
use crate::ranks::layout::partition::{Partition, Piece};
use crate::ranks::transport::collective::Collective;
use crate::ranks::vars::values::{Direct, Float, InTree, Slot, cast, cast_mut};

/// The buffers of one float type's reduce-scatter of the small pieces:
/// `size` blocks of `block` elements to send, one block to receive.
#[derive(Default)]
struct Scatter<F> {
    block: usize,
    send: Vec<F>,
    recv: Vec<F>,
}

/// The pieces of the slices, split by size once, on the first call.
struct Layout {
    /// Per rank, the pieces below the direct threshold (any dtype).
    fused: Vec<Vec<Piece>>,
    /// The pieces from the direct threshold up, with their owners, in rank
    /// then manifest order: the same sequence on every rank.
    direct: Vec<(usize, Piece)>,
    /// The all-gather's block: the largest rank's small pieces, in bytes.
    gather_block: usize,
}

/// A plan's buffers for the partitioned exchange, made by its first call
/// and reused after.
pub(crate) struct ZeroBuffers {
    /// The plan's [`PlanOptions::direct_bytes`], on which the ranks agreed.
    direct_bytes: usize,
    /// The most elements (bytes, `f32`s, `f64`s) one call of a direct
    /// piece moves: the bucket, as [`PlanOptions::cap`] gives it.
    cap_bytes: usize,
    cap32: usize,
    cap64: usize,
    layout: Option<Layout>,
    f32s: Option<Scatter<f32>>,
    f64s: Option<Scatter<f64>>,
    /// The spares of this rank's direct pieces, in `layout.direct` order.
    spares32: Vec<Vec<f32>>,
    spares64: Vec<Vec<f64>>,
    /// The all-gather: this rank's block of bytes, and every rank's.
    gather: Option<(Vec<u8>, Vec<u8>)>,
}

/// The bytes of one element of `slot`.
fn elem_size(slot: &Slot) -> usize {
    slot.access.dtype.bitsize() / 8
}

impl Layout {
    /// Splits `part`'s pieces at `direct_bytes`. O(pieces).
    fn new(part: &Partition, slots: &[Slot], direct_bytes: usize) -> Self {
        let mut fused = Vec::with_capacity(part.ranks());
        let mut direct = Vec::new();
        for r in 0..part.ranks() {
            let mut small = Vec::new();
            for &p in part.pieces(r) {
                if p.len * elem_size(&slots[p.var]) >= direct_bytes {
                    direct.push((r, p));
                } else {
                    small.push(p);
                }
            }
            fused.push(small);
        }
        let gather_block = fused
            .iter()
            .map(|pieces| {
                pieces
                    .iter()
                    .map(|p| p.len * elem_size(&slots[p.var]))
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        Self {
            fused,
            direct,
            gather_block,
        }
    }
}

impl<F: Float> Scatter<F> {
    /// Buffers for the small pieces `fused` (per rank), whose largest
    /// slice of `F` sets the block.
    fn new(fused: &[Vec<Piece>], slots: &[Slot]) -> Self {
        let block = fused
            .iter()
            .map(|pieces| {
                pieces
                    .iter()
                    .filter(|p| slots[p.var].access.dtype == F::DTYPE)
                    .map(|p| p.len)
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        Self {
            block,
            send: vec![F::zeroed(); block * fused.len()],
            recv: vec![F::zeroed(); block],
        }
    }

    /// Reduce-scatters the small `F` pieces: every rank's go into its
    /// block, and this rank's reduced block back into its pieces.
    fn run<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        fused: &[Vec<Piece>],
        slots: &[Slot],
        op: Reduce,
    ) -> Result<(), Error> {
        if self.block == 0 {
            return Ok(()); // the same on every rank: no small piece of this type
        }
        for (r, pieces) in fused.iter().enumerate() {
            let mut at = r * self.block;
            for p in pieces {
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
        for p in &fused[comm.rank()] {
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

/// Sums the direct `F` pieces of `direct` to their owners, each from its
/// variable's buffer in chunks of `cap` elements; on the owner into its
/// spare (`spares`, one per direct piece of this rank, in order), which
/// then becomes the variable (a whole one) or is copied into its piece.
fn reduce_direct<F: Float, C: Collective + ?Sized>(
    comm: &C,
    tree: &mut ScopeTree,
    slots: &[Slot],
    direct: &[(usize, Piece)],
    spares: &mut Vec<Vec<F>>,
    cap: usize,
    op: Reduce,
) -> Result<(), Error> {
    let me = comm.rank();
    let mut mine = 0;
    for &(owner, p) in direct {
        let slot = slots[p.var];
        if slot.access.dtype != F::DTYPE {
            continue;
        }
        let elems: &[F] = cast((slot.access.bytes)(tree, slot.id)?)?;
        let send = &elems[p.elems()];
        if owner != me {
            for s in send.chunks(cap) {
                F::reduce_to(comm, owner, s, &mut [])?;
            }
            continue;
        }
        if spares.len() == mine {
            spares.push(Vec::new());
        }
        let spare = &mut spares[mine];
        mine += 1;
        if spare.len() != p.len {
            *spare = vec![F::zeroed(); p.len];
        }
        for (s, r) in send.chunks(cap).zip(spare.chunks_mut(cap)) {
            F::reduce_to(comm, owner, s, r)?;
        }
        if op == Reduce::Mean {
            let ranks = F::of_count(comm.size());
            for x in spare.iter_mut() {
                *x = *x / ranks;
            }
        }
        if p.start == 0 && p.len * std::mem::size_of::<F>() == slot.nbytes {
            InTree { tree, slots }.adopt(p.var, spare)?;
        } else {
            let elems: &mut [F] = cast_mut((slot.access.bytes_mut)(tree, slot.id)?)?;
            elems[p.elems()].copy_from_slice(spare);
        }
    }
    Ok(())
}

impl ZeroBuffers {
    /// The buffers of a plan built with `opts`; nothing is allocated until
    /// the first exchange. O(1).
    pub(in crate::ranks) fn new(opts: &PlanOptions) -> Self {
        Self {
            direct_bytes: opts.direct_bytes,
            cap_bytes: opts.cap(1),
            cap32: opts.cap(4),
            cap64: opts.cap(8),
            layout: None,
            f32s: None,
            f64s: None,
            spares32: Vec::new(),
            spares64: Vec::new(),
            gather: None,
        }
    }

    /// Reduce-scatters the `f32` then the `f64` variables of `slots`, cut
    /// by `part`: the small pieces through the buffers, then the direct
    /// ones. The first call allocates the buffers and the spares of this
    /// rank's direct pieces (about its slice's bytes); later calls allocate
    /// nothing on a tree. O(bytes of the small pieces) of copies per rank,
    /// and O(bytes) of partial direct pieces on their owner.
    pub(in crate::ranks) fn reduce_scatter<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        part: &Partition,
        slots: &[Slot],
        op: Reduce,
    ) -> Result<(), Error> {
        let direct_bytes = self.direct_bytes;
        let layout = self
            .layout
            .get_or_insert_with(|| Layout::new(part, slots, direct_bytes));
        self.f32s
            .get_or_insert_with(|| Scatter::new(&layout.fused, slots))
            .run(comm, tree, &layout.fused, slots, op)?;
        self.f64s
            .get_or_insert_with(|| Scatter::new(&layout.fused, slots))
            .run(comm, tree, &layout.fused, slots, op)?;
        let direct = &layout.direct;
        reduce_direct(
            comm,
            tree,
            slots,
            direct,
            &mut self.spares32,
            self.cap32,
            op,
        )?;
        reduce_direct(
            comm,
            tree,
            slots,
            direct,
            &mut self.spares64,
            self.cap64,
            op,
        )
    }

    /// All-gathers every rank's slice of `slots` (cut by `part`): the small
    /// pieces each padded to the largest rank's small pieces' bytes, the
    /// direct ones broadcast from their owners in place, in chunks of the
    /// bucket. The first call allocates the buffers; later calls allocate
    /// nothing. O(bytes of the small pieces) of copies per rank.
    pub(in crate::ranks) fn all_gather<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        part: &Partition,
        slots: &[Slot],
    ) -> Result<(), Error> {
        let direct_bytes = self.direct_bytes;
        let layout = self
            .layout
            .get_or_insert_with(|| Layout::new(part, slots, direct_bytes));
        let block = layout.gather_block;
        if block > 0 {
            let ranks = part.ranks();
            let (send, recv) = self
                .gather
                .get_or_insert_with(|| (vec![0; block], vec![0; block * ranks]));
            let me = comm.rank();
            let mut at = 0;
            for p in &layout.fused[me] {
                let slot = slots[p.var];
                let e = elem_size(&slot);
                let bytes = (slot.access.bytes)(tree, slot.id)?;
                send[at..at + p.len * e]
                    .copy_from_slice(&bytes[p.start * e..(p.start + p.len) * e]);
                at += p.len * e;
            }
            comm.all_gather_bytes(send, recv)?;
            for (r, pieces) in layout.fused.iter().enumerate().filter(|&(r, _)| r != me) {
                let mut at = r * block;
                for p in pieces {
                    let slot = slots[p.var];
                    let e = elem_size(&slot);
                    let bytes = (slot.access.bytes_mut)(tree, slot.id)?;
                    bytes[p.start * e..(p.start + p.len) * e]
                        .copy_from_slice(&recv[at..at + p.len * e]);
                    at += p.len * e;
                }
            }
        }
        for &(owner, p) in &layout.direct {
            let slot = slots[p.var];
            let e = elem_size(&slot);
            let bytes = (slot.access.bytes_mut)(tree, slot.id)?;
            for chunk in bytes[p.start * e..(p.start + p.len) * e].chunks_mut(self.cap_bytes) {
                comm.broadcast_bytes(owner, chunk)?;
            }
        }
        Ok(())
    }
}
