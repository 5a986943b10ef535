//! The `d8` transformer of the `candle_store` bench built through one store,
//! for instruction counts under callgrind and plain-process timings.
//!
//! `probe_candle_build {varmap|scopetree} N`: N builds, each on a fresh
//! store (creation and drop included in the printed time).
//! `probe_candle_build {re-varmap|re-scopetree} N`: one build, then N
//! rebuilds through the full store (every `get` a reuse).
//!
//! Instructions of the builds alone (as the criterion bench times them):
//!
//! ```text
//! cargo build --release -p scopetree-peers --example probe_candle_build
//! valgrind --tool=callgrind --toggle-collect='probe_candle_build::build_once' \
//!     target/release/examples/probe_candle_build scopetree 50
//! ```

use std::time::Instant;

use candle_core::{DType, Device, Result};
use candle_nn::{VarBuilder, VarMap};
use scopetree::candle::CandleStore;

#[path = "../support/gpt.rs"]
#[allow(dead_code)] // the forward pass is the benches', not the probe's
mod gpt;

/// One build of the `d8` model (its own symbol, for `--toggle-collect`).
#[inline(never)]
fn build_once(vb: &VarBuilder) -> Result<()> {
    gpt::build(vb, gpt::D8).map(drop)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "scopetree".to_owned());
    let n: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100);
    let (dtype, dev) = (DType::F32, Device::Cpu);
    let t = Instant::now();
    match which.as_str() {
        "varmap" => {
            for _ in 0..n {
                let map = VarMap::new();
                build_once(&VarBuilder::from_varmap(&map, dtype, &dev))?;
            }
        }
        "scopetree" => {
            for _ in 0..n {
                let store = CandleStore::new();
                build_once(&store.var_builder(dtype, &dev))?;
            }
        }
        "re-varmap" | "re-scopetree" => {
            let map = VarMap::new();
            let store = CandleStore::new();
            let vb = if which == "re-varmap" {
                VarBuilder::from_varmap(&map, dtype, &dev)
            } else {
                store.var_builder(dtype, &dev)
            };
            build_once(&vb)?;
            let t = Instant::now();
            for _ in 0..n {
                build_once(&vb)?;
            }
            println!("{which}: {:?} per rebuild", t.elapsed() / n.max(1));
            return Ok(());
        }
        other => {
            eprintln!(
                "usage: probe_candle_build varmap|scopetree|re-varmap|re-scopetree N ({other:?})"
            );
            std::process::exit(2);
        }
    }
    println!("{which}: {:?} per build", t.elapsed() / n.max(1));
    Ok(())
}
