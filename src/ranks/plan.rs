//! [`SyncPlan`]: the variables of one scope, agreed between ranks once,
//! then broadcast, all-reduced in buckets and checked by digest as often as
//! needed, with every buffer reused.

use std::hash::Hasher;

use bytemuck::Pod;
use rustc_hash::FxHasher;

use super::access::{Access, FLOATS};
use super::buckets::Buckets;
use super::collective::{Collective, DIGEST_BYTES, Digest, check_root};
use super::error::Error;
use super::manifest::{Bound, Manifest, bind, bind_store, digest_parts};
use super::partition::Partition;
use super::zero::ZeroBuffers;
use crate::checkpoint::{Dtype, Filter};
use crate::sharing::VariableStore;
use crate::{ScopeId, ScopeTree, VarId};

/// The default bucket size: 25 MiB, as PyTorch's DDP.
///
/// ```
/// assert_eq!(scopetree::ranks::DEFAULT_BUCKET_BYTES, 25 * 1024 * 1024);
/// ```
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// The largest number of elements one MPI call can count.
const MAX_COUNT: usize = i32::MAX as usize;

/// How gradients are combined across ranks.
///
/// ```
/// assert_ne!(scopetree::ranks::Reduce::Sum, scopetree::ranks::Reduce::Mean);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// The sum over ranks.
    Sum,
    /// The sum over ranks divided by the number of ranks (PyTorch DDP's
    /// gradient average).
    Mean,
}

/// Options of a [`SyncPlan`].
///
/// ```
/// use scopetree::ranks::{PlanOptions, DEFAULT_BUCKET_BYTES};
/// assert_eq!(PlanOptions::new().bucket_bytes_value(), DEFAULT_BUCKET_BYTES);
/// assert_eq!(PlanOptions::new().bucket_bytes(4096).bucket_bytes_value(), 4096);
/// ```
#[derive(Clone)]
pub struct PlanOptions {
    bucket_bytes: usize,
    filter: Option<Filter>,
}

impl std::fmt::Debug for PlanOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanOptions")
            .field("bucket_bytes", &self.bucket_bytes)
            .field("filter", &self.filter.is_some())
            .finish()
    }
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl PlanOptions {
    /// Buckets of [`DEFAULT_BUCKET_BYTES`]. O(1).
    ///
    /// ```
    /// let _ = scopetree::ranks::PlanOptions::new();
    /// ```
    pub fn new() -> Self {
        Self {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            filter: None,
        }
    }

    /// Only the variables whose full name (relative to the plan's scope,
    /// joined by `/`) `keep` accepts belong to the plan, as
    /// [`SaveOptions::filter`](crate::checkpoint::SaveOptions::filter) keeps
    /// keys: for example the gradients among an optimizer's state, or the
    /// parameters and optimizer state without the workers' scratch. The
    /// plan's checkpoints ([`SyncPlan::save_on_root`],
    /// [`SyncPlan::load_on_all`]) use the same filter. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let optim = tree.new_named_scope(tree.root(), "optim")?;
    /// for name in ["w@GRAD", "w@M", "step"] {
    ///     let v = tree.var(optim, name)?;
    ///     tree.set(v, vec![0.0_f32; 2])?;
    /// }
    /// let opts = PlanOptions::new().filter(|key| key.ends_with("@GRAD"));
    /// let plan = SyncPlan::new(&SingleProcess, &tree, optim, &opts)?;
    /// assert_eq!(plan.manifest().entries().len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn filter(mut self, keep: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.filter = Some(std::sync::Arc::new(keep));
        self
    }

    /// The most bytes one collective call moves. A bucket holds at least one
    /// element, so a size below an element's size means one element per
    /// call; at most `i32::MAX` elements (MPI's count). Larger buckets make
    /// fewer calls and cost more memory: the plan keeps two buffers of one
    /// bucket for each of `f32` and `f64`. O(1).
    ///
    /// ```
    /// use scopetree::ranks::PlanOptions;
    /// let o = PlanOptions::new().bucket_bytes(1 << 20);
    /// assert_eq!(o.bucket_bytes_value(), 1 << 20);
    /// ```
    #[must_use]
    pub fn bucket_bytes(mut self, bytes: usize) -> Self {
        self.bucket_bytes = bytes;
        self
    }

    /// The bucket size set. O(1).
    ///
    /// ```
    /// assert_eq!(scopetree::ranks::PlanOptions::new().bucket_bytes(8).bucket_bytes_value(), 8);
    /// ```
    pub fn bucket_bytes_value(&self) -> usize {
        self.bucket_bytes
    }

    /// Whether the plan keeps the variable `key` (no filter keeps all). O(filter).
    #[cfg(feature = "candle")]
    pub(super) fn keeps(&self, key: &str) -> bool {
        self.filter.as_ref().is_none_or(|keep| keep(key))
    }

    /// The bucket capacity in elements of `size` bytes. O(1).
    pub(super) fn cap(&self, size: usize) -> usize {
        (self.bucket_bytes / size).clamp(1, MAX_COUNT)
    }
}

