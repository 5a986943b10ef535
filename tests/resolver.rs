//! `Resolver`: a caller-owned cache of `find_var` answers. After any
//! sequence of operations on the tree, every answer (and every error) of a
//! resolver equals `ScopeTree::find_var`'s, whatever the resolver cached
//! before, whatever its capacity, and with a second tree in the mix.
//!
//! `PROPTEST_CASES` sets the number of cases (default 256).

use proptest::prelude::*;
use scopetree::{Error, Resolver, ScopeId, ScopeTree, Symbol, VarId};

/// Variable names the model draws from: few, so that shadowing, renames onto
/// a used name and erasures of a cached name are frequent.
const NAMES: [&str; 4] = ["a", "b", "c", "d"];
/// A name no operation ever interns.
const NEVER: &str = "never_interned";

#[derive(Clone, Debug)]
enum Op {
    NewScope {
        parent: usize,
    },
    NewNamed {
        parent: usize,
        name: usize,
    },
    Var {
        scope: usize,
        name: usize,
    },
    Erase {
        scope: usize,
        name: usize,
    },
    EraseExcept {
        scope: usize,
        keep: usize,
    },
    Rename {
        scope: usize,
        old: usize,
        new: usize,
    },
    RenameUnique {
        scope: usize,
        name: usize,
    },
    RemoveVar {
        var: usize,
    },
    Delete {
        scope: usize,
    },
    DropKids {
        scope: usize,
    },
    /// Delete a scope and create one under another parent at once, so the
    /// new scope takes the freed slot.
    Reparent {
        scope: usize,
        parent: usize,
    },
    /// A lookup through the sparse resolver only.
    Query {
        scope: usize,
        name: usize,
    },
    /// A lookup in the second tree through both resolvers.
    Other {
        scope: usize,
        name: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let i = || 0usize..64;
    let n = || 0..NAMES.len();
    prop_oneof![
        3 => i().prop_map(|parent| Op::NewScope { parent }),
        1 => (i(), n()).prop_map(|(parent, name)| Op::NewNamed { parent, name }),
        6 => (i(), n()).prop_map(|(scope, name)| Op::Var { scope, name }),
        2 => (i(), n()).prop_map(|(scope, name)| Op::Erase { scope, name }),
        1 => (i(), n()).prop_map(|(scope, keep)| Op::EraseExcept { scope, keep }),
        2 => (i(), n(), n()).prop_map(|(scope, old, new)| Op::Rename { scope, old, new }),
        1 => (i(), n()).prop_map(|(scope, name)| Op::RenameUnique { scope, name }),
        2 => i().prop_map(|var| Op::RemoveVar { var }),
        2 => i().prop_map(|scope| Op::Delete { scope }),
        1 => i().prop_map(|scope| Op::DropKids { scope }),
        1 => (i(), i()).prop_map(|(scope, parent)| Op::Reparent { scope, parent }),
        4 => (i(), n()).prop_map(|(scope, name)| Op::Query { scope, name }),
        1 => (i(), n()).prop_map(|(scope, name)| Op::Other { scope, name }),
    ]
}

struct Model {
    tree: ScopeTree,
    /// A second tree of the same shape as the first's start, so raw keys of
    /// the two trees coincide.
    other: ScopeTree,
    other_scopes: Vec<ScopeId>,
    /// Every scope handle ever made, live or not.
    scopes: Vec<ScopeId>,
    /// Every variable handle ever made, live or not.
    vars: Vec<VarId>,
    /// Asked about every (scope, name) after every operation.
    dense: Resolver,
    /// Asked only by `Query` and `Other`, so its entries live across many
    /// changes.
    sparse: Resolver,
}

fn pick<T: Copy>(v: &[T], i: usize) -> T {
    v[i % v.len()]
}

impl Model {
    fn new(capacity: usize) -> Self {
        let mut tree = ScopeTree::new();
        let mut other = ScopeTree::new();
        let root = tree.root();
        let a = tree.var(root, "a").unwrap();
        let mut other_scopes = vec![other.root()];
        other.var(other.root(), "a").unwrap();
        let kid = other.new_scope(other.root()).unwrap();
        other.var(kid, "b").unwrap();
        other_scopes.push(kid);
        Model {
            tree,
            other,
            other_scopes,
            scopes: vec![root],
            vars: vec![a],
            dense: Resolver::with_capacity(capacity),
            sparse: Resolver::with_capacity(capacity),
        }
    }

