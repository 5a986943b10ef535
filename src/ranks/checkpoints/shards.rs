//! Checkpoints across ranks that scale with the ranks: every rank writes a
//! part of a plan's variables, in parallel, as one shard of a Hugging Face
//! sharded checkpoint, and a checkpoint saved on N ranks loads on any
//! number of ranks, each rank reading a share of the bytes and the ranks
//! exchanging the rest.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use rustc_hash::FxHashSet;

use super::state_shards::{Files, PreparedState};
use crate::ScopeTree;
use crate::checkpoint::{
    self, CHECKSUM_PREFIX, Dtype, INDEX_FILE, LoadOptions, OPTIMIZER_INDEX_FILE, SAVE_ID,
    SaveOptions, Separator, index_json, is_convertible_float, new_save_id, shard_name, sync_file,
    write_atomic,
};
use crate::ranks::error::Error;
use crate::ranks::layout::slices::scatter_whole;
use crate::ranks::plan::agree::{Same, settle, show_count};
use crate::ranks::plan::bucketed::broadcast_values;
use crate::ranks::plan::sync_plan::SyncPlan;
use crate::ranks::transport::collective::{Collective, DIGEST_BYTES};
use crate::ranks::vars::checksum::written_hash;
use crate::ranks::vars::values::{InTree, Slot};

/// The longest save id a save broadcasts (its ids are about 30 bytes).
const SAVE_ID_BYTES: usize = 64;

/// What one rank did in a [`SyncPlan::save_shards`].
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// tree.set(w, vec![1.0_f32; 4])?;
/// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
/// let saved = plan.save_shards(&SingleProcess, &tree, dir.path(), &Default::default())?;
/// assert_eq!(saved.shards, ["model-00001-of-00001.safetensors"]);
/// assert_eq!(saved.keys, ["w"]);
/// assert_eq!(saved.bytes, 16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardedSave {
    /// Every shard of the checkpoint, in order; the index names them.
    pub shards: Vec<String>,
    /// The shard this rank wrote, if any (a rank writes none when the plan
    /// has fewer variables to save than there are ranks).
    pub mine: Option<String>,
    /// The keys of this rank's shard, in key order.
    pub keys: Vec<String>,
    /// The tensor bytes of this rank's shard, as written.
    pub bytes: u64,
    /// The shard of [sliced state](crate::ranks::SlicedState) this rank wrote, if
    /// any (`optimizer-0000k-of-0000N.safetensors`); in a save of a
    /// `Training`, its shard of the optimizer's state
    /// (`optimizer/model-0000k-of-0000N.safetensors`).
    pub state_shard: Option<String>,
    /// The keys of this rank's state shard, in key order.
    pub state_keys: Vec<String>,
    /// The bytes of this rank's state shard.
    pub state_bytes: u64,
}

/// What one rank did in a [`SyncPlan::load_shards`].
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// tree.set(w, vec![1.0_f32; 4])?;
/// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
/// plan.save_shards(&SingleProcess, &tree, dir.path(), &Default::default())?;
/// let loaded = plan.load_shards(&SingleProcess, &mut tree, dir.path())?;
/// assert_eq!((loaded.keys, loaded.bytes), (vec!["w".to_owned()], 16));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardedLoad {
    /// The keys this rank read from the files, in key order; the other
    /// ranks sent it the rest.
    pub keys: Vec<String>,
    /// The tensor bytes this rank read.
    pub bytes: u64,
    /// The [sliced state](crate::ranks::SlicedState)'s tensors this rank read
    /// whole (it sent the other ranks their pieces), in key order; in a load
    /// of a `Training`, the optimizer's tensors this rank read (with a
    /// `ZeroAdamW`, its slice of each).
    pub state_keys: Vec<String>,
    /// The bytes this rank read of them.
    pub state_bytes: u64,
}

