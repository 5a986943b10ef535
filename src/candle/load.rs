//! The store's loads: checked against the tree first (every name, shape,
//! dtype and device), then read through staging buffers straight to each
//! tensor's device, verified against the checksums the files carry, and
//! committed at once; and the placement of the variables a load creates
//! (the device the caller names, or the one the model first asks for).

use std::path::Path;

use candle_core::{Device, Var};

use super::error::Error;
use super::staged::{
    Buffer, Dest, Fresh, HostDirect, Kind, StoreSink, To, is_direct, pool, synchronize,
};
use super::store::{CandleStore, Inner, Pending};
use super::var::{candle_dtype, var_codec};
use crate::checkpoint::staged::{Job, Shape, read_direct, read_staged, verify};
use crate::checkpoint::{
    self, Commit, Dtype, FileTensor, LoadOptions, LoadReport, Part, Plan, Separator, Step,
};
use crate::short;

/// The options of a store's load: dotted names, `Var`s made for the file's
/// tensors.
fn candle_opts(opts: &LoadOptions) -> LoadOptions {
    let mut opts = opts
        .clone()
        .separator(Separator::Dot)
        .with_crate_type::<Var>();
    opts.create_with = Some(var_codec);
    opts
}

/// How a staged load places new memory.
#[derive(Clone, Copy)]
enum Placement<'d> {
    /// On this device; an existing `Var` elsewhere is an error
    /// (`load_on`).
    Named(&'d Device),
    /// On this device; existing `Var`s stay where they are (a deferred
    /// load placed by the first `get`, or a load that makes nothing new).
    Fresh(&'d Device),
}

impl Placement<'_> {
    fn device(&self) -> &Device {
        match self {
            Self::Named(d) | Self::Fresh(d) => d,
        }
    }
}

impl Inner {
    /// Places a deferred load's variables on `device` (nothing if no load
    /// waits). On an error the store is as before the load, and the load
    /// no longer waits.
    pub(super) fn place_pending(&mut self, device: &Device) -> Result<(), Error> {
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        let plan = checkpoint::plan_store(&self.store, &p.path, &p.opts)?;
        run_load(self, &p.path, plan, &p.opts, Placement::Fresh(device)).map(drop)
    }
}

impl CandleStore {
    /// Verifies, without writing anything, the checksums the files carry
    /// for every tensor a [`load`](Self::load) of `path` with `opts` would
    /// read: a load's first pass, for a caller that must know every part
    /// is sound before any is written (the ranks' sharded load; it then
    /// loads with `LoadOptions::sums_verified` set). The store is planned
    /// against as a load plans (a deferred load is placed on the CPU
    /// first). O(header + variables × depth + bytes with a checksum);
    /// memory: 1 MiB per reader.
    ///
    /// # Errors
    /// As [`load`](Self::load)'s checks: a mismatch, a bad file,
    /// [`Corrupted`](checkpoint::Error::Corrupted).
    pub(crate) fn verify_sums(&self, path: &Path, opts: &LoadOptions) -> Result<(), Error> {
        let opts = candle_opts(opts);
        let inner = self.placed()?;
        let plan = checkpoint::plan_store(&inner.store, path, &opts)?;
        drop(inner);
        let jobs = jobs_of(&plan.parts, &plan.steps)?;
        let sums: Vec<Job> = jobs.into_iter().filter(|j| j.checksum.is_some()).collect();
        if !sums.is_empty() {
            verify(&plan.parts, &sums, opts.reader_threads()).map_err(|e| *e.error)?;
        }
        Ok(())
    }
}

