//! Path resolution in [`VariableStore`]: following a [`Path`]'s components
//! from a scope by named kids, to a scope or a variable, and creating the
//! missing scopes (recorded in the journal).

use crate::arena::{ScopeKey, VarKey};
use crate::sharing::error::Error;
use crate::sharing::journal::Undo;
use crate::sharing::path::Path;
use crate::sharing::store::VariableStore;

impl VariableStore {
    /// Follows named kids from `start` along `dirs`; `None` if one is
    /// missing. O(len) per component, no allocation.
    pub(crate) fn resolve(&self, start: ScopeKey, dirs: Option<Path<'_>>) -> Option<ScopeKey> {
        let mut k = start;
        for c in dirs.iter().flat_map(|d| d.components()) {
            k = self.tree.kid_key(k, self.tree.sym_of(c)?)?;
        }
        Some(k)
    }

    /// The variable `leaf` of the scope at `dirs` under `start`. O(len) per
    /// component, no allocation.
    pub(crate) fn locate(
        &self,
        start: ScopeKey,
        dirs: Option<Path<'_>>,
        leaf: &str,
    ) -> Option<VarKey> {
        let scope = match dirs {
            None => start,
            Some(d) => self.resolve(start, Some(d))?,
        };
        self.tree.local_var_named(scope, leaf)
    }

    /// Follows named kids from `start` along `dirs`, creating the missing
    /// ones (recorded in the journal). One walk.
    pub(crate) fn resolve_or_create(
        &mut self,
        start: ScopeKey,
        dirs: Option<Path<'_>>,
    ) -> Result<ScopeKey, Error> {
        let mut k = start;
        for c in dirs.iter().flat_map(|d| d.components()) {
            let found = self.tree.sym_of(c).and_then(|s| self.tree.kid_key(k, s));
            k = match found {
                Some(kid) => kid,
                None => {
                    let kid = self.tree.new_named_scope(self.tree.scope_id(k), c)?.key;
                    self.journal.created(Undo::NewScope(kid));
                    kid
                }
            };
        }
        Ok(k)
    }
}
