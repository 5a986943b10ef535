//! burn-store's entry points: the [`ModuleStore`] impl, and the
//! checkpoint's tensors as `get_tensor`, `get_all_tensors` and `keys` list
//! them (their bytes read, and checked, on demand).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use burn_store::burn_pack::{Error as PackError, Tensor as PackTensor};
use burn_store::{ApplyResult, ModuleSnapshot, ModuleStore};

use super::error::Error;
use super::load::read_checked;
use super::names::{PARAM_ID_PREFIX, remap_all, to_burn};
use super::store::CheckpointStore;
use crate::checkpoint::open_checkpoint;

impl ModuleStore for CheckpointStore {
    type Error = Error;

    /// Saves `module` (see [`CheckpointStore`]). O(the module's bytes);
    /// memory: one file's bytes.
    fn collect_from<M: ModuleSnapshot>(&mut self, module: &M) -> Result<(), Error> {
        self.save_from(module)
    }

    /// Loads the checkpoint into `module`, strictly and atomically (see
    /// [`CheckpointStore`]). O(headers + module + bytes read); memory: one
    /// shard beyond the module.
    fn apply_to<M: ModuleSnapshot>(&mut self, module: &mut M) -> Result<ApplyResult, Error> {
        self.load_into(module)
    }

    /// The checkpoint tensor named `name` (after remapping), its bytes
    /// read when asked for. O(headers) the first time, then a lookup.
    fn get_tensor(&mut self, name: &str) -> Result<Option<&PackTensor>, Error> {
        Ok(self.tensors()?.get(name))
    }

    /// Every tensor of the checkpoint (the index's, for a sharded one),
    /// by name after remapping. O(headers) the first time.
    fn get_all_tensors(&mut self) -> Result<&BTreeMap<String, PackTensor>, Error> {
        self.tensors()
    }

    /// The names of [`get_all_tensors`](Self::get_all_tensors), sorted.
    fn keys(&mut self) -> Result<Vec<String>, Error> {
        Ok(self.tensors()?.keys().cloned().collect())
    }
}

impl CheckpointStore {
    /// The cached listing, made on first use: each tensor deferred, read
    /// and checked against its checksum when its bytes are asked for.
    fn tensors(&mut self) -> Result<&BTreeMap<String, PackTensor>, Error> {
        if self.cache.is_none() {
            let opened = open_checkpoint(&self.path)?;
            let names = remap_all(
                &self.remapper,
                opened.tensors.iter().map(|(_, t)| t.key.as_str()),
                &opened.shown,
            )?;
            let described: Vec<_> = opened
                .tensors
                .iter()
                .map(|(part, t)| {
                    let id = opened.parts[*part]
                        .metadata
                        .as_ref()
                        .and_then(|m| m.get(&format!("{PARAM_ID_PREFIX}{}", t.key)))
                        .and_then(|v| v.parse::<u64>().ok());
                    (to_burn(t.dtype), t.shape.clone(), id)
                })
                .collect();
            let opened = Arc::new(Mutex::new(opened));
            let mut cache = BTreeMap::new();
            for (name, i) in names {
                let (Some(dtype), shape, id) = described[i].clone() else {
                    // No burn dtype (FP8, sub-byte): not a tensor burn can hold.
                    continue;
                };
                let opened = Arc::clone(&opened);
                let len = shape.iter().product::<usize>() * dtype.size();
                let tensor = PackTensor::deferred(name.clone(), dtype, shape, id, len, move || {
                    let opened = opened
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    read_checked(&opened, i)
                        .map(super::load::Aligned::into_bytes)
                        .map_err(|(file, reason)| PackError::IoError(format!("{file}: {reason}")))
                });
                cache.insert(name, tensor);
            }
            self.cache = Some(cache);
        }
        Ok(self.cache.get_or_insert_with(BTreeMap::new))
    }
}
