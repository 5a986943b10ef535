//! Listing the store's `Var`s by dotted name: all of them, the trainable
//! ones (by prefix or collection), and the ones no model asked for.

use candle_core::Var;
use rustc_hash::FxHashSet;

use super::error::Error;
use super::names::{check_prefix, within};
use super::store::{CandleStore, Inner};
use crate::VarId;
use crate::checkpoint::{self, Separator};

impl Inner {
    /// Every `Var` of the tree with its dotted name and handle, sorted by
    /// name. A tree name with `.` in it (made through the sharing API)
    /// would read as another path, so it is an error, as is a key two
    /// variables share.
    pub(super) fn named(&self) -> Result<Vec<(String, VarId, Var)>, Error> {
        let tree = self.store.tree();
        // The tree's own paths, sorted. Without a `.` in any, each becomes
        // its dotted name by swapping `/` for `.`, which keeps the order
        // (no byte lies between the two) and makes no two alike.
        let walked = checkpoint::walk(tree, tree.root(), Separator::Slash, None)?;
        if walked.vars.iter().any(|(path, _)| path.contains('.')) {
            return self.named_dotted();
        }
        let mut out = Vec::with_capacity(walked.vars.len());
        for (path, v) in walked.vars {
            if let Ok(var) = tree.get::<Var>(v) {
                out.push((path.replace('/', "."), v, var.clone()));
            }
        }
        Ok(out)
    }

    /// [`named`](Self::named) where a name holds a `.`: walked by dotted
    /// name, so that two variables with one dotted name are a key
    /// collision, and otherwise a `Var` whose name holds a `.` is an
    /// error. O(variables × depth), twice.
    fn named_dotted(&self) -> Result<Vec<(String, VarId, Var)>, Error> {
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
    pub(super) fn created_trainable(&self, var: VarId) -> bool {
        self.store.is_trainable(var).ok().flatten().unwrap_or(true)
    }
}

impl CandleStore {
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
        let inner = self.lock();
        let mut names: Vec<String> = inner.named()?.into_iter().map(|(k, ..)| k).collect();
        // A deferred load's variables are named before they are placed.
        if let Some(p) = &inner.pending {
            names.extend(p.keys.iter().cloned());
            names.sort_unstable();
            names.dedup();
        }
        Ok(names)
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
            .placed()?
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
        Ok(self
            .placed()?
            .named()?
            .into_iter()
            .map(|(.., v)| v)
            .collect())
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

    /// [`trainable_vars`](Self::trainable_vars) with their dotted names, by
    /// name. O(variables × depth).
    ///
    /// # Errors
    /// As [`trainable_vars`](Self::trainable_vars).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// let names: Vec<String> = store.trainable_named_vars("")?.into_iter().map(|(n, _)| n).collect();
    /// assert_eq!(names, ["fc.bias", "fc.weight"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn trainable_named_vars(&self, prefix: &str) -> Result<Vec<(String, Var)>, Error> {
        self.trainable_named(prefix)
    }

    /// [`trainable_vars`](Self::trainable_vars) with their dotted names.
    pub(crate) fn trainable_named(&self, prefix: &str) -> Result<Vec<(String, Var)>, Error> {
        check_prefix(prefix)?;
        let inner = self.placed()?;
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
        let inner = self.placed()?;
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
        let inner = self.placed()?;
        Ok(inner
            .named()?
            .into_iter()
            .filter(|(_, id, _)| inner.asked.get(id.key) != Some(&id.tree))
            .map(|(k, ..)| k)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::Init;

    #[test]
    fn paths_turned_into_dotted_names_are_the_dotted_walk_in_its_order() {
        let store = CandleStore::new();
        // Names whose bytes sit on either side of `.` and `/` (`-` below
        // both, `0` and `_` above), at several depths.
        for name in [
            "a.x", "a-x", "a0", "a_x", "a.b.x", "a.b-x", "a-b.x", "ab.x", "a.b0", "z", "a.z.y.x",
        ] {
            store
                .get(1, name, Init::Const(0.0), DType::F32, &Device::Cpu)
                .unwrap();
        }
        let inner = store.lock();
        let fast: Vec<String> = inner
            .named()
            .unwrap()
            .into_iter()
            .map(|(k, ..)| k)
            .collect();
        let walked: Vec<String> = (inner.named_dotted().unwrap().into_iter())
            .map(|(k, ..)| k)
            .collect();
        assert_eq!(fast, walked);
        let mut sorted = fast.clone();
        sorted.sort_unstable();
        assert_eq!(fast, sorted);
        assert_eq!(fast.len(), 11);
    }
}
