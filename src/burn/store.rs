//! [`CheckpointStore`]: where it saves and loads, and its options.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use burn_store::burn_pack::Tensor as PackTensor;
use burn_store::{KeyRemapper, ModuleAdapter, PathFilter};

use super::error::{Error, cut};
use crate::checkpoint::{DEFAULT_MAX_SHARD_SIZE, DtypePolicy, FloatDtype};

/// Where a store saves: one file, or a sharded checkpoint in a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    File,
    Sharded,
}

/// A burn-store [`ModuleStore`](burn_store::ModuleStore) backed by
/// scopetree checkpoints: `model.save_into(&mut store)` and
/// `model.load_from(&mut store)` write and read safetensors files and
/// sharded Hugging Face checkpoints.
///
/// - **Save** ([`from_file`](Self::from_file): one file;
///   [`sharded`](Self::sharded): `model-0000k-of-0000n.safetensors` shards
///   of at most [`max_shard_size`](Self::max_shard_size) bytes and
///   `model.safetensors.index.json`). Floats keep their dtype or are
///   written in bf16 / f16, correctly rounded
///   ([`floats_as`](Self::floats_as)). Every file is written to a
///   temporary file and renamed, the index last; the files record the
///   xxh3-128 of the tensors and their burn `ParamId`s. Each tensor is
///   read back from its device only while it is written.
/// - **Load**, from a file, an index or its directory, is strict and
///   atomic: every header is checked and every module tensor matched by
///   name, shape and dtype before anything changes, and one
///   [`Error::Mismatch`] names every problem.
///   [`allow_missing`](Self::allow_missing) and
///   [`allow_unused`](Self::allow_unused) relax it as in
///   [`LoadOptions`](crate::checkpoint::LoadOptions). Shards are then read
///   one at a time, each checked against its checksums (on a second thread,
///   overlapping the reads) before any of its tensors is applied: memory is
///   the module plus one shard.
/// - **Names**: a [`PathFilter`], [`KeyRemapper`] patterns and the
///   adapters of burn-store ([`PyTorchToBurnAdapter`](burn_store::PyTorchToBurnAdapter))
///   work as in burn-store's `SafetensorsStore`.
///
/// ```
/// # use burn_core as burn;
/// # if !cfg!(feature = "burn-ndarray") { return Ok(()); }
/// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
/// use burn_core::module::{Module, Param};
/// use burn_core::tensor::{Device, Tensor};
/// use burn_store::ModuleSnapshot;
/// use scopetree::burn::CheckpointStore;
///
/// #[derive(Module, Debug)]
/// struct Net { w: Param<Tensor<2>>, b: Param<Tensor<1>> }
///
/// let device = Device::default();
/// let net = Net {
///     w: Param::from_tensor(Tensor::ones([2, 3], &device)),
///     b: Param::from_tensor(Tensor::zeros([3], &device)),
/// };
/// net.save_into(&mut CheckpointStore::sharded(&dir).max_shard_size(16))?;
///
/// let mut fresh = Net {
///     w: Param::from_tensor(Tensor::zeros([2, 3], &device)),
///     b: Param::from_tensor(Tensor::ones([3], &device)),
/// };
/// let result = fresh.load_from(&mut CheckpointStore::sharded(&dir))?;
/// assert_eq!(result.applied.len(), 2);
/// assert_eq!(fresh.w.val().into_data(), net.w.val().into_data());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CheckpointStore {
    pub(crate) path: PathBuf,
    pub(crate) target: Target,
    pub(crate) max_shard_size: u64,
    pub(crate) floats_as: Option<FloatDtype>,
    pub(crate) metadata: HashMap<String, String>,
    pub(crate) allow_missing: bool,
    pub(crate) allow_unused: bool,
    pub(crate) dtype_policy: DtypePolicy,
    pub(crate) rollback: bool,
    pub(crate) param_ids: bool,
    pub(crate) filter: Option<PathFilter>,
    pub(crate) remapper: KeyRemapper,
    pub(crate) from_adapter: Option<Box<dyn ModuleAdapter>>,
    pub(crate) to_adapter: Option<Box<dyn ModuleAdapter>>,
    pub(crate) skip_enum_variants: bool,
    /// The checkpoint's tensors as burn-store's `get_all_tensors` gives
    /// them, read once (their bytes on demand).
    pub(crate) cache: Option<BTreeMap<String, PackTensor>>,
}

impl std::fmt::Debug for CheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointStore")
            .field("path", &self.path)
            .field("target", &self.target)
            .field("max_shard_size", &self.max_shard_size)
            .field("floats_as", &self.floats_as)
            .field("allow_missing", &self.allow_missing)
            .field("allow_unused", &self.allow_unused)
            .field("dtype_policy", &self.dtype_policy)
            .field("rollback", &self.rollback)
            .field("param_ids", &self.param_ids)
            .field("remapper", &self.remapper)
            .finish_non_exhaustive()
    }
}

