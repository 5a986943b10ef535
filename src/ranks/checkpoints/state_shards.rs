//! The sliced state's part of a sharded checkpoint: in a save, the whole
//! tensors each rank holds, written as one shard of
//! `optimizer.safetensors.index.json`'s; in a load, the files the state is
//! read from (the optimizer index, or the parameters' own files when a
//! save held the state whole), checked against the plan and read by the
//! tensors' holders.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;

use crate::ScopeTree;
use crate::checkpoint::{
    self, CHECKSUM_PREFIX, Dtype, INDEX_FILE, OPTIMIZER_INDEX_FILE, Opened, SAVE_ID, Staged,
    open_checkpoint, shard_file, sync_file, write_tensors,
};
use crate::ranks::error::Error;
use crate::ranks::layout::sliced::BoundState;
use crate::ranks::layout::slices::gather_whole;
use crate::ranks::plan::agree::Same;
use crate::ranks::plan::sync_plan::SyncPlan;
use crate::ranks::transport::collective::Collective;
use crate::ranks::vars::checksum::hash_bytes;
use crate::ranks::vars::values::Slot;

/// The sliced state of a save under way: its tensors and their shards.
pub(in crate::ranks) struct PreparedState {
    pub(in crate::ranks) bound: BoundState,
    /// Every shard's file name, in order.
    pub(in crate::ranks) shards: Vec<String>,
    /// Per tensor (as `bound.tensors`): its shard, an index into `shards`.
    pub(in crate::ranks) shard_of: Vec<usize>,
    /// The shard this rank writes, if it holds any tensor.
    pub(in crate::ranks) mine: Option<usize>,
    /// The state's bytes in all.
    pub(in crate::ranks) total: u64,
}

/// One staged shard of state: its tensors' keys, dtypes and shapes, where
/// each one's bytes are (a staging buffer, or `None` for its variable's
/// own), its metadata and file name.
pub(in crate::ranks) struct StateFile {
    pub(in crate::ranks) tensors: Vec<(String, Dtype, Vec<usize>)>,
    /// Per tensor: its staging buffer, or `None` for the bytes of its
    /// variable (this rank's whole piece), in `slots`.
    pub(in crate::ranks) buffers: Vec<Option<usize>>,
    /// Per tensor: this rank's variable of it, if it holds the whole.
    pub(in crate::ranks) slots: Vec<Option<Slot>>,
    pub(in crate::ranks) metadata: HashMap<String, String>,
    pub(in crate::ranks) name: String,
}

impl StateFile {
    /// Writes the shard into `dir`, atomically, and flushes it to the disk:
    /// each tensor from its staging buffer in `buffers`, or from its
    /// variable in `tree` (given when some tensor is not staged). O(bytes).
    pub(in crate::ranks) fn write(
        &self,
        dir: &Path,
        tree: Option<&ScopeTree>,
        buffers: &[Vec<u8>],
    ) -> Result<(), Error> {
        let mut bytes: Vec<&[u8]> = Vec::with_capacity(self.tensors.len());
        for (b, slot) in self.buffers.iter().zip(&self.slots) {
            bytes.push(match (b, slot, tree) {
                (Some(k), ..) => &buffers[*k],
                (None, Some(slot), Some(tree)) => (slot.access.bytes)(tree, slot.id)?,
                (None, ..) => unreachable!("a tensor not staged is written from its tree"),
            });
        }
        let path = dir.join(&self.name);
        let metadata = Some(self.metadata.clone());
        Ok(write_flushed(&self.tensors, bytes, None, metadata, &path)?)
    }

    /// The bytes of the state this shard holds. O(tensors).
    pub(in crate::ranks) fn bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|(_, d, s)| (s.iter().product::<usize>() * d.bitsize() / 8) as u64)
            .sum()
    }
}

/// Writes `tensors` (key, dtype, shape), the `n`th holding `bytes[n]`, to
/// `path` as the checkpoint layer writes a tree's (floats converted to
/// `floats_as`, atomically, with `metadata`), then flushes the file to the
/// disk. O(bytes).
pub(in crate::ranks) fn write_flushed<'a>(
    tensors: &'a [(String, Dtype, Vec<usize>)],
    bytes: impl IntoIterator<Item = &'a [u8]>,
    floats_as: Option<Dtype>,
    metadata: Option<HashMap<String, String>>,
    path: &Path,
) -> Result<(), checkpoint::Error> {
    let staged: Vec<Staged<'_>> = tensors
        .iter()
        .zip(bytes)
        .map(|((key, dtype, shape), bytes)| Staged {
            key,
            dtype: *dtype,
            shape,
            bytes,
        })
        .collect();
    write_tensors(&staged, floats_as, metadata, path)?;
    sync_file(path)
}

/// How a message shows the digest of the state's keys.
fn show_keys(v: u64) -> String {
    format!("sliced-state keys {v:016x}")
}

