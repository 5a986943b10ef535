//! The collections listings of [`VariableStore`]: the live members of a
//! collection, under a scope or everywhere (TensorFlow's `get_collection`,
//! `global_variables`, ...), and the collection names.

use crate::arena::{ScopeKey, VarId, VarKey};
use crate::sharing::collections::{GLOBAL_VARIABLES, LOCAL_VARIABLES, TRAINABLE_VARIABLES};
use crate::sharing::error::Error;
use crate::sharing::path::Path;
use crate::sharing::scope::VarScope;
use crate::sharing::store::VariableStore;

impl VariableStore {
    /// All collection entries, dead ones included (for tests). O(collections).
    #[cfg(test)]
    pub(crate) fn collection_entries(&self) -> usize {
        self.collections.entries()
    }

    fn member_live(&self, var: VarKey) -> bool {
        self.var_meta.contains_key(var) && self.tree.var_is_live(var)
    }

    /// The live members of `key` under scope `top` (every one if `None`).
    fn members_under(
        &self,
        key: &str,
        top: Option<ScopeKey>,
    ) -> Result<Vec<(String, VarId)>, Error> {
        let mut out = Vec::new();
        for &(_, v) in self.collections.members(key) {
            if !self.member_live(v) {
                continue;
            }
            if let Some(top) = top {
                let within = self
                    .tree
                    .owner_of(v)
                    .is_some_and(|o| self.tree.is_within(o, top));
                if !within {
                    continue;
                }
            }
            let id = self.tree.var_id(v);
            out.push((self.tree.var_path(id)?, id));
        }
        Ok(out)
    }

    /// The variables of collection `key`, with their full names, in the order
    /// they joined it (TensorFlow's `tf.get_collection(key, scope)`).
    ///
    /// With `scope: Some(path)`, only the variables at or below the scope of
    /// that full name. Matching is on whole path components: `foo` selects
    /// `foo/w` and `foo/bar/w` but never `foo_/w` or `foobar/w` (TensorFlow
    /// matches a regular expression prefix instead, so its `"foo"` does pick
    /// up `foo_1/w`). `Some("")` is the root: everything. An unknown
    /// collection or scope gives an empty list.
    ///
    /// O(members × depth).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`InvalidName`](crate::Error::InvalidName)) for an empty path component.
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, ScopeOpts, VariableStore, VarSpec, GLOBAL_VARIABLES};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// for scope in ["foo", "foo_"] {
    ///     store.variable_scope(&root, scope, ScopeOpts::new(), |s, vs| {
    ///         s.get_variable(vs, VarSpec::new("w").initializer(Initializer::constant(0_u8)))
    ///     })?;
    /// }
    /// let names: Vec<_> = store.collection(GLOBAL_VARIABLES, Some("foo"))?.into_iter().map(|(n, _)| n).collect();
    /// assert_eq!(names, ["foo/w"]);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn collection(
        &self,
        key: &str,
        scope: Option<&str>,
    ) -> Result<Vec<(String, VarId)>, Error> {
        let top = match scope {
            None | Some("") => None,
            Some(path) => match self.resolve(self.tree.root_key(), Some(Path::parse(path)?)) {
                Some(k) => Some(k),
                None => return Ok(Vec::new()),
            },
        };
        self.members_under(key, top)
    }

    /// The variables of collection `key` at or below the variable scope
    /// `scope` (TensorFlow's `VariableScope.get_collection`). O(members ×
    /// depth).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`StaleScope`](crate::Error::StaleScope)) or [`Tree`](Error::Tree)([`ForeignScope`](crate::Error::ForeignScope)) if `scope`'s place was
    /// deleted or belongs to another store.
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, ScopeOpts, VariableStore, VarSpec, TRAINABLE_VARIABLES};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let names = store.variable_scope(&root, "foo", ScopeOpts::new(), |s, vs| {
    ///     s.get_variable(vs, VarSpec::new("a").initializer(Initializer::constant(0_u8)))?;
    ///     s.get_variable(vs, VarSpec::new("b").trainable(false).initializer(Initializer::constant(0_u8)))?;
    ///     s.scope_collection(vs, TRAINABLE_VARIABLES)
    /// })?;
    /// assert_eq!(names.len(), 1);
    /// assert_eq!(names[0].0, "foo/a");
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn scope_collection(
        &self,
        scope: &VarScope,
        key: &str,
    ) -> Result<Vec<(String, VarId)>, Error> {
        let top = self.tree.check_scope(scope.place)?;
        let top = (top != self.tree.root_key()).then_some(top);
        self.members_under(key, top)
    }

    /// [`GLOBAL_VARIABLES`] under `scope` (see [`collection`](Self::collection)).
    /// O(members × depth).
    ///
    /// # Errors
    /// As [`collection`](Self::collection).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// store.get_variable(&root, VarSpec::new("w").initializer(Initializer::constant(0_u8)))?;
    /// assert_eq!(store.global_variables(None)?.len(), 1);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn global_variables(&self, scope: Option<&str>) -> Result<Vec<(String, VarId)>, Error> {
        self.collection(GLOBAL_VARIABLES, scope)
    }

    /// [`TRAINABLE_VARIABLES`] under `scope` (see
    /// [`collection`](Self::collection)). O(members × depth).
    ///
    /// # Errors
    /// As [`collection`](Self::collection).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// store.get_variable(&root, VarSpec::new("w").initializer(Initializer::constant(0_u8)))?;
    /// store.get_variable(&root, VarSpec::new("step").trainable(false).initializer(Initializer::constant(0_u8)))?;
    /// assert_eq!(store.trainable_variables(None)?.len(), 1);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn trainable_variables(&self, scope: Option<&str>) -> Result<Vec<(String, VarId)>, Error> {
        self.collection(TRAINABLE_VARIABLES, scope)
    }

    /// [`LOCAL_VARIABLES`] under `scope` (see [`collection`](Self::collection)).
    /// O(members × depth).
    ///
    /// # Errors
    /// As [`collection`](Self::collection).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// store.get_local_variable(&root, VarSpec::new("n").initializer(Initializer::constant(0_u8)))?;
    /// assert_eq!(store.local_variables(None)?.len(), 1);
    /// assert!(store.global_variables(None)?.is_empty());
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn local_variables(&self, scope: Option<&str>) -> Result<Vec<(String, VarId)>, Error> {
        self.collection(LOCAL_VARIABLES, scope)
    }

    /// The names of the collections that have ever had a member, in the order
    /// they were first used. O(collections).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// store.get_variable(&root, VarSpec::new("w").initializer(Initializer::constant(0_u8)))?;
    /// assert_eq!(store.collection_names().collect::<Vec<_>>(), ["variables", "trainable_variables"]);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn collection_names(&self) -> impl Iterator<Item = &str> {
        self.collections.names()
    }

    /// Full names of the live members of `key` that joined at or after
    /// creation number `since` (for the template check).
    pub(crate) fn joined_since(&self, key: &str, since: u64) -> Vec<String> {
        self.collections
            .since(key, since)
            .iter()
            .filter(|&&(_, v)| self.member_live(v))
            .filter_map(|&(_, v)| self.tree.var_path(self.tree.var_id(v)).ok())
            .collect()
    }
}
