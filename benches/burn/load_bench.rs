//! Loading a 1 GiB burn model (ndarray backend, f32) through scopetree's
//! `CheckpointStore` and through burn-store's own `SafetensorsStore` and
//! `BurnpackStore`, compared by load time and peak RSS in one run.
//!
//! ```text
//! cargo run --release --features burn-ndarray --example burn_load_bench -- [--mib 1024] [--runs 5] [--shard-mib 256] [--dir DIR]
//! ```
//!
//! The parent builds the model (16 tensors of `mib / 16` MiB, values it
//! can check), saves it through each store (scopetree: sharded in shards
//! of `--shard-mib` and as one file; burn-store: one safetensors file and
//! one burnpack file), then, `--runs` times and in turns, starts a fresh
//! child process per variant. The child builds the model lazily, as
//! `Config::init` does (no parameter memory until a load fills it), or,
//! for the second table, with other values in every parameter; notes its
//! RSS, loads, checks a value of every tensor, and reports the load's
//! time and its peak RSS (`VmHWM` of /proc/self/status: the process's
//! high-water mark, file-backed pages of a memory map included) above the
//! RSS it had before the load. The files are read before the runs, so
//! every load reads from the page cache. Medians are printed, with each
//! variant's ratio to scopetree's sharded load.
//!
//! Each load runs in two children. Code cold: the measured load is the
//! first the process makes, so the pages of the loader's code (file-backed,
//! shared, evictable) come into its RSS during the load and count in the
//! peak.
//! Code warm: the child first loads a 1 MiB model saved the same way
//! (tensors of 64 KiB, under the allocator's memory-map threshold), then
//! measures; the peak is then the memory the load itself holds. The child
//! also reports how much of its RSS is file-backed before and after the
//! load (`RssFile`).
//!
//! The goal (issue 35): at least as fast as `SafetensorsStore`, and a peak
//! of at most the model's bytes plus one shard.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use burn_core as burn;
use burn_core::module::{Module, Param, ParamId};
use burn_core::tensor::{Device, Tensor, TensorData};
use burn_store::{BurnpackStore, ModuleSnapshot, SafetensorsStore};
use scopetree::burn::CheckpointStore;

const TENSORS: usize = 16;
/// The size of the model a child loads first when the code is to be warm.
const WARM_MIB: usize = 1;
const COLS: usize = 1024;

#[derive(Module, Debug)]
struct Big {
    layers: Vec<Param<Tensor<2>>>,
}

/// Element `i` of tensor `k`.
fn value(k: usize, i: usize) -> f32 {
    k as f32 * 1000.0 + (i % 4096) as f32 * 0.25
}

fn rows(mib: usize) -> usize {
    mib * (1 << 20) / TENSORS / 4 / COLS
}

fn built(mib: usize, device: &Device) -> Big {
    let r = rows(mib);
    Big {
        layers: (0..TENSORS)
            .map(|k| {
                let v: Vec<f32> = (0..r * COLS).map(|i| value(k, i)).collect();
                Param::from_tensor(Tensor::from_data(TensorData::new(v, [r, COLS]), device))
            })
            .collect(),
    }
}

fn lazy(mib: usize, device: &Device) -> Big {
    let r = rows(mib);
    Big {
        layers: (0..TENSORS)
            .map(|_| {
                Param::uninitialized(
                    ParamId::new(),
                    move |d, _| Tensor::zeros([r, COLS], d),
                    device.clone(),
                    false,
                    [r, COLS].into(),
                )
            })
            .collect(),
    }
}