/// One variable of a plan.
#[derive(Clone, Copy)]
pub(super) struct Slot {
    pub(super) id: VarId,
    pub(super) access: Access,
    pub(super) nbytes: usize,
}

/// A float type a plan reduces.
pub(super) trait Float: Pod + std::ops::Div<Output = Self> {
    const DTYPE: Dtype;
    fn sum<C: Collective + ?Sized>(comm: &C, send: &[Self], recv: &mut [Self])
    -> Result<(), Error>;
    fn scatter<C: Collective + ?Sized>(
        comm: &C,
        send: &[Self],
        recv: &mut [Self],
    ) -> Result<(), Error>;
    fn of_count(n: usize) -> Self;
}

impl Float for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn sum<C: Collective + ?Sized>(comm: &C, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        comm.all_reduce_sum_f32(send, recv)
    }
    fn scatter<C: Collective + ?Sized>(
        comm: &C,
        send: &[f32],
        recv: &mut [f32],
    ) -> Result<(), Error> {
        comm.reduce_scatter_sum_f32(send, recv)
    }
    #[allow(clippy::cast_precision_loss)]
    fn of_count(n: usize) -> f32 {
        n as f32
    }
}

impl Float for f64 {
    const DTYPE: Dtype = Dtype::F64;
    fn sum<C: Collective + ?Sized>(comm: &C, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        comm.all_reduce_sum_f64(send, recv)
    }
    fn scatter<C: Collective + ?Sized>(
        comm: &C,
        send: &[f64],
        recv: &mut [f64],
    ) -> Result<(), Error> {
        comm.reduce_scatter_sum_f64(send, recv)
    }
    #[allow(clippy::cast_precision_loss)]
    fn of_count(n: usize) -> f64 {
        n as f64
    }
}

/// Where a plan's values live, seen as native bytes: the tree's variables,
/// or a candle store's tensors. `var` is the variable's index in the plan,
/// `at` a byte offset within it.
pub(super) trait Values {
    /// Copies the bytes `at..at + into.len()` of variable `var` into `into`.
    fn read(&mut self, var: usize, at: usize, into: &mut [u8]) -> Result<(), Error>;
    /// Copies `from` over the bytes `at..at + from.len()` of variable `var`.
    fn write(&mut self, var: usize, at: usize, from: &[u8]) -> Result<(), Error>;
}

/// The variables of a tree plan.
struct InTree<'a> {
    tree: &'a mut ScopeTree,
    slots: &'a [Slot],
}

impl Values for InTree<'_> {
    fn read(&mut self, var: usize, at: usize, into: &mut [u8]) -> Result<(), Error> {
        let slot = self.slots[var];
        let bytes = (slot.access.bytes)(self.tree, slot.id)?;
        into.copy_from_slice(&bytes[at..at + into.len()]);
        Ok(())
    }
    fn write(&mut self, var: usize, at: usize, from: &[u8]) -> Result<(), Error> {
        let slot = self.slots[var];
        let bytes = (slot.access.bytes_mut)(self.tree, slot.id)?;
        bytes[at..at + from.len()].copy_from_slice(from);
        Ok(())
    }
}

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

/// `bytes` as a slice of `F`; [`Error::BadBuffers`] if they do not fit
/// (never for the plan's own, aligned buffers). O(1).
pub(super) fn cast<F: Pod>(bytes: &[u8]) -> Result<&[F], Error> {
    bytemuck::try_cast_slice(bytes).map_err(|e| Error::BadBuffers {
        op: "all-reduce",
        reason: e.to_string(),
    })
}

