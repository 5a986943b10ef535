//! [`AsyncSaver`]: saves beside training. A save copies this rank's part
//! of a plan into staging buffers reused from save to save and returns; a
//! background thread writes the shard; the next save, or
//! [`wait`](AsyncSaver::wait), finishes it on every rank (the outcome
//! exchanged, the index written, the manager's pointer moved).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::manager::CheckpointManager;
use super::plans::StagedPlan;
use super::shards::{Prepared, ShardedSave, publish};
use super::staged::{Shards, Spare, Staged, Written};
use crate::checkpoint::{self, SaveOptions};
use crate::ranks::error::Error;
use crate::ranks::transport::collective::Collective;
use crate::ranks::transport::watchdog::Watch;

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
/// plan (its shard of [`StagedPlan`]'s `save_shards`' layout) into buffers kept
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
/// The staging memory is this rank's part only, and at most the budget
/// given to [`with_budget`](Self::with_budget): a rank whose part exceeds
/// it writes the part in the call instead. The buffers keep their
/// capacity, so saves of the same plan allocate nothing for the values
/// after the first. MPI is only called from the thread that calls `save`
/// and `wait` (the background thread writes files only), as
/// `Threading::Funneled` requires.
///
/// With a `CandlePlan`, a rank copies its
/// shard's variables off their device (in 8 MiB pieces, in the caller's
/// time), and the background thread hashes each tensor and writes the
/// shard, with the checksums `CandlePlan::save_shards` writes.
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
pub struct AsyncSaver {
    /// Staging buffers, one per tensor of this rank's last shard and of
    /// the sliced state it wrote (with the writer while a save is under
    /// way).
    spare: Spare,
    /// The most bytes a rank stages for one save.
    budget: u64,
    pending: Option<Pending>,
}

impl Default for AsyncSaver {
    fn default() -> Self {
        Self {
            spare: Spare::default(),
            budget: u64::MAX,
            pending: None,
        }
    }
}

/// How a save beside training started on this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SaveStarted {
    /// The bytes of this rank's shards, as held.
    pub bytes: u64,
    /// Whether a background thread writes them (`false`: they exceeded
    /// the saver's [budget](AsyncSaver::with_budget), or the system refused
    /// the writer's thread, and this rank wrote them before the call
    /// returned). Either way the checkpoint is
    /// published by the next save or [`wait`](AsyncSaver::wait).
    pub in_background: bool,
    /// How long the call held the caller: the checks, the copies into
    /// staging (or the writes, over the budget).
    pub blocked: Duration,
}

