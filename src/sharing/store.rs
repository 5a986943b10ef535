//! [`VariableStore`]: the sharing layer over a [`ScopeTree`], its per-scope
//! and per-variable metadata, and entering scopes (named, default-named,
//! re-entered) with TensorFlow's default-name counting.

use std::any::TypeId;
use std::fmt;

use slotmap::SecondaryMap;
use smallvec::SmallVec;

use crate::arena::{ScopeId, ScopeKey, VarId, VarKey};
use crate::error::{Error, InvalidNameReason};
use crate::names::validate_name;
use crate::sharing::collections::Collection;
use crate::sharing::scope::{Reuse, ScopeOpts, VarScope};
use crate::sharing::shape::Shape;
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

/// What the sharing layer knows of a variable it created.
#[derive(Clone, Debug)]
pub(crate) struct VarMeta {
    /// The shape of the initial value.
    pub(crate) shape: Shape,
    pub(crate) trainable: bool,
    pub(crate) type_id: TypeId,
    pub(crate) type_name: &'static str,
    /// How many collection entries the variable has (each becomes a dead
    /// entry when it is deleted; see `maybe_compact`).
    pub(crate) entries: usize,
}

/// A variable store with TensorFlow-1-style sharing, over a [`ScopeTree`].
///
/// Named variable scopes are named scopes of the tree, and the variables
/// `get_variable` creates are variables of the tree, so a variable's full name
/// is its tree path (`encoder/layer_1/w`), and [`ScopeTree::find_var`],
/// handles and stale reporting all keep working on them (reach the tree with
/// [`tree`](Self::tree) and [`tree_mut`](Self::tree_mut)).
///
/// The store adds what TensorFlow keeps beside its variable dictionary:
/// default-name counters per scope, and per variable its initial shape, value
/// type, trainable flag and collections. These live in slotmap
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
/// # Ok::<(), scopetree::Error>(())
/// ```
pub struct VariableStore {
    pub(crate) tree: ScopeTree,
    scope_meta: SecondaryMap<ScopeKey, ScopeMeta>,
    pub(crate) var_meta: SecondaryMap<VarKey, VarMeta>,
    pub(crate) collections: Vec<Collection>,
    pub(crate) next_seq: u64,
    /// Dead entries left in the collection lists since the last compaction.
    pub(crate) dead: usize,
    clock: u64,
    /// Old values of `scope_meta` entries changed while a captured scope is
    /// re-entered, undone when it exits (TensorFlow restores a snapshot of
    /// all counts there).
    journal: Vec<(ScopeKey, Option<ScopeMeta>)>,
    marks: Vec<usize>,
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

/// Splits a full or relative name on `/`, rejecting empty components.
pub(crate) fn split_path(name: &str) -> Result<SmallVec<[&str; 8]>, Error> {
    if name.is_empty() {
        return Err(Error::InvalidName {
            name: String::new(),
            reason: InvalidNameReason::Empty,
        });
    }
    let mut out = SmallVec::new();
    for c in name.split('/') {
        if c.is_empty() {
            return Err(Error::InvalidName {
                name: name.chars().take(64).collect(),
                reason: InvalidNameReason::Empty,
            });
        }
        out.push(c);
    }
    Ok(out)
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
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn from_tree(tree: ScopeTree) -> Self {
        VariableStore {
            tree,
            scope_meta: SecondaryMap::new(),
            var_meta: SecondaryMap::new(),
            collections: Vec::new(),
            next_seq: 0,
            dead: 0,
            clock: 0,
            journal: Vec::new(),
            marks: Vec::new(),
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
    /// that metadata at once. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let w = store.get_variable(&root, VarSpec::new("w").initializer(Initializer::constant(1.0_f32)))?;
    /// *store.tree_mut().get_mut::<f32>(w)? += 1.0;
    /// assert_eq!(*store.tree().get::<f32>(w)?, 2.0);
    /// # Ok::<(), scopetree::Error>(())
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

    /// The root variable scope: full name `""`, reuse mode `Inherit` (create
    /// only), no defaults. Every call returns a fresh value; settings made on
    /// one (e.g. [`VarScope::reuse_variables`]) stay with that value. O(1).
    ///
    /// ```
    /// use scopetree::sharing::VariableStore;
    /// let store = VariableStore::new();
    /// assert_eq!(store.root_scope().name(), "");
    /// ```
    pub fn root_scope(&self) -> VarScope {
        VarScope::root(self.tree.root())
    }

    // ----- entering scopes ------------------------------------------------

    /// Enters the named scope `name` under `current` and runs `f` in it
    /// (TensorFlow's `with tf.variable_scope("name") as vs:`). Entering the
    /// same name again gives the same scope: names are used as given, never
    /// made unique. A name with `/` enters nested scopes (`"a/b"`).
    ///
    /// The new scope's full name is `current.name()/name`; its reuse mode is
    /// `opts`' unless that is `Inherit`, then `current`'s (so `Reuse` is
    /// sticky, and `AutoReuse` overrides an inherited `Reuse`); it inherits
    /// `current`'s initializers, trainable default and custom getters, then
    /// applies `opts`. The tree scope is created if absent. On exit the
    /// default-name counters of its sub-scopes are reset, as in TensorFlow.
    ///
    /// O(components + depth) plus `f`: each component is one O(1) named-kid
    /// probe, and opening the scope reads its ancestors' default-name counters.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty name or component;
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for `current`; and
    /// whatever `f` returns.
    ///
    /// ```
    /// use scopetree::sharing::{ScopeOpts, VariableStore};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let name = store.variable_scope(&root, "foo", ScopeOpts::new(), |store, foo| {
    ///     store.variable_scope(foo, "bar", ScopeOpts::new(), |_, bar| Ok(bar.name().to_owned()))
    /// })?;
    /// assert_eq!(name, "foo/bar");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn variable_scope<R>(
        &mut self,
        current: &VarScope,
        name: &str,
        opts: impl Into<ScopeOpts>,
        f: impl FnOnce(&mut Self, &mut VarScope) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let opts = opts.into();
        let start = self.tree.check_scope(current.place)?;
        let comps = split_path(name)?;
        let place = self.resolve_or_create(start, &comps)?;
        let reuse = opts.reuse.or(current.reuse);
        let mut vs = current.child(self.tree.scope_id(place), name, reuse);
        vs.apply(opts);
        self.run_named(place, vs, f)
    }

    /// Enters a new scope named after `default_name`, made unique under
    /// `current` (TensorFlow's `tf.variable_scope(None, default_name=...)`):
    /// `layer`, then `layer_1`, `layer_2`, ... The counting is TensorFlow's:
    /// a name counts as used while a scope of that full name has been entered
    /// (by any means) since its parent scope was last exited, so the numbering
    /// under a scope restarts each time that scope is entered anew, and
    /// existing variables do not matter.
    ///
    /// Otherwise as [`variable_scope`](Self::variable_scope), except that the
    /// reuse mode is always `current`'s.
    ///
    /// O(depth × tries) to pick the name, plus `f`.
    ///
    /// # Errors
    /// [`Error::ReuseWithoutName`] if `opts` asks for `Reuse` or `AutoReuse`;
    /// [`Error::InvalidName`] if `default_name` is empty or contains `/`;
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for `current`; and
    /// whatever `f` returns.
    ///
    /// ```
    /// use scopetree::sharing::{ScopeOpts, VariableStore};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let mut names = Vec::new();
    /// for _ in 0..3 {
    ///     names.push(store.variable_scope_unique(&root, "layer", ScopeOpts::new(), |_, vs| Ok(vs.name().to_owned()))?);
    /// }
    /// assert_eq!(names, ["layer", "layer_1", "layer_2"]);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn variable_scope_unique<R>(
        &mut self,
        current: &VarScope,
        default_name: &str,
        opts: impl Into<ScopeOpts>,
        f: impl FnOnce(&mut Self, &mut VarScope) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let opts = opts.into();
        let start = self.tree.check_scope(current.place)?;
        if opts.reuse != Reuse::Inherit {
            return Err(Error::ReuseWithoutName {
                default_name: default_name.to_owned(),
                scope: self.tree.path_of(start),
                reuse: opts.reuse,
            });
        }
        validate_name(default_name)?;
        let name = self.unique_scope_name(start, default_name)?;
        let place = self.resolve_or_create(start, &[name.as_str()])?;
        let mut vs = current.child(self.tree.scope_id(place), &name, current.reuse);
        vs.apply(opts);
        self.run_named(place, vs, f)
    }

    fn run_named<R>(
        &mut self,
        place: ScopeKey,
        mut vs: VarScope,
        f: impl FnOnce(&mut Self, &mut VarScope) -> Result<R, Error>,
    ) -> Result<R, Error> {
        self.open(place);
        let out = f(self, &mut vs);
        self.close_subscopes(place);
        out
    }

    /// Re-enters a captured scope (TensorFlow's `with
    /// tf.variable_scope(captured_vs):`) and runs `f` in it, from wherever the
    /// caller is: the scope keeps its own full name, and its own reuse mode,
    /// initializers, trainable default and custom getters, not the caller's.
    /// `opts` applies on top: a reuse mode other than `Inherit` replaces the
    /// captured one (so a captured `Reuse` cannot be turned off), a custom
    /// getter wraps the captured chain.
    ///
    /// Default-name counters changed inside are restored on exit, as
    /// TensorFlow restores them when leaving a re-entered scope. O(depth)
    /// plus `f` plus O(counter changes inside) on exit.
    ///
    /// # Errors
    /// [`Error::StaleScope`] if the captured scope was deleted;
    /// [`Error::ForeignScope`] if it belongs to another store; and whatever
    /// `f` returns.
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, Reuse, ScopeOpts, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let spec = || VarSpec::new("v").initializer(Initializer::constant(1.0_f32));
    /// let (tower, v) = store.variable_scope(&root, "tower", ScopeOpts::new(), |s, vs| {
    ///     Ok((vs.clone(), s.get_variable(vs, spec())?))
    /// })?;
    /// let again = store.variable_scope(&root, "elsewhere", ScopeOpts::new(), |s, _| {
    ///     s.reenter_scope(&tower, Reuse::Reuse, |s, vs| s.get_variable(vs, spec()))
    /// })?;
    /// assert_eq!(again, v);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn reenter_scope<R>(
        &mut self,
        captured: &VarScope,
        opts: impl Into<ScopeOpts>,
        f: impl FnOnce(&mut Self, &mut VarScope) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let opts = opts.into();
        let place = self.tree.check_scope(captured.place)?;
        self.open(place);
        self.marks.push(self.journal.len());
        let mut vs = captured.clone();
        vs.reuse = opts.reuse.or(captured.reuse);
        vs.apply(opts);
        let out = f(self, &mut vs);
        self.undo_to_mark();
        out
    }

