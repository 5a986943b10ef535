//! Model test of the sharing layer (`VariableStore`): random programs of
//! `variable_scope`, `variable_scope_unique`, `reenter_scope`,
//! `reuse_variables`, `get_variable` / `get_local_variable` with every reuse
//! mode, shape and initializer kind, value changes through `tree_mut`,
//! `delete_scope` (on the store and behind its back on the tree), templates
//! and collection queries, against a plain model keyed by full names
//! (`HashMap<String, _>`).
//!
//! Checked: the exact result of every call (the handle, or the error variant
//! with its fields); after every call, which full names exist, that
//! `variable(full_name)` and `full_name(v)` round-trip, the initial shape and
//! trainable flag, every collection in creation order, prefix queries on
//! whole path components, and that every handle and captured scope of a
//! deleted scope is stale in both the store and the tree. Default-name
//! counting itself is `tests/sharing_model.rs`'s job: here the unique name a
//! scope gets is read back and only checked to have the `name` / `name_N`
//! form. `PROPTEST_CASES` sets the number of cases; by default each
//! property runs a quarter of its cases in debug (the README's `cargo test`)
//! and all of them in release (CI's release step).

use std::any::type_name;
use std::collections::HashMap;

use proptest::prelude::*;
use scopetree::sharing::{
    self, CustomGetter, GLOBAL_VARIABLES, HasShape, Initializer, LOCAL_VARIABLES, Reuse, ScopeOpts,
    Shape, TRAINABLE_VARIABLES, Template, VarScope, VarSpec, VariableStore,
};
use scopetree::{Error, InvalidNameReason, ScopeId, VarId};

const SCOPE_NAMES: [&str; 7] = ["a", "b", "a/b", "ab", "a_", "", "x//y"];
const UNIQUE_NAMES: [&str; 4] = ["layer", "a", "", "p/q"];
const VAR_NAMES: [&str; 6] = ["w", "v", "x/w", "b/w", "", "w//z"];
const PREFIXES: [&str; 12] = [
    "", "a", "a/b", "ab", "a_", "b", "x", "layer", "tpl", "a/w", "a/", "/a",
];
const COLLECTIONS: [&str; 4] = [
    GLOBAL_VARIABLES,
    TRAINABLE_VARIABLES,
    LOCAL_VARIABLES,
    "mine",
];
const TEMPLATES: [&str; 3] = ["tpl", "tpl", "grow"];

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Ty {
    F32,
    U8,
}

fn ty_name(ty: Ty) -> &'static str {
    match ty {
        Ty::F32 => type_name::<Vec<f32>>(),
        Ty::U8 => type_name::<u8>(),
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Init {
    None,
    Const,
    FromFn,
    Shaped,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum ShapeArg {
    None,
    Known(usize),
    Unknown,
    Rank2(usize),
    Scalar,
}

impl ShapeArg {
    fn dims(self) -> Option<Vec<Option<usize>>> {
        match self {
            ShapeArg::None => None,
            ShapeArg::Known(n) => Some(vec![Some(n)]),
            ShapeArg::Unknown => Some(vec![None]),
            ShapeArg::Rank2(n) => Some(vec![Some(n), Some(1)]),
            ShapeArg::Scalar => Some(vec![]),
        }
    }
}

fn show(dims: &[Option<usize>]) -> String {
    Shape::from_dims(dims.iter().copied()).to_string()
}

fn compatible(a: &[Option<usize>], b: &[Option<usize>]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.is_none() || y.is_none() || x == y)
}

#[derive(Clone, Debug)]
struct GetOp {
    name: usize,
    ty: Ty,
    /// Length of the `Vec<f32>` a constant or `from_fn` initializer makes.
    len: usize,
    shape: ShapeArg,
    init: Init,
    reuse: Reuse,
    trainable: Option<bool>,
    local: bool,
    /// `collections(["mine"])`.
    mine: bool,
}

#[derive(Clone, Debug)]
enum Op {
    Scope {
        name: usize,
        reuse: Reuse,
        trainable: Option<bool>,
        /// A custom getter for the scope: 0 none, 1 appends `_g` to the
        /// name, 2 prepends the scope `m/` (moving it out of the scope).
        getter: usize,
        body: Vec<Op>,
    },
    Unique {
        name: usize,
        reuse: Reuse,
        body: Vec<Op>,
    },
    Reenter {
        k: usize,
        reuse: Reuse,
        body: Vec<Op>,
    },
    Get(GetOp),
    /// `tree_mut().set` a new value (maybe of the other type) in variable `k`.
    SetVal {
        k: usize,
        ty: Ty,
        len: usize,
    },
    /// `store.delete_scope` (or, `tree`, the tree's own) of captured scope `k`.
    Delete {
        k: usize,
        tree: bool,
    },
    ReuseVariables,
    Template {
        t: usize,
    },
    TemplateVars {
        t: usize,
    },
    Collect {
        key: usize,
        prefix: usize,
    },
    ScopeCollect {
        key: usize,
    },
}

fn reuse() -> impl Strategy<Value = Reuse> {
    prop_oneof![
        3 => Just(Reuse::Inherit),
        1 => Just(Reuse::Reuse),
        1 => Just(Reuse::AutoReuse),
    ]
}

fn get_op() -> impl Strategy<Value = GetOp> {
    let shape = prop_oneof![
        10 => Just(ShapeArg::None),
        3 => (0..4usize).prop_map(ShapeArg::Known),
        1 => Just(ShapeArg::Unknown),
        1 => (0..3usize).prop_map(ShapeArg::Rank2),
        1 => Just(ShapeArg::Scalar),
    ];
    let init = prop_oneof![
        1 => Just(Init::None),
        4 => Just(Init::Const),
        2 => Just(Init::FromFn),
        2 => Just(Init::Shaped),
    ];
    let ty = prop_oneof![3 => Just(Ty::F32), 1 => Just(Ty::U8)];
    (
        prop_oneof![8 => 0..4usize, 1 => 4..VAR_NAMES.len()],
        ty,
        1..4usize,
        shape,
        init,
        reuse(),
        prop::option::weighted(0.2, any::<bool>()),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.15),
    )
        .prop_map(
            |(name, ty, len, shape, init, reuse, trainable, local, mine)| GetOp {
                name,
                ty,
                len,
                shape,
                init,
                reuse,
                trainable,
                local,
                mine,
            },
        )
}

