//! [`CandlePlan`]: a [`CandleStore`]'s trainable variables across ranks
//! (features `candle` and, for MPI, `mpi`): agreement on their manifest,
//! broadcast of their values, all-reduce of their gradients in a candle
//! `GradStore`, the consistency check and checkpoints, with the buckets and
//! agreement of the tree plans.

use std::any::Any;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

use smallvec::SmallVec;

use super::chunks::{
    Chunk, ChunkStaging, Laid, Part, exchange_staged, fetch_now, put_now, reduce_run, steps,
};
pub(in crate::ranks) use super::host::candle;
use super::host::{Staged, with_bytes};
use super::in_place::{SwapIn, all_distinct, storage_at};
use crate::candle::CandleStore;
use crate::checkpoint::{self, Dtype, LoadOptions, LoadReport, SaveReport};
use crate::ranks::checkpoints::checkpoint::header_fits;
use crate::ranks::error::Error;
use crate::ranks::layout::partition::{Partition, Piece};
use crate::ranks::plan::agree::{Same, settle, show_count, start};
use crate::ranks::plan::bucketed::Lane;
use crate::ranks::plan::consistency::compare_values;
use crate::ranks::plan::options::{PlanOptions, Reduce};
use crate::ranks::transport::collective::{Collective, Digest, check_root};
use crate::ranks::transport::watchdog::Watch;
use crate::ranks::vars::checksum::{VarHash, digest_of_hashes, hash_bytes};
use crate::ranks::vars::manifest::{Manifest, ManifestEntry};
use crate::ranks::vars::values::{Direct, Span, SumChunk, Values};

/// What a candle plan accepts, for error messages.
const CANDLE_FLOATS: &str = "the ranks layer synchronises candle variables of F32 or F64; \
     freeze the variable (CandleStore::freeze) or leave it out with PlanOptions::filter";

/// A [`CandleStore`]'s trainable variables (not frozen, in name order), as
/// every rank agreed on them, with the buckets and buffers to synchronise
/// them step after step: [`broadcast`](Self::broadcast) the values from a
/// root rank, [`all_reduce`](Self::all_reduce) the gradients of a candle
/// `GradStore` after `backward`, [`check_consistency`](Self::check_consistency)
/// of the values, checkpoints ([`save_on_root`](Self::save_on_root),
/// [`load_on_all`](Self::load_on_all)) and ZeRO stage 1
/// ([`partition`](Self::partition), [`reduce_scatter`](Self::reduce_scatter),
/// [`all_gather`](Self::all_gather), with
/// [`ZeroAdamW`](crate::ranks::ZeroAdamW)). It is [`SyncPlan`](crate::ranks::SyncPlan)
/// for candle: the same manifest agreement (names are candle's dotted
/// names), buckets, argument checks and errors.
///
/// The plan holds the `Var`s it was built on (clones share the storage with
/// the model and the optimizer): build it after the model, and again after
/// rebuilding the model. Every call is a collective call: every rank makes
/// it, in the same order. Variables must be `F32` or `F64`; those on another
/// device than the CPU go through host memory a bucket's chunk at a time:
/// the large gradients of a CUDA device (feature `cuda`) through
/// page-locked buffers the plan keeps, their copies beside MPI's calls
/// (tested on an H200).
/// Every call is watched with the plan's [timeout](PlanOptions::timeout), as
/// [`SyncPlan`](crate::ranks::SyncPlan)'s (see [`Watch`]).
///
/// ```
/// use candle_core::{DType, Device, Module, Tensor};
/// use candle_nn::{AdamW, Optimizer, ParamsAdamW};
/// use scopetree::candle::CandleStore;
/// use scopetree::ranks::{CandlePlan, PlanOptions, Reduce, SingleProcess};
///
/// let world = SingleProcess; // or `universe.world()` under MPI
/// let store = CandleStore::new();
/// let model = candle_nn::linear(3, 1, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
/// let mut plan = CandlePlan::new(&world, &store, &PlanOptions::new())?;
/// plan.broadcast(&world, 0)?; // every rank starts from rank 0's values
/// let mut opt = AdamW::new(plan.vars().to_vec(), ParamsAdamW::default())?;
/// let x = Tensor::ones((4, 3), DType::F32, &Device::Cpu)?; // this rank's share of the batch
/// let loss = model.forward(&x)?.sqr()?.mean_all()?;
/// let mut grads = loss.backward()?;
/// plan.all_reduce(&world, &mut grads, Reduce::Mean)?;
/// opt.step(&grads)?;
/// plan.check_consistency(&world)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
pub struct CandlePlan {
    pub(in crate::ranks) manifest: Manifest,
    /// The variables, in manifest order.
    pub(in crate::ranks) vars: Vec<Var>,
    pub(in crate::ranks) f32s: Lane<f32>,
    pub(in crate::ranks) f64s: Lane<f64>,
    pub(in crate::ranks) byte_cap: usize,
    /// Per-variable digests of the last consistency check.
    digests: Vec<VarHash>,
    /// One digest per rank, for status exchanges and checks.
    pub(in crate::ranks) gathered: Vec<Digest>,
    /// The tensors one call reads, one per variable (`None`: zeros);
    /// emptied after each call, its capacity kept.
    pub(in crate::ranks) sources: Vec<Option<Tensor>>,
    /// Per variable, whether this call's source is the gradient itself
    /// (a contiguous CPU tensor): the ones [`all_reduce_in_place`]
    /// (Self::all_reduce_in_place) may write into.
    own: Vec<bool>,
    /// Scratch for the in-place call's check that no two storages alias.
    starts: Vec<usize>,
    /// How many ranks hold a gradient of each variable: sent, and summed.
    pub(in crate::ranks) present: Vec<f64>,
    pub(in crate::ranks) present_sum: Vec<f64>,
    /// What the watchdog names, and the calls' timeout.
    watched: Arc<str>,
    timeout: Option<Duration>,
    /// Whether host tensors go through the staged path of device tensors
    /// too (the unit tests' way to drive that path without a GPU).
    stage_all: bool,
    /// ZeRO's cut of the variables into one slice per rank.
    pub(in crate::ranks) partition: Partition,
    /// The staging of the direct variables' chunks on a device, kept from
    /// call to call.
    pub(in crate::ranks) chunk_staging: ChunkStaging,
}

impl std::fmt::Debug for CandlePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandlePlan")
            .field("vars", &self.vars.len())
            .field("reduce_buckets", &self.reduce_buckets())
            .finish_non_exhaustive()
    }
}

