//! [`ZeroAdamW`]: scopetree's candle AdamW, operation for operation, over
//! one rank's ZeRO slice of a [`CandlePlan`]'s variables, with the moments
//! of that slice only, on the variables' devices.

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use candle_nn::ParamsAdamW;

use super::plan::{CandlePlan, candle};
use crate::candle::CandleStore;
use crate::candle::Error::Missing;
use crate::candle::{AdamWRule as Rule, STEP, new_step, step_of};
use crate::ranks::error::Error;
use crate::ranks::transport::collective::Collective;

/// AdamW for ZeRO stage 1 over a [`CandlePlan`]: this rank keeps the two
/// moments of its own slice of the variables ([`CandlePlan::partition`])
/// only, on the variables' devices, and steps that slice, with the
/// operations of [`candle::AdamW`](crate::candle::AdamW) (so of candle-nn's
/// `AdamW`) in the same order, element by element. A ZeRO step is
///
/// ```text
/// plan.reduce_scatter(&world, &mut grads, Reduce::Mean)?; // my slice's gradients, reduced
/// opt.step(&grads)?;                                      // my slice, stepped
/// plan.all_gather(&world)?;                               // every slice, from its owner
/// ```
///
/// and ends bit-identical to the replicated step (`all_reduce` then
/// `AdamW::step` on every rank) wherever the reduce-scatter's sums are the
/// all-reduce's (always at 2 ranks). The moments take 2/N of the
/// parameters' bytes per rank instead of 2×.
///
/// The state ([`state`](Self::state)) holds `<name>.m` and `<name>.v` of
/// each piece of this rank's slice (the piece's elements, flat) and the
/// step count; it belongs to this rank and this number of ranks.
/// [`save_shards`](Self::save_shards) writes it as scopetree's `AdamW`
/// state, whole, every rank a shard, and
/// [`load_shards`](Self::load_shards) reads that (or an `AdamW`'s) at any
/// number of ranks.
///
/// ```
/// use candle_core::{DType, Device};
/// use candle_nn::ParamsAdamW;
/// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, Reduce, SingleProcess, ZeroAdamW}};
/// let world = SingleProcess;
/// let store = CandleStore::new();
/// let w = store.get(3, "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
/// let mut plan = CandlePlan::new(&world, &store, &PlanOptions::new())?;
/// let mut opt = ZeroAdamW::new(&world, &plan, ParamsAdamW { lr: 0.1, ..ParamsAdamW::default() })?;
/// let mut grads = w.sqr()?.sum_all()?.backward()?;
/// plan.reduce_scatter(&world, &mut grads, Reduce::Mean)?;
/// opt.step(&grads)?;
/// plan.all_gather(&world)?;
/// assert!(w.to_vec1::<f32>()?.iter().all(|&x| x < 1.0));
/// assert_eq!(opt.step_count()?, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
#[derive(Debug)]
pub struct ZeroAdamW {
    params: ParamsAdamW,
    pub(super) slices: Vec<Slice>,
    state: CandleStore,
    pub(super) step: Var,
}

/// One piece of this rank's slice: a variable's elements
/// `start..start + len` (flattened) and their moments.
#[derive(Debug)]
pub(super) struct Slice {
    pub(super) key: String,
    /// The variable's index in the plan's manifest.
    pub(super) var_index: usize,
    var: Var,
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) m: Var,
    pub(super) v: Var,
}

