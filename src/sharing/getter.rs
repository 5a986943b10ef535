//! `get_variable`: the [`VarSpec`] a call gives,
//! [`VariableStore::get_variable`] and `get_local_variable`, and the true
//! getter with TensorFlow's four cases at the end of the custom-getter chain
//! (`chain.rs`).

use std::fmt;
use std::sync::Arc;

use crate::arena::{ScopeKey, TextFind, VarId, VarKey};
use crate::sharing::chain::{CustomGetter, GetterArgs, NextGetter, TypeInfo};
use crate::sharing::collections::{GLOBAL_VARIABLES, LOCAL_VARIABLES, TRAINABLE_VARIABLES};
use crate::sharing::error::Error;
use crate::sharing::init::{InitKind, Initializer};
use crate::sharing::path::Path;
use crate::sharing::reuse::Reuse;
use crate::sharing::scope::VarScope;
use crate::sharing::shape::{HasShape, Shape};
use crate::sharing::store::VariableStore;
use crate::short;
use crate::tree::ScopeTree;

/// What one `get_variable` call asks for: the name (relative to the scope),
/// and optionally a shape, an initializer, the trainable flag, the
/// collections, a reuse mode for this call only, and a custom getter that
/// replaces the scope's chain for this call.
///
/// The name, reuse mode and shape are kept inline; the initializer, trainable
/// flag, collections and custom getter (rarely given on reuse) share one box,
/// allocated by the first of those builder calls, so a reuse spec is a few
/// words to build, pass and drop.
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
    reuse: Reuse,
    shape: Option<Shape>,
    /// The parts a reuse call rarely sets, boxed so that the common spec
    /// (name, reuse mode, maybe a shape) stays small to build, pass and drop.
    rare: Option<Box<Rare<T>>>,
}

/// The rarely set parts of a [`VarSpec`].
struct Rare<T> {
    init: Option<Initializer<T>>,
    trainable: Option<bool>,
    collections: Option<Vec<String>>,
    getter: Option<CustomGetter>,
}

impl<T> Default for Rare<T> {
    fn default() -> Self {
        Rare {
            init: None,
            trainable: None,
            collections: None,
            getter: None,
        }
    }
}

impl<T> fmt::Debug for VarSpec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rare = self.rare.as_deref();
        f.debug_struct("VarSpec")
            .field("name", &self.name.as_str())
            .field("shape", &self.shape)
            .field("initializer", &rare.and_then(|r| r.init.as_ref()))
            .field("trainable", &rare.and_then(|r| r.trainable))
            .field("collections", &rare.and_then(|r| r.collections.as_ref()))
            .field("reuse", &self.reuse)
            .field("custom_getter", &rare.is_some_and(|r| r.getter.is_some()))
            .finish()
    }
}

impl<T> VarSpec<T> {
    /// A spec for the variable `name`, relative to the scope it is asked in
    /// (it may contain `/`: `"a/b"` is `b` in the sub-scope `a`). A name of
    /// up to 23 bytes is kept inline, so building a spec allocates nothing.
    /// O(len).
    ///
    /// ```
    /// use scopetree::sharing::VarSpec;
    /// assert_eq!(VarSpec::<f32>::new("v").name(), "v");
    /// assert_eq!(VarSpec::<f32>::new(format!("w{}", 3)).name(), "w3");
    /// ```
    #[inline]
    pub fn new(name: impl AsRef<str>) -> Self {
        VarSpec {
            name: SpecName::new(name.as_ref()),
            reuse: Reuse::Inherit,
            shape: None,
            rare: None,
        }
    }

    /// The rarely set parts, boxed on first use (one allocation per spec).
    fn rare_mut(&mut self) -> &mut Rare<T> {
        self.rare.get_or_insert_with(Box::default)
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
        self.rare_mut().init = Some(init);
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
        self.rare_mut().trainable = Some(trainable);
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
        self.rare_mut().collections = Some(collections.into_iter().map(Into::into).collect());
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
        self.rare_mut().getter = Some(getter);
        self
    }
}

/// The name of a [`VarSpec`]: inline up to [`SpecName::INLINE`] bytes, in
/// one 24-byte image (the length, then the bytes, zero-padded), else on the
/// heap.
#[derive(Clone)]
struct SpecName {
    /// `image[0]` is the length of an inline name; the bytes follow.
    image: [u8; 24],
    /// A name longer than [`INLINE`](Self::INLINE) bytes.
    heap: Option<Box<str>>,
}

impl SpecName {
    const INLINE: usize = 23;

    #[inline]
    fn new(name: &str) -> Self {
        match u8::try_from(name.len()) {
            Ok(len) if name.len() <= Self::INLINE => SpecName {
                image: Self::image(len, name.as_bytes()),
                heap: None,
            },
            _ => SpecName {
                image: [0; 24],
                heap: Some(name.into()),
            },
        }
    }

