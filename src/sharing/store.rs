//! [`VariableStore`]: the sharing layer over a [`ScopeTree`], its per-variable
//! metadata, entering scopes (named, default-named, re-entered), full-name
//! lookups, collections listings and deletion.
//!
//! Every call that runs a closure of the caller (a scope body, a custom
//! getter chain) runs it inside a journal frame: if the closure panics, the
//! store undoes what the call did (counters, scopes and variables it created,
//! their metadata and collection entries) and resumes the panic.

use std::any::TypeId;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;

use slotmap::SecondaryMap;
#[cfg(feature = "candle")]
use smallvec::SmallVec;

use crate::arena::Payload;
use crate::arena::{ScopeId, ScopeKey, VarId, VarKey};
#[cfg(feature = "candle")]
use crate::layer_api::Sym;
use crate::names::validate_name;
use crate::sharing::collections::{
    Collections, GLOBAL_VARIABLES, LOCAL_VARIABLES, TRAINABLE_VARIABLES,
};
use crate::sharing::counts::NameCounts;
use crate::sharing::error::Error;
use crate::sharing::getter::{self, VarSpec};
use crate::sharing::index::FullNames;
use crate::sharing::journal::{Journal, Saved, Undo};
use crate::sharing::path::Path;
#[cfg(feature = "candle")]
use crate::sharing::prefix::Prefixes;
use crate::sharing::reuse::Reuse;
use crate::sharing::scope::{ScopeOpts, VarScope};
use crate::sharing::shape::{HasShape, Shape};
use crate::tree::ScopeTree;

