//! Variable scopes as values: [`VarScope`] (TensorFlow's `VariableScope`
//! object) and the [`ScopeOpts`] a scope is entered with.

use std::any::TypeId;
use std::fmt;
use std::sync::Arc;

use crate::arena::ScopeId;
use crate::sharing::chain::CustomGetter;
use crate::sharing::init::{AnyInit, Initializer};
use crate::sharing::reuse::Reuse;

/// The options a scope is entered with; every field is optional and unset
/// fields are inherited (from the parent scope, or from the captured scope
/// when re-entering one).
///
/// `Reuse` converts into `ScopeOpts`, so `Reuse::Reuse` can stand where
/// `ScopeOpts` is taken.
///
/// ```
/// use scopetree::sharing::{Initializer, Reuse, ScopeOpts};
/// let opts = ScopeOpts::new()
///     .reuse(Reuse::AutoReuse)
///     .initializer(Initializer::constant(0.3_f32))
///     .trainable(false);
/// assert_eq!(opts.get_reuse(), Reuse::AutoReuse);
/// ```
#[derive(Clone, Default)]
pub struct ScopeOpts {
    pub(crate) reuse: Reuse,
    pub(crate) initializers: Vec<(TypeId, AnyInit)>,
    pub(crate) trainable: Option<bool>,
    pub(crate) getter: Option<CustomGetter>,
}

impl ScopeOpts {
    /// No options: inherit everything. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Reuse, ScopeOpts};
    /// assert_eq!(ScopeOpts::new().get_reuse(), Reuse::Inherit);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// The reuse mode to enter with (see [`Reuse`] for how it combines with
    /// the parent's). O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Reuse, ScopeOpts};
    /// assert_eq!(ScopeOpts::new().reuse(Reuse::Reuse).get_reuse(), Reuse::Reuse);
    /// ```
    pub fn reuse(mut self, reuse: Reuse) -> Self {
        self.reuse = reuse;
        self
    }

    /// The reuse mode these options ask for. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Reuse, ScopeOpts};
    /// assert_eq!(ScopeOpts::from(Reuse::AutoReuse).get_reuse(), Reuse::AutoReuse);
    /// ```
    pub fn get_reuse(&self) -> Reuse {
        self.reuse
    }

    /// The default initializer for variables of type `T` created in this
    /// scope and its sub-scopes (one per value type; a spec's own initializer
    /// wins). O(number of types set).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, ScopeOpts};
    /// let opts = ScopeOpts::new().initializer(Initializer::constant(1_u8));
    /// # let _ = opts;
    /// ```
    pub fn initializer<T: Send + Sync + 'static>(mut self, init: Initializer<T>) -> Self {
        set_init(&mut self.initializers, init);
        self
    }

    /// The default trainable flag for variables created in this scope and its
    /// sub-scopes (a spec's own flag wins; without either, `true`). O(1).
    ///
    /// ```
    /// use scopetree::sharing::ScopeOpts;
    /// let opts = ScopeOpts::new().trainable(false);
    /// # let _ = opts;
    /// ```
    pub fn trainable(mut self, trainable: bool) -> Self {
        self.trainable = Some(trainable);
        self
    }

    /// A custom getter for this scope. It wraps the getters the scope
    /// inherits: on each `get_variable` it runs first, and its `next` runs the
    /// inherited ones (innermost first, as TensorFlow chains them). O(1).
    ///
    /// ```
    /// use scopetree::sharing::{CustomGetter, ScopeOpts};
    /// let opts = ScopeOpts::new().custom_getter(CustomGetter::new(|store, args, next| next.get(store, args)));
    /// # let _ = opts;
    /// ```
    pub fn custom_getter(mut self, getter: CustomGetter) -> Self {
        self.getter = Some(getter);
        self
    }
}

impl From<Reuse> for ScopeOpts {
    fn from(reuse: Reuse) -> Self {
        ScopeOpts::new().reuse(reuse)
    }
}

impl fmt::Debug for ScopeOpts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopeOpts")
            .field("reuse", &self.reuse)
            .field("initializers", &self.initializers.len())
            .field("trainable", &self.trainable)
            .field("custom_getter", &self.getter.is_some())
            .finish()
    }
}

