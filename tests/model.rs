//! Model-based property test of `ScopeTree`.
//!
//! Random sequences of every public operation run against the tree and, side
//! by side, against a plain reference model written for this test (vectors of
//! scopes and variables, no arena, no keys). After every step the two must
//! agree on every observable: the result or error of the call, which handles
//! are live, names, paths, values, kids and variables in order, counts, the
//! dump, and (every few steps and at the end) every lookup from every live
//! scope. A failing sequence shrinks to a minimal one.
//!
//! Handles are drawn from everything ever issued, so calls get live handles,
//! stale ones (including handles whose slot has since been reused by a newer
//! scope or variable) and handles, symbols and scopes of another tree. Names
//! include invalid ones (empty, containing `/`), non-ASCII ones, names that
//! collide with generated unique names, and more than 64 distinct names so
//! that the lookup signature bits (`symbol % 64`) collide. A `Fill` operation
//! grows scopes past 16 variables, where the hash index takes over. Some
//! values are bombs whose `Drop` panics: every call that drops one must
//! panic, and only after finishing its bookkeeping, so the model and the tree
//! still agree afterwards.
//!
//! Size: `PROPTEST_CASES` sets the number of cases (default
//! [`DEFAULT_CASES`]: 150 in debug, about 18 s on a 2-core machine, for the
//! README's `cargo test`; 1,600 in release, about 23 s, for CI's release
//! step, which runs the long property runs);
//! each case is up to [`MAX_OPS`] operations. Run with `--nocapture` to see
//! the closing tally (cases, operations, stale-after-reuse checks, ...).

use std::any::type_name;
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Once, OnceLock};

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use scopetree::{Error, InvalidNameReason, NameRef, ScopeId, ScopeTree, Symbol, VarId};

/// Cases run when `PROPTEST_CASES` is not set: a short run in debug, a long
/// one in release.
const DEFAULT_CASES: u32 = if cfg!(debug_assertions) { 150 } else { 1600 };
/// Longest operation sequence of one case.
const MAX_OPS: usize = 160;
/// The full lookup grid is compared every this many steps (and at the end).
const GRID_EVERY: usize = 8;

// ----- the name universe ----------------------------------------------------

/// Names `0..INVALID` of [`names`] are invalid.
const INVALID: usize = 3;

/// Every name the generator can use: invalid ones first, then a non-ASCII
/// name, names of the shape `unique_var` generates, and 80 plain names (more
/// than 64, so signature bits collide).
fn names() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut v: Vec<String> = ["", "a/b", "/"].map(String::from).to_vec();
        v.extend(["ü名 x", "x_0", "x_1", "x_3", "w", "w_0", "w_2"].map(String::from));
        v.extend((0..80).map(|i| format!("v{i}")));
        v
    })
}

// ----- operations -------------------------------------------------------------

/// A scope argument.
#[derive(Clone, Copy, Debug)]
enum SRef {
    Root,
    /// The i-th live scope (in issue order).
    Live(usize),
    /// The i-th scope handle ever issued, live or not.
    Any(usize),
    /// A scope of another tree (0: its root, 1: a kid).
    Foreign(usize),
}

/// A variable argument.
#[derive(Clone, Copy, Debug)]
enum VRef {
    Live(usize),
    Any(usize),
    Foreign,
}

/// A name argument: an index into [`names`], passed as text, as a symbol of
/// this tree, or as a symbol of another tree.
#[derive(Clone, Copy, Debug)]
enum NRef {
    Str(usize),
    Sym(usize),
    Foreign(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    U64,
    Str,
    Vec,
    Bomb,
}

#[derive(Clone, Debug, PartialEq)]
enum Val {
    U64(u64),
    Str(String),
    Vec(Vec<f32>),
    Bomb(u64),
}

// ----- values whose Drop panics -------------------------------------------------

const BOOM: &str = "model bomb: a value's Drop panicked (expected by the test)";

/// A value whose `Drop` panics while a harness is armed (on this thread).
#[derive(Debug)]
struct Bomb {
    id: u64,
}

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    /// Bombs dropped while armed.
    static BOOMS: Cell<u64> = const { Cell::new(0) };
}

impl Drop for Bomb {
    fn drop(&mut self) {
        if ARMED.with(Cell::get) {
            BOOMS.with(|b| b.set(b.get() + 1));
            panic!("{BOOM}");
        }
    }
}

/// Keeps the expected bomb panics out of the test output.
fn quiet_bombs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let p = info.payload();
            let msg = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied());
            if msg != Some(BOOM) {
                default(info);
            }
        }));
    });
}

/// Runs a tree call that may drop bombs: `Err(())` if it panicked.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, ()> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|_| ())
}

/// Compares a guarded call with the model: it panics exactly when the model
/// drops a bomb, and otherwise returns what the model expects.
fn settle<T: PartialEq + Debug>(act: Result<T, ()>, exp: &T, bombs: u64, ctx: String) -> R {
    match act {
        Err(()) if bombs > 0 => Ok(()),
        Ok(a) if bombs == 0 => {
            if &a == exp {
                Ok(())
            } else {
                fail(format!("{ctx}: tree gave {a:?}, model expects {exp:?}"))
            }
        }
        Err(()) => fail(format!("{ctx}: panicked, but the model drops no bomb")),
        Ok(a) => fail(format!(
            "{ctx}: returned {a:?} without panicking, but the model drops {bombs} bomb(s)"
        )),
    }
}

#[derive(Clone, Debug)]
enum Op {
    NewScope(SRef),
    NewNamedScope(SRef, NRef),
    Kid(SRef, NRef),
    DeleteScope(SRef),
    DeleteKid(SRef, SRef),
    DropKids(SRef),
    HasKid(SRef, SRef),
    /// `n` nested kids below a scope (every fifth one named), to get deep
    /// enough for the dump's `[depth N]` lines and long deletions.
    Chain(SRef, usize),
    Var(SRef, NRef),
    /// `var_entry`, then `or_create` (`true`) or only `id` (`false`).
    VarEntry(SRef, NRef, bool),
    CreateVar(SRef, NRef),
    UniqueVar(SRef, NRef),
    /// `var` for `n` consecutive plain names from `start`.
    Fill(SRef, usize, usize),
    FindVar(SRef, NRef),
    FindLocalVar(SRef, NRef),
    GetVar(SRef, NRef),
    FindScope(SRef, NRef),
    EraseVars(SRef, Vec<NRef>),
    EraseVarsExcept(SRef, Vec<NRef>),
    /// `erase_vars_except` keeping the names of some local variables.
    EraseKeepLocal(SRef, Vec<usize>),
    RemoveVar(VRef),
    Rename(SRef, NRef, NRef),
    /// `rename` of the i-th local variable (as text or symbol) to a name.
    RenameLocal(SRef, usize, bool, NRef),
    RenameUnique(SRef, NRef),
    RenameUniqueLocal(SRef, usize),
    Set(VRef, Val),
    Get(VRef, Ty),
    GetMut(VRef, Ty),
    Replace(VRef, Val),
    Take(VRef, Ty),
    Clear(VRef),
    Is(VRef, Ty),
    GetOrDefault(VRef, Ty),
    GetOrInsertWith(VRef, Val),
    GetDisjointMut(VRef, VRef, Ty),
    Intern(NRef),
    Dump(SRef),
}

fn sref() -> impl Strategy<Value = SRef> {
    prop_oneof![
        2 => Just(SRef::Root),
        10 => (0..64usize).prop_map(SRef::Live),
        4 => (0..256usize).prop_map(SRef::Any),
        1 => (0..2usize).prop_map(SRef::Foreign),
    ]
}

fn vref() -> impl Strategy<Value = VRef> {
    prop_oneof![
        10 => (0..256usize).prop_map(VRef::Live),
        4 => (0..1024usize).prop_map(VRef::Any),
        1 => Just(VRef::Foreign),
    ]
}

fn nref() -> impl Strategy<Value = NRef> {
    let n = names().len();
    let idx = prop_oneof![1 => 0..INVALID, 24 => INVALID..n];
    (idx, 0..20u8).prop_map(|(i, k)| match k {
        0..=15 => NRef::Str(i),
        16..=18 => NRef::Sym(i),
        _ => NRef::Foreign(i),
    })
}

fn ty() -> impl Strategy<Value = Ty> {
    prop_oneof![Just(Ty::U64), Just(Ty::Str), Just(Ty::Vec), Just(Ty::Bomb)]
}

