//! Checkpoints: the peak extra memory of a load, measured with a counting
//! global allocator (this file's own: it counts the allocations of the
//! thread that makes them, so the tests of this file can run in parallel).
//!
//! A load streams the file: it holds the header, its plan and at most one
//! tensor being read (plus a 64 KiB read buffer); by default
//! (`rollback(false)`) a value of the right type and size takes its tensor
//! in place. With `rollback(true)` it reads every tensor into new memory
//! before changing anything, so that a read error leaves the tree as it
//! was: extra memory about the file's size. Print the figures with
//! `cargo test --release --test checkpoint_memory -- --nocapture`.

#[path = "support/peak_alloc.rs"]
mod peak_alloc;

use peak_alloc::measure;
use scopetree::checkpoint::{self, LoadOptions, SaveOptions};
use scopetree::{ScopeTree, VarId};

const TENSORS: usize = 16;
const ELEMS: usize = 256 * 1024; // 1 MiB of f32 each
const TENSOR_BYTES: i64 = (ELEMS * 4) as i64;
/// Header, plan, report, key strings, read buffer: well under this.
const OVERHEAD: i64 = 256 * 1024;

fn model(v: f32) -> (ScopeTree, Vec<VarId>) {
    let mut t = ScopeTree::new();
    let s = t.new_named_scope(t.root(), "layers").unwrap();
    let vars = (0..TENSORS)
        .map(|i| {
            let w = t.var(s, format!("w{i:02}")).unwrap();
            t.set(w, vec![v + i as f32; ELEMS]).unwrap();
            w
        })
        .collect();
    (t, vars)
}

fn saved() -> (tempfile::TempDir, std::path::PathBuf, u64) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.safetensors");
    let (t, _) = model(1.0);
    checkpoint::save(&t, t.root(), &p, &SaveOptions::new()).unwrap();
    let len = std::fs::metadata(&p).unwrap().len();
    (d, p, len)
}

#[test]
fn a_streamed_load_needs_about_one_tensor() {
    let (_d, p, file_len) = saved();
    let (mut t, vars) = model(0.0);
    let root = t.root();
    let (start, peak, end) = measure(|| {
        checkpoint::load(&mut t, root, &p, &LoadOptions::new()).unwrap();
    });
    let extra = peak - start;
    println!(
        "default (in place): file {file_len} B, tensor {TENSOR_BYTES} B, peak extra {extra} B ({:.2} tensors), live change {} B",
        extra as f64 / TENSOR_BYTES as f64,
        end - start
    );
    assert!(extra <= TENSOR_BYTES + OVERHEAD, "peak extra {extra} B");
    assert_eq!(t.get::<Vec<f32>>(vars[3]).unwrap()[0], 4.0);
}

#[test]
fn an_atomic_load_needs_at_most_the_file_plus_one_tensor() {
    let (_d, p, file_len) = saved();
    let (mut t, vars) = model(0.0);
    let root = t.root();
    let (start, peak, end) = measure(|| {
        checkpoint::load(&mut t, root, &p, &LoadOptions::new().rollback(true)).unwrap();
    });
    let extra = peak - start;
    println!(
        "rollback(true): file {file_len} B, peak extra {extra} B ({:.3} x file), live change {} B",
        extra as f64 / file_len as f64,
        end - start
    );
    assert!(
        extra <= file_len as i64 + TENSOR_BYTES,
        "peak extra {extra} B"
    );
    assert_eq!(t.get::<Vec<f32>>(vars[15]).unwrap()[ELEMS - 1], 16.0);
}

