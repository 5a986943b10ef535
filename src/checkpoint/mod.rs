//! Checkpoints: save and load a tree, a subtree or a store as a
//! [safetensors](https://github.com/huggingface/safetensors) file, the format
//! PyTorch, candle, JAX and the Hugging Face tools read.
//!
//! - **Keys** are full names relative to the saved scope: scope names and the
//!   variable's name joined by `/` (or `.` with [`Separator::Dot`], the
//!   PyTorch and candle spelling). Unnamed scopes have no stable name and are
//!   left out (the save report lists them). The file's tensors are in a
//!   deterministic order (by dtype, then key), so equal trees give
//!   byte-identical files.
//! - **Values** are tensors when their type is [`Checkpointable`]: `Vec<T>`,
//!   `Box<[T]>` and [`Tensor<T>`] of every [`Element`]. Any other value makes
//!   the save fail naming every such variable, unless
//!   [`SaveOptions::skip_non_tensors`] is set. A flat value (`Vec`, `Box`)
//!   saves with the shape the sharing layer recorded for it, if any.
//! - **Save** writes a temporary file beside the target and renames it, so a
//!   crash never leaves a torn file at the path.
//! - **Load** is strict and atomic by default: it reads and checks the header
//!   (sizes against the file's length before any allocation), matches every
//!   name, shape and dtype against the tree, lists every problem in one
//!   [`Error::Mismatch`], and changes nothing unless everything matches. Then
//!   it streams the tensors one at a time, into the existing values where
//!   they fit. [`LoadOptions`] allows missing or
//!   unused names, creates the variables the file names, and converts float
//!   dtypes. The [`LoadReport`] says what was loaded, missing and unused.
//!
//! | file | holds |
//! |---|---|
//! | `dtype` | [`Dtype`], [`FloatDtype`] |
//! | `element` | [`Element`]: the element types and their little-endian encodings |
//! | `checkpointable` | [`Checkpointable`], and its impls for `Vec<E>` and `Box<[E]>` |
//! | `tensor` | [`Tensor`] |
//! | `codec` | `Codec`: a checkpointable type's operations, type-erased, that saves and loads look values up with |
//! | `known_types` | `Types`: the types a save or load knows; the value type a load makes for a dtype |
//! | `float_convert` | the float conversions of [`SaveOptions::floats_as`] and [`DtypePolicy::Convert`], correctly rounded |
//! | `header` | [`FileTensor`]: a safetensors header, read and checked |
//! | `index` | a sharded checkpoint's index |
//! | `source` | opening a checkpoint: a file, an index or a directory |
//! | `save` | [`SaveOptions`], [`SaveReport`], writing files and shards |
//! | `load/` | [`LoadOptions`], [`DtypePolicy`], [`LoadReport`]; the load's checks, reads and passes |
//! | `error` | [`Error`] and its parts |
//!
//! ```
//! # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
//! use scopetree::{ScopeTree, checkpoint};
//!
//! let mut tree = ScopeTree::new();
//! let enc = tree.new_named_scope(tree.root(), "encoder")?;
//! let w = tree.var(enc, "w")?;
//! tree.set(w, vec![0.5_f32; 6])?;
//! let path = dir.join("model.safetensors");
//! checkpoint::save(&tree, tree.root(), &path, &checkpoint::SaveOptions::new())?;
//!
//! // A fresh process: load before the model is built.
//! let mut fresh = ScopeTree::new();
//! let root = fresh.root();
//! let report = checkpoint::load(&mut fresh, root, &path,
//!                               &checkpoint::LoadOptions::new().create(true))?;
//! assert_eq!(report.created, ["encoder/w"]);
//! let enc2 = fresh.kid(fresh.root(), "encoder")?.expect("created");
//! let w2 = fresh.find_local_var(enc2, "w")?.expect("created");
//! assert_eq!(fresh.get::<Vec<f32>>(w2)?, &[0.5; 6]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod checkpointable;
mod codec;
mod dtype;
mod element;
mod error;
mod float_convert;
mod header;
mod index;
mod known_types;
mod load;
mod save;
mod source;
mod tensor;

use std::path::Path;

