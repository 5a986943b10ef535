//! What every rank passes to a plan: the bucket size, the filter of the
//! plan's variables, the timeout of its calls, and how gradients are
//! combined ([`Reduce`]).

use std::time::Duration;

use crate::checkpoint::Filter;
use crate::ranks::layout::sliced::SlicedState;
use crate::ranks::transport::watchdog::DEFAULT_TIMEOUT;

/// The default bucket size: 2 MiB, chosen by measurement (the bucket sweep
/// of `docs/benchmarks.md`: raw MPI in chunks of 1 to 4 MiB was the
/// fastest way to move 100 MB here, over shared memory and over TCP).
/// PyTorch DDP's 25 MiB is made for GPUs over NCCL; raise it for few large
/// messages over a slow network (see `docs/ranks/all-reduce.md`).
///
/// ```
/// assert_eq!(scopetree::ranks::DEFAULT_BUCKET_BYTES, 2 * 1024 * 1024);
/// ```
pub const DEFAULT_BUCKET_BYTES: usize = 2 << 20;

/// The default size from which an all-reduce sends a variable straight
/// from its own buffer, with no bucket copy: see
/// [`PlanOptions::direct_bytes`].
///
/// ```
/// assert!(scopetree::ranks::DEFAULT_DIRECT_BYTES > 0);
/// ```
pub const DEFAULT_DIRECT_BYTES: usize = 64 << 10;

/// The default number of bucket buffer pairs: see
/// [`PlanOptions::bucket_buffers`].
///
/// ```
/// assert!(scopetree::ranks::DEFAULT_BUCKET_BUFFERS >= 1);
/// ```
pub const DEFAULT_BUCKET_BUFFERS: usize = 1;

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

/// Options of a [`SyncPlan`](crate::ranks::SyncPlan).
///
/// ```
/// use scopetree::ranks::{PlanOptions, DEFAULT_BUCKET_BYTES};
/// assert_eq!(PlanOptions::new().bucket_bytes_value(), DEFAULT_BUCKET_BYTES);
/// assert_eq!(PlanOptions::new().bucket_bytes(4096).bucket_bytes_value(), 4096);
/// ```
#[derive(Clone)]
pub struct PlanOptions {
    pub(in crate::ranks) bucket_bytes: usize,
    pub(in crate::ranks) filter: Option<Filter>,
    pub(in crate::ranks) scratch: Option<Filter>,
    pub(in crate::ranks) timeout: Option<Duration>,
    pub(in crate::ranks) sliced: Option<SlicedState>,
    pub(in crate::ranks) direct_bytes: usize,
    pub(in crate::ranks) bucket_buffers: usize,
}

