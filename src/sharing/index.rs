//! [`FullNames`]: an index from full names (`encoder/layer_1/w`) to the
//! variables the store created, so that a full-name lookup hashes the name
//! once instead of walking its components.
//!
//! The index is a cache, never the truth: a hit is checked in O(1) against
//! the tree (the variable is live, still owned by the scope it was created
//! in and still carries the same name symbol, whose slot has not been freed
//! since: scopes never move or get renamed, so the owner's path is
//! unchanged, and a symbol slot keeps its text until it is freed, which
//! bumps its generation), and a miss or a failed check falls back to the
//! component walk. The check reads two slots and compares integers: no
//! string beyond the one the hash probe compares.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::arena::{ScopeKey, VarKey};
use crate::layer_api::Sym;
use crate::tree::ScopeTree;

#[derive(Copy, Clone, Debug)]
struct Entry {
    var: VarKey,
    owner: ScopeKey,
    /// The variable's name symbol when it was recorded, and that symbol
    /// slot's generation then.
    sym: Sym,
    generation: u32,
}

impl Entry {
    /// Whether the tree still has this entry's variable at this entry's
    /// full name. O(1).
    #[inline]
    fn holds(&self, tree: &ScopeTree) -> bool {
        tree.var_place(self.var) == Some((self.owner, self.sym))
            && tree.sym_generation(self.sym) == self.generation
    }
}

/// Full name → variable, for the variables `get_variable` created (not the
/// candle backend's, which candle finds by their dotted names).
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
        e.holds(tree).then_some(e.var)
    }

    /// Records the live variable `var` at `full`, with the owner and name
    /// symbol the tree gives it now. Sweeps dead entries when the index has
    /// grown past twice the tree's variables: amortised O(1).
    pub(crate) fn insert(&mut self, tree: &ScopeTree, full: Arc<str>, var: VarKey) {
        let Some((owner, sym)) = tree.var_place(var) else {
            return;
        };
        if self.map.len() >= 2 * tree.var_count() + 64 {
            self.map.retain(|_, e| e.holds(tree));
        }
        self.map.insert(
            full,
            Entry {
                var,
                owner,
                sym,
                generation: tree.sym_generation(sym),
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
