//! The cost per MB of the ranks' digests (the consistency check's local
//! hashing, `SyncPlan::digest`, and the printed digests), side by side with
//! the FxHash the digests used before they became checksums.
//!
//! Group `digest_per_mb`, 1 MiB of `f32` in 16 variables per iteration:
//! - `sync_plan_digest_xxh3`: `SyncPlan::digest` (xxh3-128 per variable,
//!   then of the hashes);
//! - `fxhash_same_bytes`: `rustc_hash::FxHasher` over the same 16 buffers,
//!   as the digest did before.
//!
//! `cargo bench --bench digest`

use std::hash::Hasher;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use scopetree::ScopeTree;
use scopetree::ranks::{PlanOptions, SingleProcess, SyncPlan};

const VARS: usize = 16;
const BYTES: usize = 1 << 20;

fn digest_per_mb(c: &mut Criterion) {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let mut raw = Vec::new();
    for i in 0..VARS {
        let values: Vec<f32> = (0..BYTES / 4 / VARS)
            .map(|j| (i * j) as f32 * 0.5)
            .collect();
        let v = tree.var(root, format!("w{i}")).expect("a fresh name");
        tree.set(v, values.clone()).expect("a live variable");
        raw.push(
            values
                .iter()
                .flat_map(|x| x.to_ne_bytes())
                .collect::<Vec<u8>>(),
        );
    }
    let mut plan = SyncPlan::new(&SingleProcess, &tree, root, &PlanOptions::new())
        .expect("a plan of one rank");
    let mut g = c.benchmark_group("digest_per_mb");
    g.throughput(Throughput::Bytes(BYTES as u64));
    g.bench_function("sync_plan_digest_xxh3", |b| {
        b.iter(|| black_box(plan.digest(black_box(&tree)).expect("planned variables")));
    });
    g.bench_function("fxhash_same_bytes", |b| {
        b.iter(|| {
            let mut all = rustc_hash::FxHasher::default();
            for values in &raw {
                let mut h = rustc_hash::FxHasher::default();
                h.write(black_box(values));
                all.write_u64(h.finish());
            }
            black_box(all.finish())
        });
    });
    g.finish();
}

criterion_group!(benches, digest_per_mb);
criterion_main!(benches);