/// What the sharing layer knows of a variable it created.
#[derive(Clone, Debug)]
pub(crate) struct VarMeta {
    /// The shape of the initial value.
    pub(crate) shape: Shape,
    pub(crate) trainable: bool,
    pub(crate) type_id: TypeId,
    pub(crate) type_name: &'static str,
    /// How many collection entries the variable has (each becomes a dead
    /// entry when it is deleted; see `Collections::maybe_compact`).
    pub(crate) entries: usize,
    /// The full name it was created at, the key of its full-name index
    /// entry; `None` for a variable the index does not hold (the candle
    /// backend's, which candle finds by their dotted names).
    pub(crate) full: Option<Arc<str>>,
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
/// default-name counters per scope, per variable its initial shape, value
/// type, trainable flag and collections, and an index of full names. These live in slotmap
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
/// # Ok::<(), scopetree::sharing::Error>(())
/// ```
pub struct VariableStore {
    tree: ScopeTree,
    counts: NameCounts,
    journal: Journal,
    var_meta: SecondaryMap<VarKey, VarMeta>,
    collections: Collections,
    /// Creation number of the next variable the store creates.
    next_seq: u64,
    names: FullNames,
    /// The scopes of the last separated name walked.
    #[cfg(feature = "candle")]
    prefixes: Prefixes,
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
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn from_tree(tree: ScopeTree) -> Self {
        VariableStore {
            tree,
            counts: NameCounts::default(),
            journal: Journal::default(),
            var_meta: SecondaryMap::new(),
            collections: Collections::default(),
            next_seq: 0,
            names: FullNames::default(),
            #[cfg(feature = "candle")]
            prefixes: Prefixes::default(),
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
    /// that metadata at once, and frees the default names of the deleted
    /// scopes (a default-named scope deleted here keeps its number taken
    /// until its parent is entered anew). Edits made here inside a scope
    /// body are not undone if the body panics. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let w = store.get_variable(&root, VarSpec::new("w").initializer(Initializer::constant(1.0_f32)))?;
    /// *store.tree_mut().get_mut::<f32>(w)? += 1.0;
    /// assert_eq!(*store.tree().get::<f32>(w)?, 2.0);
    /// # Ok::<(), scopetree::sharing::Error>(())
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

    // ----- journal frames ---------------------------------------------------

    /// Runs `f` in a journal frame: if it panics, everything recorded in the
    /// frame is undone and the panic resumed. O(1) plus `f`, plus
    /// O(changes recorded) when the frame ends.
    pub(crate) fn guarded<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        self.journal.begin(Some(Saved {
            next_seq: self.next_seq,
            collections: self.collections.len(),
        }));
        let depth = self.journal.depth();
        match catch_unwind(AssertUnwindSafe(|| f(self))) {
            Ok(out) => {
                while self.journal.depth() >= depth {
                    self.journal.commit();
                }
                out
            }
            Err(payload) => {
                self.rollback(depth);
                resume_unwind(payload)
            }
        }
    }

    /// Undoes the frames from the `depth`-th on, newest change first.
    fn rollback(&mut self, depth: usize) {
        let (undo, saved) = self.journal.rollback(depth);
        for u in undo {
            match u {
                Undo::Count(k, old) => self.counts.restore(&self.tree, k, old),
                Undo::NewVar(v) => self.unmake_var(v),
                Undo::NewScope(k) => self.unmake_scope(k),
            }
        }
        if let Some(saved) = saved {
            self.next_seq = saved.next_seq;
            self.collections.truncate(saved.collections);
        }
    }

    /// Drops the metadata of `v` and its full-name index entry; returns how
    /// many collection entries it had, if the store knew it. O(len(name)).
    fn forget_var(&mut self, v: VarKey) -> Option<usize> {
        let meta = self.var_meta.remove(v)?;
        if let Some(full) = &meta.full {
            self.names.remove(full, v);
        }
        Some(meta.entries)
    }

    fn unmake_var(&mut self, v: VarKey) {
        if let Some(entries) = self.forget_var(v) {
            self.collections.pop(v, entries);
        }
        if self.tree.var_is_live(v) {
            let id = self.tree.var_id(v);
            // A panicking `Drop` of the value: the tree has finished its
            // bookkeeping; the first panic is the one resumed.
            let _ = catch_unwind(AssertUnwindSafe(|| self.tree.remove_var(id)));
        }
    }

    fn unmake_scope(&mut self, k: ScopeKey) {
        if !self.tree.scope_is_live(k) {
            return;
        }
        self.counts.kids_changed(&self.tree, k);
        self.counts.forget(k);
        let id = self.tree.scope_id(k);
        let _ = catch_unwind(AssertUnwindSafe(|| self.tree.delete_scope(id)));
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
    /// # Panics
    /// If `f` panics, the panic is resumed after the store is put back as it
    /// was before the call: default-name counters, re-entry state, and the
    /// scopes, variables, metadata and collection entries the call created
    /// (deletions made inside cannot be undone and stay).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`InvalidName`](crate::Error::InvalidName)) for an empty name or component;
    /// [`Tree`](Error::Tree)([`StaleScope`](crate::Error::StaleScope)) or [`Tree`](Error::Tree)([`ForeignScope`](crate::Error::ForeignScope)) for `current`; and
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
    /// # Ok::<(), scopetree::sharing::Error>(())
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
        let path = Path::parse(name)?;
        self.guarded(|s| {
            let place = s.resolve_or_create(start, Some(path))?;
            let reuse = opts.reuse.or(current.reuse);
            let mut vs = current.child(s.tree.scope_id(place), name, reuse);
            vs.apply(opts);
            s.run_named(place, vs, f)
        })
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
    /// O(depth + len(default_name)) amortised to pick the name, however many
    /// siblings the scope has (the scan for `default_name_N` resumes where
    /// the last one under `current` stopped), plus `f`.
    ///
    /// # Panics
    /// As [`variable_scope`](Self::variable_scope): a panic of `f` is resumed
    /// after the call is undone, and the next default name is the same as if
    /// the call had not been made.
    ///
    /// # Errors
    /// [`Error::ReuseWithoutName`] if `opts` asks for `Reuse` or `AutoReuse`;
    /// [`Tree`](Error::Tree)([`InvalidName`](crate::Error::InvalidName)) if `default_name` is empty or contains `/`;
    /// [`Tree`](Error::Tree)([`StaleScope`](crate::Error::StaleScope)) or [`Tree`](Error::Tree)([`ForeignScope`](crate::Error::ForeignScope)) for `current`; and
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
    /// # Ok::<(), scopetree::sharing::Error>(())
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
                default_name: crate::short::name(default_name),
                scope: crate::short::path(&self.tree.path_of(start)),
                reuse: opts.reuse,
            });
        }
        validate_name(default_name)?;
        self.guarded(|s| {
            let name = s.counts.unique_name(&s.tree, start, default_name);
            let place = s.resolve_or_create(start, Some(Path::parse(&name)?))?;
            let mut vs = current.child(s.tree.scope_id(place), &name, current.reuse);
            vs.apply(opts);
            s.run_named(place, vs, f)
        })
    }

    fn run_named<R>(
        &mut self,
        place: ScopeKey,
        mut vs: VarScope,
        f: impl FnOnce(&mut Self, &mut VarScope) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let journal = &mut self.journal;
        self.counts
            .open(&self.tree, place, |k, old| journal.count_changed(k, old));
        let out = f(self, &mut vs);
        let journal = &mut self.journal;
        self.counts
            .close_subscopes(&self.tree, place, |k, old| journal.count_changed(k, old));
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
    /// # Panics
    /// As [`variable_scope`](Self::variable_scope).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`StaleScope`](crate::Error::StaleScope)) if the captured scope was deleted;
    /// [`Tree`](Error::Tree)([`ForeignScope`](crate::Error::ForeignScope)) if it belongs to another store; and whatever
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
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn reenter_scope<R>(
        &mut self,
        captured: &VarScope,
        opts: impl Into<ScopeOpts>,
        f: impl FnOnce(&mut Self, &mut VarScope) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let opts = opts.into();
        let place = self.tree.check_scope(captured.place)?;
        self.guarded(|s| {
            let journal = &mut s.journal;
            s.counts
                .open(&s.tree, place, |k, old| journal.count_changed(k, old));
            s.journal.begin(None);
            let mut vs = captured.clone();
            vs.reuse = opts.reuse.or(captured.reuse);
            vs.apply(opts);
            let out = f(s, &mut vs);
            let (counts, tree) = (&mut s.counts, &s.tree);
            s.journal.end_mark(|k, old| counts.restore(tree, k, old));
            out
        })
    }

    // ----- names ------------------------------------------------------------

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

    /// The variable at the full name `full_name` (`encoder/layer_1/w`), if
    /// any: exactly that name, resolved from the root component by component,
    /// never a parent's variable of the same local name. O(len) for a variable
    /// `get_variable` created (one hash of the whole name in an index, checked
    /// against the tree in O(1)); otherwise (a variable made through the tree
    /// or by the candle backend) O(depth), one O(1) named-kid probe per
    /// component.
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`InvalidName`](crate::Error::InvalidName)) for an empty name or component.
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
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    #[inline]
    pub fn variable(&self, full_name: &str) -> Result<Option<VarId>, Error> {
        match self.names.get(&self.tree, full_name) {
            Some(v) => Ok(Some(self.tree.var_id(v))),
            None => self.variable_by_walk(full_name),
        }
    }

    /// [`variable`](Self::variable) for a name the index does not confirm:
    /// the component walk, out of line so that a hit's call stays small.
    #[inline(never)]
    fn variable_by_walk(&self, full_name: &str) -> Result<Option<VarId>, Error> {
        let (dirs, leaf) = Path::parse(full_name)?.split_leaf();
        Ok(self
            .locate(self.tree.root_key(), dirs, leaf)
            .map(|v| self.tree.var_id(v)))
    }

    /// The full name of a variable (its tree path, `encoder/w`). O(depth).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`StaleVar`](crate::Error::StaleVar)) or [`Tree`](Error::Tree)([`ForeignVar`](crate::Error::ForeignVar)).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let v = store.get_variable(&root, VarSpec::new("a/b").initializer(Initializer::constant(0_u8)))?;
    /// assert_eq!(store.full_name(v)?, "a/b");
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn full_name(&self, var: VarId) -> Result<String, Error> {
        Ok(self.tree.var_path(var)?)
    }

    fn meta(&self, var: VarId) -> Result<Option<&VarMeta>, Error> {
        self.tree.var_slot(var)?;
        Ok(self.var_meta.get(var.key))
    }

    /// The shape of the value `get_variable` created `var` with; `None` for a
    /// variable the sharing layer did not create. O(1).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`StaleVar`](crate::Error::StaleVar)) or [`Tree`](Error::Tree)([`ForeignVar`](crate::Error::ForeignVar)).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, Shape, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let v = store.get_variable(&root, VarSpec::new("v").initializer(Initializer::constant(vec![0_u8; 3])))?;
    /// assert_eq!(store.initial_shape(v)?, Some(&Shape::new([3])));
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn initial_shape(&self, var: VarId) -> Result<Option<&Shape>, Error> {
        Ok(self.meta(var)?.map(|m| &m.shape))
    }

    /// Whether `var` was created trainable; `None` for a variable the sharing
    /// layer did not create. O(1).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`StaleVar`](crate::Error::StaleVar)) or [`Tree`](Error::Tree)([`ForeignVar`](crate::Error::ForeignVar)).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let v = store.get_variable(&root, VarSpec::new("v").initializer(Initializer::constant(0_u8)))?;
    /// assert_eq!(store.is_trainable(v)?, Some(true));
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn is_trainable(&self, var: VarId) -> Result<Option<bool>, Error> {
        Ok(self.meta(var)?.map(|m| m.trainable))
    }

    // ----- get_variable -------------------------------------------------------

    /// Gets the variable `spec.name` of the scope `scope`, or creates it:
    /// TensorFlow 1's `tf.get_variable`, with its four cases:
    ///
    /// | variable | scope's reuse mode | result |
    /// |---|---|---|
    /// | exists | `Inherit` (create only) | [`Error::VariableExists`], which suggests the reuse modes |
    /// | exists | `Reuse` or `AutoReuse` | the same handle, after checking the held type ([`Error::ShareTypeMismatch`]) and shape ([`Error::ShapeMismatch`]) |
    /// | absent | `Reuse` | [`Error::VariableMissing`] |
    /// | absent | `Inherit` or `AutoReuse` | created with the initializer |
    ///
    /// The name resolves to the full name `{scope.name()}/{spec.name}` and
    /// exactly there: parents are *not* searched. (Searching parents is
    /// [`ScopeTree::find_var`]'s job; both exist, under distinct names.)
    /// Custom getters of the scope (or the spec's own) run first, on create
    /// and on reuse alike. On reuse the spec's initializer, trainable flag and
    /// collections are ignored, as in TensorFlow.
    ///
    /// Cost: for an existing variable and no custom getter, O(len) per
    /// component of `spec.name` (one name probe each, no string is built);
    /// with custom getters, or on create, O(depth + len) to build and resolve
    /// the full name, plus the initializer and O(number of collections) to
    /// record a new variable.
    ///
    /// # Panics
    /// If a custom getter or an initializer panics, the panic is resumed
    /// after the variables the call created are undone.
    ///
    /// # Errors
    /// The four cases above; [`Error::InitializerRequired`] when creating with
    /// no initializer; [`Error::ConstantWithShape`], [`Error::ShapeRequired`]
    /// and [`Error::InitShapeMismatch`] for an initializer that does not fit
    /// the spec; [`Tree`](Error::Tree)([`InvalidName`](crate::Error::InvalidName)) for an empty name or empty path
    /// component; [`Tree`](Error::Tree)([`StaleScope`](crate::Error::StaleScope)) or [`Tree`](Error::Tree)([`ForeignScope`](crate::Error::ForeignScope)) if
    /// `scope`'s place was deleted or belongs to another store; and whatever a
    /// custom getter returns.
    ///
    /// ```
    /// use scopetree::sharing::{Error, Initializer, Reuse, ScopeOpts, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let spec = || VarSpec::new("w").initializer(Initializer::constant(vec![0.0_f32; 2]));
    /// let w = store.variable_scope(&root, "layer", ScopeOpts::new(), |store, vs| {
    ///     store.get_variable(vs, VarSpec::new("w").initializer(Initializer::constant(vec![0.0_f32; 2])))
    /// })?;
    /// assert_eq!(store.full_name(w)?, "layer/w");
    /// let again = store.variable_scope(&root, "layer", Reuse::Reuse, |store, vs| {
    ///     store.get_variable(vs, VarSpec::<Vec<f32>>::new("w").shape([2]))
    /// })?;
    /// assert_eq!(again, w);
    /// let err = store.variable_scope(&root, "layer", ScopeOpts::new(), |s, vs| s.get_variable(vs, spec()));
    /// assert!(matches!(err, Err(Error::VariableExists { .. })));
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn get_variable<T>(&mut self, scope: &VarScope, spec: VarSpec<T>) -> Result<VarId, Error>
    where
        T: HasShape + Send + Sync + 'static,
    {
        getter::get_variable(self, scope, spec, false)
    }

    /// Gets or creates a *local* variable (TensorFlow's
    /// `get_local_variable`): as [`get_variable`](Self::get_variable), but the
    /// variable is never trainable and joins [`LOCAL_VARIABLES`] (after the
    /// spec's collections, if any) instead of [`GLOBAL_VARIABLES`].
    /// Same cost as `get_variable`: O(depth) plus the
    /// initializer on create.
    ///
    /// # Errors
    /// As [`get_variable`](Self::get_variable).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let step = store.get_local_variable(&root, VarSpec::new("step").initializer(Initializer::constant(0_u64)))?;
    /// assert_eq!(store.local_variables(None)?, [("step".to_string(), step)]);
    /// assert!(store.trainable_variables(None)?.is_empty());
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn get_local_variable<T>(
        &mut self,
        scope: &VarScope,
        spec: VarSpec<T>,
    ) -> Result<VarId, Error>
    where
        T: HasShape + Send + Sync + 'static,
    {
        getter::get_variable(self, scope, spec, true)
    }

    /// Creates the variable `leaf` in `place` holding `payload`. O(1).
    pub(crate) fn create_var_with(
        &mut self,
        place: ScopeKey,
        leaf: impl crate::Name,
        payload: Box<dyn Payload>,
    ) -> Result<VarId, Error> {
        let var = self.tree.create_var(self.tree.scope_id(place), leaf)?;
        self.tree.var_slot_mut(var)?.value = Some(payload);
        Ok(var)
    }

    /// The metadata of a variable the store created, if `var` is live. O(1).
    pub(crate) fn var_meta(&self, var: VarKey) -> Option<&VarMeta> {
        self.var_meta.get(var)
    }

    /// The creation number the next new variable gets. O(1).
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Records a variable the true getter just created at `full`: journal,
    /// collections, metadata and, if `full` is given, the full-name index.
    /// O(collections × number of collections).
    pub(crate) fn record_new_var(
        &mut self,
        var: VarKey,
        full: Option<Arc<str>>,
        collections: &[String],
        meta: (Shape, bool, TypeId, &'static str),
    ) {
        self.journal.created(Undo::NewVar(var));
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut joined = 0;
        for (i, c) in collections.iter().enumerate() {
            if !collections[..i].contains(c) {
                joined += 1;
                self.collections.push(c, seq, var);
            }
        }
        if let Some(full) = &full {
            self.names.insert(&self.tree, Arc::clone(full), var);
        }
        let (shape, trainable, type_id, type_name) = meta;
        self.var_meta.insert(
            var,
            VarMeta {
                shape,
                trainable,
                type_id,
                type_name,
                entries: joined,
                full,
            },
        );
    }

    /// The variable at the full name `name` whose components are separated
    /// by `sep` (`.` for candle names), walked without building a string
    /// from the deepest scope it shares with the last name
    /// [`get_or_make`](Self::get_or_make) walked; `None` if absent or if a
    /// component is empty or holds `/` (no tree name is empty or holds `/`,
    /// and a leading separator is caught here). O(len).
    #[cfg(feature = "candle")]
    pub(crate) fn find_sep(&self, name: &str, sep: u8) -> Option<VarId> {
        let (dirs, leaf) = split_leaf(name, sep);
        if leading_sep(name, sep) {
            return None;
        }
        let from = self.prefixes.start(&self.tree, dirs, sep);
        let (k, at, _) = self.walk_sep(from.key, dirs, from.done, sep, |_, _| ());
        if at < dirs.len() {
            return None;
        }
        let v = self.tree.local_var_named(k, leaf)?;
        Some(self.tree.var_id(v))
    }

    /// Walks the scope path `dirs` down from `key`, the scope of its first
    /// `done` bytes, as far as its scopes exist, calling `level` with the
    /// end of each component found and its scope. Returns the deepest scope
    /// reached, the length of its path in `dirs` and, if the walk stopped
    /// at a component whose name the tree holds, that name's symbol (so that
    /// a caller creating the scope need not hash it again). O(len).
    #[cfg(feature = "candle")]
    fn walk_sep(
        &self,
        mut key: ScopeKey,
        dirs: &str,
        mut done: usize,
        sep: u8,
        mut level: impl FnMut(usize, ScopeKey),
    ) -> (ScopeKey, usize, Option<Sym>) {
        while done < dirs.len() {
            let (begin, end) = next_component(dirs, done, sep);
            let Some(sym) = self.tree.sym_of(&dirs[begin..end]) else {
                return (key, done, None);
            };
            let Some(kid) = self.tree.kid_key(key, sym) else {
                return (key, done, Some(sym));
            };
            level(end, kid);
            (key, done) = (kid, end);
        }
        (key, done, None)
    }

    /// Get-or-create at the full name `name` (components separated by
    /// `sep`) from the root, walking it once (the candle store's `get`): the
    /// variable if one exists there, else a new one holding
    /// `make(leaf, scope path)`'s value, with the missing scopes, recorded as
    /// `get_variable` records a trainable variable (`collections`, its
    /// shape), except in the full-name index: the candle store finds its
    /// variables by this walk, so a `/`-joined copy of every name would be
    /// built for nothing. `make` runs before anything is created,
    /// so its failure changes nothing. Returns the variable and whether it
    /// was created. O(len) plus `make`.
    ///
    /// The walk starts at the deepest scope the name shares with the last
    /// one walked (see [`Prefixes`]): a model's names come in runs
    /// (`h.3.attn.q.weight`, `h.3.attn.q.bias`, `h.3.attn.k.weight`), so
    /// most walks take one step.
    ///
    /// A name with an empty component or a `/` is never found (no tree
    /// name is empty or holds `/`, and a leading separator is caught here),
    /// so the caller can leave its name check to `make`, the path that
    /// creates.
    #[cfg(feature = "candle")]
    pub(crate) fn get_or_make<T, E>(
        &mut self,
        name: &str,
        sep: u8,
        collections: &[String],
        make: impl FnOnce(&str, &str) -> Result<T, E>,
    ) -> Result<(VarId, bool), E>
    where
        T: HasShape + Send + Sync + 'static,
        E: From<Error>,
    {
        let (dirs, leaf) = split_leaf(name, sep);
        let from = self.prefixes.start(&self.tree, dirs, sep);
        let mut levels: SmallVec<[(usize, ScopeKey); 8]> = SmallVec::new();
        let (mut k, at, mut next_sym) =
            self.walk_sep(from.key, dirs, from.done, sep, |end, key| {
                levels.push((end, key));
            });
        // The symbols of the first missing scope and of the leaf, when the
        // tree holds those names: creating with them hashes no text again.
        let mut leaf_sym = None;
        if at == dirs.len() && !leading_sep(name, sep) {
            // By symbol, not by a text scan: a model's build mostly misses
            // here, and the create that follows reuses the symbol.
            leaf_sym = self.tree.sym_of(leaf);
            let v = leaf_sym.and_then(|s| self.tree.local_var_key(k, s));
            if !dirs.is_empty() {
                self.prefixes.record(&self.tree, dirs, sep, from, &levels);
            }
            if let Some(v) = v {
                return Ok((self.tree.var_id(v), false));
            }
        }
        let value = make(leaf, dirs)?;
        let shape = value.shape();
        let mut first_new: Option<ScopeKey> = None;
        let created = (|| -> Result<VarId, Error> {
            let mut done = at;
            while done < dirs.len() {
                let (begin, end) = next_component(dirs, done, sep);
                let name = self.name_ref(next_sym.take(), &dirs[begin..end]);
                k = self.tree.new_named_scope(self.tree.scope_id(k), name)?.key;
                first_new.get_or_insert(k);
                levels.push((end, k));
                done = end;
            }
            let name = self.name_ref(leaf_sym, leaf);
            self.create_var_with(k, name, Box::new(value))
        })();
        let var = match created {
            Ok(v) => v,
            Err(e) => {
                if let Some(s) = first_new {
                    let _ = self.tree.delete_scope(self.tree.scope_id(s));
                }
                return Err(e.into());
            }
        };
        if first_new.is_some() {
            self.prefixes.record(&self.tree, dirs, sep, from, &levels);
        }
        self.record_new_var(
            var.key,
            None,
            collections,
            (shape, true, TypeId::of::<T>(), std::any::type_name::<T>()),
        );
        Ok((var, true))
    }

    /// The name `text` as its symbol `sym` when the walk found one (so
    /// that creating with it hashes no text again), else as text. O(1).
    #[cfg(feature = "candle")]
    fn name_ref<'a>(&self, sym: Option<Sym>, text: &'a str) -> crate::NameRef<'a> {
        match sym {
            Some(sym) => crate::NameRef::Sym(self.tree.symbol_of(sym)),
            None => crate::NameRef::Str(text),
        }
    }

    /// Records a tree variable made outside `get_variable` (a checkpoint
    /// load's `create`) as the candle store's `get` records the variables
    /// it makes: metadata, [`GLOBAL_VARIABLES`] and, when `trainable`,
    /// [`TRAINABLE_VARIABLES`], not the full-name index. A variable the
    /// store already knows is left as it is. O(collections).
    #[cfg(feature = "candle")]
    pub(crate) fn adopt(&mut self, var: VarId, shape: Shape, trainable: bool) -> Result<(), Error> {
        self.tree.var_slot(var)?;
        if self.var_meta.contains_key(var.key) {
            return Ok(());
        }
        if self.tree.var_place(var.key).is_none() {
            return Ok(());
        }
        let type_id = self
            .tree
            .value_type_id(var.key)
            .unwrap_or(TypeId::of::<()>());
        let type_name = self.tree.type_name(var)?.unwrap_or("()");
        let mut collections = vec![GLOBAL_VARIABLES.to_owned()];
        if trainable {
            collections.push(TRAINABLE_VARIABLES.to_owned());
        }
        self.record_new_var(
            var.key,
            None,
            &collections,
            (shape, trainable, type_id, type_name),
        );
        Ok(())
    }

    // ----- collections ------------------------------------------------------

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

    // ----- deletion -----------------------------------------------------------

    /// Deletes `scope` with its sub-scopes and variables (as
    /// [`ScopeTree::delete_scope`]) and frees their sharing metadata. Captured
    /// [`VarScope`]s and templates of the deleted scopes report stale from now
    /// on; their variables leave every collection. O(size of the subtree),
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