/// As [`cast`], mutable. O(1).
pub(super) fn cast_mut<F: Pod>(bytes: &mut [u8]) -> Result<&mut [F], Error> {
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| Error::BadBuffers {
        op: "all-reduce",
        reason: e.to_string(),
    })
}

/// The variables of one scope, as every rank agreed on them, with the
/// buckets and buffers to synchronise them step after step.
///
/// Building a plan is a collective call: every rank makes the manifest of
/// its scope and the ranks [agree](Manifest::agree) on it. Then:
/// - [`broadcast`](Self::broadcast) copies the root rank's values to every
///   rank (initial parameters);
/// - [`all_reduce`](Self::all_reduce) sums or averages the values over the
///   ranks in place (gradients), allocating nothing;
/// - [`check_consistency`](Self::check_consistency) checks that the values
///   are bit-identical on every rank (parameters, every few steps).
///
/// Every call first checks, on every rank, that the variables still hold
/// the planned types and lengths, and the ranks exchange the outcome with
/// the arguments every rank must pass alike (bucket size, root, reduction);
/// so a rank whose tree changed, or that passed another root, makes every
/// rank return an error instead of hanging in a collective.
///
/// Values are sent as their native bytes: ranks must share the byte order
/// (every MPI cluster in practice does).
///
/// ```
/// use scopetree::{ScopeTree, ranks::{PlanOptions, Reduce, SingleProcess, SyncPlan}};
/// let mut tree = ScopeTree::new();
/// let grads = tree.new_named_scope(tree.root(), "grads")?;
/// let g = tree.var(grads, "w")?;
/// tree.set(g, vec![1.0_f32, 2.0])?;
/// let world = SingleProcess;
/// let mut plan = SyncPlan::new(&world, &tree, grads, &PlanOptions::new())?;
/// plan.all_reduce(&world, &mut tree, Reduce::Mean)?;
/// assert_eq!(tree.get::<Vec<f32>>(g)?, &[1.0, 2.0]); // a world of one
/// plan.check_consistency(&world, &tree)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SyncPlan {
    pub(super) manifest: Manifest,
    scope: ScopeId,
    /// The variables' filter, which the plan's checkpoints use too.
    filter: Option<Filter>,
    pub(super) slots: Vec<Slot>,
    /// The first variable that is neither `f32` nor `f64`.
    pub(super) first_not_float: Option<usize>,
    /// Each rank's slice of the variables (ZeRO stage 1).
    pub(super) partition: Partition,
    /// The buffers of the partitioned exchange, made by its first call.
    pub(super) zero: ZeroBuffers,
    f32s: Lane<f32>,
    f64s: Lane<f64>,
    byte_cap: usize,
    /// Per-variable digests of the last consistency check.
    digests: Vec<u64>,
    /// One digest per rank, for status exchanges and checks.
    gathered: Vec<Digest>,
}

impl std::fmt::Debug for SyncPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncPlan")
            .field("scope", &self.manifest.scope())
            .field("vars", &self.slots.len())
            .field("reduce_buckets", &self.reduce_buckets())
            .finish_non_exhaustive()
    }
}