impl CheckpointStore {
    fn new(path: PathBuf, target: Target) -> Self {
        Self {
            path,
            target,
            max_shard_size: DEFAULT_MAX_SHARD_SIZE,
            floats_as: None,
            metadata: HashMap::new(),
            allow_missing: false,
            allow_unused: false,
            dtype_policy: DtypePolicy::Exact,
            rollback: false,
            param_ids: true,
            filter: None,
            remapper: KeyRemapper::new(),
            from_adapter: None,
            to_adapter: None,
            skip_enum_variants: false,
            cache: None,
        }
    }

    /// A store that saves one safetensors file at `path` and loads the
    /// checkpoint at `path`: a file, a sharded checkpoint's index, or the
    /// directory that holds it. O(1).
    ///
    /// ```
    /// let store = scopetree::burn::CheckpointStore::from_file("model.safetensors");
    /// assert_eq!(store.path(), std::path::Path::new("model.safetensors"));
    /// ```
    pub fn from_file(path: impl Into<PathBuf>) -> Self {
        Self::new(path.into(), Target::File)
    }

    /// A store that saves a sharded checkpoint in the Hugging Face layout
    /// into the directory `dir` (made if missing; shards of at most
    /// [`max_shard_size`](Self::max_shard_size) bytes, 5 GB by default,
    /// and `model.safetensors.index.json`), and loads the checkpoint there.
    /// O(1).
    ///
    /// ```
    /// let store = scopetree::burn::CheckpointStore::sharded("ckpt").max_shard_size(2 << 30);
    /// # let _ = store;
    /// ```
    pub fn sharded(dir: impl Into<PathBuf>) -> Self {
        Self::new(dir.into(), Target::Sharded)
    }

