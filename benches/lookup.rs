//! `find_var` against depth and width, next to the Paddle-style baseline.
//!
//! Groups (criterion ids `group/function/parameter`):
//! - `find_var_root_hit/*/d`: from the scope at depth `d`, a name held only
//!   by the root: the lookup walks all `d + 1` levels.
//! - `find_var_local_hit/*/d`: a name held by the starting scope.
//! - `find_var_miss/*/d`: a name the tree interned but no level on the way
//!   holds (scopetree) / no level holds (Paddle-style).
//! - `find_var_width/*/n`: a scope at depth 1 holding `n` variables; a local
//!   hit on its last variable and a root hit through it.
//! - `full_path_walk/*/d`: resolve the variable `v{d}_0` at the full path
//!   `s1/…/s{d}/v{d}_0` from the root, component by component (`kid` per
//!   level, then `find_local_var`), in a chain whose levels have one kid
//!   (`*_kids1`) or 16 named siblings before the path's kid (`*_kids17`).
//!   `walk_str` passes each component as `&str`, `walk_sym` as a `Symbol`
//!   interned beforehand; `sharing_variable` is the sharing layer's
//!   `VariableStore::variable("s1/…/v{d}_0")` on the same tree.
//!
//! Functions: `scopetree_str` (name as `&str`, hashed once per lookup),
//! `scopetree_sym` (an interned `Symbol`), `resolver_str` / `resolver_sym`
//! (the same lookup through a `Resolver` that has cached it: a hit),
//! `paddle_style` (SipHash, a lock and a hash at every level),
//! `paddle_style_fx` (the same with an Fx hasher); in `find_var_root_hit`,
//! `index_chase_floor` (the floor of any walk over slot indices: `d + 1`
//! dependent loads from a dense `Vec<u32>` of parent indices).

#[path = "support/chains.rs"]
mod chains;
#[path = "support/paddle_style.rs"]
mod paddle_style;

use std::hash::RandomState;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use scopetree::sharing::VariableStore;
use scopetree::{Resolver, ScopeId, ScopeTree, Symbol};

use chains::{
    DEPTHS, full_name, paddle_chain, scope_name, scopetree_chain, scopetree_wide_chain, var_name,
};
use paddle_style::PaddleScope;

/// Which variable a depth group looks up from the scope at depth `d`.
#[derive(Clone, Copy)]
enum Case {
    RootHit,
    LocalHit,
    Miss,
}

impl Case {
    fn group(self) -> &'static str {
        match self {
            Case::RootHit => "find_var_root_hit",
            Case::LocalHit => "find_var_local_hit",
            Case::Miss => "find_var_miss",
        }
    }

    fn name(self, d: usize) -> String {
        match self {
            Case::RootHit => var_name(0, 0),
            Case::LocalHit => var_name(d, 0),
            Case::Miss => "absent".to_owned(),
        }
    }
}