fn val() -> impl Strategy<Value = Val> {
    prop_oneof![
        2 => any::<u64>().prop_map(Val::U64),
        2 => "[a-zé]{0,6}".prop_map(Val::Str),
        2 => prop::collection::vec((-1000i16..1000).prop_map(f32::from), 0..4).prop_map(Val::Vec),
        2 => (0..1000u64).prop_map(Val::Bomb),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let structure = prop_oneof![
        6 => sref().prop_map(Op::NewScope),
        3 => (sref(), nref()).prop_map(|(s, n)| Op::NewNamedScope(s, n)),
        2 => (sref(), nref()).prop_map(|(s, n)| Op::Kid(s, n)),
        3 => sref().prop_map(Op::DeleteScope),
        2 => (sref(), sref()).prop_map(|(p, k)| Op::DeleteKid(p, k)),
        1 => sref().prop_map(Op::DropKids),
        1 => (sref(), sref()).prop_map(|(p, k)| Op::HasKid(p, k)),
        1 => (sref(), 1..48usize).prop_map(|(s, n)| Op::Chain(s, n)),
    ];
    let vars = prop_oneof![
        8 => (sref(), nref()).prop_map(|(s, n)| Op::Var(s, n)),
        3 => (sref(), nref(), any::<bool>()).prop_map(|(s, n, c)| Op::VarEntry(s, n, c)),
        3 => (sref(), nref()).prop_map(|(s, n)| Op::CreateVar(s, n)),
        2 => (sref(), nref()).prop_map(|(s, n)| Op::UniqueVar(s, n)),
        2 => (sref(), 0..96usize, 1..40usize).prop_map(|(s, a, n)| Op::Fill(s, a, n)),
        2 => (sref(), prop::collection::vec(nref(), 0..6)).prop_map(|(s, n)| Op::EraseVars(s, n)),
        1 => (sref(), prop::collection::vec(nref(), 0..4))
            .prop_map(|(s, n)| Op::EraseVarsExcept(s, n)),
        1 => (sref(), prop::collection::vec(0..64usize, 0..24))
            .prop_map(|(s, k)| Op::EraseKeepLocal(s, k)),
        3 => vref().prop_map(Op::RemoveVar),
        1 => (sref(), nref(), nref()).prop_map(|(s, a, b)| Op::Rename(s, a, b)),
        3 => (sref(), 0..64usize, any::<bool>(), nref())
            .prop_map(|(s, i, y, n)| Op::RenameLocal(s, i, y, n)),
    ];
    let more_vars = prop_oneof![
        1 => (sref(), nref()).prop_map(|(s, n)| Op::RenameUnique(s, n)),
        2 => (sref(), 0..64usize).prop_map(|(s, i)| Op::RenameUniqueLocal(s, i)),
        1 => nref().prop_map(Op::Intern),
        1 => sref().prop_map(Op::Dump),
    ];
    let lookups = prop_oneof![
        (sref(), nref()).prop_map(|(s, n)| Op::FindVar(s, n)),
        (sref(), nref()).prop_map(|(s, n)| Op::FindLocalVar(s, n)),
        (sref(), nref()).prop_map(|(s, n)| Op::GetVar(s, n)),
        (sref(), nref()).prop_map(|(s, n)| Op::FindScope(s, n)),
    ];
    let values = prop_oneof![
        4 => (vref(), val()).prop_map(|(v, x)| Op::Set(v, x)),
        3 => (vref(), ty()).prop_map(|(v, t)| Op::Get(v, t)),
        2 => (vref(), ty()).prop_map(|(v, t)| Op::GetMut(v, t)),
        2 => (vref(), val()).prop_map(|(v, x)| Op::Replace(v, x)),
        2 => (vref(), ty()).prop_map(|(v, t)| Op::Take(v, t)),
        1 => vref().prop_map(Op::Clear),
        1 => (vref(), ty()).prop_map(|(v, t)| Op::Is(v, t)),
        1 => (vref(), ty()).prop_map(|(v, t)| Op::GetOrDefault(v, t)),
        1 => (vref(), val()).prop_map(|(v, x)| Op::GetOrInsertWith(v, x)),
        2 => (vref(), vref(), ty()).prop_map(|(a, b, t)| Op::GetDisjointMut(a, b, t)),
    ];
    prop_oneof![
        5 => structure,
        8 => vars,
        2 => more_vars,
        3 => lookups,
        6 => values,
    ]
}

// ----- values -------------------------------------------------------------------

impl Ty {
    fn full_name(self) -> &'static str {
        match self {
            Ty::U64 => type_name::<u64>(),
            Ty::Str => type_name::<String>(),
            Ty::Vec => type_name::<Vec<f32>>(),
            Ty::Bomb => type_name::<Bomb>(),
        }
    }
    /// The type as dumps show it (written out, not computed by the crate).
    fn short_name(self) -> &'static str {
        match self {
            Ty::U64 => "u64",
            Ty::Str => "String",
            Ty::Vec => "Vec<f32>",
            Ty::Bomb => "Bomb",
        }
    }
    fn default_val(self) -> Val {
        match self {
            Ty::U64 | Ty::Bomb => Val::U64(0),
            Ty::Str => Val::Str(String::new()),
            Ty::Vec => Val::Vec(Vec::new()),
        }
    }
}

impl Val {
    fn ty(&self) -> Ty {
        match self {
            Val::U64(_) => Ty::U64,
            Val::Str(_) => Ty::Str,
            Val::Vec(_) => Ty::Vec,
            Val::Bomb(_) => Ty::Bomb,
        }
    }

    /// The value passed where the harness cannot hand over a bomb (it would
    /// be dropped, and explode, in the harness's own hands).
    fn defused(self) -> Val {
        match self {
            Val::Bomb(id) => Val::U64(id),
            v => v,
        }
    }
}

/// The mutation applied through every `&mut T` the tree hands out.
fn bump_u64(x: &mut u64) {
    *x = x.wrapping_add(1);
}
fn bump_str(x: &mut String) {
    x.push('!');
}
fn bump_vec(x: &mut Vec<f32>) {
    x.push(1.0);
}
fn bump_bomb(x: &mut Bomb) {
    x.id = x.id.wrapping_add(1);
}
fn bump(v: &mut Val) {
    match v {
        Val::U64(x) => bump_u64(x),
        Val::Str(x) => bump_str(x),
        Val::Vec(x) => bump_vec(x),
        Val::Bomb(x) => *x = x.wrapping_add(1),
    }
}

fn tree_get(t: &ScopeTree, v: VarId, ty: Ty) -> Result<Val, Error> {
    match ty {
        Ty::U64 => t.get::<u64>(v).map(|x| Val::U64(*x)),
        Ty::Str => t.get::<String>(v).map(|x| Val::Str(x.clone())),
        Ty::Vec => t.get::<Vec<f32>>(v).map(|x| Val::Vec(x.clone())),
        Ty::Bomb => t.get::<Bomb>(v).map(|x| Val::Bomb(x.id)),
    }
}

fn tree_set(t: &mut ScopeTree, v: VarId, x: Val) -> Result<(), Error> {
    match x {
        Val::U64(x) => t.set(v, x),
        Val::Str(x) => t.set(v, x),
        Val::Vec(x) => t.set(v, x),
        Val::Bomb(id) => t.set(v, Bomb { id }),
    }
}

// ----- the reference model -----------------------------------------------------

struct MScope {
    alive: bool,
    parent: Option<usize>,
    kids: Vec<usize>,
    vars: Vec<usize>,
    name: Option<String>,
    /// Path component: the name, or `#idx v version` for an unnamed scope.
    comp: String,
    depth: usize,
}

struct MVar {
    alive: bool,
    owner: usize,
    name: String,
    val: Option<Val>,
}

/// A resolved name argument: its text, and how it is passed.
#[derive(Clone)]
struct Arg {
    text: String,
    sym: Option<Symbol>,
    foreign: Option<Symbol>,
}

impl Arg {
    fn as_ref(&self) -> NameRef<'_> {
        match (self.foreign, self.sym) {
            (Some(f), _) => NameRef::Sym(f),
            (None, Some(s)) => NameRef::Sym(s),
            (None, None) => NameRef::Str(&self.text),
        }
    }
}

/// Tallies over the whole run, printed at the end.
static CASES: AtomicU64 = AtomicU64::new(0);
static OPS: AtomicU64 = AtomicU64::new(0);
static STALE_REUSED: AtomicU64 = AtomicU64::new(0);
static FOREIGN_CALLS: AtomicU64 = AtomicU64::new(0);
static INDEXED_SCOPES: AtomicU64 = AtomicU64::new(0);
static MAX_LOCAL: AtomicU64 = AtomicU64::new(0);
static MAX_SYMBOLS: AtomicU64 = AtomicU64::new(0);
static LOOKUPS: AtomicU64 = AtomicU64::new(0);
static MAX_DEPTH: AtomicU64 = AtomicU64::new(0);
static BOMBS: AtomicU64 = AtomicU64::new(0);

