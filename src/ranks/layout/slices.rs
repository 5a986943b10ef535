//! Moving [sliced state](crate::ranks::SlicedState) between the ranks' pieces
//! and whole tensors. In a save, the holder of each tensor (the owner of
//! its middle element) gathers the pieces that other ranks own of it; in
//! a load, the holder of each tensor it read sends the other ranks their
//! pieces. Only the pieces of the tensors that two ranks' slices split
//! move, by broadcast in chunks of at most one bucket.

use std::ops::Range;

use super::sliced::{BoundState, StateLayout};
use crate::ScopeTree;
use crate::ranks::error::Error;
use crate::ranks::transport::collective::Collective;
use crate::ranks::vars::manifest::Manifest;

/// State tensor `t`'s element size and its bytes in all, as `(size, bytes)`.
fn bytes_of(
    layout: &StateLayout,
    manifest: &Manifest,
    bound: &BoundState,
    t: usize,
) -> (usize, usize) {
    let entry = &manifest.entries()[layout.vars[bound.tensors[t].var]];
    let size = entry.dtype.bitsize() / 8;
    (size, entry.shape.iter().product::<usize>() * size)
}

/// A piece's byte range within its tensor.
fn range(start: usize, len: usize, size: usize) -> Range<usize> {
    start * size..(start + len) * size
}

/// The chunks of `n` bytes, at most `cap` each, as (offset, length).
fn chunks(n: usize, cap: usize) -> impl Iterator<Item = (usize, usize)> {
    let cap = cap.max(1);
    (0..n).step_by(cap).map(move |at| (at, cap.min(n - at)))
}

/// The largest piece of a split tensor, bounded by `cap`: the scratch a
/// rank needs for the chunks it sends or sees pass. O(tensors).
fn scratch_len(layout: &StateLayout, manifest: &Manifest, cap: usize) -> usize {
    layout
        .owners
        .iter()
        .zip(&layout.vars)
        .filter(|(owners, _)| owners.len() > 1)
        .flat_map(|(owners, &i)| {
            let size = manifest.entries()[i].dtype.bitsize() / 8;
            owners.iter().map(move |(_, p)| p.len * size)
        })
        .max()
        .unwrap_or(0)
        .min(cap.max(1))
}

/// Builds, on each rank, the whole tensors of `bound` it holds: its own
/// pieces copied, the pieces other ranks own received. Returns their
/// positions in `bound.tensors`, in order, each with the staging buffer
/// that holds its bytes (the buffers keep their capacity from call to
/// call); with `copy_own` false, a tensor this rank owns whole is not
/// copied (`None`: its bytes are its variable's). A collective call, in
/// the same order on every rank. O(bytes copied + bytes of the split
/// tensors' pieces); memory: the tensors copied plus one chunk.
///
/// # Errors
/// A failed collective; [`Error::Tree`] for a variable that changed since
/// `bound` (never while the caller holds the tree).
#[allow(clippy::too_many_arguments)]
pub(in crate::ranks) fn gather_whole<C: Collective + ?Sized>(
    comm: &C,
    tree: &ScopeTree,
    layout: &StateLayout,
    manifest: &Manifest,
    bound: &BoundState,
    cap: usize,
    copy_own: bool,
    buffers: &mut Vec<Vec<u8>>,
) -> Result<Vec<(usize, Option<usize>)>, Error> {
    let me = comm.rank();
    let mut scratch = vec![0_u8; scratch_len(layout, manifest, cap)];
    let mut held = Vec::new();
    let mut used = 0;
    for (t, tensor) in bound.tensors.iter().enumerate() {
        let holder = layout.holders[tensor.var];
        let owners = &layout.owners[tensor.var];
        let (size, total) = bytes_of(layout, manifest, bound, t);
        if me == holder && !copy_own && owners.len() == 1 {
            held.push((t, None)); // its variable is the whole tensor
            continue;
        }
        if me == holder {
            if buffers.len() <= used {
                buffers.push(Vec::new());
            }
            let buf = &mut buffers[used];
            buf.clear();
            buf.resize(total, 0);
            held.push((t, Some(used)));
            used += 1;
        }
        let mine = match bound.mine[t] {
            Some((_, slot)) => (slot.access.bytes)(tree, slot.id)?,
            None => &[][..],
        };
        for &(owner, p) in owners {
            let at = range(p.start, p.len, size);
            if owner == holder {
                if me == holder {
                    buffers[used - 1][at].copy_from_slice(mine);
                }
                continue;
            }
            for (off, n) in chunks(at.len(), cap) {
                if me == holder {
                    let to = at.start + off;
                    comm.broadcast_bytes(owner, &mut buffers[used - 1][to..to + n])?;
                } else {
                    if me == owner {
                        scratch[..n].copy_from_slice(&mine[off..off + n]);
                    }
                    comm.broadcast_bytes(owner, &mut scratch[..n])?;
                }
            }
        }
    }
    Ok(held)
}

/// The reverse of [`gather_whole`] in a load: each rank holds the whole
/// tensors `held[t]` (empty for those it does not hold) and every rank
/// ends with its pieces of every tensor written into its variables. A
/// collective call, in the same order on every rank. O(bytes of this
/// rank's pieces + bytes of the split tensors' pieces); memory: one chunk.
///
/// # Errors
/// A failed collective; [`Error::Tree`] for a variable that changed since
/// `bound` (never while the caller holds the tree).
pub(in crate::ranks) fn scatter_whole<C: Collective + ?Sized>(
    comm: &C,
    tree: &mut ScopeTree,
    layout: &StateLayout,
    manifest: &Manifest,
    bound: &BoundState,
    held: &mut [Vec<u8>],
    cap: usize,
) -> Result<(), Error> {
    let me = comm.rank();
    let mut scratch = vec![0_u8; scratch_len(layout, manifest, cap)];
    for (t, tensor) in bound.tensors.iter().enumerate() {
        let holder = layout.holders[tensor.var];
        let (size, _) = bytes_of(layout, manifest, bound, t);
        for &(owner, p) in &layout.owners[tensor.var] {
            let at = range(p.start, p.len, size);
            let slot = bound.mine[t].filter(|_| me == owner).map(|(_, s)| s);
            if owner == holder {
                if let Some(slot) = slot {
                    (slot.access.bytes_mut)(tree, slot.id)?.copy_from_slice(&held[t][at]);
                }
                continue;
            }
            for (off, n) in chunks(at.len(), cap) {
                if me == holder {
                    let from = at.start + off;
                    comm.broadcast_bytes(holder, &mut held[t][from..from + n])?;
                } else if let Some(slot) = slot {
                    let dest = (slot.access.bytes_mut)(tree, slot.id)?;
                    comm.broadcast_bytes(holder, &mut dest[off..off + n])?;
                } else {
                    comm.broadcast_bytes(holder, &mut scratch[..n])?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::chunks;

    #[test]
    fn chunks_cover_the_bytes_once_in_order() {
        let got: Vec<_> = chunks(10, 4).collect();
        assert_eq!(got, [(0, 4), (4, 4), (8, 2)]);
        assert_eq!(chunks(0, 4).count(), 0);
        assert_eq!(chunks(3, 0).count(), 3); // a cap of 0 counts as 1
    }
}
