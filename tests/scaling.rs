//! The scaling suite of the core tree (issue 9), release mode only: every
//! public operation of `ScopeTree`, `StepScopes`, `Resolver` and the worker
//! split whose documentation states its cost is timed per unit of work (per
//! call, per level, per item) at a small size (10^3–10^4) and at 10^5, along
//! each growth axis that matters (scopes, siblings, variables in one scope,
//! names, depth, steps, cached entries), and fails when the cost per unit
//! grows more than 3x. See `support/timing.rs` for how a figure is taken
//! (minimum of 5–10 alternating runs per size).
//!
//! The sharing layer's operations have scaling tests of their own.
//!
//! Run with the figures printed:
//! `cargo test --release --test scaling -- --nocapture`.

#[path = "support/timing.rs"]
mod timing;

use std::fmt::{self, Write};
use std::hint::black_box;

use scopetree::{Resolver, ScopeId, ScopeTree, StepScopes, StepVar, Symbol, VarId};
use timing::Scaling;

/// The small size of most tests.
const SMALL: usize = 10_000;
/// The large size of every test.
const LARGE: usize = 100_000;
/// Operations per run of a test that reads (cycling over the items), at both
/// sizes, so that both figures come from runs of the same length.
const READS: usize = 100_000;

/// Calls per run of an operation that walks all `n` items in one call, a
/// few nanoseconds per item.
fn walks(n: usize) -> usize {
    (1_000_000 / n).max(5)
}

/// Calls per run of an operation that formats or writes all `n` items in one
/// call, up to a microsecond per item.
fn few_walks(n: usize) -> usize {
    (100_000 / n).max(2)
}

/// `prefix0`, `prefix1`, …
fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// A step through `0..n` that visits every index once, out of order.
fn scattered(i: usize, n: usize) -> usize {
    // 7919 is prime and divides no power of ten.
    (i * 7919) % n
}

/// Item `i` of a read test over `n` items: every item in turn, out of order,
/// so that neither size gains from a prefetcher walking memory in order.
fn pick(i: usize, n: usize) -> usize {
    scattered(i % n, n)
}

/// A tree whose root holds `n` variables `v0` … and their names.
struct Wide {
    tree: ScopeTree,
    scope: ScopeId,
    names: Vec<String>,
    vars: Vec<VarId>,
}

fn wide(n: usize) -> Wide {
    let mut tree = ScopeTree::new();
    let scope = tree.root();
    let names = names("v", n);
    let vars = names
        .iter()
        .map(|name| tree.create_var(scope, name).unwrap())
        .collect();
    Wide {
        tree,
        scope,
        names,
        vars,
    }
}

/// A chain of `n` scopes below the root, all named `s`; level `i` holds one
/// variable `x{i}` and the root holds `w`. Returns the chain, deepest last.
fn chain(n: usize) -> (ScopeTree, Vec<ScopeId>) {
    let mut tree = ScopeTree::new();
    let mut at = tree.root();
    tree.var(at, "w").unwrap();
    let s = tree.intern("s").unwrap();
    let mut levels = Vec::with_capacity(n);
    for i in 1..=n {
        at = tree.new_named_scope(at, s).unwrap();
        let x = tree.var(at, format!("x{i}")).unwrap();
        tree.set(x, i as f32).unwrap();
        levels.push(at);
    }
    (tree, levels)
}

/// A tree whose root has `n` named kids `k0` …, each holding one variable.
fn wide_kids(n: usize) -> (ScopeTree, Vec<ScopeId>, Vec<String>) {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let names = names("k", n);
    let kids = names
        .iter()
        .map(|name| {
            let k = tree.new_named_scope(root, name).unwrap();
            let v = tree.var(k, "y").unwrap();
            tree.set(v, 1.0_f32).unwrap();
            k
        })
        .collect();
    (tree, kids, names)
}

/// `n` variables spread over 100 scopes under the root, each set to an `f32`.
fn many_vars(n: usize) -> (ScopeTree, Vec<VarId>) {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let scopes: Vec<ScopeId> = (0..100).map(|_| tree.new_scope(root).unwrap()).collect();
    let vars = (0..n)
        .map(|i| {
            let v = tree.var(scopes[i % 100], format!("v{i}")).unwrap();
            tree.set(v, i as f32).unwrap();
            v
        })
        .collect();
    (tree, vars)
}