/// `t` as a contiguous CPU tensor: itself (an `Arc` clone) when it is one
/// already, else a copy.
fn on_host(t: &Tensor) -> candle_core::Result<Tensor> {
    if t.device().is_cpu() && t.is_contiguous() {
        Ok(t.clone())
    } else {
        t.to_device(&Device::Cpu)?.contiguous()
    }
}

/// Whether a call reads `t` in place on the host (else through staging).
fn in_host(t: &Tensor, stage_all: bool) -> bool {
    t.device().is_cpu() && !stage_all
}

/// The elements a call writes, one buffer per variable; they become the
/// variables' new tensors.
enum Out {
    F32(Vec<f32>),
    F64(Vec<f64>),
    /// A result on its variable's device, written a piece at a time
    /// ([`Staged::write`]); `None` until a reduce hands over a direct
    /// variable's elements.
    Dev(Device, Option<Tensor>),
}

impl Out {
    /// Zeros of `var`'s dtype and element count: on the host, or on
    /// `var`'s device when it is staged.
    fn zeros(var: &Var, stage_all: bool) -> candle_core::Result<Self> {
        if !in_host(var.as_tensor(), stage_all) {
            let t = Tensor::zeros(var.elem_count(), var.dtype(), var.device())?;
            return Ok(Out::Dev(var.device().clone(), Some(t)));
        }
        Ok(match var.dtype() {
            DType::F64 => Out::F64(vec![0.0; var.elem_count()]),
            _ => Out::F32(vec![0.0; var.elem_count()]),
        })
    }

    /// An empty buffer of `var`'s dtype, for a result a reduce hands over.
    fn empty(var: &Var, stage_all: bool) -> Self {
        if !in_host(var.as_tensor(), stage_all) {
            return Out::Dev(var.device().clone(), None);
        }
        match var.dtype() {
            DType::F64 => Out::F64(Vec::new()),
            _ => Out::F32(Vec::new()),
        }
    }

    /// Copies `from` over the bytes `at..` of the result. O(bytes).
    fn write(&mut self, at: usize, from: &[u8]) -> candle_core::Result<()> {
        let bytes: &mut [u8] = match self {
            Out::F32(v) => bytemuck::cast_slice_mut(v),
            Out::F64(v) => bytemuck::cast_slice_mut(v),
            Out::Dev(_, Some(t)) => return Staged::write(t, at, from),
            Out::Dev(_, None) => return Err(no_result()),
        };
        bytes[at..at + from.len()].copy_from_slice(from);
        Ok(())
    }

    /// The result as a tensor of `var`'s shape on `var`'s device (no copy
    /// on the CPU, nor for a result made on the device).
    fn into_tensor(self, var: &Var) -> candle_core::Result<Tensor> {
        let t = match self {
            Out::F32(v) => Tensor::from_vec(v, var.dims(), &Device::Cpu)?,
            Out::F64(v) => Tensor::from_vec(v, var.dims(), &Device::Cpu)?,
            Out::Dev(_, Some(t)) => return t.reshape(var.dims()),
            Out::Dev(_, None) => return Err(no_result()),
        };
        t.to_device(var.device())
    }
}

/// A device result that no reduce handed over (a bug, not an input).
fn no_result() -> candle_core::Error {
    candle_core::Error::Msg("a device result that no reduce handed over".into())
}

/// The tensors a call reads and the buffers it writes (`None`: a variable
/// whose result is not kept).
struct Host<'a> {
    keys: &'a [ManifestEntry],
    sources: &'a [Option<Tensor>],
    out: &'a mut [Option<Out>],
    /// Per variable, whether its source is the gradient itself, whose
    /// storage may take the reduced elements in place (empty: none may).
    in_place: &'a [bool],
    /// Whether host tensors are staged as device ones are (tests).
    stage_all: bool,
    /// The page-locked staging of the variables on a CUDA device.
    staging: &'a mut ChunkStaging,
    /// Whether a fused bucket's pieces on a CUDA device are copied
    /// together through `staging` ([`Values::spans`]).
    spans: bool,
}

impl Host<'_> {
    /// `spans`' pieces as the parts of one chunk, each `len` bytes of its
    /// variable's elements, part `i` the `i`th span's (its `var` is `i`:
    /// the chunk's tensors are the spans', in order); `None` if a piece is
    /// not whole elements of `F32` or `F64` (a bug). O(spans).
    fn chunk(&self, spans: &[Span], send: bool) -> Option<Chunk> {
        let mut parts = SmallVec::new();
        let mut len = 0;
        for (i, s) in spans.iter().enumerate() {
            let size = self.keys[s.var].dtype.bitsize() / 8;
            if size == 0 || s.at % size != 0 || s.len % size != 0 {
                return None;
            }
            parts.push(Part {
                var: i,
                first: s.at / size,
                n: s.len / size,
                at: s.to,
            });
            len = len.max(s.to + s.len);
        }
        let (send_parts, recv_parts) = if send {
            (parts, SmallVec::new())
        } else {
            (SmallVec::new(), parts)
        };
        Some(Chunk {
            send: send_parts,
            send_len: if send { len } else { 0 },
            recv: recv_parts,
            recv_len: if send { 0 } else { len },
            root: 0,
        })
    }
}

