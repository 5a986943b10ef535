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

/// The child: loads `variant` from `dir`, prints `ms peak_bytes`.
/// The child: loads `variant` from `dir` into a lazily built model (or,
/// with `built`, one whose parameters hold other values already), prints
/// `ms peak_bytes`.
fn child(
    variant: &str,
    dir: &Path,
    mib: usize,
    built_first: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::default();
    let mut model = if built_first {
        let m = built(mib, &device);
        // Other values than the checkpoint's, so that the check means something.
        Big {
            layers: m
                .layers
                .into_iter()
                .map(|p| p.map(|t| t.mul_scalar(-1.0)))
                .collect(),
        }
    } else {
        lazy(mib, &device)
    };
    let before = status_bytes("VmRSS:");
    let path = path_of(dir, variant);
    let start = Instant::now();
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
    let secs = start.elapsed().as_secs_f64();
    let peak = status_bytes("VmHWM:");
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
    println!("{:.3} {}", secs * 1e3, peak.saturating_sub(before));
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut mib, mut runs, mut shard_mib, mut dir, mut child_of) = (1024, 5, 256, None, None);
    let mut built_first = false;
    while let Some(a) = args.next() {
        let mut next = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--mib" => mib = next()?.parse()?,
            "--runs" => runs = next()?.parse()?,
            "--shard-mib" => shard_mib = next()?.parse()?,
            "--dir" => dir = Some(PathBuf::from(next()?)),
            "--child" => child_of = Some(next()?),
            "--built" => built_first = true,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    let own = dir.is_none();
    let dir = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("burn-load-bench-{}", std::process::id()))
    });
    if let Some(variant) = child_of {
        return child(&variant, &dir, mib, built_first);
    }

    std::fs::create_dir_all(&dir)?;
    let model_bytes = (rows(mib) * COLS * 4 * TENSORS) as u64;
    {
        let device = Device::default();
        let model = built(mib, &device);
        model.save_into(
            &mut CheckpointStore::sharded(path_of(&dir, "scopetree-sharded"))
                .max_shard_size((shard_mib as u64) << 20),
        )?;
        model.save_into(&mut CheckpointStore::from_file(path_of(
            &dir,
            "scopetree-file",
        )))?;
        model.save_into(
            &mut SafetensorsStore::from_file(path_of(&dir, "safetensors-store")).overwrite(true),
        )?;
        model.save_into(
            &mut BurnpackStore::from_file(path_of(&dir, "burnpack-store")).overwrite(true),
        )?;
    }
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
        let mut times = vec![Vec::new(); VARIANTS.len()];
        let mut peaks = vec![Vec::new(); VARIANTS.len()];
        // One warm-up round (page cache), then `runs` timed rounds, in turns.
        for round in 0..=runs {
            for (v, variant) in VARIANTS.iter().enumerate() {
                let mut cmd = Command::new(&exe);
                if built_first {
                    cmd.arg("--built");
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
                let mut it = text.split_whitespace();
                let ms: f64 = it.next().ok_or("no time")?.parse()?;
                let peak: f64 = it.next().ok_or("no peak")?.parse()?;
                if round > 0 {
                    times[v].push(ms);
                    peaks[v].push(peak);
                }
            }
        }
        let base_t = median(&mut times[0].clone());
        println!(
            "| load of {model_bytes} bytes | median time | vs scopetree sharded | median peak RSS above the start | peak / model bytes | peak - model bytes |"
        );
        println!("|---|---|---|---|---|---|");
        for (v, variant) in VARIANTS.iter().enumerate() {
            let t = median(&mut times[v]);
            let p = median(&mut peaks[v]);
            println!(
                "| {variant} | {t:.1} ms | {:.2}x | {:.0} MiB | {:.3} | {:+.1} MiB |",
                t / base_t,
                p / (1 << 20) as f64,
                p / model_bytes as f64,
                (p - model_bytes as f64) / (1 << 20) as f64
            );
        }
        println!(
            "goal: scopetree-sharded peak above the start <= {}one shard ({:.0} MiB): {}",
            if built_first { "" } else { "model + " },
            budget as f64 / (1 << 20) as f64,
            if median(&mut peaks[0]) <= budget as f64 {
                "met"
            } else {
                "MISSED"
            }
        );
    }
    if own {
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}
