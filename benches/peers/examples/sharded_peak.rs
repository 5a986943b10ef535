//! The peak memory and the time of loading the `sharded` bench's 1 GiB
//! Llama checkpoint and building the model, one path per process, as a
//! training script does it once: the process's peak resident set (`VmHWM`
//! from `/proc/self/status`) before and after, so that both paths count
//! what they map as well as what they allocate, and the wall time of the
//! load and the build.
//!
//! ```sh
//! cargo run --release -p scopetree-peers --example sharded_peak -- make DIR
//! cargo run --release -p scopetree-peers --example sharded_peak -- scopetree DIR
//! cargo run --release -p scopetree-peers --example sharded_peak -- candle_mmap DIR
//! ```

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::Llama;
use scopetree::candle::CandleStore;
use scopetree::checkpoint::LoadOptions;

#[path = "../support/llama_1g.rs"]
mod llama_1g;

/// A field of `/proc/self/status`, in bytes (the file gives kB).
fn status(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn shards(dir: &Path) -> Vec<PathBuf> {
    let mut s: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the checkpoint directory")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    s.sort();
    s
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_default();
    let dir = PathBuf::from(
        args.next()
            .ok_or("usage: sharded_peak make|scopetree|candle_mmap DIR")?,
    );
    let cfg = llama_1g::config(true);
    if which == "make" {
        std::fs::create_dir_all(&dir)?;
        let s = llama_1g::checkpoint(&dir, &cfg);
        println!("{} shards in {}", s.len(), dir.display());
        return Ok(());
    }
    let files = shards(&dir);
    let bytes: u64 = files
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    let before = status("VmHWM:");
    let start = std::time::Instant::now();
    match which.as_str() {
        "scopetree" => {
            let store = CandleStore::new();
            store.load(&dir, &LoadOptions::new().create(true))?;
            store.seal();
            let model = Llama::load(store.var_builder(DType::F32, &Device::Cpu), &cfg)?;
            std::hint::black_box(&model);
        }
        "candle_mmap" => {
            // SAFETY: the shard files are not modified while they are mapped.
            let vb =
                unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &Device::Cpu)? };
            let model = Llama::load(vb, &cfg)?;
            std::hint::black_box(&model);
        }
        other => return Err(format!("unknown path {other}").into()),
    }
    let took = start.elapsed();
    let peak = status("VmHWM:");
    println!(
        "{which}: checkpoint {bytes} B; load and build {:.1} ms; peak RSS {peak} B ({:.3} x the checkpoint), {} B above the start",
        took.as_secs_f64() * 1e3,
        peak as f64 / bytes as f64,
        peak - before
    );
    Ok(())
}
