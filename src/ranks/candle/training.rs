//! [`Training`]: a [`CandleStore`]'s variables with their optimizer's
//! state ([`ZeroAdamW`], or scopetree's replicated
//! [`AdamW`](crate::candle::AdamW)), as one checkpoint that a
//! [`CheckpointManager`](crate::ranks::CheckpointManager) keeps: saved by
//! every rank, loaded at any number of ranks, both parts or neither.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::plan::CandlePlan;
use super::shards::CheckedShards;
use super::zero_adamw::ZeroAdamW;
use super::zero_state::CheckedState;
use crate::candle::{AdamW, CandleStore};
use crate::checkpoint::SaveOptions;
use crate::ranks::checkpoints::plans::{Sealed, ShardedPlan};
use crate::ranks::checkpoints::shards::{ShardedLoad, ShardedSave};
use crate::ranks::error::Error;
use crate::ranks::transport::collective::Collective;

/// The sub-directory of a [`Training`] checkpoint that holds the
/// optimizer's state (the layout of `ZeroAdamW::save_shards`, which is
/// also a replicated `AdamW`'s); the model's shards and index are beside
/// it.
///
/// ```
/// assert_eq!(scopetree::ranks::OPTIMIZER_DIR, "optimizer");
/// ```
pub const OPTIMIZER_DIR: &str = "optimizer";

/// An optimizer whose state a [`Training`] checkpoint holds:
/// [`ZeroAdamW`] (each rank its slice of the moments) and scopetree's
/// [`AdamW`](crate::candle::AdamW) (every rank the whole state, as in
/// replicated data-parallel training). Both keep the same tensors
/// (`<name>.m`, `<name>.v`, `step`), so a checkpoint of either resumes
/// the other, at any number of ranks. Sealed: the crate implements it for
/// these two.
///
/// ```
/// use scopetree::{candle::AdamW, ranks::{TrainingOptimizer, ZeroAdamW}};
/// fn kept<O: TrainingOptimizer>() {}
/// kept::<ZeroAdamW>();
/// kept::<AdamW>();
/// ```
pub trait TrainingOptimizer: OptimizerState {}

/// The calls a [`Training`] checkpoint makes of its optimizer; not
/// nameable outside the ranks layer, so that [`TrainingOptimizer`] stays
/// sealed.
pub trait OptimizerState {
    /// What a load's check found, for its read.
    type Checked;

    /// Saves the state into `dir`, every rank a shard, through `plan`.
    fn save_state<C: Collective + ?Sized>(
        &self,
        comm: &C,
        plan: &mut CandlePlan,
        dir: &Path,
    ) -> Result<ShardedSave, Error>;

    /// Checks the state's files in `dir` and verifies this rank's
    /// checksums, writing nothing; an error is every rank's.
    fn check_state<C: Collective + ?Sized>(
        &self,
        comm: &C,
        plan: &mut CandlePlan,
        dir: &Path,
    ) -> Result<Self::Checked, Error>;

    /// Reads the checked files into the state.
    fn read_state<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        plan: &mut CandlePlan,
        checked: Self::Checked,
    ) -> Result<ShardedLoad, Error>;
}

impl TrainingOptimizer for ZeroAdamW {}

impl OptimizerState for ZeroAdamW {
    type Checked = CheckedState;

    fn save_state<C: Collective + ?Sized>(
        &self,
        comm: &C,
        plan: &mut CandlePlan,
        dir: &Path,
    ) -> Result<ShardedSave, Error> {
        self.save_shards(comm, plan, dir)
    }

    fn check_state<C: Collective + ?Sized>(
        &self,
        comm: &C,
        plan: &mut CandlePlan,
        dir: &Path,
    ) -> Result<CheckedState, Error> {
        self.check_shards(comm, plan, dir)
    }

    fn read_state<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        plan: &mut CandlePlan,
        checked: CheckedState,
    ) -> Result<ShardedLoad, Error> {
        self.read_shards(comm, plan, checked)
    }
}

/// The replicated optimizer's state is a store like the model's: the plan
/// saves it every rank a shard, and loads it as it loads the model.
impl TrainingOptimizer for AdamW {}

impl OptimizerState for AdamW {
    type Checked = CheckedShards;

    fn save_state<C: Collective + ?Sized>(
        &self,
        comm: &C,
        plan: &mut CandlePlan,
        dir: &Path,
    ) -> Result<ShardedSave, Error> {
        plan.save_shards(comm, self.state(), dir, &SaveOptions::new())
    }

    fn check_state<C: Collective + ?Sized>(
        &self,
        comm: &C,
        plan: &mut CandlePlan,
        dir: &Path,
    ) -> Result<CheckedShards, Error> {
        plan.check_shards(comm, self.state(), dir)
    }

    fn read_state<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        plan: &mut CandlePlan,
        checked: CheckedShards,
    ) -> Result<ShardedLoad, Error> {
        plan.read_shards(comm, self.state(), checked)
    }
}

