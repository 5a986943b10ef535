//! A save: the module's tensors collected lazily by burn-store, renamed,
//! and streamed by the checkpoint layer into its files, each tensor read
//! back from its device only while it is written.

use std::any::Any;

use burn_core::tensor::{BoolStore, DType};
use burn_store::ModuleSnapshot;
use burn_store::burn_pack::Tensor as PackTensor;

use super::error::{Error, cut};
use super::names::{PARAM_ID_PREFIX, remap_all, to_file};
use super::store::{CheckpointStore, Target};
use crate::checkpoint::{self, SaveOptions, Streamed, save_streamed};

/// Streams a collected tensor's bytes as a checkpoint holds them, in
/// pieces of at most `chunk`: burn's little-endian bytes, bools of a 32-bit
/// storage narrowed to one byte each. Memory: the tensor read back once.
fn write_pack(
    value: &dyn Any,
    chunk: usize,
    put: &mut dyn FnMut(&[u8]) -> Result<(), checkpoint::Error>,
) -> Result<(), checkpoint::Error> {
    let Some(t) = value.downcast_ref::<PackTensor>() else {
        unreachable!("the burn save streams burn-store tensors only")
    };
    let bytes = t.to_bytes().map_err(|e| checkpoint::Error::BadTensor {
        reason: format!("burn could not read it back: {}", cut(&e.to_string())),
    })?;
    if t.dtype == DType::Bool(BoolStore::U32) {
        let narrowed: Vec<u8> = bytes
            .chunks_exact(4)
            .map(|c| u8::from(c != [0; 4]))
            .collect();
        return narrowed.chunks(chunk.max(1)).try_for_each(put);
    }
    bytes.chunks(chunk.max(1)).try_for_each(put)
}

impl CheckpointStore {
    /// The save behind `collect_from`. See the type's documentation.
    pub(crate) fn save_from<M: ModuleSnapshot>(&mut self, module: &M) -> Result<(), Error> {
        self.cache = None;
        let shown = self.path.to_string_lossy().into_owned();
        let adapter = self.to_adapter.as_ref().map(|a| a.clone_box());
        let tensors = module.collect(self.filter.clone(), adapter, self.skip_enum_variants);
        let keys = remap_all(
            &self.remapper,
            tensors.iter().map(|t| t.name.as_str()),
            &shown,
        )?;
        let mut meta = self.metadata.clone();
        let mut streamed = Vec::with_capacity(keys.len());
        for (key, i) in keys {
            let t = &tensors[i];
            let Some(dtype) = to_file(t.dtype) else {
                return Err(Error::Unsupported {
                    name: t.name.clone(),
                    dtype: format!("{:?}", t.dtype),
                });
            };
            if let Some(id) = t.param_id {
                meta.insert(format!("{PARAM_ID_PREFIX}{key}"), id.to_string());
            }
            streamed.push(Streamed {
                key,
                dtype,
                shape: t.shape.to_vec(),
                value: t as &dyn Any,
                write: write_pack,
            });
        }
        let mut opts = SaveOptions::new()
            .max_shard_size(self.max_shard_size)
            .metadata(meta);
        if let Some(f) = self.floats_as {
            opts = opts.floats_as(f);
        }
        let sharded = self.target == Target::Sharded;
        save_streamed(streamed, &self.path, sharded, true, &opts)?;
        Ok(())
    }
}