/// Cuts items of `sizes` bytes, in order, into at most `parts` contiguous
/// ranges of about equal bytes: each item goes to the part its middle byte
/// falls in, so no range holds much more than `total / parts` plus one
/// item. Some ranges are empty when a few items are large; `parts` below 1
/// counts as 1. O(items).
pub(in crate::ranks) fn cut_whole(sizes: &[u64], parts: usize) -> Vec<Range<usize>> {
    let parts = parts.max(1);
    let total: u64 = sizes.iter().sum();
    let mut ranges = vec![0..0; parts];
    let mut before = 0_u64;
    let mut start = 0;
    let mut part = 0;
    for (i, &size) in sizes.iter().enumerate() {
        let middle = u128::from(before) * 2 + u128::from(size);
        let p = if total == 0 {
            i * parts / sizes.len().max(1)
        } else {
            (middle * parts as u128 / (u128::from(total) * 2)) as usize
        }
        .min(parts - 1);
        if p != part {
            ranges[part] = start..i;
            for empty in ranges.iter_mut().take(p).skip(part + 1) {
                *empty = i..i;
            }
            (start, part) = (i, p);
        }
        before += size;
    }
    ranges[part] = start..sizes.len();
    for empty in ranges.iter_mut().skip(part + 1) {
        *empty = sizes.len()..sizes.len();
    }
    ranges
}

/// The dtype a tensor of `dtype` is written in under
/// [`SaveOptions::floats_as`]. O(1).
pub(in crate::ranks) fn written(dtype: Dtype, floats_as: Option<Dtype>) -> Dtype {
    match floats_as {
        Some(to) if is_convertible_float(dtype) => to,
        _ => dtype,
    }
}

/// A save under way: its id, its shards, and which variables each holds.
pub(in crate::ranks) struct Prepared {
    /// The save's id, stamped on every shard and the index.
    pub(in crate::ranks) save_id: String,
    /// Every shard's file name, in order.
    pub(in crate::ranks) shards: Vec<String>,
    /// The saved variables of each shard, as ranges of `indices`.
    pub(in crate::ranks) ranges: Vec<Range<usize>>,
    /// The shard this rank writes, if any: shard `k` is rank `k`'s.
    pub(in crate::ranks) mine: Option<usize>,
    /// The saved variables, as indices into the plan's slots, in key order.
    pub(in crate::ranks) indices: Vec<usize>,
    /// Their bytes as written.
    pub(in crate::ranks) sizes: Vec<u64>,
    /// Their keys.
    pub(in crate::ranks) keys: Vec<String>,
    /// The sliced state's tensors and shards, if the plan has any.
    pub(in crate::ranks) state: Option<PreparedState>,
}

impl Prepared {
    /// Cuts the saved variables (`indices`, of `sizes` bytes as written,
    /// named `keys`, in key order) into one shard of whole tensors per rank
    /// of a world of `size` ranks, of about equal bytes, fewer when there
    /// are fewer variables than ranks; names the shards, stamped with
    /// `save_id`, and picks rank `rank`'s. O(variables).
    pub(in crate::ranks) fn new(
        rank: usize,
        size: usize,
        save_id: String,
        indices: Vec<usize>,
        sizes: Vec<u64>,
        keys: Vec<String>,
    ) -> Self {
        let ranges: Vec<Range<usize>> = cut_whole(&sizes, size.min(sizes.len()).max(1))
            .into_iter()
            .filter(|r| !r.is_empty() || sizes.is_empty())
            .collect();
        let n = ranges.len();
        Prepared {
            save_id,
            shards: (1..=n).map(|k| shard_name(k, n)).collect(),
            mine: (rank < n).then_some(rank),
            ranges,
            indices,
            sizes,
            keys,
            state: None,
        }
    }

    /// The same save with the sliced state `state`. O(1).
    pub(in crate::ranks) fn with_state(mut self, state: Option<PreparedState>) -> Self {
        self.state = state;
        self
    }

    /// The saved variables of this rank's shard, as a range of `indices`
    /// (empty when it writes none). O(1).
    pub(in crate::ranks) fn my_range(&self) -> Range<usize> {
        self.mine.map_or(0..0, |k| self.ranges[k].clone())
    }

    /// What this rank's save reports, before its shard is written. O(keys
    /// of the shard).
    pub(in crate::ranks) fn report(&self) -> ShardedSave {
        let range = self.my_range();
        ShardedSave {
            shards: self.shards.clone(),
            mine: self.mine.map(|k| self.shards[k].clone()),
            keys: self.keys[range.clone()].to_vec(),
            bytes: self.sizes[range].iter().sum(),
            ..ShardedSave::default()
        }
    }
}

