//! [`Template`]: a closure that creates its variables on the first call and
//! reuses them on every later one (TensorFlow's `tf.make_template`).

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use crate::arena::VarId;
use crate::names::validate_name;
use crate::sharing::chain::CustomGetter;
use crate::sharing::collections::{GLOBAL_VARIABLES, LOCAL_VARIABLES, TRAINABLE_VARIABLES};
use crate::sharing::error::Error;
use crate::sharing::reuse::Reuse;
use crate::sharing::scope::{ScopeOpts, VarScope};
use crate::sharing::store::VariableStore;

/// How many created names a [`Error::TemplateCreatedVariable`] lists.
const SHOWN_NAMES: usize = 1;

/// A closure wrapped for variable sharing (TensorFlow's `tf.make_template`).
///
/// The first [`call`](Template::call) enters a new scope named after the
/// template, made unique where it is called (`fn`, then `fn_1` for a second
/// template of the same name), captures it, and runs the closure there, so its
/// `get_variable` calls create. Every later call re-enters the captured scope
/// in `Reuse` mode, wherever it is called from, so the same calls share the
/// variables of the first. A later call that creates a new trainable variable
/// fails with [`Error::TemplateCreatedVariable`]. A first call that fails
/// leaves the template uncalled (the captured scope is kept, as in
/// TensorFlow), so the next call creates again.
///
/// Arguments that TensorFlow binds with `**kwargs` are simply captured by the
/// closure; per-call arguments go through `call`'s `args`.
///
/// ```
/// use scopetree::sharing::{Initializer, ScopeOpts, Template, VariableStore, VarSpec};
/// let mut store = VariableStore::new();
/// let root = store.root_scope();
/// let mut linear = Template::new("linear", |store, vs, x: f32| {
///     let w = store.get_variable(vs, VarSpec::new("w").initializer(Initializer::constant(2.0_f32)))?;
///     Ok(*store.tree().get::<f32>(w)? * x)
/// })?;
/// let a = store.variable_scope(&root, "abc", ScopeOpts::new(), |s, vs| linear.call(s, vs, 1.0))?;
/// let b = store.variable_scope(&root, "def", ScopeOpts::new(), |s, vs| linear.call(s, vs, 3.0))?;
/// assert_eq!((a, b), (2.0, 6.0));
/// let names: Vec<_> = store.global_variables(None)?.into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["abc/linear/w"]); // created once, at the first call
/// # Ok::<(), scopetree::sharing::Error>(())
/// ```
pub struct Template<F> {
    name: String,
    unique_name: Option<String>,
    getter: Option<CustomGetter>,
    scope: Option<VarScope>,
    created: bool,
    func: F,
}

impl<F> fmt::Debug for Template<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Template")
            .field("name", &self.name)
            .field("unique_name", &self.unique_name)
            .field("scope", &self.scope.as_ref().map(VarScope::name))
            .field("variables_created", &self.created)
            .finish()
    }
}

impl<F> Template<F> {
    /// Wraps `func` as a template named `name`; the scope is made at the
    /// first call. O(len(name)).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`InvalidName`](crate::Error::InvalidName)) if `name` is empty or contains `/` (TensorFlow
    /// accepts `""` and then names variables `outer//v`; that is rejected here).
    ///
    /// ```
    /// use scopetree::sharing::{Template, VariableStore, VarScope};
    /// let t = Template::new("fn", |_: &mut VariableStore, _: &mut VarScope, (): ()| Ok(()))?;
    /// assert_eq!(t.name(), "fn");
    /// assert!(Template::new("", |_: &mut VariableStore, _: &mut VarScope, (): ()| Ok(())).is_err());
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn new<A, R>(name: &str, func: F) -> Result<Self, Error>
    where
        F: FnMut(&mut VariableStore, &mut VarScope, A) -> Result<R, Error>,
    {
        validate_name(name)?;
        Ok(Template {
            name: name.to_owned(),
            unique_name: None,
            getter: None,
            scope: None,
            created: false,
            func,
        })
    }

    /// Uses `unique_name` as the scope name as given, never made unique
    /// (TensorFlow's `unique_name_`): two templates with the same unique name
    /// share one scope, so the second one's first call fails with
    /// [`Error::VariableExists`] unless the calling scope reuses. Set it before
    /// the first call or [`create_scope_now`](Self::create_scope_now). O(1).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`InvalidName`](crate::Error::InvalidName)) if `unique_name` is empty or contains `/`.
    ///
    /// ```
    /// use scopetree::sharing::{Template, VariableStore, VarScope};
    /// let t = Template::new("fn", |_: &mut VariableStore, _: &mut VarScope, (): ()| Ok(()))?
    ///     .with_unique_name("s1")?;
    /// # let _ = t;
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn with_unique_name(mut self, unique_name: &str) -> Result<Self, Error> {
        validate_name(unique_name)?;
        self.unique_name = Some(unique_name.to_owned());
        Ok(self)
    }

