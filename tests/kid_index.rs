//! The index of named kids behind `kid` and `new_named_scope`: after any
//! sequence of creations and deletions (`delete_scope`, `delete_kid`,
//! `drop_kids`, with slots reused), it agrees with a linear scan of the kid
//! list and with an independent model of the tree.
//!
//! `PROPTEST_CASES` sets the number of cases (default 256).

use proptest::prelude::*;
use scopetree::{Error, ScopeId, ScopeTree};

/// The names the model draws from: the first 4 in the first test, so that
/// collisions are frequent; all 12 in the second, so that a parent can have
/// more named kids than the arena scans before it indexes them.
const NAMES: [&str; 12] = [
    "a", "b", "c", "layer_1", "d", "e", "f", "g", "h", "i", "j", "layer_2",
];

/// The kid of `parent` named `name`, by walking its kid list: the oracle the
/// index must agree with.
fn scan(tree: &ScopeTree, parent: ScopeId, name: &str) -> Option<ScopeId> {
    let mut found = None;
    for k in tree.kids(parent).unwrap() {
        if tree.scope_name(k).unwrap() == Some(name) {
            assert!(found.is_none(), "two kids named {name}");
            found = Some(k);
        }
    }
    found
}

#[derive(Clone, Debug)]
enum Op {
    Named { parent: usize, name: usize },
    Unnamed { parent: usize },
    Delete { scope: usize },
    DeleteKid { parent: usize, kid: usize },
    DropKids { scope: usize },
}

/// An operation on one of `parents` nodes (mod the count) with one of the
/// first `names` names.
fn op(parents: usize, names: usize) -> impl Strategy<Value = Op> {
    let i = move || 0usize..parents;
    prop_oneof![
        4 => (i(), 0..names).prop_map(|(parent, name)| Op::Named { parent, name }),
        2 => i().prop_map(|parent| Op::Unnamed { parent }),
        2 => i().prop_map(|scope| Op::Delete { scope }),
        1 => (i(), i()).prop_map(|(parent, kid)| Op::DeleteKid { parent, kid }),
        1 => i().prop_map(|scope| Op::DropKids { scope }),
    ]
}

/// One scope as the model knows it.
struct Node {
    id: ScopeId,
    parent: Option<usize>,
    name: Option<usize>,
    alive: bool,
}

struct Model {
    tree: ScopeTree,
    nodes: Vec<Node>,
}

impl Model {
    fn new() -> Self {
        let tree = ScopeTree::new();
        let root = Node {
            id: tree.root(),
            parent: None,
            name: None,
            alive: true,
        };
        Model {
            tree,
            nodes: vec![root],
        }
    }

    /// The `i`-th node (mod the count), alive or not: stale handles are
    /// picked too.
    fn pick(&self, i: usize) -> usize {
        i % self.nodes.len()
    }

    /// The most live kids any live node has.
    fn widest(&self) -> usize {
        let mut kids = vec![0usize; self.nodes.len()];
        for n in self.nodes.iter().filter(|n| n.alive) {
            if let Some(p) = n.parent {
                kids[p] += 1;
            }
        }
        kids.into_iter().max().unwrap_or(0)
    }

    /// The model's live kid of `parent` named `name`.
    fn kid(&self, parent: usize, name: usize) -> Option<ScopeId> {
        let mut kids = self
            .nodes
            .iter()
            .filter(|n| n.alive && n.parent == Some(parent) && n.name == Some(name));
        let found = kids.next().map(|n| n.id);
        assert!(
            kids.next().is_none(),
            "the model holds two kids named {name}"
        );
        found
    }

