//! Costs around the training loop of `examples/train_rnn`: one recycled
//! sequence of step scopes, one ping-pong step, one worker split, one
//! `run_workers` call. Run with `cargo bench --bench step_workers`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use scopetree::{ScopeTree, StepScopes};

/// The example's tree shape: 5 parameters in the root, 2 workers with 8
/// variables each and 20 step scopes of 4 variables under each.
fn example_tree() -> (ScopeTree, Vec<scopetree::ScopeId>, Vec<StepScopes>) {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    for name in ["Wxh", "Whh", "bh", "Why", "by"] {
        let v = tree.var(root, name).unwrap();
        tree.set(v, vec![0.0_f32; 64]).unwrap();
    }
    let mut workers = Vec::new();
    let mut all_steps = Vec::new();
    for i in 0..2 {
        let w = tree.new_named_scope(root, format!("worker_{i}")).unwrap();
        for j in 0..8 {
            let v = tree.var(w, format!("v{j}")).unwrap();
            tree.set(v, vec![0.0_f32; 64]).unwrap();
        }
        let mut steps = StepScopes::new(&tree, w).unwrap();
        let svs: Vec<_> = ["x", "y", "h", "p"]
            .iter()
            .map(|n| steps.declare(&mut tree, *n).unwrap())
            .collect();
        for _ in 0..20 {
            let t = steps.push(&mut tree).unwrap();
            for &sv in &svs {
                tree.set(steps.var(sv, t).unwrap(), vec![0.0_f32; 64])
                    .unwrap();
            }
        }
        workers.push(w);
        all_steps.push(steps);
    }
    (tree, workers, all_steps)
}

fn bench(c: &mut Criterion) {
    let (mut tree, workers, mut steps) = example_tree();
    c.bench_function("step_scopes/recycle_and_push_20_steps_x4_vars", |b| {
        b.iter(|| {
            let s = &mut steps[0];
            s.recycle(&mut tree).unwrap();
            for _ in 0..20 {
                black_box(s.push(&mut tree).unwrap());
            }
        })
    });

    let mut pp_tree = ScopeTree::new();
    let mut pp = StepScopes::ping_pong(&pp_tree, pp_tree.root()).unwrap();
    for n in ["x", "y", "h", "p"] {
        pp.declare(&mut pp_tree, n).unwrap();
    }
    c.bench_function("step_scopes/ping_pong_push_4_vars", |b| {
        b.iter(|| black_box(pp.push(&mut pp_tree).unwrap()))
    });

    c.bench_function("workers/split_2_workers_181_vars", |b| {
        b.iter(|| black_box(tree.split_workers(&workers).unwrap().len()))
    });

    c.bench_function("workers/run_workers_2_empty", |b| {
        b.iter(|| black_box(tree.run_workers(&workers, |w| w.index()).unwrap()))
    });

    let (mut one_tree, one_workers, _) = example_tree();
    let one = &one_workers[..1];
    c.bench_function("workers/run_workers_1_empty", |b| {
        b.iter(|| black_box(one_tree.run_workers(one, |w| w.index()).unwrap()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