    // ----- default-name counting --------------------------------------------

    fn scope_live(&self, key: ScopeKey) -> bool {
        self.tree.scope_is_live(key)
    }

    /// The count of `key` in force (TensorFlow's `variable_scope_count`).
    fn effective_count(&self, key: ScopeKey) -> u32 {
        let Some(meta) = self.scope_meta.get(key) else {
            return 0;
        };
        let reset_above = self.tree.ancestor_keys(key).skip(1).any(|k| {
            self.scope_meta
                .get(k)
                .is_some_and(|m| m.closed_at >= meta.opened_at)
        });
        if reset_above { 0 } else { meta.count }
    }

    fn set_meta(&mut self, key: ScopeKey, meta: ScopeMeta) {
        if !self.marks.is_empty() {
            let old = self.scope_meta.get(key).copied();
            self.journal.push((key, old));
        }
        self.scope_meta.insert(key, meta);
    }

    /// TensorFlow's `open_variable_scope`.
    fn open(&mut self, key: ScopeKey) {
        let count = self.effective_count(key);
        let closed_at = self.scope_meta.get(key).map_or(0, |m| m.closed_at);
        self.clock += 1;
        self.set_meta(
            key,
            ScopeMeta {
                count: count.saturating_add(1),
                opened_at: self.clock,
                closed_at,
            },
        );
    }