fn program() -> impl Strategy<Value = Vec<Op>> {
    let leaf = prop_oneof![
        16 => get_op().prop_map(Op::Get),
        2 => (0..64usize, prop_oneof![Just(Ty::F32), Just(Ty::U8)], 0..4usize)
            .prop_map(|(k, ty, len)| Op::SetVal { k, ty, len }),
        1 => (0..64usize, any::<bool>()).prop_map(|(k, tree)| Op::Delete { k, tree }),
        1 => Just(Op::ReuseVariables),
        3 => (0..3usize).prop_map(|t| Op::Template { t }),
        1 => (0..3usize).prop_map(|t| Op::TemplateVars { t }),
        2 => (0..4usize, 0..PREFIXES.len()).prop_map(|(key, prefix)| Op::Collect { key, prefix }),
        1 => (0..4usize).prop_map(|key| Op::ScopeCollect { key }),
    ];
    let op = leaf.prop_recursive(3, 64, 6, |inner| {
        let body = prop::collection::vec(inner, 0..6);
        prop_oneof![
            4 => (
                prop_oneof![6 => 0..5usize, 1 => 5..SCOPE_NAMES.len()],
                reuse(),
                prop::option::weighted(0.2, any::<bool>()),
                prop_oneof![6 => Just(0usize), 1 => Just(1usize), 1 => Just(2usize)],
                body.clone()
            )
                .prop_map(|(name, reuse, trainable, getter, body)| Op::Scope { name, reuse, trainable, getter, body }),
            2 => (
                prop_oneof![6 => 0..2usize, 1 => 2..UNIQUE_NAMES.len()],
                prop_oneof![6 => Just(Reuse::Inherit), 1 => Just(Reuse::Reuse), 1 => Just(Reuse::AutoReuse)],
                body.clone()
            )
                .prop_map(|(name, reuse, body)| Op::Unique { name, reuse, body }),
            2 => (0..64usize, reuse(), body).prop_map(|(k, reuse, body)| Op::Reenter { k, reuse, body }),
        ]
    });
    prop::collection::vec(op, 1..16)
}

/// A variable scope as the model sees it.
#[derive(Clone, Debug)]
struct MScope {
    name: String,
    /// Which incarnation of the scope of that full name (0 for the root).
    inc: u64,
    reuse: Reuse,
    trainable: Option<bool>,
    /// Custom getters in force: how many append `_g`, how many prepend `m/`.
    suffix: usize,
    prefix: usize,
}

#[derive(Clone, Debug)]
struct MVar {
    handle: VarId,
    ty: Ty,
    /// Current length, for a `Vec<f32>`.
    len: usize,
    init_shape: Vec<Option<usize>>,
    trainable: bool,
    collections: Vec<String>,
    seq: u64,
}

impl MVar {
    fn shape(&self) -> Vec<Option<usize>> {
        match self.ty {
            Ty::F32 => vec![Some(self.len)],
            Ty::U8 => vec![],
        }
    }
}

/// A variable the model expects to be created: an [`MVar`] but the handle.
#[derive(Clone, Debug)]
struct NewVar {
    ty: Ty,
    len: usize,
    init_shape: Vec<Option<usize>>,
    trainable: bool,
    collections: Vec<String>,
    seq: u64,
}

#[derive(Default)]
struct Model {
    /// Live named scopes by full name, with their incarnation.
    scopes: HashMap<String, u64>,
    next_inc: u64,
    vars: HashMap<String, MVar>,
    seq: u64,
    dead_vars: Vec<VarId>,
}

fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_owned()
    } else {
        format!("{a}/{b}")
    }
}

fn bad_path(name: &str) -> Option<sharing::Error> {
    (name.is_empty() || name.split('/').any(str::is_empty)).then(|| {
        sharing::Error::Tree(Error::InvalidName {
            name: name.chars().take(64).collect(),
            reason: InvalidNameReason::Empty,
        })
    })
}