/// The end of a save on every rank: the ranks exchange the outcome of
/// their shard's write (`written`); when every shard is on disk, rank 0
/// writes the index into `dir`, atomically, last, and the ranks exchange
/// that outcome too. A collective call.
pub(in crate::ranks) fn publish<C: Collective + ?Sized>(
    comm: &C,
    dir: &Path,
    prepared: &Prepared,
    written: Result<(), Error>,
) -> Result<(), Error> {
    let mut gathered = vec![[0_u8; DIGEST_BYTES]; comm.size()];
    settle(comm, &mut gathered, "writing the shards", written, None)?;
    let indexed = if comm.rank() == 0 {
        let entries: Vec<(&str, &str)> = prepared
            .ranges
            .iter()
            .zip(&prepared.shards)
            .flat_map(|(range, shard)| {
                prepared.keys[range.clone()]
                    .iter()
                    .map(move |k| (k.as_str(), shard.as_str()))
            })
            .collect();
        let total = prepared.sizes.iter().sum();
        let text = index_json(&entries, total, &prepared.save_id);
        // The state's index first: the parameters' index, last, makes the
        // checkpoint visible.
        let state = prepared.state.as_ref().map_or(Ok(()), |st| {
            let entries: Vec<(&str, &str)> = (st.bound.tensors.iter())
                .zip(&st.shard_of)
                .map(|(t, &k)| (t.key.as_str(), st.shards[k].as_str()))
                .collect();
            let text = index_json(&entries, st.total, &prepared.save_id);
            write_atomic(&dir.join(OPTIMIZER_INDEX_FILE), text.as_bytes())
        });
        state
            .and_then(|()| write_atomic(&dir.join(INDEX_FILE), text.as_bytes()))
            .map_err(Error::from)
    } else {
        Ok(())
    };
    settle(comm, &mut gathered, "writing the index", indexed, None)
}

/// Makes the directory `dir` of a save. O(path depth).
pub(in crate::ranks) fn make_dir(dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir)
        .map_err(checkpoint::Error::io(&dir.to_string_lossy()))
        .map_err(Error::from)
}

/// `opts`' [`floats_as`](SaveOptions::floats_as), as an argument every
/// rank must pass alike. O(1).
pub(in crate::ranks) fn same_floats(opts: &SaveOptions) -> Same {
    (
        "float dtypes",
        opts.floats_as.map_or(0, |d| d.bitsize() as u64 + 1),
        show_count,
    )
}

/// Names a save on every rank: rank 0 makes the id and broadcasts it, so
/// every rank stamps its shard with the same. A collective call.
pub(in crate::ranks) fn name_save<C: Collective + ?Sized>(comm: &C) -> Result<String, Error> {
    let mut id = [0_u8; SAVE_ID_BYTES];
    if comm.rank() == 0 {
        let mine = new_save_id();
        let n = mine.len().min(SAVE_ID_BYTES);
        id[..n].copy_from_slice(&mine.as_bytes()[..n]);
    }
    comm.broadcast_bytes(0, &mut id)?;
    let end = id.iter().position(|&b| b == 0).unwrap_or(SAVE_ID_BYTES);
    Ok(String::from_utf8_lossy(&id[..end]).into_owned())
}

/// The metadata entry of the checksum `sum` of the tensor `key` (see
/// [`CHECKSUM_PREFIX`]).
pub(in crate::ranks) fn checksum_text(key: &str, sum: u128) -> (String, String) {
    (format!("{CHECKSUM_PREFIX}{key}"), format!("{sum:032x}"))
}

/// The metadata of a shard: `opts`' own, `"format": "pt"`, the save's id
/// and the checksums `sums` (see [`checksum_text`]). O(entries).
pub(in crate::ranks) fn shard_meta(
    opts: &SaveOptions,
    save_id: &str,
    sums: Vec<(String, String)>,
) -> std::collections::HashMap<String, String> {
    let mut meta = opts.metadata.clone().unwrap_or_default();
    meta.entry("format".to_owned())
        .or_insert_with(|| "pt".to_owned());
    meta.insert(SAVE_ID.to_owned(), save_id.to_owned());
    meta.extend(sums);
    meta
}