macro_rules! same {
    ($actual:expr, $expected:expr, $($ctx:tt)+) => {{
        let (a, e) = (&$actual, &$expected);
        if a != e {
            return Err(TestCaseError::fail(format!(
                "{}: tree gave {:?}, model expects {:?}",
                format!($($ctx)+),
                a,
                e
            )));
        }
    }};
}

fn fail<T>(msg: String) -> Result<T, TestCaseError> {
    Err(TestCaseError::fail(msg))
}

type R<T = ()> = Result<T, TestCaseError>;

/// The tree under test, the model, and every handle ever issued.
struct Harness {
    tree: ScopeTree,
    other: ScopeTree,
    foreign_scopes: [ScopeId; 2],
    foreign_var: VarId,
    /// Handle i is model scope i.
    sids: Vec<ScopeId>,
    vids: Vec<VarId>,
    seen_s: HashSet<ScopeId>,
    seen_v: HashSet<VarId>,
    ms: Vec<MScope>,
    mv: Vec<MVar>,
    counter: u64,
    syms: HashMap<String, Symbol>,
    /// Model scopes already counted as having grown past 16 variables.
    indexed: HashSet<usize>,
    /// Bombs the model expects to have been dropped.
    booms: u64,
}

impl Drop for Harness {
    fn drop(&mut self) {
        // The tree and its bombs are dropped after this: quietly.
        ARMED.with(|a| a.set(false));
    }
}

fn slot_of(debug: &str) -> String {
    // `ScopeId(3v1@t5)` -> `3v1`
    let inner = debug.split('(').nth(1).unwrap_or("");
    inner.split('@').next().unwrap_or("").to_owned()
}

fn slot_index(debug: &str) -> String {
    slot_of(debug).split('v').next().unwrap_or("").to_owned()
}

impl Harness {
    fn new() -> Self {
        quiet_bombs();
        ARMED.with(|a| a.set(true));
        BOOMS.with(|b| b.set(0));
        let tree = ScopeTree::new();
        let mut other = ScopeTree::new();
        let o_root = other.root();
        let o_kid = other.new_named_scope(o_root, "v1").expect("other tree");
        let o_var = other.var(o_kid, "v0").expect("other tree");
        other.set(o_var, 7_u64).expect("other tree");
        let root = tree.root();
        Harness {
            tree,
            other,
            foreign_scopes: [o_root, o_kid],
            foreign_var: o_var,
            sids: vec![root],
            vids: Vec::new(),
            seen_s: HashSet::from([root]),
            seen_v: HashSet::new(),
            ms: vec![MScope {
                alive: true,
                parent: None,
                kids: Vec::new(),
                vars: Vec::new(),
                name: None,
                comp: String::new(),
                depth: 0,
            }],
            mv: Vec::new(),
            counter: 0,
            syms: HashMap::new(),
            indexed: HashSet::new(),
            booms: 0,
        }
    }

    // --- argument resolution ---

    /// A scope argument: the handle, and its model index (`None`: foreign).
    fn scope(&self, r: SRef) -> (ScopeId, Option<usize>) {
        match r {
            SRef::Root => (self.sids[0], Some(0)),
            SRef::Live(i) => {
                let live: Vec<usize> = (0..self.ms.len()).filter(|&j| self.ms[j].alive).collect();
                let j = live[i % live.len()];
                (self.sids[j], Some(j))
            }
            SRef::Any(i) => {
                let j = i % self.sids.len();
                (self.sids[j], Some(j))
            }
            SRef::Foreign(i) => {
                FOREIGN_CALLS.fetch_add(1, Relaxed);
                (self.foreign_scopes[i % 2], None)
            }
        }
    }

    fn var(&self, r: VRef) -> (VarId, Option<usize>) {
        let live: Vec<usize> = (0..self.mv.len()).filter(|&j| self.mv[j].alive).collect();
        match r {
            VRef::Live(i) if !live.is_empty() => {
                let j = live[i % live.len()];
                (self.vids[j], Some(j))
            }
            VRef::Any(i) if !self.vids.is_empty() => {
                let j = i % self.vids.len();
                (self.vids[j], Some(j))
            }
            _ => {
                FOREIGN_CALLS.fetch_add(1, Relaxed);
                (self.foreign_var, None)
            }
        }
    }

    fn arg_text(&mut self, text: &str, as_sym: bool) -> Arg {
        let sym = if as_sym && valid(text) {
            let s = self.tree.intern(text).ok();
            if let Some(s) = s {
                self.syms.insert(text.to_owned(), s);
            }
            s
        } else {
            None
        };
        Arg {
            text: text.to_owned(),
            sym,
            foreign: None,
        }
    }

    fn arg(&mut self, n: NRef) -> Arg {
        match n {
            NRef::Str(i) => self.arg_text(&names()[i], false),
            NRef::Sym(i) => self.arg_text(&names()[i], true),
            NRef::Foreign(i) => {
                let text = names()[i].clone();
                let foreign = if valid(&text) {
                    FOREIGN_CALLS.fetch_add(1, Relaxed);
                    self.other.intern(&text).ok()
                } else {
                    None
                };
                Arg {
                    text,
                    sym: None,
                    foreign,
                }
            }
        }
    }

    /// The i-th local variable name of a scope (or a plain name if it has none).
    fn local_name(&self, s: Option<usize>, i: usize) -> String {
        match s.map(|s| &self.ms[s]) {
            Some(m) if m.alive && !m.vars.is_empty() => {
                self.mv[m.vars[i % m.vars.len()]].name.clone()
            }
            _ => names()[INVALID + i % (names().len() - INVALID)].clone(),
        }
    }

    // --- the model's view ---

    fn m_scope(&self, id: ScopeId, m: Option<usize>) -> Result<usize, Error> {
        match m {
            None => Err(Error::ForeignScope {
                scope: id,
                tree: self.tree.tag(),
            }),
            Some(i) if !self.ms[i].alive => Err(Error::StaleScope { scope: id }),
            Some(i) => Ok(i),
        }
    }

    fn m_var(&self, id: VarId, m: Option<usize>) -> Result<usize, Error> {
        match m {
            None => Err(Error::ForeignVar {
                var: id,
                tree: self.tree.tag(),
            }),
            Some(i) if !self.mv[i].alive => Err(Error::StaleVar { var: id }),
            Some(i) => Ok(i),
        }
    }

    /// Checks a name as a lookup or create does: validity, then the tree of a symbol.
    fn m_name(&self, a: &Arg) -> Result<String, Error> {
        if let Some(f) = a.foreign {
            return Err(Error::ForeignSymbol {
                symbol: f,
                tree: self.tree.tag(),
            });
        }
        m_validate(&a.text)?;
        Ok(a.text.clone())
    }

    fn m_path(&self, s: usize) -> String {
        let mut parts = Vec::new();
        let mut k = s;
        while let Some(p) = self.ms[k].parent {
            parts.push(self.ms[k].comp.as_str());
            k = p;
        }
        parts.reverse();
        parts.join("/")
    }

    /// A path as errors carry it (the rule `Error`'s docs state).
    fn m_error_path(&self, s: usize) -> String {
        cut_path(&self.m_path(s))
    }

    fn m_local(&self, s: usize, name: &str) -> Option<usize> {
        self.ms[s]
            .vars
            .iter()
            .copied()
            .find(|&v| self.mv[v].name == name)
    }

    fn m_find(&self, s: usize, name: &str) -> Option<(usize, usize)> {
        let mut k = Some(s);
        while let Some(i) = k {
            if let Some(v) = self.m_local(i, name) {
                return Some((i, v));
            }
            k = self.ms[i].parent;
        }
        None
    }

    fn m_kid(&self, p: usize, name: &str) -> Option<usize> {
        self.ms[p]
            .kids
            .iter()
            .copied()
            .find(|&k| self.ms[k].name.as_deref() == Some(name))
    }

    fn m_is_bomb(&self, v: usize) -> bool {
        matches!(self.mv[v].val, Some(Val::Bomb(_)))
    }

    /// Deletes a subtree; returns how many bombs that drops.
    fn m_delete(&mut self, top: usize) -> u64 {
        if let Some(p) = self.ms[top].parent {
            self.ms[p].kids.retain(|&k| k != top);
        }
        let mut bombs = 0;
        let mut stack = vec![top];
        while let Some(s) = stack.pop() {
            self.ms[s].alive = false;
            for v in std::mem::take(&mut self.ms[s].vars) {
                bombs += u64::from(self.m_is_bomb(v));
                self.mv[v].alive = false;
                self.mv[v].val = None;
            }
            stack.extend(std::mem::take(&mut self.ms[s].kids));
        }
        self.booms += bombs;
        bombs
    }

