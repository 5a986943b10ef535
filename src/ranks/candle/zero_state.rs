//! [`ZeroAdamW`]'s state in checkpoints: saved by every rank as the whole
//! tensors scopetree's [`AdamW`](crate::candle::AdamW) keeps (`<name>.m`,
//! `<name>.v`, `step`) in a Hugging Face sharded layout, and loaded at any
//! number of ranks, each rank reading the elements of its own slice.

use std::path::Path;

use candle_core::{Device, Tensor, Var};
use rustc_hash::FxHashMap;

use super::in_tensors::{Entry, InTensors, set_elements};
use super::plan::{CandlePlan, candle};
use super::zero_adamw::{Slice, ZeroAdamW};
use crate::candle::STEP;
use crate::checkpoint::staged::{Job, read_at, verify};
use crate::checkpoint::{
    self, Codec, Dtype, FileTensor, LoadOptions, Mismatch, Opened, SAVE_ID, SaveOptions, Streamed,
    open_checkpoint, save_streamed, shard_name, sync_file,
};
use crate::ranks::checkpoints::shards::{
    Prepared, ShardedLoad, ShardedSave, make_dir, name_save, publish,
};
use crate::ranks::error::Error;
use crate::ranks::layout::partition::Piece;
use crate::ranks::plan::agree::settle;
use crate::ranks::plan::bucketed::broadcast_values;
use crate::ranks::transport::collective::Collective;

/// The most bytes a load reads from a file at once, per moment.
const READ_CHUNK: usize = 8 << 20;

/// Who holds what in a save of a ZeRO state: per variable of the plan, the
/// rank that writes its moments (the owner of its first element; for a
/// variable of no elements, the holder before it), and whether other ranks
/// own pieces of it.
struct Holders {
    holder: Vec<usize>,
    split: Vec<bool>,
}

impl Holders {
    /// From every rank's pieces (`pieces[r]`, rank `r`'s). O(variables +
    /// ranks).
    fn new(vars: usize, pieces: &[Vec<Piece>]) -> Self {
        let mut holder = vec![usize::MAX; vars];
        let mut split = vec![false; vars];
        for (r, mine) in pieces.iter().enumerate() {
            for p in mine {
                if p.start == 0 {
                    holder[p.var] = r;
                } else {
                    split[p.var] = true;
                }
            }
        }
        let mut last = 0;
        for h in &mut holder {
            if *h == usize::MAX {
                *h = last;
            } else {
                last = *h;
            }
        }
        Self { holder, split }
    }
}

/// The key of a moment of the variable `key`.
fn moment(key: &str, which: &str) -> String {
    format!("{key}.{which}")
}

impl ZeroAdamW {
    /// Checks that `plan` in `comm`'s world is the one this optimizer was
    /// made over: the same world size and this rank's pieces. O(pieces).
    fn check_plan<C: Collective + ?Sized>(&self, comm: &C, plan: &CandlePlan) -> Result<(), Error> {
        let part = plan.partition();
        let mine = part.pieces(comm.rank().min(part.ranks().saturating_sub(1)));
        let same = comm.size() == part.ranks()
            && mine.len() == self.slices.len()
            && mine.iter().zip(&self.slices).all(|(p, s)| {
                p.start == s.start && p.len == s.len && plan.manifest.entries()[p.var].key == s.key
            });
        if same {
            Ok(())
        } else {
            Err(Error::BadOption {
                reason: format!(
                    "this ZeroAdamW was made over another plan or world (rank {} of {}, plan for \
                     {} rank(s)); pass the plan it was made with",
                    comm.rank(),
                    comm.size(),
                    part.ranks()
                ),
            })
        }
    }

