//! [`SyncPlan`]: the variables of one scope, agreed between ranks once,
//! then broadcast, all-reduced in buckets and checked by digest as often as
//! needed, with every buffer reused. Every collective call is watched by
//! the watchdog with the plan's timeout.

use std::sync::Arc;
use std::time::Duration;

use super::agree::{Same, settle, show_count, start};
use super::bucketed::{Lane, broadcast_values};
use super::consistency::compare_values;
use super::options::{PlanOptions, Reduce};
use super::scatter::ZeroBuffers;
use crate::checkpoint::{Dtype, Filter};
use crate::ranks::error::Error;
use crate::ranks::layout::partition::Partition;
use crate::ranks::layout::sliced::StateLayout;
use crate::ranks::transport::collective::{Collective, Digest, check_root};
use crate::ranks::transport::watchdog::Watch;
use crate::ranks::vars::access::FLOATS;
use crate::ranks::vars::checksum::{VarHash, digest_of_hashes, hash_bytes};
use crate::ranks::vars::manifest::{Bound, Manifest, bind, bind_store};
use crate::ranks::vars::values::{InTree, Slot};
use crate::sharing::VariableStore;
use crate::{ScopeId, ScopeTree};

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
/// Every call is watched with the plan's [timeout](PlanOptions::timeout)
/// (10 minutes by default): a rank still waiting in it then ends its
/// process (see [`Watch`]).
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
    pub(in crate::ranks) manifest: Manifest,
    scope: ScopeId,
    /// The variables' filter, which the plan's checkpoints use too.
    filter: Option<Filter>,
    /// The variables the plan synchronises but its checkpoints leave out.
    scratch: Option<Filter>,
    pub(in crate::ranks) slots: Vec<Slot>,
    /// The first variable that is neither `f32` nor `f64`.
    pub(in crate::ranks) first_not_float: Option<usize>,
    /// Each rank's slice of the variables (ZeRO stage 1).
    pub(in crate::ranks) partition: Partition,
    /// The optimizer state the ranks hold sliced, if any.
    pub(in crate::ranks) state: Option<StateLayout>,
    /// The buffers of the partitioned exchange, made by its first call.
    pub(in crate::ranks) zero: ZeroBuffers,
    f32s: Lane<f32>,
    f64s: Lane<f64>,
    byte_cap: usize,
    /// Per-variable digests of the last consistency check.
    digests: Vec<VarHash>,
    /// One digest per rank, for status exchanges and checks.
    gathered: Vec<Digest>,
    /// What the watchdog names (``scope `optim` ``), and the calls' timeout.
    watched: Arc<str>,
    timeout: Option<Duration>,
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
        let watched = watched(bound.as_ref().map_or("", |b| b.manifest.scope()));
        let _watch = Watch::arm(comm.rank(), "building the plan", &watched, opts.timeout);
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
        let state = opts
            .sliced
            .clone()
            .map(|spec| StateLayout::new(spec, &bound.manifest, comm.size()))
            .transpose()?;
        Ok(Self {
            partition,
            state,
            zero: ZeroBuffers::new(opts),
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
            scratch: opts.scratch.clone(),
            slots,
            gathered,
            watched,
            timeout: opts.timeout,
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

    /// The bytes of the plan's variable `i`, checked against the plan.
    /// O(1); allocates nothing.
    ///
    /// # Errors
    /// [`Error::Changed`] when it no longer holds its planned type and
    /// length.
    pub(in crate::ranks) fn slot_bytes<'t>(
        &self,
        tree: &'t ScopeTree,
        i: usize,
    ) -> Result<&'t [u8], Error> {
        let s = self.slots[i];
        match (s.access.bytes)(tree, s.id) {
            Ok(b) if b.len() == s.nbytes => Ok(b),
            _ => Err(Error::Changed {
                key: self.manifest.entries()[i].key.clone(),
                scope: self.manifest.scope().to_owned(),
                reason: "another type or length than planned".into(),
            }),
        }
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

    /// The partition of the plan's [sliced state](crate::ranks::SlicedState)
    /// across the ranks: rank `r` holds, for each of its
    /// [`pieces`](Partition::pieces), that piece of every state tensor of
    /// the variable the piece names (an index among the variables that
    /// carry state, in manifest order). It equals
    /// [`partition`](Self::partition) when every variable carries state.
    /// `None` without sliced state. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SlicedState, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![0.0_f32; 4])?;
    /// let plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// assert!(plan.state_partition().is_none());
    /// let state = SlicedState::new(tree.root(), ["@M"]);
    /// let opts = PlanOptions::new().sliced_state(state);
    /// let plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &opts)?;
    /// assert_eq!(plan.state_partition(), Some(plan.partition()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn state_partition(&self) -> Option<&Partition> {
        self.state.as_ref().map(|s| &s.partition)
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

    /// The keys the plan's checkpoints hold: those its filter keeps and
    /// that are not scratch (see [`PlanOptions::scratch`]); `None` for all.
    /// O(1).
    pub(crate) fn saved_keys(&self) -> Option<Filter> {
        match (&self.filter, &self.scratch) {
            (keep, None) => keep.clone(),
            (keep, Some(scratch)) => {
                let (keep, scratch) = (keep.clone(), scratch.clone());
                Some(std::sync::Arc::new(move |key: &str| {
                    keep.as_ref().is_none_or(|keep| keep(key)) && !scratch(key)
                }))
            }
        }
    }

    /// The most bytes one broadcast of the plan moves. O(1).
    pub(in crate::ranks) fn byte_cap(&self) -> usize {
        self.byte_cap
    }

    /// Whether the plan's variable `key` is scratch. O(1) plus the
    /// predicate.
    pub(crate) fn is_scratch(&self, key: &str) -> bool {
        self.scratch.as_ref().is_some_and(|scratch| scratch(key))
    }

    /// Whether each variable, in manifest order, is flat (`Vec`, `Box`). O(1)
    /// per item.
    pub(crate) fn flat(&self) -> impl Iterator<Item = bool> + '_ {
        self.slots.iter().map(|s| s.access.flat)
    }

    /// Checks that every variable still holds its planned type and length,
    /// then exchanges the outcome with every rank. O(variables + world
    /// size); allocates only on failure.
    pub(in crate::ranks) fn check_slots<C: Collective + ?Sized>(
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
        let _watch = self.watch(comm, "broadcast");
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
        let _watch = self.watch(comm, "all-reduce");
        self.require_floats(tree)?;
        self.check_slots(comm, tree, "all-reduce", Ok(()), op.same())?;
        let slots = &self.slots;
        let mut values = InTree { tree, slots };
        self.f32s.reduce(comm, &mut values, op)?;
        self.f64s.reduce(comm, &mut values, op)
    }

    /// [`Error::Unsupported`] naming the first variable of the plan that a
    /// reduction cannot take (not `f32` or `f64`). O(1).
    pub(in crate::ranks) fn require_floats(&self, tree: &ScopeTree) -> Result<(), Error> {
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
    /// bytes (xxh3-128, a checksum, as [`Manifest::digest`]), then of those hashes in
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
        for i in 0..self.slots.len() {
            self.digests[i] = hash_bytes(self.slot_bytes(tree, i)?);
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
        let _watch = self.watch(comm, "consistency check");
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

/// What the watchdog names for a plan of the scope at `path`.
fn watched(path: &str) -> Arc<str> {
    if path.is_empty() {
        "the root scope".into()
    } else {
        format!("scope `{path}`").into()
    }
}
