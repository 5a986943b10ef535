//! The candle store's checkpoint load: its peak extra memory, measured with
//! a counting global allocator (this file's own).
//!
//! By default a load assigns each `Var` from a value read just before, so it
//! holds about one tensor beyond the header and its plan, and that memory
//! serves the next tensor. `rollback(true)` reads every tensor first (about
//! the file's size) so that a read error of the disk changes nothing. A
//! load that converts dtypes goes through staging buffers: the values it
//! makes, plus at most the staging budget. `CandlePlan::load_shards` at 2
//! ranks (threads) holds a few buckets: no host copy of any part, and no
//! copy of its part's old values (it verifies every part's checksums
//! before any is written instead). Print
//! the figures with `cargo test --release --features candle --test
//! candle_checkpoint_memory -- --nocapture`.

#[path = "support/peak_alloc.rs"]
mod peak_alloc;
#[path = "support/thread_world.rs"]
mod thread_world;

use candle_core::{DType, Device};
use candle_nn::Init;
use peak_alloc::measure;
use scopetree::candle::CandleStore;
use scopetree::checkpoint::LoadOptions;

const TENSORS: usize = 16;
const ELEMS: usize = 256 * 1024; // 1 MiB of f32 each
const TENSOR_BYTES: i64 = (ELEMS * 4) as i64;
/// Header, plan, report, key strings, read buffer: well under this.
const OVERHEAD: i64 = 256 * 1024;

fn store(value: f64) -> CandleStore {
    let store = CandleStore::new();
    for i in 0..TENSORS {
        let name = format!("layers.w{i:02}");
        store
            .get(
                ELEMS,
                &name,
                Init::Const(value + i as f64),
                DType::F32,
                &Device::Cpu,
            )
            .unwrap();
    }
    store
}

fn first(store: &CandleStore, name: &str) -> f32 {
    let var = store.var(name).unwrap().expect("built");
    var.as_tensor().get(0).unwrap().to_scalar::<f32>().unwrap()
}

fn saved() -> (tempfile::TempDir, std::path::PathBuf, i64) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.safetensors");
    store(1.0).save(&p).unwrap();
    let len = std::fs::metadata(&p).unwrap().len();
    (d, p, i64::try_from(len).unwrap())
}

#[test]
fn a_default_load_holds_about_one_tensor() {
    let (_d, p, file_len) = saved();
    let s = store(0.0);
    let held = s.var("layers.w03").unwrap().expect("built");
    let (start, peak, end) = measure(|| {
        s.load(&p, &LoadOptions::new()).unwrap();
    });
    let extra = peak - start;
    println!(
        "default: file {file_len} B, tensor {TENSOR_BYTES} B, peak extra {extra} B ({:.2} tensors), live change {} B",
        extra as f64 / TENSOR_BYTES as f64,
        end - start
    );
    assert!(extra <= TENSOR_BYTES + OVERHEAD, "peak extra {extra} B");
    // The model's Var itself holds the file's values.
    assert_eq!(
        held.as_tensor().get(0).unwrap().to_scalar::<f32>().unwrap(),
        4.0
    );
    assert_eq!(first(&s, "layers.w15"), 16.0);
}

#[test]
fn a_load_with_rollback_reads_the_whole_file_first() {
    let (_d, p, file_len) = saved();
    let s = store(0.0);
    let (start, peak, _) = measure(|| {
        s.load(&p, &LoadOptions::new().rollback(true)).unwrap();
    });
    let extra = peak - start;
    println!(
        "rollback(true): file {file_len} B, peak extra {extra} B ({:.3} x file)",
        extra as f64 / file_len as f64
    );
    assert!(
        extra >= TENSORS as i64 * TENSOR_BYTES,
        "peak extra {extra} B"
    );
    assert!(
        extra <= file_len + TENSOR_BYTES + OVERHEAD,
        "peak extra {extra} B"
    );
    assert_eq!(first(&s, "layers.w15"), 16.0);
}

#[test]
fn a_converting_load_holds_its_values_and_at_most_the_staging_budget() {
    use scopetree::checkpoint::FloatDtype;
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("bf16.safetensors");
    let src = CandleStore::new();
    for i in 0..TENSORS {
        src.get(
            ELEMS,
            &format!("layers.w{i:02}"),
            Init::Const(i as f64),
            DType::BF16,
            &Device::Cpu,
        )
        .unwrap();
    }
    src.save(&p).unwrap();
    drop(src);
    let budget = 256 * 1024;
    let values = (TENSORS * ELEMS * 4) as i64; // made as f32
    let fresh = CandleStore::new();
    let (start, peak, _) = measure(|| {
        let opts = LoadOptions::new()
            .create(true)
            .create_floats_as(FloatDtype::F32)
            .staging_budget(budget);
        fresh.load_on(&p, &opts, &Device::Cpu).unwrap();
    });
    let extra = peak - start - values;
    println!(
        "bf16 -> f32 through staging of {budget} B: peak extra beyond the values {extra} B, {} B kept",
        fresh.staging_bytes()
    );
    assert!(
        extra <= budget as i64 + OVERHEAD,
        "{extra} B beyond the values"
    );
    // The staging kept for the next load is within the budget, and freed.
    assert!(fresh.staging_bytes() > 0);
    assert!(fresh.staging_bytes() <= budget);
    fresh.free_staging();
    assert_eq!(fresh.staging_bytes(), 0);
    assert_eq!(first(&fresh, "layers.w15"), 15.0);
}

#[test]
fn load_shards_at_2_ranks_holds_a_few_buckets_only() {
    use scopetree::ranks::{CandlePlan, DEFAULT_BUCKET_BYTES, PlanOptions};
    // 32 tensors of 1 MiB: each rank reads 16 MiB and receives 16 MiB.
    let d = tempfile::tempdir().unwrap();
    let root = d.path().to_owned();
    let out = thread_world::run(2, |world| {
        let s = CandleStore::new();
        for i in 0..2 * TENSORS {
            let name = format!("layers.w{i:02}");
            s.get(
                ELEMS,
                &name,
                Init::Const(i as f64),
                DType::F32,
                &Device::Cpu,
            )
            .unwrap();
        }
        let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).unwrap();
        plan.save_shards(world, &s, &root, &Default::default())
            .unwrap();
        for (_, v) in s.named_vars().unwrap() {
            v.set(&v.zeros_like().unwrap()).unwrap();
        }
        let (start, peak, _) = measure(|| {
            plan.load_shards(world, &s, &root).unwrap();
        });
        (
            peak - start,
            first(&s, "layers.w00"),
            first(&s, "layers.w31"),
        )
    });
    let part = TENSORS as i64 * TENSOR_BYTES;
    let bucket = DEFAULT_BUCKET_BYTES as i64;
    for (rank, (extra, w0, w31)) in out.into_iter().enumerate() {
        println!(
            "load_shards, rank {rank} of 2: part {part} B, peak extra {extra} B ({:.2} parts)",
            extra as f64 / part as f64
        );
        assert_eq!((w0, w31), (0.0, 31.0), "rank {rank}: both parts arrived");
        // A few buckets (the exchange's buffer, the stand-in world's copies
        // of it, a segment's copies): a part is 8 buckets here, so a copy
        // of the part's old values, or a received part kept whole, fails
        // this (each once did).
        assert!(
            extra <= 4 * bucket + OVERHEAD,
            "rank {rank}: peak extra {extra} B"
        );
    }
}
