//! [`ShardedPlan`]: the plans whose checkpoints across ranks a
//! [`CheckpointManager`](crate::ranks::CheckpointManager) keeps, and
//! [`StagedPlan`]: those an [`AsyncSaver`](crate::ranks::AsyncSaver) also
//! writes beside training: [`SyncPlan`] over a [`ScopeTree`] (here), and
//! `CandlePlan` over a `CandleStore` or a `Training` (in the candle
//! room).

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::shards::{Prepared, ShardedLoad, ShardedSave};
use super::staged::{Shard, Shards, Spare, Staged};
use crate::ScopeTree;
use crate::checkpoint::SaveOptions;
use crate::ranks::error::Error;
use crate::ranks::plan::sync_plan::SyncPlan;
use crate::ranks::transport::collective::Collective;

/// A plan whose checkpoints across ranks, held in a state of type `S`, a
/// [`CheckpointManager`](crate::ranks::CheckpointManager) keeps:
/// [`SyncPlan`] over a [`ScopeTree`], and `CandlePlan` over a
/// `CandleStore` or a `Training` (feature `candle`). Those an
/// [`AsyncSaver`](crate::ranks::AsyncSaver) writes are [`StagedPlan`]s
/// too. Sealed:
/// the crate implements it for its plans, and callers name it only in
/// bounds.
///
/// ```
/// use scopetree::{ScopeTree, ranks::{ShardedPlan, SyncPlan}};
/// fn saves_trees<P: ShardedPlan<ScopeTree>>() {}
/// saves_trees::<SyncPlan>();
/// ```
pub trait ShardedPlan<S: ?Sized>: Sealed<S> {}

/// The calls a manager (and a saver) makes of a plan; not nameable outside
/// the ranks layer, so that [`ShardedPlan`] stays sealed.
pub trait Sealed<S: ?Sized> {
    /// What the watchdog names for the plan, and its timeout.
    fn watched(&self) -> (Arc<str>, Option<Duration>);

    /// The plan's `save_shards` of `state` into `dir`.
    fn save_shards_of<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        state: &S,
        dir: &Path,
        opts: &SaveOptions,
    ) -> Result<ShardedSave, Error>;

    /// The plan's `load_shards` of `dir` into `state`.
    fn load_shards_into<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        state: &mut S,
        dir: &Path,
    ) -> Result<ShardedLoad, Error>;
}

/// A [`ShardedPlan`] whose checkpoints an
/// [`AsyncSaver`](crate::ranks::AsyncSaver) also writes beside training:
/// [`SyncPlan`] over a [`ScopeTree`], and `CandlePlan` over a
/// `CandleStore`. A `CandlePlan` over a `Training` (a store with its
/// optimizer) is a [`ShardedPlan`] only: its optimizer's state is not
/// staged. Sealed, as
/// [`ShardedPlan`].
///
/// ```
/// use scopetree::{ScopeTree, ranks::{StagedPlan, SyncPlan}};
/// fn stages_trees<P: StagedPlan<ScopeTree>>() {}
/// stages_trees::<SyncPlan>();
/// ```
pub trait StagedPlan<S: ?Sized>: ShardedPlan<S> + SealedStage<S> {}

/// The call an [`AsyncSaver`](crate::ranks::AsyncSaver) makes of a plan
/// beyond [`Sealed`]'s; not nameable outside the ranks layer, so that
/// [`StagedPlan`] stays sealed.
pub trait SealedStage<S: ?Sized>: Sealed<S> {
    /// Checks and names a save of `state` into `dir` (collective: an error
    /// here is every rank's, with nothing started), then copies this
    /// rank's shards into `spare`'s buffers for a background thread to
    /// write.
    ///
    /// A rank whose shards hold more than `budget` bytes writes them
    /// instead, before returning (from its variables, with no staging),
    /// and says so in [`Staged::in_background`].
    fn stage<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        state: &S,
        dir: &Path,
        opts: &SaveOptions,
        spare: &mut Spare,
        budget: u64,
    ) -> Result<Staged, Error>;
}

impl ShardedPlan<ScopeTree> for SyncPlan {}

impl StagedPlan<ScopeTree> for SyncPlan {}

impl Sealed<ScopeTree> for SyncPlan {
    fn watched(&self) -> (Arc<str>, Option<Duration>) {
        SyncPlan::watched(self)
    }

