//! ZeRO stage 1 for a [`CandlePlan`] over [`Nccl`]: the reduce-scatter of
//! the gradients and the all-gather of the parameters on the device, each
//! rank's slice laid end to end per float type and padded to the largest
//! rank's, as NCCL's equal blocks need.

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor};

use super::comm::{DeviceCollective, Nccl};
use super::plan::{Divisors, same_world};
use crate::ranks::candle::plan::{CandlePlan, candle};
use crate::ranks::error::Error;
use crate::ranks::layout::partition::Piece;
use crate::ranks::plan::agree::{Same, settle, show_count};
use crate::ranks::plan::options::Reduce;
use crate::ranks::transport::collective::Collective;

/// One float type's exchange, queued: each rank's pieces and the device
/// buffer that receives them.
struct Queued {
    pieces: Vec<Vec<Piece>>,
    block: usize,
    out: Tensor,
}

impl CandlePlan {
    /// As [`reduce_scatter`](Self::reduce_scatter), over NCCL on the GPU:
    /// per float type, every rank's slice of the gradients (zeros where a
    /// rank has none, padded to the largest rank's) is laid into one device
    /// buffer and summed by one `ncclReduceScatter`, each rank receiving its
    /// own; a mean divides on the device. Both types' calls are queued
    /// before one wait. Afterwards the elements of this rank's slice in
    /// `grads` hold the reduced gradients (in a fresh copy of this rank's
    /// gradient, zeros where it has none) and the others keep this rank's
    /// own. Hand `grads` to [`ZeroAdamW`](crate::ranks::ZeroAdamW), which
    /// keeps its moments on the device.
    ///
    /// The agreement runs first over `comm`, the bootstrap collective, as
    /// in [`all_reduce_nccl`](Self::all_reduce_nccl). Device memory: one
    /// copy of the gradients (the send buffers) and of this rank's slice
    /// while the call runs. O(bytes) on the device, plus NCCL's transfer.
    ///
    /// # Errors
    /// As [`all_reduce_nccl`](Self::all_reduce_nccl).
    ///
    /// ```no_run
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, Nccl, PlanOptions, Reduce, SingleProcess}};
    /// let device = Device::new_cuda(0)?;
    /// let nccl = Nccl::new(&SingleProcess, &device)?;
    /// let store = CandleStore::new();
    /// let w = store.get(3, "w", candle_nn::Init::Const(2.0), DType::F32, &device)?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let mut grads = w.sqr()?.sum_all()?.backward()?;
    /// plan.reduce_scatter_nccl(&SingleProcess, &nccl, &mut grads, Reduce::Mean)?;
    /// assert_eq!(grads.get(&w).expect("a gradient").to_vec1::<f32>()?, [4.0; 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce_scatter_nccl<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        nccl: &Nccl,
        grads: &mut GradStore,
        op: Reduce,
    ) -> Result<(), Error> {
        self.reduce_scatter_device(comm, nccl, grads, op)
    }

    /// [`reduce_scatter_nccl`](Self::reduce_scatter_nccl) over any
    /// [`DeviceCollective`].
    pub(super) fn reduce_scatter_device<C: Collective + ?Sized, D: DeviceCollective + ?Sized>(
        &mut self,
        comm: &C,
        nccl: &D,
        grads: &mut GradStore,
        op: Reduce,
    ) -> Result<(), Error> {
        const OP: &str = "reduce-scatter over NCCL";
        let done = self
            .agree_on_gradients(comm, nccl, grads, op, OP)
            .and_then(|()| {
                let divisors = Divisors::new(nccl, op)?;
                let me = nccl.rank();
                let keys = self.manifest.entries();
                let mut queued = Vec::new();
                for dtype in [DType::F32, DType::F64] {
                    let pieces: Vec<Vec<Piece>> = (0..nccl.size())
                        .map(|r| self.lane_pieces(r, dtype, true))
                        .collect();
                    let Some(block) = longest(&pieces) else {
                        continue;
                    };
                    let mut parts = Vec::new();
                    for ps in &pieces {
                        for p in ps {
                            parts.push(self.source_or_zeros(nccl, p.var, p.start, p.len)?);
                        }
                        parts.extend(padding(ps, block, dtype, nccl)?);
                    }
                    let send = joined(nccl, &parts, OP)?;
                    let out =
                        Tensor::zeros(block, dtype, nccl.device()).map_err(|e| candle(OP, e))?;
                    nccl.queue_reduce_scatter(&send, &out)?;
                    let first = pieces[me].first().map_or(OP, |p| keys[p.var].key.as_str());
                    let out = divisors.mean(out, first)?;
                    queued.push(Queued { pieces, block, out });
                }
                nccl.wait("NCCL reduce-scatter")?;
                // This rank's results: a fresh copy of each gradient of its
                // slice, its piece written from the received block.
                let mut reduced = Vec::new();
                for q in &queued {
                    let mut at = 0;
                    for p in &q.pieces[me] {
                        let key = &keys[p.var].key;
                        let fresh = match &self.sources[p.var] {
                            Some(g) => g.copy(),
                            None => self.vars[p.var].zeros_like(),
                        };
                        let t = fresh
                            .and_then(|t| {
                                let part = q.out.narrow(0, at, p.len)?;
                                t.flatten_all()?.slice_set(&part, 0, p.start)?;
                                Ok(t)
                            })
                            .map_err(|e| candle(key, e))?;
                        reduced.push((p.var, t));
                        at += p.len;
                    }
                    debug_assert!(at <= q.block);
                }
                for (i, t) in reduced {
                    grads.insert(self.vars[i].as_tensor(), t);
                }
                Ok(())
            });
        self.sources.clear();
        done
    }

    /// As [`all_gather`](Self::all_gather), over NCCL on the GPU: per float
    /// type, this rank's slice of the values (padded to the largest rank's)
    /// goes to every rank by one `ncclAllGather`, both types' calls queued
    /// before one wait; then every other rank's pieces are written in place
    /// into the variables' storage on the device. The ranks agree first
    /// over `comm`. Device memory: `size + 1` slices while the call runs.
    /// O(bytes) on the device, plus NCCL's transfer.
    ///
    /// # Errors
    /// On every rank [`Error::ArgumentsDiffer`] when the ranks' slices
    /// differ in size. On a rank whose variables are not on `nccl`'s device,
    /// or whose `comm` and `nccl` differ, [`Error::Nccl`]; on the others
    /// [`Error::PeerFailed`]; nothing changes then. A candle failure after
    /// the exchange ([`Error::Candle`]) leaves the pieces written before it
    /// with their new values.
    ///
    /// ```no_run
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, Nccl, PlanOptions, SingleProcess}};
    /// let device = Device::new_cuda(0)?;
    /// let nccl = Nccl::new(&SingleProcess, &device)?;
    /// let store = CandleStore::new();
    /// let w = store.get(3, "w", candle_nn::Init::Const(0.5), DType::F32, &device)?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// plan.all_gather_nccl(&SingleProcess, &nccl)?;
    /// assert_eq!(w.to_vec1::<f32>()?, [0.5; 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_gather_nccl<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        nccl: &Nccl,
    ) -> Result<(), Error> {
        self.all_gather_device(comm, nccl)
    }

    /// [`all_gather_nccl`](Self::all_gather_nccl) over any
    /// [`DeviceCollective`].
    pub(super) fn all_gather_device<C: Collective + ?Sized, D: DeviceCollective + ?Sized>(
        &mut self,
        comm: &C,
        nccl: &D,
    ) -> Result<(), Error> {
        const OP: &str = "all-gather over NCCL";
        self.sources.clear();
        self.sources.resize(self.vars.len(), None);
        let agreed = {
            let _watch = self.watch(comm, OP);
            let part = &self.partition;
            let block = (0..part.ranks()).map(|r| part.bytes(r)).max().unwrap_or(0);
            let same: Same = ("slice sizes", block as u64, show_count);
            let local = same_world(comm, nccl, OP).and_then(|()| self.on_device(nccl, OP));
            settle(comm, &mut self.gathered, OP, local, Some(same))
        };
        self.sources.clear();
        agreed?;
        let (me, keys) = (nccl.rank(), self.manifest.entries());
        let mut queued = Vec::new();
        for dtype in [DType::F32, DType::F64] {
            let pieces: Vec<Vec<Piece>> = (0..nccl.size())
                .map(|r| self.lane_pieces(r, dtype, false))
                .collect();
            let Some(block) = longest(&pieces) else {
                continue;
            };
            let mut parts = Vec::new();
            for p in &pieces[me] {
                let v = self.vars[p.var].as_tensor();
                let part = v.flatten_all().and_then(|t| t.narrow(0, p.start, p.len));
                parts.push(part.map_err(|e| candle(&keys[p.var].key, e))?);
            }
            parts.extend(padding(&pieces[me], block, dtype, nccl)?);
            let send = joined(nccl, &parts, OP)?;
            let out = Tensor::zeros(block * nccl.size(), dtype, nccl.device());
            let out = out.map_err(|e| candle(OP, e))?;
            nccl.queue_all_gather(&send, &out)?;
            queued.push(Queued { pieces, block, out });
        }
        nccl.wait("NCCL all-gather")?;
        for q in &queued {
            for (r, ps) in q.pieces.iter().enumerate().filter(|&(r, _)| r != me) {
                let mut at = r * q.block;
                for p in ps {
                    let v = self.vars[p.var].as_tensor();
                    (q.out.narrow(0, at, p.len))
                        .and_then(|part| v.flatten_all()?.slice_set(&part, 0, p.start))
                        .map_err(|e| candle(&keys[p.var].key, e))?;
                    at += p.len;
                }
            }
        }
        Ok(())
    }
}

/// The largest rank's elements of `pieces`, or `None` when no rank has any.
fn longest(pieces: &[Vec<Piece>]) -> Option<usize> {
    let block = (pieces.iter())
        .map(|ps| ps.iter().map(|p| p.len).sum::<usize>())
        .max()?;
    (block > 0).then_some(block)
}

/// Zeros that pad `pieces` to `block` elements, if they fall short.
fn padding<D: DeviceCollective + ?Sized>(
    pieces: &[Piece],
    block: usize,
    dtype: DType,
    nccl: &D,
) -> Result<Option<Tensor>, Error> {
    let len: usize = pieces.iter().map(|p| p.len).sum();
    (len < block)
        .then(|| Tensor::zeros(block - len, dtype, nccl.device()))
        .transpose()
        .map_err(|e| candle("the padding", e))
}

/// `parts` in one contiguous device buffer of its own.
fn joined<D: DeviceCollective + ?Sized>(
    nccl: &D,
    parts: &[Tensor],
    op: &'static str,
) -> Result<Tensor, Error> {
    match parts {
        [one] => nccl.fresh(one, op),
        _ => Tensor::cat(parts, 0)
            .map(|t| t.detach())
            .map_err(|e| candle(op, e)),
    }
}
