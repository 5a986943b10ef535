//! [`CandleStore`]: a clonable handle to a [`VariableStore`] of candle
//! `Var`s, the state behind its lock, and its construction. What the store
//! does lives beside it: `get` (the backend of `VarBuilder`), `listing`,
//! `freeze`, `seal` and `checkpoint`.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use slotmap::SecondaryMap;

use crate::arena::{TreeTag, VarKey};
use crate::sharing::{GLOBAL_VARIABLES, TRAINABLE_VARIABLES, VariableStore};

/// A load whose new variables wait for their device: the first `get`
/// names it (or a call that needs the values first places them on the
/// CPU). The checkpoint is planned again then, against the tree as it is.
#[derive(Clone, Debug)]
pub(super) struct Pending {
    pub(super) path: std::path::PathBuf,
    pub(super) opts: crate::checkpoint::LoadOptions,
    /// The keys of the variables it will make, for `contains_tensor` and
    /// `names`.
    pub(super) keys: rustc_hash::FxHashSet<String>,
}

/// The store's state behind its lock.
#[derive(Debug)]
pub(super) struct Inner {
    pub(super) store: VariableStore,
    /// Freeze rules, `(prefix, frozen)`; the longest matching prefix wins.
    pub(super) rules: Vec<(String, bool)>,
    /// Whether a `get` of an unknown name is an error (`seal.rs`).
    pub(super) sealed: bool,
    /// The collections a variable the store creates joins.
    pub(super) collections: Vec<String>,
    /// The variables the backend has handed out, by key, with their tree's
    /// tag: slotmap's versions make a deleted and recreated variable a new
    /// key, so it counts as not asked, and the map never holds more entries
    /// than the tree has had variable slots.
    pub(super) asked: SecondaryMap<VarKey, TreeTag>,
    /// A load whose new variables wait for the device the model first asks
    /// for (`load.rs`).
    pub(super) pending: Option<Pending>,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            store: VariableStore::default(),
            rules: Vec::new(),
            sealed: false,
            collections: vec![GLOBAL_VARIABLES.to_owned(), TRAINABLE_VARIABLES.to_owned()],
            asked: SecondaryMap::new(),
            pending: None,
        }
    }
}

/// scopetree as the variable store behind candle-nn's
/// [`VarBuilder`]: a clonable handle (one `Arc`) to a
/// [`VariableStore`] whose variables hold candle
/// [`Var`](candle_core::Var)s, named by candle's dotted paths
/// (`gru.weight_ih_l0` is the variable `weight_ih_l0` of the scope `gru`).
///
/// What it adds to candle's `VarMap`:
/// - get-or-create that checks shape, **dtype and device** on reuse, with an
///   error naming both sides, and never converts;
/// - a sealed mode, in which an unknown name is an error instead of a
///   variable of zeros (candle #699);
/// - variables in a deterministic order (by name), for the whole store, a
///   prefix or a collection, ready for `AdamW::new`;
/// - freezing by prefix (candle #2323);
/// - strict, atomic checkpoints in candle's own format and names, which
///   can be loaded before the model is built (candle #1469).
///
/// ```
/// use candle_core::{DType, Device, Module, Tensor};
/// use scopetree::candle::CandleStore;
/// let store = CandleStore::new();
/// let vb = store.var_builder(DType::F32, &Device::Cpu);
/// let lin = candle_nn::linear(4, 2, vb.pp("head"))?;
/// let y = lin.forward(&Tensor::zeros((1, 4), DType::F32, &Device::Cpu)?)?;
/// assert_eq!(y.dims(), &[1, 2]);
/// assert_eq!(store.names()?, ["head.bias", "head.weight"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct CandleStore {
    inner: Arc<Mutex<Inner>>,
}

impl CandleStore {
    /// An empty store, unsealed, nothing frozen. O(1).
    ///
    /// ```
    /// assert!(scopetree::candle::CandleStore::new().names()?.is_empty());
    /// # Ok::<(), scopetree::candle::Error>(())
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// A store over an existing [`VariableStore`] (its `Var`s become the
    /// candle variables). O(1).
    ///
    /// ```
    /// use scopetree::{candle::CandleStore, sharing::VariableStore};
    /// let store = CandleStore::from_store(VariableStore::new());
    /// assert!(store.names()?.is_empty());
    /// # Ok::<(), scopetree::candle::Error>(())
    /// ```
    pub fn from_store(store: VariableStore) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                store,
                ..Inner::default()
            })),
        }
    }

    /// The lock; a panic inside an earlier call left the store consistent
    /// (the sharing layer undoes a panicking call), so a poisoned lock is
    /// taken over.
    #[inline]
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A [`VarBuilder`] whose variables live in this store. candle-nn's
    /// layers (`linear`, `embedding`, `conv1d`, `conv2d`, `layer_norm`,
    /// `gru`, `lstm`, …) take it. O(1).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// let vb = store.var_builder(DType::F32, &Device::Cpu);
    /// candle_nn::embedding(10, 4, vb.pp("emb"))?;
    /// assert_eq!(store.names()?, ["emb.weight"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn var_builder(&self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self.clone()), dtype, device.clone())
    }

    /// Runs `f` on the underlying [`VariableStore`]: the sharing API,
    /// collections, deletion and renaming. The variables of a
    /// [`load`](Self::load) that waits for its device are placed on the CPU
    /// first (should that fail, they are left waiting, `f` does not see
    /// them, and the next call that places them reports the error). O(1)
    /// plus `f`.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// candle_nn::linear(2, 2, store.var_builder(DType::F32, &Device::Cpu).pp("old"))?;
    /// store.with_store(|s| {
    ///     let old = s.tree().kid(s.tree().root(), "old")?.expect("built");
    ///     s.delete_scope(old)
    /// })?;
    /// assert!(store.names()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_store<R>(&self, f: impl FnOnce(&mut VariableStore) -> R) -> R {
        let mut inner = self.lock();
        if let Some(p) = inner.pending.take() {
            // Placed, or kept waiting with its error for a later call.
            let keep = p.clone();
            inner.pending = Some(p);
            if inner.place_pending(&Device::Cpu).is_err() {
                inner.pending = Some(keep);
            }
        }
        f(&mut inner.store)
    }
}
