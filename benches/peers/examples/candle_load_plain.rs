//! A checkpoint load outside criterion: the `candle_store` bench's `d64`
//! model (262 tensors, a 3.2 MB file) saved once, then loaded `N` times in
//! this plain process through `CandleStore::load` (strict and atomic) or
//! `VarMap::load`, printing the mean time per load.
//!
//! criterion's `candle_load` group runs in a process whose heap is already
//! large; here the allocator starts from a small heap, as in a training
//! script that resumes from a checkpoint. Run one process per store:
//!
//! ```sh
//! cargo run --release -p scopetree-peers --example candle_load_plain -- scopetree 300
//! cargo run --release -p scopetree-peers --example candle_load_plain -- varmap 300
//! cargo run --release -p scopetree-peers --example candle_load_plain -- scopetree 1
//! ```

use std::time::Instant;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use scopetree::candle::CandleStore;
use scopetree::checkpoint::LoadOptions;

#[path = "../support/gpt.rs"]
#[allow(dead_code)] // the forward pass is the benches', not this example's
mod gpt;

/// The parameters of the bench's GPT-style model with `d_model` 64.
fn build(vb: &VarBuilder) -> candle_core::Result<()> {
    gpt::build(vb, gpt::D64).map(drop)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "scopetree".into());
    let n: usize = args.next().map_or(Ok(300), |s| s.parse())?;
    let dir = std::env::temp_dir().join(format!("candle-load-plain-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("model.safetensors");

    let store = CandleStore::new();
    build(&store.var_builder(DType::F32, &Device::Cpu))?;
    store.save(&file)?;
    let mut map = VarMap::new();
    build(&VarBuilder::from_varmap(&map, DType::F32, &Device::Cpu))?;

    let strict = LoadOptions::new();
    let start = Instant::now();
    for _ in 0..n {
        match which.as_str() {
            "varmap" => map.load(&file)?,
            _ => drop(store.load(&file, &strict)?),
        }
    }
    let per = start.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("{which}: {n} loads, {per:.1} us per load");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
