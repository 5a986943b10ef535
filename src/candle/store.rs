//! [`CandleStore`]: a clonable handle to a [`VariableStore`] of candle
//! `Var`s, and its `SimpleBackend` implementation for `VarBuilder`.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use rustc_hash::FxHashSet;
use slotmap::SecondaryMap;

use super::error::Error;
use super::var::var_codec;
use crate::VarId;
use crate::arena::{TreeTag, VarKey};
use crate::checkpoint::{self, LoadOptions, LoadReport, SaveOptions, SaveReport, Separator};
use crate::sharing::{GLOBAL_VARIABLES, TRAINABLE_VARIABLES, VariableStore};

/// The store's state behind its lock.
#[derive(Debug)]
struct Inner {
    store: VariableStore,
    /// Freeze rules, `(prefix, frozen)`; the longest matching prefix wins.
    rules: Vec<(String, bool)>,
    sealed: bool,
    /// The collections a variable the store creates joins.
    collections: Vec<String>,
    /// The variables the backend has handed out, by key, with their tree's
    /// tag: slotmap's versions make a deleted and recreated variable a new
    /// key, so it counts as not asked, and the map never holds more entries
    /// than the tree has had variable slots.
    asked: SecondaryMap<VarKey, TreeTag>,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            store: VariableStore::default(),
            rules: Vec::new(),
            sealed: false,
            collections: vec![GLOBAL_VARIABLES.to_owned(), TRAINABLE_VARIABLES.to_owned()],
            asked: SecondaryMap::new(),
        }
    }
}

impl Inner {
    fn is_frozen(&self, name: &str) -> bool {
        self.rules
            .iter()
            .filter(|(p, _)| within(name, p))
            .max_by_key(|(p, _)| p.len())
            .is_some_and(|&(_, f)| f)
    }

    /// The tensor `get` returns for variable `id` (named `name`), once
    /// `check` accepts its `Var`: the `Var`'s own tensor, or a detached one
    /// if the name is frozen; the variable is recorded as asked for. The
    /// `Var` is borrowed from the tree, not cloned. [`Error::NotAVar`] if
    /// the variable holds something else or nothing; `check`'s error
    /// changes nothing. O(freeze rules).
    fn hand_out(
        &mut self,
        id: VarId,
        name: &str,
        check: impl FnOnce(&Var) -> Result<(), Error>,
    ) -> Result<Tensor, Error> {
        let var = var_ref(&self.store, id, name)?;
        check(var)?;
        let tensor = if self.is_frozen(name) {
            var.as_detached_tensor()
        } else {
            var.as_tensor().clone()
        };
        self.asked.insert(id.key, id.tree);
        Ok(tensor)
    }

    /// Every `Var` of the tree with its dotted name and handle, sorted by
    /// name. A tree name with `.` in it (made through the sharing API)
    /// would read as another path, so it is an error, as is a key two
    /// variables share.
    fn named(&self) -> Result<Vec<(String, VarId, Var)>, Error> {
        let tree = self.store.tree();
        let walked = checkpoint::walk(tree, tree.root(), Separator::Dot, None)?;
        let mut out = Vec::with_capacity(walked.vars.len());
        for (k, v) in walked.vars {
            let Ok(var) = tree.get::<Var>(v) else {
                continue;
            };
            let path = tree.var_path(v).map_err(crate::sharing::Error::from)?;
            if path.contains('.') {
                return Err(Error::InvalidName {
                    name: path,
                    reason: "a scope or variable name of the tree contains `.`, which candle \
                             reads as a scope separator; rename it",
                });
            }
            out.push((k, v, var.clone()));
        }
        Ok(out)
    }

    /// Whether `var` was created trainable (a variable the sharing layer
    /// does not know counts as trainable).
    fn created_trainable(&self, var: VarId) -> bool {
        self.store.is_trainable(var).ok().flatten().unwrap_or(true)
    }
}