pub(crate) fn set_init<T: Send + Sync + 'static>(
    inits: &mut Vec<(TypeId, AnyInit)>,
    init: Initializer<T>,
) {
    let id = TypeId::of::<T>();
    let init: AnyInit = Arc::new(init);
    match inits.iter_mut().find(|(t, _)| *t == id) {
        Some(slot) => slot.1 = init,
        None => inits.push((id, init)),
    }
}

/// A variable scope: where `get_variable` puts and finds variables (a named
/// scope of the tree, with its full name), the reuse mode, and the defaults
/// (initializers per value type, trainable flag, custom getters).
///
/// This is TensorFlow 1's `VariableScope` object. You get one from
/// [`VariableStore::root_scope`](crate::sharing::VariableStore::root_scope) or
/// as the argument of a [`variable_scope`](crate::sharing::VariableStore::variable_scope)
/// closure. Clone it to capture it; re-enter a captured scope with
/// [`reenter_scope`](crate::sharing::VariableStore::reenter_scope) from
/// anywhere and it keeps its own full name and settings. It holds a
/// [`ScopeId`]: once that scope is deleted, every call given this `VarScope`
/// returns [`Tree`](crate::sharing::Error::Tree)([`StaleScope`](crate::Error::StaleScope)).
///
/// ```
/// use scopetree::sharing::{VariableStore, ScopeOpts};
/// let mut store = VariableStore::new();
/// let root = store.root_scope();
/// let tower = store.variable_scope(&root, "tower", ScopeOpts::new(), |_, vs| Ok(vs.clone()))?;
/// assert_eq!(tower.name(), "tower");
/// assert_eq!(store.tree().path(tower.place())?, "tower");
/// # Ok::<(), scopetree::sharing::Error>(())
/// ```
#[derive(Clone)]
pub struct VarScope {
    pub(crate) place: ScopeId,
    pub(crate) name: Arc<str>,
    pub(crate) reuse: Reuse,
    pub(crate) trainable: Option<bool>,
    pub(crate) initializers: Vec<(TypeId, AnyInit)>,
    /// Outermost first: the innermost (last) runs first.
    pub(crate) getters: Vec<CustomGetter>,
}

impl VarScope {
    pub(crate) fn root(place: ScopeId) -> Self {
        VarScope {
            place,
            name: Arc::from(""),
            reuse: Reuse::Inherit,
            trainable: None,
            initializers: Vec::new(),
            getters: Vec::new(),
        }
    }

