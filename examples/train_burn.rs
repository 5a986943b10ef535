//! Training a small burn model with checkpoints in scopetree's store: the
//! example a burn user copies.
//!
//! An MLP learns y = sin(3 x0) cos(2 x1) + x0 x1 from points this example
//! makes, on burn's ndarray backend (CPU) with autodiff and burn-optim's
//! Adam. Every `--save-every` steps it saves a checkpoint directory
//! `step-NNNNNN/`: the model as a sharded Hugging Face checkpoint through
//! `scopetree::burn::CheckpointStore` (`model-0000k-of-0000n.safetensors`
//! and `model.safetensors.index.json`), and Adam's state with burn-optim's
//! own `ModuleOptimizer::save` (`optimizer.bpk`). Then it points the file
//! `latest` at it (written to a temporary file and renamed), so a crash
//! mid-save leaves `latest` naming the previous, complete checkpoint.
//!
//! `--resume` starts from `latest`: a freshly built model loads the shards
//! (strictly: every name, shape and dtype checked first), which also gives
//! the parameters back their `ParamId`s, and Adam's state, keyed by those
//! ids, applies again. The run then ends bit-identical to one that never
//! stopped (the printed digest is the same). At the end it loads the last
//! checkpoint back through burn-store's own `SafetensorsStore`, shard by
//! shard, to show that the files are ordinary safetensors.
//!
//! ```text
//! cargo run --release --features burn-ndarray --example train_burn -- --steps 300 --save-every 100
//! cargo run --release --features burn-ndarray --example train_burn -- --steps 300 --stop-after 150   # "crashes" after step 150
//! cargo run --release --features burn-ndarray --example train_burn -- --steps 300 --resume           # same digest as the first run
//! ```
//!
//! Options: `--dir PATH` (default: `scopetree-train-burn` in the system's
//! temporary directory; it is emptied unless `--resume`), `--steps N`
//! (300), `--save-every N` (100), `--stop-after N` (stop after step N
//! without a final save, as a crash would), `--shard-size BYTES` (2048:
//! small, so that this small model has several shards), `--resume`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn_core as burn;
use burn_core::module::Module;
use burn_core::tensor::{Device, Tensor, TensorData, activation::relu};
use burn_nn::{Linear, LinearConfig};
use burn_optim::{AdamConfig, GradientsParams, ModuleOptimizer};
use burn_store::{ModuleSnapshot, SafetensorsStore};
use scopetree::burn::CheckpointStore;

#[derive(Module, Debug)]
struct Mlp {
    l1: Linear,
    l2: Linear,
    l3: Linear,
}

impl Mlp {
    fn new(device: &Device) -> Self {
        Self {
            l1: LinearConfig::new(2, 64).init(device),
            l2: LinearConfig::new(64, 64).init(device),
            l3: LinearConfig::new(64, 1).init(device),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let h = relu(self.l1.forward(x));
        let h = relu(self.l2.forward(h));
        self.l3.forward(h)
    }
}

const BATCH: usize = 64;
const LR: f64 = 3e-3;

/// Points in [-1, 1]^2 and their targets: batch `k` of the training set
/// (`k` < 2^32) or of the held-out set (`k` >= 2^32), the same every run.
fn batch(k: u64, device: &Device) -> (Tensor<2>, Tensor<2>) {
    let mut state = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
    };
    let xs: Vec<f32> = (0..2 * BATCH).map(|_| uniform()).collect();
    let ys: Vec<f32> = xs
        .chunks(2)
        .map(|p| (3.0 * p[0]).sin() * (2.0 * p[1]).cos() + p[0] * p[1])
        .collect();
    (
        Tensor::from_data(TensorData::new(xs, [BATCH, 2]), device),
        Tensor::from_data(TensorData::new(ys, [BATCH, 1]), device),
    )
}

fn mse(model: &Mlp, x: Tensor<2>, y: Tensor<2>) -> Tensor<1> {
    (model.forward(x) - y).powi_scalar(2).mean()
}

fn held_out_loss(model: &Mlp, device: &Device) -> f32 {
    let total: f32 = (0..8)
        .map(|i| {
            let (x, y) = batch((1 << 32) + i, device);
            mse(model, x, y).into_scalar::<f32>()
        })
        .sum();
    total / 8.0
}

