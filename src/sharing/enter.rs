//! Entering variable scopes: [`VariableStore::root_scope`],
//! [`variable_scope`](VariableStore::variable_scope) (a named scope),
//! [`variable_scope_unique`](VariableStore::variable_scope_unique) (a
//! default-named one, counted by `counts.rs`) and
//! [`reenter_scope`](VariableStore::reenter_scope) (a captured one).

use crate::arena::ScopeKey;
use crate::names::validate_name;
use crate::sharing::error::Error;
use crate::sharing::path::Path;
use crate::sharing::reuse::Reuse;
use crate::sharing::scope::{ScopeOpts, VarScope};
use crate::sharing::store::VariableStore;

impl VariableStore {
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
}
