//! [`VariableStore::delete_scope`]: deletes a subtree and frees its
//! sharing metadata (counters, variable metadata, full-name index entries,
//! collection entries).

use crate::arena::ScopeId;
use crate::sharing::error::Error;
use crate::sharing::store::VariableStore;

impl VariableStore {
    /// Deletes `scope` with its sub-scopes and variables (as
    /// [`ScopeTree::delete_scope`](crate::ScopeTree::delete_scope)) and
    /// frees their sharing metadata. Captured
    /// [`VarScope`](crate::sharing::VarScope)s and templates of the deleted
    /// scopes report stale from now on; their variables leave every
    /// collection. O(size of the subtree),
    /// plus an amortised O(1) per deleted variable to compact collections.
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`RootScope`](crate::Error::RootScope)) for the root; [`Tree`](Error::Tree)([`StaleScope`](crate::Error::StaleScope)) or
    /// [`Tree`](Error::Tree)([`ForeignScope`](crate::Error::ForeignScope)).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, ScopeOpts, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let tower = store.variable_scope(&root, "tower", ScopeOpts::new(), |s, vs| {
    ///     s.get_variable(vs, VarSpec::new("v").initializer(Initializer::constant(0_u8)))?;
    ///     Ok(vs.clone())
    /// })?;
    /// store.delete_scope(tower.place())?;
    /// assert!(store.global_variables(None)?.is_empty());
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn delete_scope(&mut self, scope: ScopeId) -> Result<(), Error> {
        let k = self.tree.check_scope(scope)?;
        if k == self.tree.root_key() {
            return Err(crate::Error::RootScope.into());
        }
        let mut scopes = Vec::new();
        let mut vars = Vec::new();
        for (s, _) in self.tree.descendants(scope)? {
            scopes.push(s.key);
            vars.extend(self.tree.local_vars(s)?.map(|(_, v)| v.key));
        }
        self.counts.kids_changed(&self.tree, k);
        self.tree.delete_scope(scope)?;
        for s in scopes {
            self.counts.forget(s);
        }
        for v in vars {
            if let Some(entries) = self.forget_var(v) {
                self.collections.died(entries);
            }
        }
        let (var_meta, tree) = (&self.var_meta, &self.tree);
        self.collections
            .maybe_compact(|v| var_meta.contains_key(v) && tree.var_is_live(v));
        Ok(())
    }
}
