//! Values whose `Drop` panics. A value's destructor is user code; when the
//! tree drops values (deleting a scope, dropping kids, erasing variables) and
//! one of those destructors panics, the panic reaches the caller, but only
//! after the tree has finished its own bookkeeping: every value is dropped
//! exactly once, nothing is orphaned, no live variable points at a deleted
//! scope, and the tree stays fully usable after `catch_unwind`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use scopetree::{ScopeId, ScopeTree, VarId};

/// A value that counts its drops and, if `bomb`, panics when dropped.
struct Tracked {
    drops: Arc<AtomicUsize>,
    bomb: bool,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        if self.bomb {
            panic!("boom from a value's Drop");
        }
    }
}

struct Setup {
    tree: ScopeTree,
    drops: Arc<AtomicUsize>,
    values: usize,
}

impl Setup {
    fn new() -> Self {
        Setup {
            tree: ScopeTree::new(),
            drops: Arc::new(AtomicUsize::new(0)),
            values: 0,
        }
    }

    fn put(&mut self, scope: ScopeId, name: &str, bomb: bool) -> VarId {
        let v = self.tree.var(scope, name).unwrap();
        let value = Tracked {
            drops: Arc::clone(&self.drops),
            bomb,
        };
        self.tree.set(v, value).unwrap();
        self.values += 1;
        v
    }

    fn drops(&self) -> usize {
        self.drops.load(Ordering::SeqCst)
    }
}

/// The tree's counts, links and owners agree with each other.
fn assert_consistent(tree: &ScopeTree) {
    let root = tree.root();
    let all: Vec<_> = tree.descendants(root).unwrap().collect();
    assert_eq!(
        all.len(),
        tree.scope_count(),
        "scopes unreachable from the root"
    );
    let mut vars = 0;
    for &(s, depth) in &all {
        assert_eq!(tree.depth(s).unwrap(), depth);
        for k in tree.kids(s).unwrap() {
            assert_eq!(tree.parent(k).unwrap(), Some(s));
        }
        for (name, v) in tree.local_vars(s).unwrap() {
            assert_eq!(tree.owner(v).unwrap(), s);
            assert_eq!(tree.var_name(v).unwrap(), name);
            assert_eq!(tree.find_local_var(s, name).unwrap(), Some(v));
            vars += 1;
        }
    }
    assert_eq!(vars, tree.var_count(), "variables outside any live scope");
}

fn panics<R>(f: impl FnOnce() -> R) -> bool {
    catch_unwind(AssertUnwindSafe(f)).is_err()
}

#[test]
fn panicking_drop_during_delete_scope() {
    let mut t = Setup::new();
    let root = t.tree.root();
    let keep = t.put(root, "keep", false);
    let a = t.tree.new_scope(root).unwrap();
    let a1 = t.tree.new_scope(a).unwrap();
    let a2 = t.tree.new_scope(a).unwrap();
    let a1x = t.tree.new_scope(a1).unwrap();
    let mut doomed = vec![t.put(a, "p", false)];
    doomed.push(t.put(a1, "x", false));
    doomed.push(t.put(a1, "bomb", true));
    doomed.push(t.put(a1, "y", false));
    doomed.push(t.put(a1x, "z", false));
    doomed.push(t.put(a2, "w", false));
    let b = t.tree.new_scope(root).unwrap();
    let bv = t.put(b, "v", false);

    assert!(panics(|| t.tree.delete_scope(a)));

    assert_consistent(&t.tree);
    for s in [a, a1, a2, a1x] {
        assert!(!t.tree.contains_scope(s), "{s:?} survived");
    }
    for v in &doomed {
        assert!(!t.tree.contains_var(*v), "{v:?} survived");
    }
    assert_eq!(
        t.drops(),
        doomed.len(),
        "every doomed value dropped exactly once"
    );
    assert_eq!(t.tree.kids(root).unwrap().collect::<Vec<_>>(), [b]);
    assert_eq!((t.tree.scope_count(), t.tree.var_count()), (2, 2));
    // Still fully usable.
    assert!(t.tree.contains_var(keep) && t.tree.contains_var(bv));
    let c = t.tree.new_scope(root).unwrap();
    assert_eq!(t.tree.kids(root).unwrap().collect::<Vec<_>>(), [b, c]);
    t.tree.delete_scope(b).unwrap();
    assert_consistent(&t.tree);
}

#[test]
fn panicking_drops_during_drop_kids() {
    let mut t = Setup::new();
    let root = t.tree.root();
    let mut kids = Vec::new();
    for i in 0..5 {
        let k = t.tree.new_scope(root).unwrap();
        let inner = t.tree.new_scope(k).unwrap();
        t.put(k, "a", false);
        // Two of the kids hold a bomb, one of them deep down.
        t.put(inner, "b", i == 1 || i == 3);
        t.put(inner, "c", false);
        kids.push((k, inner));
    }
    let own = t.put(root, "own", false);

    assert!(panics(|| t.tree.drop_kids(root)));

    assert_consistent(&t.tree);
    assert_eq!((t.tree.scope_count(), t.tree.var_count()), (1, 1));
    assert!(
        kids.iter()
            .all(|&(k, i)| !t.tree.contains_scope(k) && !t.tree.contains_scope(i))
    );
    assert_eq!(t.drops(), t.values - 1);
    assert!(t.tree.contains_var(own));
    let k = t.tree.new_scope(root).unwrap();
    assert_eq!(t.tree.kids(root).unwrap().collect::<Vec<_>>(), [k]);
}

#[test]
fn panicking_drop_during_erase_and_remove() {
    let mut t = Setup::new();
    let root = t.tree.root();
    let s = t.tree.new_scope(root).unwrap();
    let names = ["a", "bomb", "c", "d"];
    let vars: Vec<VarId> = names.iter().map(|n| t.put(s, n, *n == "bomb")).collect();

    assert!(panics(|| t.tree.erase_vars(s, ["a", "bomb", "c"])));
    assert_consistent(&t.tree);
    assert!(vars[..3].iter().all(|v| !t.tree.contains_var(*v)));
    assert_eq!(
        t.tree.local_var_names(s).unwrap().collect::<Vec<_>>(),
        ["d"]
    );
    assert_eq!(t.drops(), 3);

    let b2 = t.put(s, "bomb2", true);
    t.put(s, "e", false);
    assert!(panics(|| t.tree.erase_vars_except(s, ["d"])));
    assert_consistent(&t.tree);
    assert!(!t.tree.contains_var(b2));
    assert_eq!(
        t.tree.local_var_names(s).unwrap().collect::<Vec<_>>(),
        ["d"]
    );
    assert_eq!(t.drops(), 5);

    let b3 = t.put(s, "bomb3", true);
    assert!(panics(|| t.tree.remove_var(b3)));
    assert_consistent(&t.tree);
    assert!(!t.tree.contains_var(b3));
    assert_eq!(t.drops(), 6);

    // Overwriting and clearing a bomb: the old value is gone, the new one in.
    let b4 = t.put(s, "bomb4", true);
    assert!(panics(|| t.tree.set(b4, 1_u8)));
    assert_eq!(*t.tree.get::<u8>(b4).unwrap(), 1);
    let b5 = t.put(s, "bomb5", true);
    assert!(panics(|| t.tree.clear(b5)));
    assert!(!t.tree.is_initialized(b5).unwrap());
    assert_consistent(&t.tree);
    assert_eq!(t.drops(), 8);
}