impl SyncPlan {
    /// The plan's variables that its checkpoints hold (not scratch), as
    /// indices into its slots, with their bytes as written under
    /// `floats_as`. O(variables).
    fn saved_entries(&self, floats_as: Option<Dtype>) -> (Vec<usize>, Vec<u64>) {
        self.manifest()
            .entries()
            .iter()
            .enumerate()
            .filter(|(_, e)| !self.is_scratch(&e.key))
            .map(|(i, e)| {
                let elems: usize = e.shape.iter().product();
                (
                    i,
                    (elems * written(e.dtype, floats_as).bitsize() / 8) as u64,
                )
            })
            .unzip()
    }

    /// The metadata entries of the checksums of the variables at `indices`
    /// (see [`CHECKSUM_PREFIX`]), each of its bytes as written (converted
    /// by `floats_as` where it applies). O(bytes of those variables);
    /// converting, 1 MiB more.
    fn checksums(
        &self,
        tree: &ScopeTree,
        indices: &[usize],
        floats_as: Option<Dtype>,
    ) -> Result<Vec<(String, String)>, Error> {
        let mut out = Vec::with_capacity(indices.len());
        for &i in indices {
            let e = &self.manifest().entries()[i];
            let to = written(e.dtype, floats_as);
            let sum = written_hash(e.dtype, to, self.slot_bytes(tree, i)?);
            out.push(checksum_text(&e.key, sum));
        }
        Ok(out)
    }

