//! The steady state of a data-parallel step allocates nothing on the tree
//! path: [`SyncPlan::all_reduce`], [`SyncPlan::check_consistency`] and
//! ZeRO's [`SyncPlan::reduce_scatter`] and [`SyncPlan::all_gather`] reuse
//! the plan's buckets, buffers and spares, step after step. Measured with a
//! counting global allocator of this file's own (per thread, so the tests
//! of the file may run in parallel), on the single-process world; the MPI
//! test binary (`tests/ranks_mpi.rs`) checks the same under `mpirun`.
//!
//! The allocator is `unsafe` only because `GlobalAlloc` is an unsafe
//! trait: it forwards every call to `System` unchanged and only counts.

use scopetree::checkpoint::Tensor;
use scopetree::ranks::{PlanOptions, Reduce, SingleProcess, SyncPlan};
use scopetree::{ScopeTree, VarId};

#[path = "support/count_alloc.rs"]
mod count_alloc;

/// A gradient scope of 60 variables of every reduced type, some larger than
/// a bucket and many smaller.
fn grads() -> (ScopeTree, scopetree::ScopeId, Vec<VarId>) {
    let mut tree = ScopeTree::new();
    let grads = tree.new_named_scope(tree.root(), "grads").unwrap();
    let mut vars = Vec::new();
    for layer in 0..15 {
        let s = tree
            .new_named_scope(grads, format!("layer_{layer}"))
            .unwrap();
        let n = 1 + layer * 37;
        let w = tree.var(s, "w").unwrap();
        tree.set(w, Tensor::new(vec![n, 3], vec![1.0_f32; 3 * n]).unwrap())
            .unwrap();
        let b = tree.var(s, "b").unwrap();
        tree.set(b, vec![0.5_f32; n]).unwrap();
        let d = tree.var(s, "d").unwrap();
        tree.set(d, vec![0.25_f64; 2 * n]).unwrap();
        let t = tree.var(s, "t").unwrap();
        tree.set(t, Tensor::new(vec![n], vec![2.0_f64; n]).unwrap())
            .unwrap();
        vars.extend([w, b, d, t]);
    }
    (tree, grads, vars)
}

#[test]
fn all_reduce_and_the_consistency_check_allocate_nothing_per_step() {
    let (mut tree, grads, vars) = grads();
    let world = SingleProcess;
    // Buckets of 1 KiB and 25 MiB; every variable fused, every variable
    // sent from its own buffer (and swapped with a spare), and a mix.
    let cases = [
        (1 << 10, usize::MAX),
        (25 << 20, usize::MAX),
        (1 << 10, 1),
        (25 << 20, 1),
        (25 << 20, 1024),
    ];
    for (bucket, direct) in cases {
        let opts = PlanOptions::new().bucket_bytes(bucket).direct_bytes(direct);
        let mut plan = SyncPlan::new(&world, &tree, grads, &opts).unwrap();
        assert!(plan.reduce_buckets() >= 2);
        // One warm-up step, as a training loop's first.
        plan.all_reduce(&world, &mut tree, Reduce::Mean).unwrap();
        plan.check_consistency(&world, &tree).unwrap();
        let n = count_alloc::allocations(|| {
            for step in 0..50 {
                tree.get_mut::<Vec<f32>>(vars[1]).unwrap()[0] = step as f32;
                plan.all_reduce(&world, &mut tree, Reduce::Sum).unwrap();
                plan.all_reduce(&world, &mut tree, Reduce::Mean).unwrap();
                plan.check_consistency(&world, &tree).unwrap();
            }
        });
        assert_eq!(
            n, 0,
            "{n} allocations in 50 steps with buckets of {bucket} bytes, direct from {direct}"
        );
        assert_eq!(tree.get::<Vec<f32>>(vars[1]).unwrap()[0], 49.0);
    }
}

#[test]
fn the_zero_exchange_allocates_nothing_per_step() {
    let (mut tree, grads, vars) = grads();
    let world = SingleProcess;
    // Every piece through the padded buffers, every piece reduced into a
    // spare that the variable then takes, in one call or in chunks, and a
    // mix.
    let cases = [
        (1 << 10, usize::MAX),
        (1 << 10, 1),
        (25 << 20, 1),
        (25 << 20, 1024),
    ];
    for (bucket, direct) in cases {
        let opts = PlanOptions::new().bucket_bytes(bucket).direct_bytes(direct);
        let mut plan = SyncPlan::new(&world, &tree, grads, &opts).unwrap();
        plan.reduce_scatter(&world, &mut tree, Reduce::Mean)
            .unwrap();
        plan.all_gather(&world, &mut tree).unwrap();
        let n = count_alloc::allocations(|| {
            for step in 0..50 {
                tree.get_mut::<Vec<f32>>(vars[1]).unwrap()[0] = step as f32;
                plan.reduce_scatter(&world, &mut tree, Reduce::Sum).unwrap();
                plan.reduce_scatter(&world, &mut tree, Reduce::Mean)
                    .unwrap();
                plan.all_gather(&world, &mut tree).unwrap();
            }
        });
        assert_eq!(
            n, 0,
            "{n} allocations in 50 steps with buckets of {bucket} bytes, direct from {direct}"
        );
        assert_eq!(tree.get::<Vec<f32>>(vars[1]).unwrap()[0], 49.0);
    }
}

#[test]
fn the_counter_sees_an_allocation() {
    // The test above can fail: a step that allocates is counted.
    let n = count_alloc::allocations(|| {
        let v = std::hint::black_box(vec![0_u8; 64]);
        drop(v);
    });
    assert_eq!(n, 1);
}
