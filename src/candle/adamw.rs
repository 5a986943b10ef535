//! [`AdamW`]: candle-nn's AdamW, operation for operation, with its state
//! (the moments and the step count) in a [`CandleStore`] of its own, so
//! that it is saved, loaded and resumed like the parameters.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Optimizer, ParamsAdamW};

use super::error::Error;
use super::store::CandleStore;

/// The name of the step count in an [`AdamW`]'s state store.
pub const STEP: &str = "step";

/// candle-nn's [`AdamW`](candle_nn::AdamW), step for step, with its state
/// where a checkpoint reaches it: the first and second moments of the
/// parameter `name` are the variables `name.m` and `name.v` of
/// [`state`](Self::state), a store of its own (on each parameter's device,
/// in its dtype), and the step count is its variable `step` (an `f64` on
/// the CPU). candle's own `AdamW` keeps these private (candle PR #3819), so
/// a resumed run starts them afresh; save `state()` beside the parameters
/// and load it back, and a resumed run continues bit for bit.
///
/// Each step runs the tensor operations of candle-nn 0.11's `AdamW::step`,
/// in the same order, so the parameters it trains are bit-identical to
/// candle's optimizer on the same gradients.
///
/// ```
/// use candle_core::{DType, Device, Module, Tensor};
/// use candle_nn::{Optimizer, ParamsAdamW};
/// use scopetree::candle::{AdamW, CandleStore};
/// let store = CandleStore::new();
/// let model = candle_nn::linear(3, 1, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
/// let mut opt = AdamW::for_store(&store, "", ParamsAdamW::default())?;
/// let x = Tensor::ones((4, 3), DType::F32, &Device::Cpu)?;
/// opt.backward_step(&model.forward(&x)?.sqr()?.mean_all()?)?;
/// assert_eq!(opt.step_count()?, 1);
/// assert_eq!(opt.state().names()?, ["fc.bias.m", "fc.bias.v", "fc.weight.m", "fc.weight.v", "step"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct AdamW {
    params: ParamsAdamW,
    /// Each float parameter with its moments.
    vars: Vec<Moments>,
    state: CandleStore,
    step: Var,
}

#[derive(Debug)]
struct Moments {
    var: Var,
    m: Var,
    v: Var,
}

impl AdamW {
    /// An optimizer for `named` (`(name, Var)`, e.g.
    /// [`CandleStore::trainable_named_vars`](super::CandleStore::trainable_named_vars)): zero moments for each float
    /// parameter, named after it in a new state store, and a step count of
    /// 0. Parameters that are not floats are left out, as candle's `AdamW`
    /// leaves them. O(parameters' elements) on their devices.
    ///
    /// # Errors
    /// [`Error::Candle`] if a moment cannot be made; [`Error::InvalidName`]
    /// for a name the store cannot hold; [`Error::Sharing`] for two equal
    /// names.
    ///
    /// ```
    /// use candle_core::{DType, Device, Var};
    /// use scopetree::candle::AdamW;
    /// let w = Var::zeros(3, DType::F32, &Device::Cpu)?;
    /// let opt = AdamW::new(vec![("w".into(), w)], candle_nn::ParamsAdamW::default())?;
    /// assert_eq!(opt.state().names()?, ["step", "w.m", "w.v"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(named: Vec<(String, Var)>, params: ParamsAdamW) -> Result<Self, Error> {
        let state = CandleStore::new();
        let mut vars = Vec::with_capacity(named.len());
        for (name, var) in named {
            if !var.dtype().is_float() {
                continue;
            }
            let zero = |suffix: &str| -> Result<Var, Error> {
                let full = format!("{name}.{suffix}");
                state.get(
                    var.shape(),
                    &full,
                    candle_nn::Init::Const(0.0),
                    var.dtype(),
                    var.device(),
                )?;
                state.var(&full)?.ok_or(Error::Missing { name: full })
            };
            let (m, v) = (zero("m")?, zero("v")?);
            vars.push(Moments { var, m, v });
        }
        let step = new_step(&state)?;
        Ok(Self {
            params,
            vars,
            state,
            step,
        })
    }

    /// An optimizer for the trainable variables of `store` at or below
    /// `prefix` (`""` for all), named as the store names them. O(as
    /// [`new`](Self::new)).
    ///
    /// # Errors
    /// As [`CandleStore::trainable_vars`] and [`new`](Self::new).
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::candle::{AdamW, CandleStore};
    /// let store = CandleStore::new();
    /// candle_nn::linear(2, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// let opt = AdamW::for_store(&store, "fc", candle_nn::ParamsAdamW::default())?;
    /// assert_eq!(opt.state().names()?.len(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn for_store(
        store: &CandleStore,
        prefix: &str,
        params: ParamsAdamW,
    ) -> Result<Self, Error> {
        Self::new(store.trainable_named(prefix)?, params)
    }

    /// The store that holds the moments and the step count: save it beside
    /// the parameters, and load it back (strictly, into this optimizer's
    /// variables, which a load writes in place) to resume. O(1).
    ///
    /// ```
    /// let opt = scopetree::candle::AdamW::new(vec![], candle_nn::ParamsAdamW::default())?;
    /// assert_eq!(opt.state().names()?, ["step"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn state(&self) -> &CandleStore {
        &self.state
    }

    /// The steps taken (the state's `step`). O(1).
    ///
    /// # Errors
    /// [`Error::Candle`] if the count cannot be read.
    ///
    /// ```
    /// let opt = scopetree::candle::AdamW::new(vec![], candle_nn::ParamsAdamW::default())?;
    /// assert_eq!(opt.step_count()?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn step_count(&self) -> Result<u64, Error> {
        step_of(&self.step)
    }

    /// The hyper-parameters. O(1).
    ///
    /// ```
    /// let opt = scopetree::candle::AdamW::new(vec![], candle_nn::ParamsAdamW::default())?;
    /// assert_eq!(opt.params().beta1, 0.9);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn params(&self) -> &ParamsAdamW {
        &self.params
    }

    /// One step from `grads`, as candle-nn's `AdamW::step`: for every
    /// parameter with a gradient, the moments, then the parameter, updated
    /// with the same tensor operations in the same order. O(parameters'
    /// elements) on their devices.
    ///
    /// # Errors
    /// [`Error::Candle`] naming the parameter whose update failed.
    fn update(&mut self, grads: &GradStore) -> Result<(), Error> {
        let step_t = self.step_count()? + 1;
        self.step
            .set(&Tensor::new(step_t as f64, &Device::Cpu).map_err(|e| candle(STEP, e))?)
            .map_err(|e| candle(STEP, e))?;
        let rule = Rule::new(&self.params, step_t);
        for mv in &self.vars {
            let Some(g) = grads.get(&mv.var) else {
                continue;
            };
            let run = || -> candle_core::Result<()> {
                let (theta, m, v) = rule.apply(mv.var.as_tensor(), &mv.m, &mv.v, g)?;
                mv.m.set(&m)?;
                mv.v.set(&v)?;
                mv.var.set(&theta)
            };
            run().map_err(|e| candle("a parameter's update", e))?;
        }
        Ok(())
    }
}