impl SyncPlan {
    /// Builds the plan of `scope` and its named descendants, and checks that
    /// every rank holds the same variables. A collective call: every rank
    /// calls it. O(variables × depth + sort) for the manifest, plus the
    /// agreement (see [`Manifest::agree`]); allocates two buffers of one
    /// bucket per float type.
    ///
    /// # Errors
    /// On every rank: [`Error::Disagree`] when the ranks' manifests differ;
    /// [`Error::ArgumentsDiffer`] when they pass different bucket sizes. On
    /// the rank concerned [`Error::BadOption`] for a bucket of 0 bytes and
    /// the manifest's errors ([`Error::Unsupported`], …), and on the others
    /// [`Error::PeerFailed`]. Nothing changes.
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{Error, PlanOptions, SingleProcess, SyncPlan}};
    /// let tree = ScopeTree::new();
    /// let err = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new().bucket_bytes(0))
    ///     .unwrap_err();
    /// assert!(matches!(err, Error::BadOption { .. }));
    /// ```
    pub fn new<C: Collective + ?Sized>(
        comm: &C,
        tree: &ScopeTree,
        scope: ScopeId,
        opts: &PlanOptions,
    ) -> Result<Self, Error> {
        Self::build(
            comm,
            opts,
            bind(tree, scope, opts.filter.as_ref(), &|_| None),
        )
    }

    /// [`new`](Self::new) for a whole [`VariableStore`], whose manifest
    /// carries the shapes the store recorded (see [`Manifest::of_store`]).
    /// Use the plan with [`VariableStore::tree_mut`]. O(as `new`).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    ///
    /// ```
    /// use scopetree::{ranks::{PlanOptions, SingleProcess, SyncPlan}, sharing::VariableStore};
    /// let mut store = VariableStore::new();
    /// let root = store.tree().root();
    /// let w = store.tree_mut().var(root, "w")?;
    /// store.tree_mut().set(w, vec![1.0_f64; 3])?;
    /// let mut plan = SyncPlan::for_store(&SingleProcess, &store, &PlanOptions::new())?;
    /// plan.broadcast(&SingleProcess, store.tree_mut(), 0)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn for_store<C: Collective + ?Sized>(
        comm: &C,
        store: &VariableStore,
        opts: &PlanOptions,
    ) -> Result<Self, Error> {
        Self::build(comm, opts, bind_store(store, opts.filter.as_ref()))
    }

    fn build<C: Collective + ?Sized>(
        comm: &C,
        opts: &PlanOptions,
        bound: Result<Bound, Error>,
    ) -> Result<Self, Error> {
        let (bound, gathered) = start(comm, opts, bound, |b| &b.manifest)?;
        let slots: Vec<Slot> = bound
            .vars
            .iter()
            .zip(bound.manifest.entries())
            .map(|(&(id, access), e)| Slot {
                id,
                access,
                nbytes: e.shape.iter().product::<usize>() * (e.dtype.bitsize() / 8),
            })
            .collect();
        let partition = Partition::new(&bound.manifest, comm.size())?;
        Ok(Self {
            partition,
            zero: ZeroBuffers::default(),
            first_not_float: slots
                .iter()
                .position(|s| !matches!(s.access.dtype, Dtype::F32 | Dtype::F64)),
            f32s: Lane::new(slots.iter().map(|s| (s.access.dtype, s.nbytes)), opts),
            f64s: Lane::new(slots.iter().map(|s| (s.access.dtype, s.nbytes)), opts),
            byte_cap: opts.cap(1),
            digests: vec![0; slots.len()],
            manifest: bound.manifest,
            scope: bound.scope,
            filter: opts.filter.clone(),
            slots,
            gathered,
        })
    }

    /// The manifest the ranks agreed on. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let tree = ScopeTree::new();
    /// let plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// assert!(plan.manifest().entries().is_empty());
    /// # Ok::<(), scopetree::ranks::Error>(())
    /// ```
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The synchronised scope. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let tree = ScopeTree::new();
    /// let plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// assert_eq!(plan.scope(), tree.root());
    /// # Ok::<(), scopetree::ranks::Error>(())
    /// ```
    pub fn scope(&self) -> ScopeId {
        self.scope
    }

    /// How many all-reduce calls one [`all_reduce`](Self::all_reduce) makes
    /// (its buckets, `f32` and `f64` together). O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![0.0_f32; 10])?;
    /// let plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new().bucket_bytes(16))?;
    /// assert_eq!(plan.reduce_buckets(), 3); // 4 + 4 + 2 elements
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce_buckets(&self) -> usize {
        self.f32s.calls() + self.f64s.calls()
    }

    /// The plan's filter, if any.
    pub(crate) fn filter(&self) -> Option<&Filter> {
        self.filter.as_ref()
    }

    /// Whether each variable, in manifest order, is flat (`Vec`, `Box`). O(1)
    /// per item.
    pub(crate) fn flat(&self) -> impl Iterator<Item = bool> + '_ {
        self.slots.iter().map(|s| s.access.flat)
    }

    /// Checks that every variable still holds its planned type and length,
    /// then exchanges the outcome with every rank. O(variables + world
    /// size); allocates only on failure.
    pub(super) fn check_slots<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &ScopeTree,
        op: &'static str,
        first: Result<(), Error>,
        same: Same,
    ) -> Result<(), Error> {
        let local = first.and_then(|()| {
            self.slots
                .iter()
                .zip(self.manifest.entries())
                .try_for_each(|(s, e)| match (s.access.bytes)(tree, s.id) {
                    Ok(b) if b.len() == s.nbytes => Ok(()),
                    Ok(b) => Err(Error::Changed {
                        key: e.key.clone(),
                        scope: self.manifest.scope().to_owned(),
                        reason: format!("{} bytes, {} when planned", b.len(), s.nbytes),
                    }),
                    Err(err) => Err(Error::Changed {
                        key: e.key.clone(),
                        scope: self.manifest.scope().to_owned(),
                        reason: err.to_string(),
                    }),
                })
        });
        settle(comm, &mut self.gathered, op, local, Some(same))
    }

    /// Copies every variable's value on rank `root` to the same variable on
    /// every rank, in manifest order, one bucket of bytes per broadcast. A
    /// collective call. O(bytes) per rank; allocates one bucket.
    ///
    /// # Errors
    /// On every rank: [`Error::ArgumentsDiffer`] when the ranks pass
    /// different roots. On a rank that passes a `root` outside the world,
    /// [`Error::BadRank`], and on a rank whose tree changed since the plan,
    /// [`Error::Changed`]; on the others [`Error::PeerFailed`]. Nothing
    /// changes then.
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![3_i64; 2])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// plan.broadcast(&SingleProcess, &mut tree, 0)?;
    /// assert!(plan.broadcast(&SingleProcess, &mut tree, 1).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn broadcast<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        root: usize,
    ) -> Result<(), Error> {
        let same: Same = ("roots", root as u64, show_count);
        self.check_slots(comm, tree, "broadcast", check_root(root, comm.size()), same)?;
        let slots = &self.slots;
        let nbytes = slots.iter().map(|s| s.nbytes);
        broadcast_values(
            comm,
            root,
            nbytes,
            self.byte_cap,
            &mut InTree { tree, slots },
        )
    }

    /// Sums (or averages, [`Reduce::Mean`]) every variable over the ranks,
    /// in place, in buckets of the plan's size: `f32` variables in manifest
    /// order, then `f64` ones. A collective call. Allocates nothing; O(bytes)
    /// per rank for the copies into and out of the buckets, plus one
    /// all-gather of 16 bytes per rank for the check and the all-reduces.
    ///
    /// The sum of each element is MPI's: with two ranks it is one rounded
    /// addition, the same on both (float addition commutes); with more ranks
    /// the grouping of the additions is the MPI library's choice, and MPI
    /// does not promise every rank the same bits (Open MPI 4.1 gave them in
    /// the crate's tests at 3 and 4 ranks), so run
    /// [`check_consistency`](Self::check_consistency) on the parameters
    /// every few steps.
    ///
    /// # Errors
    /// On every rank: [`Error::Unsupported`] when the plan holds a variable
    /// that is neither `f32` nor `f64` (build the plan on the gradients'
    /// scope); [`Error::ArgumentsDiffer`] when the ranks pass different
    /// `op`s. On a rank whose tree changed since the plan,
    /// [`Error::Changed`], and on the others [`Error::PeerFailed`]; nothing
    /// changes then.
    ///
    /// ```
    /// use scopetree::{ScopeTree, checkpoint::Tensor, ranks::{PlanOptions, Reduce, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let g = tree.var(tree.root(), "g")?;
    /// tree.set(g, Tensor::new(vec![2, 2], vec![1.0_f64, 2.0, 3.0, 4.0])?)?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// plan.all_reduce(&SingleProcess, &mut tree, Reduce::Sum)?;
    /// assert_eq!(tree.get::<Tensor<f64>>(g)?.data(), &[1.0, 2.0, 3.0, 4.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_reduce<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        op: Reduce,
    ) -> Result<(), Error> {
        self.require_floats(tree)?;
        self.check_slots(comm, tree, "all-reduce", Ok(()), op.same())?;
        let slots = &self.slots;
        let mut values = InTree { tree, slots };
        self.f32s.reduce(comm, &mut values, op)?;
        self.f64s.reduce(comm, &mut values, op)
    }

    /// [`Error::Unsupported`] naming the first variable of the plan that a
    /// reduction cannot take (not `f32` or `f64`). O(1).
    pub(super) fn require_floats(&self, tree: &ScopeTree) -> Result<(), Error> {
        match self.first_not_float {
            None => Ok(()),
            Some(i) => Err(Error::Unsupported {
                key: self.manifest.entries()[i].key.clone(),
                scope: self.manifest.scope().to_owned(),
                holds: tree.type_name(self.slots[i].id).ok().flatten(),
                wanted: FLOATS,
            }),
        }
    }

    /// This rank's digest of the variables' bytes: a hash of each value's
    /// bytes (FxHash, as [`Manifest::digest`]), then of those hashes in
    /// manifest order. Local: no collective. Allocates nothing. O(bytes).
    ///
    /// # Errors
    /// [`Error::Changed`] if a variable no longer holds its planned type and
    /// length.
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![1.0_f32; 4])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// let before = plan.digest(&tree)?;
    /// tree.get_mut::<Vec<f32>>(w)?[3] = 1.5;
    /// assert_ne!(plan.digest(&tree)?, before);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn digest(&mut self, tree: &ScopeTree) -> Result<Digest, Error> {
        for ((s, d), e) in self
            .slots
            .iter()
            .zip(&mut self.digests)
            .zip(self.manifest.entries())
        {
            let bytes = (s.access.bytes)(tree, s.id)
                .ok()
                .filter(|b| b.len() == s.nbytes)
                .ok_or_else(|| Error::Changed {
                    key: e.key.clone(),
                    scope: self.manifest.scope().to_owned(),
                    reason: "another type or length than planned".into(),
                })?;
            *d = hash_bytes(bytes);
        }
        Ok(digest_of_hashes(&self.digests))
    }

    /// Checks that every rank holds bit-identical values: the ranks
    /// all-gather the [`digest`](Self::digest) of their values; when the
    /// digests differ, each rank broadcasts its per-variable hashes in turn
    /// and every rank builds the same [`Error::Diverged`]. A collective
    /// call. Allocates nothing when the ranks agree; O(bytes + world size).
    ///
    /// # Errors
    /// On every rank: [`Error::Diverged`] naming the first variable (in
    /// manifest order) whose bytes differ and the groups of ranks that hold
    /// the same bytes there. On a rank whose tree changed since the plan,
    /// [`Error::Changed`], and on the others [`Error::PeerFailed`].
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![1.0_f32; 4])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// plan.check_consistency(&SingleProcess, &tree)?; // one rank agrees with itself
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_consistency<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &ScopeTree,
    ) -> Result<(), Error> {
        let local = self.digest(tree);
        compare_values(
            comm,
            &mut self.gathered,
            &self.digests,
            &self.manifest,
            local,
        )
    }
}

