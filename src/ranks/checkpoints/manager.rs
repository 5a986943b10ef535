//! [`CheckpointManager`]: a directory of checkpoints, one sub-directory per
//! step written by every rank (a [`ShardedPlan`]'s `save_shards`), a pointer to
//! the latest complete one replaced atomically, and the last K kept.

use std::path::{Path, PathBuf};

use super::plans::ShardedPlan;
use super::shards::{ShardedLoad, ShardedSave};
use crate::checkpoint::{self, INDEX_FILE, SaveOptions, write_atomic};
use crate::ranks::error::Error;
use crate::ranks::plan::agree::settle;
use crate::ranks::transport::collective::{Collective, DIGEST_BYTES};
use crate::ranks::transport::watchdog::Watch;

/// The pointer's file name in a manager's directory: one line, the name of
/// the latest complete checkpoint's sub-directory.
pub const LATEST_FILE: &str = "latest";

/// The prefix of a step's sub-directory (`step-00000000000000001234`).
const STEP_PREFIX: &str = "step-";

/// A directory of checkpoints across ranks: `step-<N>/` per saved step (a
/// Hugging Face sharded checkpoint, every rank writing a shard), the file
/// [`LATEST_FILE`] naming the latest complete one, and the last `keep`
/// complete ones kept. As Orbax's `CheckpointManager` and DeepSpeed's
/// `latest` tag, for a scopetree plan: any [`ShardedPlan`], a
/// [`SyncPlan`](crate::ranks::SyncPlan) over a tree or a
/// `CandlePlan` over a candle store (its
/// variables on any device).
///
/// The pointer moves only once a step's index is on disk, by an atomic
/// rename: a save that stops anywhere (a rank killed, a full disk) leaves
/// the pointer naming the previous complete checkpoint, which loads. The
/// manager never removes the checkpoint the pointer names.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// use scopetree::{ScopeTree, ranks::{CheckpointManager, PlanOptions, SingleProcess, SyncPlan}};
/// let world = SingleProcess;
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// tree.set(w, vec![0.0_f32; 4])?;
/// let mut plan = SyncPlan::new(&world, &tree, tree.root(), &PlanOptions::new())?;
/// let manager = CheckpointManager::new(dir.path(), 2)?;
/// for step in 1..=3_u64 {
///     tree.set(w, vec![step as f32; 4])?;
///     manager.save(&world, &mut plan, &tree, step, &Default::default())?;
/// }
/// assert_eq!(manager.steps()?, [2, 3]); // the last two
/// tree.set(w, vec![0.0_f32; 4])?;
/// let (step, _) = manager.load_latest(&world, &mut plan, &mut tree)?.expect("a checkpoint");
/// assert_eq!((step, tree.get::<Vec<f32>>(w)?[0]), (3, 3.0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct CheckpointManager {
    dir: PathBuf,
    keep: usize,
}

impl CheckpointManager {
    /// A manager of the directory `dir` (made by the first save), keeping
    /// the last `keep` complete checkpoints. Local: no collective. O(1).
    ///
    /// # Errors
    /// [`Error::BadOption`] when `keep` is 0: the latest checkpoint is
    /// always kept.
    ///
    /// ```
    /// use scopetree::ranks::{CheckpointManager, Error};
    /// assert!(CheckpointManager::new("ckpts", 3).is_ok());
    /// assert!(matches!(CheckpointManager::new("ckpts", 0), Err(Error::BadOption { .. })));
    /// ```
    pub fn new(dir: impl Into<PathBuf>, keep: usize) -> Result<Self, Error> {
        if keep == 0 {
            return Err(Error::BadOption {
                reason: "a checkpoint manager that keeps 0 checkpoints; keep at least 1 \
                         (the latest is never removed)"
                    .into(),
            });
        }
        Ok(Self {
            dir: dir.into(),
            keep,
        })
    }