    /// Erases matching variables; returns how many, and how many were bombs.
    fn m_erase(&mut self, s: usize, mut pred: impl FnMut(&str) -> bool) -> (usize, u64) {
        let vars = std::mem::take(&mut self.ms[s].vars);
        let mut kept = Vec::new();
        let mut n = 0;
        let mut bombs = 0;
        for v in vars {
            if pred(&self.mv[v].name) {
                bombs += u64::from(self.m_is_bomb(v));
                self.mv[v].alive = false;
                self.mv[v].val = None;
                n += 1;
            } else {
                kept.push(v);
            }
        }
        self.ms[s].vars = kept;
        self.booms += bombs;
        (n, bombs)
    }

    fn m_unique(&mut self, s: usize, prefix: &str) -> String {
        loop {
            let name = format!("{prefix}_{}", self.counter);
            self.counter += 1;
            if self.m_local(s, &name).is_none() {
                return name;
            }
        }
    }

    fn m_read(&self, vid: VarId, m: Option<usize>, ty: Ty) -> Result<usize, Error> {
        let v = self.m_var(vid, m)?;
        let mv = &self.mv[v];
        let scope = self.m_error_path(mv.owner);
        match &mv.val {
            None => Err(Error::Uninitialized {
                name: cut_name(&mv.name),
                scope,
                expected: ty.full_name(),
            }),
            Some(x) if x.ty() != ty => Err(Error::TypeMismatch {
                name: cut_name(&mv.name),
                scope,
                expected: ty.full_name(),
                found: x.ty().full_name(),
            }),
            Some(_) => Ok(v),
        }
    }

    // --- recording new handles ---

    fn new_scope(&mut self, id: ScopeId, parent: usize, name: Option<String>) -> R<usize> {
        if id.tree() != self.tree.tag() || !self.seen_s.insert(id) {
            return fail(format!(
                "new scope handle {id:?} was issued before (aliasing)"
            ));
        }
        let comp = name
            .clone()
            .unwrap_or_else(|| format!("#{}", slot_of(&format!("{id:?}"))));
        let i = self.ms.len();
        MAX_DEPTH.fetch_max(self.ms[parent].depth as u64 + 1, Relaxed);
        self.ms.push(MScope {
            alive: true,
            parent: Some(parent),
            kids: Vec::new(),
            vars: Vec::new(),
            name,
            comp,
            depth: self.ms[parent].depth + 1,
        });
        self.ms[parent].kids.push(i);
        self.sids.push(id);
        Ok(i)
    }

    fn new_var(&mut self, id: VarId, owner: usize, name: String) -> R<usize> {
        if id.tree() != self.tree.tag() || !self.seen_v.insert(id) {
            return fail(format!(
                "new variable handle {id:?} was issued before (aliasing)"
            ));
        }
        let i = self.mv.len();
        self.mv.push(MVar {
            alive: true,
            owner,
            name,
            val: None,
        });
        self.ms[owner].vars.push(i);
        self.vids.push(id);
        let n = self.ms[owner].vars.len();
        MAX_LOCAL.fetch_max(n as u64, Relaxed);
        if n > 16 && self.indexed.insert(owner) {
            INDEXED_SCOPES.fetch_add(1, Relaxed);
        }
        Ok(i)
    }

    // --- one operation ---