/// Starts a plan on every rank: checks the bucket size, exchanges the
/// outcome of the local work `local` (so that no rank waits for one that
/// returned) and the bucket sizes, then agrees on the manifest `of`
/// `local`'s value. Returns the value and a buffer of one digest per rank.
/// A collective call.
pub(super) fn start<C: Collective + ?Sized, T>(
    comm: &C,
    opts: &PlanOptions,
    local: Result<T, Error>,
    of: impl Fn(&T) -> &Manifest,
) -> Result<(T, Vec<Digest>), Error> {
    let local = if opts.bucket_bytes == 0 {
        Err(Error::BadOption {
            reason: "a bucket of 0 bytes; pass at least one element's size \
                     (the default is 25 MiB)"
                .into(),
        })
    } else {
        local
    };
    let mut gathered = vec![[0_u8; DIGEST_BYTES]; comm.size()];
    let same: Same = ("bucket sizes", opts.bucket_bytes as u64, show_count);
    let value = settle(comm, &mut gathered, "building the plan", local, Some(same))?;
    of(&value).agree(comm)?;
    Ok((value, gathered))
}

/// The hash of one variable's bytes, as a digest of values counts it.
pub(super) fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(bytes);
    h.finish()
}

/// The digest of the per-variable hashes `digests`.
pub(super) fn digest_of_hashes(digests: &[u64]) -> Digest {
    let mut all = FxHasher::default();
    for d in digests {
        all.write_u64(*d);
    }
    digest_parts(all.finish(), digests.len() as u64)
}