impl CandleStore {
    /// The lock, with any deferred load placed on the CPU: for the calls
    /// that need the values before a model asked for a device.
    pub(super) fn placed(&self) -> Result<std::sync::MutexGuard<'_, Inner>, Error> {
        let mut inner = self.lock();
        inner.place_pending(&Device::Cpu)?;
        Ok(inner)
    }

    /// Loads `path` (dotted names, as candle writes them): strict and
    /// atomic by default, as [`checkpoint::load`]: every name, shape and
    /// dtype is checked against the file's header before anything changes.
    /// `path` is a safetensors file, or a sharded Hugging Face checkpoint
    /// (its `model.safetensors.index.json` or its directory), checked
    /// across all its shards.
    ///
    /// **Where the tensors go.** Into each existing `Var` on its own device,
    /// in place, so a model already built sees them. The variables the
    /// load creates ([`LoadOptions::create`], loading before the model is
    /// built) go to the device the model first asks for: the load checks
    /// everything now and returns the report of what it will make, and the
    /// data is read at the first [`get`](Self::get) (a `VarBuilder` build),
    /// straight to that `get`'s device; a call that needs the values before
    /// any `get` ([`var`](Self::var), the listings, a save, another load)
    /// places them on the CPU. [`load_on`](Self::load_on) names the device
    /// instead.
    ///
    /// **How.** The files are read by parallel readers into two staging
    /// buffers of half [`LoadOptions::staging_budget`] each, 16 MiB at most (page-locked for
    /// a CUDA device), the next filling while the last is copied to the
    /// tensors' memory; a float conversion happens on the staged bytes, so
    /// no second copy of a tensor is made on its device. Checksums a save
    /// wrote (`scopetree_xxh3/<key>`, as the ranks' checkpoints carry) are
    /// verified on the staged bytes. A checksum covers a tensor's bytes, not
    /// the dtype and shape its header gives them: a built model's variables
    /// check those, but a variable the load creates takes them from the
    /// header. Host memory: the staging budget,
    /// whatever the model's size; the buffers are kept for the process's
    /// next load ([`free_staging`](Self::free_staging) drops them). O(header +
    /// variables × depth + bytes read).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] with every missing, unexpected and mismatched
    /// name in one [`Mismatch`](checkpoint::Error::Mismatch), a bad file, a
    /// tensor whose bytes fail their checksum
    /// ([`Corrupted`](checkpoint::Error::Corrupted)), or a device copy that
    /// fails; the store is then unchanged (checksums of tensors loaded in
    /// place are verified in a first pass, before any is written). Only a
    /// read error of the disk after every check has passed can leave some
    /// `Var`s loaded ([`checkpoint::Error::Data`] with `rolled_back:
    /// false`); [`rollback(true)`](LoadOptions::rollback) reads every
    /// tensor into new memory first (the model's size again, on each
    /// tensor's device) so that even that changes nothing.
    ///
    /// ```
    /// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, checkpoint::LoadOptions};
    /// let trained = CandleStore::new();
    /// candle_nn::linear(2, 2, trained.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// trained.save(dir.join("fc.safetensors"))?;
    ///
    /// let fresh = CandleStore::new();
    /// fresh.load(dir.join("fc.safetensors"), &LoadOptions::new().create(true))?;
    /// fresh.seal();
    /// // The build's first `get` places the loaded variables on its device.
    /// candle_nn::linear(2, 2, fresh.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// assert!(fresh.unused()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(&self, path: impl AsRef<Path>, opts: &LoadOptions) -> Result<LoadReport, Error> {
        let opts = candle_opts(opts);
        let mut inner = self.lock();
        inner.place_pending(&Device::Cpu)?;
        let plan = checkpoint::plan_store(&inner.store, path.as_ref(), &opts)?;
        let makes: Vec<&str> = plan
            .steps
            .iter()
            .filter(|(_, _, s)| makes_new(&inner, s))
            .map(|(_, t, _)| t.key.as_str())
            .collect();
        if makes.is_empty() || needs_old_path(&inner, &plan) {
            return run_load(
                &mut inner,
                path.as_ref(),
                plan,
                &opts,
                Placement::Fresh(&Device::Cpu),
            );
        }
        let keys = makes.into_iter().map(str::to_owned).collect();
        let report = planned_report(plan);
        inner.pending = Some(Pending {
            path: path.as_ref().to_owned(),
            opts,
            keys,
        });
        Ok(report)
    }

    /// Loads `path` as [`load`](Self::load) does, with every tensor on
    /// `device`: the variables it creates are made there, and every
    /// existing `Var` it loads must already live there (it is written in
    /// place). A deferred load waiting for its device is placed on
    /// `device` first. O(as `load`).
    ///
    /// # Errors
    /// As [`load`](Self::load); [`Error::LoadDevice`] naming both devices
    /// when an existing `Var` lives elsewhere (nothing changes then).
    ///
    /// ```
    /// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, checkpoint::LoadOptions};
    /// let trained = CandleStore::new();
    /// candle_nn::linear(2, 2, trained.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// trained.save(dir.join("fc.safetensors"))?;
    ///
    /// let device = Device::Cpu; // or Device::new_cuda(0)? with the `cuda` feature
    /// let fresh = CandleStore::new();
    /// fresh.load_on(dir.join("fc.safetensors"), &LoadOptions::new().create(true), &device)?;
    /// assert!(fresh.var("fc.weight")?.expect("made").device().same_device(&device));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_on(
        &self,
        path: impl AsRef<Path>,
        opts: &LoadOptions,
        device: &Device,
    ) -> Result<LoadReport, Error> {
        let opts = candle_opts(opts);
        let mut inner = self.lock();
        inner.place_pending(device)?;
        let plan = checkpoint::plan_store(&inner.store, path.as_ref(), &opts)?;
        run_load(
            &mut inner,
            path.as_ref(),
            plan,
            &opts,
            Placement::Named(device),
        )
    }

    /// Places the variables a deferred [`load`](Self::load) will make on
    /// `device` now (nothing if no load waits): what the model's first
    /// `get` would do. O(as `load`).
    ///
    /// # Errors
    /// As [`load`](Self::load), for the reads the load deferred; the store
    /// is then as before the load, which no longer waits.
    ///
    /// ```
    /// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, checkpoint::LoadOptions};
    /// let trained = CandleStore::new();
    /// candle_nn::linear(2, 2, trained.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// trained.save(dir.join("fc.safetensors"))?;
    /// let fresh = CandleStore::new();
    /// fresh.load(dir.join("fc.safetensors"), &LoadOptions::new().create(true))?;
    /// assert!(fresh.is_pending()); // checked, not read yet
    /// fresh.place(&Device::Cpu)?;
    /// assert!(!fresh.is_pending());
    /// assert!(fresh.var("fc.weight")?.expect("placed").device().is_cpu());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn place(&self, device: &Device) -> Result<(), Error> {
        self.lock().place_pending(device)
    }

    /// Whether a [`load`](Self::load) waits for the device its variables
    /// go to. O(1).
    ///
    /// ```
    /// assert!(!scopetree::candle::CandleStore::new().is_pending());
    /// ```
    pub fn is_pending(&self) -> bool {
        self.lock().pending.is_some()
    }

    /// Drops the staging buffers loads keep between loads (at most the
    /// largest staging budget used; kept for the process, any store's next
    /// load reuses them), and the page-locked buffers that saves from CUDA
    /// devices keep (two pieces per device). O(1) plus freeing them.
    ///
    /// ```
    /// let store = scopetree::candle::CandleStore::new();
    /// store.free_staging();
    /// assert_eq!(store.staging_bytes(), 0);
    /// ```
    pub fn free_staging(&self) {
        pool().clear();
        #[cfg(feature = "cuda")]
        super::cuda::free_save_staging();
    }

    /// The bytes of staging buffers loads keep between loads (for the
    /// process), and of the page-locked buffers saves from CUDA devices
    /// keep. O(buffers).
    ///
    /// ```
    /// assert_eq!(scopetree::candle::CandleStore::new().staging_bytes(), 0);
    /// ```
    pub fn staging_bytes(&self) -> usize {
        let kept = pool().bytes();
        #[cfg(feature = "cuda")]
        let kept = kept + super::cuda::save_staging_bytes();
        kept
    }
}