/// A candle model's variables and its optimizer, saved and loaded as one
/// checkpoint: the state a
/// [`CheckpointManager`](crate::ranks::CheckpointManager) keeps of
/// data-parallel training through a [`CandlePlan`], with [`ZeroAdamW`]
/// (ZeRO stage 1) or scopetree's replicated
/// [`AdamW`](crate::candle::AdamW).
///
/// A save writes the optimizer's state into [`OPTIMIZER_DIR`], every rank
/// a shard ([`ZeroAdamW::save_shards`]; a replicated `AdamW`'s state
/// through [`CandlePlan::save_shards`]), then the model's shards beside it
/// ([`CandlePlan::save_shards`]), whose index comes last: a step
/// directory with the model's index is whole. The optimizer's state is
/// the same tensors for both optimizers, so a checkpoint of either
/// resumes the other. A load checks both parts' files and verifies both
/// parts' checksums on every rank before it writes anything, so that a
/// missing, mismatched or corrupted tensor in either part leaves the
/// variables and the optimizer unchanged on every rank; it ends with the
/// plan's [consistency check](CandlePlan::check_consistency). Only a disk
/// that fails to read bytes that verified a moment before, or candle
/// failing to set a value, can leave them partly loaded. A save costs
/// what the two `save_shards` cost, a load what the two `load_shards`
/// cost: O(variables + ranks + bytes of this rank's parts), plus the
/// exchanges.
///
/// Not an [`AsyncSaver`](crate::ranks::AsyncSaver)'s: the optimizer's
/// state is not staged (a `ZeroAdamW`'s moments of a variable split
/// between ranks are put together by a collective exchange), so the saves
/// of this state are synchronous.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// use candle_core::{DType, Device};
/// use scopetree::{candle::CandleStore, ranks::{CandlePlan, CheckpointManager, PlanOptions, SingleProcess, Training, ZeroAdamW}};
/// let world = SingleProcess;
/// let store = CandleStore::new();
/// let w = store.get(3, "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
/// let mut plan = CandlePlan::new(&world, &store, &PlanOptions::new())?;
/// let mut opt = ZeroAdamW::new(&world, &plan, Default::default())?;
/// opt.step(&w.sqr()?.sum_all()?.backward()?)?;
/// let manager = CheckpointManager::new(dir.path(), 2)?;
/// manager.save(&world, &mut plan, &Training::new(&store, &mut opt), 1, &Default::default())?;
///
/// let mut fresh = ZeroAdamW::new(&world, &plan, Default::default())?;
/// let (step, _) = manager
///     .load_latest(&world, &mut plan, &mut Training::new(&store, &mut fresh))?
///     .expect("a checkpoint");
/// assert_eq!((step, fresh.step_count()?), (1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
#[derive(Debug)]
pub struct Training<'a, O> {
    store: &'a CandleStore,
    optimizer: &'a mut O,
}

impl<'a, O: TrainingOptimizer> Training<'a, O> {
    /// The training state of `store`'s variables and `optimizer`. A
    /// `ZeroAdamW` must have been made over the plan that saves or loads
    /// it (else those calls fail with [`Error::BadOption`]); an `AdamW`'s
    /// state must fit the files a load reads, as the model must. O(1).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::{AdamW, CandleStore}, ranks::Training};
    /// let store = CandleStore::new();
    /// store.get(2, "w", candle_nn::Init::Const(0.0), DType::F32, &Device::Cpu)?;
    /// let mut opt = AdamW::for_store(&store, "", Default::default())?;
    /// let state = Training::new(&store, &mut opt);
    /// assert_eq!(state.optimizer().step_count()?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(store: &'a CandleStore, optimizer: &'a mut O) -> Self {
        Self { store, optimizer }
    }

    /// The model's store. O(1).
    ///
    /// ```
    /// use scopetree::{candle::{AdamW, CandleStore}, ranks::Training};
    /// let store = CandleStore::new();
    /// let mut opt = AdamW::for_store(&store, "", Default::default())?;
    /// assert!(Training::new(&store, &mut opt).store().names()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn store(&self) -> &CandleStore {
        self.store
    }

    /// The optimizer. O(1).
    ///
    /// ```
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess, Training, ZeroAdamW}};
    /// let store = CandleStore::new();
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let mut opt = ZeroAdamW::new(&SingleProcess, &plan, Default::default())?;
    /// assert_eq!(Training::new(&store, &mut opt).optimizer().step_count()?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn optimizer(&self) -> &O {
        self.optimizer
    }
}

impl<O: TrainingOptimizer> ShardedPlan<Training<'_, O>> for CandlePlan {}

impl<O: TrainingOptimizer> Sealed<Training<'_, O>> for CandlePlan {
    fn watched(&self) -> (Arc<str>, Option<Duration>) {
        CandlePlan::watched(self)
    }

    fn save_shards_of<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        state: &Training<'_, O>,
        dir: &Path,
        opts: &SaveOptions,
    ) -> Result<ShardedSave, Error> {
        // The optimizer first: the model's index, written last, marks the
        // directory whole.
        let optimizer = state
            .optimizer
            .save_state(comm, self, &dir.join(OPTIMIZER_DIR))?;
        let mut saved = self.save_shards(comm, state.store, dir, opts)?;
        saved.state_shard = (optimizer.mine).map(|name| format!("{OPTIMIZER_DIR}/{name}"));
        saved.state_keys = optimizer.keys;
        saved.state_bytes = optimizer.bytes;
        Ok(saved)
    }

    fn load_shards_into<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        state: &mut Training<'_, O>,
        dir: &Path,
    ) -> Result<ShardedLoad, Error> {
        let _watch = self.watch(comm, "loading the model and its optimizer");
        // Both parts checked and verified, on every rank, before either is
        // written.
        let model = self.check_shards(comm, state.store, dir)?;
        let optimizer_dir = dir.join(OPTIMIZER_DIR);
        let optimizer = state.optimizer.check_state(comm, self, &optimizer_dir)?;
        let optimizer = state.optimizer.read_state(comm, self, optimizer)?;
        let mut loaded = self.read_shards(comm, state.store, model)?;
        self.check_consistency(comm)?;
        loaded.state_keys = optimizer.keys;
        loaded.state_bytes = optimizer.bytes;
        Ok(loaded)
    }
}
