//! The store's checkpoints: saves (one file or sharded) and loads in
//! candle's dotted names, through the checkpoint layer.

use std::path::Path;

use candle_core::Var;

use super::error::Error;
use super::store::CandleStore;
use crate::checkpoint::{self, SaveOptions, SaveReport, Separator};
use crate::sharing::VariableStore;

impl CandleStore {
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
    /// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
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

    /// Saves the variables `opts` keeps to the file `path`, as
    /// [`save`](Self::save) does with `opts`' filter, metadata and
    /// [`floats_as`](SaveOptions::floats_as) (its separator is always
    /// `.`): the ranks layer writes one shard of a checkpoint with it.
    /// O(variables × depth + bytes written).
    pub(crate) fn save_file_with(
        &self,
        path: impl AsRef<Path>,
        opts: &SaveOptions,
    ) -> Result<SaveReport, Error> {
        self.save_with(opts, |store, opts| {
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
        let inner = self.placed()?;
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
    /// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
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
}
