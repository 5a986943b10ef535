//! [`FullNames`]: an index from full names (`encoder/layer_1/w`) to the
//! variables the store created, so that a full-name lookup hashes the name
//! once instead of walking its components.
//!
//! The index is a cache, never the truth: a hit is checked in O(1) against
//! the tree (the variable is live, still owned by the scope it was created
//! in and still has the same local name; scopes never move or get renamed,
//! so the owner's path is unchanged), and a miss or a failed check falls
//! back to the component walk. Entries are keyed by strings and generational
//! keys only, never by interned symbols, which the tree may free.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::arena::{ScopeKey, VarKey};
use crate::tree::ScopeTree;

#[derive(Copy, Clone, Debug)]
struct Entry {
    var: VarKey,
    owner: ScopeKey,
    /// Byte offset of the local name in the full name.
    leaf_at: u32,
}

/// Full name → variable, for the variables the store created.
#[derive(Debug, Default)]
pub(crate) struct FullNames {
    map: FxHashMap<Arc<str>, Entry>,
}

impl FullNames {
    /// The variable at `full`, if the index knows it and the tree confirms
    /// it. O(len).
    #[inline]
    pub(crate) fn get(&self, tree: &ScopeTree, full: &str) -> Option<VarKey> {
        let e = self.map.get(full)?;
        let (owner, sym) = tree.var_place(e.var)?;
        let leaf = full.get(e.leaf_at as usize..)?;
        (owner == e.owner && tree.sym_text(sym) == leaf).then_some(e.var)
    }

    /// Records `var`, owned by `owner`, at `full`. Sweeps dead entries when
    /// the index has grown past twice the tree's variables: amortised O(1).
    pub(crate) fn insert(
        &mut self,
        tree: &ScopeTree,
        full: Arc<str>,
        leaf_at: usize,
        var: VarKey,
        owner: ScopeKey,
    ) {
        let Ok(leaf_at) = u32::try_from(leaf_at) else {
            // A name over 4 GiB is simply not indexed; the walk finds it.
            return;
        };
        if self.map.len() >= 2 * tree.var_count() + 64 {
            self.map.retain(|full, e| {
                tree.var_place(e.var).is_some_and(|(o, s)| {
                    o == e.owner && full.get(e.leaf_at as usize..) == Some(tree.sym_text(s))
                })
            });
        }
        self.map.insert(
            full,
            Entry {
                var,
                owner,
                leaf_at,
            },
        );
    }

    /// Forgets `full` if it still points at `var`. O(len).
    pub(crate) fn remove(&mut self, full: &str, var: VarKey) {
        if self.map.get(full).is_some_and(|e| e.var == var) {
            self.map.remove(full);
        }
    }
}