impl Values for Host<'_> {
    fn read(&mut self, var: usize, at: usize, into: &mut [u8]) -> Result<(), Error> {
        match &self.sources[var] {
            None => into.fill(0),
            Some(t) if !in_host(t, self.stage_all) => {
                Staged::read(t, at, into).map_err(|e| candle(&self.keys[var].key, e))?;
            }
            Some(t) => with_bytes(t, |b| into.copy_from_slice(&b[at..at + into.len()]))
                .map_err(|e| candle(&self.keys[var].key, e))?,
        }
        Ok(())
    }
    fn write(&mut self, var: usize, at: usize, from: &[u8]) -> Result<(), Error> {
        if let Some(out) = &mut self.out[var] {
            out.write(at, from)
                .map_err(|e| candle(&self.keys[var].key, e))?;
        }
        Ok(())
    }

    fn spans(&self) -> bool {
        self.spans
    }

    /// The pieces of gradients on one CUDA device, copied together through
    /// a page-locked slot (one wait); else one at a time.
    fn read_spans(&mut self, k: usize, spans: &[Span], into: &mut [u8]) -> Result<(), Error> {
        if let Some(chunk) = self.chunk(spans, true) {
            // The spans' tensors only: O(spans) per bucket, not O(variables).
            let ends: Vec<_> = (spans.iter())
                .map(|s| {
                    (
                        self.keys[s.var].key.as_str(),
                        self.sources[s.var].as_ref(),
                        None,
                    )
                })
                .collect();
            let len = chunk.send_len;
            if fetch_now(&ends, self.staging, k % 2, &chunk, &mut into[..len])? {
                return Ok(());
            }
        }
        for s in spans {
            self.read(s.var, s.at, &mut into[s.to..s.to + s.len])?;
        }
        Ok(())
    }

    /// The pieces of results made on one CUDA device, copied together
    /// through a page-locked slot (queued, not waited for); else one at a
    /// time.
    fn write_spans(&mut self, k: usize, spans: &[Span], from: &[u8]) -> Result<(), Error> {
        // Only results made on a device: a host one is written in place.
        let on_device = spans
            .iter()
            .all(|s| matches!(self.out[s.var], None | Some(Out::Dev(_, Some(_)))));
        if let Some(chunk) = self.chunk(spans, false).filter(|_| on_device) {
            let ends: Vec<_> = (spans.iter())
                .map(|s| match &self.out[s.var] {
                    Some(Out::Dev(_, Some(t))) => (self.keys[s.var].key.as_str(), None, Some(t)),
                    _ => (self.keys[s.var].key.as_str(), None, None),
                })
                .collect();
            let len = chunk.recv_len;
            if put_now(&ends, self.staging, k % 2, &chunk, &from[..len])? {
                return Ok(());
            }
        }
        for s in spans {
            self.write(s.var, s.at, &from[s.to..s.to + s.len])?;
        }
        Ok(())
    }
}

