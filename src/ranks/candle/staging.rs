//! [`CandlePlan`] as a [`ShardedPlan`] over a [`CandleStore`]: its
//! checkpoints across ranks kept by a
//! [`CheckpointManager`](crate::ranks::CheckpointManager), and written
//! beside training by an [`AsyncSaver`](crate::ranks::AsyncSaver), which
//! copies this rank's shard (from any device) into host buffers kept from
//! save to save and hashes and writes it on a background thread.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use candle_core::Var;

use super::plan::{CandlePlan, candle};
use super::shards::write_shard;
use crate::candle::CandleStore;
use crate::checkpoint::{Checkpointable, Dtype, SaveOptions};
use crate::ranks::checkpoints::plans::{Sealed, SealedStage, ShardedPlan, StagedPlan};
use crate::ranks::checkpoints::shards::{Prepared, ShardedLoad, ShardedSave, shard_meta};
use crate::ranks::checkpoints::staged::{Shard, Shards, Spare, Staged};
use crate::ranks::error::Error;
use crate::ranks::transport::collective::Collective;

/// The host buffers' piece size when copying a variable off its device.
const PIECE: usize = 8 << 20;

impl ShardedPlan<CandleStore> for CandlePlan {}

impl StagedPlan<CandleStore> for CandlePlan {}

impl Sealed<CandleStore> for CandlePlan {
    fn watched(&self) -> (Arc<str>, Option<Duration>) {
        CandlePlan::watched(self)
    }

    fn save_shards_of<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        store: &CandleStore,
        dir: &Path,
        opts: &SaveOptions,
    ) -> Result<ShardedSave, Error> {
        self.save_shards(comm, store, dir, opts)
    }

    fn load_shards_into<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        store: &mut CandleStore,
        dir: &Path,
    ) -> Result<ShardedLoad, Error> {
        self.load_shards(comm, store, dir)
    }
}

impl SealedStage<CandleStore> for CandlePlan {
    fn stage<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        store: &CandleStore,
        dir: &Path,
        opts: &SaveOptions,
        spare: &mut Spare,
        budget: u64,
    ) -> Result<Staged, Error> {
        let (prepared, named) = self.prepare_save(comm, store, dir, opts, "starting a save")?;
        let mut report = prepared.report();
        let bytes: u64 = named[prepared.my_range()]
            .iter()
            .map(|(_, v)| (v.elem_count() * v.as_tensor().dtype().size_in_bytes()) as u64)
            .sum();
        if bytes > budget {
            // Over the budget: written now, streamed from the variables.
            let written = write_shard(store, &named, &prepared, opts, dir, &mut report);
            return Ok(Staged {
                prepared,
                report,
                shards: written.map(|()| None),
                bytes,
                in_background: false,
            });
        }
        let shards = match &report.mine {
            None => Ok(None),
            Some(shard) => {
                let mine = &named[prepared.my_range()];
                stage_shard(mine, &prepared, opts, &dir.join(shard), spare).map(|model| {
                    Some(Shards {
                        model: Some(model),
                        state: None,
                        spare_state: std::mem::take(&mut spare.state),
                    })
                })
            }
        };
        Ok(Staged {
            prepared,
            report,
            shards,
            bytes,
            in_background: true,
        })
    }
}

/// Copies the variables `mine` (this rank's shard of `prepared`, by key)
/// into `spare`'s buffers, as held (of any dtype, from any device, in
/// pieces of [`PIECE`] bytes), and describes the shard for the writer,
/// which adds every tensor's checksum, of its bytes as written (converted
/// by `floats_as` where it applies). O(bytes of the shard); allocates only
/// where a buffer is too small.
///
/// # Errors
/// [`Error::Candle`] naming the variable that cannot be read; the buffers
/// stay in `spare`.
fn stage_shard(
    mine: &[(String, Var)],
    prepared: &Prepared,
    opts: &SaveOptions,
    path: &Path,
    spare: &mut Spare,
) -> Result<Shard, Error> {
    let mut buffers = std::mem::take(&mut spare.model);
    buffers.resize_with(mine.len(), Vec::new);
    let mut tensors = Vec::with_capacity(mine.len());
    for (buf, (key, var)) in buffers.iter_mut().zip(mine) {
        let dtype: Dtype = var.as_tensor().dtype().into();
        buf.clear();
        buf.reserve(var.elem_count() * var.as_tensor().dtype().size_in_bytes());
        let copied = Checkpointable::write_le(var, PIECE, &mut |piece| {
            buf.extend_from_slice(piece);
            Ok(())
        });
        if let Err(e) = copied {
            spare.model = buffers;
            return Err(candle(key, candle_core::Error::Msg(e.to_string())));
        }
        tensors.push((key.clone(), dtype, var.dims().to_vec()));
    }
    spare.model_bytes = buffers.iter().map(Vec::capacity).sum();
    Ok(Shard {
        tensors,
        buffers,
        floats_as: opts.floats_as,
        metadata: shard_meta(opts, &prepared.save_id, Vec::new()),
        checksummed: true,
        path: path.to_owned(),
    })
}