    /// A custom getter for the template's scope (TensorFlow's
    /// `custom_getter_`): it runs on every `get_variable` inside every call.
    /// Set it before the first call or `create_scope_now`. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{CustomGetter, Template, VariableStore, VarScope};
    /// let t = Template::new("fn", |_: &mut VariableStore, _: &mut VarScope, (): ()| Ok(()))?
    ///     .with_custom_getter(CustomGetter::new(|s, a, next| next.get(s, a)));
    /// # let _ = t;
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn with_custom_getter(mut self, getter: CustomGetter) -> Self {
        self.getter = Some(getter);
        self
    }

    /// Makes and captures the template's scope now, under `current`
    /// (TensorFlow's `create_scope_now_=True`): the name is reserved here and
    /// every call, the first included, runs in this scope wherever it is
    /// called from. Does nothing if a scope is already captured. No variable
    /// is created until the first call. O(depth × tries) to pick the name.
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`StaleScope`](crate::Error::StaleScope)) or [`Tree`](Error::Tree)([`ForeignScope`](crate::Error::ForeignScope)) for `current`.
    ///
    /// ```
    /// use scopetree::sharing::{ScopeOpts, Template, VariableStore, VarScope};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let t = store.variable_scope(&root, "foo", ScopeOpts::new(), |s, vs| {
    ///     Template::new("bar", |_: &mut VariableStore, _: &mut VarScope, (): ()| Ok(()))?.create_scope_now(s, vs)
    /// })?;
    /// assert_eq!(t.variable_scope().map(|v| v.name()), Some("foo/bar"));
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn create_scope_now(
        mut self,
        store: &mut VariableStore,
        current: &VarScope,
    ) -> Result<Self, Error> {
        if self.scope.is_none() {
            let opts = self.opts();
            let captured = match &self.unique_name {
                Some(u) => store.variable_scope(current, u, opts, |_, vs| Ok(vs.clone()))?,
                None => store
                    .variable_scope_unique(current, &self.name, opts, |_, vs| Ok(vs.clone()))?,
            };
            self.scope = Some(captured);
        }
        Ok(self)
    }

    fn opts(&self) -> ScopeOpts {
        match &self.getter {
            Some(g) => ScopeOpts::new().custom_getter(g.clone()),
            None => ScopeOpts::new(),
        }
    }

    /// The name the template was made with. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Template, VariableStore, VarScope};
    /// let t = Template::new("mlp", |_: &mut VariableStore, _: &mut VarScope, (): ()| Ok(()))?;
    /// assert_eq!(t.name(), "mlp");
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The captured scope: `None` until the first call (or
    /// [`create_scope_now`](Self::create_scope_now)). O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Template, VariableStore, VarScope};
    /// let t = Template::new("mlp", |_: &mut VariableStore, _: &mut VarScope, (): ()| Ok(()))?;
    /// assert!(t.variable_scope().is_none());
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn variable_scope(&self) -> Option<&VarScope> {
        self.scope.as_ref()
    }

    /// Whether a call has completed, so later calls reuse. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Template, VariableStore, VarScope};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let mut t = Template::new("t", |_: &mut VariableStore, _: &mut VarScope, (): ()| Ok(()))?;
    /// assert!(!t.variables_created());
    /// t.call(&mut store, &root, ())?;
    /// assert!(t.variables_created());
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn variables_created(&self) -> bool {
        self.created
    }

    /// The captured scope, checked to be alive in `store`.
    fn live_scope(&self, store: &VariableStore) -> Result<Option<&VarScope>, Error> {
        match &self.scope {
            Some(vs) => match store.tree().check_scope(vs.place) {
                Ok(_) => Ok(Some(vs)),
                Err(crate::Error::StaleScope { scope }) => Err(Error::StaleTemplate {
                    template: crate::short::name(&self.name),
                    scope,
                }),
                Err(e) => Err(e.into()),
            },
            None => Ok(None),
        }
    }

    fn listed(&self, store: &VariableStore, key: &str) -> Result<Vec<(String, VarId)>, Error> {
        match self.live_scope(store)? {
            Some(vs) if self.created => store.scope_collection(vs, key),
            _ => Ok(Vec::new()),
        }
    }

    /// The template's [`GLOBAL_VARIABLES`] (under its scope), with full
    /// names; empty until a call completed. O(members × depth).
    ///
    /// # Errors
    /// [`Error::StaleTemplate`] if the captured scope was deleted;
    /// [`Tree`](Error::Tree)([`ForeignScope`](crate::Error::ForeignScope)) if `store` is not the template's store.
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, Template, VariableStore, VarScope, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let mut t = Template::new("t", |s: &mut VariableStore, vs: &mut VarScope, (): ()| {
    ///     s.get_variable(vs, VarSpec::new("w").initializer(Initializer::constant(0_u8)))
    /// })?;
    /// assert!(t.global_variables(&store)?.is_empty());
    /// t.call(&mut store, &root, ())?;
    /// assert_eq!(t.global_variables(&store)?[0].0, "t/w");
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn global_variables(&self, store: &VariableStore) -> Result<Vec<(String, VarId)>, Error> {
        self.listed(store, GLOBAL_VARIABLES)
    }

    /// The template's [`TRAINABLE_VARIABLES`]; empty until a call completed.
    /// O(members × depth).
    ///
    /// # Errors
    /// As [`global_variables`](Self::global_variables).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, Template, VariableStore, VarScope, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let mut t = Template::new("t", |s: &mut VariableStore, vs: &mut VarScope, (): ()| {
    ///     s.get_variable(vs, VarSpec::new("w").trainable(false).initializer(Initializer::constant(0_u8)))
    /// })?;
    /// t.call(&mut store, &root, ())?;
    /// assert!(t.trainable_variables(&store)?.is_empty());
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn trainable_variables(
        &self,
        store: &VariableStore,
    ) -> Result<Vec<(String, VarId)>, Error> {
        self.listed(store, TRAINABLE_VARIABLES)
    }

    /// The template's [`LOCAL_VARIABLES`]; empty until a call completed.
    /// O(members × depth).
    ///
    /// # Errors
    /// As [`global_variables`](Self::global_variables).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, Template, VariableStore, VarScope, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let mut t = Template::new("t", |s: &mut VariableStore, vs: &mut VarScope, (): ()| {
    ///     s.get_local_variable(vs, VarSpec::new("n").initializer(Initializer::constant(0_u8)))
    /// })?;
    /// t.call(&mut store, &root, ())?;
    /// assert_eq!(t.local_variables(&store)?.len(), 1);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn local_variables(&self, store: &VariableStore) -> Result<Vec<(String, VarId)>, Error> {
        self.listed(store, LOCAL_VARIABLES)
    }

    /// Global then local variables (TensorFlow's `Template.variables`).
    /// O(members × depth).
    ///
    /// # Errors
    /// As [`global_variables`](Self::global_variables).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, Template, VariableStore, VarScope, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let mut t = Template::new("t", |s: &mut VariableStore, vs: &mut VarScope, (): ()| {
    ///     s.get_variable(vs, VarSpec::new("w").initializer(Initializer::constant(0_u8)))?;
    ///     s.get_local_variable(vs, VarSpec::new("n").initializer(Initializer::constant(0_u8)))
    /// })?;
    /// t.call(&mut store, &root, ())?;
    /// assert_eq!(t.variables(&store)?.len(), 2);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn variables(&self, store: &VariableStore) -> Result<Vec<(String, VarId)>, Error> {
        let mut all = self.global_variables(store)?;
        all.extend(self.local_variables(store)?);
        Ok(all)
    }

    /// Global but not trainable variables (TensorFlow's
    /// `Template.non_trainable_variables`). O(members² ) in the worst case.
    ///
    /// # Errors
    /// As [`global_variables`](Self::global_variables).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, Template, VariableStore, VarScope, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let mut t = Template::new("t", |s: &mut VariableStore, vs: &mut VarScope, (): ()| {
    ///     s.get_variable(vs, VarSpec::new("w").trainable(false).initializer(Initializer::constant(0_u8)))
    /// })?;
    /// t.call(&mut store, &root, ())?;
    /// assert_eq!(t.non_trainable_variables(&store)?.len(), 1);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn non_trainable_variables(
        &self,
        store: &VariableStore,
    ) -> Result<Vec<(String, VarId)>, Error> {
        let trainable = self.trainable_variables(store)?;
        let mut global = self.global_variables(store)?;
        global.retain(|(_, v)| !trainable.iter().any(|(_, t)| t == v));
        Ok(global)
    }

    /// Calls the template with `args`, from the scope `current`.
    ///
    /// First call: enters the captured scope (if
    /// [`create_scope_now`](Self::create_scope_now) made one) with its own
    /// reuse mode, or else a new scope under `current` named after the
    /// template and made unique (or its unique name as given), with the
    /// template's custom getter, captures that scope, and runs `func` there.
    /// Later calls: re-enter the captured scope in `Reuse` mode, ignoring
    /// `current` and whatever scope settings it carries, run `func`, and check
    /// that it created no trainable variable.
    ///
    /// O(`func`) plus the cost of entering a scope; a later call also scans
    /// the trainable variables created during it.
    ///
    /// # Errors
    /// [`Error::StaleTemplate`] if the captured scope was deleted;
    /// [`Tree`](Error::Tree)([`ForeignScope`](crate::Error::ForeignScope)) for a scope of another store;
    /// [`Error::TemplateCreatedVariable`] if a later call created trainable
    /// variables (they stay in the store); the errors of entering a scope under
    /// `current`; and whatever `func` returns.
    ///
    /// # Panics
    /// If `func` panics, the panic is resumed after the store and the
    /// template are put back as they were before the call (the scope it
    /// would have captured, its variables, the default-name counters).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, Template, VariableStore, VarScope, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let mut t = Template::new("dense", |s: &mut VariableStore, vs: &mut VarScope, (): ()| {
    ///     s.get_variable(vs, VarSpec::new("w").initializer(Initializer::constant(1.0_f32)))
    /// })?;
    /// let first = t.call(&mut store, &root, ())?;
    /// assert_eq!(t.call(&mut store, &root, ())?, first);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn call<A, R>(
        &mut self,
        store: &mut VariableStore,
        current: &VarScope,
        args: A,
    ) -> Result<R, Error>
    where
        F: FnMut(&mut VariableStore, &mut VarScope, A) -> Result<R, Error>,
    {
        // The store undoes its own state if `func` panics; the template puts
        // back the scope it captured and its `created` flag.
        let (scope, created) = (self.scope.clone(), self.created);
        match catch_unwind(AssertUnwindSafe(|| self.call_inner(store, current, args))) {
            Ok(out) => out,
            Err(payload) => {
                self.scope = scope;
                self.created = created;
                resume_unwind(payload)
            }
        }
    }

    fn call_inner<A, R>(
        &mut self,
        store: &mut VariableStore,
        current: &VarScope,
        args: A,
    ) -> Result<R, Error>
    where
        F: FnMut(&mut VariableStore, &mut VarScope, A) -> Result<R, Error>,
    {
        if let Some(captured) = self.live_scope(store)?.cloned() {
            let reuse = if self.created {
                Reuse::Reuse
            } else {
                Reuse::Inherit
            };
            return store.reenter_scope(&captured, reuse, |s, vs| self.call_func(s, vs, args));
        }
        let opts = self.opts();
        let (unique, name) = (self.unique_name.clone(), self.name.clone());
        let run = |s: &mut VariableStore, vs: &mut VarScope| {
            self.scope = Some(vs.clone());
            self.call_func(s, vs, args)
        };
        match unique {
            Some(u) => store.variable_scope(current, &u, opts, run),
            None => store.variable_scope_unique(current, &name, opts, run),
        }
    }

    fn call_func<A, R>(
        &mut self,
        store: &mut VariableStore,
        vs: &mut VarScope,
        args: A,
    ) -> Result<R, Error>
    where
        F: FnMut(&mut VariableStore, &mut VarScope, A) -> Result<R, Error>,
    {
        if !self.created {
            let out = (self.func)(store, vs, args)?;
            self.created = true;
            return Ok(out);
        }
        let since = store.next_seq();
        let out = (self.func)(store, vs, args)?;
        let created = store.joined_since(TRAINABLE_VARIABLES, since);
        if !created.is_empty() {
            // The message lists the names: keep it short whatever they are.
            let mut names: Vec<String> = created
                .iter()
                .take(SHOWN_NAMES)
                .map(|n| crate::short::path(n))
                .collect();
            if created.len() > SHOWN_NAMES {
                names.push(format!("… and {} more", created.len() - SHOWN_NAMES));
            }
            return Err(Error::TemplateCreatedVariable {
                template: crate::short::name(&self.name),
                scope: crate::short::path(vs.name()),
                names,
            });
        }
        Ok(out)
    }
}
