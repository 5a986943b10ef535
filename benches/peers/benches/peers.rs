//! `scopetree` next to candle's `VarMap` + `VarBuilder` and the Paddle-style
//! baseline, in one run: resolving the variable at a full path
//! `s1/…/s{d}/v{d}_0` at depth `d`.
//!
//! - candle: model code holds a `VarBuilder` pushed to the prefix
//!   (`vb.pp("s1")…pp("sd")`) and asks for `v{d}_0`. `get` joins the prefix
//!   into a `String`, locks the map, hashes the path, checks the shape and
//!   clones the tensor handle; `contains_tensor` does the same without the
//!   shape check and the clone.
//! - scopetree: `find_var` from the scope at depth `d` (a hit in the current
//!   scope), and a walk of the path from the root by names (`kid` per level,
//!   then `find_local_var`), which is what a full-name lookup does: by `&str`
//!   (`scopetree_path_walk`, each component hashed as candle hashes its whole
//!   path) and by `Symbol`s interned beforehand (`scopetree_path_walk_sym`).
//! - Paddle-style: `FindVar` from the scope at depth `d`.
//!
//! Run: `cargo bench -p scopetree-peers` (builds candle; not part of CI).

#[path = "../../support/chains.rs"]
mod chains;
#[path = "../../support/paddle_style.rs"]
mod paddle_style;

use std::hint::black_box;
use std::time::Duration;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use scopetree::Symbol;

use chains::{DEPTHS, VARS_PER_SCOPE, paddle_chain, scope_name, scopetree_chain, var_name};
use paddle_style::PaddleScope;

/// The candle side: a `VarMap` holding every variable of the chain under its
/// full path, and a `VarBuilder` per level.
fn candle_chain(depth: usize) -> (VarMap, Vec<VarBuilder<'static>>) {
    let map = VarMap::new();
    let root = VarBuilder::from_varmap(&map, DType::F32, &Device::Cpu);
    let mut builders = vec![root];
    for level in 0..=depth {
        for j in 0..VARS_PER_SCOPE {
            builders[level].get(4, &var_name(level, j)).unwrap();
        }
        if level < depth {
            let next = builders[level].pp(scope_name(level + 1));
            builders.push(next);
        }
    }
    (map, builders)
}

fn full_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("peers_full_path");
    for &d in &DEPTHS {
        let name = var_name(d, 0);

        let (map, vbs) = candle_chain(d);
        assert_eq!(map.all_vars().len(), (d + 1) * VARS_PER_SCOPE);
        let vb = &vbs[d];
        assert!(vb.contains_tensor(&name));
        g.bench_with_input(BenchmarkId::new("candle_varbuilder_get", d), &d, |b, _| {
            b.iter(|| vb.get(4, black_box(&name)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("candle_contains_tensor", d), &d, |b, _| {
            b.iter(|| vb.contains_tensor(black_box(&name)))
        });

        let (mut tree, scopes) = scopetree_chain(d);
        let at = scopes[d];
        assert!(tree.find_var(at, name.as_str()).unwrap().is_some());
        g.bench_with_input(BenchmarkId::new("scopetree_find_var", d), &d, |b, _| {
            b.iter(|| {
                tree.find_var(black_box(at), black_box(name.as_str()))
                    .unwrap()
            })
        });
        let path: Vec<String> = (1..=d).map(scope_name).collect();
        g.bench_with_input(BenchmarkId::new("scopetree_path_walk", d), &d, |b, _| {
            b.iter(|| {
                let mut s = tree.root();
                for part in black_box(&path) {
                    s = tree.kid(s, part.as_str()).unwrap().unwrap();
                }
                tree.find_local_var(s, black_box(name.as_str())).unwrap()
            })
        });

        let syms: Vec<Symbol> = path.iter().map(|p| tree.intern(p).unwrap()).collect();
        let leaf = tree.intern(name.as_str()).unwrap();
        g.bench_with_input(
            BenchmarkId::new("scopetree_path_walk_sym", d),
            &d,
            |b, _| {
                b.iter(|| {
                    let mut s = tree.root();
                    for &part in black_box(&syms) {
                        s = tree.kid(s, part).unwrap().unwrap();
                    }
                    tree.find_local_var(s, black_box(leaf)).unwrap()
                })
            },
        );

        let paddle = paddle_chain::<std::hash::RandomState>(d);
        let p: &PaddleScope = &paddle[d];
        assert!(p.find_var(&name).is_some());
        g.bench_with_input(BenchmarkId::new("paddle_style_find_var", d), &d, |b, _| {
            b.iter(|| p.find_var(black_box(&name)))
        });

        // The headline case, repeated here so that all three sit in one run:
        // a hit at the root from depth d (candle has no parent search).
        let root_name = var_name(0, 0);
        g.bench_with_input(BenchmarkId::new("scopetree_root_hit", d), &d, |b, _| {
            b.iter(|| {
                tree.find_var(black_box(at), black_box(root_name.as_str()))
                    .unwrap()
            })
        });
        g.bench_with_input(BenchmarkId::new("paddle_style_root_hit", d), &d, |b, _| {
            b.iter(|| p.find_var(black_box(&root_name)))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    targets = full_path
}
criterion_main!(benches);