    /// The path the store saves to and loads from. O(1).
    ///
    /// ```
    /// let store = scopetree::burn::CheckpointStore::sharded("ckpt");
    /// assert_eq!(store.path(), std::path::Path::new("ckpt"));
    /// ```
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The most tensor bytes a shard of a sharded save holds (as written,
    /// after [`floats_as`](Self::floats_as)); a larger tensor gets a shard
    /// of its own. One-file saves ignore it. O(1).
    ///
    /// ```
    /// let _ = scopetree::burn::CheckpointStore::sharded("ckpt").max_shard_size(1 << 30);
    /// ```
    pub fn max_shard_size(mut self, bytes: u64) -> Self {
        self.max_shard_size = bytes;
        self
    }

    /// Saves every float tensor (`F16`, `BF16`, `F32`, `F64`) as `dtype`,
    /// each value rounded once to nearest, ties to even (`half`'s
    /// `from_f32`, never `from_f64`); other tensors keep their dtype. The
    /// module is not changed. Load such a checkpoint back with
    /// [`DtypePolicy::Convert`]. O(1).
    ///
    /// ```
    /// use scopetree::{burn::CheckpointStore, checkpoint::FloatDtype};
    /// let _ = CheckpointStore::sharded("ckpt").floats_as(FloatDtype::BF16);
    /// ```
    pub fn floats_as(mut self, dtype: FloatDtype) -> Self {
        self.floats_as = Some(dtype);
        self
    }

    /// A string pair for the `__metadata__` of every file a save writes.
    /// O(1).
    ///
    /// ```
    /// let _ = scopetree::burn::CheckpointStore::from_file("m.safetensors").metadata("epoch", "3");
    /// ```
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Module tensors the checkpoint lacks keep their values instead of
    /// failing the load; the result's `missing` lists them. O(1).
    ///
    /// ```
    /// let _ = scopetree::burn::CheckpointStore::from_file("m.safetensors").allow_missing(true);
    /// ```
    pub fn allow_missing(mut self, allow: bool) -> Self {
        self.allow_missing = allow;
        self
    }

    /// Checkpoint tensors that no module tensor takes (and tensors a shard
    /// holds that the index assigns elsewhere) are skipped instead of
    /// failing the load; the result's `unused` lists them. O(1).
    ///
    /// ```
    /// let _ = scopetree::burn::CheckpointStore::from_file("m.safetensors").allow_unused(true);
    /// ```
    pub fn allow_unused(mut self, allow: bool) -> Self {
        self.allow_unused = allow;
        self
    }

    /// [`DtypePolicy::Exact`] (the default): a checkpoint tensor's dtype
    /// must be the module tensor's. [`DtypePolicy::Convert`]: float tensors
    /// convert to the module tensor's float dtype, correctly rounded (a
    /// bf16 checkpoint into an f32 module is exact). burn-store's own
    /// stores instead give the parameter the file's dtype. O(1).
    ///
    /// ```
    /// use scopetree::{burn::CheckpointStore, checkpoint::DtypePolicy};
    /// let _ = CheckpointStore::sharded("ckpt").dtype_policy(DtypePolicy::Convert);
    /// ```
    pub fn dtype_policy(mut self, policy: DtypePolicy) -> Self {
        self.dtype_policy = policy;
        self
    }

    /// Makes a load that fails while reading the second or a later shard
    /// (a disk error, a file changed since its header was checked, bytes
    /// that fail their checksum) put the module back as it was. The cost:
    /// the replaced tensors stay in memory until the load ends (up to the
    /// module's size again), and lazily initialized parameters are
    /// initialized. Off by default: every other failure already leaves the
    /// module unchanged, and a one-file checkpoint is read whole before
    /// anything changes. O(1).
    ///
    /// ```
    /// let _ = scopetree::burn::CheckpointStore::sharded("ckpt").rollback(true);
    /// ```
    pub fn rollback(mut self, rollback: bool) -> Self {
        self.rollback = rollback;
        self
    }

    /// Whether a load gives each parameter the `ParamId` its save recorded
    /// (on by default), so that an optimizer's state, keyed by those ids,
    /// applies after a restart; off keeps the module's own ids. Files that
    /// record no ids (other tools' files) keep the module's ids either way.
    /// O(1).
    ///
    /// ```
    /// let _ = scopetree::burn::CheckpointStore::from_file("m.safetensors").param_ids(false);
    /// ```
    pub fn param_ids(mut self, restore: bool) -> Self {
        self.param_ids = restore;
        self
    }

    /// Only the module paths `filter` accepts take part: a save writes
    /// only them, and a load changes only them; other module tensors are
    /// listed as `skipped`, and checkpoint names the filter rejects are
    /// ignored (neither loaded nor unused). As burn-store's filters, a
    /// filter with no criteria matches nothing. O(1).
    ///
    /// ```
    /// use burn_store::PathFilter;
    /// let _ = scopetree::burn::CheckpointStore::from_file("m.safetensors")
    ///     .filter(PathFilter::new().with_regex(r"^encoder\."));
    /// ```
    pub fn filter(mut self, filter: PathFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// Renames names with `remapper`'s patterns, in order: a load renames
    /// the checkpoint's keys before matching them to module paths, a save
    /// renames module paths into keys (as burn-store's stores do). Two
    /// names that land on one are [`Error::Collision`]. O(1).
    ///
    /// ```
    /// use burn_store::KeyRemapper;
    /// let r = KeyRemapper::new().add_pattern(r"^model\.", "")?;
    /// let _ = scopetree::burn::CheckpointStore::sharded("llama").remap(r);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remap(mut self, remapper: KeyRemapper) -> Self {
        self.remapper = remapper;
        self.cache = None;
        self
    }

    /// Adds one remapping pattern (a regular expression and its
    /// replacement, `$1` for groups); see [`remap`](Self::remap). O(pattern).
    ///
    /// # Errors
    /// [`Error::BadPattern`] when `from` is not a valid regular expression.
    ///
    /// ```
    /// let store = scopetree::burn::CheckpointStore::sharded("llama")
    ///     .with_key_remapping(r"^model\.", "")?
    ///     .with_key_remapping(r"\.self_attn\.", ".attn.")?;
    /// # let _ = store;
    /// # Ok::<(), scopetree::burn::Error>(())
    /// ```
    pub fn with_key_remapping(
        mut self,
        from: impl AsRef<str>,
        to: impl Into<String>,
    ) -> Result<Self, Error> {
        let from = from.as_ref();
        self.remapper = self
            .remapper
            .add_pattern(from, to)
            .map_err(|e| Error::BadPattern {
                pattern: from.to_owned(),
                reason: cut(&e.to_string()),
            })?;
        self.cache = None;
        Ok(self)
    }

    /// The adapter a load applies to each checkpoint tensor on its way into
    /// the module, as burn-store's: [`PyTorchToBurnAdapter`](burn_store::PyTorchToBurnAdapter)
    /// transposes `Linear` weights and maps norm layers' `weight`/`bias`
    /// to `gamma`/`beta`. The checks see the adapted shapes. O(1).
    ///
    /// ```
    /// use burn_store::PyTorchToBurnAdapter;
    /// let _ = scopetree::burn::CheckpointStore::sharded("hub").with_from_adapter(PyTorchToBurnAdapter);
    /// ```
    pub fn with_from_adapter(mut self, adapter: impl ModuleAdapter + 'static) -> Self {
        self.from_adapter = Some(Box::new(adapter));
        self
    }

    /// The adapter a save applies to each module tensor, as burn-store's
    /// ([`BurnToPyTorchAdapter`](burn_store::BurnToPyTorchAdapter) writes
    /// PyTorch's layouts). O(1).
    ///
    /// ```
    /// use burn_store::BurnToPyTorchAdapter;
    /// let _ = scopetree::burn::CheckpointStore::sharded("out").with_to_adapter(BurnToPyTorchAdapter);
    /// ```
    pub fn with_to_adapter(mut self, adapter: impl ModuleAdapter + 'static) -> Self {
        self.to_adapter = Some(Box::new(adapter));
        self
    }

    /// Leaves enum variant names out of module paths
    /// (`feature.weight`, not `feature.BaseConv.weight`), as burn-store's
    /// option of the same name. O(1).
    ///
    /// ```
    /// let _ = scopetree::burn::CheckpointStore::from_file("m.safetensors").skip_enum_variants(true);
    /// ```
    pub fn skip_enum_variants(mut self, skip: bool) -> Self {
        self.skip_enum_variants = skip;
        self
    }
}