impl Model {
    fn alive(&self, s: &MScope) -> bool {
        s.name.is_empty() || self.scopes.get(&s.name) == Some(&s.inc)
    }

    /// Creates the missing scopes of `path`; the incarnation of the last.
    fn ensure(&mut self, path: &str) -> u64 {
        let mut full = String::new();
        let mut inc = 0;
        for c in path.split('/').filter(|c| !c.is_empty()) {
            full = join(&full, c);
            inc = match self.scopes.get(&full) {
                Some(&i) => i,
                None => {
                    self.next_inc += 1;
                    self.scopes.insert(full.clone(), self.next_inc);
                    self.next_inc
                }
            };
        }
        inc
    }

    fn delete(&mut self, name: &str) {
        let prefix = format!("{name}/");
        self.scopes
            .retain(|s, _| s != name && !s.starts_with(&prefix));
        let doomed: Vec<String> = self
            .vars
            .keys()
            .filter(|v| v.starts_with(&prefix))
            .cloned()
            .collect();
        for v in doomed {
            if let Some(mv) = self.vars.remove(&v) {
                self.dead_vars.push(mv.handle);
            }
        }
    }

    /// `get_variable` (or `get_local_variable`) of `name` in `cur`: the full
    /// name and, if it is created, the new variable (without its handle,
    /// which [`settle`] fills in), or the error.
    fn get(
        &mut self,
        cur: &MScope,
        place: ScopeId,
        name: &str,
        g: &GetOp,
    ) -> Result<(String, Option<NewVar>), sharing::Error> {
        if !self.alive(cur) {
            return Err(sharing::Error::Tree(Error::StaleScope { scope: place }));
        }
        if let Some(e) = bad_path(name) {
            return Err(e);
        }
        let reuse = g.reuse.or(cur.reuse);
        let full = format!(
            "{}{}{}",
            "m/".repeat(cur.prefix),
            join(&cur.name, name),
            "_g".repeat(cur.suffix)
        );
        let (dirs, last) = match full.rsplit_once('/') {
            Some((d, l)) => (d.to_owned(), l.to_owned()),
            None => (String::new(), full.clone()),
        };
        let want = g.shape.dims();
        if g.init == Init::Const && want.is_some() {
            return Err(sharing::Error::ConstantWithShape {
                name: last,
                scope: dirs,
            });
        }
        if let Some(v) = self.vars.get(&full) {
            if reuse == Reuse::Inherit {
                return Err(sharing::Error::VariableExists {
                    name: last,
                    scope: dirs,
                });
            }
            if v.ty != g.ty {
                return Err(sharing::Error::ShareTypeMismatch {
                    name: last,
                    scope: dirs,
                    expected: ty_name(g.ty),
                    found: ty_name(v.ty),
                });
            }
            if let Some(want) = &want {
                if !compatible(want, &v.shape()) {
                    return Err(sharing::Error::ShapeMismatch {
                        name: last,
                        scope: dirs,
                        expected: show(want),
                        found: show(&v.shape()),
                    });
                }
            }
            return Ok((full, None));
        }
        if reuse == Reuse::Reuse {
            return Err(sharing::Error::VariableMissing {
                name: last,
                scope: dirs,
            });
        }
        let made_len = match g.init {
            Init::None => {
                return Err(sharing::Error::InitializerRequired {
                    name: last,
                    scope: dirs,
                    value_type: ty_name(g.ty),
                });
            }
            Init::Shaped => match want
                .as_ref()
                .and_then(|w| w.iter().copied().collect::<Option<Vec<usize>>>())
            {
                Some(d) => d.iter().product(),
                None => {
                    return Err(sharing::Error::ShapeRequired {
                        name: last,
                        scope: dirs,
                        shape: want
                            .as_ref()
                            .map_or_else(|| "unknown".to_owned(), |w| show(w)),
                    });
                }
            },
            Init::Const | Init::FromFn => g.len,
        };
        let made = match g.ty {
            Ty::F32 => vec![Some(made_len)],
            Ty::U8 => vec![],
        };
        if let Some(want) = &want {
            if !compatible(want, &made) {
                return Err(sharing::Error::InitShapeMismatch {
                    name: last,
                    scope: dirs,
                    expected: show(want),
                    found: show(&made),
                });
            }
        }
        self.ensure(&dirs);
        let trainable = !g.local && g.trainable.or(cur.trainable).unwrap_or(true);
        let mut collections: Vec<String> = if g.mine {
            vec!["mine".into()]
        } else if g.local {
            vec![]
        } else {
            vec![GLOBAL_VARIABLES.into()]
        };
        if g.local {
            collections.push(LOCAL_VARIABLES.into());
        } else if trainable {
            collections.push(TRAINABLE_VARIABLES.into());
        }
        self.seq += 1;
        let new = NewVar {
            ty: g.ty,
            len: made_len,
            init_shape: made,
            trainable,
            collections,
            seq: self.seq,
        };
        Ok((full, Some(new)))
    }

