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
//!
//! A second group, `peers_full_name`, asks for one variable by its full name
//! of 5, 9 or 17 components (`encoder/layer_1/attention0/…/w`) in a store of
//! 1,001 variables: candle's `VarBuilder::get` from a builder pushed to the
//! prefix (what a candle-nn layer does), against the sharing layer's
//! `VariableStore::variable(full_name)` and `get_variable` of the existing
//! variable from the caller's variable scope.
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
use scopetree::sharing::{Initializer, Reuse, ScopeOpts, VarScope, VarSpec, VariableStore};

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

fn full_path_walk(c: &mut Criterion) {
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

/// The scope names of a full name of `n` components (the last is `w`).
fn dirs(n: usize) -> Vec<String> {
    let mut d = vec!["encoder".to_owned(), "layer_1".to_owned()];
    let mut i = 0;
    while d.len() < n - 1 {
        d.push(format!("attention{i}"));
        i += 1;
    }
    d.truncate(n - 1);
    d
}

/// A store holding `dirs/w` and 1,000 other variables, and the variable
/// scope of `dirs`.
fn sharing_store(dirs: &[String]) -> (VariableStore, VarScope) {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let f32s = || Initializer::constant(vec![0.0_f32; 4]);
    for i in 0..1_000 {
        let scope = format!("other{}", i % 50);
        store
            .variable_scope(&root, &scope, ScopeOpts::new(), |s, vs| {
                s.get_variable(vs, VarSpec::new(format!("v{i}")).initializer(f32s()))
            })
            .expect("build");
    }
    let vs = store
        .variable_scope(&root, &dirs.join("/"), ScopeOpts::new(), |s, vs| {
            s.get_variable(vs, VarSpec::new("w").initializer(f32s()))?;
            Ok(vs.clone())
        })
        .expect("build");
    (store, vs)
}

/// The same 1,001 variables in a `VarMap`, and a builder pushed to `dirs`.
fn candle_store(dirs: &[String]) -> (VarMap, VarBuilder<'static>) {
    let map = VarMap::new();
    let root = VarBuilder::from_varmap(&map, DType::F32, &Device::Cpu);
    for i in 0..1_000 {
        root.pp(format!("other{}", i % 50))
            .get(4, &format!("v{i}"))
            .expect("build");
    }
    let mut vb = root;
    for d in dirs {
        vb = vb.pp(d);
    }
    vb.get(4, "w").expect("build");
    (map, vb)
}

fn full_name(c: &mut Criterion) {
    let mut g = c.benchmark_group("peers_full_name");
    for n in [5usize, 9, 17] {
        let dirs = dirs(n);
        let (map, vb) = candle_store(&dirs);
        assert_eq!(map.all_vars().len(), 1_001);
        g.bench_with_input(BenchmarkId::new("candle_varbuilder_get", n), &n, |b, _| {
            b.iter(|| vb.get(4, black_box("w")).unwrap())
        });
        let (mut store, vs) = sharing_store(&dirs);
        let full = format!("{}/w", dirs.join("/"));
        let w = store.variable(&full).expect("valid").expect("present");
        g.bench_with_input(BenchmarkId::new("scopetree_variable", n), &n, |b, _| {
            b.iter(|| store.variable(black_box(&full)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("scopetree_get_variable", n), &n, |b, _| {
            b.iter(|| {
                let got = store
                    .get_variable(
                        black_box(&vs),
                        VarSpec::<Vec<f32>>::new(black_box("w")).reuse(Reuse::Reuse),
                    )
                    .unwrap();
                debug_assert_eq!(got, w);
                got
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    targets = full_path_walk, full_name
}
criterion_main!(benches);
