//! The custom-getter chain: [`CustomGetter`], the [`GetterArgs`] a getter
//! sees and the [`NextGetter`] it passes them on to. It does not know the
//! true getter (the end of the chain is a function the caller gives) nor
//! variable scopes, so `scope.rs` can hold getters without depending on
//! `getter.rs`.

use std::any::{Any, TypeId, type_name};
use std::fmt;
use std::sync::Arc;

use crate::arena::{ScopeId, VarId};
use crate::sharing::error::Error;
use crate::sharing::init::ErasedInit;
use crate::sharing::reuse::Reuse;
use crate::sharing::shape::{HasShape, Shape};
use crate::sharing::store::VariableStore;
use crate::tree::ScopeTree;

type GetterFn =
    dyn Fn(&mut VariableStore, GetterArgs, NextGetter<'_>) -> Result<VarId, Error> + Send + Sync;

/// A custom getter (TensorFlow's `custom_getter`): a closure that receives
/// the resolved arguments of a `get_variable` call and the next getter of the
/// chain, and returns a variable handle.
///
/// It runs on every `get_variable` through its scope, on create and on reuse.
/// It may change the arguments (the full name, the shape, the trainable
/// flag, ...) before calling `next`, call `next` several times to create
/// several variables, or not call it at all. Getters set on nested scopes
/// chain: the innermost runs first and its `next` is the next-outer getter,
/// down to the true getter.
///
/// ```
/// use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
/// use scopetree::sharing::{CustomGetter, Initializer, ScopeOpts, VariableStore, VarSpec};
/// let calls = Arc::new(AtomicUsize::new(0));
/// let seen = Arc::clone(&calls);
/// let counting = CustomGetter::new(move |store, args, next| {
///     seen.fetch_add(1, Ordering::Relaxed);
///     next.get(store, args)
/// });
/// let mut store = VariableStore::new();
/// let root = store.root_scope();
/// store.variable_scope(&root, "s", ScopeOpts::new().custom_getter(counting), |store, s| {
///     store.get_variable(s, VarSpec::new("v").initializer(Initializer::constant(1.0_f32)))
/// })?;
/// assert_eq!(calls.load(Ordering::Relaxed), 1);
/// # Ok::<(), scopetree::sharing::Error>(())
/// ```
#[derive(Clone)]
pub struct CustomGetter(Arc<GetterFn>);

impl CustomGetter {
    /// Wraps a closure as a custom getter. O(1).
    ///
    /// ```
    /// use scopetree::sharing::CustomGetter;
    /// let identity = CustomGetter::new(|store, args, next| next.get(store, args));
    /// # let _ = identity;
    /// ```
    pub fn new<F>(f: F) -> Self
    where
        F: Fn(&mut VariableStore, GetterArgs, NextGetter<'_>) -> Result<VarId, Error>
            + Send
            + Sync
            + 'static,
    {
        CustomGetter(Arc::new(f))
    }
}

impl fmt::Debug for CustomGetter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CustomGetter")
    }
}

/// How the true getter checks and reads a value of the requested type.
#[derive(Copy, Clone)]
pub(crate) struct TypeInfo {
    pub(crate) id: TypeId,
    pub(crate) name: &'static str,
    pub(crate) shape_of: fn(&ScopeTree, VarId) -> Option<Shape>,
    pub(crate) holds: fn(&ScopeTree, VarId) -> bool,
}

fn shape_of<T: HasShape + Any>(tree: &ScopeTree, var: VarId) -> Option<Shape> {
    tree.get::<T>(var).ok().map(HasShape::shape)
}

fn holds<T: Any>(tree: &ScopeTree, var: VarId) -> bool {
    tree.is::<T>(var).unwrap_or(false)
}

impl TypeInfo {
    pub(crate) fn of<T: HasShape + Any>() -> Self {
        TypeInfo {
            id: TypeId::of::<T>(),
            name: type_name::<T>(),
            shape_of: shape_of::<T>,
            holds: holds::<T>,
        }
    }
}

/// The resolved arguments of one `get_variable` call, as custom getters see
/// them (TensorFlow passes the same as keyword arguments). A getter may
/// change any public field before passing them on.
///
/// ```
/// use scopetree::sharing::{CustomGetter, Initializer, VariableStore, VarSpec};
/// // A getter that renames every variable it sees.
/// let rename = CustomGetter::new(|store, mut args, next| {
///     args.name.push_str("_renamed");
///     next.get(store, args)
/// });
/// let mut store = VariableStore::new();
/// let root = store.root_scope();
/// let v = store.get_variable(&root, VarSpec::new("v")
///     .initializer(Initializer::constant(1_u8)).custom_getter(rename))?;
/// assert_eq!(store.full_name(v)?, "v_renamed");
/// # Ok::<(), scopetree::sharing::Error>(())
/// ```
#[derive(Clone)]
pub struct GetterArgs {
    /// The full name: the scope's full name, `/`, the spec's name.
    pub name: String,
    /// The spec's shape (`None`: unknown).
    pub shape: Option<Shape>,
    /// The resolved trainable flag.
    pub trainable: bool,
    /// The resolved reuse mode (the spec's, else the scope's).
    pub reuse: Reuse,
    /// The collections a created variable joins.
    pub collections: Vec<String>,
    pub(crate) ty: TypeInfo,
    pub(crate) init: Option<ErasedInit>,
    /// The scope the call was made in: resolution starts there when the
    /// name still lies under it.
    pub(crate) base: (ScopeId, Arc<str>),
}