/// A `kB` line of /proc/self/status, in bytes.
fn status_bytes(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

const VARIANTS: [&str; 4] = [
    "scopetree-sharded",
    "scopetree-file",
    "safetensors-store",
    "burnpack-store",
];

fn path_of(dir: &Path, variant: &str) -> PathBuf {
    match variant {
        "scopetree-sharded" => dir.join("sharded"),
        "scopetree-file" => dir.join("scopetree.safetensors"),
        "safetensors-store" => dir.join("burn.safetensors"),
        _ => dir.join("burn.bpk"),
    }
}

/// The model of `mib` MiB a child loads into: lazily built, or (`built`)
/// with other values than the checkpoint's in every parameter already, so
/// that the check after the load means something.
fn model_for(mib: usize, built_first: bool, device: &Device) -> Big {
    if built_first {
        let m = built(mib, device);
        Big {
            layers: m
                .layers
                .into_iter()
                .map(|p| p.map(|t| t.mul_scalar(-1.0)))
                .collect(),
        }
    } else {
        lazy(mib, device)
    }
}

/// Loads `variant` of the checkpoints in `dir` into `model`.
fn load(model: &mut Big, variant: &str, dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let path = path_of(dir, variant);
    match variant {
        "scopetree-sharded" => {
            model.load_from(&mut CheckpointStore::sharded(&path))?;
        }
        "scopetree-file" => {
            model.load_from(&mut CheckpointStore::from_file(&path))?;
        }
        "safetensors-store" => {
            model.load_from(&mut SafetensorsStore::from_file(&path))?;
        }
        _ => {
            model.load_from(&mut BurnpackStore::from_file(&path))?;
        }
    }
    Ok(())
}

/// The child: loads `variant` from `dir` into a model of `mib` MiB
/// ([`model_for`]), after a load of the 1 MiB model in `dir/warm` when
/// `warm`; prints `ms peak_bytes file_before file_after` (bytes above the
/// RSS before the load; `RssFile` before and after it).
fn child(
    variant: &str,
    dir: &Path,
    mib: usize,
    built_first: bool,
    warm: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::default();
    if warm {
        let mut small = model_for(WARM_MIB, built_first, &device);
        load(&mut small, variant, &dir.join("warm"))?;
    }
    let mut model = model_for(mib, built_first, &device);
    let before = status_bytes("VmRSS:");
    let file_before = status_bytes("RssFile:");
    let start = Instant::now();
    load(&mut model, variant, dir)?;
    let secs = start.elapsed().as_secs_f64();
    let peak = status_bytes("VmHWM:");
    let file_after = status_bytes("RssFile:");
    // Check one value of every tensor (not timed).
    for (k, p) in model.layers.iter().enumerate() {
        let v = p
            .val()
            .slice([1..2, 3..4])
            .into_data()
            .try_into_vec::<f32>()?;
        if v[0] != value(k, COLS + 3) {
            return Err(format!("{variant}: tensor {k} holds {} at [1, 3]", v[0]).into());
        }
    }
    println!(
        "{:.3} {} {file_before} {file_after}",
        secs * 1e3,
        peak.saturating_sub(before)
    );
    Ok(())
}

/// Saves a model of `mib` MiB into `dir` through each store: scopetree
/// sharded (shards of at most `shard_bytes`) and as one file, burn-store's
/// safetensors and burnpack.
fn save_all(dir: &Path, mib: usize, shard_bytes: u64) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let model = built(mib, &Device::default());
    model.save_into(
        &mut CheckpointStore::sharded(path_of(dir, "scopetree-sharded"))
            .max_shard_size(shard_bytes),
    )?;
    model.save_into(&mut CheckpointStore::from_file(path_of(
        dir,
        "scopetree-file",
    )))?;
    model.save_into(
        &mut SafetensorsStore::from_file(path_of(dir, "safetensors-store")).overwrite(true),
    )?;
    model
        .save_into(&mut BurnpackStore::from_file(path_of(dir, "burnpack-store")).overwrite(true))?;
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut mib, mut runs, mut shard_mib, mut dir, mut child_of) = (1024, 5, 256, None, None);
    let (mut built_first, mut warm) = (false, false);
    while let Some(a) = args.next() {
        let mut next = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--mib" => mib = next()?.parse()?,
            "--runs" => runs = next()?.parse()?,
            "--shard-mib" => shard_mib = next()?.parse()?,
            "--dir" => dir = Some(PathBuf::from(next()?)),
            "--child" => child_of = Some(next()?),
            "--built" => built_first = true,
            "--warm" => warm = true,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    let own = dir.is_none();
    let dir = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("burn-load-bench-{}", std::process::id()))
    });
    if let Some(variant) = child_of {
        return child(&variant, &dir, mib, built_first, warm);
    }

    std::fs::create_dir_all(&dir)?;
    let model_bytes = (rows(mib) * COLS * 4 * TENSORS) as u64;
    save_all(&dir, mib, (shard_mib as u64) << 20)?;
    // The model a child loads first to bring the loader's code in: four
    // shards too.
    save_all(&dir.join("warm"), WARM_MIB, (WARM_MIB as u64) << 18)?;
    let shards = std::fs::read_dir(path_of(&dir, "scopetree-sharded"))?
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        })
        .count();
    let shard_bytes = model_bytes.div_ceil(shards as u64);
    println!(
        "model: {TENSORS} f32 tensors, {model_bytes} bytes; scopetree's sharded checkpoint: {shards} shards of about {shard_bytes} bytes"
    );
    let exe = std::env::current_exe()?;
    for built_first in [false, true] {
        println!(
            "\ninto a model {}:",
            if built_first {
                "built with other values (its parameters resident before the load)"
            } else {
                "built lazily (no parameter memory before the load)"
            }
        );
        // Lazily built, the load makes the model's memory; built, it was there.
        let budget = if built_first {
            shard_bytes
        } else {
            model_bytes + shard_bytes
        };
        // Per variant, code cold and code warm: times, peaks, RssFile growth.
        let mut times = vec![[Vec::new(), Vec::new()]; VARIANTS.len()];
        let mut peaks = vec![[Vec::new(), Vec::new()]; VARIANTS.len()];
        let mut files = vec![Vec::new(); VARIANTS.len()];
        // One warm-up round (page cache), then `runs` timed rounds, in turns.
        for round in 0..=runs {
            for (v, variant) in VARIANTS.iter().enumerate() {
                for (w, warm) in [false, true].into_iter().enumerate() {
                    let mut cmd = Command::new(&exe);
                    if built_first {
                        cmd.arg("--built");
                    }
                    if warm {
                        cmd.arg("--warm");
                    }
                    let out = cmd
                        .args(["--child", variant, "--mib", &mib.to_string(), "--dir"])
                        .arg(&dir)
                        .output()?;
                    if !out.status.success() {
                        return Err(
                            format!("{variant}: {}", String::from_utf8_lossy(&out.stderr)).into(),
                        );
                    }
                    let text = String::from_utf8(out.stdout)?;
                    let mut it = text.split_whitespace().map(str::parse::<f64>);
                    let mut next = || it.next().ok_or("a short report").map(|r| r.ok());
                    let (ms, peak) = (next()?.ok_or("no time")?, next()?.ok_or("no peak")?);
                    let (fb, fa) = (next()?.ok_or("no RssFile")?, next()?.ok_or("no RssFile")?);
                    if round > 0 {
                        times[v][w].push(ms);
                        peaks[v][w].push(peak);
                        if !warm {
                            files[v].push(fa - fb);
                        }
                    }
                }
            }
        }
        let mib_of = |b: f64| b / (1 << 20) as f64;
        let base_t = median(&mut times[0][0].clone());
        println!(
            "| load of {model_bytes} bytes | median time, code cold / warm | vs scopetree sharded (cold) | median peak RSS above the start, code cold | RssFile grew by (code cold) | peak, code warm | warm peak - {} |",
            if built_first {
                "one shard"
            } else {
                "(model + one shard)"
            }
        );
        println!("|---|---|---|---|---|---|---|");
        for v in 0..VARIANTS.len() {
            let (tc, tw) = (median(&mut times[v][0]), median(&mut times[v][1]));
            let (pc, pw) = (median(&mut peaks[v][0]), median(&mut peaks[v][1]));
            println!(
                "| {} | {tc:.1} / {tw:.1} ms | {:.2}x | {:.1} MiB | {:.2} MiB | {:.1} MiB | {:+.0} KiB |",
                VARIANTS[v],
                tc / base_t,
                mib_of(pc),
                mib_of(median(&mut files[v])),
                mib_of(pw),
                (pw - budget as f64) / 1024.0
            );
        }
        let verdict = |p: f64| if p <= budget as f64 { "met" } else { "MISSED" };
        println!(
            "goal: scopetree-sharded peak above the start <= {}one shard ({:.0} MiB): code cold {}, code warm {}",
            if built_first { "" } else { "model + " },
            mib_of(budget as f64),
            verdict(median(&mut peaks[0][0])),
            verdict(median(&mut peaks[0][1]))
        );
    }
    if own {
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}