    fn apply(&mut self, op: &Op) {
        let t = &mut self.tree;
        let s = |i: usize| pick(&self.scopes, i);
        match *op {
            Op::NewScope { parent } => {
                if let Ok(k) = t.new_scope(s(parent)) {
                    self.scopes.push(k);
                }
            }
            Op::NewNamed { parent, name } => {
                if let Ok(k) = t.new_named_scope(s(parent), NAMES[name]) {
                    self.scopes.push(k);
                }
            }
            Op::Var { scope, name } => {
                if let Ok(v) = t.var(s(scope), NAMES[name]) {
                    self.vars.push(v);
                }
            }
            Op::Erase { scope, name } => {
                let _ = t.erase_vars(s(scope), [NAMES[name]]);
            }
            Op::EraseExcept { scope, keep } => {
                let _ = t.erase_vars_except(s(scope), [NAMES[keep]]);
            }
            Op::Rename { scope, old, new } => {
                let _ = t.rename(s(scope), NAMES[old], NAMES[new]);
            }
            Op::RenameUnique { scope, name } => {
                let _ = t.rename_unique(s(scope), NAMES[name]);
            }
            Op::RemoveVar { var } => {
                let _ = t.remove_var(pick(&self.vars, var));
            }
            Op::Delete { scope } => {
                let _ = t.delete_scope(s(scope));
            }
            Op::DropKids { scope } => {
                let _ = t.drop_kids(s(scope));
            }
            Op::Reparent { scope, parent } => {
                let (old, parent) = (s(scope), s(parent));
                if t.delete_scope(old).is_ok() {
                    if let Ok(k) = t.new_scope(parent) {
                        self.scopes.push(k);
                    }
                }
            }
            Op::Query { scope, name } => {
                let at = s(scope);
                let expect = t.find_var(at, NAMES[name]);
                assert_eq!(self.sparse.find_var(t, at, NAMES[name]), expect);
            }
            Op::Other { scope, name } => {
                let at = pick(&self.other_scopes, scope);
                let expect = self.other.find_var(at, NAMES[name]);
                assert_eq!(self.sparse.find_var(&self.other, at, NAMES[name]), expect);
                assert_eq!(self.dense.find_var(&self.other, at, NAMES[name]), expect);
                // A scope of the second tree against the first is foreign.
                assert!(matches!(
                    self.sparse.find_var(t, at, NAMES[name]),
                    Err(Error::ForeignScope { .. })
                ));
            }
        }
    }