/// Counts the bytes written, without keeping them.
#[derive(Default)]
struct Count(usize);

impl Write for Count {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

fn formatted_len(x: impl fmt::Display) -> usize {
    let mut c = Count::default();
    write!(c, "{x}").unwrap();
    c.0
}

// ----- scopes ------------------------------------------------------------------

/// Issue 9 item 1: `block_0/attn`, `block_1/attn`, … The named-kid index is
/// keyed by parent and name; a weak hash put every such key in one probe
/// chain.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn new_named_scope_one_name_under_distinct_parents() {
    Scaling::new(
        "new_named_scope(p_i, \"attn\") under n distinct parents",
        "scope",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |n| {
            let mut tree = ScopeTree::new();
            let root = tree.root();
            let parents: Vec<ScopeId> = (0..n).map(|_| tree.new_scope(root).unwrap()).collect();
            (tree, parents)
        },
        |(tree, parents), i| {
            black_box(tree.new_named_scope(parents[i], "attn").unwrap());
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn new_named_scope_among_many_siblings() {
    Scaling::new(
        "new_named_scope(root, k_i) with n siblings",
        "scope",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |n| (ScopeTree::new(), names("k", n)),
        |(tree, names), i| {
            black_box(tree.new_named_scope(tree.root(), &names[i]).unwrap());
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn new_scope_among_many_siblings() {
    Scaling::new("new_scope(root) with n siblings", "scope", SMALL, LARGE)
        .fresh()
        .check(
            |_| ScopeTree::new(),
            |tree, _| {
                black_box(tree.new_scope(tree.root()).unwrap());
            },
        );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn kid_among_many_siblings() {
    Scaling::new(
        "kid(root, k_i) among n named siblings",
        "lookup",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(wide_kids, |(tree, kids, names), i| {
        let j = pick(i, kids.len());
        assert_eq!(tree.kid(tree.root(), &names[j]).unwrap(), Some(kids[j]));
    });
}

/// Each parent has 4 unnamed kids before `attn`, so the lookup goes past the
/// short walk to the tree's index of named kids.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn kid_one_name_under_distinct_parents() {
    Scaling::new(
        "kid(p_i, \"attn\") under n distinct parents (index probe)",
        "lookup",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(
        |n| {
            let mut tree = ScopeTree::new();
            let root = tree.root();
            let attn = tree.intern("attn").unwrap();
            let mut pairs = Vec::with_capacity(n);
            for _ in 0..n {
                let p = tree.new_scope(root).unwrap();
                for _ in 0..4 {
                    tree.new_scope(p).unwrap();
                }
                pairs.push((p, tree.new_named_scope(p, attn).unwrap()));
            }
            (tree, attn, pairs)
        },
        |(tree, attn, pairs), i| {
            let (p, k) = pairs[pick(i, pairs.len())];
            assert_eq!(tree.kid(p, *attn).unwrap(), Some(k));
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn delete_scope_of_one_kid_among_many_siblings() {
    Scaling::new(
        "delete_scope(k_i) of one named kid among n siblings, scattered order",
        "deletion",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |n| {
            let (tree, kids, _) = wide_kids(n);
            (tree, kids)
        },
        |(tree, kids), i| {
            tree.delete_scope(kids[scattered(i, kids.len())]).unwrap();
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn delete_kid_among_many_siblings() {
    Scaling::new(
        "delete_kid(root, k_i) among n named siblings, scattered order",
        "deletion",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |n| {
            let (tree, kids, _) = wide_kids(n);
            (tree, kids)
        },
        |(tree, kids), i| {
            let root = tree.root();
            tree.delete_kid(root, kids[scattered(i, kids.len())])
                .unwrap();
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn drop_kids_per_deleted_scope() {
    Scaling::new(
        "drop_kids(root) with n kids of one variable each",
        "scope",
        SMALL,
        LARGE,
    )
    .fresh()
    .once_per_copy()
    .units_per_op(|n| n as f64)
    .check(
        |n| wide_kids(n).0,
        |tree, _| {
            tree.drop_kids(tree.root()).unwrap();
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn delete_scope_of_a_deep_chain_per_scope() {
    Scaling::new(
        "delete_scope of an n-deep chain (one variable per level)",
        "scope",
        SMALL,
        LARGE,
    )
    .fresh()
    .once_per_copy()
    .units_per_op(|n| n as f64)
    .check(chain, |(tree, levels), _| {
        tree.delete_scope(levels[0]).unwrap();
    });
}

/// Named scopes made and deleted one after another: the kid index, the
/// arena's free list and the interner (every name is new) must not slow the
/// cycle down as it repeats.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn named_scope_churn() {
    Scaling::new(
        "new_named_scope(root, fresh name) + delete_scope, n cycles",
        "cycle",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |n| (ScopeTree::new(), names("tmp", n)),
        |(tree, names), i| {
            let k = tree.new_named_scope(tree.root(), &names[i]).unwrap();
            tree.delete_scope(k).unwrap();
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn scope_queries_with_many_scopes() {
    Scaling::new(
        "parent + depth + has_kid + scope_name + contains_scope with n scopes",
        "scope",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(wide_kids, |(tree, kids, _), i| {
        let k = kids[pick(i, kids.len())];
        let root = tree.root();
        assert_eq!(tree.parent(k).unwrap(), Some(root));
        assert_eq!(tree.depth(k).unwrap(), 1);
        assert!(tree.has_kid(root, k).unwrap());
        black_box(tree.scope_name(k).unwrap());
        assert!(tree.contains_scope(k));
        black_box(tree.scope_count());
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn kid_count_per_kid() {
    Scaling::new("kid_count(root) with n kids", "kid", SMALL, LARGE)
        .ops(walks)
        .units_per_op(|n| n as f64)
        .check(
            |n| wide_kids(n).0,
            |tree, _| {
                black_box(tree.kid_count(tree.root()).unwrap());
            },
        );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn heap_bytes_per_scope() {
    Scaling::new(
        "heap_bytes() with n scopes of one variable each",
        "scope",
        SMALL,
        LARGE,
    )
    .ops(walks)
    .units_per_op(|n| n as f64)
    .check(
        |n| wide_kids(n).0,
        |tree, _| {
            black_box(tree.heap_bytes());
        },
    );
}

// ----- paths and lookups up the chain -----------------------------------------

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn path_per_component() {
    Scaling::new("path(deepest) of an n-deep chain", "level", SMALL, LARGE)
        .ops(walks)
        .units_per_op(|n| n as f64)
        .check(chain, |(tree, levels), _| {
            let p = tree.path(*levels.last().unwrap()).unwrap();
            black_box(p.len());
        });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn var_path_per_component() {
    Scaling::new(
        "var_path(x) of a variable at depth n",
        "level",
        SMALL,
        LARGE,
    )
    .ops(walks)
    .units_per_op(|n| n as f64)
    .check(
        |n| {
            let (tree, levels) = chain(n);
            let x = tree
                .find_local_var(*levels.last().unwrap(), format!("x{n}"))
                .unwrap()
                .unwrap();
            (tree, x)
        },
        |(tree, x), _| {
            black_box(tree.var_path(*x).unwrap().len());
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn find_var_per_level() {
    Scaling::new(
        "find_var(deepest, \"w\") hit at the root of an n-deep chain",
        "level",
        SMALL,
        LARGE,
    )
    .ops(walks)
    .units_per_op(|n| n as f64)
    .check(chain, |(tree, levels), _| {
        assert!(
            tree.find_var(*levels.last().unwrap(), "w")
                .unwrap()
                .is_some()
        );
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn get_var_and_find_scope_per_level() {
    Scaling::new(
        "get_var + find_scope(deepest, \"w\") at the root of an n-deep chain",
        "level",
        SMALL,
        LARGE,
    )
    .ops(walks)
    .units_per_op(|n| 2.0 * n as f64)
    .check(chain, |(tree, levels), _| {
        let deepest = *levels.last().unwrap();
        black_box(tree.get_var(deepest, "w").unwrap());
        assert_eq!(tree.find_scope(deepest, "w").unwrap(), Some(tree.root()));
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn find_var_miss_per_level() {
    Scaling::new(
        "find_var(deepest, \"absent\") miss through an n-deep chain",
        "level",
        SMALL,
        LARGE,
    )
    .ops(walks)
    .units_per_op(|n| n as f64)
    .check(
        |n| {
            let (mut tree, levels) = chain(n);
            // Interned, so the miss walks instead of failing on the name.
            tree.intern("absent").unwrap();
            (tree, levels)
        },
        |(tree, levels), _| {
            assert_eq!(
                tree.find_var(*levels.last().unwrap(), "absent").unwrap(),
                None
            );
        },
    );
}

// ----- iterators and dumps -------------------------------------------------------

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn ancestors_per_item() {
    Scaling::new(
        "ancestors(deepest) of an n-deep chain",
        "item",
        SMALL,
        LARGE,
    )
    .ops(walks)
    .units_per_op(|n| n as f64)
    .check(chain, |(tree, levels), _| {
        let count = tree.ancestors(*levels.last().unwrap()).unwrap().count();
        assert_eq!(count, levels.len() + 1);
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn descendants_per_item_wide() {
    Scaling::new("descendants(root) with n kids", "item", SMALL, LARGE)
        .ops(walks)
        .units_per_op(|n| n as f64)
        .check(
            |n| wide_kids(n).0,
            |tree, _| {
                black_box(tree.descendants(tree.root()).unwrap().count());
            },
        );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn descendants_per_item_deep() {
    Scaling::new("descendants(root) of an n-deep chain", "item", SMALL, LARGE)
        .ops(walks)
        .units_per_op(|n| n as f64)
        .check(
            |n| chain(n).0,
            |tree, _| {
                black_box(tree.descendants(tree.root()).unwrap().count());
            },
        );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn kids_per_item() {
    Scaling::new("kids(root) with n kids", "item", SMALL, LARGE)
        .ops(walks)
        .units_per_op(|n| n as f64)
        .check(
            |n| wide_kids(n).0,
            |tree, _| {
                black_box(tree.kids(tree.root()).unwrap().count());
            },
        );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn local_vars_per_item() {
    Scaling::new(
        "local_vars + local_var_names of a scope of n variables",
        "variable",
        SMALL,
        LARGE,
    )
    .ops(walks)
    .units_per_op(|n| n as f64)
    .check(wide, |w, _| {
        let a = w.tree.local_vars(w.scope).unwrap().count();
        let b: usize = w.tree.local_var_names(w.scope).unwrap().map(str::len).sum();
        black_box((a, b));
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn dump_per_scope_wide() {
    Scaling::new(
        "dump(root) formatted, n kids of one variable each",
        "scope",
        SMALL,
        LARGE,
    )
    .ops(few_walks)
    .units_per_op(|n| n as f64)
    .check(
        |n| wide_kids(n).0,
        |tree, _| {
            black_box(formatted_len(tree.dump(tree.root()).unwrap()));
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn dump_per_scope_deep() {
    Scaling::new(
        "dump(root) formatted, n-deep chain of one variable per level",
        "scope",
        SMALL,
        LARGE,
    )
    .ops(few_walks)
    .units_per_op(|n| n as f64)
    .check(
        |n| chain(n).0,
        |tree, _| {
            black_box(formatted_len(tree.dump(tree.root()).unwrap()));
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn to_dot_per_scope_wide() {
    Scaling::new(
        "to_dot(root) formatted, n kids of one variable each",
        "scope",
        SMALL,
        LARGE,
    )
    .ops(few_walks)
    .units_per_op(|n| n as f64)
    .check(
        |n| wide_kids(n).0,
        |tree, _| {
            black_box(formatted_len(tree.to_dot(tree.root()).unwrap()));
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn to_dot_per_scope_deep() {
    Scaling::new(
        "to_dot(root) formatted, n-deep chain of one variable per level",
        "scope",
        SMALL,
        LARGE,
    )
    .ops(few_walks)
    .units_per_op(|n| n as f64)
    .check(
        |n| chain(n).0,
        |tree, _| {
            black_box(formatted_len(tree.to_dot(tree.root()).unwrap()));
        },
    );
}

/// `dump` and `to_dot` document O(size of the subtree), but the first line
/// shows the top scope's full path, so a dump of a leaf costs O(its depth):
/// timed per level of that path, which must stay flat.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn dump_and_to_dot_of_a_leaf_per_level_of_its_path() {
    Scaling::new(
        "dump + to_dot of the leaf at depth n, formatted",
        "level",
        SMALL,
        LARGE,
    )
    .ops(walks)
    .units_per_op(|n| 2.0 * n as f64)
    .check(chain, |(tree, levels), _| {
        let leaf = *levels.last().unwrap();
        let a = formatted_len(tree.dump(leaf).unwrap());
        let b = formatted_len(tree.to_dot(leaf).unwrap());
        black_box((a, b));
    });
}

// ----- variables in one wide scope ---------------------------------------------------

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn create_var_in_a_wide_scope() {
    Scaling::new(
        "create_var(root, v_i) up to n variables in one scope",
        "variable",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |n| (ScopeTree::new(), names("v", n)),
        |(tree, names), i| {
            black_box(tree.create_var(tree.root(), &names[i]).unwrap());
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn var_existing_in_a_wide_scope() {
    Scaling::new(
        "var(root, v_i) of an existing variable among n in one scope",
        "call",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(wide, |w, i| {
        let j = pick(i, w.vars.len());
        assert_eq!(w.tree.var(w.scope, &w.names[j]).unwrap(), w.vars[j]);
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn var_entry_insert_in_a_wide_scope() {
    Scaling::new(
        "var_entry(root, v_i).or_insert_with(..) up to n new variables in one scope",
        "variable",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |n| (ScopeTree::new(), names("v", n)),
        |(tree, names), i| {
            let root = tree.root();
            *tree
                .var_entry(root, &names[i])
                .unwrap()
                .or_insert_with(|| 0_u64)
                .unwrap() += 1;
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn var_entry_existing_in_a_wide_scope() {
    Scaling::new(
        "var_entry(root, v_i) of an existing variable among n in one scope",
        "call",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(wide, |w, i| {
        let j = pick(i, w.vars.len());
        assert_eq!(
            w.tree.var_entry(w.scope, &w.names[j]).unwrap().id(),
            Some(w.vars[j])
        );
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn find_local_var_in_a_wide_scope() {
    Scaling::new(
        "find_local_var(root, v_i) among n variables in one scope",
        "lookup",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(wide, |w, i| {
        let j = pick(i, w.vars.len());
        assert_eq!(
            w.tree.find_local_var(w.scope, &w.names[j]).unwrap(),
            Some(w.vars[j])
        );
    });
}

/// Issue 9 item 6: freeing the oldest temporaries one by one.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn remove_var_front_to_back_in_a_wide_scope() {
    Scaling::new(
        "remove_var front to back in a scope of n variables",
        "removal",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(wide, |w, i| w.tree.remove_var(w.vars[i]).unwrap());
}

/// The newest variable first, as a stack of temporaries is freed.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn remove_var_back_to_front_in_a_wide_scope() {
    Scaling::new(
        "remove_var back to front in a scope of n variables",
        "removal",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(wide, |w, i| {
        let last = w.vars.len() - 1 - i;
        w.tree.remove_var(w.vars[last]).unwrap();
    });
}

/// Issue 9 item 6.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn rename_in_a_wide_scope() {
    Scaling::new(
        "rename(root, v_i, r_i) of each of n variables in one scope",
        "rename",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |n| (wide(n), names("r", n)),
        |(w, new), i| {
            assert_eq!(
                w.tree.rename(w.scope, &w.names[i], &new[i]).unwrap(),
                w.vars[i]
            );
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn rename_unique_in_a_wide_scope() {
    Scaling::new(
        "rename_unique(root, v_i) of each of n variables in one scope",
        "rename",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(wide, |w, i| {
        black_box(w.tree.rename_unique(w.scope, &w.names[i]).unwrap().len());
    });
}

/// Issue 9 item 6: one call with every other name of the scope.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn erase_vars_half_the_names_per_variable() {
    Scaling::new(
        "erase_vars(root, every other name) in a scope of n variables",
        "variable",
        SMALL,
        LARGE,
    )
    .fresh()
    .once_per_copy()
    .units_per_op(|n| n as f64)
    .check(
        |n| {
            let w = wide(n);
            let half: Vec<String> = w.names.iter().step_by(2).cloned().collect();
            (w, half)
        },
        |(w, half), _| {
            assert_eq!(w.tree.erase_vars(w.scope, &*half).unwrap(), half.len());
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn erase_vars_except_half_the_names_per_variable() {
    Scaling::new(
        "erase_vars_except(root, every other name) in a scope of n variables",
        "variable",
        SMALL,
        LARGE,
    )
    .fresh()
    .once_per_copy()
    .units_per_op(|n| n as f64)
    .check(
        |n| {
            let w = wide(n);
            let keep: Vec<String> = w.names.iter().step_by(2).cloned().collect();
            (w, keep)
        },
        |(w, keep), _| {
            let erased = w.tree.erase_vars_except(w.scope, &*keep).unwrap();
            assert_eq!(erased, w.vars.len() - keep.len());
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn unique_var_in_one_scope() {
    Scaling::new(
        "unique_var(root, \"tmp\") up to n variables in one scope",
        "variable",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |_| ScopeTree::new(),
        |tree, _| {
            black_box(tree.unique_var(tree.root(), "tmp").unwrap());
        },
    );
}

/// Temporaries made and freed one after another: every cycle draws a new
/// unique name.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn unique_var_and_remove_var_churn() {
    Scaling::new(
        "unique_var(step, \"tmp\") + remove_var, n cycles",
        "cycle",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |_| {
            let mut tree = ScopeTree::new();
            let step = tree.new_scope(tree.root()).unwrap();
            tree.var(step, "h").unwrap();
            (tree, step)
        },
        |(tree, step), _| {
            let v = tree.unique_var(*step, "tmp").unwrap();
            tree.remove_var(v).unwrap();
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn var_queries_in_a_wide_scope() {
    Scaling::new(
        "owner + var_name + contains_var + local_var_count, n variables in one scope",
        "variable",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(wide, |w, i| {
        let j = pick(i, w.vars.len());
        let v = w.vars[j];
        assert_eq!(w.tree.owner(v).unwrap(), w.scope);
        assert_eq!(w.tree.var_name(v).unwrap(), w.names[j]);
        assert!(w.tree.contains_var(v));
        black_box(w.tree.local_var_count(w.scope).unwrap());
        black_box(w.tree.var_count());
    });
}

// ----- names -------------------------------------------------------------------------

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn intern_new_names() {
    Scaling::new("intern(n_i) of n new names", "name", SMALL, LARGE)
        .fresh()
        .check(
            |n| (ScopeTree::new(), names("n", n)),
            |(tree, names), i| {
                black_box(tree.intern(&names[i]).unwrap());
            },
        );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn symbol_intern_resolve_with_many_names() {
    Scaling::new(
        "symbol + intern (known) + resolve with n names",
        "name",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(
        |n| {
            let mut tree = ScopeTree::new();
            let names = names("n", n);
            let syms: Vec<Symbol> = names.iter().map(|s| tree.intern(s).unwrap()).collect();
            (tree, names, syms)
        },
        |(tree, names, syms), i| {
            let j = pick(i, names.len());
            assert_eq!(tree.symbol(&names[j]), Some(syms[j]));
            assert_eq!(tree.intern(&names[j]).unwrap(), syms[j]);
            assert_eq!(tree.resolve(syms[j]).unwrap().len(), names[j].len());
        },
    );
}

// ----- values --------------------------------------------------------------------------

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn get_with_many_variables() {
    Scaling::new(
        "get::<f32> with n variables in the tree",
        "read",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(many_vars, |(tree, vars), i| {
        black_box(*tree.get::<f32>(vars[pick(i, vars.len())]).unwrap());
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn set_with_many_variables() {
    Scaling::new(
        "set(f32) with n variables in the tree",
        "write",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(many_vars, |(tree, vars), i| {
        tree.set(vars[pick(i, vars.len())], i as f32).unwrap();
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn value_ops_with_many_variables() {
    Scaling::new(
        "replace, is, is_initialized, type_name, get_mut, take, clear, get_or_insert_with, \
         get_pair_mut with n variables in the tree",
        "variable",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(many_vars, |(tree, vars), i| {
        let (v, w) = (vars[pick(i, vars.len())], vars[pick(i + 1, vars.len())]);
        black_box(tree.replace(v, 2.0_f32).unwrap());
        assert!(tree.is::<f32>(v).unwrap());
        assert!(tree.is_initialized(v).unwrap());
        black_box(tree.type_name(v).unwrap());
        *tree.get_mut::<f32>(v).unwrap() += 1.0;
        black_box(tree.take::<f32>(v).unwrap());
        tree.set(v, 0.5_f32).unwrap();
        assert!(tree.clear(v).unwrap());
        *tree.get_or_insert_with(v, || 1.0_f32).unwrap() += 1.0;
        let (a, b) = tree.get_pair_mut::<f32, f32>(v, w).unwrap();
        *a += *b;
    });
}

// ----- step scopes -----------------------------------------------------------------------

/// Step scopes under the root with the step variables `h` and `c`, and `n`
/// steps pushed.
fn steps(n: usize) -> (ScopeTree, StepScopes, StepVar) {
    let mut tree = ScopeTree::new();
    let mut steps = StepScopes::new(&tree, tree.root()).unwrap();
    let h = steps.declare(&mut tree, "h").unwrap();
    steps.declare(&mut tree, "c").unwrap();
    for _ in 0..n {
        steps.push(&mut tree).unwrap();
    }
    (tree, steps, h)
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn step_push_with_many_steps() {
    Scaling::new(
        "StepScopes::push up to n live steps (2 step variables)",
        "push",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |_| steps(0),
        |(tree, steps, _), _| {
            black_box(steps.push(tree).unwrap());
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn step_push_ping_pong_many_steps() {
    Scaling::new(
        "StepScopes::push with a window of 2, n steps",
        "push",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |_| {
            let mut tree = ScopeTree::new();
            let mut steps = StepScopes::ping_pong(&tree, tree.root()).unwrap();
            let h = steps.declare(&mut tree, "h").unwrap();
            (tree, steps, h)
        },
        |(tree, steps, h), _| {
            let t = steps.push(tree).unwrap();
            tree.set(steps.var(*h, t).unwrap(), t as f32).unwrap();
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn step_push_after_recycle() {
    Scaling::new(
        "StepScopes::push into n parked step scopes after recycle",
        "push",
        SMALL,
        LARGE,
    )
    .fresh()
    .check(
        |n| {
            let (mut tree, mut steps, h) = steps(n);
            steps.recycle(&mut tree).unwrap();
            (tree, steps, h)
        },
        |(tree, steps, _), _| {
            black_box(steps.push(tree).unwrap());
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn step_recycle_per_step() {
    Scaling::new("StepScopes::recycle of n live steps", "step", SMALL, LARGE)
        .fresh()
        .once_per_copy()
        .units_per_op(|n| n as f64)
        .check(steps, |(tree, steps, _), _| {
            steps.recycle(tree).unwrap();
        });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn step_declare_per_held_scope() {
    Scaling::new(
        "StepScopes::declare of a new step variable with n step scopes held",
        "step",
        SMALL,
        LARGE,
    )
    .fresh()
    .once_per_copy()
    .units_per_op(|n| n as f64)
    .check(steps, |(tree, steps, _), _| {
        black_box(steps.declare(tree, "extra").unwrap());
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn step_drop_all_per_scope() {
    Scaling::new(
        "StepScopes::drop_all of n step scopes",
        "step",
        SMALL,
        LARGE,
    )
    .fresh()
    .once_per_copy()
    .units_per_op(|n| n as f64)
    .check(steps, |(tree, steps, _), _| {
        steps.drop_all(tree).unwrap();
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn step_var_and_scope_with_many_steps() {
    Scaling::new(
        "StepScopes::var + scope of step t among n live steps",
        "lookup",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(steps, |(tree, steps, h), i| {
        let t = pick(i, steps.len());
        let v = steps.var(*h, t).unwrap();
        assert_eq!(tree.owner(v).unwrap(), steps.scope(t).unwrap());
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn step_scopes_iter_per_item() {
    Scaling::new(
        "StepScopes::scopes() over n live steps",
        "item",
        SMALL,
        LARGE,
    )
    .ops(walks)
    .units_per_op(|n| n as f64)
    .check(steps, |(_, steps, _), _| {
        for item in steps.scopes() {
            black_box(item);
        }
    });
}

// ----- resolver --------------------------------------------------------------------------

/// The capacity of every resolver below that must hold all its entries: the
/// same at both sizes, so that only the number of entries changes.
const RESOLVER_CAPACITY: usize = 1 << 19;

/// Fills `r` with `pairs` and checks that a second pass hits (almost) always.
fn warm(r: &mut Resolver, tree: &ScopeTree, pairs: &[(ScopeId, Symbol)]) {
    for &(s, name) in pairs {
        r.find_var(tree, s, name).unwrap();
    }
    let (hits, _) = r.hits_and_misses();
    for &(s, name) in pairs {
        r.find_var(tree, s, name).unwrap();
    }
    let new_hits = r.hits_and_misses().0 - hits;
    assert!(
        new_hits as f64 >= 0.95 * pairs.len() as f64,
        "only {new_hits} of {} lookups hit",
        pairs.len()
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn resolver_hits_with_many_cached_names() {
    Scaling::new(
        "Resolver::find_var hit, n names cached for one scope",
        "hit",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(
        |n| {
            let Wide {
                mut tree, scope, ..
            } = wide(n);
            let step = tree.new_scope(scope).unwrap();
            let pairs: Vec<(ScopeId, Symbol)> = names("v", n)
                .iter()
                .map(|s| (step, tree.symbol(s).unwrap()))
                .collect();
            let mut r = Resolver::with_capacity(RESOLVER_CAPACITY);
            warm(&mut r, &tree, &pairs);
            (tree, pairs, r)
        },
        |(tree, pairs, r), i| {
            let (s, name) = pairs[pick(i, pairs.len())];
            assert!(r.find_var(tree, s, name).unwrap().is_some());
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn resolver_hits_with_many_cached_scopes() {
    Scaling::new(
        "Resolver::find_var(s_i, \"w\") hit, n scopes cached for one name",
        "hit",
        SMALL,
        LARGE,
    )
    .ops(|_| READS)
    .check(
        |n| {
            let mut tree = ScopeTree::new();
            let root = tree.root();
            tree.var(root, "w").unwrap();
            let w = tree.intern("w").unwrap();
            let pairs: Vec<(ScopeId, Symbol)> =
                (0..n).map(|_| (tree.new_scope(root).unwrap(), w)).collect();
            let mut r = Resolver::with_capacity(RESOLVER_CAPACITY);
            warm(&mut r, &tree, &pairs);
            (tree, pairs, r)
        },
        |(tree, pairs, r), i| {
            let (s, name) = pairs[pick(i, pairs.len())];
            assert!(r.find_var(tree, s, name).unwrap().is_some());
        },
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn resolver_miss_per_level() {
    Scaling::new(
        "Resolver::find_var miss (walks) from the bottom of an n-deep chain",
        "level",
        SMALL,
        LARGE,
    )
    .ops(walks)
    .units_per_op(|n| n as f64)
    .check(
        |n| {
            let (tree, levels) = chain(n);
            (tree, *levels.last().unwrap(), Resolver::with_capacity(2))
        },
        |(tree, deepest, r), _| {
            r.clear();
            assert!(r.find_var(tree, *deepest, "w").unwrap().is_some());
        },
    );
}

// ----- workers -----------------------------------------------------------------------------

/// Two worker scopes under the root holding `n / 2` variables each (set to
/// `f32`), and 16 parameters in the root.
struct Split {
    tree: ScopeTree,
    workers: [ScopeId; 2],
    own: [Vec<VarId>; 2],
    param: VarId,
}

fn split(n: usize) -> Split {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let mut param = None;
    for p in 0..16 {
        let v = tree.var(root, format!("p{p}")).unwrap();
        tree.set(v, 1.0_f32).unwrap();
        param.get_or_insert(v);
    }
    let workers = [tree.new_scope(root).unwrap(), tree.new_scope(root).unwrap()];
    let own = workers.map(|w| {
        (0..n / 2)
            .map(|i| {
                let v = tree.var(w, format!("a{i}")).unwrap();
                tree.set(v, 0.0_f32).unwrap();
                v
            })
            .collect()
    });
    Split {
        tree,
        workers,
        own,
        param: param.unwrap(),
    }
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn split_workers_per_variable() {
    Scaling::new(
        "split_workers(2 scopes) with n variables in the workers",
        "variable",
        SMALL,
        LARGE,
    )
    .ops(walks)
    .units_per_op(|n| n as f64)
    .check(split, |s, _| {
        let ws = s.tree.split_workers(&s.workers).unwrap();
        assert_eq!(ws[1].own_var_count(), s.own[1].len());
    });
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing test: run with cargo test --release"
)]
fn run_workers_per_variable() {
    Scaling::new(
        "run_workers(2 scopes), each writing its n/2 variables from a parameter",
        "variable",
        SMALL,
        LARGE,
    )
    .ops(few_walks)
    .units_per_op(|n| n as f64)
    .check(split, |s, _| {
        let Split {
            tree,
            workers,
            own,
            param,
        } = s;
        // A failed access panics in its worker, and `run_workers` passes the
        // panic on.
        let counts = tree
            .run_workers(workers, |mut w| {
                let p = *w.get::<f32>(*param).unwrap();
                for &v in &own[w.index()] {
                    *w.get_mut::<f32>(v).unwrap() += p;
                }
                own[w.index()].len()
            })
            .unwrap();
        assert_eq!(counts, [own[0].len(), own[1].len()]);
    });
}
