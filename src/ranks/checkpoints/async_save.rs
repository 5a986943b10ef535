//! [`AsyncSaver`]: saves beside training. A save copies this rank's part
//! of a plan into staging buffers reused from save to save and returns; a
//! background thread writes the shard; the next save, or
//! [`wait`](AsyncSaver::wait), finishes it on every rank (the outcome
//! exchanged, the index written, the manager's pointer moved).

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::manager::CheckpointManager;
use super::shards::{Prepared, ShardedSave, publish};
use super::state_shards::{StateFile, write_flushed};
use crate::ScopeTree;
use crate::checkpoint::{self, Dtype, SaveOptions};
use crate::ranks::error::Error;
use crate::ranks::plan::sync_plan::SyncPlan;
use crate::ranks::transport::collective::Collective;
use crate::ranks::transport::watchdog::Watch;

/// What the background thread writes: this rank's tensors, staged.
struct Shard {
    /// Each tensor's key, dtype and shape, in key order.
    tensors: Vec<(String, Dtype, Vec<usize>)>,
    /// Each tensor's bytes (the staging buffers, handed back when written).
    buffers: Vec<Vec<u8>>,
    floats_as: Option<Dtype>,
    metadata: HashMap<String, String>,
    path: PathBuf,
}

/// What the background thread writes: this rank's shards, staged.
struct Shards {
    /// The parameters' shard, if this rank writes one.
    model: Option<Shard>,
    /// The sliced state's shard, if this rank writes one, with its buffers
    /// and directory.
    state: Option<(StateFile, Vec<Vec<u8>>, PathBuf)>,
    /// The state's buffers when this rank writes no state shard (kept for
    /// the next save).
    spare_state: Vec<Vec<u8>>,
}