pub use checkpointable::Checkpointable;
#[cfg(feature = "candle")]
pub(crate) use codec::Codec;
pub use dtype::{Dtype, FloatDtype};
pub use element::Element;
pub use error::{BadFile, BadIndex, Error, Mismatch, NotTensor};
#[cfg(feature = "burn")]
pub(crate) use float_convert::convert_floats;
pub(crate) use float_convert::convert_floats_into;
pub(crate) use float_convert::is_convertible_float;
pub use header::FileTensor;
pub(crate) use index::{
    CHECKSUM_PREFIX, INDEX_FILE, OPTIMIZER_INDEX_FILE, SAVE_ID, index_json, shard_file, shard_name,
};
#[cfg(feature = "candle")]
pub(crate) use load::{Commit, Plan, Step, staged};
pub use load::{DEFAULT_STAGING_BUDGET, DtypePolicy, LoadOptions, LoadReport};
#[cfg(feature = "candle")]
pub(crate) use save::save_staged_sharded;
pub use save::{DEFAULT_MAX_SHARD_SIZE, SaveOptions, SaveReport};
pub(crate) use save::{Staged, new_save_id, sync_file, write_atomic, write_tensors};
#[cfg(any(feature = "burn", feature = "candle"))]
pub(crate) use save::{Streamed, save_streamed};
#[cfg(feature = "candle")]
pub(crate) use source::Part;
pub(crate) use source::{Opened, open as open_checkpoint};
pub use tensor::Tensor;

use crate::sharing::VariableStore;
use crate::{ScopeId, ScopeTree, VarId};

/// The separator between the scope names of a key.
///
/// ```
/// use scopetree::checkpoint::Separator;
/// assert_eq!(Separator::default().as_str(), "/");
/// assert_eq!(Separator::Dot.as_str(), ".");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Separator {
    /// `encoder/layer_1/w`, the tree's own paths (the default).
    #[default]
    Slash,
    /// `encoder.layer_1.w`, PyTorch and candle names.
    Dot,
}

impl Separator {
    /// The separator's text. O(1).
    ///
    /// ```
    /// assert_eq!(scopetree::checkpoint::Separator::Slash.as_str(), "/");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Slash => "/",
            Self::Dot => ".",
        }
    }
}

/// Saves every variable of `scope` and below it to `path`, keys relative to
/// `scope` (pass [`ScopeTree::root`] to save the whole tree). O(size of the
/// subtree + bytes written).
///
/// # Errors
/// [`Error::NotTensors`] naming every variable that holds no tensor (unless
/// skipped); [`Error::KeyCollision`]; [`Error::Write`] when the file cannot
/// be written (nothing is left at `path` then); [`Error::Tree`] for a stale
/// or foreign scope.
///
/// ```
/// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
/// use scopetree::{ScopeTree, checkpoint::{self, SaveOptions, Separator}};
/// let mut tree = ScopeTree::new();
/// let dec = tree.new_named_scope(tree.root(), "decoder")?;
/// let b = tree.var(dec, "bias")?;
/// tree.set(b, vec![0_i64; 4])?;
/// let r = checkpoint::save(&tree, tree.root(), dir.join("d.safetensors"),
///                          &SaveOptions::new().separator(Separator::Dot))?;
/// assert_eq!(r.keys, ["decoder.bias"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn save(
    tree: &ScopeTree,
    scope: ScopeId,
    path: impl AsRef<Path>,
    opts: &SaveOptions,
) -> Result<SaveReport, Error> {
    save::save_with(tree, scope, path.as_ref(), opts, &|_| None)
}

/// Saves a whole [`VariableStore`]: like [`save`] from its root, with the
/// shapes the store recorded for flat values. O(variables + bytes written).
///
/// # Errors
/// As [`save`].
///
/// ```
/// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
/// use scopetree::{checkpoint, sharing::VariableStore};
/// let mut store = VariableStore::new();
/// let root = store.tree().root();
/// let w = store.tree_mut().var(root, "w")?;
/// store.tree_mut().set(w, vec![1.0_f64; 2])?;
/// let r = checkpoint::save_store(&store, dir.join("s.safetensors"), &checkpoint::SaveOptions::new())?;
/// assert_eq!(r.keys, ["w"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn save_store(
    store: &VariableStore,
    path: impl AsRef<Path>,
    opts: &SaveOptions,
) -> Result<SaveReport, Error> {
    let tree = store.tree();
    save::save_with(tree, tree.root(), path.as_ref(), opts, &|v| {
        store_shape(store, v)
    })
}

