//! ZeRO stage 1 for a [`CandlePlan`]: its [`partition`](CandlePlan::partition),
//! the [`reduce_scatter`](CandlePlan::reduce_scatter) of the gradients in a
//! candle `GradStore` and the [`all_gather`](CandlePlan::all_gather) of the
//! parameters, on any device, a bucket's chunk at a time through host
//! staging (`chunks.rs`).

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, WithDType};

use smallvec::SmallVec;

use super::chunks::{Chunk, ChunkStaging, Laid, exchange_staged, steps};
use super::plan::{CandlePlan, candle};
use crate::ranks::error::Error;
use crate::ranks::layout::partition::{Partition, Piece};
use crate::ranks::plan::agree::{Same, settle, show_count};
use crate::ranks::plan::options::Reduce;
use crate::ranks::transport::collective::Collective;
use crate::ranks::vars::values::{Float, cast, cast_mut};

impl CandlePlan {
    /// ZeRO's cut of the plan's variables into one contiguous slice per
    /// rank, by [`Partition`]'s rule over the manifest: every rank computes
    /// the same cut, a variable may be split between ranks, and each slice
    /// holds about 1/N of the bytes. [`reduce_scatter`](Self::reduce_scatter),
    /// [`ZeroAdamW`](crate::ranks::ZeroAdamW) and
    /// [`all_gather`](Self::all_gather) follow it. O(1).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu))?;
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// assert_eq!(plan.partition().bytes(0), 8 * 4); // a world of one owns it all
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// Sums (or averages) over the ranks the gradients of each rank's own
    /// slice of the variables ([`partition`](Self::partition)), the first
    /// half of a ZeRO step: afterwards, on each rank, the elements of its
    /// slice in `grads` hold the reduced gradients, bit for bit those of
    /// [`all_reduce`](Self::all_reduce) where the transport adds in the
    /// same order (always at 2 ranks), and the other elements keep this
    /// rank's own. Hand `grads` to [`ZeroAdamW`](crate::ranks::ZeroAdamW),
    /// which reads the slice only. A collective call.
    ///
    /// Each rank's slice goes to it by `MPI_Reduce` (`f32` variables, then
    /// `f64` ones), in calls of at most a bucket, each call's chunk
    /// gathered from the gradients into host staging; on the owner, each
    /// chunk of sums is written on the device into a fresh copy of this
    /// rank's gradient (zeros where it has none) that replaces it in
    /// `grads`. Missing gradients count as zeros, and a variable no rank
    /// has a gradient of stays without one, as in
    /// [`all_reduce`](Self::all_reduce). On one CUDA device (feature
    /// `cuda`) the staging is the plan's page-locked buffers and the copies
    /// run beside MPI's calls: chunk `k + 1` is copied off the device
    /// while chunk `k` is reduced. Host memory: four buffers of at most a
    /// bucket. O(bytes) per rank read, O(slice) written, plus the transport
    /// and the agreement's all-gather of 16 bytes per rank.
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce): on every rank
    /// [`Error::ArgumentsDiffer`] when the ranks pass different `op`s; on a
    /// rank whose gradient of a variable has another dtype or shape than the
    /// variable, [`Error::Changed`], or whose gradient cannot be read,
    /// [`Error::Candle`], and on the others [`Error::PeerFailed`]; `grads`
    /// is unchanged then. Should candle fail after the exchange
    /// ([`Error::Candle`]), `grads` is unchanged on that rank only.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, Reduce, SingleProcess}};
    /// let store = CandleStore::new();
    /// let w = store.get(3, "w", candle_nn::Init::Const(2.0), DType::F32, &Device::Cpu)?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let mut grads = w.sqr()?.sum_all()?.backward()?;
    /// plan.reduce_scatter(&SingleProcess, &mut grads, Reduce::Mean)?;
    /// assert_eq!(grads.get(&w).expect("a gradient").to_vec1::<f32>()?, [4.0; 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce_scatter<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        grads: &mut GradStore,
        op: Reduce,
    ) -> Result<(), Error> {
        let _watch = self.watch(comm, "reduce-scatter");
        let local = self.gradients(grads);
        let done = settle(
            comm,
            &mut self.gathered,
            "reduce-scatter",
            local,
            Some(op.same()),
        );
        let done = done.and_then(|()| {
            comm.all_reduce_sum_f64(&self.present, &mut self.present_sum)?;
            // This rank's results: a fresh copy of each gradient of its
            // slice (its own storage, so the writes touch nothing else).
            let me = comm.rank();
            let mut out: Vec<Option<Tensor>> = vec![None; self.vars.len()];
            for p in self.partition.pieces(me) {
                if self.present_sum[p.var] == 0.0 {
                    continue;
                }
                let key = &self.manifest.entries()[p.var].key;
                let fresh = match &self.sources[p.var] {
                    Some(g) => g.copy(),
                    None => self.vars[p.var].zeros_like(),
                };
                out[p.var] = Some(fresh.map_err(|e| candle(key, e))?);
            }
            let mut staging = std::mem::take(&mut self.chunk_staging);
            let done = (self.scatter_lane::<f32, C>(comm, &mut staging, DType::F32, op, &out))
                .and_then(|()| {
                    self.scatter_lane::<f64, C>(comm, &mut staging, DType::F64, op, &out)
                });
            self.chunk_staging = staging;
            done?;
            for (v, t) in self.vars.iter().zip(out) {
                if let Some(t) = t {
                    grads.insert(v.as_tensor(), t);
                }
            }
            Ok(())
        });
        self.sources.clear();
        done
    }

    /// The pieces of rank `r`'s slice of `dtype` (those that some rank has
    /// a gradient of when `present`: the same on every rank). O(pieces of
    /// `r`).
    pub(in crate::ranks) fn lane_pieces(
        &self,
        r: usize,
        dtype: DType,
        present: bool,
    ) -> Vec<Piece> {
        (self.partition.pieces(r).iter())
            .filter(|p| self.vars[p.var].dtype() == dtype)
            .filter(|p| !present || self.present_sum[p.var] != 0.0)
            .copied()
            .collect()
    }

    /// Each of the `ranks` ranks' pieces of `dtype` laid end to end (those
    /// some rank has a gradient of when `present`), the most elements of
    /// a rank, and the elements of a chunk of `size`-byte elements (a
    /// bucket's, at most the most of a rank); `None` when no rank has any.
    /// O(pieces).
    fn lanes(
        &self,
        ranks: usize,
        dtype: DType,
        present: bool,
        size: usize,
    ) -> Option<(Vec<Laid>, usize, usize)> {
        let laid: Vec<Laid> = (0..ranks)
            .map(|r| Laid::new(self.lane_pieces(r, dtype, present)))
            .collect();
        let longest = laid.iter().map(Laid::len).max().unwrap_or(0);
        let per = (self.byte_cap / size).clamp(1, longest.max(1));
        (longest > 0).then_some((laid, longest, per))
    }

    /// [`reduce_scatter`](Self::reduce_scatter) of the `dtype` variables:
    /// rank by rank, that rank's pieces laid end to end and reduced to it in
    /// calls of at most a bucket, each chunk gathered from the gradients
    /// through `staging` and its sums, on the owner, put into `out`
    /// ([`exchange_staged`]).
    fn scatter_lane<F: Float + WithDType, C: Collective + ?Sized>(
        &self,
        comm: &C,
        staging: &mut ChunkStaging,
        dtype: DType,
        op: Reduce,
        out: &[Option<Tensor>],
    ) -> Result<(), Error> {
        let size = std::mem::size_of::<F>();
        let me = comm.rank();
        let Some((laid, _, per)) = self.lanes(comm.size(), dtype, true, size) else {
            return Ok(()); // the same on every rank
        };
        let keys = self.manifest.entries();
        let ends: Vec<_> = (keys.iter().zip(&self.sources).zip(out))
            .map(|((e, s), o)| (e.key.as_str(), s.as_ref(), o.as_ref()))
            .collect();
        let mut chunks = laid.iter().enumerate().flat_map(|(r, pieces)| {
            steps(pieces.len(), per).map(move |(at, n)| {
                let send = pieces.slot_parts(at, n, size, 0);
                let mine = r == me;
                Chunk {
                    recv: if mine { send.clone() } else { SmallVec::new() },
                    send,
                    send_len: n * size,
                    recv_len: if mine { n * size } else { 0 },
                    root: r,
                }
            })
        });
        let ranks = F::of_count(comm.size());
        let caps = (per * size, per * size);
        exchange_staged(&ends, staging, caps, &mut chunks, &mut |c, send, recv| {
            let recv = cast_mut::<F>(recv)?;
            F::reduce_to(comm, c.root, cast::<F>(send)?, recv)?;
            if op == Reduce::Mean {
                for x in recv.iter_mut() {
                    *x /= ranks;
                }
            }
            Ok(())
        })
    }

    /// Copies each rank's slice of the variables ([`partition`](Self::partition))
    /// from that rank into the same `Var`s on every rank, the second half
    /// of a ZeRO step: after each rank stepped its own slice
    /// ([`ZeroAdamW`](crate::ranks::ZeroAdamW)), every rank holds all the
    /// updated parameters, bit for bit. A collective call.
    ///
    /// `f32` variables, then `f64` ones: each rank's pieces laid end to end,
    /// gathered into host staging and exchanged by `MPI_Allgather` in
    /// rounds of at most a bucket per rank (each rank's padded to the
    /// largest rank's), and written in place into the variables' storage
    /// on their devices (the model sees them, as with `Var::set`). On one
    /// CUDA device (feature `cuda`) the staging is the plan's page-locked
    /// buffers and the copies run beside MPI's calls. Host memory: two
    /// buffers of at most a bucket and two of `size` buckets. O(bytes) per
    /// rank written, O(slice) read, plus the transport and the agreement's
    /// all-gather of 16 bytes per rank.
    ///
    /// # Errors
    /// On every rank [`Error::ArgumentsDiffer`] when the ranks' slices
    /// differ in size (plans of different worlds). [`Error::Candle`] if a
    /// variable cannot be read or written; the variables written before it
    /// keep their new values then.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// let w = store.get(3, "w", candle_nn::Init::Const(0.5), DType::F64, &Device::Cpu)?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// plan.all_gather(&SingleProcess)?;
    /// assert_eq!(w.to_vec1::<f64>()?, [0.5; 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_gather<C: Collective + ?Sized>(&mut self, comm: &C) -> Result<(), Error> {
        let _watch = self.watch(comm, "all-gather");
        let part = &self.partition;
        let block = (0..part.ranks()).map(|r| part.bytes(r)).max().unwrap_or(0);
        let same: Same = ("slice sizes", block as u64, show_count);
        settle(comm, &mut self.gathered, "all-gather", Ok(()), Some(same))?;
        let mut staging = std::mem::take(&mut self.chunk_staging);
        let done = (self.gather_lane::<f32, C>(comm, &mut staging, DType::F32))
            .and_then(|()| self.gather_lane::<f64, C>(comm, &mut staging, DType::F64));
        self.chunk_staging = staging;
        done
    }

    /// [`all_gather`](Self::all_gather) of the `dtype` variables: rounds
    /// of at most a bucket per rank, each gathering this rank's pieces from
    /// the variables through `staging` and putting the other ranks' into
    /// them ([`exchange_staged`]).
    fn gather_lane<F: Float + WithDType, C: Collective + ?Sized>(
        &self,
        comm: &C,
        staging: &mut ChunkStaging,
        dtype: DType,
    ) -> Result<(), Error> {
        let size = std::mem::size_of::<F>();
        let (me, world) = (comm.rank(), comm.size());
        let Some((laid, longest, per)) = self.lanes(world, dtype, false, size) else {
            return Ok(()); // the same on every rank
        };
        let keys = self.manifest.entries();
        let ends: Vec<_> = (keys.iter().zip(&self.vars))
            .map(|(e, v)| (e.key.as_str(), Some(v.as_tensor()), Some(v.as_tensor())))
            .collect();
        let laid = &laid;
        let mut chunks = steps(longest, per).map(|(at, n)| {
            let recv = (0..world)
                .filter(|&r| r != me)
                .flat_map(|r| laid[r].slot_parts(at, n, size, r * n * size))
                .collect();
            Chunk {
                send: laid[me].slot_parts(at, n, size, 0),
                send_len: n * size,
                recv,
                recv_len: world * n * size,
                root: 0,
            }
        });
        let caps = (per * size, world * per * size);
        exchange_staged(&ends, staging, caps, &mut chunks, &mut |_, send, recv| {
            comm.all_gather_bytes(send, recv)
        })
    }
}