#[test]
fn creating_from_a_file_holds_nothing_beyond_the_values_it_makes() {
    let (_d, p, file_len) = saved();
    let mut t = ScopeTree::new();
    let root = t.root();
    let (start, peak, end) = measure(|| {
        checkpoint::load(
            &mut t,
            root,
            &p,
            &LoadOptions::new().create(true).rollback(false),
        )
        .unwrap();
    });
    let kept = end - start;
    println!(
        "create: file {file_len} B, values kept {kept} B, transient peak above them {} B",
        peak - end
    );
    assert!(kept >= (TENSORS as i64) * TENSOR_BYTES);
    assert!(
        peak - end <= TENSOR_BYTES + OVERHEAD,
        "transient {} B",
        peak - end
    );
}

// A sharded checkpoint of about 1 GiB in 4 shards (release only: `.ci/run`
// runs it in `cargo test --release --tests`). The bound of issue 22: the
// peak of a load is at most the values it loads plus the largest shard.

const BIG_TENSORS: usize = 64;
const BIG_ELEMS: usize = 4 * 1024 * 1024; // 16 MiB of f32 each
const BIG_BYTES: i64 = (BIG_TENSORS * BIG_ELEMS * 4) as i64; // 1 GiB
const SHARD: u64 = 256 << 20;

fn big_model(v: f32) -> (ScopeTree, Vec<VarId>) {
    let mut t = ScopeTree::new();
    let s = t.new_named_scope(t.root(), "layers").unwrap();
    let vars = (0..BIG_TENSORS)
        .map(|i| {
            let w = t.var(s, format!("w{i:02}")).unwrap();
            t.set(w, vec![v + i as f32; BIG_ELEMS]).unwrap();
            w
        })
        .collect();
    (t, vars)
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "1 GiB: release only (cargo test --release --test checkpoint_memory)"
)]
fn a_sharded_load_of_1_gib_in_4_shards_peaks_below_the_values_plus_the_largest_shard() {
    let d = tempfile::tempdir().unwrap();
    {
        let (t, _) = big_model(1.0);
        let opts = SaveOptions::new().max_shard_size(SHARD);
        let r = checkpoint::save_sharded(&t, t.root(), d.path(), &opts).unwrap();
        assert_eq!(r.shards.len(), 4);
    }
    let largest = (1..=4)
        .map(|k| {
            let p = d.path().join(format!("model-{k:05}-of-00004.safetensors"));
            std::fs::metadata(p).unwrap().len() as i64
        })
        .max()
        .unwrap();

    // Into the built model (in place), then atomic (rollback), then into
    // an empty tree (every value made).
    let (mut t, vars) = big_model(0.0);
    let root = t.root();
    let (start, peak, _) = measure(|| {
        checkpoint::load(&mut t, root, d.path(), &LoadOptions::new()).unwrap();
    });
    println!(
        "sharded in place: 1 GiB in 4 shards (largest {largest} B), peak extra {} B",
        peak - start
    );
    assert!(peak - start <= largest, "peak extra {} B", peak - start);
    assert_eq!(t.get::<Vec<f32>>(vars[63]).unwrap()[BIG_ELEMS - 1], 64.0);

    let (start, peak, _) = measure(|| {
        checkpoint::load(&mut t, root, d.path(), &LoadOptions::new().rollback(true)).unwrap();
    });
    println!(
        "sharded rollback(true): peak extra {} B ({:.3} x the values)",
        peak - start,
        (peak - start) as f64 / BIG_BYTES as f64
    );
    assert!(
        peak - start <= BIG_BYTES + largest,
        "peak extra {} B",
        peak - start
    );
    drop(t);

    let mut fresh = ScopeTree::new();
    let root = fresh.root();
    let (start, peak, end) = measure(|| {
        checkpoint::load(&mut fresh, root, d.path(), &LoadOptions::new().create(true)).unwrap();
    });
    println!(
        "sharded create: values kept {} B, peak {} B above the start ({} B above the values)",
        end - start,
        peak - start,
        peak - start - BIG_BYTES
    );
    assert!(end - start >= BIG_BYTES);
    assert!(
        peak - start <= BIG_BYTES + largest,
        "peak {} B",
        peak - start
    );
}