    /// Saves the plan's variables into the directory `dir` as a Hugging
    /// Face sharded checkpoint, every rank writing one shard in parallel: the
    /// variables (less [scratch](crate::ranks::PlanOptions::scratch)), in key
    /// order, are cut into one shard of whole tensors per rank, of about
    /// equal bytes (fewer shards when there are fewer variables than
    /// ranks), and rank `k` writes `model-0000k-of-0000N.safetensors`
    /// atomically, with `"format": "pt"` and the save's id in its metadata,
    /// and flushes it to the disk (`fsync`).
    /// When every rank's shard is on disk, rank 0 writes the index
    /// `model.safetensors.index.json` (the shards' names and the same id),
    /// atomically, last: only then is the checkpoint visible. A collective
    /// call; every rank's variables must be equal (replicated, as after an
    /// all-reduce or a broadcast). candle's `from_mmaped_safetensors`,
    /// `transformers` and Python's `safetensors` read the shards as they
    /// are; [`load_shards`](Self::load_shards) reads them at any number of
    /// ranks.
    ///
    /// With [sliced state](crate::ranks::SlicedState)
    /// ([`PlanOptions::sliced_state`](crate::ranks::PlanOptions::sliced_state)),
    /// the state's tensors are written whole beside the parameters, under
    /// `optimizer.safetensors.index.json` and its shards
    /// `optimizer-0000k-of-0000N.safetensors`: each tensor by the rank that
    /// owns its middle element, which receives the pieces the other ranks
    /// own of it (only tensors that two slices split move). That index is
    /// written just before the parameters' index. Memory: the split tensors
    /// this rank writes (it writes those it owns whole from its variables).
    ///
    /// Keys are the manifest's (`/`-separated); `opts`' separator and
    /// filter are the plan's own, its other options apply
    /// ([`floats_as`](SaveOptions::floats_as), metadata). O(variables +
    /// bytes of this rank's shard); memory: this rank's shard's converted
    /// bytes under `floats_as`, else none beyond the headers.
    ///
    /// A save that stops before the index (a rank killed, a full disk)
    /// leaves the previous index in place; if the previous checkpoint in
    /// `dir` had shards of the same names, those now carry another save's
    /// id and the checkpoint fails to load with a clear error
    /// ([`BadIndex::TornSave`](checkpoint::BadIndex::TornSave)) rather
    /// than mixing two saves. Save each step into a directory of its own
    /// to keep the previous checkpoint loadable.
    ///
    /// # Errors
    /// On every rank: [`Error::ArgumentsDiffer`] when the ranks pass
    /// different `floats_as`; when a rank cannot create `dir` or write its
    /// shard, that rank's [`Error::Checkpoint`] and [`Error::PeerFailed`]
    /// on the others, with no index written; [`Error::Changed`] on a rank
    /// whose tree changed since the plan; [`Error::BadState`] on a rank
    /// whose sliced state does not fit the plan's
    /// [`state_partition`](Self::state_partition) (and
    /// [`Error::PeerFailed`] on the others), with nothing written.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use scopetree::{ScopeTree, checkpoint, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// for name in ["a", "b"] {
    ///     let v = tree.var(tree.root(), name)?;
    ///     tree.set(v, vec![0.5_f32; 4])?;
    /// }
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// plan.save_shards(&SingleProcess, &tree, dir.path(), &Default::default())?;
    /// // A plain Hugging Face checkpoint: the checkpoint layer reads it too.
    /// assert_eq!(checkpoint::inspect(dir.path())?.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save_shards<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &ScopeTree,
        dir: impl AsRef<Path>,
        opts: &SaveOptions,
    ) -> Result<ShardedSave, Error> {
        let _watch = self.watch(comm, "saving the shards");
        let dir = dir.as_ref();
        let prepared = self.prepare_save(comm, tree, dir, opts, "saving the shards")?;
        let (saved, written) = self.write_shards(comm, tree, dir, opts, &prepared)?;
        publish(comm, dir, &prepared, written)?;
        Ok(saved)
    }

    /// Writes this rank's shards of the save `prepared` into `dir`, from
    /// the tree (the sliced state's split tensors gathered first, a
    /// collective call): returns this rank's report and how its writes
    /// went, which [`publish`] then settles. An error returned is every
    /// rank's (a failed collective); a failed write is in the outcome.
    /// O(bytes of this rank's shards).
    pub(in crate::ranks) fn write_shards<C: Collective + ?Sized>(
        &self,
        comm: &C,
        tree: &ScopeTree,
        dir: &Path,
        opts: &SaveOptions,
        prepared: &Prepared,
    ) -> Result<(ShardedSave, Result<(), Error>), Error> {
        let mut saved = prepared.report();
        let mut buffers = Vec::new();
        let state = match &prepared.state {
            Some(st) => self.stage_state(comm, tree, st, &prepared.save_id, false, &mut buffers)?,
            None => None,
        };
        let written = match prepared.mine {
            Some(_) => {
                let range = prepared.my_range();
                // An error here is settled with the writes below, never
                // returned before it: the other ranks wait in that settle.
                let meta = self.shard_metadata(tree, prepared, range.clone(), opts);
                let keys: FxHashSet<String> = prepared.keys[range].iter().cloned().collect();
                let mut mine = opts.clone();
                mine.sep = Separator::Slash;
                let keys = Arc::new(keys);
                mine.filter = Some(Arc::new(move |k: &str| keys.contains(k)));
                let path = dir.join(saved.mine.as_deref().unwrap_or_default());
                meta.and_then(|meta| {
                    mine.metadata = Some(meta);
                    let report = checkpoint::save(tree, self.scope(), &path, &mine)?;
                    saved.keys = report.keys;
                    sync_file(&path).map_err(Error::from)
                })
            }
            None => Ok(()),
        };
        let written = written.and_then(|()| match &state {
            Some(file) => {
                saved.state_shard = Some(file.name.clone());
                saved.state_keys = file.tensors.iter().map(|t| t.0.clone()).collect();
                saved.state_bytes = file.bytes();
                file.write(dir, Some(tree), &buffers)
            }
            None => Ok(()),
        });
        Ok((saved, written))
    }

    /// The start of a save on every rank: checks the plan and the options,
    /// makes `dir`, names the save (rank 0's id, broadcast) and cuts the
    /// plan's variables into one shard per rank. A collective call.
    pub(in crate::ranks) fn prepare_save<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &ScopeTree,
        dir: &Path,
        opts: &SaveOptions,
        op: &'static str,
    ) -> Result<Prepared, Error> {
        self.check_slots(comm, tree, op, make_dir(dir), same_floats(opts))?;
        let (bound, keys) = self.bind_state(tree, comm.rank());
        let mut gathered = vec![[0_u8; DIGEST_BYTES]; comm.size()];
        let bound = settle(comm, &mut gathered, op, bound, Some(keys))?;
        let save_id = name_save(comm)?;
        let (indices, sizes) = self.saved_entries(opts.floats_as);
        let keys = indices
            .iter()
            .map(|&i| self.manifest().entries()[i].key.clone())
            .collect();
        Ok(
            Prepared::new(comm.rank(), comm.size(), save_id, indices, sizes, keys)
                .with_state(bound.map(|b| self.prepare_state(b, comm.size(), comm.rank()))),
        )
    }

    /// The metadata of this rank's shard (the saved variables `range` of
    /// `prepared`): `opts`' own, `"format": "pt"`, the save's id, and the
    /// checksum of each tensor's bytes as written (converted by
    /// `floats_as` where it applies). O(bytes of the shard).
    pub(in crate::ranks) fn shard_metadata(
        &self,
        tree: &ScopeTree,
        prepared: &Prepared,
        range: Range<usize>,
        opts: &SaveOptions,
    ) -> Result<std::collections::HashMap<String, String>, Error> {
        let sums = self.checksums(tree, &prepared.indices[range], opts.floats_as)?;
        Ok(shard_meta(opts, &prepared.save_id, sums))
    }

    /// Loads a checkpoint directory (or index, or single file) into the
    /// plan's variables at any number of ranks, each rank reading a share:
    /// the plan's variables (less scratch), in key order, are cut into one
    /// part of whole tensors per rank of about equal bytes, each rank reads
    /// its part from the files, and each part is then broadcast from its
    /// rank to the others in buckets. Across all ranks the load reads each
    /// tensor once, plus every file's header on every rank. A checkpoint
    /// saved by [`save_shards`](Self::save_shards) on N ranks, by
    /// [`save_on_root`](Self::save_on_root) or by any tool writing the
    /// Hugging Face layout loads the same way. A collective call; ends with
    /// the [consistency check](Self::check_consistency).
    ///
    /// Strict and atomic across the ranks: first every rank checks the
    /// index and every shard's header against the plan (every name, dtype
    /// and shape; a missing or torn shard) and the ranks exchange the
    /// outcome, so a checkpoint that does not fit changes no rank's tree;
    /// then every rank verifies its part's checksums in the files, writing
    /// nothing, and the ranks exchange that outcome, so a corrupted tensor
    /// in any rank's part changes no rank's tree; only then does each rank
    /// read its part, in place. O(headers + variables + twice the bytes of
    /// this rank's part) read (the second time from the page cache, as a
    /// rule); memory: an 8 MiB read buffer, then one bucket, and no copy of
    /// the old values.
    ///
    /// With [sliced state](crate::ranks::SlicedState), each rank also checks that
    /// its tree holds exactly the pieces the plan's
    /// [`state_partition`](Self::state_partition) gives it, each state
    /// tensor is read whole (and its checksum checked) by the rank that
    /// owns its middle element, before any tree changes, and that rank then
    /// sends the others their pieces of it: the state of a checkpoint saved
    /// at N ranks loads at any M, read once in all. The state is found
    /// under `optimizer.safetensors.index.json`, or among the parameters'
    /// own tensors when a save held it whole (the replicated mode); in the
    /// same way a plan that holds the state whole loads it from a sliced
    /// save.
    ///
    /// # Errors
    /// On the rank concerned, [`Error::BadState`] for sliced state that does
    /// not fit the partition, the checkpoint's error ([`Error::Checkpoint`]:
    /// [`checkpoint::Error::Mismatch`] naming every missing, unexpected and
    /// mismatched tensor, a bad index, a missing or torn shard, an
    /// unreadable file; [`Error::Corrupted`] for a tensor whose bytes do
    /// not match its checksum), and on the others [`Error::PeerFailed`];
    /// the trees are unchanged. [`Error::Diverged`] when the ranks loaded
    /// different bytes (files that differ between hosts). One failure can
    /// come after every check has passed and leave the trees partly
    /// loaded, with that rank's error and [`Error::PeerFailed`] on the
    /// others: the disk failing to read (or a file changing under) a part
    /// that verified a moment before.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![1.0_f32; 4])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// plan.save_shards(&SingleProcess, &tree, dir.path(), &Default::default())?;
    /// tree.get_mut::<Vec<f32>>(w)?.fill(0.0);
    /// plan.load_shards(&SingleProcess, &mut tree, dir.path())?;
    /// assert_eq!(tree.get::<Vec<f32>>(w)?, &[1.0; 4]);
    /// // A variable the files lack is an error, and nothing changes.
    /// let v = tree.var(tree.root(), "v")?;
    /// tree.set(v, vec![2.0_f32; 2])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// tree.get_mut::<Vec<f32>>(w)?.fill(0.0);
    /// assert!(plan.load_shards(&SingleProcess, &mut tree, dir.path()).is_err());
    /// assert_eq!(tree.get::<Vec<f32>>(w)?, &[0.0; 4]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_shards<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        dir: impl AsRef<Path>,
    ) -> Result<ShardedLoad, Error> {
        let _watch = self.watch(comm, "loading the shards");
        let dir = dir.as_ref();
        self.check_slots(comm, tree, "checking the shards", Ok(()), no_argument())?;
        // Every rank checks every header and its own sliced state before
        // any rank reads: a checkpoint that does not fit changes nothing.
        let (bound, same) = self.bind_state(tree, comm.rank());
        let opened = bound.and_then(|bound| {
            let files = Files::open(dir)?;
            self.check_files(dir, &files, bound.as_ref())?;
            Ok((files, bound))
        });
        let mut gathered = vec![[0_u8; DIGEST_BYTES]; comm.size()];
        let (files, bound) = settle(
            comm,
            &mut gathered,
            "checking the shards",
            opened,
            Some(same),
        )?;

        let (indices, sizes) = self.saved_entries(None);
        let ranges = cut_whole(&sizes, comm.size());
        let mine = &indices[ranges[comm.rank()].clone()];
        let keys: Vec<String> = mine
            .iter()
            .map(|&i| self.manifest().entries()[i].key.clone())
            .collect();
        let slots = &self.slots;
        // First every rank verifies its part's checksums in the files,
        // writing nothing, so that a corrupted part anywhere changes no
        // rank's tree; no copy of the old values is kept. Any error here
        // is settled with the others', never returned before it: the
        // other ranks wait in that settle.
        let mut buf = Vec::new();
        let verified = mine
            .iter()
            .try_for_each(|&i| files.verify(&self.manifest().entries()[i].key, &mut buf));
        drop(buf);
        // The whole state tensors this rank holds, read and checked into
        // buffers of their own.
        let mut held: Vec<Vec<u8>> = Vec::new();
        let mut state_keys = Vec::new();
        let verified = verified.and_then(|()| {
            let (Some(layout), Some(bound)) = (&self.state, &bound) else {
                return Ok(());
            };
            held.resize_with(bound.tensors.len(), Vec::new);
            for (t, tensor) in bound.tensors.iter().enumerate() {
                if layout.holders[tensor.var] != comm.rank() {
                    continue;
                }
                let e = &self.manifest().entries()[layout.vars[tensor.var]];
                held[t] = vec![0_u8; e.shape.iter().product::<usize>() * e.dtype.bitsize() / 8];
                files.read_checked(&tensor.key, &mut held[t])?;
                state_keys.push(tensor.key.clone());
            }
            Ok(())
        });
        settle(comm, &mut gathered, "verifying the shards", verified, None)?;
        // Then each rank reads its part into its tree, in place (the
        // checksums checked again on the bytes loaded).
        let read = self.read_part(tree, &files, mine);
        settle(comm, &mut gathered, "reading the shards", read, None)?;

        let cap = self.byte_cap();
        for (rank, range) in ranges.iter().enumerate() {
            let part: Vec<Slot> = indices[range.clone()].iter().map(|&i| slots[i]).collect();
            let nbytes = part.iter().map(|s| s.nbytes);
            broadcast_values(comm, rank, nbytes, cap, &mut InTree { tree, slots: &part })?;
        }
        if let (Some(layout), Some(bound)) = (&self.state, &bound) {
            scatter_whole(comm, tree, layout, self.manifest(), bound, &mut held, cap)?;
        }
        self.check_consistency(comm, tree)?;
        Ok(ShardedLoad {
            bytes: sizes[ranges[comm.rank()].clone()].iter().sum(),
            keys,
            state_bytes: held.iter().map(|b| b.len() as u64).sum(),
            state_keys,
        })
    }

    /// Reads this rank's part of the plan's variables (`mine`, indices into
    /// its slots) from whichever of `files` holds each, and checks them
    /// against the checksums the files carry. O(bytes of the part).
    fn read_part(&self, tree: &mut ScopeTree, files: &Files, mine: &[usize]) -> Result<(), Error> {
        let mut by_file: Vec<FxHashSet<String>> = vec![FxHashSet::default(); files.opened.len()];
        for &i in mine {
            let key = &self.manifest().entries()[i].key;
            if let Some((f, _)) = files.find(key) {
                by_file[f].insert(key.clone());
            }
        }
        for ((path, _), wanted) in files.opened.iter().zip(by_file) {
            if wanted.is_empty() {
                continue;
            }
            let wanted = Arc::new(wanted);
            let opts = LoadOptions::new().filter(move |k| wanted.contains(k));
            checkpoint::load(tree, self.scope(), path, &opts)?;
        }
        for &i in mine {
            let key = &self.manifest().entries()[i].key;
            files.check(key, self.slot_bytes(tree, i)?)?;
        }
        Ok(())
    }

    /// Checks the files' tensors against the plan's saved variables and its
    /// sliced state (`bound`): the same keys, dtypes and shapes. O(headers
    /// + variables).
    fn check_files(
        &self,
        path: &Path,
        files: &Files,
        bound: Option<&crate::ranks::layout::sliced::BoundState>,
    ) -> Result<(), Error> {
        let mut file = files.tensors();
        let state: FxHashSet<&str> = bound
            .map(|b| b.tensors.iter().map(|t| t.key.as_str()).collect())
            .unwrap_or_default();
        // Keys the plan's checkpoints leave out are ignored, as a load
        // ignores them.
        let saved = self.saved_keys();
        file.retain(|t| {
            state.contains(t.key.as_str()) || saved.as_ref().is_none_or(|keep| keep(&t.key))
        });
        let mut mine: Vec<(&str, Dtype, &[usize], bool)> = self
            .manifest()
            .entries()
            .iter()
            .zip(self.flat())
            .filter(|(e, _)| !self.is_scratch(&e.key))
            .map(|(e, flat)| (e.key.as_str(), e.dtype, e.shape.as_slice(), flat))
            .collect();
        if let (Some(layout), Some(bound)) = (&self.state, bound) {
            for t in &bound.tensors {
                let e = &self.manifest().entries()[layout.vars[t.var]];
                mine.push((t.key.as_str(), e.dtype, e.shape.as_slice(), true));
            }
            mine.sort_by(|a, b| a.0.cmp(b.0));
        }
        super::checkpoint::header_fits(path, file, mine.into_iter())
    }
}