/// `name` split at its last `sep` (an ASCII byte) into the scope path and
/// the leaf; the path is empty for a name without `sep`. O(len).
#[cfg(feature = "candle")]
fn split_leaf(name: &str, sep: u8) -> (&str, &str) {
    debug_assert!(sep.is_ascii());
    match name.bytes().rposition(|b| b == sep) {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => ("", name),
    }
}

/// Whether `name` starts with `sep`: an empty first component, which
/// [`split_leaf`] would otherwise turn into a leaf at the root (`.w` into
/// `w`). O(1).
#[cfg(feature = "candle")]
fn leading_sep(name: &str, sep: u8) -> bool {
    name.as_bytes().first() == Some(&sep)
}

/// The component of the scope path `dirs` after its first `done` bytes
/// (0, or the end of a component): where it begins and ends. O(its length).
#[cfg(feature = "candle")]
fn next_component(dirs: &str, done: usize, sep: u8) -> (usize, usize) {
    let begin = if done == 0 { 0 } else { done + 1 };
    let end = find_byte(&dirs[begin..], sep).map_or(dirs.len(), |i| begin + i);
    (begin, end)
}

/// The first `b` (an ASCII byte) in `s`: a plain loop, cheaper than a
/// `char` search on the short components of a candle name. O(len).
#[cfg(feature = "candle")]
fn find_byte(s: &str, b: u8) -> Option<usize> {
    debug_assert!(b.is_ascii());
    s.bytes().position(|c| c == b)
}