    /// TensorFlow's `close_variable_subscopes`: every strict descendant's
    /// count drops to 0 (lazily, see [`ScopeMeta`]).
    fn close_subscopes(&mut self, key: ScopeKey) {
        if !self.scope_live(key) {
            return;
        }
        let old = self.scope_meta.get(key).copied().unwrap_or_default();
        self.clock += 1;
        self.set_meta(
            key,
            ScopeMeta {
                closed_at: self.clock,
                ..old
            },
        );
    }

    fn undo_to_mark(&mut self) {
        let Some(mark) = self.marks.pop() else {
            return;
        };
        while self.journal.len() > mark {
            let Some((key, old)) = self.journal.pop() else {
                break;
            };
            if !self.scope_live(key) {
                continue;
            }
            match old {
                Some(m) => {
                    self.scope_meta.insert(key, m);
                }
                None => {
                    self.scope_meta.remove(key);
                }
            }
        }
    }

    /// TensorFlow's `_get_unique_variable_scope`.
    fn unique_scope_name(&self, parent: ScopeKey, prefix: &str) -> Result<String, Error> {
        let pid = self.tree.scope_id(parent);
        let count = |name: &str| -> Result<u32, Error> {
            Ok(match self.tree.kid(pid, name)? {
                Some(k) => self.effective_count(k.key),
                None => 0,
            })
        };
        if count(prefix)? == 0 {
            return Ok(prefix.to_owned());
        }
        let mut idx = 1u64;
        loop {
            let name = format!("{prefix}_{idx}");
            if count(&name)? == 0 {
                return Ok(name);
            }
            idx += 1;
        }
    }

    // ----- names ------------------------------------------------------------