struct Args {
    dir: PathBuf,
    steps: usize,
    save_every: usize,
    stop_after: Option<usize>,
    shard_size: u64,
    resume: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        dir: std::env::temp_dir().join("scopetree-train-burn"),
        steps: 300,
        save_every: 100,
        stop_after: None,
        shard_size: 2048,
        resume: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--dir" => a.dir = PathBuf::from(value()?),
            "--steps" => a.steps = number(value()?)? as usize,
            "--save-every" => a.save_every = number(value()?)?.max(1) as usize,
            "--stop-after" => a.stop_after = Some(number(value()?)? as usize),
            "--shard-size" => a.shard_size = number(value()?)?,
            "--resume" => a.resume = true,
            "--help" | "-h" => return Err("see the top of examples/train_burn.rs".into()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(a)
}

/// Saves step `step`'s model and optimizer as `dir/step-NNNNNN/`, then
/// points `dir/latest` at it atomically and keeps the two newest.
fn save(
    dir: &Path,
    step: usize,
    model: &Mlp,
    optim: &ModuleOptimizer,
    shard_size: u64,
) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let name = format!("step-{step:06}");
    let at = dir.join(&name);
    let mut store = CheckpointStore::sharded(&at)
        .max_shard_size(shard_size)
        .metadata("step", step.to_string());
    model.save_into(&mut store)?;
    optim.save(at.join("optimizer.bpk"))?;
    let tmp = dir.join(".latest.tmp");
    std::fs::write(&tmp, &name)?;
    std::fs::rename(&tmp, dir.join("latest"))?;
    let mut old: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.starts_with("step-") && *n != name)
        .collect();
    old.sort();
    for n in old.iter().rev().skip(1) {
        std::fs::remove_dir_all(dir.join(n))?;
    }
    Ok(at)
}

/// The xxh3-128 of every parameter's bytes, in module order.
fn digest(model: &Mlp) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for t in model.collect(None, None, false) {
        let data = burn_store::bridge::to_data(&t).expect("a parameter reads back");
        h.update(t.name.as_bytes());
        h.update(data.as_bytes());
    }
    format!("{:032x}", h.digest128())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args().map_err(|e| format!("train_burn: {e}"))?;
    let device = Device::default().autodiff();
    device.seed(42);
    let mut model = Mlp::new(&device);
    let mut optim = AdamConfig::new().init();
    let mut first = 0;

    if args.resume {
        let name = std::fs::read_to_string(args.dir.join("latest"))
            .map_err(|e| format!("no checkpoint to resume in {}: {e}", args.dir.display()))?;
        let at = args.dir.join(name.trim());
        let result = model.load_from(&mut CheckpointStore::sharded(&at))?;
        optim = optim.load(at.join("optimizer.bpk"))?;
        first = name.trim().trim_start_matches("step-").parse::<usize>()?;
        println!(
            "resumed from {} ({} tensors, ParamIds restored, Adam state loaded)",
            at.display(),
            result.applied.len()
        );
    } else {
        if args.dir.exists() {
            std::fs::remove_dir_all(&args.dir)?;
        }
        std::fs::create_dir_all(&args.dir)?;
    }

    let start = Instant::now();
    let mut last_saved = None;
    for step in first + 1..=args.steps {
        let (x, y) = batch(step as u64, &device);
        let loss = mse(&model, x, y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(LR, model, grads);
        if step % 50 == 0 {
            println!(
                "step {step:4}: held-out loss {:.5}",
                held_out_loss(&model, &device)
            );
        }
        if args.stop_after == Some(step) {
            println!("stopped after step {step}, as a crash would (no final save)");
            return Ok(());
        }
        if step % args.save_every == 0 || step == args.steps {
            let at = save(&args.dir, step, &model, &optim, args.shard_size)?;
            let shards = std::fs::read_dir(&at)?
                .filter(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                })
                .count();
            println!("saved {} ({shards} shards)", at.display());
            last_saved = Some(at);
        }
    }
    println!(
        "trained steps {}..={} in {:.2} s; final held-out loss {:.5}",
        first + 1,
        args.steps,
        start.elapsed().as_secs_f64(),
        held_out_loss(&model, &device)
    );
    println!("digest {}", digest(&model));

    // The files are ordinary safetensors: burn-store's own store reads
    // each shard into a fresh model, which then equals the trained one.
    if let Some(at) = last_saved {
        let mut fresh = Mlp::new(&device);
        let mut shards: Vec<_> = std::fs::read_dir(&at)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        shards.sort();
        let mut applied = 0;
        for shard in &shards {
            let r = fresh.load_from(&mut SafetensorsStore::from_file(shard).allow_partial(true))?;
            applied += r.applied.len();
        }
        let same = digest(&fresh) == digest(&model);
        println!(
            "burn-store's SafetensorsStore read {applied} tensors from {} shards: {}",
            shards.len(),
            if same {
                "equal to the trained model"
            } else {
                "DIFFERENT"
            }
        );
        if !same {
            return Err("SafetensorsStore read other values".into());
        }
    }
    Ok(())
}