    /// Saves this optimizer's state into the directory `dir`, every rank
    /// writing a shard, as the tensors scopetree's
    /// [`AdamW`](crate::candle::AdamW) keeps: `<name>.m` and `<name>.v` of
    /// each variable of the plan, whole, in its shape and dtype, and the
    /// step count `step` (`f64`). Each variable's moments are written by
    /// the rank that owns its first element; the pieces of a variable split
    /// between ranks are first sent to it (bucketed broadcasts of those
    /// pieces only) and put together on its device. Rank 0 also writes the
    /// step count. Each shard is `model-0000k-of-0000N.safetensors`
    /// (atomic, flushed, with each tensor's checksum and the save's id),
    /// and when all are on disk rank 0 writes `model.safetensors.index.json`,
    /// last. So the directory is what `AdamW::state().save_sharded` writes:
    /// [`load_shards`](Self::load_shards) reads it at any number of ranks,
    /// and a single process's `AdamW` loads it with
    /// `state().load(dir, ..)`. A collective call; `plan` must be the plan
    /// this optimizer was made over.
    ///
    /// O(variables + ranks + bytes of this rank's shard), plus the
    /// broadcasts of the split variables' pieces (O(their bytes) per
    /// rank). Memory: on the device, the moments of the split variable
    /// this rank writes, whole (at most one: the variable that crosses the
    /// end of its slice); on the host, a bucket and a piece of a tensor at
    /// a time.
    ///
    /// # Errors
    /// [`Error::BadOption`] on every rank when `plan` is not this
    /// optimizer's. When a rank cannot create `dir`, put a variable
    /// together or write its shard, that rank's error
    /// ([`Error::Checkpoint`], [`Error::Candle`]) and [`Error::PeerFailed`]
    /// on the others, with no index written.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess, ZeroAdamW}};
    /// let store = CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let opt = ZeroAdamW::new(&SingleProcess, &plan, Default::default())?;
    /// let saved = opt.save_shards(&SingleProcess, &mut plan, dir.path())?;
    /// assert_eq!(saved.keys, ["fc.bias.m", "fc.bias.v", "fc.weight.m", "fc.weight.v", "step"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save_shards<C: Collective + ?Sized>(
        &self,
        comm: &C,
        plan: &mut CandlePlan,
        dir: impl AsRef<Path>,
    ) -> Result<ShardedSave, Error> {
        let op = "saving the optimizer's shards";
        let _watch = plan.watch(comm, op);
        let dir = dir.as_ref();
        let local = make_dir(dir).and_then(|()| self.check_plan(comm, plan));
        settle(comm, &mut plan.gathered, op, local, None)?;

        let (rank, size) = (comm.rank(), comm.size());
        let pieces: Vec<Vec<Piece>> = (0..size)
            .map(|r| plan.partition().pieces(r).to_vec())
            .collect();
        let entries = plan.manifest.entries().to_vec();
        let held = Holders::new(entries.len(), &pieces);
        // This rank's piece of each variable, if any.
        let mut by_var: Vec<Option<&Slice>> = vec![None; entries.len()];
        for s in &self.slices {
            by_var[s.var_index] = Some(s);
        }

        // The whole moments of the variables this rank writes that it does
        // not own whole: zeros on the variable's device, its own piece in.
        let mut whole: FxHashMap<usize, (Var, Var)> = FxHashMap::default();
        let made = (|| -> Result<(), Error> {
            for (i, e) in entries.iter().enumerate() {
                let own_all = by_var[i].is_some_and(|s| s.start == 0) && !held.split[i];
                if held.holder[i] != rank || own_all {
                    continue;
                }
                let var = &plan.vars[i];
                let n = var.elem_count();
                let zeros = || Var::zeros(n, var.dtype(), var.device());
                let (m, v) = (
                    zeros().map_err(|x| candle(&e.key, x))?,
                    zeros().map_err(|x| candle(&e.key, x))?,
                );
                if let Some(s) = by_var[i] {
                    (m.slice_set(&s.m, 0, 0))
                        .and_then(|()| v.slice_set(&s.v, 0, 0))
                        .map_err(|x| candle(&e.key, x))?;
                }
                whole.insert(i, (m, v));
            }
            Ok(())
        })();
        settle(comm, &mut plan.gathered, op, made, None)?;

        // The pieces of split variables, each from its owner to the
        // variable's holder (the others drop them).
        let mut sent = Ok(());
        for (owner, mine) in pieces.iter().enumerate() {
            let moved: Vec<&Piece> = mine.iter().filter(|p| p.start > 0).collect();
            if moved.is_empty() {
                continue;
            }
            let mut list = Vec::with_capacity(2 * moved.len());
            let mut nbytes = Vec::with_capacity(2 * moved.len());
            for p in &moved {
                let key = &entries[p.var].key;
                let size = plan.vars[p.var].dtype().size_in_bytes();
                for which in 0..2 {
                    let tensor = if owner == rank {
                        by_var[p.var]
                            .map(|s| if which == 0 { &s.m } else { &s.v })
                            .map(|t| t.as_tensor().clone())
                    } else if held.holder[p.var] == rank {
                        whole
                            .get(&p.var)
                            .map(|(m, v)| if which == 0 { m } else { v })
                            .map(|t| t.as_tensor().clone())
                    } else {
                        None
                    };
                    let base = if owner == rank { 0 } else { p.start };
                    list.push(Entry {
                        key: moment(key, ["m", "v"][which]),
                        tensor,
                        base,
                    });
                    nbytes.push(p.len * size);
                }
            }
            let mut values = InTensors::new(list);
            broadcast_values(comm, owner, nbytes.into_iter(), plan.byte_cap, &mut values)?;
            if let (Some(e), Ok(())) = (values.failed, &sent) {
                sent = Err(e);
            }
        }
        settle(comm, &mut plan.gathered, op, sent, None)?;

        // The shards: `step` and the moments of rank 0's variables, then
        // each writing rank's, in variable order (the holders only grow).
        let save_id = name_save(comm)?;
        let mut keys = vec![STEP.to_owned()];
        let mut sizes = vec![8_u64];
        let mut writer_of = vec![0_usize];
        for (i, e) in entries.iter().enumerate() {
            let bytes = (e.shape.iter().product::<usize>() * e.dtype.bitsize() / 8) as u64;
            for which in ["m", "v"] {
                keys.push(moment(&e.key, which));
                sizes.push(bytes);
                writer_of.push(held.holder[i]);
            }
        }
        // Each writing rank's keys: a run of `writer_of` (the holders only
        // grow), found in one pass.
        let mut writers: Vec<usize> = Vec::new();
        let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
        for (k, &w) in writer_of.iter().enumerate() {
            match (writers.last(), ranges.last_mut()) {
                (Some(&last), Some(r)) if last == w => r.end = k + 1,
                _ => {
                    writers.push(w);
                    ranges.push(k..k + 1);
                }
            }
        }
        let shards: Vec<String> = (1..=writers.len())
            .map(|k| shard_name(k, writers.len()))
            .collect();
        let prepared = Prepared {
            save_id,
            shards,
            ranges,
            mine: writers.iter().position(|&w| w == rank),
            indices: (0..keys.len()).collect(),
            sizes,
            keys,
            state: None,
        };
        let mut saved = prepared.report();
        saved.keys.sort_unstable();
        let written = (|| -> Result<(), Error> {
            let Some(k) = prepared.mine else {
                return Ok(());
            };
            let write = Codec::of::<Var>().1.write;
            let mut items = Vec::new();
            if rank == 0 {
                items.push(Streamed {
                    key: STEP.to_owned(),
                    dtype: Dtype::F64,
                    shape: Vec::new(),
                    value: &self.step as &dyn std::any::Any,
                    write,
                });
            }
            for (i, e) in entries.iter().enumerate() {
                if held.holder[i] != rank {
                    continue;
                }
                let (m, v) = match whole.get(&i) {
                    Some((m, v)) => (m, v),
                    None => {
                        let s = by_var[i].ok_or_else(|| Error::BadBuffers {
                            op,
                            reason: format!("`{}` has no piece on its holder", e.key),
                        })?;
                        (&s.m, &s.v)
                    }
                };
                for (which, t) in [("m", m), ("v", v)] {
                    items.push(Streamed {
                        key: moment(&e.key, which),
                        dtype: e.dtype,
                        shape: e.shape.clone(),
                        value: t as &dyn std::any::Any,
                        write,
                    });
                }
            }
            let mut meta = std::collections::HashMap::new();
            meta.insert(SAVE_ID.to_owned(), prepared.save_id.clone());
            let opts = SaveOptions::new().metadata(meta);
            let path = dir.join(&prepared.shards[k]);
            save_streamed(items, &path, false, true, &opts)?;
            Ok(sync_file(&path)?)
        })();
        drop(whole);
        publish(comm, dir, &prepared, written)?;
        Ok(saved)
    }

    /// Loads this optimizer's state from a checkpoint directory (or index,
    /// or single file) of the tensors scopetree's
    /// [`AdamW`](crate::candle::AdamW) keeps, as
    /// [`save_shards`](Self::save_shards) writes them at any number of
    /// ranks (or `AdamW::state().save_sharded` in one process): each rank
    /// reads the elements of its own slice of `<name>.m` and `<name>.v`,
    /// and every rank the step count, into its moments in place on their
    /// device. A collective call; `plan` must be the plan this optimizer
    /// was made over.
    ///
    /// Strict and atomic across the ranks: first every rank checks the
    /// files' headers against the plan (every moment present, in its
    /// variable's shape and dtype, and nothing else) and verifies the
    /// checksums of the tensors whose first element it owns (so every
    /// tensor is verified once across the ranks), writing nothing; the
    /// ranks exchange the outcome, so a checkpoint that does not fit, or a
    /// corrupted tensor, changes no rank's state. Then each rank reads its
    /// slice. O(headers + variables + ranks + bytes verified + bytes of
    /// this rank's slice); memory: 8 MiB of host buffer per read.
    ///
    /// # Errors
    /// On the rank concerned: [`Error::Checkpoint`] for a missing, torn
    /// or unreadable file, or a
    /// [`Mismatch`](checkpoint::Error::Mismatch) naming every missing,
    /// unexpected and mismatched tensor; [`Error::Corrupted`] for a tensor
    /// whose bytes fail their checksum; and on the others
    /// [`Error::PeerFailed`]; every state is unchanged. [`Error::BadOption`]
    /// on every rank when `plan` is not this optimizer's. Only a disk that
    /// fails to read bytes that verified a moment before, or candle failing
    /// to write into a moment, can leave the states partly loaded (that
    /// rank's error, and [`Error::PeerFailed`] on the others).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess, ZeroAdamW}};
    /// let store = CandleStore::new();
    /// let w = store.get(4, "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
    /// let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let mut opt = ZeroAdamW::new(&SingleProcess, &plan, Default::default())?;
    /// opt.step(&w.sqr()?.sum_all()?.backward()?)?;
    /// opt.save_shards(&SingleProcess, &mut plan, dir.path())?;
    ///
    /// let mut fresh = ZeroAdamW::new(&SingleProcess, &plan, Default::default())?;
    /// fresh.load_shards(&SingleProcess, &mut plan, dir.path())?;
    /// assert_eq!(fresh.step_count()?, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_shards<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        plan: &mut CandlePlan,
        dir: impl AsRef<Path>,
    ) -> Result<ShardedLoad, Error> {
        let op = "loading the optimizer's shards";
        let _watch = plan.watch(comm, op);
        let checked = self.check_shards(comm, plan, dir.as_ref())?;
        self.read_shards(comm, plan, checked)
    }

    /// The first half of [`load_shards`](Self::load_shards), which
    /// changes nothing: checks the plan and the files, and verifies the
    /// checksums of this rank's tensors, settled among the ranks (an error
    /// is every rank's). A collective call. O(headers + variables + bytes
    /// verified).
    pub(super) fn check_shards<C: Collective + ?Sized>(
        &self,
        comm: &C,
        plan: &mut CandlePlan,
        dir: &Path,
    ) -> Result<CheckedState, Error> {
        let rank = comm.rank();
        let checked = self
            .check_plan(comm, plan)
            .and_then(|()| check_state(plan, dir, rank, comm.size()));
        let (opened, found) = settle(
            comm,
            &mut plan.gathered,
            "checking the optimizer's shards",
            checked,
            None,
        )?;
        Ok(CheckedState { opened, found })
    }

    /// The second half of [`load_shards`](Self::load_shards): each rank
    /// reads its slice of the checked files into its state, in place. A
    /// collective call. O(bytes of the slice).
    pub(super) fn read_shards<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        plan: &mut CandlePlan,
        checked: CheckedState,
    ) -> Result<ShardedLoad, Error> {
        let CheckedState { opened, found } = checked;
        let read = self.read_slice(&opened, &found);
        settle(
            comm,
            &mut plan.gathered,
            "reading the optimizer's shards",
            read,
            None,
        )?;
        let mut keys: Vec<String> = self
            .slices
            .iter()
            .flat_map(|s| [moment(&s.key, "m"), moment(&s.key, "v")])
            .chain([STEP.to_owned()])
            .collect();
        keys.sort_unstable();
        let bytes = self
            .slices
            .iter()
            .map(|s| (2 * s.len * s.m.dtype().size_in_bytes()) as u64)
            .sum::<u64>()
            + 8;
        Ok(ShardedLoad {
            keys,
            bytes,
            ..ShardedLoad::default()
        })
    }

    /// Reads this rank's slice of each moment, and the step count, from
    /// the checked files into the state, in place. O(bytes of the slice).
    fn read_slice(&self, opened: &Opened, found: &FxHashMap<String, usize>) -> Result<(), Error> {
        let mut buf = Vec::new();
        for s in &self.slices {
            for (which, target) in [("m", &s.m), ("v", &s.v)] {
                let key = moment(&s.key, which);
                let (part, t) = &opened.tensors[found[&key]];
                let file = &opened.parts[*part];
                let size = target.dtype().size_in_bytes();
                let per = (READ_CHUNK / size).max(1);
                let mut done = 0;
                while done < s.len {
                    let n = per.min(s.len - done);
                    buf.resize(n * size, 0);
                    let at = file.data_start + t.begin + ((s.start + done) * size) as u64;
                    read_at(&file.file, &mut buf, at)
                        .map_err(checkpoint::Error::io(&file.path.to_string_lossy()))?;
                    set_elements(&key, target.as_tensor(), done, &buf)?;
                    done += n;
                }
            }
        }
        let (part, t) = &opened.tensors[found[STEP]];
        let file = &opened.parts[*part];
        let mut eight = [0_u8; 8];
        read_at(&file.file, &mut eight, file.data_start + t.begin)
            .map_err(checkpoint::Error::io(&file.path.to_string_lossy()))?;
        Tensor::new(f64::from_le_bytes(eight), &Device::Cpu)
            .and_then(|c| self.step.set(&c))
            .map_err(|e| candle(STEP, e))
    }
}

