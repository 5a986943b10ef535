//! Building and tearing down a big tree: 100,000 scopes and 1,000,000
//! variables (the root, 1,000 kids, 99 grandkids under each; 10 variables,
//! unset, in every scope but the root).
//!
//! Group `tree_100k_scopes_1m_vars`: `*_build` times the build alone (the
//! drop happens outside the timing), `*_teardown` the drop alone.

#[path = "support/paddle_style.rs"]
mod paddle_style;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use scopetree::ScopeTree;

use paddle_style::PaddleScope;

const KIDS: usize = 1_000;
const GRANDKIDS: usize = 99;
const VARS: [&str; 10] = ["v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9"];

fn build_scopetree() -> ScopeTree {
    let mut tree = ScopeTree::new();
    let syms: Vec<_> = VARS.iter().map(|n| tree.intern(n).unwrap()).collect();
    let root = tree.root();
    for _ in 0..KIDS {
        let kid = tree.new_scope(root).unwrap();
        for &s in &syms {
            tree.var(kid, s).unwrap();
        }
        for _ in 0..GRANDKIDS {
            let g = tree.new_scope(kid).unwrap();
            for &s in &syms {
                tree.var(g, s).unwrap();
            }
        }
    }
    tree
}

fn build_paddle() -> Vec<Arc<PaddleScope>> {
    let root = PaddleScope::new_root();
    let mut all = Vec::with_capacity(1 + KIDS * (1 + GRANDKIDS));
    for _ in 0..KIDS {
        let kid = root.new_scope();
        for n in VARS {
            kid.var(n);
        }
        for _ in 0..GRANDKIDS {
            let g = kid.new_scope();
            for n in VARS {
                g.var(n);
            }
            all.push(g);
        }
        all.push(kid);
    }
    all.push(root);
    all
}

fn big_tree(c: &mut Criterion) {
    let t = build_scopetree();
    assert_eq!(t.scope_count(), 1 + KIDS * (1 + GRANDKIDS));
    assert_eq!(t.var_count(), KIDS * (1 + GRANDKIDS) * VARS.len());
    drop(t);

    let mut g = c.benchmark_group("tree_100k_scopes_1m_vars");
    g.sample_size(10);
    g.bench_function("scopetree_build", |b| {
        b.iter_with_large_drop(build_scopetree)
    });
    g.bench_function("scopetree_teardown", |b| {
        b.iter_batched(build_scopetree, drop, BatchSize::PerIteration)
    });
    g.bench_function("paddle_style_build", |b| {
        b.iter_with_large_drop(build_paddle)
    });
    g.bench_function("paddle_style_teardown", |b| {
        b.iter_batched(build_paddle, drop, BatchSize::PerIteration)
    });
    g.finish();
    black_box(());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = big_tree
}
criterion_main!(benches);