    /// Marks `top`'s subtree dead (or only its kids' subtrees).
    fn kill(&mut self, top: usize, keep_top: bool) {
        // Nodes are pushed after their parents, so one forward pass sees a
        // parent's death before its kids.
        let mut dead = vec![false; self.nodes.len()];
        for i in 0..self.nodes.len() {
            dead[i] = (i == top && !keep_top)
                || self.nodes[i]
                    .parent
                    .is_some_and(|p| dead[p] || (p == top && keep_top));
        }
        for (n, d) in self.nodes.iter_mut().zip(dead) {
            if d {
                n.alive = false;
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Named { parent, name } => {
                let p = self.pick(parent);
                let r = self.tree.new_named_scope(self.nodes[p].id, NAMES[name]);
                if !self.nodes[p].alive {
                    assert!(matches!(r, Err(Error::StaleScope { .. })), "{r:?}");
                } else if self.kid(p, name).is_some() {
                    assert!(matches!(r, Err(Error::ScopeNameTaken { .. })), "{r:?}");
                } else {
                    self.nodes.push(Node {
                        id: r.unwrap(),
                        parent: Some(p),
                        name: Some(name),
                        alive: true,
                    });
                }
            }
            Op::Unnamed { parent } => {
                let p = self.pick(parent);
                let r = self.tree.new_scope(self.nodes[p].id);
                if self.nodes[p].alive {
                    self.nodes.push(Node {
                        id: r.unwrap(),
                        parent: Some(p),
                        name: None,
                        alive: true,
                    });
                } else {
                    assert!(matches!(r, Err(Error::StaleScope { .. })), "{r:?}");
                }
            }
            Op::Delete { scope } => {
                let s = self.pick(scope);
                let r = self.tree.delete_scope(self.nodes[s].id);
                match (s, self.nodes[s].alive) {
                    (0, _) => assert_eq!(r, Err(Error::RootScope)),
                    (_, true) => {
                        r.unwrap();
                        self.kill(s, false);
                    }
                    (_, false) => assert!(matches!(r, Err(Error::StaleScope { .. }))),
                }
            }
            Op::DeleteKid { parent, kid } => {
                let (p, k) = (self.pick(parent), self.pick(kid));
                let r = self.tree.delete_kid(self.nodes[p].id, self.nodes[k].id);
                let ok =
                    self.nodes[p].alive && self.nodes[k].alive && self.nodes[k].parent == Some(p);
                if ok {
                    r.unwrap();
                    self.kill(k, false);
                } else {
                    assert!(r.is_err());
                }
            }
            Op::DropKids { scope } => {
                let s = self.pick(scope);
                let r = self.tree.drop_kids(self.nodes[s].id);
                if self.nodes[s].alive {
                    r.unwrap();
                    self.kill(s, true);
                } else {
                    assert!(matches!(r, Err(Error::StaleScope { .. })));
                }
            }
        }
    }

    /// Every live scope: `kid` by text and by symbol agrees with the model
    /// and with a scan of the kid list, for every name. Every dead handle is
    /// stale.
    fn check(&mut self) {
        let syms: Vec<_> = NAMES.iter().map(|n| self.tree.intern(n).unwrap()).collect();
        let live = self.nodes.iter().filter(|n| n.alive).count();
        assert_eq!(self.tree.scope_count(), live);
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.alive {
                assert!(matches!(
                    self.tree.kid(node.id, NAMES[0]),
                    Err(Error::StaleScope { .. })
                ));
                continue;
            }
            for (n, name) in NAMES.iter().enumerate() {
                let expect = self.kid(i, n);
                assert_eq!(self.tree.kid(node.id, *name).unwrap(), expect);
                assert_eq!(self.tree.kid(node.id, syms[n]).unwrap(), expect);
                assert_eq!(scan(&self.tree, node.id, name), expect);
            }
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

/// Applies `ops` to a fresh model, checking everything after each one;
/// returns the most live kids any node had.
fn run(ops: &[Op]) -> usize {
    let mut m = Model::new();
    let mut widest = 0;
    for op in ops {
        m.apply(op);
        m.check();
        widest = widest.max(m.widest());
    }
    widest
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn index_agrees_with_a_scan_and_a_model(ops in prop::collection::vec(op(64, 4), 1..120)) {
        run(&ops);
    }

    /// Few parents and many names: parents pass the arena's scan limit (8
    /// kids), lose kids again, have them dropped and come back, so lookups
    /// run through both the kid scan and the index, and across the switch.
    #[test]
    fn index_agrees_across_wide_and_narrow_parents(ops in prop::collection::vec(op(6, 12), 1..200)) {
        run(&ops);
    }
}

#[test]
fn a_parent_passes_the_scan_limit_and_comes_back() {
    // A fixed sequence of the operations above, checked at every step: a
    // parent gets a named kid past the scan limit (8 kids) and turns wide,
    // loses kids and gets more, has them all dropped, then takes unnamed
    // kids past the limit (it stays narrow) and a named kid after them
    // (it turns wide).
    let mut ops: Vec<Op> = (0..12).map(|name| Op::Named { parent: 0, name }).collect();
    ops.extend((0..3).map(|_| Op::Unnamed { parent: 0 }));
    ops.extend((0..6).map(|kid| Op::DeleteKid {
        parent: 0,
        kid: 1 + kid * 2,
    }));
    ops.extend((0..12).map(|name| Op::Named { parent: 0, name }));
    ops.push(Op::DropKids { scope: 0 });
    ops.extend((0..5).map(|name| Op::Named { parent: 0, name }));
    ops.extend((0..4).map(|_| Op::Unnamed { parent: 0 }));
    ops.extend((5..8).map(|name| Op::Named { parent: 0, name }));
    let widest = run(&ops);
    assert!(widest > 8, "a parent had at most {widest} kids");
}

#[test]
fn a_name_is_free_again_once_its_scope_is_deleted() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let a = tree.new_named_scope(root, "a").unwrap();
    assert!(matches!(
        tree.new_named_scope(root, "a"),
        Err(Error::ScopeNameTaken { .. })
    ));
    // The same name under another parent is no conflict.
    let a_in_a = tree.new_named_scope(a, "a").unwrap();
    assert_eq!(tree.kid(a, "a").unwrap(), Some(a_in_a));

    tree.delete_scope(a).unwrap();
    assert_eq!(tree.kid(root, "a").unwrap(), None);
    let again = tree.new_named_scope(root, "a").unwrap();
    assert_ne!(again, a);
    assert_eq!(tree.kid(root, "a").unwrap(), Some(again));
    // The new scope took a freed slot; the old key finds nothing.
    assert!(matches!(tree.kid(a, "a"), Err(Error::StaleScope { .. })));
    assert_eq!(tree.kid(again, "a").unwrap(), None);
}

#[test]
fn a_reused_slot_is_not_found_under_the_old_parent_or_name() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let p1 = tree.new_named_scope(root, "p1").unwrap();
    let p2 = tree.new_named_scope(root, "p2").unwrap();
    let x = tree.new_named_scope(p1, "x").unwrap();
    tree.delete_scope(x).unwrap();
    // Slotmap hands out the most recently freed slot first: `x`'s.
    let y = tree.new_named_scope(p2, "y").unwrap();
    assert_eq!(
        format!("{x:?}").split('v').next(),
        format!("{y:?}").split('v').next()
    );
    assert_eq!(tree.kid(p1, "x").unwrap(), None);
    assert_eq!(tree.kid(p1, "y").unwrap(), None);
    assert_eq!(tree.kid(p2, "x").unwrap(), None);
    assert_eq!(tree.kid(p2, "y").unwrap(), Some(y));
    // An unnamed scope in a named scope's old slot is found by no name.
    tree.delete_scope(y).unwrap();
    let z = tree.new_scope(p2).unwrap();
    assert_eq!(tree.kid(p2, "y").unwrap(), None);
    assert_eq!(tree.kids(p2).unwrap().collect::<Vec<_>>(), [z]);
}

#[test]
fn drop_kids_frees_every_name_of_the_dropped_level() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let enc = tree.new_named_scope(root, "enc").unwrap();
    for i in 0..100 {
        let l = tree
            .new_named_scope(enc, format!("layer_{i}").as_str())
            .unwrap();
        tree.new_named_scope(l, "w").unwrap();
    }
    assert!(tree.kid(enc, "layer_42").unwrap().is_some());
    tree.drop_kids(enc).unwrap();
    assert_eq!(tree.scope_count(), 2);
    for i in 0..100 {
        let name = format!("layer_{i}");
        assert_eq!(tree.kid(enc, name.as_str()).unwrap(), None);
        tree.new_named_scope(enc, name.as_str()).unwrap();
    }
    assert_eq!(tree.kid(root, "enc").unwrap(), Some(enc));
}

