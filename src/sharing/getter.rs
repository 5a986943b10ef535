//! `get_variable`: the [`VarSpec`] a call gives, the custom-getter chain
//! ([`CustomGetter`], [`GetterArgs`], [`NextGetter`]) and the true getter with
//! TensorFlow's four cases.

use std::any::{Any, TypeId, type_name};
use std::fmt;
use std::sync::Arc;

use crate::arena::{ScopeId, ScopeKey, VarId, VarKey};
use crate::sharing::collections::{GLOBAL_VARIABLES, LOCAL_VARIABLES, TRAINABLE_VARIABLES};
use crate::sharing::error::Error;
use crate::sharing::init::{ErasedInit, InitKind, Initializer};
use crate::sharing::path::Path;
use crate::sharing::scope::{Reuse, VarScope};
use crate::sharing::shape::{HasShape, Shape};
use crate::sharing::store::VariableStore;
use crate::short;
use crate::tree::ScopeTree;

/// What one `get_variable` call asks for: the name (relative to the scope),
/// and optionally a shape, an initializer, the trainable flag, the
/// collections, a reuse mode for this call only, and a custom getter that
/// replaces the scope's chain for this call.
///
/// ```
/// use scopetree::sharing::{Initializer, VarSpec};
/// let spec = VarSpec::new("w")
///     .shape([2])
///     .initializer(Initializer::with_shape(|s: &[usize]| vec![0.0_f32; s[0]]))
///     .trainable(true);
/// assert_eq!(spec.name(), "w");
/// ```
pub struct VarSpec<T> {
    name: SpecName,
    shape: Option<Shape>,
    init: Option<Initializer<T>>,
    trainable: Option<bool>,
    collections: Option<Vec<String>>,
    reuse: Reuse,
    getter: Option<CustomGetter>,
}

impl<T> fmt::Debug for VarSpec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VarSpec")
            .field("name", &self.name.as_str())
            .field("shape", &self.shape)
            .field("initializer", &self.init)
            .field("trainable", &self.trainable)
            .field("collections", &self.collections)
            .field("reuse", &self.reuse)
            .field("custom_getter", &self.getter.is_some())
            .finish()
    }
}

impl<T> VarSpec<T> {
    /// A spec for the variable `name`, relative to the scope it is asked in
    /// (it may contain `/`: `"a/b"` is `b` in the sub-scope `a`). A name of
    /// up to 22 bytes is kept inline, so building a spec allocates nothing.
    /// O(len).
    ///
    /// ```
    /// use scopetree::sharing::VarSpec;
    /// assert_eq!(VarSpec::<f32>::new("v").name(), "v");
    /// assert_eq!(VarSpec::<f32>::new(format!("w{}", 3)).name(), "w3");
    /// ```
    pub fn new(name: impl AsRef<str>) -> Self {
        VarSpec {
            name: SpecName::new(name.as_ref()),
            shape: None,
            init: None,
            trainable: None,
            collections: None,
            reuse: Reuse::Inherit,
            getter: None,
        }
    }

    /// The name asked for. O(1).
    ///
    /// ```
    /// use scopetree::sharing::VarSpec;
    /// assert_eq!(VarSpec::<u8>::new("b").name(), "b");
    /// ```
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The expected shape: checked against the held value on reuse and
    /// against the initializer's value on create, and passed to a
    /// shape-taking initializer. Without it the shape is unknown and matches
    /// anything. O(rank).
    ///
    /// ```
    /// use scopetree::sharing::{Shape, VarSpec};
    /// let spec = VarSpec::<Vec<f32>>::new("v").shape(Shape::from_dims([None]));
    /// # let _ = spec;
    /// ```
    pub fn shape(mut self, shape: impl Into<Shape>) -> Self {
        self.shape = Some(shape.into());
        self
    }

    /// The initializer, used only if the variable is created; it wins over
    /// the scope's default for `T`. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VarSpec};
    /// let spec = VarSpec::new("v").initializer(Initializer::constant(0_u32));
    /// # let _ = spec;
    /// ```
    pub fn initializer(mut self, init: Initializer<T>) -> Self {
        self.init = Some(init);
        self
    }