    /// Members of collection `key`, in creation order, under scope `under`
    /// (`None`: all).
    fn members(&self, key: &str, under: Option<&str>) -> Vec<(String, VarId)> {
        let mut out: Vec<(u64, String, VarId)> = self
            .vars
            .iter()
            .filter(|(_, v)| v.collections.iter().any(|c| c == key))
            .filter(|(n, _)| under.is_none_or(|p| n.starts_with(&format!("{p}/"))))
            .map(|(n, v)| (v.seq, n.clone(), v.handle))
            .collect();
        out.sort();
        out.into_iter().map(|(_, n, v)| (n, v)).collect()
    }

    fn collection(&self, key: &str, prefix: &str) -> Result<Vec<(String, VarId)>, sharing::Error> {
        if prefix.is_empty() {
            return Ok(self.members(key, None));
        }
        if let Some(e) = bad_path(prefix) {
            return Err(e);
        }
        if !self.scopes.contains_key(prefix) {
            return Ok(Vec::new());
        }
        Ok(self.members(key, Some(prefix)))
    }
}

type TplFn =
    Box<dyn FnMut(&mut VariableStore, &mut VarScope, ()) -> Result<VarId, sharing::Error> + Send>;

struct MTemplate {
    captured: Option<MScope>,
    created: bool,
    calls: u32,
}

struct Ctx {
    m: Model,
    captured: Vec<(VarScope, MScope)>,
    templates: Vec<Template<TplFn>>,
    mt: Vec<MTemplate>,
}

/// The template functions: `tpl` gets `w`; `grow` gets a new `g{n}` on
/// every call, with a call-level `AutoReuse` (so a later call creates).
fn template_get(t: usize, calls: u32) -> (String, GetOp) {
    let g = GetOp {
        name: 0,
        ty: if t == 2 { Ty::U8 } else { Ty::F32 },
        len: 2,
        shape: ShapeArg::None,
        init: Init::Const,
        reuse: if t == 2 {
            Reuse::AutoReuse
        } else {
            Reuse::Inherit
        },
        trainable: None,
        local: false,
        mine: false,
    };
    let name = if t == 2 {
        format!("g{calls}")
    } else {
        "w".to_owned()
    };
    (name, g)
}

fn make_templates() -> Vec<Template<TplFn>> {
    let mut out = Vec::new();
    for (t, name) in TEMPLATES.iter().enumerate() {
        let mut calls = 0u32;
        let f: TplFn = Box::new(move |s: &mut VariableStore, vs: &mut VarScope, (): ()| {
            calls += 1;
            let (name, g) = template_get(t, calls);
            real_get(s, vs, &name, &g)
        });
        out.push(Template::new(name, f).unwrap_or_else(|e| panic!("{e}")));
    }
    out
}

fn finish<T: HasShape + Send + Sync + 'static>(
    store: &mut VariableStore,
    vs: &VarScope,
    name: &str,
    g: &GetOp,
    init: Option<Initializer<T>>,
) -> Result<VarId, sharing::Error> {
    let mut spec = VarSpec::new(name).reuse(g.reuse);
    if let Some(d) = g.shape.dims() {
        spec = spec.shape(Shape::from_dims(d));
    }
    if let Some(i) = init {
        spec = spec.initializer(i);
    }
    if let Some(t) = g.trainable {
        spec = spec.trainable(t);
    }
    if g.mine {
        spec = spec.collections(["mine"]);
    }
    if g.local {
        store.get_local_variable(vs, spec)
    } else {
        store.get_variable(vs, spec)
    }
}

fn real_get(
    store: &mut VariableStore,
    vs: &VarScope,
    name: &str,
    g: &GetOp,
) -> Result<VarId, sharing::Error> {
    let len = g.len;
    match g.ty {
        Ty::F32 => {
            let init = match g.init {
                Init::None => None,
                Init::Const => Some(Initializer::constant(vec![0.5_f32; len])),
                Init::FromFn => Some(Initializer::from_fn(move || vec![0.5_f32; len])),
                Init::Shaped => Some(Initializer::with_shape(|s: &[usize]| {
                    vec![0.5_f32; s.iter().product()]
                })),
            };
            finish(store, vs, name, g, init)
        }
        Ty::U8 => {
            let init = match g.init {
                Init::None => None,
                Init::Const => Some(Initializer::constant(7_u8)),
                Init::FromFn => Some(Initializer::from_fn(|| 7_u8)),
                Init::Shaped => Some(Initializer::with_shape(|_: &[usize]| 7_u8)),
            };
            finish(store, vs, name, g, init)
        }
    }
}

/// Compares a real result with the model's, recording a created variable.
fn settle(
    m: &mut Model,
    real: Result<VarId, sharing::Error>,
    want: Result<(String, Option<NewVar>), sharing::Error>,
) -> Result<(), TestCaseError> {
    match (real, want) {
        (Ok(v), Ok((full, new))) => {
            prop_assert!(
                !m.dead_vars.contains(&v),
                "a dead handle came back for {}",
                full
            );
            match new {
                Some(n) => {
                    prop_assert!(
                        m.vars.values().all(|x| x.handle != v),
                        "new {} aliases another variable",
                        full
                    );
                    let mv = MVar {
                        handle: v,
                        ty: n.ty,
                        len: n.len,
                        init_shape: n.init_shape,
                        trainable: n.trainable,
                        collections: n.collections,
                        seq: n.seq,
                    };
                    prop_assert!(
                        m.vars.insert(full.clone(), mv).is_none(),
                        "{} created twice",
                        full
                    );
                }
                None => {
                    let mv = m
                        .vars
                        .get(&full)
                        .ok_or_else(|| TestCaseError::fail(format!("{full} not in model")))?;
                    prop_assert_eq!(mv.handle, v, "shared {} is another handle", full);
                }
            }
        }
        (Err(e), Err(w)) => prop_assert_eq!(e, w),
        (r, w) => prop_assert!(false, "store gave {:?}, model says {:?}", r, w),
    }
    Ok(())
}

