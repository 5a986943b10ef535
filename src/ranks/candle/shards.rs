//! [`CandlePlan`]'s checkpoints written and read by every rank: a
//! [`CandleStore`]'s variables saved as one shard per rank of a Hugging
//! Face sharded checkpoint in candle's names, and loaded at any number of
//! ranks, as [`SyncPlan`](crate::ranks::SyncPlan)'s `save_shards` and
//! `load_shards` do for a tree.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Var;
use rustc_hash::FxHashSet;

use super::in_tensors::{InTensors, bad};
use super::plan::{CandlePlan, check_file};
use crate::candle::CandleStore;
use crate::checkpoint::{Checkpointable, Dtype, LoadOptions, SaveOptions, sync_file};
use crate::ranks::checkpoints::shards::{
    Prepared, ShardedLoad, ShardedSave, checksum_text, cut_whole, make_dir, name_save, publish,
    same_floats, shard_meta, written,
};
use crate::ranks::error::Error;
use crate::ranks::plan::agree::settle;
use crate::ranks::plan::bucketed::broadcast_values;
use crate::ranks::transport::collective::Collective;
use crate::ranks::vars::checksum::WrittenHasher;
use crate::ranks::vars::manifest::{Manifest, ManifestEntry};

/// The checksum entry of a variable's bytes as written (converted by
/// `floats_as` where it applies), hashed piece by piece as a save streams
/// them (a device tensor through two staging pieces), so no whole copy of
/// it is made on the host.
fn streamed_sum(key: &str, var: &Var, floats_as: Option<Dtype>) -> Result<(String, String), Error> {
    let held: Dtype = var.as_tensor().dtype().into();
    let mut h = WrittenHasher::new(held, written(held, floats_as));
    Checkpointable::write_le(var, 8 << 20, &mut |piece| {
        h.update(piece);
        Ok(())
    })
    .map_err(|e| bad(key, &e))?;
    Ok(checksum_text(key, h.digest()))
}

/// Writes this rank's shard of the save `prepared` (of the variables
/// `named`, by key) into `dir`, streamed from the variables through the
/// store's writer, each tensor hashed as it streams (those `floats_as`
/// leaves as they are), and flushes it to the disk; sets `saved.keys`.
/// Nothing on a rank that writes no shard. Local: [`publish`] settles the
/// outcome. O(bytes of the shard); memory: two pieces per tensor.
pub(super) fn write_shard(
    store: &CandleStore,
    named: &[(String, Var)],
    prepared: &Prepared,
    opts: &SaveOptions,
    dir: &Path,
    saved: &mut ShardedSave,
) -> Result<(), Error> {
    let Some(shard) = &saved.mine else {
        return Ok(());
    };
    let range = prepared.my_range();
    let sums: Vec<_> = named[range.clone()]
        .iter()
        .map(|(key, v)| streamed_sum(key, v, opts.floats_as))
        .collect::<Result<_, Error>>()?;
    let path = dir.join(shard);
    let keys: Arc<FxHashSet<String>> = Arc::new(prepared.keys[range].iter().cloned().collect());
    let mut mine = opts.clone();
    mine.metadata = Some(shard_meta(opts, &prepared.save_id, sums));
    mine.filter = Some(Arc::new(move |k: &str| keys.contains(k)));
    let report = store.save_file_with(&path, &mine)?;
    saved.keys = report.keys;
    Ok(sync_file(&path)?)
}