/// Whether step `s` makes new memory whose device nobody named: a variable
/// created, or one that holds no value yet.
fn makes_new(inner: &Inner, s: &Step) -> bool {
    match s {
        Step::Create { .. } => true,
        Step::Set { var, .. } => inner.store.tree().value_any(*var).is_none(),
        Step::Skip => false,
    }
}

/// Whether a step loads into a value that is not a candle `Var` (a `Vec`
/// put in through the sharing API): such loads take the checkpoint
/// layer's own path, on the host.
fn needs_old_path(inner: &Inner, plan: &Plan) -> bool {
    plan.steps.iter().any(|(_, _, s)| match s {
        Step::Set { var, .. } => {
            let tree = inner.store.tree();
            tree.value_any(*var).is_some() && tree.get::<Var>(*var).is_err()
        }
        _ => false,
    })
}

/// The report of a load that has not read its data yet: what it will
/// load and create.
fn planned_report(plan: Plan) -> LoadReport {
    let mut report = plan.report;
    for (_, t, s) in plan.steps {
        match s {
            Step::Create { .. } => {
                report.created.push(t.key.clone());
                report.loaded.push(t.key);
            }
            Step::Set { .. } => report.loaded.push(t.key),
            Step::Skip => {}
        }
    }
    report.loaded.sort_unstable();
    report.created.sort_unstable();
    report
}

