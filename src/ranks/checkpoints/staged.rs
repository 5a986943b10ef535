//! What a save beside training hands its background thread: this rank's
//! shards, staged into buffers kept from save to save, and how a plan
//! reports what it staged. Filled by each plan's staging
//! ([`ShardedPlan`](crate::ranks::ShardedPlan)), written by
//! [`AsyncSaver`](crate::ranks::AsyncSaver)'s thread.

use std::collections::HashMap;
use std::path::PathBuf;

use super::shards::{Prepared, ShardedSave, checksum_text, written};
use super::state_shards::{StateFile, write_flushed};
use crate::checkpoint::{self, Dtype};
use crate::ranks::error::Error;
use crate::ranks::vars::checksum::written_hash;

/// One staged shard of parameters: each tensor's key, dtype and shape (in
/// key order) and its bytes in a staging buffer.
pub(in crate::ranks) struct Shard {
    pub(in crate::ranks) tensors: Vec<(String, Dtype, Vec<usize>)>,
    /// Each tensor's bytes (the staging buffers, handed back when written).
    pub(in crate::ranks) buffers: Vec<Vec<u8>>,
    pub(in crate::ranks) floats_as: Option<Dtype>,
    pub(in crate::ranks) metadata: HashMap<String, String>,
    /// Whether the writer adds every tensor's checksum to the metadata,
    /// from its staged bytes as written (off the caller's thread).
    pub(in crate::ranks) checksummed: bool,
    pub(in crate::ranks) path: PathBuf,
}

impl Shard {
    /// Writes the shard; hands the buffers back for the next save.
    fn write(mut self) -> (Vec<Vec<u8>>, Result<(), checkpoint::Error>) {
        if self.checksummed {
            for ((key, dtype, _), bytes) in self.tensors.iter().zip(&self.buffers) {
                let sum = written_hash(*dtype, written(*dtype, self.floats_as), bytes);
                let (key, value) = checksum_text(key, sum);
                self.metadata.insert(key, value);
            }
        }
        let bytes = self.buffers.iter().map(Vec::as_slice);
        let written = write_flushed(
            &self.tensors,
            bytes,
            self.floats_as,
            Some(self.metadata),
            &self.path,
        );
        (self.buffers, written)
    }
}

/// This rank's shards, staged.
pub(in crate::ranks) struct Shards {
    /// The parameters' shard, if this rank writes one.
    pub(in crate::ranks) model: Option<Shard>,
    /// The sliced state's shard, if this rank writes one, with its buffers
    /// and directory.
    pub(in crate::ranks) state: Option<(StateFile, Vec<Vec<u8>>, PathBuf)>,
    /// The state's buffers when this rank writes no state shard (kept for
    /// the next save).
    pub(in crate::ranks) spare_state: Vec<Vec<u8>>,
}

/// What the background writer hands back: the staging buffers (the
/// parameters' and the state's), and how the writes went.
pub(in crate::ranks) type Written = ((Vec<Vec<u8>>, Vec<Vec<u8>>), Result<(), Error>);

impl Shards {
    /// Writes the shards, the parameters' first; hands the buffers back
    /// for the next save. O(bytes).
    pub(in crate::ranks) fn write(self) -> Written {
        let (model, written) = match self.model {
            Some(shard) => {
                let (buffers, written) = shard.write();
                (buffers, written.map_err(Error::from))
            }
            None => (Vec::new(), Ok(())),
        };
        let (state, written) = match self.state {
            Some((file, buffers, dir)) => {
                let w = written.and_then(|()| file.write(&dir, None, &buffers));
                (buffers, w)
            }
            None => (self.spare_state, written),
        };
        ((model, state), written)
    }
}

/// The staging buffers a saver keeps from save to save: one per tensor of
/// this rank's last shard, and the sliced state's, with their capacities
/// as of the last staging.
#[derive(Default)]
pub struct Spare {
    pub(in crate::ranks) model: Vec<Vec<u8>>,
    pub(in crate::ranks) state: Vec<Vec<u8>>,
    /// The parameters' buffers' capacity in bytes, as of the last staging.
    pub(in crate::ranks) model_bytes: usize,
    /// The state's buffers' capacity in bytes, as of the last staging.
    pub(in crate::ranks) state_bytes: usize,
}

impl Spare {
    /// Keeps the buffers a writer hands back for the next save (an empty
    /// list of the parameters' buffers keeps the ones held). O(1).
    pub(in crate::ranks) fn put_back(&mut self, model: Vec<Vec<u8>>, state: Vec<Vec<u8>>) {
        if !model.is_empty() {
            self.model = model;
        }
        self.state = state;
    }
}

/// What a plan staged for a save beside training: the save's layout, this
/// rank's report, and the shards to write (`None`: this rank writes none;
/// an error found while staging, reported with the writes, when the other
/// ranks are already writing theirs).
pub struct Staged {
    pub(in crate::ranks) prepared: Prepared,
    pub(in crate::ranks) report: ShardedSave,
    pub(in crate::ranks) shards: Result<Option<Shards>, Error>,
    /// This rank's bytes to write, as held.
    pub(in crate::ranks) bytes: u64,
    /// Whether the shards are left to the background thread (`false`:
    /// over the budget, they were written before `stage` returned).
    pub(in crate::ranks) in_background: bool,
}
