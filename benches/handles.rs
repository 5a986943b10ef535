//! Reads and writes through a `VarId`, next to the floor: a plain
//! `Vec<Box<dyn Any>>` index plus downcast.
//!
//! Group `handle_read`: `*_one` reads one variable; `*_sweep_1024` reads all
//! 1024 variables of the tree per iteration (handles kept in a `Vec`, as a
//! runtime keeps them); `*_set` overwrites one value in place.

use std::any::Any;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use scopetree::{ScopeTree, VarId};

const N: usize = 1024;

fn handle_read(c: &mut Criterion) {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let layer = tree.new_named_scope(root, "layer").unwrap();
    let mut handles: Vec<VarId> = Vec::with_capacity(N);
    for i in 0..N {
        let scope = if i % 2 == 0 { root } else { layer };
        let v = tree.var(scope, format!("p{i}")).unwrap();
        tree.set(v, i as f32).unwrap();
        handles.push(v);
    }
    let mut floor: Vec<Box<dyn Any + Send + Sync>> = (0..N)
        .map(|i| Box::new(i as f32) as Box<dyn Any + Send + Sync>)
        .collect();
    let indices: Vec<usize> = (0..N).collect();
    let (h, i) = (handles[N / 2], N / 2);

    let mut g = c.benchmark_group("handle_read");
    g.bench_function("scopetree_get_one", |b| {
        b.iter(|| *tree.get::<f32>(black_box(h)).unwrap())
    });
    g.bench_function("vec_floor_get_one", |b| {
        b.iter(|| *floor[black_box(i)].downcast_ref::<f32>().unwrap())
    });
    g.bench_function("scopetree_get_sweep_1024", |b| {
        b.iter(|| {
            black_box(&handles)
                .iter()
                .map(|&h| *tree.get::<f32>(h).unwrap())
                .sum::<f32>()
        })
    });
    g.bench_function("vec_floor_get_sweep_1024", |b| {
        b.iter(|| {
            black_box(&indices)
                .iter()
                .map(|&i| *floor[i].downcast_ref::<f32>().unwrap())
                .sum::<f32>()
        })
    });
    g.bench_function("scopetree_set", |b| {
        b.iter(|| tree.set(black_box(h), black_box(1.5_f32)).unwrap())
    });
    g.bench_function("vec_floor_set", |b| {
        b.iter(|| *floor[black_box(i)].downcast_mut::<f32>().unwrap() = black_box(1.5_f32))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    targets = handle_read
}
criterion_main!(benches);