impl ZeroAdamW {
    /// The optimizer of `comm`'s rank over `plan`'s variables: zero moments
    /// for each piece of this rank's slice, on its variable's device, in its
    /// dtype, and a step count of 0. Local: no collective. O(pieces) plus
    /// the moments' zeroing, O(slice elements).
    ///
    /// # Errors
    /// [`Error::BadOption`] when `comm` is not of the world the plan was
    /// cut for; [`Error::Candle`] if a moment cannot be made.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess, ZeroAdamW}};
    /// let store = CandleStore::new();
    /// candle_nn::linear(4, 2, store.var_builder(DType::F32, &Device::Cpu))?;
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let opt = ZeroAdamW::new(&SingleProcess, &plan, Default::default())?;
    /// assert_eq!(opt.state().names()?, ["bias.m", "bias.v", "step", "weight.m", "weight.v"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new<C: Collective + ?Sized>(
        comm: &C,
        plan: &CandlePlan,
        params: ParamsAdamW,
    ) -> Result<Self, Error> {
        let part = plan.partition();
        let (rank, size) = (comm.rank(), comm.size());
        if size != part.ranks() || rank >= size {
            return Err(Error::BadOption {
                reason: format!(
                    "ZeroAdamW for rank {rank} of {size}, but the plan was cut for {} rank(s); \
                     build the plan and the optimizer in the same world",
                    part.ranks()
                ),
            });
        }
        let state = CandleStore::new();
        let mut slices = Vec::with_capacity(part.pieces(rank).len());
        for p in part.pieces(rank) {
            let var = plan.vars[p.var].clone();
            let key = plan.manifest.entries()[p.var].key.clone();
            let zero = |suffix: &str| -> Result<Var, Error> {
                let full = format!("{key}.{suffix}");
                state.get(
                    p.len,
                    &full,
                    candle_nn::Init::Const(0.0),
                    var.dtype(),
                    var.device(),
                )?;
                Ok(state.var(&full)?.ok_or(Missing { name: full })?)
            };
            let (m, v) = (zero("m")?, zero("v")?);
            slices.push(Slice {
                key,
                var_index: p.var,
                var,
                start: p.start,
                len: p.len,
                m,
                v,
            });
        }
        let step = new_step(&state)?;
        Ok(Self {
            params,
            slices,
            state,
            step,
        })
    }

    /// The optimizer's own store: this rank's moments and the step count.
    /// O(1).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess, ZeroAdamW}};
    /// let store = CandleStore::new();
    /// store.get(5, "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let opt = ZeroAdamW::new(&SingleProcess, &plan, Default::default())?;
    /// assert_eq!(opt.state().var("w.m")?.expect("a moment").dims(), &[5]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn state(&self) -> &CandleStore {
        &self.state
    }

    /// How many steps were taken. O(1).
    ///
    /// # Errors
    /// [`Error::Candle`] if the count cannot be read.
    ///
    /// ```
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess, ZeroAdamW}};
    /// let plan = CandlePlan::new(&SingleProcess, &CandleStore::new(), &PlanOptions::new())?;
    /// assert_eq!(ZeroAdamW::new(&SingleProcess, &plan, Default::default())?.step_count()?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn step_count(&self) -> Result<u64, Error> {
        Ok(step_of(&self.step)?)
    }

    /// The learning rate. O(1).
    ///
    /// ```
    /// use candle_nn::ParamsAdamW;
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess, ZeroAdamW}};
    /// let plan = CandlePlan::new(&SingleProcess, &CandleStore::new(), &PlanOptions::new())?;
    /// let mut opt = ZeroAdamW::new(&SingleProcess, &plan, ParamsAdamW::default())?;
    /// opt.set_learning_rate(0.5);
    /// assert_eq!(opt.learning_rate(), 0.5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn learning_rate(&self) -> f64 {
        self.params.lr
    }

    /// Sets the learning rate of the next steps. O(1).
    ///
    /// ```
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, PlanOptions, SingleProcess, ZeroAdamW}};
    /// let plan = CandlePlan::new(&SingleProcess, &CandleStore::new(), &PlanOptions::new())?;
    /// let mut opt = ZeroAdamW::new(&SingleProcess, &plan, Default::default())?;
    /// opt.set_learning_rate(1e-4);
    /// assert_eq!(opt.learning_rate(), 1e-4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_learning_rate(&mut self, lr: f64) {
        self.params.lr = lr;
    }

    /// One AdamW step of this rank's slice, from the elements of the slice
    /// in `grads` (after [`CandlePlan::reduce_scatter`]); a piece whose
    /// variable has no gradient is left alone, as candle's AdamW leaves a
    /// variable. The slice's new values are written into the variables'
    /// storage in place; [`CandlePlan::all_gather`] then brings every
    /// rank's. Local: no collective. O(slice elements), on the device.
    ///
    /// # Errors
    /// [`Error::Changed`] when a gradient's dtype or shape is not its
    /// variable's; [`Error::Candle`] if candle fails. Both are checked
    /// before anything changes, bar a candle failure mid-step (the pieces
    /// before it keep their step then).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::{candle::CandleStore, ranks::{CandlePlan, Error, PlanOptions, SingleProcess, ZeroAdamW}};
    /// let store = CandleStore::new();
    /// let w = store.get(2, "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
    /// let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    /// let mut opt = ZeroAdamW::new(&SingleProcess, &plan, Default::default())?;
    /// let other = candle_core::Var::new(&[1.0_f32, 2.0, 3.0], &Device::Cpu)?;
    /// let mut grads = other.sum_all()?.backward()?;
    /// grads.insert(&w, other.as_tensor().clone()); // 3 elements for a variable of 2
    /// assert!(matches!(opt.step(&grads), Err(Error::Changed { .. })));
    /// assert_eq!(opt.step_count()?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn step(&mut self, grads: &GradStore) -> Result<(), Error> {
        for s in &self.slices {
            if let Some(g) = grads.get(s.var.as_tensor()) {
                if g.dtype() != s.var.dtype() || g.dims() != s.var.dims() {
                    return Err(Error::Changed {
                        key: s.key.clone(),
                        scope: String::new(),
                        reason: format!(
                            "its gradient is {:?} {:?}, the variable {:?} {:?}",
                            g.dtype(),
                            g.dims(),
                            s.var.dtype(),
                            s.var.dims()
                        ),
                    });
                }
            }
        }
        let step_t = self.step_count()? + 1;
        #[allow(clippy::cast_precision_loss)]
        let count = Tensor::new(step_t as f64, &Device::Cpu).map_err(|e| candle(STEP, e))?;
        let rule = Rule::new(&self.params, step_t);
        for s in &self.slices {
            let Some(g) = grads.get(s.var.as_tensor()) else {
                continue;
            };
            let run = || -> candle_core::Result<()> {
                let g = g.flatten_all()?.narrow(0, s.start, s.len)?;
                let flat = s.var.as_tensor().flatten_all()?;
                let theta = flat.narrow(0, s.start, s.len)?;
                let (theta, m, v) = rule.apply(&theta, &s.m, &s.v, &g)?;
                s.m.set(&m)?;
                s.v.set(&v)?;
                flat.slice_set(&theta, 0, s.start)
            };
            run().map_err(|e| candle(&s.key, e))?;
        }
        self.step.set(&count).map_err(|e| candle(STEP, e))
    }
}
