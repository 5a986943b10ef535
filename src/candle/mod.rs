//! scopetree as the variable store behind candle-nn's
//! [`VarBuilder`](candle_nn::VarBuilder) (feature `candle`).
//!
//! [`CandleStore`] implements candle-nn's `SimpleBackend`, so
//! `store.var_builder(dtype, &device)` builds any candle-nn model with its
//! parameters in the tree: `gru.weight_ih_l0` is the variable
//! `weight_ih_l0` of the scope `gru`. See `docs/candle.md` for the mapping
//! from `VarMap` calls.
//!
//! | file | holds |
//! |---|---|
//! | `store` | [`CandleStore`], the state behind its lock, and its construction |
//! | `get` | the get path `VarBuilder` calls: get-or-create, checked on reuse; `var` |
//! | `names` | candle's dotted names: their check, and the prefix match |
//! | `listing` | the `Var`s by name: all, trainable (by prefix or collection), unused |
//! | `freeze` | freezing by prefix: the store's rules on top of the trainable flag |
//! | `seal` | sealing: no new variable for an unknown name |
//! | `checkpoint` | the store's saves (one file or sharded), in dotted names |
//! | `load` | the store's loads: checked, staged to each tensor's device, committed at once; where new variables go |
//! | `staged` | the store's side of staged loads: staging buffers, destinations, the sink |
//! | `cuda/` | CUDA devices (feature `cuda`): page-locked staging and device copies |
//! | `var` | a candle `Var` as a tree value: its shape, its checkpoint bytes |
//! | `async_save` | [`AsyncSaver`]: saves of stores beside training, through one staging buffer kept between saves |
//! | `adamw` | [`AdamW`]: candle-nn's AdamW step for step, its moments and step count in a store of their own |
//! | `error` | [`Error`], this layer's errors |
//!
//! ```
//! use candle_core::{DType, Device, Module, Tensor};
//! use candle_nn::{AdamW, Optimizer, ParamsAdamW};
//! use scopetree::candle::CandleStore;
//!
//! let store = CandleStore::new();
//! let vb = store.var_builder(DType::F32, &Device::Cpu);
//! let model = candle_nn::linear(3, 1, vb.pp("fc"))?;
//! let mut opt = AdamW::new(store.trainable_vars("")?, ParamsAdamW::default())?;
//! let x = Tensor::ones((4, 3), DType::F32, &Device::Cpu)?;
//! let loss = model.forward(&x)?.sqr()?.mean_all()?;
//! opt.backward_step(&loss)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod adamw;
mod async_save;
mod checkpoint;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod error;
mod freeze;
mod get;
mod listing;
mod load;
mod names;
mod seal;
mod staged;
mod store;
mod var;
pub(crate) use var::host_bytes;

pub use adamw::{AdamW, STEP};
pub(crate) use adamw::{Rule as AdamWRule, new_step, step_of};
pub use async_save::{AsyncSaver, Staging};
pub use error::Error;
pub use store::CandleStore;

/// The code blocks of `docs/candle.md`, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/candle.md")]
struct CandleDocDoctests;