/// The whole store against the model.
fn check(store: &VariableStore, ctx: &Ctx) -> Result<(), TestCaseError> {
    let m = &ctx.m;
    let tree = store.tree();
    prop_assert_eq!(tree.var_count(), m.vars.len());
    prop_assert_eq!(tree.scope_count(), 1 + m.scopes.len());
    for (full, v) in &m.vars {
        prop_assert_eq!(store.variable(full)?, Some(v.handle), "variable({})", full);
        prop_assert_eq!(&store.full_name(v.handle)?, full);
        prop_assert_eq!(&tree.var_path(v.handle)?, full);
        prop_assert_eq!(
            store.initial_shape(v.handle)?,
            Some(&Shape::from_dims(v.init_shape.iter().copied()))
        );
        prop_assert_eq!(store.is_trainable(v.handle)?, Some(v.trainable));
        prop_assert_eq!(tree.type_name(v.handle)?, Some(ty_name(v.ty)));
    }
    // Every full name the programs can reach: exists exactly as modelled.
    let mut scopes: Vec<&str> = m.scopes.keys().map(String::as_str).collect();
    scopes.push("");
    for s in scopes {
        for n in ["w", "v", "g1", "g2", "b", "w_g", "v_g", "w_g_g", "g1_g"] {
            let full = join(s, n);
            prop_assert_eq!(
                store.variable(&full)?,
                m.vars.get(&full).map(|v| v.handle),
                "{}",
                full
            );
        }
    }
    for key in COLLECTIONS {
        prop_assert_eq!(
            store.collection(key, None)?,
            m.members(key, None),
            "{}",
            key
        );
    }
    for &d in &m.dead_vars {
        prop_assert_eq!(
            store.full_name(d),
            Err(sharing::Error::Tree(Error::StaleVar { var: d }))
        );
        prop_assert_eq!(
            store.is_trainable(d),
            Err(sharing::Error::Tree(Error::StaleVar { var: d }))
        );
        prop_assert_eq!(
            store.initial_shape(d).err(),
            Some(sharing::Error::Tree(Error::StaleVar { var: d }))
        );
        prop_assert_eq!(tree.get::<u8>(d).err(), Some(Error::StaleVar { var: d }));
        prop_assert!(!tree.contains_var(d));
    }
    for (vs, ms) in &ctx.captured {
        if m.alive(ms) {
            prop_assert_eq!(&tree.path(vs.place())?, &ms.name);
        } else {
            let stale = Error::StaleScope { scope: vs.place() };
            prop_assert!(!tree.contains_scope(vs.place()));
            prop_assert_eq!(
                store.scope_collection(vs, GLOBAL_VARIABLES).err(),
                Some(sharing::Error::Tree(stale.clone()))
            );
            prop_assert_eq!(tree.path(vs.place()).err(), Some(stale));
        }
    }
    Ok(())
}

fn capture(ctx: &mut Ctx, vs: &VarScope, ms: &MScope) {
    if ctx.captured.len() < 32 {
        ctx.captured.push((vs.clone(), ms.clone()));
    }
}

