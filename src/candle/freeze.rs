//! Freezing by prefix: the store's rules, which `get` and the trainable
//! listings apply on top of the sharing layer's trainable flag.

use super::error::Error;
use super::names::{check_prefix, within};
use super::store::{CandleStore, Inner};

impl Inner {
    /// Whether the dotted `name` is frozen: the longest rule that selects
    /// it says so. O(rules).
    #[inline]
    pub(super) fn is_frozen(&self, name: &str) -> bool {
        self.rules
            .iter()
            .filter(|(p, _)| within(name, p))
            .max_by_key(|(p, _)| p.len())
            .is_some_and(|&(_, f)| f)
    }
}

impl CandleStore {
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
}