impl Direct for Host<'_> {
    /// The gradient's CPU storage, read in place (zeros for a variable this
    /// rank has no gradient of).
    fn with_bytes(
        &mut self,
        var: usize,
        f: &mut dyn FnMut(&[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        match &self.sources[var] {
            None => {
                let e = &self.keys[var];
                let n = e.shape.iter().product::<usize>() * (e.dtype.bitsize() / 8);
                f(&vec![0_u8; n])
            }
            Some(t) if !in_host(t, self.stage_all) => {
                // One variable's bytes on the host at a time.
                let host = t
                    .flatten_all()
                    .and_then(|t| t.to_device(&Device::Cpu))
                    .map_err(|e| candle(&self.keys[var].key, e))?;
                with_bytes(&host, |b| f(b)).map_err(|e| candle(&self.keys[var].key, e))?
            }
            Some(t) => with_bytes(t, |b| f(b)).map_err(|e| candle(&self.keys[var].key, e))?,
        }
    }

    /// A gradient off the host (on a device, or every gradient under
    /// `stage_all`) of a variable whose result no reduce has handed over.
    fn staged(&self, var: usize) -> bool {
        matches!(
            (&self.sources[var], self.out.get(var)),
            (Some(t), Some(Some(Out::Dev(_, None)))) if !in_host(t, self.stage_all)
        )
    }

    /// Each staged gradient of `vars` reduced into a new tensor on its
    /// device (or, in place, into its own memory), which becomes its
    /// variable's result: each run of them on one device together
    /// ([`reduce_run`]).
    fn reduce_staged(
        &mut self,
        vars: &[(usize, usize)],
        per: usize,
        sum: &mut SumChunk<'_>,
    ) -> Result<(), Error> {
        let mut made = Vec::with_capacity(vars.len());
        for &(var, _) in vars {
            let key = &self.keys[var].key;
            let Some(t) = &self.sources[var] else {
                return Err(Error::BadBuffers {
                    op: "all-reduce",
                    reason: format!("`{key}` staged without a gradient"),
                });
            };
            // In place: the sums go over the gradient, chunk by chunk
            // behind the chunks read from it.
            let result = if self.in_place.get(var) == Some(&true) {
                t.flatten_all()
            } else {
                Tensor::zeros(t.elem_count(), t.dtype(), t.device())
            };
            made.push((key.as_str(), t, result.map_err(|e| candle(key, e))?));
        }
        let runs = made.chunk_by(|(_, a, _), (_, b, _)| a.device().same_device(b.device()));
        for run in runs {
            let run: Vec<(&str, &Tensor, &Tensor)> =
                run.iter().map(|(k, t, r)| (*k, *t, r)).collect();
            reduce_run(&run, self.staging, per, sum)?;
        }
        let results: Vec<Tensor> = made.into_iter().map(|(_, _, r)| r).collect();
        for (&(var, _), t) in vars.iter().zip(results) {
            if let Some(Some(Out::Dev(_, result))) = self.out.get_mut(var) {
                *result = Some(t);
            }
        }
        Ok(())
    }

    /// The reduced elements become the variable's result as they are:
    /// swapped into the gradient's own storage (in place, when allowed and
    /// the gradient is all of its storage; the spare takes the old
    /// elements), or made a tensor without a copy (`Tensor::from_vec`).
    fn adopt(&mut self, var: usize, spare: &mut dyn Any) -> Result<(), Error> {
        if self.out[var].is_none() {
            return Ok(()); // no rank has a gradient of it: nothing kept
        }
        if let (Some(true), Some(t)) = (self.in_place.get(var), &self.sources[var]) {
            let swapped = SwapIn::new(&mut *spare)
                .into(t)
                .map_err(|e| candle(&self.keys[var].key, e))?;
            if swapped {
                self.out[var] = None; // the gradient holds the sums
                return Ok(());
            }
        }
        let Some(out) = &mut self.out[var] else {
            return Ok(());
        };
        if let Out::Dev(device, result) = out {
            // The sums go to the device; the spare stays the plan's.
            let made = if let Some(v) = spare.downcast_ref::<Vec<f32>>() {
                Tensor::from_slice(v, v.len(), device)
            } else if let Some(v) = spare.downcast_ref::<Vec<f64>>() {
                Tensor::from_slice(v, v.len(), device)
            } else {
                Err(no_result())
            };
            *result = Some(made.map_err(|e| candle(&self.keys[var].key, e))?);
            return Ok(());
        }
        if let Some(v) = spare.downcast_mut::<Vec<f32>>() {
            *out = Out::F32(std::mem::take(v));
        } else if let Some(v) = spare.downcast_mut::<Vec<f64>>() {
            *out = Out::F64(std::mem::take(v));
        }
        Ok(())
    }
}

impl CandlePlan {
    /// Builds the plan of `store`'s trainable variables (see
    /// [`CandleStore::trainable_vars`]) that `opts`' filter keeps (on the
    /// dotted names), in name order, and checks that every rank holds the
    /// same: names, dtypes and shapes. A collective call. O(variables ×
    /// depth + sort) for the manifest, plus the agreement (see
    /// [`Manifest::agree`]); allocates two buffers of one bucket per float
    /// type.
    ///
    /// # Errors
    /// On every rank: [`Error::Disagree`] when the ranks' manifests differ,
    /// naming the first dotted name that differs and the ranks on each side;
    /// [`Error::ArgumentsDiffer`] when they pass different bucket sizes. On
    /// the rank concerned [`Error::Unsupported`] for a variable neither
    /// `F32` nor `F64`, [`Error::BadOption`] for a bucket of 0 bytes, or
    /// [`Error::Candle`] from the store, and on the others
    /// [`Error::PeerFailed`]. Nothing changes.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, Error, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// candle_nn::embedding(10, 4, store.var_builder(DType::F32, &Device::Cpu).pp("emb"))?;
    /// candle_nn::linear(4, 2, store.var_builder(DType::BF16, &Device::Cpu).pp("head"))?;
    /// let err = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new()).unwrap_err();
    /// assert!(matches!(err, Error::Unsupported { ref key, .. } if key == "head.bias"));
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new().filter(|k| k.starts_with("emb.")))?;
    /// assert_eq!(plan.manifest().entries()[0].to_string(), "emb.weight: F32 [10, 4]");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new<C: Collective + ?Sized>(
        comm: &C,
        store: &CandleStore,
        opts: &PlanOptions,
    ) -> Result<Self, Error> {
        let watched: Arc<str> = "the candle store's trainable variables".into();
        let _watch = Watch::arm(comm.rank(), "building the plan", &watched, opts.timeout);
        let local = Self::bind(store, opts);
        let ((manifest, vars), gathered) = start(comm, opts, local, |(m, _)| m)?;
        let nbytes: Vec<usize> = vars
            .iter()
            .map(|v| v.elem_count() * v.dtype().size_in_bytes())
            .collect();
        let kinds = || {
            manifest
                .entries()
                .iter()
                .zip(&nbytes)
                .map(|(e, &n)| (e.dtype, n))
        };
        let partition = Partition::new(&manifest, comm.size())?;
        Ok(Self {
            partition,
            f32s: Lane::new(kinds(), opts),
            f64s: Lane::new(kinds(), opts),
            byte_cap: opts.cap(1),
            digests: vec![0; vars.len()],
            sources: Vec::with_capacity(vars.len()),
            own: Vec::with_capacity(vars.len()),
            starts: Vec::new(),
            present: vec![0.0; vars.len()],
            present_sum: vec![0.0; vars.len()],
            manifest,
            vars,
            gathered,
            watched,
            timeout: opts.timeout,
            stage_all: false,
            chunk_staging: ChunkStaging::default(),
        })
    }

    /// Watches the collective call `op` of this plan on `comm`'s rank, with
    /// the plan's timeout, until the returned guard drops. O(1).
    pub(in crate::ranks) fn watch<C: Collective + ?Sized>(
        &self,
        comm: &C,
        op: &'static str,
    ) -> Watch {
        Watch::arm(comm.rank(), op, &self.watched, self.timeout)
    }

    /// What the watchdog names for this plan, and its timeout, for calls
    /// that finish the plan's work later (a save beside training). O(1).
    pub(in crate::ranks) fn watched(&self) -> (Arc<str>, Option<Duration>) {
        (Arc::clone(&self.watched), self.timeout)
    }

    /// The manifest of the store's trainable variables that `opts` keeps,
    /// with the variables in its order.
    fn bind(store: &CandleStore, opts: &PlanOptions) -> Result<(Manifest, Vec<Var>), Error> {
        let mut named = store.trainable_named("")?;
        named.retain(|(k, _)| opts.keeps(k));
        named.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut entries = Vec::with_capacity(named.len());
        let mut vars = Vec::with_capacity(named.len());
        for (key, var) in named {
            let dtype = match var.dtype() {
                DType::F32 => Dtype::F32,
                DType::F64 => Dtype::F64,
                other => {
                    return Err(Error::Unsupported {
                        key,
                        scope: String::new(),
                        holds: Some(dtype_name(other)),
                        wanted: CANDLE_FLOATS,
                    });
                }
            };
            entries.push(ManifestEntry {
                key,
                dtype,
                shape: var.dims().to_vec(),
            });
            vars.push(var);
        }
        Ok((Manifest::from_entries(String::new(), entries), vars))
    }

    /// The manifest the ranks agreed on (dotted names). O(1).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let keys: Vec<&str> = plan.manifest().entries().iter().map(|e| e.key.as_str()).collect();
    /// assert_eq!(keys, ["fc.bias", "fc.weight"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The plan's `Var`s, in manifest order: hand them to the optimizer
    /// (`AdamW::new(plan.vars().to_vec(), ..)`), so that it steps exactly
    /// the variables whose gradients the plan reduces. O(1).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// assert_eq!(plan.vars()[1].dims(), &[2, 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// How many all-reduce calls of gradients one
    /// [`all_reduce`](Self::all_reduce) makes (`f32` and `f64` buckets
    /// together; one more call exchanges which gradients exist). O(1).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu))?; // 8 floats
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new().bucket_bytes(16))?;
    /// assert_eq!(plan.reduce_buckets(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce_buckets(&self) -> usize {
        self.f32s.calls() + self.f64s.calls()
    }

    /// Copies every variable's value on rank `root` into the same `Var` on
    /// every rank (with `Var::set`, so the model and the optimizer see it):
    /// the `f32` variables, then the `f64` ones, in manifest order, laid
    /// end to end and broadcast a bucket at a time through host staging
    /// (on one CUDA device, feature `cuda`, the plan's page-locked buffers,
    /// the copies beside MPI's calls). A collective call. O(bytes) per
    /// rank; host memory: four buffers of at most a bucket, and on the
    /// other ranks one new tensor per variable on its device (candle's
    /// `Var::set` copies from a tensor).
    ///
    /// # Errors
    /// On every rank: [`Error::ArgumentsDiffer`] when the ranks pass
    /// different roots. On a rank that passes a `root` outside the world,
    /// [`Error::BadRank`], or whose values cannot be read,
    /// [`Error::Candle`]; on the others [`Error::PeerFailed`]. Nothing
    /// changes then.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu))?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// plan.broadcast(&SingleProcess, 0)?;
    /// assert!(plan.broadcast(&SingleProcess, 1).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn broadcast<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        root: usize,
    ) -> Result<(), Error> {
        let _watch = self.watch(comm, "broadcast");
        let me = comm.rank() == root;
        let local = check_root(root, comm.size()).and_then(|()| {
            self.sources.clear();
            for (v, e) in self.vars.iter().zip(self.manifest.entries()) {
                let t = if me {
                    Some(
                        v.as_tensor()
                            .contiguous()
                            .map_err(|err| candle(&e.key, err))?,
                    )
                } else {
                    None
                };
                self.sources.push(t);
            }
            Ok(())
        });
        let same: Same = ("roots", root as u64, show_count);
        let done = settle(comm, &mut self.gathered, "broadcast", local, Some(same));
        let done = done.and_then(|()| {
            let keys = self.manifest.entries();
            let out: Vec<Option<Tensor>> = if me {
                vec![None; self.vars.len()]
            } else {
                (self.vars.iter().zip(keys))
                    .map(|(v, e)| v.zeros_like().map(Some).map_err(|err| candle(&e.key, err)))
                    .collect::<Result<_, Error>>()?
            };
            let ends: Vec<_> = (keys.iter().zip(&self.sources).zip(&out))
                .map(|((e, s), o)| (e.key.as_str(), s.as_ref(), o.as_ref()))
                .collect();
            for dtype in [DType::F32, DType::F64] {
                let whole = (self.vars.iter().enumerate())
                    .filter(|(_, v)| v.dtype() == dtype && v.elem_count() > 0)
                    .map(|(var, v)| Piece {
                        var,
                        start: 0,
                        len: v.elem_count(),
                    });
                let laid = Laid::new(whole.collect());
                if laid.len() == 0 {
                    continue; // the same on every rank
                }
                let size = dtype.size_in_bytes();
                let per = (self.byte_cap / size).clamp(1, laid.len());
                let mut chunks = steps(laid.len(), per).map(|(at, n)| {
                    let parts = laid.slot_parts(at, n, size, 0);
                    let (send, recv) = if me {
                        (parts, SmallVec::new())
                    } else {
                        (SmallVec::new(), parts)
                    };
                    Chunk {
                        send,
                        send_len: if me { n * size } else { 0 },
                        recv,
                        recv_len: n * size,
                        root,
                    }
                });
                let caps = (per * size, per * size);
                let staging = &mut self.chunk_staging;
                exchange_staged(&ends, staging, caps, &mut chunks, &mut |_, send, recv| {
                    if me {
                        recv.copy_from_slice(send);
                    }
                    comm.broadcast_bytes(root, recv)
                })?;
            }
            for ((o, v), e) in out.iter().zip(&self.vars).zip(keys) {
                if let Some(t) = o {
                    v.set(t).map_err(|err| candle(&e.key, err))?;
                }
            }
            Ok(())
        });
        self.sources.clear();
        done
    }

    /// Sums (or averages, [`Reduce::Mean`]) the gradients of the plan's
    /// variables in `grads` (candle's `GradStore` after `backward`) over
    /// the ranks, in buckets of the plan's size (`f32` variables in manifest
    /// order, then `f64` ones), and puts the results back into `grads`, so
    /// that `optimizer.step(&grads)` uses them. A collective call.
    ///
    /// A variable that has no gradient on a rank (unused in that rank's
    /// loss) counts as zeros there, on every rank alike; the mean still
    /// divides by the number of ranks, as PyTorch's DDP does. If no rank
    /// has a gradient for it, it stays without one everywhere, so the
    /// optimizer leaves it alone, as in one process. One extra all-reduce of
    /// one `f64` per variable tells the ranks which gradients exist.
    ///
    /// Memory: the bucket buffers are reused, but each call allocates one
    /// new tensor per variable that some rank has a gradient of (the
    /// reduced gradient replaces the one `backward` made; a large one's
    /// buffer is the spare it was summed into, so the plan zeroes a new
    /// spare for the next call), plus two small vectors of one entry per
    /// variable. [`all_reduce_in_place`](Self::all_reduce_in_place)
    /// writes the large gradients in place instead. O(bytes) per rank for
    /// the copies, plus one all-gather of 16 bytes per rank for the check.
    ///
    /// A gradient on another device (CUDA) is never copied to the host
    /// whole: each bucket segment of it is copied to the send buffer, and
    /// each segment of the sums into a result tensor made on the device;
    /// a gradient sent from its own buffer (at least
    /// [`PlanOptions::direct_bytes`]) is copied to the host one at a time,
    /// and its sums go back from the plan's spare. The buckets, and so the
    /// sums' bits, are those of CPU gradients.
    ///
    /// # Errors
    /// On every rank: [`Error::ArgumentsDiffer`] when the ranks pass
    /// different `op`s. On a rank whose gradient of a variable has another
    /// dtype or shape than the variable, [`Error::Changed`], or whose
    /// gradient cannot be read, [`Error::Candle`]; on the others
    /// [`Error::PeerFailed`]; `grads` is unchanged then. Should candle fail
    /// to make a tensor after the exchange ([`Error::Candle`]), `grads` is
    /// unchanged on that rank only.
    ///
    /// ```
    /// use candle_core::{DType, Device, Tensor};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, Reduce, SingleProcess}};
    /// let store = CandleStore::new();
    /// let w = store.get(3, "w", candle_nn::Init::Const(2.0), DType::F32, &Device::Cpu)?;
    /// store.get(1, "unused", candle_nn::Init::Const(0.0), DType::F32, &Device::Cpu)?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let mut grads = w.sqr()?.sum_all()?.backward()?;
    /// plan.all_reduce(&SingleProcess, &mut grads, Reduce::Sum)?;
    /// assert_eq!(grads.get(&w).expect("a gradient").to_vec1::<f32>()?, [4.0; 3]);
    /// assert!(grads.get(plan.vars()[0].as_tensor()).is_none()); // `unused`: still none
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_reduce<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        grads: &mut GradStore,
        op: Reduce,
    ) -> Result<(), Error> {
        self.reduce_gradients(comm, grads, op, false)
    }

    /// As [`all_reduce`](Self::all_reduce), but each gradient of at least
    /// [`PlanOptions::direct_bytes`] that is contiguous (as `backward`
    /// makes them) takes the reduced elements in place, as PyTorch's DDP
    /// writes its gradients. On the CPU, when it is all of its storage, the
    /// plan's spare buffer is swapped into the tensor's storage by a candle
    /// in-place op, and the tensor's old buffer becomes the spare for the
    /// next call; on a device (CUDA), each chunk of sums is copied over the
    /// chunk of the gradient it came from, behind the copies out of it. No
    /// new tensor and no zeroed buffer for those gradients, where
    /// [`all_reduce`](Self::all_reduce) makes a new tensor per gradient;
    /// the others are handled as there. The sums are the same, bit for
    /// bit.
    ///
    /// In place means shared: every clone or view of such a gradient
    /// tensor (taken before the call) sees the reduced elements. When two
    /// of the gradients, or a gradient and a variable, share a storage,
    /// the call writes no gradient in place (it makes new tensors, as
    /// [`all_reduce`](Self::all_reduce)). O(bytes) per rank for the fused
    /// variables' copies, O(variables × log variables) for that check,
    /// plus the transport.
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce); should candle refuse the
    /// in-place op after the exchange ([`Error::Candle`]), the gradients
    /// reduced before it on that rank keep their sums.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, Reduce, SingleProcess}};
    /// let store = CandleStore::new();
    /// let w = store.get(3, "w", candle_nn::Init::Const(2.0), DType::F32, &Device::Cpu)?;
    /// let opts = PlanOptions::new().direct_bytes(4); // `w` (12 bytes) from its own buffer
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &opts)?;
    /// let mut grads = w.sqr()?.sum_all()?.backward()?;
    /// plan.all_reduce_in_place(&SingleProcess, &mut grads, Reduce::Mean)?;
    /// assert_eq!(grads.get(&w).expect("a gradient").to_vec1::<f32>()?, [4.0; 3]); // one rank
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_reduce_in_place<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        grads: &mut GradStore,
        op: Reduce,
    ) -> Result<(), Error> {
        self.reduce_gradients(comm, grads, op, true)
    }

    /// Marks in `own` the gradients that an in-place call may write into:
    /// sent from their own buffers, and of storages that no other gradient
    /// or variable of the plan shares (else none). O(variables × log).
    fn mark_in_place(&mut self) {
        let direct = |i: usize| self.f32s.is_direct(i) || self.f64s.is_direct(i);
        for (i, own) in self.own.iter_mut().enumerate() {
            *own = *own && direct(i);
        }
        self.starts.clear();
        let grads = (self.sources.iter().zip(&self.own))
            .filter(|&(_, &own)| own)
            .filter_map(|(t, _)| t.as_ref());
        let vars = self.vars.iter().map(|v| v.as_tensor());
        self.starts.extend(grads.chain(vars).map(storage_at));
        if !all_distinct(&mut self.starts) {
            self.own.fill(false);
        }
    }

    /// [`all_reduce`](Self::all_reduce), in place or not.
    fn reduce_gradients<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        grads: &mut GradStore,
        op: Reduce,
        in_place: bool,
    ) -> Result<(), Error> {
        let _watch = self.watch(comm, "all-reduce");
        let local = self.gradients(grads);
        let done = settle(
            comm,
            &mut self.gathered,
            "all-reduce",
            local,
            Some(op.same()),
        );
        let done = done.and_then(|()| {
            comm.all_reduce_sum_f64(&self.present, &mut self.present_sum)?;
            if in_place {
                self.mark_in_place();
            }
            // Buffers only for the variables some rank has a gradient of;
            // those sent from their own buffers get theirs from the reduce.
            let direct = |i: usize| self.f32s.is_direct(i) || self.f64s.is_direct(i);
            let stage_all = self.stage_all;
            let keys = self.manifest.entries();
            let mut out: Vec<Option<Out>> = (self.vars.iter().zip(&self.present_sum))
                .enumerate()
                .map(|(i, (v, &n))| {
                    if n == 0.0 {
                        Ok(None)
                    } else if direct(i) {
                        Ok(Some(Out::empty(v, stage_all)))
                    } else {
                        Out::zeros(v, stage_all)
                            .map(Some)
                            .map_err(|e| candle(&keys[i].key, e))
                    }
                })
                .collect::<Result<_, Error>>()?;
            // A fused bucket's pieces on a CUDA device go together.
            let spans = cfg!(feature = "cuda")
                && !stage_all
                && (self.sources.iter().flatten()).any(|t| t.device().is_cuda());
            let mut host = Host {
                keys,
                sources: &self.sources,
                out: &mut out,
                in_place: if in_place { &self.own } else { &[] },
                stage_all,
                staging: &mut self.chunk_staging,
                spans,
            };
            self.f32s.reduce(comm, &mut host, op)?;
            self.f64s.reduce(comm, &mut host, op)?;
            let mut reduced = Vec::with_capacity(out.len());
            for (i, o) in out.into_iter().enumerate() {
                if let Some(o) = o {
                    let v = &self.vars[i];
                    let t = o
                        .into_tensor(v)
                        .map_err(|e| candle(&self.manifest.entries()[i].key, e))?;
                    reduced.push((i, t));
                }
            }
            for (i, t) in reduced {
                grads.insert(self.vars[i].as_tensor(), t);
            }
            Ok(())
        });
        self.sources.clear();
        done
    }

    /// Fills `sources` with each variable's gradient on the host (or
    /// `None`) and `present` with 1 where there is one, checking that each
    /// gradient has its variable's dtype and shape.
    pub(in crate::ranks) fn gradients(&mut self, grads: &GradStore) -> Result<(), Error> {
        self.sources.clear();
        self.own.clear();
        for ((v, e), p) in self
            .vars
            .iter()
            .zip(self.manifest.entries())
            .zip(&mut self.present)
        {
            let g = grads.get(v.as_tensor());
            *p = if g.is_some() { 1.0 } else { 0.0 };
            let Some(g) = g else {
                self.sources.push(None);
                self.own.push(false);
                continue;
            };
            if g.dtype() != v.dtype() || g.dims() != v.dims() {
                return Err(Error::Changed {
                    key: e.key.clone(),
                    scope: String::new(),
                    reason: format!(
                        "its gradient is {:?} {:?}, the variable {:?} {:?}",
                        g.dtype(),
                        g.dims(),
                        v.dtype(),
                        v.dims()
                    ),
                });
            }
            // The gradient's own memory: swapped on the host, written
            // through staging off it.
            self.own.push(g.is_contiguous());
            // Contiguous on its own device (an `Arc` clone when it is
            // already): read in place on the CPU, else a bucket segment at
            // a time through the host ([`Staged`]).
            self.sources
                .push(Some(g.contiguous().map_err(|err| candle(&e.key, err))?));
        }
        Ok(())
    }

    /// This rank's digest of the variables' values: a hash of each value's
    /// bytes, then of those hashes in manifest order, as
    /// [`SyncPlan::digest`](crate::ranks::SyncPlan::digest). Local: no collective.
    /// Allocates nothing for contiguous CPU variables (others are copied to
    /// the host). O(bytes).
    ///
    /// # Errors
    /// [`Error::Candle`] if a value cannot be read.
    ///
    /// ```
    /// use candle_core::{DType, Device, Tensor};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// store.get(4, "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let before = plan.digest()?;
    /// plan.vars()[0].set(&Tensor::new(&[1.0_f32, 1.0, 1.0, 1.5], &Device::Cpu)?)?;
    /// assert_ne!(plan.digest()?, before);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn digest(&mut self) -> Result<Digest, Error> {
        for ((v, e), d) in self
            .vars
            .iter()
            .zip(self.manifest.entries())
            .zip(&mut self.digests)
        {
            *d = on_host(v.as_tensor())
                .and_then(|t| with_bytes(&t, hash_bytes))
                .map_err(|err| candle(&e.key, err))?;
        }
        Ok(digest_of_hashes(&self.digests))
    }

    /// Checks that every rank holds bit-identical values, as
    /// [`SyncPlan::check_consistency`](crate::ranks::SyncPlan::check_consistency):
    /// the ranks all-gather their [`digest`](Self::digest), and when they
    /// differ every rank returns the same [`Error::Diverged`] naming the
    /// first variable whose bytes differ. A collective call. Allocates
    /// nothing when the ranks agree; O(bytes + world size).
    ///
    /// # Errors
    /// On every rank: [`Error::Diverged`]. On a rank whose values cannot be
    /// read, [`Error::Candle`], and on the others [`Error::PeerFailed`].
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu))?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// plan.check_consistency(&SingleProcess)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_consistency<C: Collective + ?Sized>(&mut self, comm: &C) -> Result<(), Error> {
        let _watch = self.watch(comm, "consistency check");
        let local = self.digest();
        compare_values(
            comm,
            &mut self.gathered,
            &self.digests,
            &self.manifest,
            local,
        )
    }

    /// Rank `root` saves the whole `store` (every variable, frozen ones
    /// too) to `path` with [`CandleStore::save`] (candle's format and
    /// names, atomically); the other ranks wait until it is done. A
    /// collective call: when it returns `Ok` on any rank, the file is whole.
    /// Returns the save's report on the root, `None` elsewhere. O(variables
    /// × depth + bytes written) on the root, plus two all-gathers of 16
    /// bytes per rank.
    ///
    /// # Errors
    /// On every rank: [`Error::ArgumentsDiffer`] when the ranks pass
    /// different roots. On a rank that passes a `root` outside the world,
    /// [`Error::BadRank`]. On the root, the save's error
    /// ([`Error::Candle`]), and on the others [`Error::PeerFailed`].
    ///
    /// ```
    /// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let report = plan.save_on_root(&SingleProcess, &store, dir.join("fc.safetensors"), 0)?;
    /// assert_eq!(report.expect("rank 0 saved").keys, ["fc.bias", "fc.weight"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save_on_root<C: Collective + ?Sized>(
        &self,
        comm: &C,
        store: &CandleStore,
        path: impl AsRef<Path>,
        root: usize,
    ) -> Result<Option<SaveReport>, Error> {
        let _watch = self.watch(comm, "saving the checkpoint");
        let mut gathered = vec![[0_u8; crate::ranks::DIGEST_BYTES]; comm.size()];
        let same: Same = ("roots", root as u64, show_count);
        let checked = check_root(root, comm.size());
        let op = "saving the checkpoint";
        settle(comm, &mut gathered, op, checked, Some(same))?;
        let local = if comm.rank() == root {
            store.save(path).map(Some).map_err(Error::from)
        } else {
            Ok(None)
        };
        settle(comm, &mut gathered, op, local, None)
    }

    /// Every rank loads `path` into `store` strictly with
    /// [`CandleStore::load`] (every name, dtype and shape of the file must
    /// be the store's), then the ranks [check](Self::check_consistency)
    /// that they hold the same values. First every rank checks the file's
    /// header against its store and the ranks exchange the outcome, so a
    /// file that does not fit makes every rank return an error with no
    /// value changed. A collective call. O(header + bytes read) per rank,
    /// plus the consistency check.
    ///
    /// # Errors
    /// On the rank concerned, [`Error::Checkpoint`] (an unreadable file, or
    /// a [`Mismatch`](checkpoint::Error::Mismatch) naming every differing
    /// name) or [`Error::Candle`], and on the others [`Error::PeerFailed`];
    /// [`Error::Diverged`] on every rank when the ranks loaded different
    /// values (files that differ between hosts).
    ///
    /// ```
    /// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
    /// use candle_core::{DType, Device, Tensor};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// let w = store.get(2, "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let path = dir.join("w.safetensors");
    /// plan.save_on_root(&SingleProcess, &store, &path, 0)?;
    /// plan.vars()[0].set(&Tensor::new(&[5.0_f32, 5.0], &Device::Cpu)?)?;
    /// let report = plan.load_on_all(&SingleProcess, &store, &path)?;
    /// assert_eq!(report.loaded, ["w"]);
    /// assert_eq!(w.to_vec1::<f32>()?, [1.0, 1.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_on_all<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        store: &CandleStore,
        path: impl AsRef<Path>,
    ) -> Result<LoadReport, Error> {
        let _watch = self.watch(comm, "loading the checkpoint");
        let path = path.as_ref();
        let checked =
            (store.named_vars().map_err(Error::from)).and_then(|named| check_file(&named, path));
        settle(
            comm,
            &mut self.gathered,
            "checking the checkpoint",
            checked,
            None,
        )?;
        let loaded = store.load(path, &LoadOptions::new()).map_err(Error::from);
        let report = settle(
            comm,
            &mut self.gathered,
            "loading the checkpoint",
            loaded,
            None,
        )?;
        self.check_consistency(comm)?;
        Ok(report)
    }
}