    /// Follows named kids from `start`; `None` if one is missing.
    pub(crate) fn resolve(
        &self,
        start: ScopeKey,
        comps: &[&str],
    ) -> Result<Option<ScopeKey>, Error> {
        let mut k = start;
        for c in comps {
            match self.tree.kid(self.tree.scope_id(k), *c)? {
                Some(s) => k = s.key,
                None => return Ok(None),
            }
        }
        Ok(Some(k))
    }

    /// Follows named kids from `start`, creating the missing ones.
    pub(crate) fn resolve_or_create(
        &mut self,
        start: ScopeKey,
        comps: &[&str],
    ) -> Result<ScopeKey, Error> {
        let mut k = self.tree.scope_id(start);
        for c in comps {
            k = match self.tree.kid(k, *c)? {
                Some(s) => s,
                None => self.tree.new_named_scope(k, *c)?,
            };
        }
        Ok(k.key)
    }

    /// The variable at the full name `full_name` (`encoder/layer_1/w`), if
    /// any: exactly that name, resolved from the root component by component,
    /// never a parent's variable of the same local name. O(depth): one
    /// O(1) named-kid probe per component.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty name or component.
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, ScopeOpts, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let w = store.variable_scope(&root, "enc", ScopeOpts::new(), |s, vs| {
    ///     s.get_variable(vs, VarSpec::new("w").initializer(Initializer::constant(0_u8)))
    /// })?;
    /// assert_eq!(store.variable("enc/w")?, Some(w));
    /// assert_eq!(store.variable("w")?, None);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn variable(&self, full_name: &str) -> Result<Option<VarId>, Error> {
        let comps = split_path(full_name)?;
        let Some((last, dirs)) = comps.split_last() else {
            return Ok(None);
        };
        match self.resolve(self.tree.root_key(), dirs)? {
            Some(s) => self.tree.find_local_var(self.tree.scope_id(s), *last),
            None => Ok(None),
        }
    }

    /// The full name of a variable (its tree path, `encoder/w`). O(depth).
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let v = store.get_variable(&root, VarSpec::new("a/b").initializer(Initializer::constant(0_u8)))?;
    /// assert_eq!(store.full_name(v)?, "a/b");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn full_name(&self, var: VarId) -> Result<String, Error> {
        self.tree.var_path(var)
    }

    fn meta(&self, var: VarId) -> Result<Option<&VarMeta>, Error> {
        self.tree.var_slot(var)?;
        Ok(self.var_meta.get(var.key))
    }

    /// The shape of the value `get_variable` created `var` with; `None` for a
    /// variable the sharing layer did not create. O(1).
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, Shape, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let v = store.get_variable(&root, VarSpec::new("v").initializer(Initializer::constant(vec![0_u8; 3])))?;
    /// assert_eq!(store.initial_shape(v)?, Some(&Shape::new([3])));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn initial_shape(&self, var: VarId) -> Result<Option<&Shape>, Error> {
        Ok(self.meta(var)?.map(|m| &m.shape))
    }

    /// Whether `var` was created trainable; `None` for a variable the sharing
    /// layer did not create. O(1).
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let v = store.get_variable(&root, VarSpec::new("v").initializer(Initializer::constant(0_u8)))?;
    /// assert_eq!(store.is_trainable(v)?, Some(true));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn is_trainable(&self, var: VarId) -> Result<Option<bool>, Error> {
        Ok(self.meta(var)?.map(|m| m.trainable))
    }

    // ----- deletion -----------------------------------------------------------

    /// Deletes `scope` with its sub-scopes and variables (as
    /// [`ScopeTree::delete_scope`]) and frees their sharing metadata. Captured
    /// [`VarScope`]s and templates of the deleted scopes report stale from now
    /// on; their variables leave every collection. O(size of the subtree),
    /// plus an amortised O(1) per deleted variable to compact collections.
    ///
    /// # Errors
    /// [`Error::RootScope`] for the root; [`Error::StaleScope`] or
    /// [`Error::ForeignScope`].
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
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn delete_scope(&mut self, scope: ScopeId) -> Result<(), Error> {
        let k = self.tree.check_scope(scope)?;
        if k == self.tree.root_key() {
            return Err(Error::RootScope);
        }
        let mut scopes = Vec::new();
        let mut vars = Vec::new();
        for (s, _) in self.tree.descendants(scope)? {
            scopes.push(s.key);
            vars.extend(self.tree.local_vars(s)?.map(|(_, v)| v.key));
        }
        self.tree.delete_scope(scope)?;
        for s in scopes {
            self.scope_meta.remove(s);
        }
        for v in vars {
            if let Some(meta) = self.var_meta.remove(v) {
                self.dead += meta.entries;
            }
        }
        self.maybe_compact();
        Ok(())
    }
}
