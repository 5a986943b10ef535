//! [`VariableStore`]: the type, its state (the tree, default-name counters,
//! undo journal, per-variable metadata, collections, full-name index) and
//! the calls that add and drop the records of one variable.
//!
//! The store's other calls live beside it, one job per file: entering
//! scopes (`enter.rs`), the journal frames that undo a panicking call
//! (`guard.rs`), path resolution (`resolve.rs`), lookups by full name and
//! metadata (`lookup.rs`), `get_variable` (`getter.rs`), collections
//! listings (`listings.rs`), deletion (`delete.rs`) and the candle backend's
//! separated names (`separated.rs`). This file imports none of them.

use std::any::TypeId;
use std::fmt;
use std::sync::Arc;

use slotmap::SecondaryMap;

use crate::arena::Payload;
use crate::arena::{ScopeKey, VarId, VarKey};
use crate::sharing::collections::Collections;
use crate::sharing::counts::NameCounts;
use crate::sharing::error::Error;
use crate::sharing::index::FullNames;
use crate::sharing::journal::{Journal, Undo};
#[cfg(feature = "candle")]
use crate::sharing::prefix::Prefixes;
use crate::sharing::shape::Shape;
use crate::sharing::var_meta::VarMeta;
use crate::tree::ScopeTree;

/// A variable store with TensorFlow-1-style sharing, over a [`ScopeTree`].
///
/// Named variable scopes are named scopes of the tree, and the variables
/// `get_variable` creates are variables of the tree, so a variable's full name
/// is its tree path (`encoder/layer_1/w`), and [`ScopeTree::find_var`],
/// handles and stale reporting all keep working on them (reach the tree with
/// [`tree`](Self::tree) and [`tree_mut`](Self::tree_mut)).
///
/// The store adds what TensorFlow keeps beside its variable dictionary:
/// default-name counters per scope, per variable its initial shape, value
/// type, trainable flag and collections, and an index of full names. These live in slotmap
/// `SecondaryMap`s keyed by the tree's own generational keys, so an entry of
/// a deleted scope or variable can never be read for a newer one that reuses
/// the slot; every read also checks that the tree still holds the key.
///
/// ```
/// use scopetree::sharing::{Initializer, Reuse, ScopeOpts, VariableStore, VarSpec};
/// let mut store = VariableStore::new();
/// let root = store.root_scope();
/// let spec = || VarSpec::new("w").initializer(Initializer::constant(vec![0.0_f32; 4]));
/// let w = store.variable_scope(&root, "enc", ScopeOpts::new(), |s, vs| s.get_variable(vs, spec()))?;
/// let w2 = store.variable_scope(&root, "enc", Reuse::Reuse, |s, vs| s.get_variable(vs, spec()))?;
/// assert_eq!(w, w2);
/// assert_eq!(store.full_name(w)?, "enc/w");
/// # Ok::<(), scopetree::sharing::Error>(())
/// ```
pub struct VariableStore {
    pub(super) tree: ScopeTree,
    pub(super) counts: NameCounts,
    pub(super) journal: Journal,
    pub(super) var_meta: SecondaryMap<VarKey, VarMeta>,
    pub(super) collections: Collections,
    /// Creation number of the next variable the store creates.
    pub(super) next_seq: u64,
    pub(super) names: FullNames,
    /// The scopes of the last separated name walked.
    #[cfg(feature = "candle")]
    pub(super) prefixes: Prefixes,
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<VariableStore>();
};

impl Default for VariableStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for VariableStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VariableStore")
            .field("tree", &self.tree)
            .field("shared_vars", &self.var_meta.len())
            .field("collections", &self.collections.len())
            .finish()
    }
}

impl VariableStore {
    /// An empty store over a new tree. O(1).
    ///
    /// ```
    /// use scopetree::sharing::VariableStore;
    /// let store = VariableStore::new();
    /// assert_eq!(store.tree().var_count(), 0);
    /// ```
    pub fn new() -> Self {
        Self::from_tree(ScopeTree::new())
    }

