//! [`LoadOptions`] and [`DtypePolicy`]: which disagreements a load
//! accepts, what it creates, how it converts dtypes.

use crate::checkpoint::Filter;
use crate::checkpoint::Separator;
use crate::checkpoint::checkpointable::Checkpointable;
use crate::checkpoint::codec::Codec;
use crate::checkpoint::dtype::{Dtype, FloatDtype};
use crate::checkpoint::float_convert::is_convertible_float;
use crate::checkpoint::known_types::{Types, default_codec};

/// The staging budget of a load when its options name none: 256 MiB (see
/// [`LoadOptions::staging_budget`]).
///
/// ```
/// assert_eq!(scopetree::checkpoint::DEFAULT_STAGING_BUDGET, 256 << 20);
/// ```
pub const DEFAULT_STAGING_BUDGET: usize = 256 << 20;

/// Whether a load accepts a file tensor of another dtype than the variable.
///
/// ```
/// use scopetree::checkpoint::{DtypePolicy, LoadOptions};
/// let _ = LoadOptions::new().dtype_policy(DtypePolicy::Convert);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DtypePolicy {
    /// The dtypes must be equal (the default).
    #[default]
    Exact,
    /// Float dtypes (`F16`, `BF16`, `F32`, `F64`) convert to the variable's
    /// float dtype, rounding to nearest, ties to even; any other difference
    /// is a mismatch.
    Convert,
}

/// How to load: which disagreements to accept, whether to create variables,
/// the dtype policy, the key separator and extra types.
///
/// ```
/// use scopetree::checkpoint::LoadOptions;
/// let opts = LoadOptions::new().allow_missing(true).allow_unused(true);
/// # let _ = opts;
/// ```
#[derive(Clone)]
pub struct LoadOptions {
    pub(super) sep: Separator,
    pub(super) allow_missing: bool,
    pub(super) allow_unused: bool,
    pub(super) create: bool,
    pub(super) create_shaped: bool,
    pub(super) dtype: DtypePolicy,
    pub(crate) rollback: bool,
    pub(super) create_floats: Option<Dtype>,
    pub(super) types: Types,
    pub(super) filter: Option<Filter>,
    /// The codec of the values a load creates, by dtype, when not the
    /// crate's default (`Vec`/`Tensor`); the candle store makes `Var`s.
    pub(crate) create_with: Option<fn(Dtype) -> Option<Codec>>,
    /// The most bytes a staged load (a candle store's) holds in staging
    /// buffers at once.
    pub(crate) staging: usize,
    /// How many threads read a staged load's files; 0: as many as the
    /// machine has cores, at most 8.
    pub(crate) readers: usize,
    /// Whether the checksums of the tensors a staged load writes in place
    /// were verified by the caller just before (the ranks' sharded load
    /// verifies every rank's part first, then loads): the load skips its
    /// own first pass over them.
    #[cfg_attr(not(feature = "candle"), allow(dead_code))]
    pub(crate) sums_verified: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("separator", &self.sep)
            .field("allow_missing", &self.allow_missing)
            .field("allow_unused", &self.allow_unused)
            .field("create", &self.create)
            .field("create_shaped", &self.create_shaped)
            .field("dtype", &self.dtype)
            .field("rollback", &self.rollback)
            .field("create_floats_as", &self.create_floats)
            .field("staging_budget", &self.staging)
            .field("readers", &self.readers)
            .finish_non_exhaustive()
    }
}

impl LoadOptions {
    /// The codec of a value this load creates for a file tensor of `dtype`,
    /// and the float dtype to convert it to first, if any. Inlined into the
    /// load's checks, as when both lived in one module.
    #[inline]
    pub(super) fn create_codec(&self, dtype: Dtype) -> Option<(Codec, Option<Dtype>)> {
        let convert_to = self
            .create_floats
            .filter(|&to| to != dtype && is_convertible_float(dtype));
        let made = convert_to.unwrap_or(dtype);
        let codec = match self.create_with {
            Some(f) => f(made),
            None => default_codec(made, self.create_shaped),
        };
        codec.map(|c| (c, convert_to))
    }

    /// Strict: every variable in the file, every file key in the tree,
    /// equal shapes and dtypes; `/` keys; values that fit overwritten in
    /// place (see [`rollback`](Self::rollback)). O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new();
    /// ```
    pub fn new() -> Self {
        Self {
            sep: Separator::Slash,
            allow_missing: false,
            allow_unused: false,
            create: false,
            create_shaped: false,
            dtype: DtypePolicy::Exact,
            rollback: false,
            create_floats: None,
            types: Types::builtin(),
            filter: None,
            create_with: None,
            staging: DEFAULT_STAGING_BUDGET,
            readers: 0,
            sums_verified: false,
        }
    }

    /// The key separator the file uses (`/` by default). O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::{LoadOptions, Separator};
    /// let _ = LoadOptions::new().separator(Separator::Dot);
    /// ```
    pub fn separator(mut self, sep: Separator) -> Self {
        self.sep = sep;
        self
    }

    /// Accept tree variables the file does not hold; they keep their values
    /// and the report lists them as missing. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().allow_missing(true);
    /// ```
    pub fn allow_missing(mut self, allow: bool) -> Self {
        self.allow_missing = allow;
        self
    }

    /// Accept file keys that name no tree variable; they are skipped and the
    /// report lists them as unused. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().allow_unused(true);
    /// ```
    pub fn allow_unused(mut self, allow: bool) -> Self {
        self.allow_unused = allow;
        self
    }

