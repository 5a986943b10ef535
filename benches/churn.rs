//! Step churn: a training step in a scope of its own, per step; and deleting
//! and re-creating one kid of a parent with 10,000 kids.
//!
//! Group `step_churn`, one step per iteration: create a step scope under the
//! model scope, create 8 variables, read the 4 parameters of the model scope,
//! delete the step scope.
//! - `scopetree_structural_sym` / `_str`: variables created but not set
//!   (names as interned symbols / as `&str`); parameters read through
//!   `VarId`s resolved once before the loop.
//! - `scopetree_values_sym`: the same, and each variable set to an `f32`
//!   (one box per fresh variable).
//! - `paddle_style_structural` / `paddle_style_values`: `NewScope`, `Var` (or
//!   set) 8 names, parameters read by name through the parent (Paddle has no
//!   safe handle), `DeleteScope`.
//!
//! Group `wide_parent_10k`: a parent with 10,000 live kids; delete one kid
//! (cycling through positions) and create a new one.

#[path = "support/paddle_style.rs"]
mod paddle_style;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use scopetree::{ScopeId, ScopeTree, Symbol, VarId};

use paddle_style::PaddleScope;

const STEP_VARS: [&str; 8] = ["x", "h", "c", "i", "f", "o", "g", "loss"];
const PARAMS: [&str; 4] = ["W_ih", "W_hh", "b_ih", "b_hh"];

struct Model {
    tree: ScopeTree,
    root: ScopeId,
    params: Vec<VarId>,
    syms: Vec<Symbol>,
}

fn model() -> Model {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let params = PARAMS
        .iter()
        .map(|p| {
            let v = tree.var(root, *p).unwrap();
            tree.set(v, 0.5_f32).unwrap();
            v
        })
        .collect();
    let syms = STEP_VARS.iter().map(|n| tree.intern(n).unwrap()).collect();
    Model {
        tree,
        root,
        params,
        syms,
    }
}

fn read_params(tree: &ScopeTree, params: &[VarId]) -> f32 {
    params.iter().map(|&p| *tree.get::<f32>(p).unwrap()).sum()
}

fn step_churn(c: &mut Criterion) {
    let mut g = c.benchmark_group("step_churn");

    let mut m = model();
    g.bench_function("scopetree_structural_sym", |b| {
        b.iter(|| {
            let step = m.tree.new_scope(m.root).unwrap();
            for &s in &m.syms {
                black_box(m.tree.var(step, s).unwrap());
            }
            black_box(read_params(&m.tree, &m.params));
            m.tree.delete_scope(step).unwrap();
        })
    });
    g.bench_function("scopetree_structural_str", |b| {
        b.iter(|| {
            let step = m.tree.new_scope(m.root).unwrap();
            for &n in &STEP_VARS {
                black_box(m.tree.var(step, black_box(n)).unwrap());
            }
            black_box(read_params(&m.tree, &m.params));
            m.tree.delete_scope(step).unwrap();
        })
    });
    g.bench_function("scopetree_values_sym", |b| {
        b.iter(|| {
            let step = m.tree.new_scope(m.root).unwrap();
            for (i, &s) in m.syms.iter().enumerate() {
                let v = m.tree.var(step, s).unwrap();
                m.tree.set(v, i as f32).unwrap();
            }
            black_box(read_params(&m.tree, &m.params));
            m.tree.delete_scope(step).unwrap();
        })
    });
    assert_eq!(m.tree.scope_count(), 1);

    let paddle = PaddleScope::new_root();
    for p in PARAMS {
        paddle.set(p, 0.5_f32);
    }
    g.bench_function("paddle_style_structural", |b| {
        b.iter(|| {
            let step = paddle.new_scope();
            for &n in &STEP_VARS {
                black_box(step.var(black_box(n)));
            }
            let sum: f32 = PARAMS.iter().map(|p| step.read::<f32>(p).unwrap()).sum();
            black_box(sum);
            paddle.delete_scope(step);
        })
    });
    g.bench_function("paddle_style_values", |b| {
        b.iter(|| {
            let step = paddle.new_scope();
            for (i, &n) in STEP_VARS.iter().enumerate() {
                step.set(black_box(n), i as f32);
            }
            let sum: f32 = PARAMS.iter().map(|p| step.read::<f32>(p).unwrap()).sum();
            black_box(sum);
            paddle.delete_scope(step);
        })
    });
    assert_eq!(paddle.kid_count(), 0);
    g.finish();
}

const WIDE: usize = 10_000;

fn wide_parent(c: &mut Criterion) {
    let mut g = c.benchmark_group("wide_parent_10k");

    let mut tree = ScopeTree::new();
    let parent = tree.new_scope(tree.root()).unwrap();
    let mut kids: Vec<ScopeId> = (0..WIDE).map(|_| tree.new_scope(parent).unwrap()).collect();
    let mut at = 0usize;
    g.bench_function("scopetree_delete_recreate", |b| {
        b.iter(|| {
            at = (at + 7919) % WIDE;
            tree.delete_scope(kids[at]).unwrap();
            kids[at] = tree.new_scope(parent).unwrap();
        })
    });
    assert_eq!(tree.kid_count(parent).unwrap(), WIDE);

    let root = PaddleScope::new_root();
    let paddle_parent = root.new_scope();
    let mut paddle_kids: Vec<Arc<PaddleScope>> =
        (0..WIDE).map(|_| paddle_parent.new_scope()).collect();
    let mut at = 0usize;
    g.bench_function("paddle_style_delete_recreate", |b| {
        b.iter(|| {
            at = (at + 7919) % WIDE;
            let fresh = paddle_parent.new_scope();
            let old = std::mem::replace(&mut paddle_kids[at], fresh);
            paddle_parent.delete_scope(old);
        })
    });
    assert_eq!(paddle_parent.kid_count(), WIDE);
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    targets = step_churn, wide_parent
}
criterion_main!(benches);