/// A step count of 0 in `state`, named [`STEP`] (an `f64` scalar on the
/// CPU), as [`AdamW`] and the ranks' ZeRO optimizer keep it. O(1).
pub(crate) fn new_step(state: &CandleStore) -> Result<Var, Error> {
    state.get(
        (),
        STEP,
        candle_nn::Init::Const(0.0),
        DType::F64,
        &Device::Cpu,
    )?;
    state.var(STEP)?.ok_or_else(|| Error::Missing {
        name: STEP.to_owned(),
    })
}

/// The count a step variable made by [`new_step`] holds. O(1).
pub(crate) fn step_of(step: &Var) -> Result<u64, Error> {
    let t = step
        .as_tensor()
        .to_scalar::<f64>()
        .map_err(|e| candle(STEP, e))?;
    // A count is a whole number well inside f64's exact integers.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(t as u64)
}

/// candle-nn's AdamW update at step `t`, its operations in its order: what
/// [`AdamW`] and the ranks' ZeRO optimizer (over a slice of each variable)
/// both apply, so that they agree bit for bit.
pub(crate) struct Rule {
    lr: f64,
    lr_lambda: f64,
    beta1: f64,
    beta2: f64,
    scale_m: f64,
    scale_v: f64,
    eps: f64,
}

impl Rule {
    /// The constants of step `t` (counted from 1). O(1).
    pub(crate) fn new(p: &ParamsAdamW, t: u64) -> Self {
        // candle computes the exponents as `i32`.
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        let t = t as i32;
        Self {
            lr: p.lr,
            lr_lambda: p.lr * p.weight_decay,
            beta1: p.beta1,
            beta2: p.beta2,
            scale_m: 1f64 / (1f64 - p.beta1.powi(t)),
            scale_v: 1f64 / (1f64 - p.beta2.powi(t)),
            eps: p.eps,
        }
    }

    /// The next values, first moment and second moment of parameters
    /// `theta` with moments `m` and `v` and gradient `g` (all of one shape),
    /// element by element. O(elements), on their device.
    pub(crate) fn apply(
        &self,
        theta: &Tensor,
        m: &Tensor,
        v: &Tensor,
        g: &Tensor,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let next_m = ((m * self.beta1)? + (g * (1.0 - self.beta1))?)?;
        let next_v = ((v * self.beta2)? + (g.sqr()? * (1.0 - self.beta2))?)?;
        let m_hat = (&next_m * self.scale_m)?;
        let v_hat = (&next_v * self.scale_v)?;
        let next_theta = (theta * (1f64 - self.lr_lambda))?;
        let adjusted_grad = (m_hat / (v_hat.sqrt()? + self.eps)?)?;
        let next_theta = (next_theta - (adjusted_grad * self.lr)?)?;
        Ok((next_theta, next_m, next_v))
    }
}

fn candle(name: &str, source: candle_core::Error) -> Error {
    Error::Candle {
        name: name.to_owned(),
        source,
    }
}

/// candle's optimizer interface: `AdamW::new(vars, params)` names the
/// parameters by position (`param_00000`, …), so a state saved from one
/// run loads into another built with the vars in the same order (a store's
/// [`trainable_vars`](CandleStore::trainable_vars) are in name order).
impl Optimizer for AdamW {
    type Config = ParamsAdamW;

    fn new(vars: Vec<Var>, params: ParamsAdamW) -> candle_core::Result<Self> {
        let named = vars
            .into_iter()
            .enumerate()
            .map(|(i, v)| (format!("param_{i:05}"), v))
            .collect();
        Ok(AdamW::new(named, params)?)
    }

    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        Ok(self.update(grads)?)
    }

    fn learning_rate(&self) -> f64 {
        self.params.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.params.lr = lr;
    }
}