    /// Whether a created variable is trainable (added to
    /// [`TRAINABLE_VARIABLES`]); wins over the scope default; without either,
    /// `true`. O(1).
    ///
    /// ```
    /// use scopetree::sharing::VarSpec;
    /// let spec = VarSpec::<f32>::new("step").trainable(false);
    /// # let _ = spec;
    /// ```
    pub fn trainable(mut self, trainable: bool) -> Self {
        self.trainable = Some(trainable);
        self
    }

    /// The collections a created variable joins, replacing the default
    /// [`GLOBAL_VARIABLES`] (as in TensorFlow); a trainable variable also joins
    /// [`TRAINABLE_VARIABLES`]. O(number of collections).
    ///
    /// ```
    /// use scopetree::sharing::VarSpec;
    /// let spec = VarSpec::<f32>::new("v").collections(["variables", "mine"]);
    /// # let _ = spec;
    /// ```
    pub fn collections<S: Into<String>>(
        mut self,
        collections: impl IntoIterator<Item = S>,
    ) -> Self {
        self.collections = Some(collections.into_iter().map(Into::into).collect());
        self
    }

    /// A reuse mode for this call only (TensorFlow's `reuse=` argument of
    /// `get_variable`); `Inherit` (the default) takes the scope's. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Reuse, VarSpec};
    /// let spec = VarSpec::<f32>::new("v").reuse(Reuse::AutoReuse);
    /// # let _ = spec;
    /// ```
    pub fn reuse(mut self, reuse: Reuse) -> Self {
        self.reuse = reuse;
        self
    }

    /// A custom getter for this call only: it *replaces* the scope's chain
    /// (as TensorFlow's `custom_getter=` argument does). O(1).
    ///
    /// ```
    /// use scopetree::sharing::{CustomGetter, VarSpec};
    /// let spec = VarSpec::<f32>::new("v").custom_getter(CustomGetter::new(|s, a, next| next.get(s, a)));
    /// # let _ = spec;
    /// ```
    pub fn custom_getter(mut self, getter: CustomGetter) -> Self {
        self.getter = Some(getter);
        self
    }
}

/// The name of a [`VarSpec`]: inline up to [`SpecName::INLINE`] bytes.
#[derive(Clone)]
enum SpecName {
    Inline {
        len: u8,
        bytes: [u8; SpecName::INLINE],
    },
    Heap(Box<str>),
}

impl SpecName {
    const INLINE: usize = 22;

    fn new(name: &str) -> Self {
        match u8::try_from(name.len()) {
            Ok(len) if name.len() <= Self::INLINE => {
                let mut bytes = [0; Self::INLINE];
                bytes[..name.len()].copy_from_slice(name.as_bytes());
                SpecName::Inline { len, bytes }
            }
            _ => SpecName::Heap(name.into()),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            SpecName::Inline { len, bytes } => std::str::from_utf8(&bytes[..usize::from(*len)])
                .expect("an inline spec name is copied whole from a `str`"),
            SpecName::Heap(s) => s,
        }
    }
}

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
    shape_of: fn(&ScopeTree, VarId) -> Option<Shape>,
    holds: fn(&ScopeTree, VarId) -> bool,
}

fn shape_of<T: HasShape + Any>(tree: &ScopeTree, var: VarId) -> Option<Shape> {
    tree.get::<T>(var).ok().map(HasShape::shape)
}

fn holds<T: Any>(tree: &ScopeTree, var: VarId) -> bool {
    tree.is::<T>(var).unwrap_or(false)
}

impl TypeInfo {
    fn of<T: HasShape + Any>() -> Self {
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
}

impl fmt::Debug for NextGetter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NextGetter({} left)", self.rest.len())
    }
}

impl NextGetter<'_> {
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
                store.guarded(|store| getter(store, args, NextGetter { rest }))
            }
            None => true_getter(store, args),
        }
    }
}

