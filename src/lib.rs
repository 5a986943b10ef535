//! # scopetree
//!
//! The variable store of a deep-learning runtime: a tree of scopes holding
//! named, typed variables, all in one generational arena. Handles are small
//! `Copy` keys that report *stale* once their scope is dropped, instead of
//! dangling or aliasing a newer variable.
//!
//! It keeps the semantics of PaddlePaddle's `Scope` (lookups fall back to the
//! parent scope, a kid's name shadows its parent's, dropping a scope drops its
//! kids and variables) with handles that cannot dangle, and no lock per level.
//!
//! ```
//! use scopetree::ScopeTree;
//!
//! let mut tree = ScopeTree::new();
//! let model = tree.root();
//! let w = tree.var(model, "W")?;
//! tree.set(w, vec![0.1_f32; 4])?;
//!
//! // One step of a training loop, in a scope of its own.
//! let step = tree.new_scope(model)?;
//! let h = tree.var(step, "h")?;
//! let w_seen = tree.get_var(step, "W")?; // found in the parent
//! let sum: f32 = tree.get::<Vec<f32>>(w_seen)?.iter().sum();
//! tree.set(h, sum)?;
//!
//! tree.delete_scope(step)?;
//! assert!(matches!(tree.get::<f32>(h), Err(scopetree::Error::StaleVar { .. })));
//! # Ok::<(), scopetree::Error>(())
//! ```
//!
//! ## Map of the crate
//!
//! | module (file) | holds |
//! |---|---|
//! | `arena/` | the arena that owns every invariant: slots, names, links, walks; [`ScopeId`], [`VarId`], [`Symbol`], [`TreeTag`] |
//! | `tree` | [`ScopeTree`], the public face of the arena: scopes, names, deletion |
//! | `vars` | variables as members of scopes: create, erase, rename |
//! | `lookup` | [`find_var`](ScopeTree::find_var) and friends |
//! | `value` | typed values: [`get`](ScopeTree::get), [`set`](ScopeTree::set), …, and the typed core every layer reads values through |
//! | `traverse` | [`Kids`], [`Ancestors`], [`Descendants`], [`LocalVars`] |
//! | `dump` | [`Dump`], [`Dot`] |
//! | `names` | [`Name`], name validation |
//! | `error` | [`Error`], the tree's errors |
//! | `resolver` | [`Resolver`]: a caller-owned cache of `find_var` answers, flat in depth |
//! | `step/` | [`StepScopes`], [`StepVar`], [`StepError`]: step scopes for RNNs and training loops |
//! | `workers/` | [`WorkerScope`], [`split_workers`](ScopeTree::split_workers), [`WorkerError`]: parallel workers |
//! | [`checkpoint`] | save and load a tree, a subtree or a store as safetensors (feature `safetensors`, on by default) |
//! | `candle` | `CandleStore`: scopetree behind candle-nn's `VarBuilder` (feature `candle`, off by default) |
//! | [`ranks`] | data-parallel ranks: [`ranks::Collective`] (MPI with feature `mpi`, off by default), manifests and their agreement, [`ranks::SyncPlan`] (broadcast, bucketed all-reduce, consistency digest, checkpoints across ranks, ZeRO stage 1 with [`ranks::Partition`]), `ranks::CandlePlan` for a `CandleStore` (feature `candle`); above the tree, sharing, checkpoint and candle layers (feature `safetensors`) |
//! | [`sharing`] | TensorFlow-1-style sharing: [`sharing::VariableStore`], `get_variable`, templates, [`sharing::Error`] |
//! | [`diagnostics`] | slot sizes and the inline table width, for memory budgets |
//! | `burn` | `CheckpointStore`: scopetree checkpoints behind burn-store's `ModuleStore` (feature `burn`, off by default); above the checkpoint layer |
//!
//! See `docs/design.md` for the arena, handles, invariants and complexities.

#![cfg_attr(docsrs, feature(doc_cfg))]
// No `unsafe` anywhere; with the `cuda` feature, one module
// (`candle::cuda::pinned`: page-locked staging) allows it, as `forbid`
// would not let it.
#![cfg_attr(not(feature = "cuda"), forbid(unsafe_code))]
#![cfg_attr(feature = "cuda", deny(unsafe_code))]
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]

mod arena;
#[cfg(feature = "burn")]
#[cfg_attr(docsrs, doc(cfg(feature = "burn")))]
pub mod burn;
#[cfg(feature = "candle")]
#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
pub mod candle;
#[cfg(feature = "safetensors")]
#[cfg_attr(docsrs, doc(cfg(feature = "safetensors")))]
pub mod checkpoint;
pub mod diagnostics;
mod dump;
mod entry;
mod error;
mod layer_api;
mod lookup;
mod names;
#[cfg(feature = "safetensors")]
#[cfg_attr(docsrs, doc(cfg(feature = "safetensors")))]
pub mod ranks;
mod resolver;
pub mod sharing;
mod short;
mod step;
mod threads;
mod traverse;
mod tree;
mod value;
mod vars;
mod workers;

pub use arena::{ScopeId, Symbol, TreeTag, VarId};
pub use dump::{Dot, Dump};
pub use entry::{OccupiedVar, VacantVar, VarEntry};
pub use error::{Error, InvalidNameReason, short_type_name};
pub use names::{Name, NameRef, SEPARATOR, validate_name};
pub use resolver::Resolver;
pub use step::{StepError, StepScopes, StepVar};
pub use traverse::{Ancestors, Descendants, Kids, LocalVars};
pub use tree::ScopeTree;
pub use workers::{WorkerAccessReason, WorkerError, WorkerScope};

/// `Result` with this crate's [`Error`].
///
/// ```
/// fn lookup(tree: &scopetree::ScopeTree) -> scopetree::Result<()> {
///     tree.find_var(tree.root(), "w")?;
///     Ok(())
/// }
/// assert!(lookup(&scopetree::ScopeTree::new()).is_ok());
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The README's code blocks, compiled and run as doctests.
/// (The README's checkpoint example needs the `safetensors` feature, on by
/// default.)
#[cfg(all(doctest, feature = "safetensors"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// `docs/runtime.md`'s code blocks (the runtime layers: steps, workers, the
/// lookup cache), compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/runtime.md")]
struct RuntimeDocDoctests;