/// The candle dtype of a checkpoint dtype the plan accepted.
fn dtype_of(d: Dtype) -> Result<candle_core::DType, Error> {
    candle_dtype(d).ok_or_else(|| {
        checkpoint::Error::BadTensor {
            reason: format!("candle has no {d:?}"),
        }
        .into()
    })
}

fn candle_failed(key: &str, e: candle_core::Error) -> Error {
    Error::Candle {
        name: key.to_owned(),
        source: e,
    }
}

/// Runs a planned load: through staged reads, or, when a value it loads is
/// not a candle `Var` (a `Vec` put in through the sharing API), through
/// the checkpoint layer's own path on the host (the placement is then
/// the CPU's).
fn run_load(
    inner: &mut Inner,
    path: &Path,
    plan: Plan,
    opts: &LoadOptions,
    placement: Placement<'_>,
) -> Result<LoadReport, Error> {
    if !needs_old_path(inner, &plan) {
        return staged_load(inner, plan, opts, placement);
    }
    drop(plan);
    let report = checkpoint::load_store(&mut inner.store, path, opts)?;
    for key in &report.created {
        let Some(id) = inner.store.find_sep(key, b'.') else {
            continue;
        };
        let Ok(var) = inner.store.tree().get::<Var>(id) else {
            continue;
        };
        let shape = crate::sharing::Shape::new(var.dims().iter().copied());
        inner.store.adopt(id, shape, true)?;
    }
    Ok(report)
}

/// The reads of a planned load's steps: where each tensor's bytes are,
/// and the checksum its file carries for it. O(steps).
fn jobs_of(parts: &[Part], steps: &[(usize, FileTensor, Step)]) -> Result<Vec<Job>, Error> {
    let jobs = steps
        .iter()
        .filter(|(_, _, s)| !matches!(s, Step::Skip))
        .map(|(part, t, _)| Job::of(parts, *part, t))
        .collect::<Result<_, checkpoint::Error>>()?;
    Ok(jobs)
}

