//! The sharing layer: full-name lookups next to a candle-style baseline, and
//! default-named scopes among many siblings.
//!
//! Groups (criterion ids `group/function/parameter`):
//! - `full_name/*/n`: a variable whose full name has `n` components
//!   (`encoder/layer_1/…/w`), in a store that also holds 1,000 other
//!   variables. `variable` is `VariableStore::variable(full_name)`;
//!   `get_variable` is `get_variable(&vs, VarSpec::new("w").reuse(Reuse))`
//!   from the variable scope of the `n - 1` enclosing components (held by
//!   the caller, as a model's layer holds its scope), including building the
//!   spec; `candle_style` is the in-crate baseline of what candle's
//!   `VarBuilder::get` does per call: join the prefix (already joined with
//!   `.`) and the name into a new `String`, lock a `Mutex<HashMap<String,
//!   V>>`, hash the whole string, clone the value (an `Arc`, as a candle
//!   `Tensor` is); `index_floor` is the floor of any lookup that hashes the
//!   full name once: a plain `FxHashMap<Box<str>, u64>` probe of the same
//!   name among the same 1,001, with no lock and no check against the tree.
//! - `default_name/*/n`: `variable_scope_unique(root, "layer")` with `n`
//!   earlier `layer_*` siblings (each call adds one).

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rustc_hash::FxHashMap;
use scopetree::sharing::{Initializer, Reuse, ScopeOpts, VarScope, VarSpec, VariableStore};

const COMPONENTS: [usize; 3] = [5, 9, 17];

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

/// A store holding `dirs/w` and 1,000 other variables; the variable scope
/// of `dirs`.
fn store_with(dirs: &[String]) -> (VariableStore, VarScope) {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    for i in 0..1_000 {
        store
            .variable_scope(
                &root,
                &format!("other{}", i % 50),
                ScopeOpts::new(),
                |s, vs| {
                    s.get_variable(
                        vs,
                        VarSpec::new(format!("v{i}"))
                            .initializer(Initializer::constant(vec![0.0_f32; 4])),
                    )
                },
            )
            .expect("build");
    }
    let path = dirs.join("/");
    let vs = store
        .variable_scope(&root, &path, ScopeOpts::new(), |s, vs| {
            s.get_variable(
                vs,
                VarSpec::new("w").initializer(Initializer::constant(vec![0.0_f32; 4])),
            )?;
            Ok(vs.clone())
        })
        .expect("build");
    (store, vs)
}

/// The candle-style baseline's map: the same 1,001 names, dotted.
fn candle_map(dirs: &[String]) -> Mutex<HashMap<String, Arc<Vec<f32>>>> {
    let mut m = HashMap::new();
    for i in 0..1_000 {
        m.insert(format!("other{}.v{i}", i % 50), Arc::new(vec![0.0_f32; 4]));
    }
    m.insert(format!("{}.w", dirs.join(".")), Arc::new(vec![0.0_f32; 4]));
    Mutex::new(m)
}

/// The floor of any lookup that hashes a full name once: the same 1,001
/// names in a plain `FxHashMap<Box<str>, u64>`, no lock, no check.
fn index_floor(dirs: &[String]) -> FxHashMap<Box<str>, u64> {
    let mut m = FxHashMap::default();
    for i in 0..1_000 {
        m.insert(format!("other{}/v{i}", i % 50).into(), i);
    }
    m.insert(format!("{}/w", dirs.join("/")).into(), 1_000);
    m
}

fn candle_get(
    map: &Mutex<HashMap<String, Arc<Vec<f32>>>>,
    prefix: &str,
    name: &str,
) -> Option<Arc<Vec<f32>>> {
    let mut full = String::with_capacity(prefix.len() + 1 + name.len());
    full.push_str(prefix);
    full.push('.');
    full.push_str(name);
    let guard = map.lock().ok()?;
    guard.get(&full).cloned()
}

fn full_name(c: &mut Criterion) {
    let mut g = c.benchmark_group("full_name");
    for n in COMPONENTS {
        let dirs = dirs(n);
        let (mut store, vs) = store_with(&dirs);
        let full = format!("{}/w", dirs.join("/"));
        let w = store.variable(&full).expect("valid").expect("present");
        g.bench_with_input(BenchmarkId::new("variable", n), &full, |b, full| {
            b.iter(|| store.variable(black_box(full)))
        });
        g.bench_with_input(BenchmarkId::new("get_variable", n), &vs, |b, vs| {
            b.iter(|| {
                let got = store.get_variable(
                    black_box(vs),
                    VarSpec::<Vec<f32>>::new(black_box("w")).reuse(Reuse::Reuse),
                );
                debug_assert_eq!(got, Ok(w));
                got
            })
        });
        let map = candle_map(&dirs);
        let prefix = dirs.join(".");
        assert!(candle_get(&map, &prefix, "w").is_some());
        g.bench_with_input(BenchmarkId::new("candle_style", n), &prefix, |b, prefix| {
            b.iter(|| candle_get(black_box(&map), black_box(prefix), black_box("w")))
        });
        let floor = index_floor(&dirs);
        assert!(floor.contains_key(full.as_str()));
        g.bench_with_input(BenchmarkId::new("index_floor", n), &full, |b, full| {
            b.iter(|| floor.get(black_box(full.as_str())).copied())
        });
    }
    g.finish();
}

fn default_name(c: &mut Criterion) {
    let mut g = c.benchmark_group("default_name");
    for n in [2_000usize, 20_000] {
        let mut store = VariableStore::new();
        let root = store.root_scope();
        for _ in 0..n {
            store
                .variable_scope_unique(&root, "layer", ScopeOpts::new(), |_, _| Ok(()))
                .expect("build");
        }
        g.bench_function(BenchmarkId::new("variable_scope_unique", n), |b| {
            b.iter(|| {
                store.variable_scope_unique(black_box(&root), "layer", ScopeOpts::new(), |_, _| {
                    Ok(())
                })
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = full_name, default_name
}
criterion_main!(benches);