/// The consistency check across ranks once each rank has hashed its values
/// (`digests`, one per variable of `manifest`, and their digest `local`):
/// see [`SyncPlan::check_consistency`]. A collective call.
pub(super) fn compare_values<C: Collective + ?Sized>(
    comm: &C,
    gathered: &mut [Digest],
    digests: &[u64],
    manifest: &Manifest,
    local: Result<Digest, Error>,
) -> Result<(), Error> {
    let mine = settle(comm, gathered, "consistency check", local, None)?;
    comm.all_gather_digest(&mine, gathered)?;
    if gathered.iter().all(|d| *d == mine) {
        return Ok(());
    }
    // Every rank's per-variable hashes, rank by rank.
    let n = digests.len();
    let mut mine_bytes: Vec<u8> = digests.iter().flat_map(|d| d.to_le_bytes()).collect();
    let mut all: Vec<Vec<u64>> = Vec::with_capacity(comm.size());
    for r in 0..comm.size() {
        let mut buf = if r == comm.rank() {
            std::mem::take(&mut mine_bytes)
        } else {
            vec![0_u8; n * 8]
        };
        comm.broadcast_bytes(r, &mut buf)?;
        all.push(
            buf.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
        );
    }
    let first = (0..n).find(|&i| all.iter().any(|d| d[i] != all[0][i]));
    let (key, sides) = match first {
        Some(i) => {
            let mut sides: Vec<(u64, Vec<usize>)> = Vec::new();
            for (r, d) in all.iter().enumerate() {
                match sides.iter_mut().find(|(h, _)| *h == d[i]) {
                    Some((_, ranks)) => ranks.push(r),
                    None => sides.push((d[i], vec![r])),
                }
            }
            let sides = sides
                .into_iter()
                .map(|(h, ranks)| (format!("bytes with hash {h:#018x}"), ranks))
                .collect();
            (manifest.entries()[i].key.clone(), sides)
        }
        // Unreachable while every rank runs one build: equal
        // per-variable hashes make equal digests.
        None => (
            "(no single variable: the digests differ)".to_owned(),
            vec![("another digest".to_owned(), (0..comm.size()).collect())],
        ),
    };
    Err(Error::Diverged {
        scope: manifest.scope().to_owned(),
        key,
        sides,
    })
}