impl GetterArgs {
    /// The name of the value type the call asked for. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{CustomGetter, Initializer, VariableStore, VarSpec};
    /// let check = CustomGetter::new(|store, args, next| {
    ///     assert_eq!(args.value_type(), "f32");
    ///     next.get(store, args)
    /// });
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// store.get_variable(&root, VarSpec::new("v").initializer(Initializer::constant(1.0_f32)).custom_getter(check))?;
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn value_type(&self) -> &'static str {
        self.ty.name
    }

    /// Whether an initializer was resolved (from the spec or the scope). O(1).
    ///
    /// ```
    /// use scopetree::sharing::{CustomGetter, VariableStore, VarSpec};
    /// let check = CustomGetter::new(|store, args, next| {
    ///     assert!(!args.has_initializer());
    ///     next.get(store, args)
    /// });
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// assert!(store.get_variable::<f32>(&root, VarSpec::new("v").custom_getter(check)).is_err());
    /// ```
    pub fn has_initializer(&self) -> bool {
        self.init.is_some()
    }
}

impl fmt::Debug for GetterArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GetterArgs")
            .field("name", &self.name)
            .field("shape", &self.shape)
            .field("trainable", &self.trainable)
            .field("reuse", &self.reuse)
            .field("collections", &self.collections)
            .field("value_type", &self.ty.name)
            .field("has_initializer", &self.init.is_some())
            .finish()
    }
}

/// The rest of a custom-getter chain: calling [`get`](NextGetter::get) runs
/// the next-outer getter, or the true getter at the end of the chain. `Copy`,
/// so a getter may call it several times.
///
/// ```
/// use scopetree::sharing::{CustomGetter, Initializer, VariableStore, VarSpec};
/// // A getter that makes two variables `<name>/0` and `<name>/1` and returns the first.
/// let twice = CustomGetter::new(|store, args, next| {
///     let mut a = args.clone();
///     a.name.push_str("/0");
///     let first = next.get(store, a)?;
///     let mut b = args;
///     b.name.push_str("/1");
///     next.get(store, b)?;
///     Ok(first)
/// });
/// let mut store = VariableStore::new();
/// let root = store.root_scope();
/// store.get_variable(&root, VarSpec::new("v").initializer(Initializer::constant(0_i32)).custom_getter(twice))?;
/// assert_eq!(store.global_variables(None)?.len(), 2);
/// # Ok::<(), scopetree::sharing::Error>(())
/// ```
#[derive(Copy, Clone)]
pub struct NextGetter<'a> {
    rest: &'a [CustomGetter],
    end: EndFn,
}

/// The end of every chain: the true getter.
pub(crate) type EndFn = fn(&mut VariableStore, GetterArgs) -> Result<VarId, Error>;

impl fmt::Debug for NextGetter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NextGetter({} left)", self.rest.len())
    }
}

impl<'a> NextGetter<'a> {
    /// The chain `rest` (run last to first), ending in `end`. O(1).
    pub(crate) fn new(rest: &'a [CustomGetter], end: EndFn) -> Self {
        NextGetter { rest, end }
    }

    /// Runs the rest of the chain with `args`. O(the getters it runs) plus
    /// the true getter's cost (see
    /// [`get_variable`](VariableStore::get_variable)).
    ///
    /// # Errors
    /// Whatever the next getter returns; the true getter's errors are listed
    /// on [`get_variable`](VariableStore::get_variable).
    ///
    /// ```
    /// use scopetree::sharing::CustomGetter;
    /// let pass_through = CustomGetter::new(|store, args, next| next.get(store, args));
    /// # let _ = pass_through;
    /// ```
    pub fn get(self, store: &mut VariableStore, args: GetterArgs) -> Result<VarId, Error> {
        match self.rest.split_last() {
            Some((getter, rest)) => {
                let getter = &getter.0;
                let next = NextGetter {
                    rest,
                    end: self.end,
                };
                store.guarded(|store| getter(store, args, next))
            }
            None => (self.end)(store, args),
        }
    }
}
