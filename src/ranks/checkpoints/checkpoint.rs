//! Checkpoints across ranks: one rank saves, every rank loads the same
//! file, and the ranks check that they agree.

use std::path::Path;

use crate::ScopeTree;
use crate::checkpoint::{
    self, Dtype, LoadOptions, LoadReport, Mismatch, SaveOptions, SaveReport, Separator,
};
use crate::ranks::error::Error;
use crate::ranks::plan::agree::{Same, settle, show_count};
use crate::ranks::plan::sync_plan::SyncPlan;
use crate::ranks::transport::collective::{Collective, DIGEST_BYTES, check_root};

impl SyncPlan {
    /// Rank `root` saves the plan's scope to `path` with
    /// [`checkpoint::save`] (atomically: a temporary file renamed into
    /// place); the other ranks wait until it is done. A collective call: when
    /// it returns `Ok` on any rank, the file is whole at `path` (on a
    /// filesystem every rank sees, for several hosts). O(subtree + bytes
    /// written) on the root, plus two all-gathers of 16 bytes per rank.
    ///
    /// The file holds exactly the plan's variables: `opts`' separator and
    /// filter are replaced by `/` and the plan's filter. Returns the save's
    /// report on the root, `None` on the other ranks.
    ///
    /// # Errors
    /// On every rank: [`Error::ArgumentsDiffer`] when the ranks pass
    /// different roots (nothing is saved then). On a rank that passes a
    /// `root` outside the world, [`Error::BadRank`]. On the root, the save's
    /// error ([`Error::Checkpoint`]), and on the others [`Error::PeerFailed`]
    /// naming the root; nothing is left at `path` then.
    ///
    /// ```
    /// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
    /// use scopetree::{ScopeTree, checkpoint::SaveOptions, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![1.0_f32; 4])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// let report = plan.save_on_root(&SingleProcess, &tree, dir.join("m.safetensors"), 0, &SaveOptions::new())?;
    /// assert_eq!(report.expect("rank 0 saved").keys, ["w"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save_on_root<C: Collective + ?Sized>(
        &self,
        comm: &C,
        tree: &ScopeTree,
        path: impl AsRef<Path>,
        root: usize,
        opts: &SaveOptions,
    ) -> Result<Option<SaveReport>, Error> {
        let _watch = self.watch(comm, "saving the checkpoint");
        let mut gathered = vec![[0_u8; DIGEST_BYTES]; comm.size()];
        // Every rank agrees on the root before one of them saves.
        let same: Same = ("roots", root as u64, show_count);
        let checked = check_root(root, comm.size());
        settle(
            comm,
            &mut gathered,
            "saving the checkpoint",
            checked,
            Some(same),
        )?;
        let local = if comm.rank() == root {
            // The file holds exactly the plan's variables, under the keys
            // of its manifest.
            let mut opts = opts.clone();
            opts.sep = Separator::Slash;
            opts.filter = self.saved_keys();
            checkpoint::save(tree, self.scope(), path, &opts)
                .map(Some)
                .map_err(Error::from)
        } else {
            Ok(None)
        };
        settle(comm, &mut gathered, "saving the checkpoint", local, None)
    }

    /// Every rank loads `path` into the plan's scope, strictly (every name,
    /// dtype and shape of the file must match the plan's variables; keys the
    /// plan's filter leaves out are ignored on both sides), then
    /// the ranks [check](Self::check_consistency) that they hold the same
    /// bytes. A collective call: call it after
    /// [`save_on_root`](Self::save_on_root) returned, or at start-up to
    /// resume. O(header + bytes read) per rank, plus the consistency check.
    ///
    /// First every rank checks the file's header against the plan and the
    /// ranks exchange the outcome, so a file that does not fit makes every
    /// rank return an error with no value changed. Only a read that fails
    /// after those checks (the disk, or a file changed meanwhile) leaves the
    /// other ranks with the file's values, and the failing rank as
    /// [`checkpoint::load`] leaves it.
    ///
    /// # Errors
    /// On the rank concerned, the load's error ([`Error::Checkpoint`]: an
    /// unreadable file or [`checkpoint::Error::Mismatch`]), and on the others
    /// [`Error::PeerFailed`] naming it; [`Error::Diverged`] on every rank
    /// when the ranks loaded different bytes (files that differ between
    /// hosts).
    ///
    /// ```
    /// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
    /// use scopetree::{ScopeTree, checkpoint::SaveOptions, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![1.0_f32; 4])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// let path = dir.join("m.safetensors");
    /// plan.save_on_root(&SingleProcess, &tree, &path, 0, &SaveOptions::new())?;
    /// tree.get_mut::<Vec<f32>>(w)?.fill(0.0);
    /// let report = plan.load_on_all(&SingleProcess, &mut tree, &path)?;
    /// assert_eq!(report.loaded, ["w"]);
    /// assert_eq!(tree.get::<Vec<f32>>(w)?, &[1.0; 4]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_on_all<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        path: impl AsRef<Path>,
    ) -> Result<LoadReport, Error> {
        let _watch = self.watch(comm, "loading the checkpoint");
        let path = path.as_ref();
        let mut gathered = vec![[0_u8; DIGEST_BYTES]; comm.size()];
        let checked = self.check_file(path);
        settle(
            comm,
            &mut gathered,
            "checking the checkpoint",
            checked,
            None,
        )?;
        let mut opts = LoadOptions::new();
        if let Some(keep) = self.saved_keys() {
            opts = opts.filter(move |key| keep(key));
        }
        let loaded = checkpoint::load(tree, self.scope(), path, &opts).map_err(Error::from);
        let report = settle(comm, &mut gathered, "loading the checkpoint", loaded, None)?;
        self.check_consistency(comm, tree)?;
        Ok(report)
    }

    /// Checks the file's header against the plan's manifest: the same keys,
    /// dtypes, and shapes (element counts for flat values). O(header).
    /// Checks the checkpoint at `path` (a file, an index or a directory)
    /// against the plan: see [`header_fits`]. O(headers + variables).
    pub(in crate::ranks) fn check_file(&self, path: &Path) -> Result<(), Error> {
        let mut file = checkpoint::inspect(path)?;
        // Keys the plan's checkpoints leave out are ignored, as a load
        // ignores them.
        let saved = self.saved_keys();
        file.retain(|t| saved.as_ref().is_none_or(|keep| keep(&t.key)));
        let mine = self
            .manifest()
            .entries()
            .iter()
            .zip(self.flat())
            .filter(|(e, _)| !self.is_scratch(&e.key))
            .map(|(e, flat)| (e.key.as_str(), e.dtype, e.shape.as_slice(), flat));
        header_fits(path, file, mine)
    }
}