/// Loads `path` into the variables of `scope` and below it, keys relative
/// to `scope`. Strict and atomic unless `opts` relaxes it: the whole header
/// is checked against the tree, and every value that needs new memory is
/// read, before anything changes; values of the crate's types that already
/// fit are then overwritten in place. O(header + variables + bytes read);
/// extra memory about one tensor plus the values that need new memory (the
/// whole file with [`LoadOptions::rollback`]).
///
/// `path` is a safetensors file, or a sharded checkpoint in the Hugging
/// Face layout: its index (a `.json` file, `model.safetensors.index.json`)
/// or the directory that holds it (a directory with only
/// `model.safetensors` loads that file). A sharded load is one load: every
/// shard's header is read and checked, and the tree matched against all of
/// them, before anything changes, and one [`Error::Mismatch`] lists every
/// problem whichever shard holds it. The index decides: a tensor is read
/// only from the shard the index assigns it to; a copy in another shard is
/// *unassigned*, never loaded, and fails a strict load.
///
/// # Errors
/// [`Error::Io`], [`Error::BadFile`] for a malformed file (or shard);
/// [`Error::BadIndex`] for a malformed index, a missing shard, a shard that
/// lacks a tensor the index assigns to it, or a torn save;
/// [`Error::Mismatch`] listing every missing, unexpected and mismatched key;
/// [`Error::KeyCollision`]; [`Error::Data`] if reading fails after the checks;
/// [`Error::Tree`] for a stale or foreign scope. On any error the tree is as
/// before the call, except an [`Error::Data`] whose `rolled_back` is `false`:
/// the disk failed while values were read in place (see
/// [`LoadOptions::rollback`]).
///
/// ```
/// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
/// use scopetree::{ScopeTree, checkpoint::{self, LoadOptions, SaveOptions}};
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// tree.set(w, vec![1_u16, 2, 3])?;
/// let path = dir.join("w.safetensors");
/// checkpoint::save(&tree, tree.root(), &path, &SaveOptions::new())?;
/// tree.set(w, vec![0_u16; 3])?;
/// let root = tree.root();
/// let report = checkpoint::load(&mut tree, root, &path, &LoadOptions::new())?;
/// assert_eq!(report.loaded, ["w"]);
/// assert_eq!(tree.get::<Vec<u16>>(w)?, &[1, 2, 3]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn load(
    tree: &mut ScopeTree,
    scope: ScopeId,
    path: impl AsRef<Path>,
    opts: &LoadOptions,
) -> Result<LoadReport, Error> {
    let plan = load::plan(tree, scope, path.as_ref(), opts, &|_| None)?;
    load::apply(tree, scope, plan, opts)
}

/// Loads `path` into a whole [`VariableStore`]: like [`load`] from its root,
/// checking flat values against the shapes the store recorded. Variables
/// that [`LoadOptions::create`] makes are plain tree variables (the store
/// records no shape or initializer for them). O(as [`load`]).
///
/// # Errors
/// As [`load`].
///
/// ```
/// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
/// use scopetree::{checkpoint, sharing::VariableStore};
/// let mut store = VariableStore::new();
/// let root = store.tree().root();
/// let w = store.tree_mut().var(root, "w")?;
/// store.tree_mut().set(w, vec![1.0_f32; 2])?;
/// let path = dir.join("s.safetensors");
/// checkpoint::save_store(&store, &path, &checkpoint::SaveOptions::new())?;
/// let r = checkpoint::load_store(&mut store, &path, &checkpoint::LoadOptions::new())?;
/// assert_eq!(r.loaded, ["w"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn load_store(
    store: &mut VariableStore,
    path: impl AsRef<Path>,
    opts: &LoadOptions,
) -> Result<LoadReport, Error> {
    let root = store.tree().root();
    let plan = load::plan(store.tree(), root, path.as_ref(), opts, &|v| {
        store_shape(store, v)
    })?;
    load::apply(store.tree_mut(), root, plan, opts)
}