    /// A store over an existing tree. Variables already in the tree are
    /// found by `get_variable` at their full names (and shared if the scope
    /// reuses) but belong to no collection. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, sharing::VariableStore};
    /// let mut tree = ScopeTree::new();
    /// tree.var(tree.root(), "w")?;
    /// let store = VariableStore::from_tree(tree);
    /// assert_eq!(store.variable("w")?.is_some(), true);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn from_tree(tree: ScopeTree) -> Self {
        VariableStore {
            tree,
            counts: NameCounts::default(),
            journal: Journal::default(),
            var_meta: SecondaryMap::new(),
            collections: Collections::default(),
            next_seq: 0,
            names: FullNames::default(),
            #[cfg(feature = "candle")]
            prefixes: Prefixes::default(),
        }
    }

    /// The tree underneath: read values, find variables, dump. O(1).
    ///
    /// ```
    /// use scopetree::sharing::VariableStore;
    /// assert_eq!(VariableStore::new().tree().scope_count(), 1);
    /// ```
    pub fn tree(&self) -> &ScopeTree {
        &self.tree
    }

    /// The tree underneath, mutably: set values, make step scopes. Structural
    /// edits made here are safe (metadata of deleted scopes and variables is
    /// never read again) but [`delete_scope`](Self::delete_scope) also frees
    /// that metadata at once, and frees the default names of the deleted
    /// scopes (a default-named scope deleted here keeps its number taken
    /// until its parent is entered anew). Edits made here inside a scope
    /// body are not undone if the body panics. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let w = store.get_variable(&root, VarSpec::new("w").initializer(Initializer::constant(1.0_f32)))?;
    /// *store.tree_mut().get_mut::<f32>(w)? += 1.0;
    /// assert_eq!(*store.tree().get::<f32>(w)?, 2.0);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn tree_mut(&mut self) -> &mut ScopeTree {
        &mut self.tree
    }

    /// Gives back the tree, dropping the sharing metadata. O(metadata).
    ///
    /// ```
    /// use scopetree::sharing::VariableStore;
    /// let tree = VariableStore::new().into_tree();
    /// assert_eq!(tree.scope_count(), 1);
    /// ```
    pub fn into_tree(self) -> ScopeTree {
        self.tree
    }

    // ----- the records of one variable --------------------------------------

    /// Creates the variable `leaf` in `place` holding `payload`. O(1).
    pub(crate) fn create_var_with(
        &mut self,
        place: ScopeKey,
        leaf: impl crate::Name,
        payload: Box<dyn Payload>,
    ) -> Result<VarId, Error> {
        let var = self.tree.create_var(self.tree.scope_id(place), leaf)?;
        self.tree.var_slot_mut(var)?.value = Some(payload);
        Ok(var)
    }

    /// The metadata of a variable the store created, if `var` is live. O(1).
    pub(crate) fn var_meta(&self, var: VarKey) -> Option<&VarMeta> {
        self.var_meta.get(var)
    }

    /// The creation number the next new variable gets. O(1).
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Records a variable the true getter just created at `full`: journal,
    /// collections, metadata and, if `full` is given, the full-name index.
    /// O(collections × number of collections).
    pub(crate) fn record_new_var(
        &mut self,
        var: VarKey,
        full: Option<Arc<str>>,
        collections: &[String],
        meta: (Shape, bool, TypeId, &'static str),
    ) {
        self.journal.created(Undo::NewVar(var));
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut joined = 0;
        for (i, c) in collections.iter().enumerate() {
            if !collections[..i].contains(c) {
                joined += 1;
                self.collections.push(c, seq, var);
            }
        }
        if let Some(full) = &full {
            self.names.insert(&self.tree, Arc::clone(full), var);
        }
        let (shape, trainable, type_id, type_name) = meta;
        self.var_meta.insert(
            var,
            VarMeta {
                shape,
                trainable,
                type_id,
                type_name,
                entries: joined,
                full,
            },
        );
    }

    /// Drops the metadata of `v` and its full-name index entry; returns how
    /// many collection entries it had, if the store knew it. O(len(name)).
    pub(super) fn forget_var(&mut self, v: VarKey) -> Option<usize> {
        let meta = self.var_meta.remove(v)?;
        if let Some(full) = &meta.full {
            self.names.remove(full, v);
        }
        Some(meta.entries)
    }
}