impl std::fmt::Debug for AsyncSaver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncSaver")
            .field("staging_buffers", &self.spare.model.len())
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

    /// A saver that stages at most `budget` bytes per rank and save: a
    /// rank whose shards hold more writes them in the call (from its
    /// variables, with no staging, as `save_shards` does) and reports
    /// [`SaveStarted::in_background`] `false`; the save is still
    /// published by the next save or [`wait`](Self::wait). The buffers
    /// kept between saves never exceed it. [`new`](Self::new) has no
    /// budget: a rank stages its whole part. O(1).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use scopetree::{ScopeTree, ranks::{AsyncSaver, PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![1.0_f32; 1024])?; // 4 KiB
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// let mut saver = AsyncSaver::with_budget(1024);
    /// let started = saver.save(&SingleProcess, &mut plan, &tree, dir.path().join("1"), &Default::default())?;
    /// assert_eq!((started.bytes, started.in_background), (4096, false));
    /// assert_eq!(saver.staging_bytes(), 0);
    /// saver.wait(&SingleProcess)?.expect("published by the wait");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_budget(budget: u64) -> Self {
        Self {
            budget,
            ..Self::default()
        }
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
        self.spare.model_bytes + self.spare.state_bytes
    }

    /// Starts a save of `plan`'s variables in `state` into `dir`, laid out
    /// as the plan's `save_shards` lays them out ([`SyncPlan::save_shards`](crate::ranks::SyncPlan::save_shards)
    /// over a tree, `CandlePlan::save_shards`
    /// over a candle store, device variables included): finishes the save under way
    /// first (see [`wait`](Self::wait)), then, on every rank, checks the
    /// plan, names the save, copies this rank's shard into the staging
    /// buffers and starts a background thread that writes it. Returns
    /// without waiting for the write. A collective call. O(variables +
    /// bytes of this rank's shard) of copies.
    ///
    /// # Errors
    /// The previous save's errors (see [`wait`](Self::wait)); then as
    /// the plan's `save_shards`' checks, on every rank, with nothing
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
    pub fn save<P, S, C>(
        &mut self,
        comm: &C,
        plan: &mut P,
        state: &S,
        dir: impl AsRef<Path>,
        opts: &SaveOptions,
    ) -> Result<SaveStarted, Error>
    where
        P: StagedPlan<S>,
        S: ?Sized,
        C: Collective + ?Sized,
    {
        self.start(comm, plan, state, dir.as_ref(), opts, None)
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
    pub fn save_managed<P, S, C>(
        &mut self,
        comm: &C,
        manager: &CheckpointManager,
        plan: &mut P,
        state: &S,
        step: u64,
        opts: &SaveOptions,
    ) -> Result<SaveStarted, Error>
    where
        P: StagedPlan<S>,
        S: ?Sized,
        C: Collective + ?Sized,
    {
        let dir = manager.step_dir(step);
        self.start(comm, plan, state, &dir, opts, Some((manager.clone(), step)))
    }

    fn start<P, S, C>(
        &mut self,
        comm: &C,
        plan: &mut P,
        state: &S,
        dir: &Path,
        opts: &SaveOptions,
        pointer: Option<(CheckpointManager, u64)>,
    ) -> Result<SaveStarted, Error>
    where
        P: StagedPlan<S>,
        S: ?Sized,
        C: Collective + ?Sized,
    {
        self.wait(comm)?;
        let t0 = Instant::now();
        let watched = plan.watched();
        let _watch = Watch::arm(
            comm.rank(),
            "starting a save beside training",
            &watched.0,
            watched.1,
        );
        let Staged {
            prepared,
            report,
            shards,
            bytes,
            in_background,
        } = plan.stage(comm, state, dir, opts, &mut self.spare, self.budget)?;
        let mut in_background = in_background;
        let (writer, staged) = match shards {
            Err(e) => (None, Err(e)),
            Ok(None) => (None, Ok(())),
            Ok(Some(shards)) => {
                match crate::threads::spawn("scopetree-save", shards, Shards::write) {
                    Ok(writer) => (Some(writer), Ok(())),
                    // The system refused the writer's thread: this rank writes
                    // its shards here; the save is published as any other.
                    Err(shards) => {
                        in_background = false;
                        let ((buffers, state), written) = shards.write();
                        self.spare.put_back(buffers, state);
                        (None, written)
                    }
                }
            }
        };
        self.pending = Some(Pending {
            writer,
            staged,
            dir: dir.to_owned(),
            prepared,
            report,
            pointer,
            watched,
        });
        Ok(SaveStarted {
            bytes,
            in_background,
            blocked: t0.elapsed(),
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
                    self.spare.put_back(buffers, state);
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

#[cfg(test)]
mod tests {
    use super::AsyncSaver;
    use crate::ScopeTree;
    use crate::ranks::{PlanOptions, SingleProcess, SyncPlan};

    #[test]
    fn a_save_refused_its_writers_thread_is_written_in_the_call_and_published_by_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let mut tree = ScopeTree::new();
        let w = tree.var(tree.root(), "w").unwrap();
        tree.set(w, vec![1.5_f32; 1024]).unwrap();
        let mut plan =
            SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new()).unwrap();
        let mut saver = AsyncSaver::new();
        let to = dir.path().join("1");
        let started = crate::threads::refusing(|| {
            saver.save(&SingleProcess, &mut plan, &tree, &to, &Default::default())
        })
        .unwrap();
        assert_eq!((started.bytes, started.in_background), (4096, false));
        assert!(saver.staging_bytes() >= 4096, "the buffers are kept");
        assert!(saver.wait(&SingleProcess).unwrap().is_some());

        tree.set(w, vec![0.0_f32; 1024]).unwrap();
        plan.load_shards(&SingleProcess, &mut tree, &to).unwrap();
        assert_eq!(*tree.get::<Vec<f32>>(w).unwrap(), vec![1.5_f32; 1024]);
    }
}