impl CandlePlan {
    /// Saves every variable of `store` (candle's dotted names, frozen ones
    /// too, as [`save_on_root`](Self::save_on_root) saves) into the
    /// directory `dir` as a Hugging Face sharded checkpoint, every rank
    /// writing one shard in parallel, as
    /// [`SyncPlan::save_shards`](crate::ranks::SyncPlan::save_shards) does: the
    /// variables, in key order, are cut into one shard of whole tensors per
    /// rank of about equal bytes (fewer shards when there are fewer
    /// variables than ranks), and rank `k` writes
    /// `model-0000k-of-0000N.safetensors` atomically through
    /// [`CandleStore`]'s writer, with `"format": "pt"`, the save's id and
    /// each tensor's checksum in its metadata, and flushes it to the disk
    /// (`fsync`). When every rank's shard is on disk, rank 0 writes the
    /// index `model.safetensors.index.json`, atomically, last. candle's
    /// `VarBuilder::from_mmaped_safetensors` over the shards reads the
    /// checkpoint as it is; [`load_shards`](Self::load_shards) reads it at
    /// any number of ranks. A collective call; every rank's store must
    /// hold the same variables (names, dtypes, shapes) and values.
    ///
    /// `opts`' [`floats_as`](SaveOptions::floats_as) and metadata apply;
    /// its separator (always `.`) and filter (every variable is saved) are
    /// ignored. O(variables × depth + bytes of this rank's shard), plus one
    /// agreement on the store's variables; memory: one tensor's bytes
    /// beyond what the writer holds (the checksum reads a copy).
    ///
    /// # Errors
    /// On every rank: [`Error::ArgumentsDiffer`] when the ranks pass
    /// different `floats_as`; [`Error::Disagree`] when the ranks' stores
    /// hold different variables (nothing is written then). When a rank
    /// cannot create `dir`, list its store or write its shard, that rank's
    /// error ([`Error::Checkpoint`], [`Error::Candle`]) and
    /// [`Error::PeerFailed`] on the others, with no index written.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let saved = plan.save_shards(&SingleProcess, &store, dir.path(), &Default::default())?;
    /// assert_eq!(saved.shards, ["model-00001-of-00001.safetensors"]);
    /// assert_eq!((saved.keys, saved.bytes), (vec!["fc.bias".to_owned(), "fc.weight".to_owned()], 32));
    /// // candle reads it as it is.
    /// let shard = dir.path().join(&saved.shards[0]);
    /// let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&[shard], DType::F32, &Device::Cpu)? };
    /// assert_eq!(vb.get((2, 3), "fc.weight")?.dims(), &[2, 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save_shards<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        store: &CandleStore,
        dir: impl AsRef<Path>,
        opts: &SaveOptions,
    ) -> Result<ShardedSave, Error> {
        let op = "saving the shards";
        let _watch = self.watch(comm, op);
        let dir = dir.as_ref();
        let (prepared, named) = self.prepare_save(comm, store, dir, opts, op)?;
        let mut saved = prepared.report();
        // Any error here is settled in `publish`, never returned before
        // it: the other ranks wait there.
        let written = write_shard(store, &named, &prepared, opts, dir, &mut saved);
        publish(comm, dir, &prepared, written)?;
        Ok(saved)
    }

    /// Checks and names a save of `store` into `dir` on every rank: makes
    /// `dir`, lists the store's variables, agrees on them and on `opts`'
    /// `floats_as`, names the save and cuts the variables into one shard
    /// per rank. Returns the save's layout (its `indices` index the
    /// variables) and the variables by key. A collective call; an error is
    /// every rank's. O(variables × depth), plus one agreement.
    pub(in crate::ranks) fn prepare_save<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        store: &CandleStore,
        dir: &Path,
        opts: &SaveOptions,
        op: &'static str,
    ) -> Result<(Prepared, Vec<(String, Var)>), Error> {
        let local = make_dir(dir).and_then(|()| Ok(store.named_vars()?));
        let named = settle(comm, &mut self.gathered, op, local, Some(same_floats(opts)))?;
        let entries = named
            .iter()
            .map(|(key, v)| ManifestEntry {
                key: key.clone(),
                dtype: v.as_tensor().dtype().into(),
                shape: v.dims().to_vec(),
            })
            .collect();
        let manifest = Manifest::from_entries(String::new(), entries);
        manifest.agree(comm)?;

        let save_id = name_save(comm)?;
        let sizes = manifest
            .entries()
            .iter()
            .map(|e| {
                let elems: usize = e.shape.iter().product();
                (elems * written(e.dtype, opts.floats_as).bitsize() / 8) as u64
            })
            .collect();
        let keys = named.iter().map(|(k, _)| k.clone()).collect();
        let prepared = Prepared::new(
            comm.rank(),
            comm.size(),
            save_id,
            (0..named.len()).collect(),
            sizes,
            keys,
        );
        Ok((prepared, named))
    }

    /// Loads a checkpoint directory (or index, or single file) into every
    /// variable of `store` (candle's dotted names, frozen ones too) at any
    /// number of ranks, each rank reading a share, as
    /// [`SyncPlan::load_shards`](crate::ranks::SyncPlan::load_shards) does: the
    /// store's variables, in key order, are cut into one part of whole
    /// tensors per rank of about equal bytes, each rank reads its part from
    /// the files (checking each tensor's checksum when the file carries
    /// one), and each part is then broadcast from its rank to the others in
    /// buckets of the plan's size. A checkpoint saved by
    /// [`save_shards`](Self::save_shards) on N ranks, by
    /// [`save_on_root`](Self::save_on_root), by
    /// [`CandleStore::save_sharded`] or by any tool writing the Hugging Face
    /// layout loads the same way. Values are written into the variables'
    /// own storage, so the model and the optimizer see them. A collective
    /// call; ends with the
    /// [consistency check](Self::check_consistency).
    ///
    /// Strict and atomic across the ranks: first every rank checks the
    /// index and every shard's header against its store (every name, dtype
    /// and shape; a missing or torn shard) and the ranks exchange the
    /// outcome, so a checkpoint that does not fit changes no rank's store;
    /// then every rank verifies the checksums of its part's tensors in the
    /// files, writing nothing, and the ranks exchange that outcome too, so
    /// a corrupted tensor in any rank's part changes no rank's store; only
    /// then does each rank read its part into its variables, in place. No
    /// copy of the old values is kept, on the host or on a device.
    /// O(headers + variables × depth + bytes of this rank's part) read
    /// twice (the checksums' pass and the load's), plus the broadcast of
    /// every part (O(bytes) per rank); memory: the store's staging budget
    /// while a rank reads, then, on the host, one bucket and a segment's
    /// copies: each part goes from its
    /// rank's variables to the others' a bucket segment at a time, read from
    /// and written into the variables on their devices (a segment that ends
    /// inside an element keeps that element's bytes for the next). A world
    /// of one rank broadcasts nothing: its values are read through the
    /// store's staged load, straight to their device.
    ///
    /// # Errors
    /// On the rank concerned, the checkpoint's error ([`Error::Checkpoint`]:
    /// [`checkpoint::Error::Mismatch`](crate::checkpoint::Error::Mismatch) naming every missing, unexpected and
    /// mismatched tensor, a bad index, a missing or torn shard, an
    /// unreadable file; [`Error::Corrupted`] for a tensor whose bytes do not
    /// match its checksum; [`Error::Candle`]), and on the others
    /// [`Error::PeerFailed`]; the stores are unchanged. [`Error::Diverged`]
    /// when the ranks loaded different bytes (files that differ between
    /// hosts). Two failures can come after every check has passed and
    /// leave the stores partly loaded, with that rank's error and
    /// [`Error::PeerFailed`] on the others: the disk failing to read a part
    /// that verified a moment before ([`checkpoint::Error::Data`](crate::checkpoint::Error::Data) with
    /// `rolled_back: false`), and candle failing to set a value received
    /// from another rank ([`Error::Candle`]).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use candle_core::{DType, Device, Tensor};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess}};
    /// let store = CandleStore::new();
    /// let w = store.get(2, "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// plan.save_shards(&SingleProcess, &store, dir.path(), &Default::default())?;
    /// plan.vars()[0].set(&Tensor::new(&[5.0_f32, 5.0], &Device::Cpu)?)?;
    /// let loaded = plan.load_shards(&SingleProcess, &store, dir.path())?;
    /// assert_eq!((loaded.keys, loaded.bytes), (vec!["w".to_owned()], 8));
    /// assert_eq!(w.to_vec1::<f32>()?, [1.0, 1.0]);
    /// // A variable the files lack is an error, and nothing changes.
    /// store.get(3, "v", candle_nn::Init::Const(2.0), DType::F32, &Device::Cpu)?;
    /// plan.vars()[0].set(&Tensor::new(&[5.0_f32, 5.0], &Device::Cpu)?)?;
    /// assert!(plan.load_shards(&SingleProcess, &store, dir.path()).is_err());
    /// assert_eq!(w.to_vec1::<f32>()?, [5.0, 5.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_shards<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        store: &CandleStore,
        dir: impl AsRef<Path>,
    ) -> Result<ShardedLoad, Error> {
        let _watch = self.watch(comm, "loading the shards");
        let dir = dir.as_ref();
        let checked = self.check_shards(comm, store, dir)?;
        let loaded = self.read_shards(comm, store, checked)?;
        self.check_consistency(comm)?;
        Ok(loaded)
    }

    /// The first half of [`load_shards`](Self::load_shards), which
    /// changes nothing: checks the files against `store` and verifies this
    /// rank's part's checksums in them, settled among the ranks (an error
    /// is every rank's). A collective call. O(variables + bytes of this
    /// rank's part).
    pub(super) fn check_shards<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        store: &CandleStore,
        dir: &Path,
    ) -> Result<CheckedShards, Error> {
        let local = (store.named_vars().map_err(Error::from))
            .and_then(|named| check_file(&named, dir).map(|()| named));
        let named = settle(comm, &mut self.gathered, "checking the shards", local, None)?;
        // Every rank's store fits the files: the ranks hold the same
        // variables, and cut them alike.
        let sizes: Vec<u64> = named
            .iter()
            .map(|(_, v)| (v.elem_count() * v.as_tensor().dtype().size_in_bytes()) as u64)
            .collect();
        let ranges = cut_whole(&sizes, comm.size());
        let mine = &named[ranges[comm.rank()].clone()];
        // Any error here is settled below with the others', never returned
        // before it: the other ranks wait in that settle.
        let wanted: Arc<FxHashSet<String>> =
            Arc::new(mine.iter().map(|(k, _)| k.clone()).collect());
        let opts = LoadOptions::new().filter(move |k| wanted.contains(k));
        // Every rank verifies its part's checksums against the files,
        // writing nothing, so that a corrupted part anywhere changes no
        // rank's store; no copy of the old values is kept.
        let verified = if mine.is_empty() {
            Ok(())
        } else {
            store.verify_sums(dir, &opts).map_err(Error::from)
        };
        settle(
            comm,
            &mut self.gathered,
            "verifying the shards",
            verified,
            None,
        )?;
        Ok(CheckedShards {
            dir: dir.to_owned(),
            named,
            sizes,
            ranges,
            opts,
        })
    }

    /// The second half of [`load_shards`](Self::load_shards), but for its
    /// consistency check: each rank reads its checked part into its
    /// variables, in place (its checksums checked again on the bytes as
    /// they are read), and sends it to the others. A collective call.
    /// O(bytes).
    pub(super) fn read_shards<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        store: &CandleStore,
        checked: CheckedShards,
    ) -> Result<ShardedLoad, Error> {
        let CheckedShards {
            dir,
            named,
            sizes,
            ranges,
            opts,
        } = checked;
        let solo = comm.size() == 1;
        let mine = ranges[comm.rank()].clone();
        // The options (their filter holds this rank's keys) go before the
        // exchange.
        let read = if mine.is_empty() {
            Ok(())
        } else {
            let mut opts = opts;
            opts.sums_verified = true;
            store.load(&dir, &opts).map(|_| ()).map_err(Error::from)
        };
        settle(comm, &mut self.gathered, "reading the shards", read, None)?;

        // Each part from its rank to the others, from and into the
        // variables a bucket segment at a time (alone, a rank sends
        // nothing). An error here (candle failing to set a value) is
        // settled after the broadcasts, which every rank makes alike.
        let mut outcome = Ok(());
        for (rank, range) in ranges.iter().enumerate().filter(|_| !solo) {
            let mut values = InTensors::of_vars(&named[range.clone()]);
            let nbytes = sizes[range.clone()].iter().map(|&n| n as usize);
            broadcast_values(comm, rank, nbytes, self.byte_cap, &mut values)?;
            if let (Some(e), Ok(())) = (values.failed, &outcome) {
                outcome = Err(e);
            }
        }
        settle(
            comm,
            &mut self.gathered,
            "loading the shards",
            outcome,
            None,
        )?;
        Ok(ShardedLoad {
            bytes: sizes[mine.clone()].iter().sum(),
            keys: named[mine].iter().map(|(k, _)| k.clone()).collect(),
            ..ShardedLoad::default()
        })
    }
}

/// A load across ranks whose files [`CandlePlan::check_shards`] checked:
/// the directory, the store's variables by name, their bytes, every
/// rank's range of them and the load's options (this rank's keys).
pub struct CheckedShards {
    dir: PathBuf,
    named: Vec<(String, Var)>,
    sizes: Vec<u64>,
    ranges: Vec<std::ops::Range<usize>>,
    opts: LoadOptions,
}