    fn step(&mut self, op: &Op) -> R {
        OPS.fetch_add(1, Relaxed);
        match op {
            Op::NewScope(p) => {
                let (pid, pm) = self.scope(*p);
                let act = self.tree.new_scope(pid);
                match (act, self.m_scope(pid, pm)) {
                    (Ok(id), Ok(pi)) => {
                        self.new_scope(id, pi, None)?;
                    }
                    (a, e) => same!(a.map(|_| ()), e.map(|_| ()), "new_scope({pid:?})"),
                }
            }
            Op::NewNamedScope(p, n) => {
                let (pid, pm) = self.scope(*p);
                let a = self.arg(*n);
                let act = self.tree.new_named_scope(pid, a.as_ref());
                let exp = self.m_scope(pid, pm).and_then(|pi| {
                    let name = self.m_name(&a)?;
                    match self.m_kid(pi, &name) {
                        Some(_) => Err(Error::ScopeNameTaken {
                            name: name.clone(),
                            scope: self.m_error_path(pi),
                        }),
                        None => Ok((pi, name)),
                    }
                });
                match (act, exp) {
                    (Ok(id), Ok((pi, name))) => {
                        self.new_scope(id, pi, Some(name))?;
                    }
                    (a, e) => same!(a.map(|_| ()), e.map(|_| ()), "new_named_scope({pid:?})"),
                }
            }
            Op::Kid(p, n) => {
                let (pid, pm) = self.scope(*p);
                let a = self.arg(*n);
                let act = self.tree.kid(pid, a.as_ref());
                let exp = self.m_scope(pid, pm).and_then(|pi| {
                    let name = self.m_name(&a)?;
                    Ok(self.m_kid(pi, &name).map(|k| self.sids[k]))
                });
                same!(act, exp, "kid({pid:?}, {:?})", a.text);
            }
            Op::DeleteScope(s) => {
                let (sid, sm) = self.scope(*s);
                let act = guarded(|| self.tree.delete_scope(sid));
                let exp = self.m_scope(sid, sm).and_then(|si| {
                    if si == 0 {
                        Err(Error::RootScope)
                    } else {
                        Ok(si)
                    }
                });
                let bombs = exp.as_ref().map_or(0, |&si| self.m_delete(si));
                settle(
                    act,
                    &exp.map(|_| ()),
                    bombs,
                    format!("delete_scope({sid:?})"),
                )?;
            }
            Op::DeleteKid(p, k) => {
                let (pid, pm) = self.scope(*p);
                let (kid, km) = self.scope(*k);
                let act = guarded(|| self.tree.delete_kid(pid, kid));
                let exp = self.m_scope(pid, pm).and_then(|pi| {
                    let ki = self.m_scope(kid, km)?;
                    if self.ms[ki].parent == Some(pi) {
                        Ok(ki)
                    } else {
                        Err(Error::NotAKid {
                            kid: self.m_error_path(ki),
                            scope: self.m_error_path(pi),
                        })
                    }
                });
                let bombs = exp.as_ref().map_or(0, |&ki| self.m_delete(ki));
                let ctx = format!("delete_kid({pid:?}, {kid:?})");
                settle(act, &exp.map(|_| ()), bombs, ctx)?;
            }
            Op::DropKids(s) => {
                let (sid, sm) = self.scope(*s);
                let act = guarded(|| self.tree.drop_kids(sid));
                let exp = self.m_scope(sid, sm);
                let mut bombs = 0;
                if let Ok(si) = exp {
                    for k in self.ms[si].kids.clone() {
                        bombs += self.m_delete(k);
                    }
                }
                settle(act, &exp.map(|_| ()), bombs, format!("drop_kids({sid:?})"))?;
            }
            Op::HasKid(p, k) => {
                let (pid, pm) = self.scope(*p);
                let (kid, km) = self.scope(*k);
                let act = self.tree.has_kid(pid, kid);
                let exp = self.m_scope(pid, pm).and_then(|pi| {
                    let ki = self.m_scope(kid, km)?;
                    Ok(self.ms[ki].parent == Some(pi))
                });
                same!(act, exp, "has_kid({pid:?}, {kid:?})");
            }
            Op::Chain(s, n) => {
                let (mut sid, mut sm) = self.scope(*s);
                for j in 0..*n {
                    let act = if j % 5 == 4 {
                        self.tree
                            .new_named_scope(sid, names()[INVALID + j].as_str())
                    } else {
                        self.tree.new_scope(sid)
                    };
                    match (act, self.m_scope(sid, sm)) {
                        (Ok(id), Ok(pi)) => {
                            let name = (j % 5 == 4).then(|| names()[INVALID + j].clone());
                            let i = self.new_scope(id, pi, name)?;
                            (sid, sm) = (id, Some(i));
                        }
                        (x, e) => {
                            same!(x.map(|_| ()), e.map(|_| ()), "chain below {sid:?}");
                            break;
                        }
                    }
                }
            }
            Op::Var(s, n) => {
                let (sid, sm) = self.scope(*s);
                let a = self.arg(*n);
                self.do_var(sid, sm, &a)?;
            }
            Op::VarEntry(s, n, true) => {
                let (sid, sm) = self.scope(*s);
                let a = self.arg(*n);
                let act = self
                    .tree
                    .var_entry(sid, a.as_ref())
                    .and_then(|e| e.or_create());
                self.check_var(act, sid, sm, &a, "var_entry.or_create")?;
            }
            Op::VarEntry(s, n, false) => {
                let (sid, sm) = self.scope(*s);
                let a = self.arg(*n);
                let act = self.tree.var_entry(sid, a.as_ref()).map(|e| e.id());
                let exp = self.m_scope(sid, sm).and_then(|si| {
                    let name = self.m_name(&a)?;
                    Ok(self.m_local(si, &name).map(|v| self.vids[v]))
                });
                same!(act, exp, "var_entry({sid:?}, {:?}).id()", a.text);
            }
            Op::Fill(s, start, n) => {
                let (sid, sm) = self.scope(*s);
                let plain = names().len() - INVALID;
                for j in 0..*n {
                    let a = self.arg_text(&names()[INVALID + (start + j) % plain], j % 3 == 0);
                    self.do_var(sid, sm, &a)?;
                }
            }
            Op::CreateVar(s, n) => {
                let (sid, sm) = self.scope(*s);
                let a = self.arg(*n);
                let act = self.tree.create_var(sid, a.as_ref());
                let exp = self.m_scope(sid, sm).and_then(|si| {
                    let name = self.m_name(&a)?;
                    match self.m_local(si, &name) {
                        Some(_) => Err(Error::NameTaken {
                            name,
                            scope: self.m_error_path(si),
                        }),
                        None => Ok((si, name)),
                    }
                });
                match (act, exp) {
                    (Ok(id), Ok((si, name))) => {
                        self.new_var(id, si, name)?;
                    }
                    (x, e) => same!(
                        x.map(|_| ()),
                        e.map(|_| ()),
                        "create_var({sid:?}, {:?})",
                        a.text
                    ),
                }
            }
            Op::UniqueVar(s, n) => {
                let (sid, sm) = self.scope(*s);
                let prefix = names()[nref_index(*n)].clone();
                let act = self.tree.unique_var(sid, &prefix);
                let exp = self.m_scope(sid, sm).and_then(|si| {
                    m_validate(&prefix)?;
                    Ok(si)
                });
                match (act, exp) {
                    (Ok(id), Ok(si)) => {
                        let name = self.m_unique(si, &prefix);
                        same!(self.tree.var_name(id), Ok(name.as_str()), "unique_var name");
                        self.new_var(id, si, name)?;
                    }
                    (a, e) => same!(
                        a.map(|_| ()),
                        e.map(|_| ()),
                        "unique_var({sid:?}, {prefix:?})"
                    ),
                }
            }
            Op::FindVar(s, n) | Op::FindLocalVar(s, n) | Op::GetVar(s, n) | Op::FindScope(s, n) => {
                let (sid, sm) = self.scope(*s);
                let a = self.arg(*n);
                let found = self.m_scope(sid, sm).and_then(|si| {
                    let name = self.m_name(&a)?;
                    Ok((si, self.m_find(si, &name), self.m_local(si, &name)))
                });
                match op {
                    Op::FindVar(..) => {
                        let exp = found.map(|(_, f, _)| f.map(|(_, v)| self.vids[v]));
                        same!(
                            self.tree.find_var(sid, a.as_ref()),
                            exp,
                            "find_var {:?}",
                            a.text
                        );
                    }
                    Op::FindLocalVar(..) => {
                        let exp = found.map(|(_, _, l)| l.map(|v| self.vids[v]));
                        same!(
                            self.tree.find_local_var(sid, a.as_ref()),
                            exp,
                            "find_local_var {:?}",
                            a.text
                        );
                    }
                    Op::GetVar(..) => {
                        let exp = found.and_then(|(si, f, _)| match f {
                            Some((_, v)) => Ok(self.vids[v]),
                            None => Err(Error::NotFound {
                                name: cut_name(&a.text),
                                scope: self.m_error_path(si),
                            }),
                        });
                        same!(
                            self.tree.get_var(sid, a.as_ref()),
                            exp,
                            "get_var {:?}",
                            a.text
                        );
                    }
                    _ => {
                        let exp = found.map(|(_, f, _)| f.map(|(s, _)| self.sids[s]));
                        same!(
                            self.tree.find_scope(sid, a.as_ref()),
                            exp,
                            "find_scope {:?}",
                            a.text
                        );
                    }
                }
            }
            Op::EraseVars(s, ns) | Op::EraseVarsExcept(s, ns) => {
                let except = matches!(op, Op::EraseVarsExcept(..));
                let (sid, sm) = self.scope(*s);
                let args: Vec<Arg> = ns.iter().map(|n| self.arg(*n)).collect();
                self.do_erase(sid, sm, &args, except)?;
            }
            Op::EraseKeepLocal(s, ix) => {
                let (sid, sm) = self.scope(*s);
                let args: Vec<Arg> = ix
                    .iter()
                    .map(|&i| {
                        let t = self.local_name(sm, i);
                        self.arg_text(&t, i % 2 == 0)
                    })
                    .collect();
                self.do_erase(sid, sm, &args, true)?;
            }
            Op::RemoveVar(v) => {
                let (vid, vm) = self.var(*v);
                let act = guarded(|| self.tree.remove_var(vid));
                let exp = self.m_var(vid, vm);
                let bombs = exp.as_ref().map_or(0, |&vi| u64::from(self.m_is_bomb(vi)));
                self.booms += bombs;
                settle(
                    act,
                    &exp.clone().map(|_| ()),
                    bombs,
                    format!("remove_var({vid:?})"),
                )?;
                if let Ok(vi) = exp {
                    let owner = self.mv[vi].owner;
                    self.ms[owner].vars.retain(|&x| x != vi);
                    self.mv[vi].alive = false;
                    self.mv[vi].val = None;
                }
            }
            Op::Rename(s, old, new) => {
                let (sid, sm) = self.scope(*s);
                let (old, new) = (self.arg(*old), self.arg(*new));
                self.do_rename(sid, sm, &old, &new)?;
            }
            Op::RenameLocal(s, i, as_sym, new) => {
                let (sid, sm) = self.scope(*s);
                let t = self.local_name(sm, *i);
                let old = self.arg_text(&t, *as_sym);
                let new = self.arg(*new);
                self.do_rename(sid, sm, &old, &new)?;
            }
            Op::RenameUnique(s, n) => {
                let (sid, sm) = self.scope(*s);
                let old = names()[nref_index(*n)].clone();
                self.do_rename_unique(sid, sm, &old)?;
            }
            Op::RenameUniqueLocal(s, i) => {
                let (sid, sm) = self.scope(*s);
                let old = self.local_name(sm, *i);
                self.do_rename_unique(sid, sm, &old)?;
            }
            Op::Set(v, x) => {
                let (vid, vm) = self.var(*v);
                let exp = self.m_var(vid, vm);
                // A bomb handed to a call that fails would go off in the error path.
                let x = if exp.is_ok() {
                    x.clone()
                } else {
                    x.clone().defused()
                };
                let act = guarded(|| tree_set(&mut self.tree, vid, x.clone()));
                let bombs = exp.as_ref().map_or(0, |&vi| u64::from(self.m_is_bomb(vi)));
                self.booms += bombs;
                settle(
                    act,
                    &exp.clone().map(|_| ()),
                    bombs,
                    format!("set({vid:?})"),
                )?;
                if let Ok(vi) = exp {
                    self.mv[vi].val = Some(x);
                }
            }
            Op::Get(v, ty) => {
                let (vid, vm) = self.var(*v);
                let act = tree_get(&self.tree, vid, *ty);
                let exp = self
                    .m_read(vid, vm, *ty)
                    .map(|vi| self.mv[vi].val.clone().unwrap_or(Val::U64(0)));
                same!(act, exp, "get({vid:?}, {ty:?})");
            }
            Op::GetMut(v, ty) => {
                let (vid, vm) = self.var(*v);
                let t = &mut self.tree;
                let act = match ty {
                    Ty::U64 => t.get_mut::<u64>(vid).map(bump_u64),
                    Ty::Str => t.get_mut::<String>(vid).map(bump_str),
                    Ty::Vec => t.get_mut::<Vec<f32>>(vid).map(bump_vec),
                    Ty::Bomb => t.get_mut::<Bomb>(vid).map(bump_bomb),
                };
                let exp = self.m_read(vid, vm, *ty);
                same!(act, exp.clone().map(|_| ()), "get_mut({vid:?}, {ty:?})");
                if let Ok(vi) = exp {
                    if let Some(x) = self.mv[vi].val.as_mut() {
                        bump(x);
                    }
                }
            }
            Op::Replace(v, x) => {
                let (vid, vm) = self.var(*v);
                let x = x.clone().defused();
                let t = &mut self.tree;
                let act = match x.clone() {
                    Val::U64(x) => t.replace(vid, x).map(|o| o.map(Val::U64)),
                    Val::Str(x) => t.replace(vid, x).map(|o| o.map(Val::Str)),
                    Val::Vec(x) => t.replace(vid, x).map(|o| o.map(Val::Vec)),
                    Val::Bomb(_) => unreachable!("defused above"),
                };
                let exp = self.m_var(vid, vm).and_then(|vi| match &self.mv[vi].val {
                    None => Ok((vi, None)),
                    Some(_) => self
                        .m_read(vid, vm, x.ty())
                        .map(|_| (vi, self.mv[vi].val.clone())),
                });
                same!(act, exp.clone().map(|(_, o)| o), "replace({vid:?})");
                if let Ok((vi, _)) = exp {
                    self.mv[vi].val = Some(x.clone());
                }
            }
            Op::Take(v, ty) => {
                let (vid, vm) = self.var(*v);
                let t = &mut self.tree;
                let act = match ty {
                    Ty::U64 => t.take::<u64>(vid).map(Val::U64),
                    Ty::Str => t.take::<String>(vid).map(Val::Str),
                    Ty::Vec => t.take::<Vec<f32>>(vid).map(Val::Vec),
                    Ty::Bomb => t.take::<Bomb>(vid).map(|b| {
                        let v = Val::Bomb(b.id);
                        std::mem::forget(b); // taken out whole: not dropped
                        v
                    }),
                };
                let exp = self.m_read(vid, vm, *ty);
                let exp_val = exp
                    .clone()
                    .map(|vi| self.mv[vi].val.clone().unwrap_or(Val::U64(0)));
                same!(act, exp_val, "take({vid:?}, {ty:?})");
                if let Ok(vi) = exp {
                    self.mv[vi].val = None;
                }
            }
            Op::Clear(v) => {
                let (vid, vm) = self.var(*v);
                let act = guarded(|| self.tree.clear(vid));
                let exp = self.m_var(vid, vm);
                let bombs = exp.as_ref().map_or(0, |&vi| u64::from(self.m_is_bomb(vi)));
                self.booms += bombs;
                let want = exp.clone().map(|vi| self.mv[vi].val.is_some());
                settle(act, &want, bombs, format!("clear({vid:?})"))?;
                if let Ok(vi) = exp {
                    self.mv[vi].val = None;
                }
            }
            Op::Is(v, ty) => {
                let (vid, vm) = self.var(*v);
                let act = match ty {
                    Ty::U64 => self.tree.is::<u64>(vid),
                    Ty::Str => self.tree.is::<String>(vid),
                    Ty::Vec => self.tree.is::<Vec<f32>>(vid),
                    Ty::Bomb => self.tree.is::<Bomb>(vid),
                };
                let exp = self
                    .m_var(vid, vm)
                    .map(|vi| self.mv[vi].val.as_ref().is_some_and(|x| x.ty() == *ty));
                same!(act, exp, "is({vid:?}, {ty:?})");
            }
            Op::GetOrDefault(v, ty) => {
                let (vid, vm) = self.var(*v);
                let t = &mut self.tree;
                let act = match ty {
                    Ty::U64 | Ty::Bomb => t.get_or_default::<u64>(vid).map(bump_u64),
                    Ty::Str => t.get_or_default::<String>(vid).map(bump_str),
                    Ty::Vec => t.get_or_default::<Vec<f32>>(vid).map(bump_vec),
                };
                self.after_get_or_insert(vid, vm, ty.default_val(), act)?;
            }
            Op::GetOrInsertWith(v, x) => {
                let (vid, vm) = self.var(*v);
                let x = x.clone().defused();
                let t = &mut self.tree;
                let act = match x.clone() {
                    Val::U64(x) => t.get_or_insert_with(vid, || x).map(bump_u64),
                    Val::Str(x) => t.get_or_insert_with(vid, || x).map(bump_str),
                    Val::Vec(x) => t.get_or_insert_with(vid, || x).map(bump_vec),
                    Val::Bomb(_) => unreachable!("defused above"),
                };
                self.after_get_or_insert(vid, vm, x.clone(), act)?;
            }
            Op::GetDisjointMut(a, b, ty) => {
                let (aid, am) = self.var(*a);
                let (bid, bm) = self.var(*b);
                let t = &mut self.tree;
                let act = match ty {
                    Ty::U64 => t.get_disjoint_mut::<u64, 2>([aid, bid]).map(|[x, y]| {
                        bump_u64(x);
                        bump_u64(y);
                    }),
                    Ty::Str => t.get_disjoint_mut::<String, 2>([aid, bid]).map(|[x, y]| {
                        bump_str(x);
                        bump_str(y);
                    }),
                    Ty::Vec => t.get_disjoint_mut::<Vec<f32>, 2>([aid, bid]).map(|[x, y]| {
                        bump_vec(x);
                        bump_vec(y);
                    }),
                    Ty::Bomb => t.get_disjoint_mut::<Bomb, 2>([aid, bid]).map(|[x, y]| {
                        bump_bomb(x);
                        bump_bomb(y);
                    }),
                };
                let exp = self.m_read(aid, am, *ty).and_then(|ai| {
                    let bi = self.m_read(bid, bm, *ty)?;
                    if ai == bi {
                        let mv = &self.mv[bi];
                        Err(Error::AliasedVar {
                            name: cut_name(&mv.name),
                            scope: self.m_error_path(mv.owner),
                        })
                    } else {
                        Ok((ai, bi))
                    }
                });
                same!(
                    act,
                    exp.clone().map(|_| ()),
                    "get_disjoint_mut({aid:?}, {bid:?})"
                );
                if let Ok((ai, bi)) = exp {
                    if let Some(x) = self.mv[ai].val.as_mut() {
                        bump(x);
                    }
                    if let Some(x) = self.mv[bi].val.as_mut() {
                        bump(x);
                    }
                }
            }
            Op::Intern(n) => {
                let a = self.arg(*n);
                if let Some(f) = a.foreign {
                    same!(
                        self.tree.resolve(f),
                        Err(Error::ForeignSymbol {
                            symbol: f,
                            tree: self.tree.tag()
                        }),
                        "resolve(foreign)"
                    );
                } else {
                    let act = self.tree.intern(&a.text);
                    let exp = m_validate(&a.text);
                    same!(act.clone().map(|_| ()), exp, "intern({:?})", a.text);
                    if let Ok(sym) = act {
                        if let Some(prev) = self.syms.insert(a.text.clone(), sym) {
                            same!(sym, prev, "intern({:?}) twice", a.text);
                        }
                        same!(self.tree.resolve(sym), Ok(a.text.as_str()), "resolve");
                        same!(self.tree.symbol(&a.text), Some(sym), "symbol");
                        MAX_SYMBOLS.fetch_max(u64::from(sym.index()) + 1, Relaxed);
                    }
                }
            }
            Op::Dump(s) => {
                let (sid, sm) = self.scope(*s);
                let act = self.tree.dump(sid).map(|d| d.to_string());
                let exp = self.m_scope(sid, sm).map(|si| self.m_dump(si));
                same!(act, exp, "dump({sid:?})");
                if let Ok(si) = self.m_scope(sid, sm) {
                    let dot = self.tree.to_dot(sid).map(|d| d.to_string());
                    let size = self.m_preorder(si).len();
                    let Ok(dot) = dot else {
                        return fail(format!("to_dot({sid:?}) failed: {dot:?}"));
                    };
                    same!(dot.matches(" -> ").count(), size - 1, "to_dot edges");
                    same!(dot.matches("[label=").count(), size, "to_dot nodes");
                }
            }
        }
        Ok(())
    }