fn depth_group(c: &mut Criterion, case: Case) {
    let mut g = c.benchmark_group(case.group());
    for &d in &DEPTHS {
        let name = case.name(d);
        let (mut tree, scopes) = scopetree_chain(d);
        let at = scopes[d];
        // Intern the missing name too, so that the miss walks the chain
        // instead of stopping at the interner.
        let sym = tree.intern(name.as_str()).unwrap();
        let expect_hit = !matches!(case, Case::Miss);
        assert_eq!(
            tree.find_var(at, name.as_str()).unwrap().is_some(),
            expect_hit
        );

        g.bench_with_input(BenchmarkId::new("scopetree_str", d), &d, |b, _| {
            b.iter(|| {
                tree.find_var(black_box(at), black_box(name.as_str()))
                    .unwrap()
            })
        });
        g.bench_with_input(BenchmarkId::new("scopetree_sym", d), &d, |b, _| {
            b.iter(|| tree.find_var(black_box(at), black_box(sym)).unwrap())
        });

        // The same lookup through a `Resolver` that has seen it once: every
        // iteration is a hit.
        let mut r = Resolver::new();
        let expect = tree.find_var(at, sym).unwrap();
        assert_eq!(r.find_var(&tree, at, sym).unwrap(), expect);
        g.bench_with_input(BenchmarkId::new("resolver_sym", d), &d, |b, _| {
            b.iter(|| r.find_var(&tree, black_box(at), black_box(sym)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("resolver_str", d), &d, |b, _| {
            b.iter(|| {
                r.find_var(&tree, black_box(at), black_box(name.as_str()))
                    .unwrap()
            })
        });
        let (hits, misses) = r.hits_and_misses();
        assert_eq!(misses, 1, "{hits} hits");

        let paddle = paddle_chain::<RandomState>(d);
        let p: &PaddleScope = &paddle[d];
        assert_eq!(p.find_var(&name).is_some(), expect_hit);
        g.bench_with_input(BenchmarkId::new("paddle_style", d), &d, |b, _| {
            b.iter(|| p.find_var(black_box(&name)))
        });
        if matches!(case, Case::RootHit) {
            let paddle_fx = paddle_chain::<rustc_hash::FxBuildHasher>(d);
            let p = &paddle_fx[d];
            g.bench_with_input(BenchmarkId::new("paddle_style_fx", d), &d, |b, _| {
                b.iter(|| p.find_var(black_box(&name)))
            });
            // The floor of any walk over slot indices: `d + 1` dependent
            // loads of a parent index from a dense array, nothing else.
            let up: Vec<u32> = (0..=d as u32)
                .map(|i| i.checked_sub(1).unwrap_or(u32::MAX))
                .collect();
            assert_eq!(index_chase(&up, d), 0);
            g.bench_with_input(BenchmarkId::new("index_chase_floor", d), &d, |b, _| {
                b.iter(|| index_chase(black_box(&up), black_box(d)))
            });
        }
    }
    g.finish();
}

/// Follows `up` from `start` until an entry is `u32::MAX`: one dependent
/// load per level, the least a parent walk over slot indices can do.
#[inline(never)]
fn index_chase(up: &[u32], start: usize) -> usize {
    let mut i = start;
    while let Some(&p) = up.get(i) {
        if p == u32::MAX {
            break;
        }
        i = p as usize;
    }
    i
}

fn root_hit(c: &mut Criterion) {
    depth_group(c, Case::RootHit);
}

fn local_hit(c: &mut Criterion) {
    depth_group(c, Case::LocalHit);
}

fn miss(c: &mut Criterion) {
    depth_group(c, Case::Miss);
}

/// A scope at depth 1 with `n` variables: a local hit on the last one, and a
/// hit at the root through it.
fn width(c: &mut Criterion) {
    let mut g = c.benchmark_group("find_var_width");
    for n in [1usize, 8, 64, 1024] {
        let mut tree = ScopeTree::new();
        let root = tree.root();
        tree.var(root, "W").unwrap();
        let wide = tree.new_scope(root).unwrap();
        let paddle = PaddleScope::new_root();
        paddle.set("W", 0.0_f32);
        let paddle_wide = paddle.new_scope();
        for i in 0..n {
            tree.var(wide, format!("x{i}")).unwrap();
            paddle_wide.set(&format!("x{i}"), 0.0_f32);
        }
        let last = format!("x{}", n - 1);
        let last_sym = tree.intern(last.as_str()).unwrap();
        let w_sym = tree.intern("W").unwrap();

        g.bench_with_input(BenchmarkId::new("scopetree_str_local", n), &n, |b, _| {
            b.iter(|| {
                tree.find_var(black_box(wide), black_box(last.as_str()))
                    .unwrap()
            })
        });
        g.bench_with_input(BenchmarkId::new("scopetree_sym_local", n), &n, |b, _| {
            b.iter(|| tree.find_var(black_box(wide), black_box(last_sym)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("paddle_style_local", n), &n, |b, _| {
            b.iter(|| paddle_wide.find_var(black_box(&last)))
        });
        g.bench_with_input(BenchmarkId::new("scopetree_str_root", n), &n, |b, _| {
            b.iter(|| tree.find_var(black_box(wide), black_box("W")).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("scopetree_sym_root", n), &n, |b, _| {
            b.iter(|| tree.find_var(black_box(wide), black_box(w_sym)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("paddle_style_root", n), &n, |b, _| {
            b.iter(|| paddle_wide.find_var(black_box("W")))
        });
    }
    g.finish();
}

/// Follows the named kids `path` from `from`, then finds `name` there.
fn walk<N: scopetree::Name + Copy>(
    tree: &ScopeTree,
    from: ScopeId,
    path: &[N],
    name: N,
) -> Option<scopetree::VarId> {
    let mut s = from;
    for &part in path {
        s = tree.kid(s, part).unwrap()?;
    }
    tree.find_local_var(s, name).unwrap()
}

/// Full-path resolution from the root, component by component, against
/// depth and the number of kids per level.
fn full_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("full_path_walk");
    for &d in &DEPTHS {
        for siblings in [0usize, 16] {
            let kids = siblings + 1;
            let (mut tree, scopes) = scopetree_wide_chain(d, siblings);
            let root = tree.root();
            let names: Vec<String> = (1..=d).map(scope_name).collect();
            let strs: Vec<&str> = names.iter().map(String::as_str).collect();
            let syms: Vec<Symbol> = strs.iter().map(|n| tree.intern(n).unwrap()).collect();
            let leaf = var_name(d, 0);
            let leaf_sym = tree.intern(leaf.as_str()).unwrap();
            let expect = tree.find_local_var(scopes[d], leaf.as_str()).unwrap();
            assert!(expect.is_some());
            assert_eq!(walk(&tree, root, &strs, leaf.as_str()), expect);
            assert_eq!(walk(&tree, root, &syms, leaf_sym), expect);

            g.bench_with_input(
                BenchmarkId::new(format!("scopetree_walk_str_kids{kids}"), d),
                &d,
                |b, _| {
                    b.iter(|| {
                        walk(
                            &tree,
                            black_box(root),
                            black_box(&strs),
                            black_box(leaf.as_str()),
                        )
                    })
                },
            );
            g.bench_with_input(
                BenchmarkId::new(format!("scopetree_walk_sym_kids{kids}"), d),
                &d,
                |b, _| {
                    b.iter(|| {
                        walk(
                            &tree,
                            black_box(root),
                            black_box(&syms),
                            black_box(leaf_sym),
                        )
                    })
                },
            );
            if siblings == 0 {
                let full = full_name(d);
                let store = VariableStore::from_tree(tree);
                assert_eq!(store.variable(&full).unwrap(), expect);
                g.bench_with_input(
                    BenchmarkId::new(format!("sharing_variable_kids{kids}"), d),
                    &d,
                    |b, _| b.iter(|| store.variable(black_box(&full)).unwrap()),
                );
            }
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    targets = root_hit, local_hit, miss, width, full_path
}
criterion_main!(benches);
