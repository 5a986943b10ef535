//! Collections: named lists of variables in creation order (TensorFlow's
//! graph collections), and listing them under a scope.

use crate::arena::{ScopeKey, VarId, VarKey};
use crate::error::Error;
use crate::sharing::scope::VarScope;
use crate::sharing::store::{VariableStore, split_path};

/// The collection every variable joins unless its spec names others
/// (TensorFlow's `GraphKeys.GLOBAL_VARIABLES`, `"variables"`).
///
/// ```
/// assert_eq!(scopetree::sharing::GLOBAL_VARIABLES, "variables");
/// ```
pub const GLOBAL_VARIABLES: &str = "variables";

/// The collection trainable variables join (TensorFlow's
/// `GraphKeys.TRAINABLE_VARIABLES`).
///
/// ```
/// assert_eq!(scopetree::sharing::TRAINABLE_VARIABLES, "trainable_variables");
/// ```
pub const TRAINABLE_VARIABLES: &str = "trainable_variables";

/// The collection local variables join (TensorFlow's
/// `GraphKeys.LOCAL_VARIABLES`); see
/// [`get_local_variable`](VariableStore::get_local_variable).
///
/// ```
/// assert_eq!(scopetree::sharing::LOCAL_VARIABLES, "local_variables");
/// ```
pub const LOCAL_VARIABLES: &str = "local_variables";

/// One named collection: members in the order they joined.
#[derive(Debug)]
pub(crate) struct Collection {
    name: String,
    members: Vec<(u64, VarKey)>,
}

impl VariableStore {
    /// Appends a variable to a collection, creating the collection.
    pub(crate) fn push_member(&mut self, name: &str, seq: u64, var: VarKey) {
        match self.collections.iter_mut().find(|c| c.name == name) {
            Some(c) => c.members.push((seq, var)),
            None => self.collections.push(Collection {
                name: name.to_owned(),
                members: vec![(seq, var)],
            }),
        }
    }

    fn member_live(&self, var: VarKey) -> bool {
        self.var_meta.contains_key(var) && self.tree.var_is_live(var)
    }

    /// Drops dead members once they make up half the entries of the lists
    /// (`dead` counts entries, not variables: a trainable variable has two):
    /// amortised O(1) per dead entry. Variables deleted behind the store's
    /// back (through `tree_mut`) are not counted; their entries are skipped
    /// as dead by every query and dropped at the next compaction.
    pub(crate) fn maybe_compact(&mut self) {
        let total: usize = self.collections.iter().map(|c| c.members.len()).sum();
        if self.dead == 0 || self.dead * 2 < total {
            return;
        }
        let mut collections = std::mem::take(&mut self.collections);
        for c in &mut collections {
            c.members.retain(|&(_, v)| self.member_live(v));
        }
        self.collections = collections;
        self.dead = 0;
    }

    /// The live members of `key` under scope `top` (every one if `None`).
    fn members_under(
        &self,
        key: &str,
        top: Option<ScopeKey>,
    ) -> Result<Vec<(String, VarId)>, Error> {
        let Some(c) = self.collections.iter().find(|c| c.name == key) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for &(_, v) in &c.members {
            if !self.member_live(v) {
                continue;
            }
            let id = self.tree.var_id(v);
            if let Some(top) = top {
                if !self.tree.is_within(self.tree.owner_key(id)?, top) {
                    continue;
                }
            }
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
    /// [`Error::InvalidName`] for an empty path component.
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
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn collection(
        &self,
        key: &str,
        scope: Option<&str>,
    ) -> Result<Vec<(String, VarId)>, Error> {
        let top = match scope {
            None | Some("") => None,
            Some(path) => {
                let comps = split_path(path)?;
                match self.resolve(self.tree.root_key(), &comps)? {
                    Some(k) => Some(k),
                    None => return Ok(Vec::new()),
                }
            }
        };
        self.members_under(key, top)
    }

    /// The variables of collection `key` at or below the variable scope
    /// `scope` (TensorFlow's `VariableScope.get_collection`). O(members ×
    /// depth).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] if `scope`'s place was
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
    /// # Ok::<(), scopetree::Error>(())
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
    /// # Ok::<(), scopetree::Error>(())
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
    /// # Ok::<(), scopetree::Error>(())
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
    /// # Ok::<(), scopetree::Error>(())
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
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn collection_names(&self) -> impl Iterator<Item = &str> {
        self.collections.iter().map(|c| c.name.as_str())
    }

    /// Full names of the live members of `key` that joined at or after
    /// creation number `since` (for the template check).
    pub(crate) fn joined_since(&self, key: &str, since: u64) -> Vec<String> {
        let Some(c) = self.collections.iter().find(|c| c.name == key) else {
            return Vec::new();
        };
        let start = c.members.partition_point(|&(seq, _)| seq < since);
        c.members[start..]
            .iter()
            .filter(|&&(_, v)| self.member_live(v))
            .filter_map(|&(_, v)| self.tree.var_path(self.tree.var_id(v)).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::sharing::{Initializer, ScopeOpts, VarSpec, VariableStore};

    /// Deleted trainable variables leave two dead entries each; compaction
    /// must keep the lists bounded while one variable stays alive.
    #[test]
    fn collection_lists_stay_bounded_under_churn() -> crate::Result<()> {
        let mut store = VariableStore::new();
        let root = store.root_scope();
        let spec = |n: &str| VarSpec::new(n).initializer(Initializer::constant(0_u8));
        store.variable_scope(&root, "keep", ScopeOpts::new(), |s, vs| {
            s.get_variable(vs, spec("w"))
        })?;
        for i in 0..200 {
            let vs =
                store.variable_scope(&root, &format!("tmp{i}"), ScopeOpts::new(), |s, vs| {
                    s.get_variable(vs, spec("w"))?;
                    Ok(vs.clone())
                })?;
            store.delete_scope(vs.place())?;
            let entries: usize = store.collections.iter().map(|c| c.members.len()).sum();
            assert!(
                entries <= 8,
                "{entries} collection entries after {i} deletions"
            );
        }
        assert_eq!(store.trainable_variables(None)?.len(), 1);
        Ok(())
    }
}
