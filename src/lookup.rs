//! Lookups: in one scope, and up the parent chain.

use crate::arena::{ScopeId, VarId};
use crate::error::Error;
use crate::names::Name;
use crate::tree::ScopeTree;

impl ScopeTree {
    /// Finds `name` in `scope` or, failing that, in its nearest ancestor that
    /// holds it (Paddle's `FindVar`): the nearest definition wins, so a name in
    /// a kid shadows the same name in a parent. `Ok(None)` when no scope on the
    /// way holds it: absence is not an error.
    ///
    /// O(depth of `scope`) after hashing the name once (never when `name` is a
    /// [`Symbol`](crate::Symbol)); a level that cannot hold the name is skipped
    /// by a 64-bit signature test. Never allocates.
    ///
    /// This searches parents. The sharing layer's full-name lookup does not;
    /// see `docs/sharing.md`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] or [`Error::ForeignSymbol`] for a bad name;
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for a bad scope.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let w = tree.var(root, "W")?;
    /// let step = tree.new_scope(root)?;
    /// assert_eq!(tree.find_var(step, "W")?, Some(w));
    /// assert_eq!(tree.find_var(step, "missing")?, None);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn find_var(&self, scope: ScopeId, name: impl Name) -> Result<Option<VarId>, Error> {
        let s = self.check_scope(scope)?;
        let Some(sym) = self.lookup_name(name.as_name_ref())? else {
            return Ok(None);
        };
        Ok(self
            .arena()
            .find_sym(s, sym)
            .map(|(_, v)| VarId::new(v, self.tag())))
    }

    /// Finds `name` in `scope` only, never in its parents (Paddle's
    /// `FindLocalVar`). O(1): a short scan, or a hash probe in a scope with
    /// more than 16 variables.
    ///
    /// # Errors
    /// [`Error::InvalidName`] or [`Error::ForeignSymbol`];
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// tree.var(root, "W")?;
    /// let step = tree.new_scope(root)?;
    /// assert_eq!(tree.find_local_var(step, "W")?, None);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn find_local_var(&self, scope: ScopeId, name: impl Name) -> Result<Option<VarId>, Error> {
        let slot = self.scope_slot(scope)?;
        let Some(sym) = self.lookup_name(name.as_name_ref())? else {
            return Ok(None);
        };
        Ok(slot.vars().find(sym).map(|v| VarId::new(v, self.tag())))
    }

    /// Like [`find_var`](Self::find_var), but absence is an error naming the
    /// variable and the scope (Paddle's `GetVar`). Same cost.
    ///
    /// # Errors
    /// [`Error::NotFound`] when no scope from `scope` to the root holds
    /// `name`; the errors of [`find_var`](Self::find_var).
    ///
    /// ```
    /// use scopetree::{Error, ScopeTree};
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let w = tree.var(root, "W")?;
    /// assert_eq!(tree.get_var(root, "W")?, w);
    /// let err = tree.get_var(root, "b").unwrap_err();
    /// assert!(matches!(err, Error::NotFound { .. }));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn get_var(&self, scope: ScopeId, name: impl Name) -> Result<VarId, Error> {
        let name = name.as_name_ref();
        match self.find_var(scope, name)? {
            Some(v) => Ok(v),
            None => Err(Error::NotFound {
                name: self.name_text(name),
                scope: self.error_path(scope.key),
            }),
        }
    }

    /// The scope that [`find_var`](Self::find_var) would find `name` in:
    /// `scope` itself or its nearest ancestor holding the name (Paddle's
    /// `FindScope`). For the scope of a handle, use
    /// [`owner`](Self::owner). Same cost as `find_var`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] or [`Error::ForeignSymbol`];
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// tree.var(root, "W")?;
    /// let step = tree.new_scope(root)?;
    /// assert_eq!(tree.find_scope(step, "W")?, Some(root));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn find_scope(&self, scope: ScopeId, name: impl Name) -> Result<Option<ScopeId>, Error> {
        let s = self.check_scope(scope)?;
        let Some(sym) = self.lookup_name(name.as_name_ref())? else {
            return Ok(None);
        };
        Ok(self
            .arena()
            .find_sym(s, sym)
            .map(|(k, _)| ScopeId::new(k, self.tag())))
    }
}