/// `get_variable` and `get_local_variable`: the fast path for an existing
/// variable without custom getters (no string is built), else the getter
/// chain down to [`true_getter`].
pub(crate) fn get_variable<T>(
    store: &mut VariableStore,
    scope: &VarScope,
    spec: VarSpec<T>,
    local: bool,
) -> Result<VarId, Error>
where
    T: HasShape + Send + Sync + 'static,
{
    let base = store.tree().check_scope(scope.place)?;
    // A '/' is fine in the name: it names a sub-scope.
    let path = Path::parse(spec.name.as_str())?;
    let reuse = spec.reuse.or(scope.reuse);
    if spec.getter.is_none() && scope.getters.is_empty() {
        let (dirs, leaf) = path.split_leaf();
        if let Some(var) = store.locate(base, dirs, leaf) {
            if spec.shape.is_some() {
                let kind = match &spec.init {
                    Some(i) => Some(i.kind()),
                    None => scope.initializer::<T>().map(Initializer::kind),
                };
                if kind == Some(InitKind::Constant) {
                    let owner = store.tree().owner_of(var).unwrap_or(base);
                    return Err(constant_with_shape(store.tree(), leaf, owner));
                }
            }
            return check_share(store, var, reuse, &TypeInfo::of::<T>(), spec.shape.as_ref());
        }
    }
    let name = crate::sharing::path::join(&scope.name, path.as_str());
    let init = spec
        .init
        .as_ref()
        .or_else(|| scope.initializer::<T>())
        .map(Initializer::erase);
    let (trainable, collections) = if local {
        let mut c = spec.collections.unwrap_or_default();
        c.push(LOCAL_VARIABLES.to_owned());
        (false, c)
    } else {
        let trainable = spec.trainable.or(scope.trainable).unwrap_or(true);
        let mut c = spec
            .collections
            .unwrap_or_else(|| vec![GLOBAL_VARIABLES.to_owned()]);
        if trainable && !c.iter().any(|c| c == TRAINABLE_VARIABLES) {
            c.push(TRAINABLE_VARIABLES.to_owned());
        }
        (trainable, c)
    };
    let args = GetterArgs {
        name,
        shape: spec.shape,
        trainable,
        reuse,
        collections,
        ty: TypeInfo::of::<T>(),
        init,
        base: (scope.place, Arc::clone(&scope.name)),
    };
    let rest = match &spec.getter {
        Some(g) => std::slice::from_ref(g),
        None => &scope.getters[..],
    };
    NextGetter { rest }.get(store, args)
}

fn constant_with_shape(tree: &ScopeTree, leaf: &str, owner: ScopeKey) -> Error {
    Error::ConstantWithShape {
        name: short::name(leaf),
        scope: short::path(&tree.path_of(owner)),
    }
}

/// Where the true getter looks: the scope to start from, and the path of
/// the variable relative to it.
fn locate_start<'a>(
    store: &VariableStore,
    args: &GetterArgs,
    path: Path<'a>,
) -> (ScopeKey, Path<'a>) {
    let (base, base_name) = (&args.base.0, &*args.base.1);
    let base_live = store.tree().contains_scope(*base);
    if base_live && base_name.is_empty() {
        return (base.key, path);
    }
    match path.strip_base(base_name) {
        Some(rel) if base_live => (base.key, rel),
        _ => (store.tree().root_key(), path),
    }
}

/// The end of every getter chain: TensorFlow's `_true_getter` /
/// `_get_single_variable`: locate, then share or create.
pub(crate) fn true_getter(store: &mut VariableStore, args: GetterArgs) -> Result<VarId, Error> {
    let path = Path::parse(&args.name)?;
    let (start, rel) = locate_start(store, &args, path);
    let (dirs, leaf) = rel.split_leaf();
    let scope_path = || path.split_leaf().0.map_or("", Path::as_str);
    if let Some(init) = &args.init {
        if init.kind == InitKind::Constant && args.shape.is_some() {
            return Err(Error::ConstantWithShape {
                name: short::name(leaf),
                scope: short::path(scope_path()),
            });
        }
    }
    match store.locate(start, dirs, leaf) {
        Some(var) => check_share(store, var, args.reuse, &args.ty, args.shape.as_ref()),
        None => create(store, &args, start, (dirs, leaf), scope_path()),
    }
}