fn run(
    store: &mut VariableStore,
    ctx: &mut Ctx,
    vs: &mut VarScope,
    cur: &mut MScope,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    for op in ops {
        match op {
            Op::Scope {
                name,
                reuse,
                trainable,
                getter,
                body,
            } => {
                let name = SCOPE_NAMES[*name];
                let want = if !ctx.m.alive(cur) {
                    Err(sharing::Error::Tree(Error::StaleScope {
                        scope: vs.place(),
                    }))
                } else if let Some(e) = bad_path(name) {
                    Err(e)
                } else {
                    Ok(())
                };
                let mut opts = ScopeOpts::new().reuse(*reuse);
                if let Some(t) = trainable {
                    opts = opts.trainable(*t);
                }
                match getter {
                    1 => {
                        opts = opts.custom_getter(CustomGetter::new(|s, mut args, next| {
                            args.name.push_str("_g");
                            next.get(s, args)
                        }))
                    }
                    2 => {
                        opts = opts.custom_getter(CustomGetter::new(|s, mut args, next| {
                            args.name.insert_str(0, "m/");
                            next.get(s, args)
                        }))
                    }
                    _ => {}
                }
                let mut inner = Ok(());
                let mut entered = false;
                let r = store.variable_scope(vs, name, opts, |s, cvs| {
                    entered = true;
                    let full = join(&cur.name, name);
                    let inc = ctx.m.ensure(&full);
                    let mut child = MScope {
                        name: full,
                        inc,
                        reuse: reuse.or(cur.reuse),
                        trainable: trainable.or(cur.trainable),
                        suffix: cur.suffix + usize::from(*getter == 1),
                        prefix: cur.prefix + usize::from(*getter == 2),
                    };
                    inner = (|| {
                        prop_assert_eq!(cvs.name(), child.name.as_str());
                        prop_assert_eq!(cvs.reuse(), child.reuse);
                        prop_assert_eq!(cvs.trainable(), child.trainable);
                        prop_assert_eq!(cvs.custom_getter_count(), child.suffix + child.prefix);
                        capture(ctx, cvs, &child);
                        run(s, ctx, cvs, &mut child, body)
                    })();
                    Ok(())
                });
                inner?;
                prop_assert_eq!(r, want.clone());
                prop_assert_eq!(entered, want.is_ok());
            }
            Op::Unique { name, reuse, body } => {
                let name = UNIQUE_NAMES[*name];
                let want = if !ctx.m.alive(cur) {
                    Err(sharing::Error::Tree(Error::StaleScope {
                        scope: vs.place(),
                    }))
                } else if *reuse != Reuse::Inherit {
                    Err(sharing::Error::ReuseWithoutName {
                        default_name: name.to_owned(),
                        scope: cur.name.clone(),
                        reuse: *reuse,
                    })
                } else {
                    scopetree::validate_name(name).map_err(sharing::Error::from)
                };
                let mut inner = Ok(());
                let mut entered = false;
                let r = store.variable_scope_unique(vs, name, *reuse, |s, cvs| {
                    entered = true;
                    inner = (|| {
                        let full = cvs.name().to_owned();
                        let base = join(&cur.name, name);
                        let suffix_ok = full == base
                            || full
                                .strip_prefix(&format!("{base}_"))
                                .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n >= 1));
                        prop_assert!(suffix_ok, "unique name {} for {}", full, base);
                        prop_assert_eq!(&s.tree().path(cvs.place())?, &full);
                        let inc = ctx.m.ensure(&full);
                        let mut child = MScope {
                            name: full,
                            inc,
                            reuse: cur.reuse,
                            trainable: cur.trainable,
                            ..cur.clone()
                        };
                        prop_assert_eq!(cvs.reuse(), child.reuse);
                        capture(ctx, cvs, &child);
                        run(s, ctx, cvs, &mut child, body)
                    })();
                    Ok(())
                });
                inner?;
                prop_assert_eq!(r, want.clone());
                prop_assert_eq!(entered, want.is_ok());
            }
            Op::Reenter { k, reuse, body } => {
                let (target, tm) = ctx.captured[k % ctx.captured.len()].clone();
                let want = if ctx.m.alive(&tm) {
                    Ok(())
                } else {
                    Err(sharing::Error::Tree(Error::StaleScope {
                        scope: target.place(),
                    }))
                };
                let mut inner = Ok(());
                let mut entered = false;
                let r = store.reenter_scope(&target, *reuse, |s, cvs| {
                    entered = true;
                    let mut child = MScope {
                        reuse: reuse.or(tm.reuse),
                        ..tm.clone()
                    };
                    inner = (|| {
                        prop_assert_eq!(cvs.name(), child.name.as_str());
                        prop_assert_eq!(cvs.reuse(), child.reuse);
                        run(s, ctx, cvs, &mut child, body)
                    })();
                    Ok(())
                });
                inner?;
                prop_assert_eq!(r, want.clone());
                prop_assert_eq!(entered, want.is_ok());
            }
            Op::Get(g) => {
                let name = VAR_NAMES[g.name];
                let real = real_get(store, vs, name, g);
                let want = ctx.m.get(cur, vs.place(), name, g);
                settle(&mut ctx.m, real, want)?;
            }
            Op::SetVal { k, ty, len } => {
                let mut names: Vec<&String> = ctx.m.vars.keys().collect();
                names.sort();
                let Some(full) = names.get(k % names.len().max(1)).map(|s| (*s).clone()) else {
                    continue;
                };
                let mv = ctx
                    .m
                    .vars
                    .get_mut(&full)
                    .ok_or_else(|| TestCaseError::fail("gone"))?;
                match ty {
                    Ty::F32 => store.tree_mut().set(mv.handle, vec![0.25_f32; *len])?,
                    Ty::U8 => store.tree_mut().set(mv.handle, 1_u8)?,
                }
                mv.ty = *ty;
                mv.len = *len;
            }
            Op::Delete { k, tree } => {
                let (target, tm) = ctx.captured[k % ctx.captured.len()].clone();
                let r = if *tree {
                    store
                        .tree_mut()
                        .delete_scope(target.place())
                        .map_err(sharing::Error::from)
                } else {
                    store.delete_scope(target.place())
                };
                if !ctx.m.alive(&tm) {
                    prop_assert_eq!(
                        r,
                        Err(sharing::Error::Tree(Error::StaleScope {
                            scope: target.place()
                        }))
                    );
                } else if tm.name.is_empty() {
                    prop_assert_eq!(r, Err(sharing::Error::Tree(Error::RootScope)));
                } else {
                    prop_assert_eq!(r, Ok(()));
                    ctx.m.delete(&tm.name);
                }
            }
            Op::ReuseVariables => {
                vs.reuse_variables();
                cur.reuse = Reuse::Reuse;
            }
            Op::Template { t } => {
                let t = *t;
                let real = ctx.templates[t].call(store, vs, ());
                let mt_captured = ctx.mt[t].captured.clone();
                let want = match mt_captured {
                    Some(c) if !ctx.m.alive(&c) => {
                        let place = ctx.templates[t]
                            .variable_scope()
                            .map(VarScope::place)
                            .ok_or_else(|| TestCaseError::fail("captured scope lost"))?;
                        Err(sharing::Error::StaleTemplate {
                            template: TEMPLATES[t].to_owned(),
                            scope: place,
                        })
                    }
                    Some(c) => {
                        let reuse = if ctx.mt[t].created {
                            Reuse::Reuse
                        } else {
                            Reuse::Inherit
                        };
                        let ms = MScope {
                            reuse: reuse.or(c.reuse),
                            ..c
                        };
                        Ok(ms)
                    }
                    None if !ctx.m.alive(cur) => Err(sharing::Error::Tree(Error::StaleScope {
                        scope: vs.place(),
                    })),
                    None => {
                        let cvs = ctx.templates[t]
                            .variable_scope()
                            .ok_or_else(|| TestCaseError::fail("no scope captured"))?
                            .clone();
                        let full = cvs.name().to_owned();
                        let base = join(&cur.name, TEMPLATES[t]);
                        let ok = full == base
                            || full
                                .strip_prefix(&format!("{base}_"))
                                .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n >= 1));
                        prop_assert!(ok, "template scope {} for {}", full, base);
                        let inc = ctx.m.ensure(&full);
                        let ms = MScope {
                            name: full,
                            inc,
                            reuse: cur.reuse,
                            trainable: cur.trainable,
                            ..cur.clone()
                        };
                        ctx.mt[t].captured = Some(ms.clone());
                        capture(ctx, &cvs, &ms);
                        Ok(ms)
                    }
                };
                let want = match want {
                    Err(e) => Err(e),
                    Ok(ms) => {
                        ctx.mt[t].calls += 1;
                        let (name, g) = template_get(t, ctx.mt[t].calls);
                        let place = ctx.templates[t]
                            .variable_scope()
                            .map(VarScope::place)
                            .ok_or_else(|| TestCaseError::fail("no scope"))?;
                        let got = ctx.m.get(&ms, place, &name, &g);
                        match got {
                            Ok((full, Some(new))) if ctx.mt[t].created && new.trainable => {
                                // A later call created a trainable variable: it
                                // stays in the store, and the call fails.
                                let handle = store.variable(&full)?.ok_or_else(|| {
                                    TestCaseError::fail(format!("{full} missing"))
                                })?;
                                settle(&mut ctx.m, Ok(handle), Ok((full.clone(), Some(new))))?;
                                Err(sharing::Error::TemplateCreatedVariable {
                                    template: TEMPLATES[t].to_owned(),
                                    scope: ms.name.clone(),
                                    names: vec![full],
                                })
                            }
                            Ok(x) => {
                                ctx.mt[t].created = true;
                                Ok(x)
                            }
                            Err(e) => Err(e),
                        }
                    }
                };
                match want {
                    Ok(x) => settle(&mut ctx.m, real, Ok(x))?,
                    Err(e) => prop_assert_eq!(real, Err(e)),
                }
                prop_assert_eq!(ctx.templates[t].variables_created(), ctx.mt[t].created);
            }
            Op::TemplateVars { t } => {
                let t = *t;
                let tpl = &ctx.templates[t];
                let mt = &ctx.mt[t];
                let want = match &mt.captured {
                    Some(c) if !ctx.m.alive(c) => Err(sharing::Error::StaleTemplate {
                        template: TEMPLATES[t].to_owned(),
                        scope: tpl
                            .variable_scope()
                            .map(VarScope::place)
                            .unwrap_or(vs.place()),
                    }),
                    Some(c) if mt.created => Ok((
                        ctx.m.members(GLOBAL_VARIABLES, Some(&c.name)),
                        ctx.m.members(TRAINABLE_VARIABLES, Some(&c.name)),
                    )),
                    _ => Ok((Vec::new(), Vec::new())),
                };
                let real = tpl
                    .global_variables(store)
                    .and_then(|g| Ok((g, tpl.trainable_variables(store)?)));
                prop_assert_eq!(real, want);
            }
            Op::Collect { key, prefix } => {
                let (key, prefix) = (COLLECTIONS[*key], PREFIXES[*prefix]);
                prop_assert_eq!(
                    store.collection(key, Some(prefix)),
                    ctx.m.collection(key, prefix),
                    "collection {} under {:?}",
                    key,
                    prefix
                );
            }
            Op::ScopeCollect { key } => {
                let key = COLLECTIONS[*key];
                let want = if !ctx.m.alive(cur) {
                    Err(sharing::Error::Tree(Error::StaleScope {
                        scope: vs.place(),
                    }))
                } else if cur.name.is_empty() {
                    Ok(ctx.m.members(key, None))
                } else {
                    Ok(ctx.m.members(key, Some(&cur.name)))
                };
                prop_assert_eq!(store.scope_collection(vs, key), want);
            }
        }
        check(store, ctx)?;
    }
    Ok(())
}

