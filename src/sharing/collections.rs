//! [`Collections`]: named lists of variables in creation order (TensorFlow's
//! graph collections). A plain table the store owns; the store lists them
//! (see [`VariableStore::collection`](crate::sharing::VariableStore::collection)).

use crate::arena::VarKey;

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
/// [`get_local_variable`](crate::sharing::VariableStore::get_local_variable).
///
/// ```
/// assert_eq!(scopetree::sharing::LOCAL_VARIABLES, "local_variables");
/// ```
pub const LOCAL_VARIABLES: &str = "local_variables";

/// One named collection: members in the order they joined, with the
/// creation number of each.
#[derive(Debug)]
struct Collection {
    name: String,
    members: Vec<(u64, VarKey)>,
}

/// Every collection, in the order first used, and how many of their entries
/// belong to deleted variables.
#[derive(Debug, Default)]
pub(crate) struct Collections {
    lists: Vec<Collection>,
    /// Dead entries left in the lists since the last compaction.
    dead: usize,
}

impl Collections {
    /// How many collections exist. O(1).
    pub(crate) fn len(&self) -> usize {
        self.lists.len()
    }

    /// Drops the collections made after the first `len` (a rollback: their
    /// members are all undone by then). O(dropped).
    pub(crate) fn truncate(&mut self, len: usize) {
        self.lists.truncate(len);
    }

    /// Appends a variable to a collection, creating the collection.
    /// O(collections).
    pub(crate) fn push(&mut self, name: &str, seq: u64, var: VarKey) {
        match self.lists.iter_mut().find(|c| c.name == name) {
            Some(c) => c.members.push((seq, var)),
            None => self.lists.push(Collection {
                name: name.to_owned(),
                members: vec![(seq, var)],
            }),
        }
    }

    /// Undoes the newest joins of `var`, which had `entries` entries (a
    /// rollback, newest creation first, so its entries are last). Entries
    /// not found at the end are counted dead. O(collections).
    pub(crate) fn pop(&mut self, var: VarKey, entries: usize) {
        let mut popped = 0;
        for c in &mut self.lists {
            if c.members.last().is_some_and(|&(_, v)| v == var) {
                c.members.pop();
                popped += 1;
            }
        }
        self.dead += entries.saturating_sub(popped);
    }

    /// Counts `entries` entries of a deleted variable as dead. O(1).
    pub(crate) fn died(&mut self, entries: usize) {
        self.dead += entries;
    }

    /// Drops dead members once they make up half the entries of the lists
    /// (`dead` counts entries, not variables: a trainable variable has two):
    /// amortised O(1) per dead entry. Variables deleted behind the store's
    /// back (through `tree_mut`) are not counted; their entries are skipped
    /// as dead by every query and dropped at the next compaction.
    pub(crate) fn maybe_compact(&mut self, live: impl Fn(VarKey) -> bool) {
        let total: usize = self.lists.iter().map(|c| c.members.len()).sum();
        if self.dead == 0 || self.dead * 2 < total {
            return;
        }
        for c in &mut self.lists {
            c.members.retain(|&(_, v)| live(v));
        }
        self.dead = 0;
    }

    /// The entries of collection `name` (dead ones included), oldest first.
    /// O(collections).
    pub(crate) fn members(&self, name: &str) -> &[(u64, VarKey)] {
        self.lists
            .iter()
            .find(|c| c.name == name)
            .map_or(&[], |c| &c.members)
    }

    /// The entries of `name` with creation number `since` or later.
    /// O(collections + log members).
    pub(crate) fn since(&self, name: &str, since: u64) -> &[(u64, VarKey)] {
        let m = self.members(name);
        &m[m.partition_point(|&(seq, _)| seq < since)..]
    }

    /// The collection names, in the order first used. O(1) each.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.lists.iter().map(|c| c.name.as_str())
    }

    /// All entries, dead ones included (for tests). O(collections).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        self.lists.iter().map(|c| c.members.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use crate::sharing::{Initializer, ScopeOpts, VarSpec, VariableStore};

    /// Deleted trainable variables leave two dead entries each; compaction
    /// must keep the lists bounded while one variable stays alive.
    #[test]
    fn collection_lists_stay_bounded_under_churn() -> Result<(), crate::sharing::Error> {
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
            let entries: usize = store.collection_entries();
            assert!(
                entries <= 8,
                "{entries} collection entries after {i} deletions"
            );
        }
        assert_eq!(store.trainable_variables(None)?.len(), 1);
        Ok(())
    }
}
