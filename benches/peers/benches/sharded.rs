//! A sharded Hugging Face checkpoint of about 1 GiB (candle-transformers'
//! Llama, 16 layers of width 1024, 4 shards of at most 300 MB), loaded and
//! the model built, in one run (issue 22's goal: scopetree not slower):
//!
//! - `sharded_load_build_interleaved/scopetree`: `CandleStore::load` of the
//!   checkpoint's directory (strict across the shards, `create(true)`:
//!   every `Var` made from the files), `seal()`, then `Llama::load` on
//!   `store.var_builder(..)`: every `get` reuses a loaded variable, checked.
//! - `sharded_load_build_interleaved/candle_mmap`:
//!   `VarBuilder::from_mmaped_safetensors` over the shard files, then the
//!   same `Llama::load` (each `get` copies its tensor out of the map).
//!
//! Each iteration runs both, in alternating order, and times only its own;
//! the model and its store are dropped untimed. The peak memory of each
//! path is measured in a process of its own by the example
//! `sharded_peak`.
//!
//! The checkpoint is written once, untimed, into a temporary directory.
//! Under `cargo test --benches` (criterion's test mode) a tiny Llama
//! stands in. Run: `cargo bench -p scopetree-peers --bench sharded` (builds
//! candle; not part of CI).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::{Config, Llama};
use criterion::{Criterion, criterion_group, criterion_main};
use scopetree::candle::CandleStore;
use scopetree::checkpoint::LoadOptions;

#[path = "../support/llama_1g.rs"]
mod llama_1g;
#[path = "../../support/timing.rs"]
mod timing;
use timing::interleaved_timed;

/// Load and build through a `CandleStore`; the time of both.
fn scopetree(dir: &PathBuf, cfg: &Config) -> Duration {
    let start = Instant::now();
    let store = CandleStore::new();
    store
        .load(dir, &LoadOptions::new().create(true))
        .expect("the checkpoint loads");
    store.seal();
    let model = Llama::load(store.var_builder(DType::F32, &Device::Cpu), cfg).expect("builds");
    let took = start.elapsed();
    drop((model, store));
    took
}

/// Map the shards and build with candle's own loader; the time of both.
fn candle_mmap(shards: &[PathBuf], cfg: &Config) -> Duration {
    let start = Instant::now();
    // SAFETY: the shard files are not modified while they are mapped.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(shards, DType::F32, &Device::Cpu) }
        .expect("the shards map");
    let model = Llama::load(vb, cfg).expect("builds");
    let took = start.elapsed();
    drop(model);
    took
}

fn bench(c: &mut Criterion) {
    let big = std::env::args().any(|a| a == "--bench");
    let cfg = llama_1g::config(big);
    let dir = std::env::temp_dir().join(format!("scopetree-sharded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shards = llama_1g::checkpoint(&dir, &cfg);
    let bytes: u64 = shards
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    println!(
        "sharded checkpoint: {} shards, {bytes} bytes in all",
        shards.len()
    );

    let mut g = c.benchmark_group("sharded_load_build_interleaved");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(30));
    g.bench_function("scopetree", |b| {
        b.iter_custom(|n| {
            interleaved_timed(n, || scopetree(&dir, &cfg), || candle_mmap(&shards, &cfg))
        })
    });
    g.bench_function("candle_mmap", |b| {
        b.iter_custom(|n| {
            interleaved_timed(n, || candle_mmap(&shards, &cfg), || scopetree(&dir, &cfg))
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
