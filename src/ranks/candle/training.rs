//! [`ZeroTraining`]: a [`CandleStore`]'s variables with their
//! [`ZeroAdamW`]'s state, as one checkpoint that a
//! [`CheckpointManager`](crate::ranks::CheckpointManager) keeps: saved by
//! every rank, loaded at any number of ranks, both parts or neither.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::plan::CandlePlan;
use super::zero_adamw::ZeroAdamW;
use crate::candle::CandleStore;
use crate::checkpoint::SaveOptions;
use crate::ranks::checkpoints::plans::{Sealed, ShardedPlan};
use crate::ranks::checkpoints::shards::{ShardedLoad, ShardedSave};
use crate::ranks::error::Error;
use crate::ranks::transport::collective::Collective;

/// The sub-directory of a [`ZeroTraining`] checkpoint that holds the
/// optimizer's state (`ZeroAdamW::save_shards`' layout); the model's
/// shards and index are beside it.
///
/// ```
/// assert_eq!(scopetree::ranks::OPTIMIZER_DIR, "optimizer");
/// ```
pub const OPTIMIZER_DIR: &str = "optimizer";

/// A candle model's variables and its ZeRO optimizer, saved and loaded as
/// one checkpoint: the state a
/// [`CheckpointManager`](crate::ranks::CheckpointManager) keeps of
/// data-parallel training with [`ZeroAdamW`], through a [`CandlePlan`].
///
/// A save writes the optimizer's state into [`OPTIMIZER_DIR`]
/// ([`ZeroAdamW::save_shards`]), then the model's shards beside it
/// ([`CandlePlan::save_shards`]), whose index comes last: a step directory
/// with the model's index is whole. A load checks both parts' files and
/// verifies both parts' checksums on every rank before it writes anything,
/// so that a missing, mismatched or corrupted tensor in either part leaves
/// the variables and the optimizer unchanged on every rank. Only a disk
/// that fails to read bytes that verified a moment before, or candle
/// failing to set a value, can leave them partly loaded. A save costs
/// what the two `save_shards` cost, a load what the two `load_shards` cost:
/// O(variables + ranks + bytes of this rank's parts), plus the exchanges.
///
/// Not an [`AsyncSaver`](crate::ranks::AsyncSaver)'s: the optimizer's
/// moments of a variable split between ranks are put together by a
/// collective exchange that is not staged, so the saves of this state
/// are synchronous.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// use candle_core::{DType, Device};
/// use scopetree::{candle::CandleStore, ranks::{CandlePlan, CheckpointManager, PlanOptions, SingleProcess, ZeroAdamW, ZeroTraining}};
/// let world = SingleProcess;
/// let store = CandleStore::new();
/// let w = store.get(3, "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
/// let mut plan = CandlePlan::new(&world, &store, &PlanOptions::new())?;
/// let mut opt = ZeroAdamW::new(&world, &plan, Default::default())?;
/// opt.step(&w.sqr()?.sum_all()?.backward()?)?;
/// let manager = CheckpointManager::new(dir.path(), 2)?;
/// manager.save(&world, &mut plan, &ZeroTraining::new(&store, &mut opt), 1, &Default::default())?;
///
/// let mut fresh = ZeroAdamW::new(&world, &plan, Default::default())?;
/// let (step, _) = manager
///     .load_latest(&world, &mut plan, &mut ZeroTraining::new(&store, &mut fresh))?
///     .expect("a checkpoint");
/// assert_eq!((step, fresh.step_count()?), (1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
#[derive(Debug)]
pub struct ZeroTraining<'a> {
    store: &'a CandleStore,
    optimizer: &'a mut ZeroAdamW,
}

impl<'a> ZeroTraining<'a> {
    /// The training state of `store`'s variables and `optimizer`, which
    /// must have been made over the plan that saves or loads it (else
    /// those calls fail with [`Error::BadOption`]). O(1).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess, ZeroAdamW, ZeroTraining}};
    /// let store = CandleStore::new();
    /// store.get(2, "w", candle_nn::Init::Const(0.0), DType::F32, &Device::Cpu)?;
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let mut opt = ZeroAdamW::new(&SingleProcess, &plan, Default::default())?;
    /// let state = ZeroTraining::new(&store, &mut opt);
    /// assert_eq!(state.optimizer().step_count()?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(store: &'a CandleStore, optimizer: &'a mut ZeroAdamW) -> Self {
        Self { store, optimizer }
    }

    /// The model's store. O(1).
    ///
    /// ```
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess, ZeroAdamW, ZeroTraining}};
    /// let store = CandleStore::new();
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let mut opt = ZeroAdamW::new(&SingleProcess, &plan, Default::default())?;
    /// assert!(ZeroTraining::new(&store, &mut opt).store().names()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn store(&self) -> &CandleStore {
        self.store
    }

    /// The optimizer. O(1).
    ///
    /// ```
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess, ZeroAdamW, ZeroTraining}};
    /// let store = CandleStore::new();
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let mut opt = ZeroAdamW::new(&SingleProcess, &plan, Default::default())?;
    /// assert_eq!(ZeroTraining::new(&store, &mut opt).optimizer().step_count()?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn optimizer(&self) -> &ZeroAdamW {
        self.optimizer
    }
}

impl ShardedPlan<ZeroTraining<'_>> for CandlePlan {}

impl Sealed<ZeroTraining<'_>> for CandlePlan {
    fn watched(&self) -> (Arc<str>, Option<Duration>) {
        CandlePlan::watched(self)
    }

    fn save_shards_of<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        state: &ZeroTraining<'_>,
        dir: &Path,
        opts: &SaveOptions,
    ) -> Result<ShardedSave, Error> {
        // The optimizer first: the model's index, written last, marks the
        // directory whole.
        let optimizer = state
            .optimizer
            .save_shards(comm, self, dir.join(OPTIMIZER_DIR))?;
        let mut saved = self.save_shards(comm, state.store, dir, opts)?;
        saved.state_shard = (optimizer.mine).map(|name| format!("{OPTIMIZER_DIR}/{name}"));
        saved.state_keys = optimizer.keys;
        saved.state_bytes = optimizer.bytes;
        Ok(saved)
    }

    fn load_shards_into<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        state: &mut ZeroTraining<'_>,
        dir: &Path,
    ) -> Result<ShardedLoad, Error> {
        let _watch = self.watch(comm, "loading the model and its optimizer");
        // Both parts checked and verified, on every rank, before either is
        // written.
        let model = self.check_shards(comm, state.store, dir)?;
        let optimizer_dir = dir.join(OPTIMIZER_DIR);
        let optimizer = state.optimizer.check_shards(comm, self, &optimizer_dir)?;
        let optimizer = state.optimizer.read_shards(comm, self, optimizer)?;
        let mut loaded = self.read_shards(comm, state.store, dir, model)?;
        loaded.state_keys = optimizer.keys;
        loaded.state_bytes = optimizer.bytes;
        Ok(loaded)
    }
}
