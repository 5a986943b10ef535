//! Cost per scope and per variable as the tree grows (issue 9). Each bench
//! reports a throughput in elements, so criterion prints the time per scope
//! or per variable; the figure should stay flat across sizes.
//!
//! Group `shared_name_scopes`: under `n` distinct parents (made beforehand,
//! untimed), one named kid `attn` each: `n` scopes that share one name, for
//! `n` = 10^4, 10^5 and 10^6 (function `scopetree`). The target: the time
//! per scope within 1.5x from 10^4 to 10^6. Beside it, `vec_push_floor`: a
//! `Vec` of `n` scope-sized (128-byte) elements grows by `n` more, the cost
//! of the memory alone.
//!
//! Group `wide_scope`, in one scope of `n` variables (made beforehand,
//! untimed):
//! - `remove_var/n`: the first 1,000 variables removed front to back, per
//!   removal (n = 10^3: every variable);
//! - `rename/n`: the first 1,000 variables renamed, per rename;
//! - `erase_vars_half/n`: one `erase_vars` call with every other name of
//!   the scope, per variable of the scope (n = 10^4 and 10^5).
//!
//! The timed calls' output (the tree) is dropped outside the timing.
//! Run: `cargo bench --bench scaling`; one group:
//! `cargo bench --bench scaling -- shared_name_scopes`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use scopetree::{ScopeId, ScopeTree, VarId};

/// A tree whose root has `n` unnamed kids, and those kids.
fn parents(n: usize) -> (ScopeTree, Vec<ScopeId>) {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let parents = (0..n).map(|_| tree.new_scope(root).unwrap()).collect();
    (tree, parents)
}

/// One scope's bytes in the arena (`diagnostics::scope_slot_bytes`), as an
/// element for the floor below.
type ScopeSized = [u64; 16];

fn shared_name_scopes(c: &mut Criterion) {
    assert_eq!(
        std::mem::size_of::<ScopeSized>(),
        scopetree::diagnostics::scope_slot_bytes(),
        "the floor's element must have a scope's size"
    );
    let mut g = c.benchmark_group("shared_name_scopes");
    g.sample_size(10);
    for n in [10_000, 100_000, 1_000_000] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("scopetree", n), &n, |b, &n| {
            b.iter_batched(
                || parents(n),
                |(mut tree, parents)| {
                    for &p in &parents {
                        black_box(tree.new_named_scope(p, "attn").unwrap());
                    }
                    (tree, parents)
                },
                BatchSize::PerIteration,
            )
        });
        // The memory floor: a `Vec` of `n` scope-sized elements (made
        // untimed, as the parents are) grows by `n` more. No hashing, no
        // links: what any arena of this slot size pays for its memory.
        g.bench_with_input(BenchmarkId::new("vec_push_floor", n), &n, |b, &n| {
            b.iter_batched(
                || {
                    let mut v: Vec<ScopeSized> = Vec::new();
                    v.extend((0..n as u64).map(|i| [i; 16]));
                    v
                },
                |mut v| {
                    for i in 0..n as u64 {
                        v.push(black_box([i; 16]));
                    }
                    v
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

/// The root holding `n` variables `v0` …, their names and handles.
fn wide(n: usize) -> (ScopeTree, Vec<String>, Vec<VarId>) {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let names: Vec<String> = (0..n).map(|i| format!("v{i}")).collect();
    let vars = names
        .iter()
        .map(|name| tree.create_var(root, name).unwrap())
        .collect();
    (tree, names, vars)
}

/// Variables removed or renamed per sample.
const CALLS: usize = 1_000;

fn wide_scope(c: &mut Criterion) {
    let mut g = c.benchmark_group("wide_scope");
    g.sample_size(10);
    g.throughput(Throughput::Elements(CALLS as u64));
    for n in [1_000, 100_000] {
        g.bench_with_input(BenchmarkId::new("remove_var", n), &n, |b, &n| {
            b.iter_batched(
                || wide(n),
                |(mut tree, names, vars)| {
                    for &v in &vars[..CALLS] {
                        tree.remove_var(v).unwrap();
                    }
                    (tree, names, vars)
                },
                BatchSize::PerIteration,
            )
        });
        let new: Vec<String> = (0..CALLS).map(|i| format!("r{i}")).collect();
        g.bench_with_input(BenchmarkId::new("rename", n), &n, |b, &n| {
            b.iter_batched(
                || wide(n),
                |(mut tree, names, vars)| {
                    let root = tree.root();
                    for (old, new) in names.iter().zip(&new) {
                        black_box(tree.rename(root, old, new).unwrap());
                    }
                    (tree, names, vars)
                },
                BatchSize::PerIteration,
            )
        });
    }
    for n in [10_000, 100_000] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("erase_vars_half", n), &n, |b, &n| {
            b.iter_batched(
                || {
                    let (tree, names, vars) = wide(n);
                    let half: Vec<String> = names.iter().step_by(2).cloned().collect();
                    (tree, half, vars)
                },
                |(mut tree, half, vars)| {
                    let root = tree.root();
                    assert_eq!(tree.erase_vars(root, &half).unwrap(), half.len());
                    (tree, half, vars)
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = shared_name_scopes, wide_scope
}
criterion_main!(benches);