    fn do_var(&mut self, sid: ScopeId, sm: Option<usize>, a: &Arg) -> R {
        let act = self.tree.var(sid, a.as_ref());
        self.check_var(act, sid, sm, a, "var")
    }

    /// Checks a get-or-create of `a` in `sid` (`var`, or an entry's
    /// `or_create`) against the model, recording a new variable.
    fn check_var(
        &mut self,
        act: Result<VarId, Error>,
        sid: ScopeId,
        sm: Option<usize>,
        a: &Arg,
        what: &str,
    ) -> R {
        let exp = self.m_scope(sid, sm).and_then(|si| {
            let name = self.m_name(a)?;
            Ok((si, self.m_local(si, &name), name))
        });
        match (act, exp) {
            (Ok(id), Ok((_, Some(v), _))) => same!(id, self.vids[v], "{what}(get) {:?}", a.text),
            (Ok(id), Ok((si, None, name))) => {
                self.new_var(id, si, name)?;
            }
            (a2, e) => same!(
                a2.map(|_| ()),
                e.map(|_| ()),
                "{what}({sid:?}, {:?})",
                a.text
            ),
        }
        Ok(())
    }

    fn do_erase(&mut self, sid: ScopeId, sm: Option<usize>, args: &[Arg], except: bool) -> R {
        let refs: Vec<NameRef<'_>> = args.iter().map(Arg::as_ref).collect();
        let act = guarded(|| {
            if except {
                self.tree.erase_vars_except(sid, refs.iter().copied())
            } else {
                self.tree.erase_vars(sid, refs.iter().copied())
            }
        });
        let exp = self.m_scope(sid, sm).and_then(|si| {
            let ns = args
                .iter()
                .map(|a| self.m_name(a))
                .collect::<Result<HashSet<String>, Error>>()?;
            Ok((si, ns))
        });
        let ctx = format!("erase(except: {except}) {sid:?}");
        match exp {
            Ok((si, ns)) => {
                let (n, bombs) = self.m_erase(si, |name| ns.contains(name) != except);
                settle(act, &Ok(n), bombs, ctx)
            }
            Err(e) => settle(act, &Err(e), 0, ctx),
        }
    }

