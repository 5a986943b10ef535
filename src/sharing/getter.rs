//! `get_variable`: [`VariableStore::get_variable`] and
//! `get_local_variable`, the common reuse answered inline, and the true
//! getter with TensorFlow's four cases at the end of the custom-getter chain
//! (`chain.rs`). What a call asks for is a [`VarSpec`] (`spec.rs`).

use std::sync::Arc;

use crate::arena::{ScopeKey, TextFind, VarId, VarKey};
use crate::sharing::chain::{GetterArgs, NextGetter, TypeInfo};
use crate::sharing::collections::{GLOBAL_VARIABLES, LOCAL_VARIABLES, TRAINABLE_VARIABLES};
use crate::sharing::error::Error;
use crate::sharing::init::{InitKind, Initializer};
use crate::sharing::path::Path;
use crate::sharing::reuse::Reuse;
use crate::sharing::scope::VarScope;
use crate::sharing::shape::{HasShape, Shape};
use crate::sharing::spec::{Rare, VarSpec};
use crate::sharing::store::VariableStore;
use crate::short;
use crate::tree::ScopeTree;

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
            // call (callgrind, `benches/probes/probe_get_variable.rs`, run as `--example probe_get_variable`).
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