/// Checks a file's tensors against `mine` (key, dtype, shape, and whether
/// only the element count must match, in key order): the same keys, dtypes
/// and shapes, else one [`Mismatch`](checkpoint::Error::Mismatch) naming
/// every difference. O(header + sort).
pub(in crate::ranks) fn header_fits<'a>(
    path: &Path,
    mut file: Vec<checkpoint::FileTensor>,
    mine: impl Iterator<Item = (&'a str, Dtype, &'a [usize], bool)>,
) -> Result<(), Error> {
    file.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    let entries: Vec<_> = mine.collect();
    let (mut missing, mut unexpected, mut mismatched) = (Vec::new(), Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < entries.len() || j < file.len() {
        match (entries.get(i), file.get(j)) {
            (Some(&(key, dtype, shape, flat)), Some(f)) if key == f.key => {
                let fits = if flat {
                    shape.iter().product::<usize>() == f.shape.iter().product::<usize>()
                } else {
                    shape == f.shape.as_slice()
                };
                if dtype != f.dtype || !fits {
                    mismatched.push(Mismatch {
                        key: key.to_owned(),
                        file: format!("{:?} {:?}", f.dtype, f.shape),
                        tree: format!("{dtype:?} {shape:?}"),
                    });
                }
                i += 1;
                j += 1;
            }
            (Some(&(key, ..)), f) if f.is_none_or(|f| key < f.key.as_str()) => {
                missing.push(key.to_owned());
                i += 1;
            }
            (_, Some(f)) => {
                unexpected.push(f.key.clone());
                j += 1;
            }
            (_, None) => break,
        }
    }
    if missing.is_empty() && unexpected.is_empty() && mismatched.is_empty() {
        return Ok(());
    }
    Err(checkpoint::Error::Mismatch {
        path: crate::short::path(&path.to_string_lossy()),
        missing,
        unexpected,
        mismatched,
        unassigned: Vec::new(),
    }
    .into())
}