impl Shards {
    /// Writes the shards, the parameters' first; hands the buffers back
    /// for the next save.
    fn write(self) -> Written {
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

impl Shard {
    /// Writes the shard; hands the buffers back for the next save.
    fn write(self) -> (Vec<Vec<u8>>, Result<(), checkpoint::Error>) {
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

/// What the background writer hands back: the staging buffers (the
/// parameters' and the state's), and how the writes went.
type Written = ((Vec<Vec<u8>>, Vec<Vec<u8>>), Result<(), Error>);

/// A save whose shard is being written.
struct Pending {
    /// The writer (none on a rank that writes no shard).
    writer: Option<JoinHandle<Written>>,
    /// An error found while staging, reported with the writes.
    staged: Result<(), Error>,
    dir: PathBuf,
    prepared: Prepared,
    report: ShardedSave,
    /// The manager and step whose pointer moves once the save is whole.
    pointer: Option<(CheckpointManager, u64)>,
    /// What the watchdog names, and the plan's timeout, for the finish.
    watched: (Arc<str>, Option<Duration>),
}

/// Saves beside training: [`save`](Self::save) stages this rank's part of a
/// plan (its shard of [`SyncPlan::save_shards`]' layout) into buffers kept
/// from save to save and returns while a background thread writes it; the
/// next `save`, or [`wait`](Self::wait), finishes it: the ranks exchange the
/// outcome of their writes, rank 0 writes the index, and (for
/// [`save_managed`](Self::save_managed)) moves the manager's pointer. A
/// failed write is reported there, on every rank. Until then the
/// checkpoint is not visible, and the previous one stays the latest.
///
/// Call [`wait`](Self::wait) before the program ends: a saver dropped with
/// a save under way lets its thread finish the shard but never publishes
/// the checkpoint (no index, no pointer), so the previous one stays the
/// latest.
///
/// The staging memory is this rank's part only: the buffers keep their
/// capacity, so saves of the same plan allocate nothing for the values
/// after the first. MPI is only called from the thread that calls `save`
/// and `wait` (the background thread writes files only), as
/// `Threading::Funneled` requires.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// use scopetree::{ScopeTree, ranks::{AsyncSaver, PlanOptions, SingleProcess, SyncPlan}};
/// let world = SingleProcess;
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// tree.set(w, vec![1.0_f32; 4])?;
/// let mut plan = SyncPlan::new(&world, &tree, tree.root(), &PlanOptions::new())?;
/// let mut saver = AsyncSaver::new();
/// saver.save(&world, &mut plan, &tree, dir.path().join("a"), &Default::default())?;
/// tree.get_mut::<Vec<f32>>(w)?.fill(2.0); // training goes on; the save holds its copy
/// let done = saver.wait(&world)?.expect("a save was under way");
/// assert_eq!(done.keys, ["w"]);
/// plan.load_shards(&world, &mut tree, dir.path().join("a"))?;
/// assert_eq!(tree.get::<Vec<f32>>(w)?, &[1.0; 4]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Default)]
pub struct AsyncSaver {
    /// Staging buffers, one per tensor of this rank's last shard (with the
    /// writer while a save is under way).
    spare: Vec<Vec<u8>>,
    /// Staging buffers of the sliced state's tensors this rank holds.
    spare_state: Vec<Vec<u8>>,
    /// Their capacity in bytes, as of the last staging.
    staging: usize,
    /// The state's buffers' capacity in bytes, as of the last staging.
    staging_state: usize,
    pending: Option<Pending>,
}

impl std::fmt::Debug for AsyncSaver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncSaver")
            .field("staging_buffers", &self.spare.len())
            .field("pending", &self.pending.as_ref().map(|p| &p.dir))
            .finish()
    }
}

impl AsyncSaver {
    /// A saver with no staging memory yet and no save under way. O(1).
    ///
    /// ```
    /// let saver = scopetree::ranks::AsyncSaver::new();
    /// assert!(!saver.is_pending());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a save is under way (started, not yet finished by
    /// [`wait`](Self::wait) or the next save). O(1).
    ///
    /// ```
    /// assert!(!scopetree::ranks::AsyncSaver::new().is_pending());
    /// ```
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The bytes of staging memory this rank holds (its part of the last
    /// save, and the whole [sliced-state](crate::ranks::SlicedState) tensors it
    /// wrote, kept for the next). O(1).
    ///
    /// ```
    /// assert_eq!(scopetree::ranks::AsyncSaver::new().staging_bytes(), 0);
    /// ```
    pub fn staging_bytes(&self) -> usize {
        self.staging + self.staging_state
    }

    /// Starts a save of `plan`'s variables into `dir`, laid out as
    /// [`SyncPlan::save_shards`] lays them out: finishes the save under way
    /// first (see [`wait`](Self::wait)), then, on every rank, checks the
    /// plan, names the save, copies this rank's shard into the staging
    /// buffers and starts a background thread that writes it. Returns
    /// without waiting for the write. A collective call. O(variables +
    /// bytes of this rank's shard) of copies.
    ///
    /// # Errors
    /// The previous save's errors (see [`wait`](Self::wait)); then as
    /// [`SyncPlan::save_shards`]' checks, on every rank, with nothing
    /// started.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use scopetree::{ScopeTree, ranks::{AsyncSaver, PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![0.5_f64; 2])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// let mut saver = AsyncSaver::new();
    /// saver.save(&SingleProcess, &mut plan, &tree, dir.path().join("1"), &Default::default())?;
    /// saver.save(&SingleProcess, &mut plan, &tree, dir.path().join("2"), &Default::default())?;
    /// assert!(dir.path().join("1/model.safetensors.index.json").exists()); // finished by the second
    /// saver.wait(&SingleProcess)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        plan: &mut SyncPlan,
        tree: &ScopeTree,
        dir: impl AsRef<Path>,
        opts: &SaveOptions,
    ) -> Result<(), Error> {
        self.start(comm, plan, tree, dir.as_ref(), opts, None)
    }

    /// [`save`](Self::save) into `manager`'s directory for `step`; when the
    /// save is finished and whole, rank 0 points the manager's `latest` at
    /// it and removes old checkpoints, as
    /// [`CheckpointManager::save`] does. A collective call.
    ///
    /// # Errors
    /// As [`save`](Self::save).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use scopetree::{ScopeTree, ranks::{AsyncSaver, CheckpointManager, PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![0.5_f64; 2])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// let manager = CheckpointManager::new(dir.path(), 2)?;
    /// let mut saver = AsyncSaver::new();
    /// saver.save_managed(&SingleProcess, &manager, &mut plan, &tree, 10, &Default::default())?;
    /// assert!(manager.latest()?.is_none()); // not visible until finished
    /// saver.wait(&SingleProcess)?;
    /// assert_eq!(manager.latest()?.map(|(step, _)| step), Some(10));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save_managed<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        manager: &CheckpointManager,
        plan: &mut SyncPlan,
        tree: &ScopeTree,
        step: u64,
        opts: &SaveOptions,
    ) -> Result<(), Error> {
        let dir = manager.step_dir(step);
        self.start(comm, plan, tree, &dir, opts, Some((manager.clone(), step)))
    }

    fn start<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        plan: &mut SyncPlan,
        tree: &ScopeTree,
        dir: &Path,
        opts: &SaveOptions,
        pointer: Option<(CheckpointManager, u64)>,
    ) -> Result<(), Error> {
        self.wait(comm)?;
        let _watch = plan.watch(comm, "starting a save beside training");
        let prepared = plan.prepare_save(comm, tree, dir, opts, "starting a save")?;
        let mut report = prepared.report();
        let range = prepared.my_range();
        // The state first: gathering its split tensors is collective.
        let mut state_buffers = std::mem::take(&mut self.spare_state);
        let state = match &prepared.state {
            Some(st) => {
                plan.stage_state(comm, tree, st, &prepared.save_id, true, &mut state_buffers)?
            }
            None => None,
        };
        if let Some(file) = &state {
            report.state_shard = Some(file.name.clone());
            report.state_keys = file.tensors.iter().map(|t| t.0.clone()).collect();
            report.state_bytes = file.bytes();
        }
        self.staging_state = state_buffers.iter().map(Vec::capacity).sum();
        let model = match prepared.mine {
            None => Ok(None),
            Some(_) => self
                .stage(plan, tree, &prepared, range, opts, dir, &report)
                .map(Some),
        };
        let (writer, staged) = match model {
            Err(e) => {
                self.spare_state = state_buffers;
                (None, Err(e))
            }
            Ok(None) if state.is_none() => {
                self.spare_state = state_buffers;
                (None, Ok(()))
            }
            Ok(model) => {
                let shards = match state {
                    Some(file) => Shards {
                        model,
                        state: Some((file, state_buffers, dir.to_owned())),
                        spare_state: Vec::new(),
                    },
                    None => Shards {
                        model,
                        state: None,
                        spare_state: state_buffers,
                    },
                };
                (Some(std::thread::spawn(move || shards.write())), Ok(()))
            }
        };
        self.pending = Some(Pending {
            writer,
            staged,
            dir: dir.to_owned(),
            prepared,
            report,
            pointer,
            watched: plan.watched(),
        });
        Ok(())
    }