    /// A scope at `place` named `name`, inheriting every setting of `self`.
    pub(crate) fn child(&self, place: ScopeId, name: &str, reuse: Reuse) -> Self {
        let full = if self.name.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.name)
        };
        VarScope {
            place,
            name: Arc::from(full),
            reuse,
            trainable: self.trainable,
            initializers: self.initializers.clone(),
            getters: self.getters.clone(),
        }
    }

    /// Applies entry options on top of inherited settings (not the reuse).
    pub(crate) fn apply(&mut self, opts: ScopeOpts) {
        for (id, init) in opts.initializers {
            match self.initializers.iter_mut().find(|(t, _)| *t == id) {
                Some(slot) => slot.1 = init,
                None => self.initializers.push((id, init)),
            }
        }
        if opts.trainable.is_some() {
            self.trainable = opts.trainable;
        }
        if let Some(g) = opts.getter {
            self.getters.push(g);
        }
    }

    /// The tree scope this variable scope names: variables it creates live
    /// there. O(1).
    ///
    /// ```
    /// use scopetree::sharing::VariableStore;
    /// let store = VariableStore::new();
    /// assert_eq!(store.root_scope().place(), store.tree().root());
    /// ```
    pub fn place(&self) -> ScopeId {
        self.place
    }

    /// The full name: scope names from the root joined by `/`; `""` for the
    /// root. A variable `v` created here is named `{name}/v`. O(1).
    ///
    /// ```
    /// use scopetree::sharing::VariableStore;
    /// assert_eq!(VariableStore::new().root_scope().name(), "");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The resolved reuse mode (see [`Reuse`]). O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Reuse, VariableStore};
    /// assert_eq!(VariableStore::new().root_scope().reuse(), Reuse::Inherit);
    /// ```
    pub fn reuse(&self) -> Reuse {
        self.reuse
    }

    /// Puts this scope in `Reuse` mode for good (TensorFlow's
    /// `scope.reuse_variables()`): later `get_variable` calls through it, and
    /// scopes entered from it afterwards, share and never create. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Reuse, VariableStore};
    /// let mut root = VariableStore::new().root_scope();
    /// root.reuse_variables();
    /// assert_eq!(root.reuse(), Reuse::Reuse);
    /// ```
    pub fn reuse_variables(&mut self) {
        self.reuse = Reuse::Reuse;
    }

    /// The default initializer for values of type `T`, if one is set. O(number
    /// of types set).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore};
    /// let mut root = VariableStore::new().root_scope();
    /// assert!(root.initializer::<f32>().is_none());
    /// root.set_initializer(Initializer::constant(0.3_f32));
    /// assert!(root.initializer::<f32>().is_some());
    /// ```
    pub fn initializer<T: Send + Sync + 'static>(&self) -> Option<&Initializer<T>> {
        let id = TypeId::of::<T>();
        self.initializers
            .iter()
            .find(|(t, _)| *t == id)
            .and_then(|(_, i)| i.downcast_ref::<Initializer<T>>())
    }

    /// Sets the default initializer for values of type `T` on this scope
    /// value (TensorFlow's `set_initializer`): later `get_variable` calls
    /// through it and scopes entered from it afterwards use it. O(number of
    /// types set).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore};
    /// let mut root = VariableStore::new().root_scope();
    /// root.set_initializer(Initializer::constant(1_i64));
    /// assert!(root.initializer::<i64>().is_some());
    /// ```
    pub fn set_initializer<T: Send + Sync + 'static>(&mut self, init: Initializer<T>) {
        set_init(&mut self.initializers, init);
    }

    /// The default trainable flag, if one is set. O(1).
    ///
    /// ```
    /// use scopetree::sharing::VariableStore;
    /// assert_eq!(VariableStore::new().root_scope().trainable(), None);
    /// ```
    pub fn trainable(&self) -> Option<bool> {
        self.trainable
    }

    /// Sets the default trainable flag on this scope value. O(1).
    ///
    /// ```
    /// use scopetree::sharing::VariableStore;
    /// let mut root = VariableStore::new().root_scope();
    /// root.set_trainable(false);
    /// assert_eq!(root.trainable(), Some(false));
    /// ```
    pub fn set_trainable(&mut self, trainable: bool) {
        self.trainable = Some(trainable);
    }

    /// Replaces the whole custom-getter chain of this scope value with one
    /// getter (TensorFlow's `set_custom_getter`), or clears it. O(chain).
    ///
    /// ```
    /// use scopetree::sharing::{CustomGetter, VariableStore};
    /// let mut root = VariableStore::new().root_scope();
    /// root.set_custom_getter(Some(CustomGetter::new(|s, a, next| next.get(s, a))));
    /// assert_eq!(root.custom_getter_count(), 1);
    /// ```
    pub fn set_custom_getter(&mut self, getter: Option<CustomGetter>) {
        self.getters.clear();
        self.getters.extend(getter);
    }

    /// How many custom getters run on each `get_variable` through this scope.
    /// O(1).
    ///
    /// ```
    /// use scopetree::sharing::VariableStore;
    /// assert_eq!(VariableStore::new().root_scope().custom_getter_count(), 0);
    /// ```
    pub fn custom_getter_count(&self) -> usize {
        self.getters.len()
    }
}

impl fmt::Debug for VarScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VarScope")
            .field("name", &self.name)
            .field("place", &self.place)
            .field("reuse", &self.reuse)
            .field("trainable", &self.trainable)
            .field("initializers", &self.initializers.len())
            .field("custom_getters", &self.getters.len())
            .finish()
    }
}