    /// Every scope handle ever made, every name (as text and as a symbol),
    /// and a name never interned: the dense resolver answers as the tree.
    fn check(&mut self) {
        let syms: Vec<Option<Symbol>> = NAMES.iter().map(|n| self.tree.symbol(n)).collect();
        for &at in &self.scopes {
            for (i, name) in NAMES.iter().enumerate() {
                let expect = self.tree.find_var(at, *name);
                assert_eq!(
                    self.dense.find_var(&self.tree, at, *name),
                    expect,
                    "{name} from {at:?}"
                );
                if let Some(sym) = syms[i] {
                    assert_eq!(self.dense.find_var(&self.tree, at, sym), expect);
                }
            }
            assert_eq!(
                self.dense.find_var(&self.tree, at, NEVER),
                self.tree.find_var(at, NEVER)
            );
        }
        assert!(self.dense.len() <= self.dense.capacity());
        assert!(self.sparse.len() <= self.sparse.capacity());
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn resolver_answers_as_find_var_after_every_operation(
        capacity in prop_oneof![Just(2usize), Just(16), Just(1024)],
        ops in prop::collection::vec(op(), 1..100),
    ) {
        let mut m = Model::new(capacity);
        m.check();
        for op in &ops {
            m.apply(op);
            m.check();
        }
    }
}

/// A chain root → s1 → … → s{depth}, `W` in the root.
fn chain(depth: usize) -> (ScopeTree, Vec<ScopeId>, VarId) {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "W").unwrap();
    let mut scopes = vec![root];
    for i in 0..depth {
        scopes.push(tree.new_scope(scopes[i]).unwrap());
    }
    (tree, scopes, w)
}

#[test]
fn a_shadowing_variable_in_an_intermediate_scope_is_seen() {
    let (mut tree, scopes, w) = chain(10);
    let mut r = Resolver::new();
    let deep = scopes[10];
    assert_eq!(r.find_var(&tree, deep, "W").unwrap(), Some(w));
    assert_eq!(r.find_var(&tree, deep, "W").unwrap(), Some(w));
    assert_eq!(r.hits_and_misses(), (1, 1));
    let w5 = tree.var(scopes[5], "W").unwrap();
    assert_eq!(r.find_var(&tree, deep, "W").unwrap(), Some(w5));
    assert_eq!(r.find_var(&tree, scopes[4], "W").unwrap(), Some(w));
    // Renaming the shadow away shows the root's again; renaming it back
    // shadows again.
    tree.rename(scopes[5], "W", "W_old").unwrap();
    assert_eq!(r.find_var(&tree, deep, "W").unwrap(), Some(w));
    assert_eq!(r.find_var(&tree, deep, "W_old").unwrap(), Some(w5));
    tree.rename(scopes[5], "W_old", "W").unwrap();
    assert_eq!(r.find_var(&tree, deep, "W").unwrap(), Some(w5));
    assert_eq!(r.find_var(&tree, deep, "W_old").unwrap(), None);
}

#[test]
fn a_cached_absence_ends_when_the_name_is_created() {
    let (mut tree, scopes, _) = chain(3);
    let mut r = Resolver::new();
    let b = tree.intern("b").unwrap();
    assert_eq!(r.find_var(&tree, scopes[3], b).unwrap(), None);
    assert_eq!(r.find_var(&tree, scopes[3], b).unwrap(), None);
    let v = tree.var(scopes[1], b).unwrap();
    assert_eq!(r.find_var(&tree, scopes[3], b).unwrap(), Some(v));
    assert_eq!(r.find_var(&tree, scopes[0], b).unwrap(), None);
    // A name the tree never saw is absent and not cached.
    assert_eq!(r.find_var(&tree, scopes[3], "zzz").unwrap(), None);
    let z = tree.var(scopes[0], "zzz").unwrap();
    assert_eq!(r.find_var(&tree, scopes[3], "zzz").unwrap(), Some(z));
}

#[test]
fn erase_remove_and_scope_deletion_are_seen() {
    let (mut tree, scopes, w) = chain(4);
    let mut r = Resolver::new();
    let w2 = tree.var(scopes[2], "W").unwrap();
    assert_eq!(r.find_var(&tree, scopes[4], "W").unwrap(), Some(w2));
    tree.erase_vars(scopes[2], ["W"]).unwrap();
    assert_eq!(r.find_var(&tree, scopes[4], "W").unwrap(), Some(w));
    let w3 = tree.var(scopes[3], "W").unwrap();
    assert_eq!(r.find_var(&tree, scopes[4], "W").unwrap(), Some(w3));
    tree.remove_var(w3).unwrap();
    assert_eq!(r.find_var(&tree, scopes[4], "W").unwrap(), Some(w));
    let w4 = tree.var(scopes[4], "W").unwrap();
    assert_eq!(r.find_var(&tree, scopes[4], "W").unwrap(), Some(w4));
    assert_eq!(r.find_var(&tree, scopes[1], "W").unwrap(), Some(w));
    // Deleting scopes[2] frees scopes 2..=4 and their variables.
    tree.delete_scope(scopes[2]).unwrap();
    let stale = r.find_var(&tree, scopes[4], "W");
    assert_eq!(stale, Err(Error::StaleScope { scope: scopes[4] }));
    assert_eq!(r.find_var(&tree, scopes[1], "W").unwrap(), Some(w));
    tree.erase_vars_except(scopes[0], ["x"]).unwrap();
    assert_eq!(r.find_var(&tree, scopes[1], "W").unwrap(), None);
}

#[test]
fn a_reused_slot_gets_its_own_answers() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let p1 = tree.new_scope(root).unwrap();
    let p2 = tree.new_scope(root).unwrap();
    let x1 = tree.var(p1, "x").unwrap();
    let x2 = tree.var(p2, "x").unwrap();
    let kid = tree.new_scope(p1).unwrap();
    let mut r = Resolver::new();
    assert_eq!(r.find_var(&tree, kid, "x").unwrap(), Some(x1));
    tree.delete_scope(kid).unwrap();
    // The new scope takes `kid`'s slot, under p2 this time.
    let again = tree.new_scope(p2).unwrap();
    let slot = |s: ScopeId| format!("{s:?}").split('v').next().unwrap().to_owned();
    assert_eq!(slot(again), slot(kid));
    assert_eq!(r.find_var(&tree, again, "x").unwrap(), Some(x2));
    assert_eq!(
        r.find_var(&tree, kid, "x"),
        Err(Error::StaleScope { scope: kid })
    );
}