    /// Copies this rank's shard (`range` of `prepared`) into the staging
    /// buffers, with its metadata. O(bytes of the shard); allocates only
    /// where a buffer is too small.
    #[allow(clippy::too_many_arguments)]
    fn stage(
        &mut self,
        plan: &SyncPlan,
        tree: &ScopeTree,
        prepared: &Prepared,
        range: Range<usize>,
        opts: &SaveOptions,
        dir: &Path,
        report: &ShardedSave,
    ) -> Result<Shard, Error> {
        let metadata = plan.shard_metadata(tree, prepared, range.clone(), opts)?;
        let mut buffers = std::mem::take(&mut self.spare);
        buffers.resize_with(range.len(), Vec::new);
        let mut tensors = Vec::with_capacity(range.len());
        for (buf, i) in buffers.iter_mut().zip(range) {
            let var = prepared.indices[i];
            buf.clear();
            buf.extend_from_slice(plan.slot_bytes(tree, var)?);
            let e = &plan.manifest().entries()[var];
            tensors.push((prepared.keys[i].clone(), e.dtype, e.shape.clone()));
        }
        self.staging = buffers.iter().map(Vec::capacity).sum();
        Ok(Shard {
            tensors,
            buffers,
            floats_as: opts.floats_as,
            metadata,
            path: dir.join(report.mine.as_deref().unwrap_or_default()),
        })
    }

    /// Finishes the save under way, if any: joins this rank's writer, the
    /// ranks exchange the outcome of their writes, rank 0 writes the index
    /// and, for a managed save, moves the pointer and removes old
    /// checkpoints. Returns this rank's report; `None` when no save was
    /// under way. A collective call: every rank calls it (or the next save)
    /// at the same point.
    ///
    /// # Errors
    /// When a rank's shard could not be written (a full disk, a directory
    /// that cannot be written): that rank's [`Error::Checkpoint`] and
    /// [`Error::PeerFailed`] on the others, with no index written and the
    /// previous checkpoint still the latest. The staging buffers are kept.
    ///
    /// ```
    /// assert!(scopetree::ranks::AsyncSaver::new().wait(&scopetree::ranks::SingleProcess)?.is_none());
    /// # Ok::<(), scopetree::ranks::Error>(())
    /// ```
    pub fn wait<C: Collective + ?Sized>(&mut self, comm: &C) -> Result<Option<ShardedSave>, Error> {
        let Some(pending) = self.pending.take() else {
            return Ok(None);
        };
        let (of, timeout) = &pending.watched;
        let _watch = Watch::arm(
            comm.rank(),
            "finishing a save beside training",
            of,
            *timeout,
        );
        let written = match pending.writer {
            None => pending.staged,
            Some(writer) => match writer.join() {
                Ok(((buffers, state), written)) => {
                    if !buffers.is_empty() {
                        self.spare = buffers;
                    }
                    self.spare_state = state;
                    written
                }
                Err(_) => {
                    let shown = pending.dir.to_string_lossy();
                    let panicked = std::io::Error::other("the background writer panicked");
                    Err(checkpoint::Error::io(&shown)(panicked).into())
                }
            },
        };
        publish(comm, &pending.dir, &pending.prepared, written)?;
        if let Some((manager, step)) = pending.pointer {
            manager.point_at(comm, step)?;
        }
        Ok(Some(pending.report))
    }
}
