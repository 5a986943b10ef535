//! Checkpoint throughput: saving and loading about 1 GiB in 256 `f32`
//! tensors, next to writing and reading the same bytes with `std::fs` in the
//! same run (the goal: at least 0.8x the raw throughput both ways).
//!
//! - `save`: `checkpoint::save` of the tree (temporary file + rename).
//! - `raw_write`: `File::create` + `write_all` of each tensor's bytes over
//!   the same file; `raw_write_atomic`: the same bytes written to a new
//!   temporary file beside the target, renamed over it (what an atomic save
//!   must do, with `std::fs`).
//! - Each timed run of the three writers starts after the file it replaces
//!   was flushed to disk, untimed (see `support/timing.rs`), so no writer pays for
//!   writeback that another left pending.
//! - `load`: a strict `checkpoint::load` into the built tree (the default:
//!   values that fit overwritten in place) and `load_rollback` with
//!   `rollback(true)` (every tensor read into new memory first).
//! - `raw_read`: `std::fs::read` of the same file (one fresh buffer), and
//!   `raw_read_into`: `read_exact` of each tensor's bytes into 256 buffers
//!   allocated once (no allocation or page fault in the loop: the fastest
//!   a reader can be).
//! - `raw_read_fresh_keep`: `read_exact` of each tensor's bytes into a fresh
//!   buffer while the previous 256 buffers stay alive until the end, then
//!   dropped: the allocation and page-fault pattern of `rollback(true)`
//!   (the like-with-like baseline for `load_rollback`).
//!
//! - `load_sharded`: the same tree saved as a Hugging Face sharded
//!   checkpoint in 4 shards (`checkpoint::save_sharded`), loaded strictly
//!   from its directory into the built tree; `raw_read_shards_into`: the 4
//!   shard files read whole with `read_exact` into 4 buffers allocated once
//!   (the same bytes, raw; issue 22's goal: at least 0.8x).
//!
//! Size: `SCOPETREE_CKPT_MIB` MiB in all (default 1024). Under
//! `cargo test --benches` (criterion's test mode: no `--bench` argument)
//! each benchmark runs once on 8 MiB, so the smoke run stays fast.
//! Run: `cargo bench --bench checkpoint`.

use std::hint::black_box;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use scopetree::checkpoint::{self, Checkpointable, LoadOptions, SaveOptions};
use scopetree::{ScopeTree, VarId};

#[path = "support/timing.rs"]
mod timing;
use timing::after_sync;

const TENSORS: usize = 256;

fn total_mib() -> usize {
    if !std::env::args().any(|a| a == "--bench") {
        return 8;
    }
    std::env::var("SCOPETREE_CKPT_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

fn model(total_bytes: usize) -> (ScopeTree, Vec<VarId>) {
    let elems = total_bytes / TENSORS / 4;
    let mut t = ScopeTree::new();
    let mut vars = Vec::with_capacity(TENSORS);
    for layer in 0..TENSORS / 8 {
        let s = t
            .new_named_scope(t.root(), format!("layer_{layer:02}"))
            .unwrap();
        for j in 0..8 {
            let v = t.var(s, format!("w{j}")).unwrap();
            t.set(v, vec![(layer * 8 + j) as f32 * 0.5; elems]).unwrap();
            vars.push(v);
        }
    }
    (t, vars)
}

fn raw_write(t: &ScopeTree, vars: &[VarId], path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    for &v in vars {
        f.write_all(&t.get::<Vec<f32>>(v).unwrap().le_bytes())
            .unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let mib = total_mib();
    let bytes = mib << 20;
    let dir = std::env::temp_dir().join(format!("scopetree-ckpt-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let st = dir.join("model.safetensors");
    let raw = dir.join("model.raw");
    let (mut tree, vars) = model(bytes);

    // Both files exist before any benchmark, so a filter may run the reads alone.
    checkpoint::save(&tree, tree.root(), &st, &SaveOptions::new()).unwrap();
    raw_write(&tree, &vars, &raw);
    let sharded = dir.join("sharded");
    let shard_opts = SaveOptions::new().max_shard_size(bytes as u64 / 4);
    let shards = checkpoint::save_sharded(&tree, tree.root(), &sharded, &shard_opts)
        .unwrap()
        .shards;
    assert_eq!(shards.len(), 4);

    let mut g = c.benchmark_group(format!("checkpoint_{mib}MiB_{TENSORS}_f32"));
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(12))
        .throughput(Throughput::Bytes(bytes as u64));

    g.bench_function("save", |b| {
        after_sync(b, &st, || {
            checkpoint::save(&tree, tree.root(), &st, &SaveOptions::new()).unwrap();
        })
    });
    g.bench_function("raw_write", |b| {
        after_sync(b, &raw, || raw_write(&tree, &vars, &raw))
    });
    let tmp = dir.join("model.raw.tmp");
    g.bench_function("raw_write_atomic", |b| {
        after_sync(b, &raw, || {
            raw_write(&tree, &vars, &tmp);
            std::fs::rename(&tmp, &raw).unwrap();
        })
    });

    let root = tree.root();
    g.bench_function("load", |b| {
        b.iter(|| checkpoint::load(&mut tree, root, &st, &LoadOptions::new()).unwrap())
    });
    let staged = LoadOptions::new().rollback(true);
    g.bench_function("load_rollback", |b| {
        b.iter(|| checkpoint::load(&mut tree, root, &st, &staged).unwrap())
    });
    g.bench_function("load_sharded", |b| {
        b.iter(|| checkpoint::load(&mut tree, root, &sharded, &LoadOptions::new()).unwrap())
    });
    let shard_paths: Vec<_> = shards.iter().map(|s| sharded.join(s)).collect();
    let mut shard_bufs: Vec<Vec<u8>> = shard_paths
        .iter()
        .map(|p| vec![0_u8; std::fs::metadata(p).unwrap().len() as usize])
        .collect();
    g.bench_function("raw_read_shards_into", |b| {
        b.iter(|| {
            for (p, buf) in shard_paths.iter().zip(&mut shard_bufs) {
                std::fs::File::open(p).unwrap().read_exact(buf).unwrap();
            }
            black_box(&shard_bufs);
        })
    });
    g.bench_function("raw_read", |b| {
        b.iter(|| black_box(std::fs::read(&raw).unwrap()))
    });
    let mut bufs = vec![vec![0_u8; bytes / TENSORS]; TENSORS];
    g.bench_function("raw_read_into", |b| {
        b.iter(|| {
            let mut f = std::fs::File::open(&raw).unwrap();
            for buf in &mut bufs {
                f.read_exact(buf).unwrap();
            }
            black_box(&bufs);
        })
    });
    // Like with like for `rollback(true)`: the same bytes read with
    // `std::fs` into one fresh buffer per tensor while the previous buffers
    // stay alive, which are dropped at the end (the memory such a load
    // needs: the old values until the last tensor is read).
    let per = bytes / TENSORS;
    let mut held: Vec<Vec<u8>> = (0..TENSORS).map(|_| vec![1_u8; per]).collect();
    g.bench_function("raw_read_fresh_keep", |b| {
        b.iter(|| {
            let mut f = std::fs::File::open(&raw).unwrap();
            let mut fresh = Vec::with_capacity(TENSORS);
            for _ in 0..TENSORS {
                let mut buf = vec![0_u8; per];
                f.read_exact(&mut buf).unwrap();
                fresh.push(buf);
            }
            drop(std::mem::replace(&mut held, fresh));
            black_box(&held);
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