/// Whether the dotted `name` is `prefix` or below it (`""` is everything):
/// whole components only, so `gru` selects `gru.w` but not `gru2.w`.
fn within(name: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || name == prefix
        || (name.starts_with(prefix) && name.as_bytes().get(prefix.len()) == Some(&b'.'))
}

/// Checks a candle name: dotted, no empty component, no `/`.
/// One pass over the bytes: `VarBuilder` calls this on every `get`.
fn check_name(name: &str) -> Result<(), Error> {
    let mut reason = None;
    // At the start, after a `.`: a `.` or the end here is an empty component.
    let mut boundary = true;
    for &b in name.as_bytes() {
        if b == b'/' {
            reason = Some("it contains `/`, which the tree uses between scopes");
            break;
        }
        let dot = b == b'.';
        if dot && boundary {
            reason = Some("it has an empty component");
        }
        boundary = dot;
    }
    if name.is_empty() {
        reason = Some("it is empty");
    } else if boundary && reason.is_none() {
        reason = Some("it has an empty component");
    }
    match reason {
        Some(reason) => Err(Error::InvalidName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// A checked prefix (`""` for everything).
fn check_prefix(prefix: &str) -> Result<(), Error> {
    if prefix.is_empty() {
        Ok(())
    } else {
        check_name(prefix)
    }
}

/// scopetree as the variable store behind candle-nn's
/// [`VarBuilder`]: a clonable handle (one `Arc`) to a
/// [`VariableStore`] whose variables hold candle [`Var`]s, named by candle's
/// dotted paths (`gru.weight_ih_l0` is the variable `weight_ih_l0` of the
/// scope `gru`).
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
    fn lock(&self) -> MutexGuard<'_, Inner> {
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
    /// collections, deletion and renaming. O(1) plus `f`.
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
        f(&mut self.lock().store)
    }

    /// Gets the variable `name` (dotted) or creates it with `init`: the
    /// backend of [`VarBuilder::get`]. On reuse the shape, dtype and device
    /// must be the variable's own. Returns the `Var`'s own tensor, so
    /// gradients reach it, or a detached copy of it when the name is
    /// frozen. O(name length) to find a variable; creating adds `init`.
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::ShapeMismatch`],
    /// [`Error::DtypeMismatch`], [`Error::DeviceMismatch`] or
    /// [`Error::NotAVar`] on reuse; [`Error::Sealed`] for an unknown name of
    /// a sealed store; [`Error::Sharing`] wrapping
    /// [`InitFailed`](crate::sharing::Error::InitFailed) when `init`
    /// fails. The store is unchanged after an error.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::candle::{CandleStore, Error};
    /// let store = CandleStore::new();
    /// let w = store.get((2, 2), "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
    /// assert_eq!(w.sum_all()?.to_scalar::<f32>()?, 4.0);
    /// let err = store.get((2, 2), "w", candle_nn::Init::Const(1.0), DType::F64, &Device::Cpu).unwrap_err();
    /// assert!(matches!(err, Error::DtypeMismatch { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get(
        &self,
        shape: impl Into<Shape>,
        name: &str,
        init: Init,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor, Error> {
        let shape: Shape = shape.into();
        let mut inner = self.lock();
        let Inner {
            store,
            sealed,
            collections,
            ..
        } = &mut *inner;
        // One walk: found, or made and created. Freezing is this store's
        // rule, applied when listing and handing out; the sharing layer
        // records every variable it makes trainable, so that `unfreeze`
        // brings it back. An invalid name is never found, so it is checked
        // only here, before anything is made.
        let (id, created) = store.get_or_make(name, b'.', collections, |leaf, scope| {
            check_name(name)?;
            if *sealed {
                return Err(Error::Sealed {
                    name: name.to_owned(),
                });
            }
            init.var(shape.dims(), dtype, device)
                .map_err(|e| crate::sharing::Error::InitFailed {
                    name: crate::short::name(leaf),
                    scope: crate::short::path(&scope.replace('.', "/")),
                    source: crate::sharing::InitError::new(e),
                })
                .map_err(Error::from)
        })?;
        inner.hand_out(id, name, |var| {
            if created {
                Ok(())
            } else {
                check_reuse(var, name, Some(shape.dims()), dtype, device)
            }
        })
    }

    /// The variable `name` (dotted) as a `Var`, or `None`. O(name length).
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::NotAVar`] if the name holds another
    /// value.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// assert_eq!(store.var("fc.weight")?.expect("built").dims(), &[2, 3]);
    /// assert!(store.var("fc.nope")?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn var(&self, name: &str) -> Result<Option<Var>, Error> {
        check_name(name)?;
        Ok(existing(&self.lock(), name)?.map(|(_, v)| v))
    }

    /// The dotted names of every `Var`, sorted. O(variables × depth).
    ///
    /// # Errors
    /// [`Error::InvalidName`] if a tree name (made through
    /// [`with_store`](Self::with_store)) contains `.`;
    /// [`Error::Checkpoint`]([`KeyCollision`](checkpoint::Error::KeyCollision))
    /// if two variables map to one dotted name.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// assert_eq!(store.names()?, ["fc.bias", "fc.weight"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn names(&self) -> Result<Vec<String>, Error> {
        Ok(self.lock().named()?.into_iter().map(|(k, ..)| k).collect())
    }

    /// Every `Var` with its dotted name, sorted by name. O(variables ×
    /// depth).
    ///
    /// # Errors
    /// As [`names`](Self::names).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// assert_eq!(store.named_vars()?[1].1.dims(), &[2, 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn named_vars(&self) -> Result<Vec<(String, Var)>, Error> {
        Ok(self
            .lock()
            .named()?
            .into_iter()
            .map(|(k, _, v)| (k, v))
            .collect())
    }

    /// Every `Var`, by name: candle's `VarMap::all_vars` in a deterministic
    /// order. O(variables × depth).
    ///
    /// # Errors
    /// As [`names`](Self::names).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu))?;
    /// assert_eq!(store.all_vars()?.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_vars(&self) -> Result<Vec<Var>, Error> {
        Ok(self.lock().named()?.into_iter().map(|(.., v)| v).collect())
    }

    /// The trainable `Var`s at or below `prefix` (`""` for all), by name:
    /// not frozen, and not created non-trainable through the sharing layer.
    /// Hand them to `AdamW::new`; one call per prefix gives parameter
    /// groups. O(variables × depth).
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a malformed prefix; as
    /// [`names`](Self::names).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// let vb = store.var_builder(DType::F32, &Device::Cpu);
    /// candle_nn::linear(3, 2, vb.pp("enc"))?;
    /// candle_nn::linear(2, 2, vb.pp("dec"))?;
    /// assert_eq!(store.trainable_vars("enc")?.len(), 2);
    /// store.freeze("enc")?;
    /// assert_eq!(store.trainable_vars("")?.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn trainable_vars(&self, prefix: &str) -> Result<Vec<Var>, Error> {
        Ok(self
            .trainable_named(prefix)?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }

    /// [`trainable_vars`](Self::trainable_vars) with their dotted names.
    pub(crate) fn trainable_named(&self, prefix: &str) -> Result<Vec<(String, Var)>, Error> {
        check_prefix(prefix)?;
        let inner = self.lock();
        Ok(inner
            .named()?
            .into_iter()
            .filter(|(k, id, _)| {
                within(k, prefix) && !inner.is_frozen(k) && inner.created_trainable(*id)
            })
            .map(|(k, _, v)| (k, v))
            .collect())
    }

    /// The trainable `Var`s of the sharing collection `collection`, by
    /// name. O(variables × depth).
    ///
    /// # Errors
    /// [`Error::Sharing`] from the collection listing; as
    /// [`names`](Self::names).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::sharing::TRAINABLE_VARIABLES;
    /// let store = scopetree::candle::CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu))?;
    /// assert_eq!(store.trainable_vars_in(TRAINABLE_VARIABLES)?.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn trainable_vars_in(&self, collection: &str) -> Result<Vec<Var>, Error> {
        let inner = self.lock();
        let members: FxHashSet<VarId> = inner
            .store
            .collection(collection, None)?
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        Ok(inner
            .named()?
            .into_iter()
            .filter(|(k, id, _)| {
                members.contains(id) && !inner.is_frozen(k) && inner.created_trainable(*id)
            })
            .map(|(.., v)| v)
            .collect())
    }

    /// Freezes every variable at or below `prefix`, present and future:
    /// `get` hands out a detached tensor for it (so a model built afterwards
    /// computes no gradient for it), and [`trainable_vars`](Self::trainable_vars)
    /// leaves it out (so an optimizer built afterwards never changes it).
    /// A model built *before* the freeze still holds the variable itself:
    /// rebuild the optimizer from `trainable_vars`. The rule is this
    /// store's: the sharing layer's trainable flag (and its
    /// `TRAINABLE_VARIABLES` collection) is left as the variable was
    /// created, trainable for every variable this store creates. O(rules).
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a malformed prefix.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// store.freeze("emb")?;
    /// candle_nn::embedding(5, 2, store.var_builder(DType::F32, &Device::Cpu).pp("emb"))?;
    /// assert!(store.is_frozen("emb.weight"));
    /// assert!(store.trainable_vars("")?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn freeze(&self, prefix: &str) -> Result<(), Error> {
        self.set_rule(prefix, true)
    }

    /// Undoes [`freeze`](Self::freeze) at or below `prefix` (a freeze of a
    /// wider prefix still holds elsewhere). O(rules).
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a malformed prefix.
    ///
    /// ```
    /// let store = scopetree::candle::CandleStore::new();
    /// store.freeze("enc")?;
    /// store.unfreeze("enc.head")?;
    /// assert!(store.is_frozen("enc.body.w"));
    /// assert!(!store.is_frozen("enc.head.w"));
    /// # Ok::<(), scopetree::candle::Error>(())
    /// ```
    pub fn unfreeze(&self, prefix: &str) -> Result<(), Error> {
        self.set_rule(prefix, false)
    }

    fn set_rule(&self, prefix: &str, frozen: bool) -> Result<(), Error> {
        check_prefix(prefix)?;
        let mut inner = self.lock();
        inner.rules.retain(|(p, _)| !within(p, prefix));
        if inner.is_frozen(prefix) != frozen {
            inner.rules.push((prefix.to_owned(), frozen));
        }
        Ok(())
    }

    /// Whether the dotted `name` is frozen. O(rules).
    ///
    /// ```
    /// let store = scopetree::candle::CandleStore::new();
    /// store.freeze("a")?;
    /// assert!(store.is_frozen("a.w") && !store.is_frozen("ab.w"));
    /// # Ok::<(), scopetree::candle::Error>(())
    /// ```
    pub fn is_frozen(&self, name: &str) -> bool {
        self.lock().is_frozen(name)
    }

    /// Seals the store: from now on a `get` of an unknown name is
    /// [`Error::Sealed`] instead of a new variable. Seal after loading a
    /// checkpoint, so that a misspelt layer name fails instead of training
    /// from zeros. O(1).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// store.seal();
    /// assert!(candle_nn::linear(2, 2, store.var_builder(DType::F32, &Device::Cpu)).is_err());
    /// assert!(store.names()?.is_empty());
    /// # Ok::<(), scopetree::candle::Error>(())
    /// ```
    pub fn seal(&self) {
        self.lock().sealed = true;
    }

    /// Lets the store create variables again. O(1).
    ///
    /// ```
    /// let store = scopetree::candle::CandleStore::new();
    /// store.seal();
    /// store.unseal();
    /// assert!(!store.is_sealed());
    /// ```
    pub fn unseal(&self) {
        self.lock().sealed = false;
    }

    /// Whether the store is sealed. O(1).
    ///
    /// ```
    /// assert!(!scopetree::candle::CandleStore::new().is_sealed());
    /// ```
    pub fn is_sealed(&self) -> bool {
        self.lock().sealed
    }

    /// The variables no model has asked for through this store (a load
    /// created them, or the sharing API did), by name: after loading a
    /// checkpoint and building the model, the names the model never used.
    /// O(variables × depth).
    ///
    /// # Errors
    /// As [`names`](Self::names).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// candle_nn::linear(2, 2, store.var_builder(DType::F32, &Device::Cpu))?;
    /// assert!(store.unused()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unused(&self) -> Result<Vec<String>, Error> {
        let inner = self.lock();
        Ok(inner
            .named()?
            .into_iter()
            .filter(|(_, id, _)| inner.asked.get(id.key) != Some(&id.tree))
            .map(|(k, ..)| k)
            .collect())
    }

    /// Saves every variable to `path` as safetensors with candle's dotted
    /// names: the file `VarMap::save` writes for the same variables, byte
    /// for byte, written atomically (a temporary file renamed into place).
    /// O(variables × depth + bytes written).
    ///
    /// # Errors
    /// As [`names`](Self::names) (nothing is written then);
    /// [`Error::Checkpoint`]: a tensor that cannot be copied to the host, or
    /// the write failing (nothing is left at `path` then).
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("st-doc-cs-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// candle_nn::linear(2, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// let report = store.save(dir.join("fc.safetensors"))?;
    /// assert_eq!(report.keys, ["fc.bias", "fc.weight"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save(&self, path: impl AsRef<Path>) -> Result<SaveReport, Error> {
        self.save_with(&SaveOptions::new(), |store, opts| {
            checkpoint::save_store(store, path, opts)
        })
    }

    /// Runs a save of the store with `opts` made candle's (dotted names,
    /// `Var`s), after checking that every tree name survives the dots.
    fn save_with(
        &self,
        opts: &SaveOptions,
        save: impl FnOnce(&VariableStore, &SaveOptions) -> Result<SaveReport, checkpoint::Error>,
    ) -> Result<SaveReport, Error> {
        let opts = opts.clone().separator(Separator::Dot).with_type::<Var>();
        let inner = self.lock();
        // A dotted tree name would come back as another path.
        inner.named()?;
        Ok(save(&inner.store, &opts)?)
    }

    /// Saves every variable as a sharded checkpoint in the Hugging Face
    /// layout into the directory `dir`, with candle's dotted names:
    /// `model-0000k-of-0000n.safetensors` shards and
    /// `model.safetensors.index.json`, as
    /// [`checkpoint::save_sharded`] writes them. `opts` sets the largest
    /// shard ([`SaveOptions::max_shard_size`]), the dtype floats are
    /// written in ([`SaveOptions::floats_as`], e.g. bf16 to publish), the
    /// keys kept ([`SaveOptions::filter`], e.g. only the trained tensors)
    /// and the metadata; its separator is ignored (always `.`). candle's
    /// `VarBuilder::from_mmaped_safetensors` reads the shards, and
    /// [`load`](Self::load) reads the index or the directory. O(variables
    /// × depth + bytes written).
    ///
    /// # Errors
    /// As [`save`](Self::save); [`Error::Checkpoint`] if `dir` cannot be
    /// made or a shard or the index cannot be written.
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("st-doc-css-{}", std::process::id()));
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, checkpoint::{LoadOptions, SaveOptions}};
    /// let store = CandleStore::new();
    /// candle_nn::linear(16, 16, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// let report = store.save_sharded(&dir, &SaveOptions::new().max_shard_size(512))?;
    /// assert_eq!(report.shards.len(), 2); // the bias (64 B), then the weight (1 KiB)
    ///
    /// let fresh = CandleStore::new();
    /// fresh.load(&dir, &LoadOptions::new().create(true))?;
    /// assert_eq!(fresh.names()?, ["fc.bias", "fc.weight"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save_sharded(
        &self,
        dir: impl AsRef<Path>,
        opts: &SaveOptions,
    ) -> Result<SaveReport, Error> {
        self.save_with(opts, |store, opts| {
            checkpoint::save_store_sharded(store, dir, opts)
        })
    }

    /// Loads `path` (dotted names, as candle writes them): strict and atomic
    /// by default, as [`checkpoint::load`]: every name, shape and dtype is
    /// checked against the file's header before anything changes. `path`
    /// is a safetensors file, or a sharded Hugging Face checkpoint (its
    /// `model.safetensors.index.json` or its directory), checked across all
    /// its shards. Loaded
    /// values are written into the existing `Var`s with `Var::set`, one
    /// tensor at a time, so a model already built sees them. With
    /// [`LoadOptions::create`] the variables the file names are created (on
    /// the CPU) before the model is built; the model's `get`s then reuse
    /// them, checked. The separator of `opts` is ignored (always `.`).
    /// O(header + variables × depth + bytes read); memory: about one tensor
    /// beyond the header (the file's size with
    /// [`rollback(true)`](LoadOptions::rollback), or for the variables a
    /// load creates).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] with every missing, unexpected and mismatched
    /// name in one [`Mismatch`](checkpoint::Error::Mismatch), or a bad file;
    /// the store is then unchanged. Only a read error of the disk after
    /// every check has passed can leave some `Var`s loaded
    /// ([`checkpoint::Error::Data`] with `rolled_back: false`);
    /// `rollback(true)` reads the whole file before the first `Var::set`,
    /// so that even that changes nothing.
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("st-doc-cl-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, checkpoint::LoadOptions};
    /// let trained = CandleStore::new();
    /// candle_nn::linear(2, 2, trained.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// trained.save(dir.join("fc.safetensors"))?;
    ///
    /// let fresh = CandleStore::new();
    /// fresh.load(dir.join("fc.safetensors"), &LoadOptions::new().create(true))?;
    /// fresh.seal();
    /// candle_nn::linear(2, 2, fresh.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// assert!(fresh.unused()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(&self, path: impl AsRef<Path>, opts: &LoadOptions) -> Result<LoadReport, Error> {
        let mut opts = opts
            .clone()
            .separator(Separator::Dot)
            .with_crate_type::<Var>();
        opts.create_with = Some(var_codec);
        let mut inner = self.lock();
        let report = checkpoint::load_store(&mut inner.store, path, &opts)?;
        // The variables the load made join the collections, as if the model
        // had made them (the store's freeze rules apply on top).
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
}

