//! TensorFlow-1-style variable sharing on the scope tree: named variable
//! scopes with full names, reuse modes, `get_variable`, scope defaults,
//! custom getters, collections and templates.
//!
//! The files form a stack, highest first: each imports (and calls into) only
//! files below it. [`VariableStore`] is defined in `store` with its state;
//! its calls are `impl VariableStore` blocks in the files above it, one job
//! per file.
//!
//! | file | holds |
//! |---|---|
//! | `template` | [`Template`] |
//! | `getter` | [`VariableStore::get_variable`] and `get_local_variable`, the true getter (locate, check the share, create) |
//! | `enter` | entering scopes: `root_scope`, `variable_scope`, `variable_scope_unique`, `reenter_scope` |
//! | `listings` | the collections listings: `collection`, `scope_collection`, `global_variables`, ..., `collection_names` |
//! | `separated` | the candle backend's calls by `.`-separated names: `find_sep`, `get_or_make`, `adopt` (feature `candle`) |
//! | `spec` | [`VarSpec`]: what one `get_variable` call asks for (its name inline up to 23 bytes) |
//! | `scope` | [`VarScope`], [`ScopeOpts`] |
//! | `chain` | the custom-getter chain: [`CustomGetter`], [`GetterArgs`], [`NextGetter`]; ends in a function the caller gives, so it knows neither the true getter nor scopes |
//! | `delete` | `delete_scope`, which also frees the sharing metadata of the subtree |
//! | `lookup` | per-variable queries: `variable` (by full name), `full_name`, `initial_shape`, `is_trainable` |
//! | `resolve` | path resolution: `resolve`, `locate`, `resolve_or_create` (by named kids, one walk) |
//! | `guard` | the journal frames (`guarded`) that undo a panicking call |
//! | `store` | [`VariableStore`]: the type, its state, and recording / forgetting one variable's metadata, collection entries and index entry |
//! | `var_meta` | `VarMeta`: what the store keeps per variable it created |
//! | `journal` | the undo journal (counter changes, created scopes and variables) |
//! | `counts` | `NameCounts`: TensorFlow's default-name counting, with the scan hints that make a default name O(1) amortised; hands each counter change to a closure, so it does not know the journal |
//! | `index` | `FullNames`: full name → variable, checked against the tree on every hit |
//! | `collections` | `Collections`, [`GLOBAL_VARIABLES`] and friends |
//! | `prefix` | `Prefixes`: the scopes of the last separated name walked (feature `candle`) |
//! | `init` | [`Initializer`] |
//! | `shape` | [`Shape`], [`HasShape`] |
//! | `path` | `Path`: a checked full or relative name; the one owner of the `/` separator |
//! | `error` | [`Error`]: the sharing errors, and the tree's wrapped in [`Error::Tree`] |
//! | `reuse` | [`Reuse`] (a leaf) |
//!
//! Two lookups coexist and differ on purpose:
//! [`get_variable`](VariableStore::get_variable) (and
//! [`VariableStore::variable`]) resolve one exact full name and never look in
//! parent scopes, as TensorFlow does; [`ScopeTree::find_var`](crate::ScopeTree::find_var)
//! walks the parent chain, as Paddle does. See `docs/sharing.md`.
//!
//! ```
//! use scopetree::sharing::{Initializer, Reuse, ScopeOpts, VariableStore, VarSpec};
//! let mut store = VariableStore::new();
//! let root = store.root_scope();
//! let spec = || VarSpec::new("w").initializer(Initializer::constant(vec![0.5_f32; 2]));
//! let a = store.variable_scope(&root, "tower", ScopeOpts::new(), |s, vs| s.get_variable(vs, spec()))?;
//! let b = store.variable_scope(&root, "tower", Reuse::Reuse, |s, vs| s.get_variable(vs, spec()))?;
//! assert_eq!(a, b);
//! assert_eq!(store.full_name(a)?, "tower/w");
//! # Ok::<(), scopetree::sharing::Error>(())
//! ```

mod chain;
mod collections;
mod counts;
mod delete;
mod enter;
mod error;
mod getter;
mod guard;
mod index;
mod init;
mod journal;
mod listings;
mod lookup;
mod path;
#[cfg(feature = "candle")]
mod prefix;
mod resolve;
mod reuse;
mod scope;
#[cfg(feature = "candle")]
mod separated;
mod shape;
mod spec;
mod store;
mod template;
mod var_meta;

pub use chain::{CustomGetter, GetterArgs, NextGetter};
pub use collections::{GLOBAL_VARIABLES, LOCAL_VARIABLES, TRAINABLE_VARIABLES};
pub use error::Error;
pub use init::{InitError, Initializer};
pub use reuse::Reuse;
pub use scope::{ScopeOpts, VarScope};
pub use shape::{HasShape, Shape};
pub use spec::VarSpec;
pub use store::VariableStore;
pub use template::Template;

/// The code blocks of `docs/sharing.md`, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/sharing.md")]
struct SharingDocDoctests;
