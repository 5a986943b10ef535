//! TensorFlow-1-style variable sharing on the scope tree: named variable
//! scopes with full names, reuse modes, `get_variable`, scope defaults,
//! custom getters, collections and templates.
//!
//! | file | holds |
//! |---|---|
//! | `error` | [`Error`]: the sharing errors, and the tree's wrapped in [`Error::Tree`] |
//! | `store` | [`VariableStore`]: entering scopes, `get_variable`, full-name lookups, collections listings, deletion, the journal frames that undo a panicking call |
//! | `getter` | the true getter (locate, check the share, create), [`VarSpec`] |
//! | `chain` | the custom-getter chain: [`CustomGetter`], [`GetterArgs`], [`NextGetter`]; ends in a function the caller gives, so it knows neither the true getter nor scopes |
//! | `scope` | [`VarScope`], [`ScopeOpts`] |
//! | `reuse` | [`Reuse`] (a leaf) |
//! | `counts` | `NameCounts`: TensorFlow's default-name counting, with the scan hints that make a default name O(1) amortised; hands each counter change to a closure, so it does not know the journal |
//! | `journal` | the undo journal (counter changes, created scopes and variables) |
//! | `index` | `FullNames`: full name → variable, checked against the tree on every hit |
//! | `path` | `Path`: a checked full or relative name; the one owner of the `/` separator |
//! | `collections` | `Collections`, [`GLOBAL_VARIABLES`] and friends |
//! | `init` | [`Initializer`] |
//! | `shape` | [`Shape`], [`HasShape`] |
//! | `template` | [`Template`] |
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
mod error;
mod getter;
mod index;
mod init;
mod journal;
mod path;
#[cfg(feature = "candle")]
mod prefix;
mod reuse;
mod scope;
mod shape;
mod store;
mod template;

pub use chain::{CustomGetter, GetterArgs, NextGetter};
pub use collections::{GLOBAL_VARIABLES, LOCAL_VARIABLES, TRAINABLE_VARIABLES};
pub use error::Error;
pub use getter::VarSpec;
pub use init::{InitError, Initializer};
pub use reuse::Reuse;
pub use scope::{ScopeOpts, VarScope};
pub use shape::{HasShape, Shape};
pub use store::VariableStore;
pub use template::Template;

/// The code blocks of `docs/sharing.md`, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/sharing.md")]
struct SharingDocDoctests;