/// `PROPTEST_CASES` if set, else `release` cases in release and a quarter of
/// them in debug.
fn cases(release: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            release / 4
        } else {
            release
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(2000), ..ProptestConfig::default() })]

    #[test]
    fn store_matches_a_model_of_full_names(ops in program()) {
        let mut store = VariableStore::new();
        let mut root = store.root_scope();
        let mut cur = MScope { name: String::new(), inc: 0, reuse: Reuse::Inherit, trainable: None, suffix: 0, prefix: 0 };
        let mut ctx = Ctx {
            m: Model::default(),
            captured: vec![(root.clone(), cur.clone())],
            templates: make_templates(),
            mt: (0..TEMPLATES.len()).map(|_| MTemplate { captured: None, created: false, calls: 0 }).collect(),
        };
        run(&mut store, &mut ctx, &mut root, &mut cur, &ops)?;
        check(&store, &ctx)?;
    }
}

/// The value type a variable of [`get_variable_answers_by_text_at_any_width`]
/// holds: every third one an `f32`, which a `Vec<f32>` reuse must refuse.
fn holds_f32(i: usize) -> bool {
    i % 3 == 0
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(512), ..ProptestConfig::default() })]

    /// `get_variable` finds a variable of a scope with few variables by
    /// comparing texts, and of a wider one by symbol. Names of one or two
    /// letters and up to 18 bytes share lengths, prefixes and suffixes, so
    /// that the compares of every chunk size meet near-misses; scopes hold 0
    /// to 23 variables, across the scan limit and the table's index; some
    /// are renamed or removed behind the store's back, through the tree.
    /// Every answer must be what the tree itself holds at that name.
    #[test]
    fn get_variable_answers_by_text_at_any_width(
        names in prop::collection::vec("[ab]{1,18}", 0..24),
        renames in prop::collection::vec((any::<prop::sample::Index>(), "[ab]{1,18}"), 0..3),
        removes in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        probes in prop::collection::vec("[ab]{0,18}", 0..12),
    ) {
        let mut store = VariableStore::new();
        let root = store.root_scope();
        let vs = store
            .variable_scope(&root, "layer", ScopeOpts::new(), |_, vs| Ok(vs.clone()))
            .unwrap();
        let place = vs.place();
        // name -> (handle, holds an f32)
        let mut model: HashMap<String, (VarId, bool)> = HashMap::new();
        for (i, name) in names.iter().enumerate() {
            if model.contains_key(name) {
                continue;
            }
            let v = if holds_f32(i) {
                store.get_variable(&vs, VarSpec::new(name).initializer(Initializer::constant(0.5_f32)))
            } else {
                store.get_variable(&vs, VarSpec::new(name).initializer(Initializer::constant(vec![0.5_f32])))
            };
            model.insert(name.clone(), (v.unwrap(), holds_f32(i)));
        }
        let mut held: Vec<String> = Vec::new();
        for name in &names {
            if !held.contains(name) {
                held.push(name.clone());
            }
        }
        for (which, new) in &renames {
            if held.is_empty() || model.contains_key(new) {
                continue;
            }
            let old = held.remove(which.index(held.len()));
            store.tree_mut().rename(place, old.as_str(), new.as_str()).unwrap();
            let entry = model.remove(&old).unwrap();
            model.insert(new.clone(), entry);
            held.push(new.clone());
        }
        for which in &removes {
            if held.is_empty() {
                continue;
            }
            let gone = held.remove(which.index(held.len()));
            let (v, _) = model.remove(&gone).unwrap();
            store.tree_mut().remove_var(v).unwrap();
        }
        let asked = names.iter().chain(&probes).chain(renames.iter().map(|(_, n)| n));
        for name in asked {
            let got = store.get_variable(&vs, VarSpec::<Vec<f32>>::new(name).reuse(Reuse::Reuse));
            match model.get(name) {
                Some(&(v, false)) => prop_assert_eq!(got, Ok(v), "`{}`", name),
                Some(&(_, true)) => prop_assert!(
                    matches!(got, Err(sharing::Error::ShareTypeMismatch { .. })),
                    "`{}`: {:?}", name, got
                ),
                None if name.is_empty() => prop_assert!(
                    matches!(got, Err(sharing::Error::Tree(Error::InvalidName { .. }))),
                    "`{}`: {:?}", name, got
                ),
                None => prop_assert!(
                    matches!(got, Err(sharing::Error::VariableMissing { .. })),
                    "`{}`: {:?}", name, got
                ),
            }
            let in_tree = store.tree().find_local_var(place, name.as_str()).ok().flatten();
            prop_assert_eq!(in_tree, model.get(name).map(|&(v, _)| v), "`{}`", name);
        }
        prop_assert_eq!(store.tree().local_var_count(place).unwrap(), model.len());
    }
}