/// The `Var` named `name` (dotted, checked) with its handle, if any.
fn existing(inner: &Inner, name: &str) -> Result<Option<(VarId, Var)>, Error> {
    let Some(id) = inner.store.find_sep(name, b'.') else {
        return Ok(None);
    };
    Ok(Some((id, var_ref(&inner.store, id, name)?.clone())))
}

/// The `Var` variable `id` (named `name`) holds; [`Error::NotAVar`] if it
/// holds something else or nothing.
fn var_ref<'a>(store: &'a VariableStore, id: VarId, name: &str) -> Result<&'a Var, Error> {
    let tree = store.tree();
    match tree.get::<Var>(id) {
        Ok(v) => Ok(v),
        Err(_) => Err(Error::NotAVar {
            name: name.to_owned(),
            holds: tree
                .type_name(id)
                .map_err(crate::sharing::Error::from)?
                .unwrap_or("nothing"),
        }),
    }
}

/// The checks a `get` makes of an existing variable: its shape, when one is
/// asked for (`get_unchecked` asks for none), its dtype and its device.
fn check_reuse(
    var: &Var,
    name: &str,
    dims: Option<&[usize]>,
    dtype: DType,
    device: &Device,
) -> Result<(), Error> {
    if let Some(dims) = dims.filter(|&d| d != var.dims()) {
        return Err(Error::ShapeMismatch {
            name: name.to_owned(),
            asked: dims.to_vec(),
            found: var.dims().to_vec(),
        });
    }
    if var.dtype() != dtype {
        return Err(Error::DtypeMismatch {
            name: name.to_owned(),
            asked: dtype,
            found: var.dtype(),
        });
    }
    if !var.device().same_device(device) {
        return Err(Error::DeviceMismatch {
            name: name.to_owned(),
            asked: format!("{:?}", device.location()),
            found: format!("{:?}", var.device().location()),
        });
    }
    Ok(())
}