    fn save_shards_of<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &ScopeTree,
        dir: &Path,
        opts: &SaveOptions,
    ) -> Result<ShardedSave, Error> {
        self.save_shards(comm, tree, dir, opts)
    }

    fn load_shards_into<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        dir: &Path,
    ) -> Result<ShardedLoad, Error> {
        self.load_shards(comm, tree, dir)
    }
}

impl SealedStage<ScopeTree> for SyncPlan {
    fn stage<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &ScopeTree,
        dir: &Path,
        opts: &SaveOptions,
        spare: &mut Spare,
        budget: u64,
    ) -> Result<Staged, Error> {
        let prepared = self.prepare_save(comm, tree, dir, opts, "starting a save")?;
        let range = prepared.my_range();
        let entries = self.manifest().entries();
        let model_bytes: u64 = prepared.indices[range.clone()]
            .iter()
            .map(|&v| {
                (entries[v].shape.iter().product::<usize>() * entries[v].dtype.bitsize() / 8) as u64
            })
            .sum();
        let state_bytes = prepared
            .state
            .as_ref()
            .map_or(0, |st| self.state_bytes_mine(st));
        let bytes = model_bytes + state_bytes;
        if bytes > budget {
            // Over the budget: written now, from the tree, as
            // `save_shards` writes (the gathering of the split state
            // tensors is the same collective call as the staging's).
            let (report, written) = self.write_shards(comm, tree, dir, opts, &prepared)?;
            return Ok(Staged {
                prepared,
                report,
                shards: written.map(|()| None),
                bytes,
                in_background: false,
            });
        }
        let mut report = prepared.report();
        // The state first: gathering its split tensors is collective.
        let mut state_buffers = std::mem::take(&mut spare.state);
        let state = match &prepared.state {
            Some(st) => {
                self.stage_state(comm, tree, st, &prepared.save_id, true, &mut state_buffers)?
            }
            None => None,
        };
        if let Some(file) = &state {
            report.state_shard = Some(file.name.clone());
            report.state_keys = file.tensors.iter().map(|t| t.0.clone()).collect();
            report.state_bytes = file.bytes();
        }
        spare.state_bytes = state_buffers.iter().map(Vec::capacity).sum();
        let model = match prepared.mine {
            None => Ok(None),
            Some(_) => self
                .stage_shard(tree, &prepared, range, opts, dir, &report, spare)
                .map(Some),
        };
        let shards = match model {
            Err(e) => {
                spare.state = state_buffers;
                Err(e)
            }
            Ok(None) if state.is_none() => {
                spare.state = state_buffers;
                Ok(None)
            }
            Ok(model) => Ok(Some(match state {
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
            })),
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

impl SyncPlan {
    /// Copies this rank's shard (`range` of `prepared`) into `spare`'s
    /// staging buffers, with its metadata. O(bytes of the shard);
    /// allocates only where a buffer is too small.
    #[allow(clippy::too_many_arguments)]
    fn stage_shard(
        &self,
        tree: &ScopeTree,
        prepared: &Prepared,
        range: Range<usize>,
        opts: &SaveOptions,
        dir: &Path,
        report: &ShardedSave,
        spare: &mut Spare,
    ) -> Result<Shard, Error> {
        let metadata = self.shard_metadata(tree, prepared, range.clone(), opts)?;
        let mut buffers = std::mem::take(&mut spare.model);
        buffers.resize_with(range.len(), Vec::new);
        let mut tensors = Vec::with_capacity(range.len());
        for (buf, i) in buffers.iter_mut().zip(range) {
            let var = prepared.indices[i];
            buf.clear();
            match self.slot_bytes(tree, var) {
                Ok(bytes) => buf.extend_from_slice(bytes),
                Err(e) => {
                    spare.model = buffers;
                    return Err(e);
                }
            }
            let e = &self.manifest().entries()[var];
            tensors.push((prepared.keys[i].clone(), e.dtype, e.shape.clone()));
        }
        spare.model_bytes = buffers.iter().map(Vec::capacity).sum();
        Ok(Shard {
            tensors,
            buffers,
            floats_as: opts.floats_as,
            metadata,
            checksummed: false,
            path: dir.join(report.mine.as_deref().unwrap_or_default()),
        })
    }
}