#[test]
fn kid_finds_every_kid_of_a_wide_parent() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let kids: Vec<ScopeId> = (0..10_000)
        .map(|i| {
            tree.new_named_scope(root, format!("k{i}").as_str())
                .unwrap()
        })
        .collect();
    for (i, &k) in kids.iter().enumerate() {
        assert_eq!(tree.kid(root, format!("k{i}").as_str()).unwrap(), Some(k));
    }
    // Delete every other kid; the rest are still found, the others not.
    for &k in kids.iter().step_by(2) {
        tree.delete_kid(root, k).unwrap();
    }
    for (i, &k) in kids.iter().enumerate() {
        let expect = (i % 2 == 1).then_some(k);
        assert_eq!(tree.kid(root, format!("k{i}").as_str()).unwrap(), expect);
    }
    assert_eq!(tree.kid(root, "k10000").unwrap(), None);
}

#[test]
fn kid_errors_are_those_of_the_handle_and_the_name() {
    let mut tree = ScopeTree::new();
    let other = ScopeTree::new();
    let root = tree.root();
    tree.new_named_scope(root, "a").unwrap();
    assert!(matches!(
        tree.kid(other.root(), "a"),
        Err(Error::ForeignScope { .. })
    ));
    assert!(matches!(
        tree.kid(root, "a/b"),
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(tree.kid(root, ""), Err(Error::InvalidName { .. })));
    let mut other = other;
    let foreign = other.intern("a").unwrap();
    assert!(matches!(
        tree.kid(root, foreign),
        Err(Error::ForeignSymbol { .. })
    ));
    assert_eq!(tree.kid(root, "never_interned").unwrap(), None);
}

/// The slot of a named scope cycled through all 2^31 versions is retired,
/// and its last occupant leaves the index like any other deleted scope.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only (2^31 cycles): cargo test --release --test kid_index"
)]
fn a_retired_named_slot_leaves_the_index() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let sym = tree.intern("cycled").unwrap();
    let first = tree.new_named_scope(root, sym).unwrap();
    tree.delete_scope(first).unwrap();
    let mut last = first;
    for _ in 1..(1_u64 << 31) {
        last = tree.new_named_scope(root, sym).unwrap();
        tree.delete_scope(last).unwrap();
    }
    let last_dbg = format!("{last:?}");
    assert!(last_dbg.contains("v4294967295@"), "{last_dbg}");
    assert_eq!(tree.kid(root, sym).unwrap(), None);
    let fresh = tree.new_named_scope(root, sym).unwrap();
    assert_ne!(fresh, first);
    assert_ne!(fresh, last);
    assert_eq!(tree.kid(root, sym).unwrap(), Some(fresh));
    assert_eq!(tree.scope_count(), 2);
}