/// Runs a planned load through staged reads: destinations made (new memory
/// on its device, or existing contiguous `Var`s in place), in-place
/// checksums verified first, every tensor read and copied, then the new
/// variables and values committed at once.
fn staged_load(
    inner: &mut Inner,
    plan: Plan,
    opts: &LoadOptions,
    placement: Placement<'_>,
) -> Result<LoadReport, Error> {
    let trace = std::env::var_os("SCOPETREE_TRACE_LOADS").is_some();
    let t0 = std::time::Instant::now();
    let Plan {
        parts,
        steps,
        mut report,
    } = plan;
    let steps: Vec<_> = steps
        .into_iter()
        .filter(|(_, _, s)| !matches!(s, Step::Skip))
        .collect();

    // Destinations, and the device of each; nothing changes yet.
    let mut dests: Vec<Dest> = Vec::with_capacity(steps.len());
    let mut devices: Vec<Device> = Vec::new();
    for (_, t, step) in &steps {
        let n: usize = t.shape.iter().product();
        let (to, convert) = match step {
            Step::Set {
                var, convert_to, ..
            } => match inner.store.tree().get::<Var>(*var) {
                Ok(v) => {
                    if let Placement::Named(d) = placement {
                        if !v.device().same_device(d) {
                            return Err(Error::LoadDevice {
                                name: t.key.clone(),
                                asked: format!("{:?}", d.location()),
                                found: format!("{:?}", v.device().location()),
                            });
                        }
                    }
                    let to = if opts.rollback || !v.is_contiguous() {
                        let made = Fresh::new(v.device(), v.dtype(), n)
                            .map_err(|e| candle_failed(&t.key, e))?;
                        To::Fresh(made)
                    } else {
                        To::InPlace(v.clone())
                    };
                    devices.push(v.device().clone());
                    (to, convert_to.map(|c| (t.dtype, c)))
                }
                Err(_) => {
                    let dt = convert_to.unwrap_or(t.dtype);
                    let made = Fresh::new(placement.device(), dtype_of(dt)?, n)
                        .map_err(|e| candle_failed(&t.key, e))?;
                    devices.push(placement.device().clone());
                    (To::Fresh(made), convert_to.map(|c| (t.dtype, c)))
                }
            },
            Step::Create { convert_to, .. } => {
                let dt = convert_to.unwrap_or(t.dtype);
                let made = Fresh::new(placement.device(), dtype_of(dt)?, n)
                    .map_err(|e| candle_failed(&t.key, e))?;
                devices.push(placement.device().clone());
                (To::Fresh(made), convert_to.map(|c| (t.dtype, c)))
            }
            Step::Skip => unreachable!("skipped steps were filtered out"),
        };
        dests.push(Dest { to, convert });
    }

    if trace {
        eprintln!(
            "scopetree load: {} destinations made in {:.4} s",
            dests.len(),
            t0.elapsed().as_secs_f64()
        );
    }
    let jobs = jobs_of(&parts, &steps)?;

    // Host destinations that take the file's bytes as they are read them
    // straight in; the rest (a device, a conversion) go through staging.
    let (direct, staged): (Vec<usize>, Vec<usize>) =
        (0..jobs.len()).partition(|&i| is_direct(&dests[i]));
    let pick = |idx: &[usize]| -> Vec<Job> { idx.iter().map(|&i| jobs[i].clone()).collect() };
    let (direct_jobs, staged_jobs) = (pick(&direct), pick(&staged));
    let readers = opts.reader_threads();

    // The checksums of what is written in place, verified before any is.
    let in_place: Vec<Job> = jobs
        .iter()
        .zip(&dests)
        .filter(|(j, d)| j.checksum.is_some() && matches!(d.to, To::InPlace(_)))
        .map(|(j, _)| j.clone())
        .collect();
    if !in_place.is_empty() && !opts.sums_verified {
        verify(&parts, &in_place, readers).map_err(|e| *e.error)?;
    }

    let mut touched = false;
    let mut failed: Option<(usize, checkpoint::Error)> = None;
    if !direct_jobs.is_empty() {
        let mut host = HostDirect {
            dests: &mut dests,
            dest_of: &direct,
            touched: false,
        };
        if let Err(e) = read_direct(&parts, &direct_jobs, readers, &mut host) {
            failed = Some((direct[e.job], *e.error));
        }
        touched |= host.touched;
    }
    if failed.is_none() && !staged_jobs.is_empty() {
        // Staging: page-locked if a destination is on a CUDA device.
        let kind = Kind::for_devices(staged.iter().map(|&i| &devices[i]));
        let largest = staged_jobs.iter().map(|j| j.len).max().unwrap_or(0);
        let shape = Shape::new(opts.staging, readers, largest);
        let mut bufs: Vec<Buffer> = pool().take(kind, shape)?;
        if trace {
            eprintln!(
                "scopetree load: {} staging buffers of {} B ({kind:?}) ready at {:.4} s",
                shape.buffers,
                shape.buffer,
                t0.elapsed().as_secs_f64()
            );
        }
        let outcome = match StoreSink::new(&mut dests, &staged) {
            Ok(mut sink) => {
                let read = read_staged(&parts, &staged_jobs, &mut bufs, shape.readers, &mut sink);
                touched |= sink.finish();
                read.map_err(|e| (staged[e.job], *e.error))
            }
            Err(e) => Err((staged[0], e)),
        };
        let synced = synchronize(&dests);
        pool().give(bufs);
        if let Err(e) = outcome {
            failed = Some(e);
        } else if let Err(e) = synced {
            failed = Some((staged[0], e));
        }
    }
    if let Some((i, error)) = failed {
        let key = jobs[i].key.clone();
        let path = short::path(&parts[jobs[i].part].path.to_string_lossy());
        return Err(match error {
            c @ checkpoint::Error::Corrupted { .. } if !touched => c.into(),
            other => checkpoint::Error::Data {
                path,
                key,
                rolled_back: !touched,
                source: Box::new(other),
            }
            .into(),
        });
    }

    if trace {
        eprintln!(
            "scopetree load: read and copied at {:.4} s",
            t0.elapsed().as_secs_f64()
        );
    }
    // Commit: new variables and values in, all or nothing.
    let root = inner.store.tree().root();
    let mut created_ids = Vec::new();
    let mut sets: Vec<(Var, Var, String)> = Vec::new();
    {
        let mut commit = Commit::new(inner.store.tree_mut(), root);
        let mut failed: Option<(String, Error)> = None;
        for ((_, t, step), dest) in steps.iter().zip(dests) {
            let Dest { to, .. } = dest;
            let fresh = match to {
                To::InPlace(_) => {
                    report.loaded.push(t.key.clone());
                    continue;
                }
                To::Fresh(f) => f,
            };
            let made = match fresh.into_var(&t.shape) {
                Ok(v) => v,
                Err(e) => {
                    failed = Some((t.key.clone(), candle_failed(&t.key, e)));
                    break;
                }
            };
            let step_done = match step {
                Step::Create { comps, .. } => commit.create(comps).and_then(|id| {
                    created_ids.push((id, made.dims().to_vec()));
                    commit.put(id, made)
                }),
                Step::Set { var, .. } => match commit.tree().get::<Var>(*var) {
                    Ok(old) => {
                        sets.push((old.clone(), made, t.key.clone()));
                        Ok(())
                    }
                    Err(_) => commit.put(*var, made),
                },
                Step::Skip => Ok(()),
            };
            if let Err(e) = step_done {
                failed = Some((t.key.clone(), e.into()));
                break;
            }
            if matches!(step, Step::Create { .. }) {
                report.created.push(t.key.clone());
            }
            report.loaded.push(t.key.clone());
        }
        if let Some((_, e)) = failed {
            commit.undo();
            return Err(e);
        }
    }
    // Existing `Var`s loaded through new memory take it (a copy on their
    // device); only a device failure can stop this, after the checks.
    for (old, made, key) in sets {
        old.set(made.as_tensor())
            .map_err(|e| candle_failed(&key, e))?;
    }
    // The variables the load made join the collections, as if the model
    // had made them (the store's freeze rules apply on top).
    for (id, dims) in created_ids {
        inner
            .store
            .adopt(id, crate::sharing::Shape::new(dims.iter().copied()), true)?;
    }
    report.loaded.sort_unstable();
    report.created.sort_unstable();
    if trace {
        eprintln!(
            "scopetree load: committed at {:.4} s",
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use crate::candle::CandleStore;
    use crate::checkpoint::{FloatDtype, LoadOptions, SaveOptions};

    fn values(store: &CandleStore) -> Vec<(String, Vec<f32>)> {
        let vars = store.named_vars().unwrap();
        vars.into_iter()
            .map(|(k, v)| {
                let t = v.as_tensor().to_dtype(DType::F32).unwrap();
                (k, t.flatten_all().unwrap().to_vec1().unwrap())
            })
            .collect()
    }

    /// A sharded checkpoint (with checksums) of a 3 MiB tensor (split
    /// among readers) and two small ones, and the store saved.
    fn saved(path: &std::path::Path) -> CandleStore {
        let store = CandleStore::new();
        let vb = store.var_builder(DType::F32, &Device::Cpu);
        for (name, n) in [("a", 7), ("big", 3 << 18), ("z", 5)] {
            vb.get(n, name).unwrap();
            let x = Tensor::arange(0_u32, n as u32, &Device::Cpu).unwrap();
            let x = (x.to_dtype(DType::F32).unwrap() * 0.25).unwrap();
            store.var(name).unwrap().unwrap().set(&x).unwrap();
        }
        let mut meta = std::collections::HashMap::new();
        for (k, v) in store.named_vars().unwrap() {
            let mut bytes = Vec::new();
            crate::checkpoint::Checkpointable::write_le(&v, 1 << 20, &mut |p| {
                bytes.extend_from_slice(p);
                Ok(())
            })
            .unwrap();
            let sum = xxhash_rust::xxh3::xxh3_128(&bytes);
            meta.insert(format!("scopetree_xxh3/{k}"), format!("{sum:032x}"));
        }
        let opts = SaveOptions::new().metadata(meta);
        store.save_sharded(path, &opts).unwrap();
        store
    }

    #[test]
    fn loads_refused_their_threads_read_and_check_on_the_callers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let store = saved(&path);
        // `load_on` reads now (a plain `load` of new variables waits for
        // the model's first `get`).
        let refused = |store: &CandleStore, opts: &LoadOptions| {
            let opts = opts.clone().readers(4);
            crate::threads::refusing(|| store.load_on(&path, &opts, &Device::Cpu))
        };
        // Read straight into new variables, and converted through staging
        // buffers of a few windows.
        let direct = LoadOptions::new().create(true);
        let back = CandleStore::new();
        refused(&back, &direct).unwrap();
        assert_eq!(values(&back), values(&store));
        let staged = direct
            .clone()
            .create_floats_as(FloatDtype::BF16)
            .staging_budget(2 << 20);
        let (plain, halves) = (CandleStore::new(), CandleStore::new());
        plain.load_on(&path, &staged, &Device::Cpu).unwrap();
        refused(&halves, &staged).unwrap();
        assert_eq!(values(&halves), values(&plain));

        // A bad byte in the big tensor: each load names it, and the strict
        // load into existing variables (checked before it writes) changes
        // nothing.
        let shard = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .max_by_key(|p| p.metadata().unwrap().len())
            .unwrap();
        let mut bytes = std::fs::read(&shard).unwrap();
        let n = bytes.len();
        bytes[n - 4096] ^= 0x10;
        std::fs::write(&shard, bytes).unwrap();
        for (into, opts) in [(CandleStore::new(), &staged), (back, &LoadOptions::new())] {
            let before = values(&into);
            let err = refused(&into, opts).unwrap_err().to_string();
            assert!(err.contains("big"), "{err}");
            assert_eq!(values(&into), before);
        }
    }
}