    /// The image of an inline name `src` of `len` bytes. The bytes are
    /// gathered by overlapping fixed-size loads into integers and the image
    /// is stored as three 8-byte words: no call to `memcpy` of a variable
    /// length, and no narrow stores that the spec's later 8-byte moves would
    /// have to wait for. O(1).
    #[inline]
    fn image(len: u8, src: &[u8]) -> [u8; 24] {
        fn load<const N: usize>(s: &[u8], at: usize) -> [u8; N] {
            s.get(at..at + N)
                .and_then(|c| c.try_into().ok())
                .unwrap_or([0; N])
        }
        let n = src.len();
        let byte = |i: usize| u128::from(src.get(i).copied().unwrap_or(0)) << (8 * i);
        // Bytes 0..16 of the name, and bytes 16..23.
        let (lo, hi): (u128, u64) = match n {
            0 => (0, 0),
            1..=3 => (byte(0) | byte(n / 2) | byte(n - 1), 0),
            4..=7 => {
                let tail = u128::from(u32::from_le_bytes(load(src, n - 4)));
                (
                    u128::from(u32::from_le_bytes(load(src, 0))) | tail << (8 * (n - 4)),
                    0,
                )
            }
            8..=16 => {
                let tail = u128::from(u64::from_le_bytes(load(src, n - 8)));
                (
                    u128::from(u64::from_le_bytes(load(src, 0))) | tail << (8 * (n - 8)),
                    0,
                )
            }
            _ => {
                // The last eight bytes end at `n`; bytes 16.. are their top.
                let tail = u64::from_le_bytes(load(src, n - 8));
                (u128::from_le_bytes(load(src, 0)), tail >> (8 * (24 - n)))
            }
        };
        let w0 = u64::from(len) | (lo as u64) << 8;
        let w1 = (lo >> 56) as u64;
        let w2 = (lo >> 120) as u64 | hi << 8;
        let mut image = [0; 24];
        image[..8].copy_from_slice(&w0.to_le_bytes());
        image[8..16].copy_from_slice(&w1.to_le_bytes());
        image[16..].copy_from_slice(&w2.to_le_bytes());
        image
    }

    /// The name's bytes, without the UTF-8 check of [`as_str`](Self::as_str)
    /// (the bytes were copied whole from a `str`). O(1).
    #[inline]
    fn as_bytes(&self) -> &[u8] {
        match &self.heap {
            None => self
                .image
                .get(1..1 + usize::from(self.image[0]))
                .unwrap_or(&[]),
            Some(s) => s.as_bytes(),
        }
    }

    #[inline]
    fn as_str(&self) -> &str {
        match &self.heap {
            None => std::str::from_utf8(self.as_bytes())
                .expect("an inline spec name is copied whole from a `str`"),
            Some(s) => s,
        }
    }
}

impl VariableStore {
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
        get_variable(self, scope, spec, false)
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
        get_variable(self, scope, spec, true)
    }
}

/// `get_variable` and `get_local_variable`: the common reuse answered inline
/// ([`reuse_held`]: no string is hashed, parsed or built), else
/// [`get_or_create`].
#[inline]
pub(crate) fn get_variable<T>(
    store: &mut VariableStore,
    scope: &VarScope,
    spec: VarSpec<T>,
    local: bool,
) -> Result<VarId, Error>
where
    T: HasShape + Send + Sync + 'static,
{
    match reuse_held(store, scope, &spec) {
        Some(var) => {
            // What the spec may own on this path: its rare parts (an
            // initializer, collections) and a long name (`reuse_held`
            // answers only when no shape is asked for). Dropping these two
            // instead of the whole spec saves 15 of 199 instructions per
            // call (callgrind, `examples/probe_get_variable`).
            let VarSpec { name, rare, .. } = spec;
            if let Some(rare) = rare {
                drop(rare);
            }
            if let Some(name) = name.heap {
                drop(name);
            }
            Ok(var)
        }
        None => get_or_create(store, scope, spec, local),
    }
}

/// The most common call, answered before anything else: the variable is
/// held by the variable scope itself under a name that scope's few
/// variables are scanned for by text, it holds a `T`, no shape is asked for,
/// the reuse mode is set and no custom getter runs. Exactly what
/// [`get_or_create`] returns for such a call. O(1); `None` for any other
/// call, which `get_or_create` then answers in full.
#[inline]
fn reuse_held<T: 'static>(
    store: &VariableStore,
    scope: &VarScope,
    spec: &VarSpec<T>,
) -> Option<VarId> {
    let custom = spec.rare.as_deref().is_some_and(|r| r.getter.is_some());
    if custom
        || spec.shape.is_some()
        || !scope.getters.is_empty()
        || spec.reuse.or(scope.reuse) == Reuse::Inherit
        || scope.place.tree() != store.tree().tag()
    {
        return None;
    }
    let tree = store.tree();
    match tree.local_var_by_text(scope.place.key, spec.name.as_bytes()) {
        TextFind::Found(var) if tree.value_type_id(var) == Some(std::any::TypeId::of::<T>()) => {
            Some(tree.var_id(var))
        }
        _ => None,
    }
}