impl SyncPlan {
    /// This rank's sliced state bound to `tree` (`None` without sliced
    /// state), and what the ranks compare so that they list the same
    /// tensors in the same order. O(variables × suffixes × depth).
    ///
    /// # Errors
    /// As [`StateLayout::bind`](crate::ranks::layout::sliced::StateLayout::bind).
    pub(in crate::ranks) fn bind_state(
        &self,
        tree: &ScopeTree,
        rank: usize,
    ) -> (Result<Option<BoundState>, Error>, Same) {
        let Some(layout) = &self.state else {
            return (Ok(None), ("sliced-state keys", 0, show_keys));
        };
        let bound = layout.bind(tree, self.manifest(), rank);
        let keys = bound.as_ref().map_or(0, |b| {
            let mut all = Vec::new();
            for t in &b.tensors {
                all.extend_from_slice(t.key.as_bytes());
                all.push(0);
            }
            hash_bytes(&all) as u64
        });
        (bound.map(Some), ("sliced-state keys", keys, show_keys))
    }

    /// Names the shards of the state bound in `bound` for `ranks` ranks:
    /// one per rank that holds a tensor, in rank order. O(tensors + ranks).
    pub(in crate::ranks) fn prepare_state(
        &self,
        bound: BoundState,
        ranks: usize,
        rank: usize,
    ) -> PreparedState {
        let Some(layout) = &self.state else {
            return PreparedState {
                bound,
                shards: Vec::new(),
                shard_of: Vec::new(),
                mine: None,
                total: 0,
            };
        };
        let mut writes = vec![false; ranks];
        for t in &bound.tensors {
            writes[layout.holders[t.var]] = true;
        }
        let mut shard_of_rank = vec![None; ranks];
        let mut n = 0;
        for (r, &w) in writes.iter().enumerate() {
            if w {
                shard_of_rank[r] = Some(n);
                n += 1;
            }
        }
        let shard_of = bound
            .tensors
            .iter()
            .map(|t| shard_of_rank[layout.holders[t.var]].unwrap_or(0))
            .collect();
        let total = bound
            .tensors
            .iter()
            .map(|t| {
                let e = &self.manifest().entries()[layout.vars[t.var]];
                (e.shape.iter().product::<usize>() * e.dtype.bitsize() / 8) as u64
            })
            .sum();
        PreparedState {
            bound,
            shards: (1..=n).map(|k| shard_file("optimizer", k, n)).collect(),
            shard_of,
            mine: shard_of_rank[rank],
            total,
        }
    }

    /// The bytes of the sliced-state tensors this rank's state shard of
    /// the save `prepared` holds, as held. O(state tensors).
    pub(in crate::ranks) fn state_bytes_mine(&self, prepared: &PreparedState) -> u64 {
        let (Some(layout), Some(mine)) = (&self.state, prepared.mine) else {
            return 0;
        };
        let entries = self.manifest().entries();
        prepared
            .bound
            .tensors
            .iter()
            .zip(&prepared.shard_of)
            .filter(|&(_, &shard)| shard == mine)
            .map(|(t, _)| {
                let e = &entries[layout.vars[t.var]];
                (e.shape.iter().product::<usize>() * e.dtype.bitsize() / 8) as u64
            })
            .sum()
    }

    /// Gathers the whole tensors this rank holds into `buffers` and
    /// describes its shard (`None` on a rank that holds none), stamped
    /// with `save_id`, `"format": "pt"` and each tensor's checksum; with
    /// `copy_own` false, a tensor the rank holds whole stays in its
    /// variable. A collective call. O(bytes held + bytes of the split
    /// tensors' pieces).
    ///
    /// # Errors
    /// A failed collective.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::ranks) fn stage_state<C: Collective + ?Sized>(
        &self,
        comm: &C,
        tree: &ScopeTree,
        prepared: &PreparedState,
        save_id: &str,
        copy_own: bool,
        buffers: &mut Vec<Vec<u8>>,
    ) -> Result<Option<StateFile>, Error> {
        let Some(layout) = &self.state else {
            return Ok(None);
        };
        let bound = &prepared.bound;
        let cap = self.byte_cap();
        let manifest = self.manifest();
        let held = gather_whole(comm, tree, layout, manifest, bound, cap, copy_own, buffers)?;
        let Some(mine) = prepared.mine else {
            return Ok(None);
        };
        let mut metadata = HashMap::new();
        metadata.insert("format".to_owned(), "pt".to_owned());
        metadata.insert(SAVE_ID.to_owned(), save_id.to_owned());
        let mut file = StateFile {
            tensors: Vec::with_capacity(held.len()),
            buffers: Vec::with_capacity(held.len()),
            slots: Vec::with_capacity(held.len()),
            metadata,
            name: prepared.shards[mine].clone(),
        };
        for (t, buffer) in held {
            let key = &bound.tensors[t].key;
            let e = &manifest.entries()[layout.vars[bound.tensors[t].var]];
            let slot = bound.mine[t].map(|(_, s)| s);
            let bytes = match (buffer, slot) {
                (Some(k), _) => &buffers[k][..],
                (None, Some(slot)) => (slot.access.bytes)(tree, slot.id)?,
                (None, None) => &[][..],
            };
            let sum = format!("{:032x}", hash_bytes(bytes));
            file.metadata.insert(format!("{CHECKSUM_PREFIX}{key}"), sum);
            file.tensors.push((key.clone(), e.dtype, e.shape.clone()));
            file.buffers.push(buffer);
            file.slots.push(slot);
        }
        Ok(Some(file))
    }
}

