//! Sealing: a sealed store's `get` of an unknown name is an error instead
//! of a new variable.

use super::store::CandleStore;

impl CandleStore {
    /// Seals the store: from now on a `get` of an unknown name is
    /// [`Error::Sealed`](super::Error::Sealed) instead of a new variable.
    /// Seal after loading a checkpoint, so that a misspelt layer name fails
    /// instead of training from zeros. O(1).
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
}