impl std::fmt::Debug for PlanOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanOptions")
            .field("bucket_bytes", &self.bucket_bytes)
            .field("filter", &self.filter.is_some())
            .field("scratch", &self.scratch.is_some())
            .field("timeout", &self.timeout)
            .field("sliced", &self.sliced)
            .field("direct_bytes", &self.direct_bytes)
            .field("bucket_buffers", &self.bucket_buffers)
            .finish()
    }
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl PlanOptions {
    /// Buckets of [`DEFAULT_BUCKET_BYTES`], calls watched with a timeout of
    /// [`DEFAULT_TIMEOUT`]. O(1).
    ///
    /// ```
    /// let _ = scopetree::ranks::PlanOptions::new();
    /// ```
    pub fn new() -> Self {
        Self {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            filter: None,
            scratch: None,
            timeout: Some(DEFAULT_TIMEOUT),
            sliced: None,
            direct_bytes: DEFAULT_DIRECT_BYTES,
            bucket_buffers: DEFAULT_BUCKET_BUFFERS,
        }
    }

    /// Only the variables whose full name (relative to the plan's scope,
    /// joined by `/`) `keep` accepts belong to the plan, as
    /// [`SaveOptions::filter`](crate::checkpoint::SaveOptions::filter) keeps
    /// keys: for example the gradients among an optimizer's state, or the
    /// parameters and optimizer state without the workers' scratch. The
    /// plan's checkpoints ([`SyncPlan::save_on_root`](crate::ranks::SyncPlan::save_on_root),
    /// [`SyncPlan::load_on_all`](crate::ranks::SyncPlan::load_on_all)) use the same filter. O(1).
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

    /// Marks the plan's variables whose full name `is_scratch` accepts as
    /// scratch: the plan synchronises them like the others (broadcast,
    /// all-reduce, consistency check), but its checkpoints
    /// ([`SyncPlan::save_on_root`](crate::ranks::SyncPlan::save_on_root), [`SyncPlan::load_on_all`](crate::ranks::SyncPlan::load_on_all)) leave them
    /// out, so that a checkpoint holds what a resume needs and nothing
    /// transient. Gradients (Paddle's `@GRAD` suffix) are the usual scratch:
    /// under ZeRO each rank holds partly reduced sums there, so saving them
    /// would make two runs with the same state write different files. The
    /// default marks nothing. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let optim = tree.new_named_scope(tree.root(), "optim")?;
    /// for name in ["w@GRAD", "w@M"] {
    ///     let v = tree.var(optim, name)?;
    ///     tree.set(v, vec![0.0_f32; 2])?;
    /// }
    /// let opts = PlanOptions::new().scratch(|key| key.ends_with("@GRAD"));
    /// let plan = SyncPlan::new(&SingleProcess, &tree, optim, &opts)?;
    /// assert_eq!(plan.manifest().entries().len(), 2); // synchronised: both
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("state.safetensors");
    /// plan.save_on_root(&SingleProcess, &tree, &path, 0, &Default::default())?;
    /// let saved = scopetree::checkpoint::inspect(&path)?;
    /// assert_eq!(saved.len(), 1); // saved: only `w@M`
    /// assert_eq!(saved[0].key, "w@M");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn scratch(mut self, is_scratch: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.scratch = Some(std::sync::Arc::new(is_scratch));
        self
    }

    /// Optimizer state that the ranks hold sliced (ZeRO stage 1), saved and
    /// loaded with the plan's variables: see [`SlicedState`]. The plan's
    /// [`state_partition`](crate::ranks::SyncPlan::state_partition) says which
    /// piece of each tensor each rank holds;
    /// [`save_shards`](crate::ranks::SyncPlan::save_shards) writes the state as
    /// whole tensors under an index of its own, and
    /// [`load_shards`](crate::ranks::SyncPlan::load_shards) cuts it again for the
    /// loading ranks. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SlicedState}};
    /// let mut tree = ScopeTree::new();
    /// let optim = tree.new_named_scope(tree.root(), "optim")?;
    /// let opts = PlanOptions::new().sliced_state(SlicedState::new(optim, ["@M", "@V"]));
    /// assert!(format!("{opts:?}").contains("@M"));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn sliced_state(mut self, state: SlicedState) -> Self {
        self.sliced = Some(state);
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

    /// The longest a collective call of the plan may take (default
    /// [`DEFAULT_TIMEOUT`], 10 minutes): a call still running when it has
    /// passed ends the process, after one line on stderr that names the
    /// rank, the call, the scope and the step (see [`Watch`](crate::ranks::Watch)),
    /// so that `mpirun` ends the job instead of hanging on a stalled rank.
    /// It covers the whole call, the local work included (a root's write
    /// in [`save_on_root`](crate::ranks::SyncPlan::save_on_root) while the other
    /// ranks wait): set it above the longest such call. A timeout of zero is
    /// [`Error::BadOption`](crate::ranks::Error::BadOption) when the plan is built.
    /// O(1).
    ///
    /// ```
    /// use std::time::Duration;
    /// use scopetree::ranks::{DEFAULT_TIMEOUT, PlanOptions};
    /// assert_eq!(PlanOptions::new().timeout_value(), Some(DEFAULT_TIMEOUT));
    /// let o = PlanOptions::new().timeout(Duration::from_secs(30));
    /// assert_eq!(o.timeout_value(), Some(Duration::from_secs(30)));
    /// ```
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// No timeout: the plan's calls wait as long as MPI does (for ever,
    /// when a rank stalls). O(1).
    ///
    /// ```
    /// let o = scopetree::ranks::PlanOptions::new().without_timeout();
    /// assert_eq!(o.timeout_value(), None);
    /// ```
    #[must_use]
    pub fn without_timeout(mut self) -> Self {
        self.timeout = None;
        self
    }

    /// The timeout set, `None` without one. O(1).
    ///
    /// ```
    /// use std::time::Duration;
    /// let o = scopetree::ranks::PlanOptions::new().timeout(Duration::from_millis(1500));
    /// assert_eq!(o.timeout_value(), Some(Duration::from_millis(1500)));
    /// ```
    pub fn timeout_value(&self) -> Option<Duration> {
        self.timeout
    }

    /// Whether the plan keeps the variable `key` (no filter keeps all). O(filter).
    #[cfg(feature = "candle")]
    pub(in crate::ranks) fn keeps(&self, key: &str) -> bool {
        self.filter.as_ref().is_none_or(|keep| keep(key))
    }

    /// The bucket capacity in elements of `size` bytes. O(1).
    /// The size from which an all-reduce sends a variable straight from
    /// its own buffer: a variable of at least `bytes` bytes is reduced from
    /// its buffer into a spare buffer of the same size that the plan keeps
    /// (in calls of at most a bucket), and the two are swapped, with no copy
    /// in or out of a bucket; smaller variables share fused buckets. The
    /// plan's spare buffers take as much memory as its direct variables.
    /// `usize::MAX` fuses every variable. O(1).
    ///
    /// ```
    /// use scopetree::ranks::{DEFAULT_DIRECT_BYTES, PlanOptions};
    /// assert_eq!(PlanOptions::new().direct_bytes_value(), DEFAULT_DIRECT_BYTES);
    /// assert_eq!(PlanOptions::new().direct_bytes(1 << 20).direct_bytes_value(), 1 << 20);
    /// ```
    #[must_use]
    pub fn direct_bytes(mut self, bytes: usize) -> Self {
        self.direct_bytes = bytes;
        self
    }

    /// The number of bucket buffer pairs (send and receive) of an
    /// all-reduce's fused buckets, 1 to 8. With 1, one bucket at a time:
    /// fill, sum, drain. With 2 or more, over MPI, each bucket's transfer
    /// is a non-blocking `MPI_Iallreduce` that overlaps the copies of the
    /// buckets around it; `2·W` pairs keep up to `W` transfers in flight.
    /// Each pair costs two buckets of memory. The ranks must pass the same
    /// number. O(1).
    ///
    /// ```
    /// use scopetree::ranks::{DEFAULT_BUCKET_BUFFERS, PlanOptions};
    /// assert_eq!(PlanOptions::new().bucket_buffers_value(), DEFAULT_BUCKET_BUFFERS);
    /// assert_eq!(PlanOptions::new().bucket_buffers(1).bucket_buffers_value(), 1);
    /// ```
    #[must_use]
    pub fn bucket_buffers(mut self, pairs: usize) -> Self {
        self.bucket_buffers = pairs;
        self
    }

    /// The number of bucket buffer pairs (see
    /// [`bucket_buffers`](Self::bucket_buffers)). O(1).
    ///
    /// ```
    /// assert!(scopetree::ranks::PlanOptions::new().bucket_buffers_value() >= 1);
    /// ```
    pub fn bucket_buffers_value(&self) -> usize {
        self.bucket_buffers
    }

    /// The size from which variables are sent from their own buffers (see
    /// [`direct_bytes`](Self::direct_bytes)). O(1).
    ///
    /// ```
    /// assert!(scopetree::ranks::PlanOptions::new().direct_bytes_value() > 0);
    /// ```
    pub fn direct_bytes_value(&self) -> usize {
        self.direct_bytes
    }

    pub(in crate::ranks) fn cap(&self, size: usize) -> usize {
        (self.bucket_bytes / size).clamp(1, MAX_COUNT)
    }
}