/// An optimizer state's files that [`ZeroAdamW::check_shards`] opened and
/// checked, and each tensor's index in them.
pub struct CheckedState {
    opened: Opened,
    found: FxHashMap<String, usize>,
}

/// Opens the state checkpoint `path` and checks it against `plan`: every
/// moment of every variable in its shape and dtype, `step` as an `f64`
/// scalar, nothing else; then verifies the checksums of the tensors whose
/// first element `rank` owns in a world of `size` (rank 0: `step` too).
/// Returns the opened files and each tensor's index in them. O(headers +
/// variables + bytes verified).
fn check_state(
    plan: &CandlePlan,
    path: &Path,
    rank: usize,
    size: usize,
) -> Result<(Opened, FxHashMap<String, usize>), Error> {
    let opened = open_checkpoint(path)?;
    let found: FxHashMap<String, usize> = (opened.tensors.iter().enumerate())
        .map(|(i, (_, t))| (t.key.clone(), i))
        .collect();
    let pieces: Vec<Vec<Piece>> = (0..size)
        .map(|r| plan.partition().pieces(r).to_vec())
        .collect();
    let held = Holders::new(plan.manifest.entries().len(), &pieces);
    let mut expected: Vec<(String, Dtype, Vec<usize>, bool)> =
        vec![(STEP.to_owned(), Dtype::F64, Vec::new(), rank == 0)];
    for (i, e) in plan.manifest.entries().iter().enumerate() {
        for which in ["m", "v"] {
            let mine = held.holder[i] == rank;
            expected.push((moment(&e.key, which), e.dtype, e.shape.clone(), mine));
        }
    }
    let (mut missing, mut mismatched) = (Vec::new(), Vec::new());
    let mut jobs = Vec::new();
    for (key, dtype, shape, verifies) in &expected {
        let Some(&i) = found.get(key) else {
            missing.push(key.clone());
            continue;
        };
        let (part, t): &(usize, FileTensor) = &opened.tensors[i];
        if t.dtype != *dtype || t.shape != *shape {
            mismatched.push(Mismatch {
                key: key.clone(),
                file: format!("{:?} {:?}", t.dtype, t.shape),
                tree: format!("{dtype:?} {shape:?}"),
            });
            continue;
        }
        if *verifies {
            jobs.push(Job::of(&opened.parts, *part, t)?);
        }
    }
    let known: rustc_hash::FxHashSet<&str> = expected.iter().map(|(k, ..)| k.as_str()).collect();
    let mut unexpected: Vec<String> = (opened.tensors.iter())
        .map(|(_, t)| t.key.clone())
        .filter(|k| !known.contains(k.as_str()))
        .collect();
    unexpected.sort_unstable();
    if !missing.is_empty()
        || !mismatched.is_empty()
        || !unexpected.is_empty()
        || !opened.unassigned.is_empty()
    {
        return Err(checkpoint::Error::Mismatch {
            path: crate::short::path(&opened.shown),
            missing,
            unexpected,
            mismatched,
            unassigned: opened.unassigned.clone(),
        }
        .into());
    }
    let readers = LoadOptions::new().reader_threads();
    verify(&opened.parts, &jobs, readers).map_err(|e| match *e.error {
        checkpoint::Error::Corrupted { key, path } => Error::Corrupted { key, file: path },
        other => Error::Checkpoint(other),
    })?;
    Ok((opened, found))
}
