//! The store's checkpoints: saves (one file or sharded) and loads in
//! candle's dotted names, through the checkpoint layer.

use std::path::Path;

use candle_core::Var;

use super::error::Error;
use super::store::CandleStore;
use super::var::var_codec;
use crate::checkpoint::{self, LoadOptions, LoadReport, SaveOptions, SaveReport, Separator};
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