/// The tensors a checkpoint declares, after the same validation a load
/// does: of a file, in file order; of a sharded checkpoint (its index or
/// its directory), the tensors the index assigns to each shard, shard by
/// shard, each naming its [`shard`](FileTensor::shard). Reads the headers
/// and the index only. O(headers + index).
///
/// # Errors
/// [`Error::Io`], [`Error::BadFile`] or [`Error::BadIndex`].
///
/// ```
/// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
/// use scopetree::{ScopeTree, checkpoint::{self, SaveOptions}};
/// let mut tree = ScopeTree::new();
/// for name in ["a", "b"] {
///     let v = tree.var(tree.root(), name)?;
///     tree.set(v, vec![0.0_f32; 4])?;
/// }
/// checkpoint::save_sharded(&tree, tree.root(), &dir, &SaveOptions::new().max_shard_size(16))?;
/// let shards: Vec<_> = checkpoint::inspect(&dir)?.into_iter().map(|t| t.shard).collect();
/// assert_eq!(shards, [Some("model-00001-of-00002.safetensors".into()),
///                     Some("model-00002-of-00002.safetensors".into())]);
/// assert!(matches!(checkpoint::inspect("/nonexistent.safetensors"),
///                  Err(checkpoint::Error::Io { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn inspect(path: impl AsRef<Path>) -> Result<Vec<FileTensor>, Error> {
    Ok(source::open(path.as_ref())?
        .tensors
        .into_iter()
        .map(|(_, t)| t)
        .collect())
}

/// Saves every variable of `scope` and below it as a sharded checkpoint in
/// the Hugging Face layout, into the directory `dir` (made if missing):
/// shards `model-00001-of-0000N.safetensors` of at most
/// [`SaveOptions::max_shard_size`] tensor bytes each (5 GB by default),
/// cut in key order, and the index `model.safetensors.index.json`
/// (`{"metadata": {"total_size": ..}, "weight_map": {key: shard}}`). Keys
/// are as [`save`] makes them; use [`Separator::Dot`] for PyTorch and
/// candle names. Every shard carries `"format": "pt"` in its metadata, as
/// the Hugging Face loaders require. Load it back with [`load`], from the
/// index or the directory. O(size of the subtree + bytes written); extra
/// memory: one shard's converted bytes with [`SaveOptions::floats_as`],
/// else none beyond the headers.
///
/// Each shard is written atomically, then the index, atomically, last; the
/// shards and the index carry the id of the save that wrote them, so a
/// save that stopped half-way (new shards, the old index) fails to load
/// with [`BadIndex::TornSave`] instead of mixing two saves. Shards that
/// the replaced index named and this one does not are removed.
///
/// # Errors
/// As [`save`]; [`Error::Io`] if `dir` cannot be made or the index cannot
/// be written.
///
/// ```
/// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
/// use scopetree::{ScopeTree, checkpoint::{self, FloatDtype, LoadOptions, SaveOptions, Separator}};
/// let mut tree = ScopeTree::new();
/// let layers = tree.new_named_scope(tree.root(), "layers")?;
/// for name in ["q", "k", "v"] {
///     let w = tree.var(layers, name)?;
///     tree.set(w, vec![0.5_f32; 256])?; // 1 KiB each
/// }
/// let opts = SaveOptions::new().separator(Separator::Dot).max_shard_size(2048);
/// let r = checkpoint::save_sharded(&tree, tree.root(), &dir, &opts)?;
/// assert_eq!(r.shards, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);
///
/// // Published in bf16, loaded back into a fresh tree as f32.
/// checkpoint::save_sharded(&tree, tree.root(), &dir, &opts.floats_as(FloatDtype::BF16))?;
/// let mut fresh = ScopeTree::new();
/// let root = fresh.root();
/// let load = LoadOptions::new().separator(Separator::Dot).create(true)
///     .create_floats_as(FloatDtype::F32);
/// let report = checkpoint::load(&mut fresh, root, dir.join("model.safetensors.index.json"), &load)?;
/// assert_eq!(report.created, ["layers.k", "layers.q", "layers.v"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn save_sharded(
    tree: &ScopeTree,
    scope: ScopeId,
    dir: impl AsRef<Path>,
    opts: &SaveOptions,
) -> Result<SaveReport, Error> {
    save::save_sharded_with(tree, scope, dir.as_ref(), opts, &|_| None)
}