    fn do_rename(&mut self, sid: ScopeId, sm: Option<usize>, old: &Arg, new: &Arg) -> R {
        let act = self.tree.rename(sid, old.as_ref(), new.as_ref());
        let exp = self.m_scope(sid, sm).and_then(|si| {
            let o = self.m_name(old)?;
            let Some(v) = self.m_local(si, &o) else {
                self.m_name(new)?;
                return Err(Error::NotFound {
                    name: cut_name(&old.text),
                    scope: self.m_error_path(si),
                });
            };
            let n = self.m_name(new)?;
            match self.m_local(si, &n) {
                Some(w) if w != v => Err(Error::NameTaken {
                    name: n,
                    scope: self.m_error_path(si),
                }),
                _ => Ok((v, n)),
            }
        });
        same!(
            act,
            exp.clone().map(|(v, _)| self.vids[v]),
            "rename({sid:?}, {:?}, {:?})",
            old.text,
            new.text
        );
        if let Ok((v, n)) = exp {
            self.mv[v].name = n;
        }
        Ok(())
    }

    fn do_rename_unique(&mut self, sid: ScopeId, sm: Option<usize>, old: &str) -> R {
        let act = self.tree.rename_unique(sid, old).map(str::to_owned);
        let exp = self.m_scope(sid, sm).and_then(|si| {
            m_validate(old)?;
            match self.m_local(si, old) {
                Some(v) => Ok((si, v)),
                None => Err(Error::NotFound {
                    name: cut_name(old),
                    scope: self.m_error_path(si),
                }),
            }
        });
        match exp {
            Ok((si, v)) => {
                let n = self.m_unique(si, old);
                same!(act, Ok(n.clone()), "rename_unique({sid:?}, {old:?})");
                self.mv[v].name = n;
            }
            Err(e) => same!(act, Err(e), "rename_unique({sid:?}, {old:?})"),
        }
        Ok(())
    }

    fn after_get_or_insert(
        &mut self,
        vid: VarId,
        vm: Option<usize>,
        init: Val,
        act: Result<(), Error>,
    ) -> R {
        let exp = self.m_var(vid, vm);
        let exp = match exp {
            Ok(vi) => {
                if self.mv[vi].val.is_none() {
                    self.mv[vi].val = Some(init.clone());
                }
                self.m_read(vid, vm, init.ty())
            }
            Err(e) => Err(e),
        };
        same!(
            act,
            exp.clone().map(|_| ()),
            "get_or_insert({vid:?}, {:?})",
            init.ty()
        );
        if let Ok(vi) = exp {
            if let Some(x) = self.mv[vi].val.as_mut() {
                bump(x);
            }
        }
        Ok(())
    }

    fn m_preorder(&self, top: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut stack = vec![(top, 0)];
        while let Some((s, d)) = stack.pop() {
            out.push((s, d));
            for &k in self.ms[s].kids.iter().rev() {
                stack.push((k, d + 1));
            }
        }
        out
    }

    fn m_dump(&self, top: usize) -> String {
        let mut out = String::new();
        for (s, d) in self.m_preorder(top) {
            let mut indent = "  ".repeat(d.min(32));
            if d > 32 {
                indent.push_str(&format!("[depth {d}] "));
            }
            let label = if s == top {
                let p = self.m_path(s);
                if p.is_empty() { "<root>".to_owned() } else { p }
            } else {
                self.ms[s].comp.clone()
            };
            out.push_str(&format!("{indent}scope {label}\n"));
            for &v in &self.ms[s].vars {
                let ty = self.mv[v]
                    .val
                    .as_ref()
                    .map_or("<uninitialised>", |x| x.ty().short_name());
                out.push_str(&format!("{indent}  {}: {ty}\n", self.mv[v].name));
            }
        }
        out
    }

    // --- observables after every step ---

    fn check(&self, grid: bool) -> R {
        let t = &self.tree;
        let live_s = self.ms.iter().filter(|s| s.alive).count();
        let live_v = self.mv.iter().filter(|v| v.alive).count();
        same!(t.scope_count(), live_s, "scope_count");
        same!(t.var_count(), live_v, "var_count");
        same!(
            BOOMS.with(Cell::get),
            self.booms,
            "bombs dropped (each exactly once)"
        );
        if t.heap_bytes() == 0 {
            return fail("heap_bytes() is 0 for a tree with a root".to_owned());
        }

        let live_slots: HashSet<String> = (0..self.sids.len())
            .filter(|&i| self.ms[i].alive)
            .map(|i| slot_index(&format!("{:?}", self.sids[i])))
            .chain(
                (0..self.vids.len())
                    .filter(|&i| self.mv[i].alive)
                    .map(|i| format!("var{}", slot_index(&format!("{:?}", self.vids[i])))),
            )
            .collect();

        for (i, &id) in self.sids.iter().enumerate() {
            let m = &self.ms[i];
            same!(t.contains_scope(id), m.alive, "contains_scope({id:?})");
            if !m.alive {
                if live_slots.contains(&slot_index(&format!("{id:?}"))) {
                    STALE_REUSED.fetch_add(1, Relaxed);
                }
                let stale = Error::StaleScope { scope: id };
                same!(t.parent(id), Err(stale.clone()), "parent(stale)");
                same!(
                    t.local_var_count(id),
                    Err(stale.clone()),
                    "local_var_count(stale)"
                );
                same!(t.kids(id).map(|_| ()), Err(stale.clone()), "kids(stale)");
                same!(t.path(id), Err(stale.clone()), "path(stale)");
                same!(t.find_var(id, "v1"), Err(stale), "find_var(stale)");
                continue;
            }
            same!(
                t.parent(id),
                Ok(m.parent.map(|p| self.sids[p])),
                "parent({id:?})"
            );
            same!(t.depth(id), Ok(m.depth), "depth({id:?})");
            same!(
                t.scope_name(id),
                Ok(m.name.as_deref()),
                "scope_name({id:?})"
            );
            same!(t.path(id), Ok(self.m_path(i)), "path({id:?})");
            let kids: Vec<ScopeId> = m.kids.iter().map(|&k| self.sids[k]).collect();
            same!(
                t.kids(id).map(|k| k.collect::<Vec<_>>()),
                Ok(kids.clone()),
                "kids({id:?})"
            );
            same!(t.kid_count(id), Ok(kids.len()), "kid_count({id:?})");
            let vars: Vec<(&str, VarId)> = m
                .vars
                .iter()
                .map(|&v| (self.mv[v].name.as_str(), self.vids[v]))
                .collect();
            same!(
                t.local_vars(id).map(|l| l.collect::<Vec<_>>()),
                Ok(vars.clone()),
                "local_vars({id:?})"
            );
            same!(
                t.local_vars(id).map(|l| l.rev().collect::<Vec<_>>()),
                Ok(vars.iter().rev().copied().collect::<Vec<_>>()),
                "local_vars({id:?}).rev()"
            );
            same!(
                t.local_var_names(id).map(|l| l.collect::<Vec<_>>()),
                Ok(vars.iter().map(|(n, _)| *n).collect::<Vec<_>>()),
                "local_var_names({id:?})"
            );
            same!(
                t.local_var_count(id),
                Ok(vars.len()),
                "local_var_count({id:?})"
            );
            let mut up = Vec::new();
            let mut k = Some(i);
            while let Some(j) = k {
                up.push(self.sids[j]);
                k = self.ms[j].parent;
            }
            same!(
                t.ancestors(id).map(|a| a.collect::<Vec<_>>()),
                Ok(up),
                "ancestors({id:?})"
            );
        }

        for (i, &id) in self.vids.iter().enumerate() {
            let m = &self.mv[i];
            same!(t.contains_var(id), m.alive, "contains_var({id:?})");
            if !m.alive {
                if live_slots.contains(&format!("var{}", slot_index(&format!("{id:?}")))) {
                    STALE_REUSED.fetch_add(1, Relaxed);
                }
                let stale = Error::StaleVar { var: id };
                same!(t.owner(id), Err(stale.clone()), "owner(stale)");
                same!(t.var_name(id), Err(stale.clone()), "var_name(stale)");
                same!(
                    t.is_initialized(id),
                    Err(stale.clone()),
                    "is_initialized(stale)"
                );
                same!(t.get::<u64>(id).copied(), Err(stale), "get(stale)");
                continue;
            }
            same!(t.owner(id), Ok(self.sids[m.owner]), "owner({id:?})");
            same!(t.var_name(id), Ok(m.name.as_str()), "var_name({id:?})");
            let p = self.m_path(m.owner);
            let vp = if p.is_empty() {
                m.name.clone()
            } else {
                format!("{p}/{}", m.name)
            };
            same!(t.var_path(id), Ok(vp), "var_path({id:?})");
            same!(
                t.is_initialized(id),
                Ok(m.val.is_some()),
                "is_initialized({id:?})"
            );
            same!(
                t.type_name(id),
                Ok(m.val.as_ref().map(|x| x.ty().full_name())),
                "type_name({id:?})"
            );
            if let Some(x) = &m.val {
                same!(tree_get(t, id, x.ty()), Ok(x.clone()), "value of {id:?}");
            }
        }

        let pre: Vec<(ScopeId, usize)> = self
            .m_preorder(0)
            .into_iter()
            .map(|(s, d)| (self.sids[s], d))
            .collect();
        same!(
            t.descendants(t.root()).map(|d| d.collect::<Vec<_>>()),
            Ok(pre),
            "descendants(root)"
        );

        if grid {
            self.check_lookups()?;
        }
        Ok(())
    }