    /// The managed directory. O(1).
    ///
    /// ```
    /// let m = scopetree::ranks::CheckpointManager::new("ckpts", 1)?;
    /// assert_eq!(m.dir(), std::path::Path::new("ckpts"));
    /// # Ok::<(), scopetree::ranks::Error>(())
    /// ```
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The sub-directory of `step`'s checkpoint (whether or not it exists).
    /// O(1).
    ///
    /// ```
    /// let m = scopetree::ranks::CheckpointManager::new("ckpts", 1)?;
    /// assert!(m.step_dir(12).ends_with("step-00000000000000000012"));
    /// # Ok::<(), scopetree::ranks::Error>(())
    /// ```
    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.dir.join(format!("{STEP_PREFIX}{step:020}"))
    }

    /// The step and directory of the latest complete checkpoint, as the
    /// pointer names it; `None` when nothing was saved yet. Local: no
    /// collective. O(1) file reads.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] when the pointer cannot be read, or names no
    /// step directory of this manager.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// let m = scopetree::ranks::CheckpointManager::new(dir.path(), 1)?;
    /// assert!(m.latest()?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn latest(&self) -> Result<Option<(u64, PathBuf)>, Error> {
        let path = self.dir.join(LATEST_FILE);
        let shown = path.to_string_lossy();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(checkpoint::Error::io(&shown)(e).into()),
        };
        let name = text.trim();
        match step_of(name) {
            Some(step) => Ok(Some((step, self.dir.join(name)))),
            None => Err(checkpoint::Error::io(&shown)(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "names {:?}, not a step directory; point it at one or remove it",
                    crate::short::name(name)
                ),
            ))
            .into()),
        }
    }

    /// The steps whose checkpoints are complete (their index is on disk),
    /// ascending. Local: no collective. O(entries of the directory).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] when the directory exists but cannot be read.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// let m = scopetree::ranks::CheckpointManager::new(dir.path().join("none"), 1)?;
    /// assert!(m.steps()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn steps(&self) -> Result<Vec<u64>, Error> {
        let mut steps: Vec<u64> = self
            .step_dirs()?
            .into_iter()
            .filter(|(_, dir)| dir.join(INDEX_FILE).is_file())
            .map(|(step, _)| step)
            .collect();
        steps.sort_unstable();
        Ok(steps)
    }

    /// Every step sub-directory, complete or not.
    fn step_dirs(&self) -> Result<Vec<(u64, PathBuf)>, Error> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(checkpoint::Error::io(&self.dir.to_string_lossy())(e).into()),
        };
        Ok(entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name();
                let step = step_of(name.to_str()?)?;
                Some((step, e.path()))
            })
            .collect())
    }

    /// Saves `step` with the plan's `save_shards`
    /// ([`SyncPlan::save_shards`](crate::ranks::SyncPlan::save_shards) of a
    /// tree, `CandlePlan::save_shards`
    /// of a candle store) into its own
    /// sub-directory; when every rank's shard and the index are on disk,
    /// rank 0 points [`LATEST_FILE`] at it (an atomic rename) and removes
    /// the complete checkpoints older than the last `keep`, and any
    /// incomplete one older than it (left by a save that stopped). A
    /// collective call. O(as `save_shards`) plus the directory's entries.
    ///
    /// # Errors
    /// As the plan's `save_shards`, on every rank, with the pointer and
    /// every earlier checkpoint untouched; [`Error::Checkpoint`] on rank 0
    /// ([`Error::PeerFailed`] on the others) when the pointer cannot be
    /// written. A checkpoint that cannot be removed is left in place.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use scopetree::{ScopeTree, ranks::{CheckpointManager, PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![1.0_f64; 2])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// let m = CheckpointManager::new(dir.path(), 1)?;
    /// m.save(&SingleProcess, &mut plan, &tree, 7, &Default::default())?;
    /// assert_eq!(m.latest()?.map(|(s, _)| s), Some(7));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save<P, S, C>(
        &self,
        comm: &C,
        plan: &mut P,
        state: &S,
        step: u64,
        opts: &SaveOptions,
    ) -> Result<ShardedSave, Error>
    where
        P: ShardedPlan<S>,
        S: ?Sized,
        C: Collective + ?Sized,
    {
        let _watch = watch(comm, plan, "saving a managed checkpoint");
        let dir = self.step_dir(step);
        let saved = plan.save_shards_of(comm, state, &dir, opts)?;
        self.point_at(comm, step)?;
        Ok(saved)
    }

    /// Once `step`'s checkpoint is whole on every rank: rank 0 points
    /// [`LATEST_FILE`] at it (an atomic rename) and removes old checkpoints;
    /// the ranks exchange the outcome. A collective call.
    pub(in crate::ranks) fn point_at<C: Collective + ?Sized>(
        &self,
        comm: &C,
        step: u64,
    ) -> Result<(), Error> {
        let pointed = if comm.rank() == 0 {
            let name = format!("{STEP_PREFIX}{step:020}\n");
            write_atomic(&self.dir.join(LATEST_FILE), name.as_bytes()).map_err(Error::from)
        } else {
            Ok(())
        };
        let mut gathered = vec![[0_u8; DIGEST_BYTES]; comm.size()];
        settle(
            comm,
            &mut gathered,
            "pointing at the checkpoint",
            pointed,
            None,
        )?;
        if comm.rank() == 0 {
            self.prune(step);
        }
        Ok(())
    }

    /// Removes the complete checkpoints older than the last `keep` and the
    /// incomplete ones older than `latest`; never `latest` itself. Best
    /// effort: what cannot be removed stays.
    fn prune(&self, latest: u64) {
        let Ok(mut dirs) = self.step_dirs() else {
            return;
        };
        dirs.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
        let mut complete = 0;
        for (step, dir) in dirs {
            if step > latest {
                continue; // not ours to judge
            }
            let whole = dir.join(INDEX_FILE).is_file();
            if whole {
                complete += 1;
            }
            if step != latest && (!whole || complete > self.keep) {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }

    /// Loads the latest complete checkpoint with the plan's `load_shards`
    /// ([`SyncPlan::load_shards`](crate::ranks::SyncPlan::load_shards),
    /// `CandlePlan::load_shards`)
    /// (at any number of ranks) and returns its step; `None` on every rank
    /// when there is none yet. A collective call.
    ///
    /// # Errors
    /// As the plan's `load_shards`: every rank's state unchanged. When the
    /// ranks see different pointers (no shared filesystem), the load's
    /// consistency check ([`Error::Diverged`]) or a file error says so.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use scopetree::{ScopeTree, ranks::{CheckpointManager, PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// let m = CheckpointManager::new(dir.path(), 1)?;
    /// assert!(m.load_latest(&SingleProcess, &mut plan, &mut tree)?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_latest<P, S, C>(
        &self,
        comm: &C,
        plan: &mut P,
        state: &mut S,
    ) -> Result<Option<(u64, ShardedLoad)>, Error>
    where
        P: ShardedPlan<S>,
        S: ?Sized,
        C: Collective + ?Sized,
    {
        let _watch = watch(comm, plan, "loading the latest checkpoint");
        let latest = self.latest();
        let mut gathered = vec![[0_u8; DIGEST_BYTES]; comm.size()];
        let latest = settle(
            comm,
            &mut gathered,
            "finding the latest checkpoint",
            latest,
            None,
        )?;
        // Every rank must take the same branch: a rank that sees no
        // pointer while another does is an error on every rank.
        let none_here = latest.is_none();
        let none = settle(
            comm,
            &mut gathered,
            "finding the latest checkpoint",
            Ok(()),
            Some(("pointers", u64::from(none_here), show_found)),
        );
        none?;
        match latest {
            None => Ok(None),
            Some((step, dir)) => Ok(Some((step, plan.load_shards_into(comm, state, &dir)?))),
        }
    }
}

/// Watches the collective call `op` of `plan` on `comm`'s rank, with the
/// plan's timeout, until the returned guard drops. O(1).
fn watch<P, S, C>(comm: &C, plan: &P, op: &'static str) -> Watch
where
    P: ShardedPlan<S>,
    S: ?Sized,
    C: Collective + ?Sized,
{
    let (of, timeout) = plan.watched();
    Watch::arm(comm.rank(), op, &of, timeout)
}

/// Whether a rank found a pointer, as a message shows it.
fn show_found(v: u64) -> String {
    if v == 0 { "a pointer" } else { "no pointer" }.to_owned()
}

/// The step a sub-directory's name holds, if it is one.
fn step_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(STEP_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_read_back_and_others_are_not_steps() {
        assert_eq!(step_of("step-00000000000000000042"), Some(42));
        assert_eq!(step_of("step-7"), Some(7));
        for bad in ["step-", "step-x", "step--1", "latest", "step-1/..", "tmp"] {
            assert_eq!(step_of(bad), None, "{bad}");
        }
    }
}