    /// Create the scopes and variables that file keys name and the tree
    /// lacks (loading before the model is built). New variables hold a
    /// `Vec<E>` of the file's dtype, or a [`Tensor<E>`](crate::checkpoint::Tensor) with
    /// [`create_shaped`](Self::create_shaped). O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().create(true);
    /// ```
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Variables that [`create`](Self::create) makes, and variables without
    /// a value, get a [`Tensor<E>`](crate::checkpoint::Tensor) (keeping the file's
    /// shape) instead of a `Vec<E>`. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().create(true).create_shaped(true);
    /// ```
    pub fn create_shaped(mut self, shaped: bool) -> Self {
        self.create_shaped = shaped;
        self
    }

    /// The dtype policy ([`DtypePolicy::Exact`] by default). O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::{DtypePolicy, LoadOptions};
    /// let _ = LoadOptions::new().dtype_policy(DtypePolicy::Convert);
    /// ```
    pub fn dtype_policy(mut self, policy: DtypePolicy) -> Self {
        self.dtype = policy;
        self
    }

    /// Whether a read error of the disk, after every check has passed,
    /// must leave the tree as it was (`false` by default).
    ///
    /// Every load first checks the whole header against the tree (names,
    /// shapes, dtypes, byte ranges against the file's length), then reads
    /// every value that needs new memory (created variables, converted
    /// dtypes, types of your own) before changing anything: a bad file or a
    /// value its type rejects changes nothing, whatever this option says.
    /// By default a value of the crate's types whose dtype and size already
    /// fit is then overwritten in place, with no extra memory; only a read
    /// error in that pass (the disk failing, not the file's content) can
    /// leave the tree partly loaded, and [`Error::Data`](crate::checkpoint::Error::Data) says so.
    /// `rollback(true)` reads every tensor into new memory first, so even
    /// that leaves the tree unchanged, at the price of about the file's
    /// size in extra memory and the time to fault it in (see
    /// `docs/checkpoints.md`). O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().rollback(true);
    /// ```
    pub fn rollback(mut self, rollback: bool) -> Self {
        self.rollback = rollback;
        self
    }

    /// Only keys for which `keep` returns `true` are loaded; on both sides of the load, other keys are neither missing nor unused. O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::LoadOptions;
    /// // Only the parameters and the optimizer state, not scratch buffers.
    /// let _ = LoadOptions::new().filter(|key| !key.contains('/') || key.starts_with("optim/"));
    /// ```
    pub fn filter(mut self, keep: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.filter = Some(std::sync::Arc::new(keep));
        self
    }

    /// Loads into values of a [`Checkpointable`] type of your own too. O(1).
    ///
    /// ```
    /// // See `SaveOptions::with_type` for a whole custom type.
    /// let _ = scopetree::checkpoint::LoadOptions::new().with_type::<Vec<f32>>();
    /// ```
    pub fn with_type<T: Checkpointable>(mut self) -> Self {
        self.types.add::<T>();
        self
    }

    /// Values this load makes (variables it [creates](Self::create), and
    /// variables that had no value) for a float tensor of the file hold
    /// `dtype` instead of the file's dtype: a `BF16` or `F16` checkpoint
    /// loads into `f32` values with `create_floats_as(FloatDtype::F32)`.
    /// Values that already exist convert under [`DtypePolicy::Convert`].
    /// Rounds to nearest, ties to even; non-float tensors keep their dtype.
    /// O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::{FloatDtype, LoadOptions};
    /// let _ = LoadOptions::new().create(true).create_floats_as(FloatDtype::F32);
    /// ```
    pub fn create_floats_as(mut self, dtype: FloatDtype) -> Self {
        self.create_floats = Some(dtype.dtype());
        self
    }

    /// The most host memory a staged load holds in staging buffers at once
    /// ([`DEFAULT_STAGING_BUDGET`](crate::checkpoint::DEFAULT_STAGING_BUDGET),
    /// 256 MiB, by default). A candle store's loads read the checkpoint
    /// through two buffers of half the budget each, pinned for a CUDA
    /// device: the readers fill one while the other is copied to the
    /// tensors' device, so the load's host memory is the budget whatever
    /// the model's size (a tensor larger than a buffer is read in pieces).
    /// A smaller budget costs speed, not correctness; a budget under 128
    /// KiB counts as 128 KiB. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().staging_budget(64 << 20);
    /// ```
    pub fn staging_budget(mut self, bytes: usize) -> Self {
        self.staging = bytes;
        self
    }

    /// How many threads read a staged load's files at once (by default as
    /// many as the machine has cores, at most 8). Each window of the
    /// checkpoint is split among them by byte range, across shards and
    /// within large tensors. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().readers(4);
    /// ```
    pub fn readers(mut self, threads: usize) -> Self {
        self.readers = threads;
        self
    }

    /// The number of reader threads a staged load uses.
    #[cfg(feature = "candle")]
    pub(crate) fn reader_threads(&self) -> usize {
        if self.readers > 0 {
            return self.readers;
        }
        std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
    }

    /// Registers `T`, a type the crate implements [`Checkpointable`] for
    /// (candle's `Var`), as one of its own: by default a load assigns it in
    /// the in-place pass, one tensor at a time (see
    /// [`rollback`](Self::rollback)).
    #[cfg(feature = "candle")]
    pub(crate) fn with_crate_type<T: Checkpointable>(mut self) -> Self {
        self.types.add_builtin::<T>();
        self
    }
}