/// Saves a whole [`VariableStore`] as a sharded checkpoint: like
/// [`save_sharded`] from its root, with the shapes the store recorded for
/// flat values. O(variables + bytes written).
///
/// # Errors
/// As [`save_sharded`].
///
/// ```
/// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
/// use scopetree::{checkpoint, sharing::VariableStore};
/// let mut store = VariableStore::new();
/// let root = store.tree().root();
/// let w = store.tree_mut().var(root, "w")?;
/// store.tree_mut().set(w, vec![1.0_f64; 2])?;
/// let r = checkpoint::save_store_sharded(&store, &dir, &checkpoint::SaveOptions::new())?;
/// assert_eq!(r.shards, ["model-00001-of-00001.safetensors"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn save_store_sharded(
    store: &VariableStore,
    dir: impl AsRef<Path>,
    opts: &SaveOptions,
) -> Result<SaveReport, Error> {
    let tree = store.tree();
    save::save_sharded_with(tree, tree.root(), dir.as_ref(), opts, &|v| {
        store_shape(store, v)
    })
}

/// Plans a load of `path` into a whole store (as [`load_store`] checks it),
/// for a load that reads the data its own way (a candle store's staged
/// load). Changes nothing. O(headers + variables).
#[cfg(feature = "candle")]
pub(crate) fn plan_store(
    store: &VariableStore,
    path: &Path,
    opts: &LoadOptions,
) -> Result<Plan, Error> {
    let root = store.tree().root();
    load::plan(store.tree(), root, path, opts, &|v| store_shape(store, v))
}

/// The fully defined shape the store recorded for `var`, if any.
fn store_shape(store: &VariableStore, var: VarId) -> Option<Vec<usize>> {
    store
        .initial_shape(var)
        .ok()
        .flatten()
        .and_then(|s| s.to_vec())
}

/// A key filter: keys for which it returns `false` are left out of a save,
/// or ignored on both sides of a load.
pub(crate) type Filter = std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The variables below a scope, keyed.
pub(crate) struct Walked {
    /// (key, variable), sorted by key, keys unique.
    pub(crate) vars: Vec<(String, VarId)>,
    /// Paths of unnamed scopes that were left out.
    pub(crate) unnamed_scopes: Vec<String>,
}

/// Keys every variable of `scope` and its named descendants, iteratively.
/// O(size of the subtree × depth) for the key texts.
pub(crate) fn walk(
    tree: &ScopeTree,
    scope: ScopeId,
    sep: Separator,
    filter: Option<&Filter>,
) -> Result<Walked, Error> {
    let sep = sep.as_str();
    let mut comps: Vec<Option<&str>> = Vec::new();
    let mut vars = Vec::new();
    let mut unnamed_scopes = Vec::new();
    for (s, depth) in tree.descendants(scope)? {
        if depth > 0 {
            comps.truncate(depth - 1);
            comps.push(tree.scope_name(s)?);
        }
        if let Some(pos) = comps.iter().position(Option::is_none) {
            if pos + 1 == comps.len() {
                unnamed_scopes.push(tree.path(s)?);
            }
            continue;
        }
        let mut prefix = String::new();
        for c in comps.iter().flatten() {
            prefix.push_str(c);
            prefix.push_str(sep);
        }
        for (name, var) in tree.local_vars(s)? {
            let mut key = String::with_capacity(prefix.len() + name.len());
            key.push_str(&prefix);
            key.push_str(name);
            if filter.is_none_or(|f| f(&key)) {
                vars.push((key, var));
            }
        }
    }
    vars.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = vars.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::KeyCollision {
            key: w[0].0.clone(),
            first: tree.var_path(w[0].1)?,
            second: tree.var_path(w[1].1)?,
        });
    }
    Ok(Walked {
        vars,
        unnamed_scopes,
    })
}

/// The code blocks of `docs/checkpoints.md`, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/checkpoints.md")]
struct CheckpointDocDoctests;