    /// Every lookup from every live scope, for every name of a live variable
    /// and every plain name of the universe, by text and (when interned) by
    /// symbol.
    fn check_lookups(&self) -> R {
        let t = &self.tree;
        let mut probe: Vec<String> = names()[INVALID..].to_vec();
        let extra: HashSet<&String> = self
            .mv
            .iter()
            .filter(|v| v.alive)
            .map(|v| &v.name)
            .collect();
        probe.extend(extra.into_iter().cloned());
        // Per scope: name -> var, for a fast model walk.
        let local: Vec<HashMap<&str, usize>> = self
            .ms
            .iter()
            .map(|s| {
                s.vars
                    .iter()
                    .map(|&v| (self.mv[v].name.as_str(), v))
                    .collect()
            })
            .collect();
        for (i, s) in self.ms.iter().enumerate() {
            if !s.alive {
                continue;
            }
            let id = self.sids[i];
            for name in &probe {
                let mut k = Some(i);
                let mut found = None;
                while let Some(j) = k {
                    if let Some(&v) = local[j].get(name.as_str()) {
                        found = Some((j, v));
                        break;
                    }
                    k = self.ms[j].parent;
                }
                let exp_var = found.map(|(_, v)| self.vids[v]);
                same!(
                    t.find_var(id, name),
                    Ok(exp_var),
                    "find_var({id:?}, {name:?})"
                );
                same!(
                    t.find_scope(id, name),
                    Ok(found.map(|(s, _)| self.sids[s])),
                    "find_scope({id:?}, {name:?})"
                );
                same!(
                    t.find_local_var(id, name),
                    Ok(local[i].get(name.as_str()).map(|&v| self.vids[v])),
                    "find_local_var({id:?}, {name:?})"
                );
                if let Some(sym) = t.symbol(name) {
                    same!(
                        t.find_var(id, sym),
                        Ok(exp_var),
                        "find_var({id:?}, sym {name:?})"
                    );
                }
                LOOKUPS.fetch_add(3, Relaxed);
            }
        }
        Ok(())
    }

    fn finish(&self) -> R {
        self.check(true)?;
        BOMBS.fetch_add(self.booms, Relaxed);
        let most = names()
            .iter()
            .chain(self.mv.iter().map(|v| &v.name))
            .filter_map(|n| self.tree.symbol(n))
            .map(|s| u64::from(s.index()) + 1)
            .max()
            .unwrap_or(0);
        MAX_SYMBOLS.fetch_max(most, Relaxed);
        // The other tree was only read and interned into; nothing leaked across.
        same!(self.other.var_count(), 1, "other tree var_count");
        same!(self.other.scope_count(), 2, "other tree scope_count");
        same!(
            self.other.get::<u64>(self.foreign_var).copied(),
            Ok(7),
            "other tree value"
        );
        // Dump of the whole tree.
        same!(
            self.tree.dump(self.tree.root()).map(|d| d.to_string()),
            Ok(self.m_dump(0)),
            "dump(root)"
        );
        Ok(())
    }
}

/// Names in errors: up to 64 characters whole, else the first 64 followed by
/// `… (N bytes)`.
fn cut_name(s: &str) -> String {
    if s.chars().count() <= 64 {
        s.to_owned()
    } else {
        format!(
            "{}… ({} bytes)",
            s.chars().take(64).collect::<String>(),
            s.len()
        )
    }
}

/// Paths in errors: whole up to 256 characters (each component cut as
/// names are), else the first and last 96 characters around `/…/`, followed
/// by ` (N bytes)` (no slash doubled where a cut meets one).
fn cut_path(s: &str) -> String {
    let cut = |p: &str| p.split('/').map(cut_name).collect::<Vec<_>>().join("/");
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= 256 {
        return cut(s);
    }
    let head: String = chars[..96].iter().collect();
    let tail: String = chars[chars.len() - 96..].iter().collect();
    format!(
        "{}/…/{} ({} bytes)",
        cut(head.trim_end_matches('/')),
        cut(tail.trim_start_matches('/')),
        s.len()
    )
}

fn valid(name: &str) -> bool {
    m_validate(name).is_ok()
}

/// Name validation, written out for the model.
fn m_validate(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        Err(Error::InvalidName {
            name: String::new(),
            reason: InvalidNameReason::Empty,
        })
    } else if name.contains('/') {
        Err(Error::InvalidName {
            name: name.chars().take(64).collect(),
            reason: InvalidNameReason::ContainsSeparator,
        })
    } else {
        Ok(())
    }
}

fn nref_index(n: NRef) -> usize {
    match n {
        NRef::Str(i) | NRef::Sym(i) | NRef::Foreign(i) => i,
    }
}

fn run_case(ops: &[Op]) -> R {
    let mut h = Harness::new();
    for (i, op) in ops.iter().enumerate() {
        h.step(op)
            .map_err(|e| TestCaseError::fail(format!("step {i} {op:?}: {e}")))?;
        h.check((i + 1) % GRID_EVERY == 0)
            .map_err(|e| TestCaseError::fail(format!("after step {i} {op:?}: {e}")))?;
    }
    h.finish()?;
    CASES.fetch_add(1, Relaxed);
    Ok(())
}

#[test]
fn tree_agrees_with_model() {
    let mut config = Config::default(); // honours PROPTEST_CASES
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = DEFAULT_CASES;
    }
    config.failure_persistence = Some(Box::new(FileFailurePersistence::Direct(
        "tests/model.proptest-regressions",
    )));
    let cases = config.cases;
    let mut runner = TestRunner::new(config);
    let strategy = prop::collection::vec(op(), 1..MAX_OPS);
    if let Err(e) = runner.run(&strategy, |ops| run_case(&ops)) {
        panic!("{e}");
    }
    eprintln!(
        "model: {} cases ({cases} asked), {} operations, no divergence; \
         {} stale-handle checks on reused slots, {} calls with foreign handles or symbols, \
         {} scopes grew past 16 variables (largest {}), up to {} symbols interned, \
         {} lookups compared, deepest scope {}, {} panicking drops survived",
        CASES.load(Relaxed),
        OPS.load(Relaxed),
        STALE_REUSED.load(Relaxed),
        FOREIGN_CALLS.load(Relaxed),
        INDEXED_SCOPES.load(Relaxed),
        MAX_LOCAL.load(Relaxed),
        MAX_SYMBOLS.load(Relaxed),
        LOOKUPS.load(Relaxed),
        MAX_DEPTH.load(Relaxed),
        BOMBS.load(Relaxed),
    );
}