/// Checks the header of the file at `path` against every variable of a
/// store, `named` (its `named_vars`): the same dotted names, dtypes and
/// shapes. O(header + variables).
pub(in crate::ranks) fn check_file(named: &[(String, Var)], path: &Path) -> Result<(), Error> {
    let file = checkpoint::inspect(path)?;
    let dtypes: Vec<Dtype> = named.iter().map(|(_, v)| v.dtype().into()).collect();
    let mine = (named.iter().zip(&dtypes)).map(|((k, v), d)| (k.as_str(), *d, v.dims(), false));
    header_fits(path, file, mine)
}

/// A candle dtype as an error message names what a variable holds.
fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "a candle Var of BF16",
        DType::F16 => "a candle Var of F16",
        DType::U8 => "a candle Var of U8",
        DType::U32 => "a candle Var of U32",
        DType::I16 => "a candle Var of I16",
        DType::I32 => "a candle Var of I32",
        DType::I64 => "a candle Var of I64",
        _ => "a candle Var of another dtype",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ranks::transport::mirror::Mirror;
    use crate::ranks::{PlanOptions, SingleProcess};
    use candle_core::backprop::GradStore;

    /// A store of `f32` and `f64` variables of several sizes.
    fn model() -> CandleStore {
        let store = CandleStore::new();
        let shapes: [(&str, usize, DType); 5] = [
            ("a", 3, DType::F32),
            ("b", 17, DType::F64),
            ("c", 40, DType::F32),
            ("d", 5, DType::F32),
            ("e", 33, DType::F64),
        ];
        for (name, n, dtype) in shapes {
            store
                .get(n, name, candle_nn::Init::Const(1.0), dtype, &Device::Cpu)
                .expect("a variable");
        }
        store
    }

    /// The gradients of `Σ w · c` over `vars` (`c` of fractional
    /// elements, so that a misplaced piece shows).
    fn grads(vars: &[Var]) -> GradStore {
        let mut loss: Option<Tensor> = None;
        for (k, v) in vars.iter().enumerate() {
            let c = Tensor::arange(0.0, v.elem_count() as f64, &Device::Cpu)
                .and_then(|t| t.affine(0.37, 1.0 / (k as f64 + 3.0)))
                .and_then(|t| t.to_dtype(v.dtype()))
                .expect("a constant");
            let term = v
                .as_tensor()
                .mul(&c)
                .and_then(|t| t.sum_all())
                .and_then(|t| t.to_dtype(DType::F64))
                .expect("a term");
            loss = Some(match loss {
                None => term,
                Some(l) => (l + term).expect("a sum"),
            });
        }
        loss.expect("a loss").backward().expect("gradients")
    }

    /// Each variable's gradient in `grads`, as bits.
    fn bits(grads: &GradStore, vars: &[Var]) -> Vec<Vec<u64>> {
        vars.iter()
            .map(|v| {
                let g = grads.get(v.as_tensor()).expect("a gradient");
                g.flatten_all()
                    .and_then(|t| t.to_dtype(DType::F64))
                    .and_then(|t| t.to_vec1::<f64>())
                    .expect("values")
                    .iter()
                    .map(|x| x.to_bits())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_staged_path_writes_in_place_only_when_asked_and_storages_are_distinct() {
        // Every variable sent from its own buffer, so every gradient is
        // staged; two identical ranks' sums double them.
        let opts = PlanOptions::new().bucket_bytes(16).direct_bytes(4);
        for (in_place, shared) in [(false, false), (true, false), (true, true)] {
            let what = format!("in place {in_place}, two sharing a storage {shared}");
            let store = model();
            let mut plan = CandlePlan::new(&Mirror(2, 0), &store, &opts).expect("a plan");
            plan.stage_all = true;
            let vars = plan.vars().to_vec();
            let mut g = grads(&vars);
            if shared {
                // `a` and `d` (3 and 5 f32s): `d`'s gradient a view of `c`'s.
                let c = g.get(vars[2].as_tensor()).expect("c").clone();
                g.insert(vars[3].as_tensor(), c.narrow(0, 0, 5).expect("a view"));
            }
            let before = bits(&g, &vars);
            let kept: Vec<Tensor> = (vars.iter())
                .map(|v| g.get(v.as_tensor()).expect("a gradient").clone())
                .collect();
            plan.reduce_gradients(&Mirror(2, 0), &mut g, Reduce::Sum, in_place)
                .expect("a reduce");
            let doubled: Vec<Vec<u64>> = (before.iter())
                .map(|v| {
                    v.iter()
                        .map(|&b| (2.0 * f64::from_bits(b)).to_bits())
                        .collect()
                })
                .collect();
            assert_eq!(bits(&g, &vars), doubled, "{what}: the sums");
            // What a clone taken before the call sees: the sums when they
            // were written in place, else the gradient as it was.
            let seen: Vec<Vec<u64>> = (kept.iter())
                .map(|t| {
                    (t.to_dtype(DType::F64).and_then(|t| t.to_vec1::<f64>()))
                        .expect("values")
                        .iter()
                        .map(|x| x.to_bits())
                        .collect()
                })
                .collect();
            let want = if in_place && !shared {
                &doubled
            } else {
                &before
            };
            assert_eq!(&seen, want, "{what}: the gradients' own memory");
        }
    }

    #[test]
    fn the_staged_path_of_device_tensors_gives_the_host_paths_bits() {
        // Fused buckets that split variables, direct variables sent in
        // chunks, and the defaults.
        for opts in [
            PlanOptions::new().bucket_bytes(12).direct_bytes(100),
            PlanOptions::new().bucket_bytes(16).direct_bytes(usize::MAX),
            PlanOptions::new(),
        ] {
            for op in [Reduce::Sum, Reduce::Mean] {
                for in_place in [false, true] {
                    let what = format!("{opts:?} {op:?} in place {in_place}");
                    let store = model();
                    let mut host = CandlePlan::new(&SingleProcess, &store, &opts).expect("a plan");
                    let mut staged =
                        CandlePlan::new(&SingleProcess, &store, &opts).expect("a plan");
                    staged.stage_all = true;
                    let vars = host.vars().to_vec();
                    let (mut a, mut b) = (grads(&vars), grads(&vars));
                    let want = bits(&a, &vars);
                    assert_eq!(bits(&b, &vars), want, "{what}: the same gradients");
                    host.reduce_gradients(&SingleProcess, &mut a, op, in_place)
                        .expect("the host path");
                    staged
                        .reduce_gradients(&SingleProcess, &mut b, op, in_place)
                        .expect("the staged path");
                    // One rank: the sums (and means) are the gradients.
                    assert_eq!(bits(&a, &vars), want, "{what}: host");
                    assert_eq!(bits(&b, &vars), want, "{what}: staged");
                }
            }
        }
    }
}