/// The index of the optimizer state beside the checkpoint at `path` (a
/// directory, or its `model.safetensors.index.json`), if there is one.
/// O(1) file-system calls.
fn optimizer_index(path: &Path) -> Option<PathBuf> {
    let dir = if path.is_dir() {
        path
    } else if path.file_name().is_some_and(|n| n == INDEX_FILE) {
        path.parent()?
    } else {
        return None;
    };
    Some(dir.join(OPTIMIZER_INDEX_FILE)).filter(|p| p.is_file())
}

/// A checkpoint's files, opened: the parameters' (a file, an index or a
/// directory) and, beside them, the optimizer state's index if any. The
/// files stay open, so the bytes read are those checked.
pub(in crate::ranks) struct Files {
    /// Each opened checkpoint with the path a load reads it from.
    pub(in crate::ranks) opened: Vec<(PathBuf, Opened)>,
    /// Where each tensor is: its file set's position and its own.
    at: FxHashMap<String, (usize, usize)>,
}

impl Files {
    /// Opens the checkpoint at `path` and the optimizer index beside it.
    /// O(headers + indexes).
    ///
    /// # Errors
    /// The checkpoint layer's: an unreadable file, a bad index, a missing
    /// or torn shard.
    pub(in crate::ranks) fn open(path: &Path) -> Result<Self, Error> {
        let mut opened = vec![(path.to_owned(), open_checkpoint(path)?)];
        if let Some(index) = optimizer_index(path) {
            let o = open_checkpoint(&index)?;
            opened.push((index, o));
        }
        let mut at = FxHashMap::default();
        for (f, (_, o)) in opened.iter().enumerate() {
            for (i, (_, t)) in o.tensors.iter().enumerate() {
                at.entry(t.key.clone()).or_insert((f, i));
            }
        }
        Ok(Self { opened, at })
    }

    /// Every tensor of the files. O(tensors).
    pub(in crate::ranks) fn tensors(&self) -> Vec<checkpoint::FileTensor> {
        self.opened
            .iter()
            .flat_map(|(_, o)| o.tensors.iter().map(|(_, t)| t.clone()))
            .collect()
    }

    /// Where tensor `key` is: the file set's position and the tensor's.
    /// O(1).
    pub(in crate::ranks) fn find(&self, key: &str) -> Option<(usize, usize)> {
        self.at.get(key).copied()
    }

    /// Reads tensor `key` whole into `into` (exactly its length) and checks
    /// it against the checksum its file carries, if any. O(its bytes).
    ///
    /// # Errors
    /// [`Error::Corrupted`] when the bytes do not match; the checkpoint
    /// layer's for a file that cannot be read.
    pub(in crate::ranks) fn read_checked(&self, key: &str, into: &mut [u8]) -> Result<(), Error> {
        let Some((f, i)) = self.find(key) else {
            unreachable!("the files were checked to hold every key read")
        };
        let opened = &self.opened[f].1;
        opened.read_into(i, into)?;
        self.check(key, into)
    }

    /// Checks the bytes the files hold for `key` against the checksum
    /// they carry for it, if any, reading them through `buf` (at most 8
    /// MiB, kept for the next call) and writing nothing. O(its bytes).
    ///
    /// # Errors
    /// [`Error::Corrupted`] when they do not match; the checkpoint layer's
    /// for a file that cannot be read.
    pub(in crate::ranks) fn verify(&self, key: &str, buf: &mut Vec<u8>) -> Result<(), Error> {
        self.compare(key, |opened, i| Ok(opened.hash_of(i, buf)?))
    }

    /// Checks `bytes` against the checksum the files carry for `key`, if
    /// any. O(bytes).
    ///
    /// # Errors
    /// [`Error::Corrupted`] when they do not match.
    pub(in crate::ranks) fn check(&self, key: &str, bytes: &[u8]) -> Result<(), Error> {
        self.compare(key, |_, _| Ok(hash_bytes(bytes)))
    }

    /// Compares the checksum the files carry for `key`, if any, with the
    /// xxh3-128 `hash` gives (called only when there is one).
    fn compare(
        &self,
        key: &str,
        hash: impl FnOnce(&Opened, usize) -> Result<u128, Error>,
    ) -> Result<(), Error> {
        let Some((f, i)) = self.find(key) else {
            return Ok(());
        };
        let opened = &self.opened[f].1;
        let Some((sum, file)) = opened.checksum(i)? else {
            return Ok(());
        };
        if hash(opened, i)? != sum {
            return Err(Error::Corrupted {
                key: key.to_owned(),
                file: crate::short::path(&file.to_string_lossy()),
            });
        }
        Ok(())
    }
}
