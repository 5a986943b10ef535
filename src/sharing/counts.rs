//! [`NameCounts`]: TensorFlow's default-name counting
//! (`_VariableScopeStore.variable_scopes_count`), kept per scope key, with a
//! per-prefix hint that makes picking the next free default name O(1)
//! amortised.
//!
//! Every counter change is handed to a `record` closure the caller gives
//! (the store passes the journal's `count_changed`), so this file does not
//! know the journal; the journal stores [`ScopeMeta`] values as they are.

use std::fmt::Write as _;

use rustc_hash::FxHashMap;
use slotmap::SecondaryMap;

use crate::arena::ScopeKey;
use crate::tree::ScopeTree;

/// Default-name bookkeeping of one scope (TensorFlow's
/// `variable_scopes_count` entry for its full name).
///
/// TensorFlow zeroes the counts of every sub-scope when a named scope exits.
/// Here that is lazy: a scope's count is in force only if it was last opened
/// after every strict ancestor last closed (`opened_at > closed_at` of each),
/// so an exit is O(1) and a count read is O(depth).
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct ScopeMeta {
    count: u32,
    opened_at: u64,
    closed_at: u64,
}

/// Where the scan for `prefix_N` under one parent resumes: every
/// `prefix_1` .. `prefix_{next-1}` had a count in force at clock `at`.
/// Counts only fall when an ancestor-or-self of the parent closes (detected
/// by comparing `closed_at` with `at`) or when an undo, a deletion or a
/// rollback touches a kid (which drops the parent's hints).
#[derive(Copy, Clone, Debug)]
struct Hint {
    next: u64,
    at: u64,
}

/// The default-name counters of every scope, and the scan hints.
#[derive(Debug, Default)]
pub(crate) struct NameCounts {
    meta: SecondaryMap<ScopeKey, ScopeMeta>,
    clock: u64,
    hints: SecondaryMap<ScopeKey, FxHashMap<Box<str>, Hint>>,
}

impl NameCounts {
    /// Whether an ancestor-or-self of `key` closed after clock `t`.
    /// O(depth).
    fn closed_after(&self, tree: &ScopeTree, key: ScopeKey, t: u64) -> bool {
        tree.ancestor_keys(key)
            .any(|a| self.meta.get(a).is_some_and(|m| m.closed_at > t))
    }

    /// The count of `key` in force (TensorFlow's `variable_scope_count`).
    /// O(depth).
    pub(crate) fn count(&self, tree: &ScopeTree, key: ScopeKey) -> u32 {
        let Some(meta) = self.meta.get(key) else {
            return 0;
        };
        let reset = tree
            .parent_of(key)
            .is_some_and(|p| self.closed_after(tree, p, meta.opened_at.saturating_sub(1)));
        if reset { 0 } else { meta.count }
    }

    /// Sets the counter of `key`, handing its old value to `record` first.
    fn set(
        &mut self,
        key: ScopeKey,
        meta: ScopeMeta,
        record: impl FnOnce(ScopeKey, Option<ScopeMeta>),
    ) {
        record(key, self.meta.get(key).copied());
        self.meta.insert(key, meta);
    }

    /// TensorFlow's `open_variable_scope`; the old counter goes to
    /// `record`. O(depth).
    pub(crate) fn open(
        &mut self,
        tree: &ScopeTree,
        key: ScopeKey,
        record: impl FnOnce(ScopeKey, Option<ScopeMeta>),
    ) {
        let count = self.count(tree, key);
        let closed_at = self.meta.get(key).map_or(0, |m| m.closed_at);
        self.clock += 1;
        let meta = ScopeMeta {
            count: count.saturating_add(1),
            opened_at: self.clock,
            closed_at,
        };
        self.set(key, meta, record);
    }

    /// TensorFlow's `close_variable_subscopes`: every strict descendant's
    /// count drops to 0 (lazily, see [`ScopeMeta`]); the old counter goes to
    /// `record`. O(1).
    pub(crate) fn close_subscopes(
        &mut self,
        tree: &ScopeTree,
        key: ScopeKey,
        record: impl FnOnce(ScopeKey, Option<ScopeMeta>),
    ) {
        if !tree.scope_is_live(key) {
            return;
        }
        let old = self.meta.get(key).copied().unwrap_or_default();
        self.clock += 1;
        let meta = ScopeMeta {
            closed_at: self.clock,
            ..old
        };
        self.set(key, meta, record);
    }

    /// Puts back a counter's old value (an undo). O(1).
    pub(crate) fn restore(&mut self, tree: &ScopeTree, key: ScopeKey, old: Option<ScopeMeta>) {
        if !tree.scope_is_live(key) {
            return;
        }
        match old {
            Some(m) => {
                self.meta.insert(key, m);
            }
            None => {
                self.meta.remove(key);
            }
        }
        self.kids_changed(tree, key);
    }

    /// Drops the scan hints of `key`'s parent: a kid's count may have fallen.
    /// O(1).
    pub(crate) fn kids_changed(&mut self, tree: &ScopeTree, key: ScopeKey) {
        if let Some(p) = tree.parent_of(key) {
            self.hints.remove(p);
        }
    }

    /// Forgets a scope that is being deleted. O(1).
    pub(crate) fn forget(&mut self, key: ScopeKey) {
        self.meta.remove(key);
        self.hints.remove(key);
    }

    /// TensorFlow's `_get_unique_variable_scope`: `prefix` if its count
    /// under `parent` is 0, else the first `prefix_N` (N ≥ 1) whose count is
    /// 0. O(depth + len) amortised: the scan resumes where the last one under
    /// `parent` stopped while no count there has fallen since.
    pub(crate) fn unique_name(
        &mut self,
        tree: &ScopeTree,
        parent: ScopeKey,
        prefix: &str,
    ) -> String {
        let count_of = |this: &Self, name: &str| {
            tree.sym_of(name)
                .and_then(|s| tree.kid_key(parent, s))
                .map_or(0, |k| this.count(tree, k))
        };
        if count_of(self, prefix) == 0 {
            return prefix.to_owned();
        }
        let start = match self.hints.get(parent).and_then(|h| h.get(prefix)) {
            Some(h) if !self.closed_after(tree, parent, h.at) => h.next,
            _ => 1,
        };
        let mut idx = start;
        let mut name = String::with_capacity(prefix.len() + 4);
        loop {
            name.clear();
            // Writing to a String cannot fail.
            let _ = write!(name, "{prefix}_{idx}");
            if count_of(self, &name) == 0 {
                break;
            }
            idx += 1;
        }
        let hint = Hint {
            next: idx,
            at: self.clock,
        };
        if let Some(entry) = self.hints.entry(parent) {
            let table = entry.or_default();
            match table.get_mut(prefix) {
                Some(h) => *h = hint,
                None => {
                    table.insert(prefix.into(), hint);
                }
            }
        }
        name
    }
}