/// The index is keyed by the parent's slot: a new parent in the slot of a
/// deleted wide parent sees none of the old kids, and the old handle is stale.
#[test]
fn a_wide_parent_slot_reused_starts_with_no_named_kids() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let wide = tree.new_named_scope(root, "wide").unwrap();
    for i in 0..20 {
        tree.new_named_scope(wide, format!("k{i}").as_str())
            .unwrap();
    }
    assert!(tree.kid(wide, "k19").unwrap().is_some());
    tree.delete_scope(wide).unwrap();
    // Freed last-in first-out: the next scopes take the slots of `wide`'s
    // subtree, `wide`'s own among them.
    let mut fresh = Vec::new();
    for _ in 0..21 {
        let s = tree.new_scope(root).unwrap();
        for _ in 0..6 {
            tree.new_scope(s).unwrap();
        }
        fresh.push(s);
    }
    let slot = |s: ScopeId| format!("{s:?}").split('v').next().unwrap().to_owned();
    let reused = fresh.iter().find(|&&s| slot(s) == slot(wide)).copied();
    let reused = reused.expect("the slot of `wide` was reused by a parent");
    for i in 0..20 {
        let name = format!("k{i}");
        assert_eq!(tree.kid(reused, name.as_str()).unwrap(), None);
        assert!(matches!(
            tree.kid(wide, name.as_str()),
            Err(Error::StaleScope { .. })
        ));
    }
    let k5 = tree.new_named_scope(reused, "k5").unwrap();
    assert_eq!(tree.kid(reused, "k5").unwrap(), Some(k5));
}