/// [`get_variable`] in full: the lookup of an existing variable for any
/// spec, then the getter chain down to [`true_getter`].
fn get_or_create<T>(
    store: &mut VariableStore,
    scope: &VarScope,
    spec: VarSpec<T>,
    local: bool,
) -> Result<VarId, Error>
where
    T: HasShape + Send + Sync + 'static,
{
    let base = store.tree().check_scope(scope.place)?;
    let text = spec.name.as_str();
    let reuse = spec.reuse.or(scope.reuse);
    let rare = spec.rare.as_deref();
    let own_getter = rare.and_then(|r| r.getter.as_ref());
    if own_getter.is_none() && scope.getters.is_empty() {
        // A name without '/' (the common case) is its own leaf: no parse.
        let found = if !text.is_empty() && !text.as_bytes().contains(&b'/') {
            store.locate(base, None, text).map(|v| (v, text))
        } else {
            let (dirs, leaf) = Path::parse(text)?.split_leaf();
            store.locate(base, dirs, leaf).map(|v| (v, leaf))
        };
        if let Some((var, leaf)) = found {
            if spec.shape.is_some() {
                let kind = match rare.and_then(|r| r.init.as_ref()) {
                    Some(i) => Some(i.kind()),
                    None => scope.initializer::<T>().map(Initializer::kind),
                };
                if kind == Some(InitKind::Constant) {
                    let owner = store.tree().owner_of(var).unwrap_or(base);
                    return Err(constant_with_shape(store.tree(), leaf, owner));
                }
            }
            // The common reuse, answered here: a `T` is held and no shape
            // is asked for (what `check_share` finds first, without its
            // type table and error set-up).
            if reuse != Reuse::Inherit
                && spec.shape.is_none()
                && store.tree().value_type_id(var) == Some(std::any::TypeId::of::<T>())
            {
                return Ok(store.tree().var_id(var));
            }
            return check_share(store, var, reuse, &TypeInfo::of::<T>(), spec.shape.as_ref());
        }
    }
    // A '/' is fine in the name: it names a sub-scope.
    let path = Path::parse(text)?;
    let name = crate::sharing::path::join(&scope.name, path.as_str());
    let VarSpec { shape, rare, .. } = spec;
    let Rare {
        init,
        trainable,
        collections,
        getter,
    } = rare.map(|r| *r).unwrap_or_default();
    let init = init
        .as_ref()
        .or_else(|| scope.initializer::<T>())
        .map(Initializer::erase);
    let (trainable, collections) = if local {
        let mut c = collections.unwrap_or_default();
        c.push(LOCAL_VARIABLES.to_owned());
        (false, c)
    } else {
        let trainable = trainable.or(scope.trainable).unwrap_or(true);
        let mut c = collections.unwrap_or_else(|| vec![GLOBAL_VARIABLES.to_owned()]);
        if trainable && !c.iter().any(|c| c == TRAINABLE_VARIABLES) {
            c.push(TRAINABLE_VARIABLES.to_owned());
        }
        (trainable, c)
    };
    let args = GetterArgs {
        name,
        shape,
        trainable,
        reuse,
        collections,
        ty: TypeInfo::of::<T>(),
        init,
        base: (scope.place, Arc::clone(&scope.name)),
    };
    let rest = match &getter {
        Some(g) => std::slice::from_ref(g),
        None => &scope.getters[..],
    };
    NextGetter::new(rest, true_getter).get(store, args)
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
    // The common case first: one slot read and a `TypeId` compare.
    let type_ok = tree.value_type_id(var) == Some(ty.id) || (ty.holds)(tree, id) || {
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
    let (shape, payload) = (init.make)(&dims).map_err(|source| Error::InitFailed {
        name: short::name(leaf),
        scope: short::path(scope_path),
        source,
    })?;
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
    store.record_new_var(
        var.key,
        Some(std::sync::Arc::from(args.name.as_str())),
        &args.collections,
        (shape, args.trainable, args.ty.id, args.ty.name),
    );
    Ok(var)
}

#[cfg(test)]
mod tests {
    use super::SpecName;

    /// An inline name keeps exactly its bytes, zero-padded, for every
    /// length that is kept inline (each branch of the chunked copy).
    #[test]
    fn inline_names_keep_their_bytes() {
        for n in 0..=SpecName::INLINE {
            let text: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
            let name = SpecName::new(&text);
            assert!(name.heap.is_none(), "len {n}");
            assert_eq!(name.as_str(), text);
            assert_eq!(name.as_bytes(), text.as_bytes());
            assert_eq!(usize::from(name.image[0]), n);
            assert!(
                name.image[1 + n..].iter().all(|&b| b == 0),
                "len {n}: padding"
            );
        }
        let long = "x".repeat(SpecName::INLINE + 1);
        assert_eq!(SpecName::new(&long).as_bytes(), long.as_bytes());
        assert_eq!(SpecName::new("\u{e9}t\u{e9}").as_str(), "\u{e9}t\u{e9}");
    }
}