#[test]
fn two_trees_of_the_same_shape_never_mix() {
    // Equal raw scope keys, equal symbol indices and equal epochs in both
    // trees; only the variable keys differ (the second tree has a variable
    // more). A resolver that kept the first tree's entry would answer the
    // first tree's key for the second.
    let build = |pad: bool| {
        let mut t = ScopeTree::new();
        t.intern("w").unwrap();
        if pad {
            t.var(t.root(), "pad").unwrap();
        }
        let s = t.new_scope(t.root()).unwrap();
        let v = t.var(s, "w").unwrap();
        (t, s, v)
    };
    let (t1, s1, v1) = build(false);
    let (mut t2, s2, v2) = build(true);
    assert_eq!(
        format!("{s1:?}").split('@').next(),
        format!("{s2:?}").split('@').next()
    );
    let mut r = Resolver::new();
    for _ in 0..2 {
        assert_eq!(r.find_var(&t1, s1, "w").unwrap(), Some(v1));
        assert_eq!(r.find_var(&t2, s2, "w").unwrap(), Some(v2));
    }
    t2.remove_var(v2).unwrap();
    assert_eq!(r.find_var(&t1, s1, "w").unwrap(), Some(v1));
    assert_eq!(r.find_var(&t2, s2, "w").unwrap(), None);
    // Handles and symbols of one tree against the other: the tree's errors.
    assert_eq!(r.find_var(&t1, s2, "w"), t1.find_var(s2, "w"));
    assert!(matches!(
        r.find_var(&t1, s2, "w"),
        Err(Error::ForeignScope { .. })
    ));
    let sym2 = t2.intern("w").unwrap();
    assert_eq!(r.find_var(&t1, s1, sym2), t1.find_var(s1, sym2));
    assert!(matches!(
        r.find_var(&t1, s1, sym2),
        Err(Error::ForeignSymbol { .. })
    ));
}

#[test]
fn bad_names_fail_as_in_the_tree() {
    let (tree, scopes, _) = chain(2);
    let mut r = Resolver::new();
    for bad in ["", "a/b"] {
        assert_eq!(
            r.find_var(&tree, scopes[2], bad),
            tree.find_var(scopes[2], bad)
        );
        assert!(matches!(
            r.find_var(&tree, scopes[2], bad),
            Err(Error::InvalidName { .. })
        ));
    }
    assert!(r.is_empty());
    assert_eq!(r.hits_and_misses(), (0, 0));
}

#[test]
fn values_do_not_invalidate_and_step_churn_leaves_other_names_cached() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "W").unwrap();
    let model = tree.new_scope(root).unwrap();
    let mut r = Resolver::new();
    assert_eq!(r.find_var(&tree, model, "W").unwrap(), Some(w));
    tree.set(w, vec![1.0_f32; 8]).unwrap();
    for _ in 0..50 {
        let step = tree.new_scope(model).unwrap();
        let h = tree.var(step, "h").unwrap();
        tree.var(step, "c").unwrap();
        tree.set(h, 0.5_f32).unwrap();
        assert_eq!(r.find_var(&tree, step, "h").unwrap(), Some(h));
        assert_eq!(r.find_var(&tree, model, "W").unwrap(), Some(w));
        tree.delete_scope(step).unwrap();
    }
    let (hits, misses) = r.hits_and_misses();
    // `W` from the model scope missed once; every step's `h` missed.
    assert_eq!((hits, misses), (50, 51));
}

#[test]
fn a_small_resolver_evicts_and_stays_correct() {
    let (mut tree, scopes, w) = chain(64);
    let mut r = Resolver::with_capacity(4);
    let names: Vec<Symbol> = (0..10)
        .map(|i| tree.intern(format!("n{i}").as_str()).unwrap())
        .collect();
    for round in 0..3 {
        for &s in &scopes {
            assert_eq!(r.find_var(&tree, s, "W").unwrap(), Some(w));
            for &n in &names {
                assert_eq!(r.find_var(&tree, s, n).unwrap(), None);
            }
            assert!(r.len() <= 4);
        }
        if round == 1 {
            r.clear();
            assert!(r.is_empty());
        }
    }
    let (hits, misses) = r.hits_and_misses();
    assert_eq!(hits + misses, 3 * 65 * 11);
    assert!(misses > hits, "{hits} hits, {misses} misses with 4 entries");
}

#[test]
fn repeated_lookups_hit_at_any_depth() {
    let (tree, scopes, w) = chain(1000);
    let mut r = Resolver::new();
    let sym = tree.symbol("W").unwrap();
    for _ in 0..10 {
        assert_eq!(r.find_var(&tree, scopes[1000], sym).unwrap(), Some(w));
        assert_eq!(r.find_var(&tree, scopes[500], "W").unwrap(), Some(w));
    }
    assert_eq!(r.hits_and_misses(), (18, 2));
    assert_eq!(r.len(), 2);
}

#[test]
fn resolver_is_send_sync_clone_and_debug() {
    fn assert_traits<T: Send + Sync + Clone + std::fmt::Debug + Default>() {}
    assert_traits::<Resolver>();
    let r = Resolver::new();
    assert!(format!("{r:?}").contains("capacity: 1024"));
}