/// The backend `VarBuilder` calls: [`CandleStore::get`], with errors
/// wrapped in `candle_core::Error`.
impl SimpleBackend for CandleStore {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        Ok(CandleStore::get(self, s, name, h, dtype, dev)?)
    }

    /// An existing variable of any shape, checked for dtype and device.
    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        check_name(name)?;
        let mut inner = self.lock();
        let Some(id) = inner.store.find_sep(name, b'.') else {
            return Err(Error::Missing {
                name: name.to_owned(),
            }
            .into());
        };
        Ok(inner.hand_out(id, name, |var| check_reuse(var, name, None, dtype, dev))?)
    }

    /// Whether `name` is a `Var` of the store (what [`var`](CandleStore::var)
    /// finds, without cloning it: `layer_norm` asks this on every build).
    fn contains_tensor(&self, name: &str) -> bool {
        // No name check: the walk never finds an invalid name.
        let inner = self.lock();
        let store = &inner.store;
        store
            .find_sep(name, b'.')
            .is_some_and(|id| store.tree().get::<Var>(id).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass check gives the reason the plain definition gives, for
    /// every name of up to five characters over `a`, `.`, `/` and `é`.
    #[test]
    fn the_name_check_agrees_with_its_definition() {
        fn reference(name: &str) -> Option<&'static str> {
            if name.is_empty() {
                Some("it is empty")
            } else if name.contains('/') {
                Some("it contains `/`, which the tree uses between scopes")
            } else if name.split('.').any(str::is_empty) {
                Some("it has an empty component")
            } else {
                None
            }
        }
        let alphabet = ['a', '.', '/', 'é'];
        let mut names = vec![String::new()];
        let mut checked = 0;
        for _ in 0..=5 {
            let mut longer = Vec::new();
            for n in &names {
                let got = match check_name(n) {
                    Ok(()) => None,
                    Err(Error::InvalidName { reason, .. }) => Some(reason),
                    Err(e) => panic!("{n:?}: {e}"),
                };
                assert_eq!(got, reference(n), "{n:?}");
                checked += 1;
                longer.extend(alphabet.iter().map(|c| format!("{n}{c}")));
            }
            names = longer;
        }
        assert_eq!(checked, 1 + 4 + 16 + 64 + 256 + 1024);
    }

    /// A loop that builds and deletes a layer keeps the record of handed-out
    /// variables bounded by the live ones.
    #[test]
    fn the_record_of_asked_variables_stays_bounded_under_churn() {
        let store = CandleStore::new();
        for _ in 0..1_000 {
            store
                .get(2, "tmp.w", Init::Const(0.), DType::F32, &Device::Cpu)
                .expect("created");
            store
                .with_store(|s| {
                    let tmp = s.tree().kid(s.tree().root(), "tmp")?.expect("built");
                    s.delete_scope(tmp)
                })
                .expect("deleted");
        }
        let asked = store.lock().asked.len();
        assert!(asked <= 2 + 64, "{asked} handles kept for no live variable");
    }
}
