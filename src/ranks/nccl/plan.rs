//! [`CandlePlan`]'s calls over [`Nccl`]: the bucketed all-reduce of CUDA
//! gradients and the broadcast of the values, with the plan's agreement
//! over the bootstrap [`Collective`] and the buckets of its MPI path.

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor};

use super::comm::{DeviceCollective, Nccl};
use crate::ranks::candle::plan::{CandlePlan, candle};
use crate::ranks::error::Error;
use crate::ranks::plan::agree::{Same, settle, show_count};
use crate::ranks::plan::buckets::Buckets;
use crate::ranks::plan::options::Reduce;
use crate::ranks::transport::collective::{Collective, check_root};

impl CandlePlan {
    /// As [`all_reduce`](Self::all_reduce), over NCCL on the GPU: the
    /// gradients (CUDA tensors on `nccl`'s device) never leave the device.
    /// Each bucket of the plan (the same buckets as the MPI path, `f32`
    /// then `f64`) is copied into a device buffer of its own and summed in
    /// place by NCCL; a gradient of at least
    /// [`PlanOptions::direct_bytes`](crate::ranks::PlanOptions::direct_bytes)
    /// is copied and summed on its own. Every bucket's call is queued on
    /// the device's stream before the call waits once, so that NCCL's
    /// transfers and the copies overlap on the GPU. A mean divides each sum
    /// by the ranks on the device. The reduced gradients replace the ones
    /// in `grads` (those of fused variables are views of their bucket).
    ///
    /// The plan's agreement (the ranks' `op`s, which gradients exist, every
    /// rank's own checks) runs first over `comm`, the bootstrap
    /// [`Collective`] of `nccl`, so that a failure on one rank is an error
    /// on every rank, not a hang. At one rank the sums are the gradients,
    /// bit for bit; at more, NCCL's order of summation may differ from
    /// MPI's in the last bits. Device memory: one copy of the gradients
    /// (the buckets and direct buffers) while the call runs.
    /// O(bytes) on the device, plus NCCL's transfer; O(variables) on the
    /// host.
    ///
    /// # Errors
    /// On every rank: [`Error::ArgumentsDiffer`] when the ranks pass
    /// different `op`s. On a rank whose gradient (or variable) is not on
    /// `nccl`'s device, or whose `comm` and `nccl` differ in rank or size,
    /// [`Error::Nccl`]; whose gradient has another dtype or shape than its
    /// variable, [`Error::Changed`]; on the others [`Error::PeerFailed`].
    /// `grads` is unchanged then. Should candle or NCCL fail after the
    /// agreement ([`Error::Candle`], [`Error::Nccl`]), `grads` is unchanged
    /// on that rank, and the others wait in NCCL until the watchdog ends
    /// the job.
    ///
    /// ```no_run
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, Nccl, PlanOptions, Reduce, SingleProcess}};
    /// let device = Device::new_cuda(0)?;
    /// let world = SingleProcess; // `universe.world()` under MPI
    /// let nccl = Nccl::new(&world, &device)?;
    /// let store = CandleStore::new();
    /// let w = store.get(3, "w", candle_nn::Init::Const(2.0), DType::F32, &device)?;
    /// let mut plan = CandlePlan::new(&world, &store, &PlanOptions::new())?;
    /// let mut grads = w.sqr()?.sum_all()?.backward()?;
    /// plan.all_reduce_nccl(&world, &nccl, &mut grads, Reduce::Mean)?;
    /// assert_eq!(grads.get(&w).expect("a gradient").to_vec1::<f32>()?, [4.0; 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_reduce_nccl<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        nccl: &Nccl,
        grads: &mut GradStore,
        op: Reduce,
    ) -> Result<(), Error> {
        self.all_reduce_device(comm, nccl, grads, op)
    }

    /// [`all_reduce_nccl`](Self::all_reduce_nccl) over any
    /// [`DeviceCollective`] (NCCL's, or the unit tests' stand-in).
    fn all_reduce_device<C: Collective + ?Sized, D: DeviceCollective + ?Sized>(
        &mut self,
        comm: &C,
        nccl: &D,
        grads: &mut GradStore,
        op: Reduce,
    ) -> Result<(), Error> {
        const OP: &str = "all-reduce over NCCL";
        let done = self
            .agree_on_gradients(comm, nccl, grads, op, OP)
            .and_then(|()| {
                let divisors = Divisors::new(nccl, op)?;
                let mean = |t: Tensor, i: usize| divisors.mean(t, &self.manifest.entries()[i].key);
                let (f32s, f32_direct) = self.f32s.layout();
                let (f64s, f64_direct) = self.f64s.layout();
                let mut reduced = Vec::new();
                for i in f32_direct.chain(f64_direct) {
                    if self.present_sum[i] > 0.0 {
                        let v = &self.vars[i];
                        let t = self.source_or_zeros(nccl, i, 0, v.elem_count())?;
                        let t = nccl.fresh(&t, OP)?;
                        nccl.queue_all_reduce(&t)?;
                        let t = mean(t, i)?.reshape(v.dims());
                        reduced.push((
                            i,
                            t.map_err(|e| candle(&self.manifest.entries()[i].key, e))?,
                        ));
                    }
                }
                // Each fused variable's gradient: its segments' views of the
                // buckets' sums, in order.
                let mut pieces: Vec<Vec<Tensor>> = vec![Vec::new(); self.vars.len()];
                for b in [f32s, f64s] {
                    for (k, (range, _)) in b.buckets.iter().enumerate() {
                        let segments = &b.segments[range.clone()];
                        let bucket = self.queue_bucket(nccl, b, k)?;
                        let bucket = mean(bucket, segments[0].var)?;
                        for s in segments {
                            if self.present_sum[s.var] > 0.0 {
                                let view = bucket.narrow(0, s.at, s.len);
                                let key = &self.manifest.entries()[s.var].key;
                                pieces[s.var].push(view.map_err(|e| candle(key, e))?);
                            }
                        }
                    }
                }
                for (i, p) in pieces.into_iter().enumerate() {
                    let t = match p.len() {
                        0 => continue,
                        1 => Ok(p.into_iter().next().expect("one piece")),
                        _ => Tensor::cat(&p, 0),
                    };
                    let t = t.and_then(|t| t.reshape(self.vars[i].dims()));
                    reduced.push((
                        i,
                        t.map_err(|e| candle(&self.manifest.entries()[i].key, e))?,
                    ));
                }
                nccl.wait("NCCL all-reduce")?;
                for (i, t) in reduced {
                    grads.insert(self.vars[i].as_tensor(), t);
                }
                Ok(())
            });
        self.sources.clear();
        done
    }

    /// The agreement of a device call on `grads` (watched, over `comm`):
    /// the same world as `nccl`, every gradient fits its variable and is on
    /// `nccl`'s device, the ranks pass the same `op`; then which gradients
    /// some rank has (`present_sum`). Fills `sources`, which the caller
    /// clears. O(variables), plus the bootstrap collective's calls.
    pub(super) fn agree_on_gradients<C: Collective + ?Sized, D: DeviceCollective + ?Sized>(
        &mut self,
        comm: &C,
        nccl: &D,
        grads: &GradStore,
        op: Reduce,
        name: &'static str,
    ) -> Result<(), Error> {
        let _watch = self.watch(comm, name);
        let local = same_world(comm, nccl, name)
            .and_then(|()| self.gradients(grads))
            .and_then(|()| self.on_device(nccl, name));
        settle(comm, &mut self.gathered, name, local, Some(op.same()))
            .and_then(|()| comm.all_reduce_sum_f64(&self.present, &mut self.present_sum))
    }

    /// Queues the NCCL sum of bucket `k` of `b` in a device buffer of its
    /// own (its variables' segments, zeros for gradients this rank lacks),
    /// and returns the buffer.
    fn queue_bucket<D: DeviceCollective + ?Sized>(
        &self,
        nccl: &D,
        b: &Buckets,
        k: usize,
    ) -> Result<Tensor, Error> {
        let segments = &b.segments[b.buckets[k].0.clone()];
        let mut parts = Vec::with_capacity(segments.len());
        for s in segments {
            parts.push(self.source_or_zeros(nccl, s.var, s.start, s.len)?);
        }
        let first = &self.manifest.entries()[segments[0].var].key;
        // `cat` copies several parts into a new buffer; one part is a view
        // of the gradient's own storage, copied.
        let bucket = if parts.len() == 1 {
            nccl.fresh(&parts[0], "NCCL all-reduce")?
        } else {
            let bucket = Tensor::cat(&parts, 0).map_err(|e| candle(first, e))?;
            bucket.detach()
        };
        nccl.queue_all_reduce(&bucket)?;
        Ok(bucket)
    }

    /// Elements `start..start + len` of variable `i`'s gradient (flat), or
    /// zeros where this rank has none.
    pub(super) fn source_or_zeros<D: DeviceCollective + ?Sized>(
        &self,
        nccl: &D,
        i: usize,
        start: usize,
        len: usize,
    ) -> Result<Tensor, Error> {
        let key = &self.manifest.entries()[i].key;
        match &self.sources[i] {
            Some(g) => g.flatten_all().and_then(|g| g.narrow(0, start, len)),
            None => Tensor::zeros(len, self.vars[i].dtype(), nccl.device()),
        }
        .map_err(|e| candle(key, e))
    }

    /// Checks that every variable and gradient is on `nccl`'s device.
    pub(super) fn on_device<D: DeviceCollective + ?Sized>(
        &self,
        nccl: &D,
        op: &'static str,
    ) -> Result<(), Error> {
        let tensors = self.vars.iter().map(|v| v.as_tensor()).zip(&self.sources);
        for ((v, g), e) in tensors.zip(self.manifest.entries()) {
            for (what, t) in [("variable", Some(v)), ("gradient", g.as_ref())] {
                let Some(t) = t else { continue };
                if !t.device().same_device(nccl.device()) {
                    return Err(Error::Nccl {
                        op,
                        reason: format!(
                            "the {what} `{}` is on {:?}, NCCL's communicator on {:?}; build the \
                             model on the communicator's device",
                            crate::short::path(&e.key),
                            t.device().location(),
                            nccl.device().location()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// As [`broadcast`](Self::broadcast), over NCCL: every variable's value
    /// on rank `root` is copied to every rank on the device, one NCCL
    /// broadcast per variable, all queued before one wait; then each rank
    /// but the root sets its `Var`s. The ranks agree on the root over
    /// `comm` first. Device memory: one copy of the values while the call
    /// runs. O(bytes) on the device, plus NCCL's transfer.
    ///
    /// # Errors
    /// On every rank: [`Error::ArgumentsDiffer`] when the ranks pass
    /// different roots. On a rank that passes a root outside the world,
    /// [`Error::BadRank`]; whose variables are not on `nccl`'s device, or
    /// whose `comm` and `nccl` differ, [`Error::Nccl`]; on the others
    /// [`Error::PeerFailed`]. Nothing changes then. A candle or NCCL
    /// failure after the agreement changes nothing on that rank.
    ///
    /// ```no_run
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, Nccl, PlanOptions, SingleProcess}};
    /// let device = Device::new_cuda(0)?;
    /// let nccl = Nccl::new(&SingleProcess, &device)?;
    /// let store = CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &device))?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// plan.broadcast_nccl(&SingleProcess, &nccl, 0)?;
    /// assert!(plan.broadcast_nccl(&SingleProcess, &nccl, 1).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn broadcast_nccl<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        nccl: &Nccl,
        root: usize,
    ) -> Result<(), Error> {
        self.broadcast_device(comm, nccl, root)
    }

    /// [`broadcast_nccl`](Self::broadcast_nccl) over any
    /// [`DeviceCollective`].
    fn broadcast_device<C: Collective + ?Sized, D: DeviceCollective + ?Sized>(
        &mut self,
        comm: &C,
        nccl: &D,
        root: usize,
    ) -> Result<(), Error> {
        const OP: &str = "broadcast over NCCL";
        self.sources.clear();
        self.sources.resize(self.vars.len(), None);
        let agreed = {
            let _watch = self.watch(comm, OP);
            let local = same_world(comm, nccl, OP)
                .and_then(|()| check_root(root, comm.size()))
                .and_then(|()| self.on_device(nccl, OP));
            let same: Same = ("roots", root as u64, show_count);
            settle(comm, &mut self.gathered, OP, local, Some(same))
        };
        self.sources.clear();
        agreed?;
        let mut out = Vec::with_capacity(self.vars.len());
        for (v, e) in self.vars.iter().zip(self.manifest.entries()) {
            let t = nccl.fresh(v.as_tensor(), OP)?;
            nccl.queue_broadcast(root, &t).map_err(|err| match err {
                Error::Nccl { reason, .. } => Error::Nccl {
                    op: OP,
                    reason: format!("`{}`: {reason}", e.key),
                },
                other => other,
            })?;
            out.push(t);
        }
        nccl.wait("NCCL broadcast")?;
        if comm.rank() != root {
            for ((v, t), e) in self.vars.iter().zip(&out).zip(self.manifest.entries()) {
                v.set(t).map_err(|err| candle(&e.key, err))?;
            }
        }
        Ok(())
    }
}

/// Checks that `comm` and `nccl` are the same world seen from the same
/// rank.
pub(super) fn same_world<C: Collective + ?Sized, D: DeviceCollective + ?Sized>(
    comm: &C,
    nccl: &D,
    op: &'static str,
) -> Result<(), Error> {
    if (comm.rank(), comm.size()) == (nccl.rank(), nccl.size()) {
        Ok(())
    } else {
        Err(Error::Nccl {
            op,
            reason: format!(
                "the collective is rank {} of {}, NCCL's communicator rank {} of {}; pass the \
                 collective NCCL was started with",
                comm.rank(),
                comm.size(),
                nccl.rank(),
                nccl.size()
            ),
        })
    }
}

/// What a mean divides by on the device: the ranks' count, one tensor per
/// float type, made once per call.
pub(super) struct Divisors(Option<[Tensor; 2]>);

impl Divisors {
    /// The divisors of `op` (none for a sum) on `nccl`'s device.
    pub(super) fn new<D: DeviceCollective + ?Sized>(nccl: &D, op: Reduce) -> Result<Self, Error> {
        match op {
            Reduce::Sum => Ok(Self(None)),
            Reduce::Mean => {
                let n = Tensor::new(nccl.size() as f64, nccl.device());
                let n = n.and_then(|n| Ok([n.to_dtype(DType::F32)?, n]));
                Ok(Self(Some(n.map_err(|e| candle("the ranks' count", e))?)))
            }
        }
    }

    /// `t` divided by the ranks for a mean (element by element, in `t`'s
    /// type, as the MPI path divides), queued after its NCCL call on the
    /// same stream; `t` itself for a sum. `key` names it in an error.
    pub(super) fn mean(&self, t: Tensor, key: &str) -> Result<Tensor, Error> {
        let Some([n32, n64]) = &self.0 else {
            return Ok(t);
        };
        let n = if t.dtype() == DType::F32 { n32 } else { n64 };
        t.broadcast_div(n).map_err(|e| candle(key, e))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Var};
    use candle_nn::Init;

    use super::*;
    use crate::candle::CandleStore;
    use crate::ranks::PlanOptions;
    use crate::ranks::transport::mirror::Mirror;

    /// NCCL's stand-in on the CPU for [`Mirror`]'s world: a sum multiplies
    /// in place by the ranks, a broadcast leaves the root's values.
    struct Scaled {
        ranks: usize,
        rank: usize,
        device: Device,
    }

    struct Times(f64);

    impl InplaceOp1 for Times {
        fn name(&self) -> &'static str {
            "times"
        }
        fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> candle_core::Result<()> {
            let (a, b) = l.contiguous_offsets().expect("contiguous");
            match s {
                CpuStorage::F32(v) => v[a..b].iter_mut().for_each(|x| *x *= self.0 as f32),
                CpuStorage::F64(v) => v[a..b].iter_mut().for_each(|x| *x *= self.0),
                _ => panic!("F32 or F64"),
            }
            Ok(())
        }
    }

    impl DeviceCollective for Scaled {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.ranks
        }
        fn device(&self) -> &Device {
            &self.device
        }
        fn fresh(&self, t: &Tensor, _: &'static str) -> Result<Tensor, Error> {
            Ok(t.force_contiguous()
                .map_err(|e| candle("fresh", e))?
                .detach())
        }
        fn queue_all_reduce(&self, out: &Tensor) -> Result<(), Error> {
            out.inplace_op1(&Times(self.ranks as f64))
                .map_err(|e| candle("sum", e))
        }
        fn queue_broadcast(&self, root: usize, _out: &Tensor) -> Result<(), Error> {
            check_root(root, self.ranks)
        }
        fn queue_reduce_scatter(&self, src: &Tensor, out: &Tensor) -> Result<(), Error> {
            // Every rank's block is this rank's: `ranks` times it.
            let n = out.elem_count();
            let mine = src.narrow(0, self.rank * n, n);
            mine.and_then(|m| out.slice_set(&m, 0, 0))
                .and_then(|()| out.inplace_op1(&Times(self.ranks as f64)))
                .map_err(|e| candle("reduce-scatter", e))
        }
        fn queue_all_gather(&self, src: &Tensor, out: &Tensor) -> Result<(), Error> {
            for r in 0..self.ranks {
                (out.slice_set(src, 0, r * src.elem_count())).map_err(|e| candle("gather", e))?;
            }
            Ok(())
        }
        fn wait(&self, _: &'static str) -> Result<(), Error> {
            Ok(())
        }
    }

    /// `f32` and `f64` variables, small and large, `a` unused by the loss.
    fn model() -> CandleStore {
        let store = CandleStore::new();
        for (name, n, dtype) in [
            ("a", 3, DType::F32),
            ("b", 1000, DType::F64),
            ("c", 7000, DType::F32),
            ("d", 5, DType::F32),
            ("e", 33, DType::F64),
            ("f", 2, DType::F64),
        ] {
            let t = Tensor::arange(0.0, n as f64, &Device::Cpu)
                .and_then(|t| t.affine(0.37, 0.1))
                .and_then(|t| t.to_dtype(dtype))
                .unwrap();
            store
                .get(n, name, Init::Const(0.0), dtype, &Device::Cpu)
                .unwrap();
            store.var(name).unwrap().unwrap().set(&t).unwrap();
        }
        store
    }

    /// The gradients of `Σ sin(w) · w` over every variable but `a`.
    fn grads(vars: &[Var]) -> GradStore {
        let mut loss: Option<Tensor> = None;
        for v in &vars[1..] {
            let t = v.as_tensor();
            let term = (t.sin().unwrap() * t).unwrap().sum_all().unwrap();
            let term = term.to_dtype(DType::F64).unwrap();
            loss = Some(match loss {
                None => term,
                Some(l) => (l + term).unwrap(),
            });
        }
        loss.unwrap().backward().unwrap()
    }

    /// Each gradient's bits, checking that it has its variable's shape.
    fn bits(g: &GradStore, vars: &[Var]) -> Vec<Option<Vec<u64>>> {
        for v in vars {
            if let Some(t) = g.get(v.as_tensor()) {
                assert_eq!(t.dims(), v.dims());
            }
        }
        bits_lenient(g, vars)
    }

    #[test]
    fn the_device_path_gives_the_mpi_paths_bits() {
        // Buckets that split variables, direct ones, the defaults.
        for opts in [
            PlanOptions::new().bucket_bytes(64).direct_bytes(4000),
            PlanOptions::new().bucket_bytes(4096),
            PlanOptions::new(),
        ] {
            for ranks in [1, 2, 3, 4, 8, 16] {
                for op in [Reduce::Sum, Reduce::Mean] {
                    let world = Mirror(ranks, 0);
                    let store = model();
                    let mut plan = CandlePlan::new(&world, &store, &opts).unwrap();
                    let vars = plan.vars().to_vec();
                    let mut host = grads(&vars);
                    plan.all_reduce(&world, &mut host, op).unwrap();
                    let want = bits(&host, &vars);
                    let mut dev = grads(&vars);
                    let before = bits(&dev, &vars);
                    let nccl = Scaled {
                        ranks,
                        rank: 0,
                        device: Device::Cpu,
                    };
                    plan.all_reduce_device(&world, &nccl, &mut dev, op).unwrap();
                    let what = format!("{opts:?} {ranks} ranks {op:?}");
                    assert!(bits(&dev, &vars) == want, "{what}: the bits differ");
                    assert!(want[0].is_none(), "{what}: `a` got a gradient");
                    // (A sum over more ranks changes the gradients.)
                    if ranks == 1 {
                        assert!(want == before, "{what}: one rank's sum changed a gradient");
                    } else if op == Reduce::Sum {
                        assert!(want != before, "{what}: the sum changed nothing");
                    }
                }
            }
        }
    }

    /// Every variable's bits.
    fn values(vars: &[Var]) -> Vec<Vec<u64>> {
        vars.iter().map(|v| tensor_bits(v)).collect()
    }

    /// A tensor's elements' bits, as `f64`s, whatever its shape.
    fn tensor_bits(t: &Tensor) -> Vec<u64> {
        let t = t.flatten_all().unwrap().to_dtype(DType::F64).unwrap();
        t.to_vec1::<f64>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    #[test]
    fn the_device_zero_path_gives_the_mpi_paths_bits() {
        // Buckets of 64 bytes: the MPI path in several rounds; the device
        // path in one call per float type whatever the bucket.
        for opts in [PlanOptions::new().bucket_bytes(64), PlanOptions::new()] {
            // Seen from every rank: a slice that starts inside a variable
            // is written at its offset.
            let seen = [(1, 0), (2, 1), (3, 0), (3, 1), (3, 2), (4, 1), (4, 3)];
            for (ranks, rank) in seen.into_iter().chain([(8, 5), (16, 0), (16, 15)]) {
                let nccl = Scaled {
                    ranks,
                    rank,
                    device: Device::Cpu,
                };
                let world = Mirror(ranks, rank);
                for op in [Reduce::Sum, Reduce::Mean] {
                    let store = model();
                    let mut plan = CandlePlan::new(&world, &store, &opts).unwrap();
                    let vars = plan.vars().to_vec();
                    let mut host = grads(&vars);
                    plan.reduce_scatter(&world, &mut host, op).unwrap();
                    let mut dev = grads(&vars);
                    let before = bits(&dev, &vars);
                    plan.reduce_scatter_device(&world, &nccl, &mut dev, op)
                        .unwrap();
                    let what = format!("{opts:?} rank {rank} of {ranks} {op:?}");
                    let want = bits(&host, &vars);
                    assert!(bits(&dev, &vars) == want, "{what}: the sums differ");
                    assert!(want[0].is_none(), "{what}: `a` got a gradient");
                    if ranks > 1 && op == Reduce::Sum {
                        assert!(want != before, "{what}: the sum changed nothing");
                    }
                }
                // The gather: the same values into two stores alike.
                let (s1, s2) = (model(), model());
                let mut p1 = CandlePlan::new(&world, &s1, &opts).unwrap();
                let mut p2 = CandlePlan::new(&world, &s2, &opts).unwrap();
                let before = values(p1.vars());
                p1.all_gather(&world).unwrap();
                p2.all_gather_device(&world, &nccl).unwrap();
                let what = format!("{opts:?} rank {rank} of {ranks}, all-gather");
                assert!(
                    values(p1.vars()) == values(p2.vars()),
                    "{what}: the values differ"
                );
                // (Every rank's slice is this rank's values here, so the
                // other slices change at more than one rank.)
                assert_eq!(values(p1.vars()) == before, ranks == 1, "{what}");
            }
        }
    }

    #[test]
    fn a_failed_check_changes_no_gradient() {
        let world = Mirror(2, 0);
        let store = model();
        let mut plan = CandlePlan::new(&world, &store, &PlanOptions::new()).unwrap();
        let vars = plan.vars().to_vec();
        let mut g = grads(&vars);
        let before = bits(&g, &vars);
        // A gradient of another shape.
        g.insert(
            vars[4].as_tensor(),
            Tensor::zeros(2, DType::F64, &Device::Cpu).unwrap(),
        );
        let before_bad = bits_lenient(&g, &vars);
        let nccl = Scaled {
            ranks: 2,
            rank: 0,
            device: Device::Cpu,
        };
        let err = plan
            .all_reduce_device(&world, &nccl, &mut g, Reduce::Sum)
            .unwrap_err();
        assert!(
            matches!(err, Error::Changed { ref key, .. } if key == "e"),
            "{err}"
        );
        assert_eq!(bits_lenient(&g, &vars), before_bad);
        assert_ne!(before_bad, before);
        // Another world's communicator.
        let mut g = grads(&vars);
        let other = Scaled {
            ranks: 3,
            rank: 0,
            device: Device::Cpu,
        };
        let err = plan
            .all_reduce_device(&world, &other, &mut g, Reduce::Sum)
            .unwrap_err();
        assert!(err.to_string().contains("rank 0 of 2"), "{err}");
        assert_eq!(bits(&g, &vars), before);
        let err = plan.broadcast_device(&world, &nccl, 2).unwrap_err();
        assert!(matches!(err, Error::BadRank { rank: 2, .. }), "{err}");
    }

    /// Each gradient's bits, whatever its shape.
    fn bits_lenient(g: &GradStore, vars: &[Var]) -> Vec<Option<Vec<u64>>> {
        vars.iter()
            .map(|v| g.get(v.as_tensor()).map(tensor_bits))
            .collect()
    }
}