/// Cases 1 and 2: the variable exists.
fn check_share(
    store: &VariableStore,
    var: VarKey,
    reuse: Reuse,
    ty: &TypeInfo,
    want: Option<&Shape>,
) -> Result<VarId, Error> {
    let tree = store.tree();
    let id = tree.var_id(var);
    let describe = || {
        let (owner, sym) = tree.var_place(var).unwrap_or((tree.root_key(), 0));
        (
            short::name(tree.sym_text(sym)),
            short::path(&tree.path_of(owner)),
        )
    };
    if reuse == Reuse::Inherit {
        let (name, scope) = describe();
        return Err(Error::VariableExists { name, scope });
    }
    let meta = || store.var_meta(var);
    let type_ok = (ty.holds)(tree, id) || {
        // Not a `T`: either another type, or no value (then the type it was
        // created with decides).
        tree.type_name(id)?.is_none() && meta().is_none_or(|m| m.type_id == ty.id)
    };
    if !type_ok {
        let held = tree.type_name(id)?;
        let (name, scope) = describe();
        return Err(Error::ShareTypeMismatch {
            name,
            scope,
            expected: ty.name,
            found: held.or(meta().map(|m| m.type_name)).unwrap_or("?"),
        });
    }
    if let Some(want) = want {
        let found = (ty.shape_of)(tree, id).or_else(|| meta().map(|m| m.shape.clone()));
        if let Some(found) = found {
            if !want.is_compatible_with(&found) {
                let (name, scope) = describe();
                return Err(Error::ShapeMismatch {
                    name,
                    scope,
                    expected: want.to_string(),
                    found: found.to_string(),
                });
            }
        }
    }
    Ok(id)
}

/// Cases 3 and 4: the variable is absent.
fn create(
    store: &mut VariableStore,
    args: &GetterArgs,
    start: ScopeKey,
    (dirs, leaf): (Option<Path<'_>>, &str),
    scope_path: &str,
) -> Result<VarId, Error> {
    if args.reuse == Reuse::Reuse {
        return Err(Error::VariableMissing {
            name: short::name(leaf),
            scope: short::path(scope_path),
        });
    }
    let Some(init) = &args.init else {
        return Err(Error::InitializerRequired {
            name: short::name(leaf),
            scope: short::path(scope_path),
            value_type: args.ty.name,
        });
    };
    let dims = match init.kind {
        InitKind::Shaped => match args.shape.as_ref().and_then(Shape::to_vec) {
            Some(d) => d,
            None => {
                return Err(Error::ShapeRequired {
                    name: short::name(leaf),
                    scope: short::path(scope_path),
                    shape: args
                        .shape
                        .as_ref()
                        .map_or_else(|| "unknown".to_owned(), ToString::to_string),
                });
            }
        },
        InitKind::Constant | InitKind::NoArgs => Vec::new(),
    };
    // The initializer runs before anything is created: if it panics, the
    // store is untouched.
    let (shape, payload) = (init.make)(&dims);
    if let Some(want) = &args.shape {
        if !want.is_compatible_with(&shape) {
            return Err(Error::InitShapeMismatch {
                name: short::name(leaf),
                scope: short::path(scope_path),
                expected: want.to_string(),
                found: shape.to_string(),
            });
        }
    }
    let place = store.resolve_or_create(start, dirs)?;
    let var = store.create_var_with(place, leaf, payload)?;
    let leaf_at = args.name.len() - leaf.len();
    store.record_new_var(
        var.key,
        place,
        &args.name,
        leaf_at,
        &args.collections,
        (shape, args.trainable, args.ty.id, args.ty.name),
    );
    Ok(var)
}