/// An argument every rank must pass alike: its name, its value here, and
/// how to show a value.
pub(crate) type Same = (&'static str, u64, fn(u64) -> String);

/// Tells every rank whether `local` failed here, and learns where it failed
/// elsewhere: this rank's error if it failed, else [`Error::PeerFailed`]
/// naming the ranks that failed, else [`Error::ArgumentsDiffer`] when the
/// ranks passed different values of `same`, else the value. A collective
/// call (one all-gather of 16 bytes per rank). Allocates only on failure.
pub(crate) fn settle<C: Collective + ?Sized, T>(
    comm: &C,
    gathered: &mut [Digest],
    op: &'static str,
    local: Result<T, Error>,
    same: Option<Same>,
) -> Result<T, Error> {
    let mut mine = [0_u8; DIGEST_BYTES];
    mine[0] = u8::from(local.is_err());
    if let Some((_, v, _)) = same {
        mine[8..].copy_from_slice(&v.to_le_bytes());
    }
    comm.all_gather_digest(&mine, gathered)?;
    let value = local?;
    if gathered.iter().any(|d| d[0] != 0) {
        return Err(Error::PeerFailed {
            op,
            ranks: (0..gathered.len())
                .filter(|&r| gathered[r][0] != 0)
                .collect(),
        });
    }
    if let Some((what, _, show)) = same {
        if gathered.iter().any(|d| d[8..] != mine[8..]) {
            let mut sides: Vec<(u64, Vec<usize>)> = Vec::new();
            for (r, d) in gathered.iter().enumerate() {
                let v = u64::from_le_bytes(d[8..].try_into().unwrap_or_default());
                match sides.iter_mut().find(|(x, _)| *x == v) {
                    Some((_, ranks)) => ranks.push(r),
                    None => sides.push((v, vec![r])),
                }
            }
            return Err(Error::ArgumentsDiffer {
                op,
                what,
                sides: sides.into_iter().map(|(v, r)| (show(v), r)).collect(),
            });
        }
    }
    Ok(value)
}

/// A count as a message shows it.
pub(crate) fn show_count(v: u64) -> String {
    v.to_string()
}

impl Reduce {
    /// The reduction as an argument every rank must pass alike.
    pub(super) fn same(self) -> Same {
        let code = match self {
            Reduce::Sum => 0,
            Reduce::Mean => 1,
        };
        ("reductions", code, show_reduce)
    }
}

/// A [`Reduce`] sent as a number, as a message shows it.
pub(super) fn show_reduce(v: u64) -> String {
    match v {
        0 => "Reduce::Sum".to_owned(),
        1 => "Reduce::Mean".to_owned(),
        _ => format!("an unknown reduction ({v})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank `rank` of a world whose other ranks' all-gather contributions
    /// are `theirs` (this rank's slot is filled with what it sends).
    struct Scripted {
        rank: usize,
        theirs: Vec<Digest>,
    }

    impl Collective for Scripted {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.theirs.len()
        }
        fn all_reduce_sum_f32(&self, _: &[f32], _: &mut [f32]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn all_reduce_sum_f64(&self, _: &[f64], _: &mut [f64]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn reduce_scatter_sum_f32(&self, _: &[f32], _: &mut [f32]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn reduce_scatter_sum_f64(&self, _: &[f64], _: &mut [f64]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn all_gather_bytes(&self, _: &[u8], _: &mut [u8]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn broadcast_bytes(&self, _: usize, _: &mut [u8]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn all_gather_digest(&self, mine: &Digest, all: &mut [Digest]) -> Result<(), Error> {
            all.copy_from_slice(&self.theirs);
            all[self.rank] = *mine;
            Ok(())
        }
        fn barrier(&self) -> Result<(), Error> {
            Ok(())
        }
    }

    fn sent(failed: bool, value: u64) -> Digest {
        let mut d = [0_u8; DIGEST_BYTES];
        d[0] = u8::from(failed);
        d[8..].copy_from_slice(&value.to_le_bytes());
        d
    }

    #[test]
    fn differing_arguments_name_who_passed_what_on_every_rank() {
        let theirs = vec![
            sent(false, 0),
            sent(false, 0),
            sent(false, 1),
            sent(false, 0),
        ];
        let mut gathered = vec![[0_u8; DIGEST_BYTES]; 4];
        let mut messages = Vec::new();
        for (rank, mine) in [(0, 0), (2, 1)] {
            let comm = Scripted {
                rank,
                theirs: theirs.clone(),
            };
            let same: Same = ("roots", mine, show_count);
            let err = settle(&comm, &mut gathered, "broadcast", Ok(()), Some(same)).unwrap_err();
            messages.push(err.to_string());
        }
        assert_eq!(messages[0], messages[1]);
        assert_eq!(
            messages[0],
            "broadcast: ranks passed different roots: 0 on ranks 0-1, 3; 1 on rank 2; \
             pass the same on every rank"
        );
    }

    #[test]
    fn a_failure_elsewhere_comes_before_differing_arguments() {
        let theirs = vec![sent(false, 0), sent(true, 1)];
        let mut gathered = vec![[0_u8; DIGEST_BYTES]; 2];
        let comm = Scripted { rank: 0, theirs };
        let same: Same = ("reductions", 0, show_reduce);
        let err = settle(&comm, &mut gathered, "all-reduce", Ok(()), Some(same)).unwrap_err();
        assert!(matches!(err, Error::PeerFailed { ref ranks, .. } if ranks == &[1]));
        assert_eq!(
            err.to_string(),
            "all-reduce failed on rank 1 (see the error there); this rank stopped with it and \
             changed nothing"
        );
        let theirs = vec![sent(false, 0), sent(false, 1)];
        let comm = Scripted { rank: 0, theirs };
        let err = settle(&comm, &mut gathered, "all-reduce", Ok(()), Some(same)).unwrap_err();
        assert!(
            err.to_string()
                .contains("Reduce::Sum on rank 0; Reduce::Mean on rank 1")
        );
        // Agreeing ranks pass.
        let comm = Scripted {
            rank: 0,
            theirs: vec![sent(false, 0), sent(false, 0)],
        };
        assert!(settle(&comm, &mut gathered, "all-reduce", Ok(7), Some(same)).is_ok());
    }
}