/// No argument to compare: every rank sends 0.
pub(in crate::ranks) fn no_argument() -> Same {
    ("arguments", 0, show_count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(sizes: &[u64], ranges: &[Range<usize>]) -> Vec<u64> {
        ranges
            .iter()
            .map(|r| sizes[r.clone()].iter().sum())
            .collect()
    }

    #[test]
    fn cuts_are_contiguous_whole_and_about_equal() {
        let sizes = [4, 4, 4, 4, 4, 4, 4, 4];
        let r = cut_whole(&sizes, 4);
        assert_eq!(r, [0..2, 2..4, 4..6, 6..8]);
        let r = cut_whole(&sizes, 3);
        assert_eq!(bytes_of(&sizes, &r), [12, 8, 12]);
        // Every item in exactly one range, in order.
        for parts in 1..10 {
            let sizes: Vec<u64> = (1..=20).map(|i| i * i).collect();
            let r = cut_whole(&sizes, parts);
            assert_eq!(r.len(), parts);
            assert_eq!(r[0].start, 0);
            assert_eq!(r[parts - 1].end, sizes.len());
            for w in r.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            let total: u64 = sizes.iter().sum();
            let largest = sizes.iter().max().copied().unwrap_or(0);
            for b in bytes_of(&sizes, &r) {
                assert!(b <= total / parts as u64 + largest, "{b} in {parts} parts");
            }
        }
    }

    #[test]
    fn large_items_leave_parts_empty_and_no_items_cut_into_empty_parts() {
        // The large item's middle byte lies in the second third.
        let r = cut_whole(&[100, 1, 1], 3);
        assert_eq!(r, [0..0, 0..1, 1..3]);
        assert_eq!(cut_whole(&[], 3), [0..0, 0..0, 0..0]);
        assert_eq!(cut_whole(&[0, 0, 0, 0], 2), [0..2, 2..4]);
        assert_eq!(cut_whole(&[5], 1).first(), Some(&(0..1)));
    }
}
