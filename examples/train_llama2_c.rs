//! candle-transformers' `llama2_c` (the model of candle's own llama2-c
//! training example) trained byte-level on a real text with its parameters
//! in a scopetree store, published as a sharded Hugging Face checkpoint,
//! read back by candle's own loader, fine-tuned with the lower layers
//! frozen, and shipped as a small adapter.
//!
//! ```text
//! cargo run --release --features candle-models --example train_llama2_c
//! cargo run --release --features candle-models --example train_llama2_c -- --steps 100 --finetune-steps 20
//! ```
//!
//! 1. **Train** on Cicero's *De finibus* I (`lipsum::LIBER_PRIMUS`, 49,068
//!    bytes; nothing is downloaded), 90 % for training and the last 10 %
//!    held out, and print the held-out loss against the unigram entropy of
//!    the bytes (the loss of a model that ignores context).
//! 2. **Publish**: `CandleStore::save_sharded` writes
//!    `model-0000k-of-0000n.safetensors` and `model.safetensors.index.json`,
//!    plus a `config.json`.
//! 3. **Read back with candle alone**: `VarBuilder::from_mmaped_safetensors`
//!    over the shards builds the same model; its logits must equal the
//!    trained model's bit for bit, and it generates a few lines.
//! 4. **Fine-tune** the top block and the head (and the final norm) on
//!    another text (`lipsum::LOREM_IPSUM`): `store.freeze("model")`, then
//!    `unfreeze` the top block and the norm, rebuild the model (a frozen
//!    tensor is handed out detached) and give `AdamW` the
//!    `trainable_vars`. The frozen tensors must end bit-identical.
//! 5. **Ship an adapter**: `save_sharded` with a filter keeps the tuned
//!    tensors only. Base plus adapter, loaded into a fresh store (the base
//!    strictly, the adapter strictly on its own names), must give the
//!    fine-tuned model's logits bit for bit.
//!
//! A fact of candle-nn 0.11 the run shows (candle issue #2168, open):
//! `RmsNorm` takes the fused `ops::rms_norm` on a contiguous input, which is
//! applied without a backward pass, so no gradient crosses a norm. In
//! `llama2_c` only `lm_head`, after the last norm, ever gets a gradient; the
//! rest of the network stays at its random initialisation, a random-feature
//! model under a trained head, whatever store holds the parameters (a
//! `VarMap` too). The run prints which tensors changed. A trained head over
//! features that carry the current byte can learn at best about the bigram
//! statistics: the text's bigram entropy is 2.365 nats/byte against a
//! unigram entropy of 2.935 (80.6 %). The held-out loss reached 2.578 and
//! 2.598 (88–89 % of the unigram entropy) in two runs of 300 steps, and
//! 2.598–2.629 (89–90 %) in three runs of the 100 steps CI runs (candle's
//! initialisation cannot be seeded, so runs differ); the issue's "well below the unigram entropy" needs gradients
//! through the norms, which candle 0.11 does not give.
//!
//! The run fails (exit status 1) if the held-out loss does not fall below
//! the unigram entropy and below half its initial value, or if any
//! bit-for-bit check fails.
//!
//! **Across ranks.** Built with the `mpi` feature and started by `mpirun`
//! with more than one rank (or in one process with `--accumulate N`,
//! `--nccl` or `--zero`), the example trains data-parallel through `ranks::CandlePlan`
//! instead of parts 1–6, which are a single process's story:
//!
//! ```text
//! cargo build --release --features candle-models,mpi --example train_llama2_c
//! mpirun -np 2 target/release/examples/train_llama2_c --steps 40
//! target/release/examples/train_llama2_c --steps 40 --accumulate 2
//! mpirun -np 2 target/release/examples/train_llama2_c --steps 40 --zero
//! ```
//!
//! The initial values are drawn from `--seed` (with the spread of candle-nn's
//! defaults) and broadcast from rank 0. Step s draws its global batch of
//! `--batch` windows from `(seed, s)`; rank r trains on the r-th slice, in
//! `--accumulate` micro-batches whose gradients it adds in order and
//! divides; the plan averages the gradients over the ranks (`Reduce::Mean`)
//! and every rank takes the same step of scopetree's AdamW. So 2 ranks end
//! bit-identical to one process with `--accumulate 2` (the same
//! `parameters: digest`), which CI checks on the CPU. With `--device cuda`
//! the MPI all-reduce reads the device gradients a bucket segment at a time;
//! with `--nccl` (feature `nccl`, one GPU per rank) they are reduced over
//! NCCL on the device, started through the MPI world (see
//! `docs/ranks/gpu.md`). With `--zero` (over MPI or NCCL) each rank keeps the
//! AdamW moments of its own slice of the parameters only
//! (`ranks::ZeroAdamW`): the gradients are reduce-scattered, each rank
//! steps its slice and the parameters are all-gathered; at 2 ranks it ends
//! bit-identical to the replicated run, which CI checks. `--checkpoint DIR
//! --save-at K` saves the parameters and AdamW's state after K steps into
//! the `ranks::CheckpointManager` directory DIR, as one `ranks::Training`
//! checkpoint (every rank a shard of each; with `--zero`, its moments),
//! and `--resume DIR` goes on from its latest at any number of ranks, with
//! or without `--zero`: both hold AdamW's whole state. CI saves a ZeRO run at 2 ranks and
//! resumes it in one process with `--accumulate 2` and, replicated, at 2
//! ranks, and resumes a replicated run's checkpoint with `--zero`; each
//! ends with the uninterrupted run's digest. The run fails if
//! the ranks' parameters or held-out losses differ, or if the held-out
//! loss does not fall.

use std::collections::HashMap;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{D, DType, Device, IndexOp, Tensor};
use candle_nn::VarMap;
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder};
use candle_transformers::models::llama2_c::{Cache, Config, Llama};
use scopetree::candle::{AdamW as StoreAdamW, AsyncSaver, CandleStore};
use scopetree::checkpoint::{LoadOptions, SaveOptions};
use scopetree::ranks::{
    CandlePlan, CheckpointManager, Collective, PlanOptions, Training, ZeroAdamW,
};

#[path = "support/data_parallel.rs"]
mod data_parallel;
use data_parallel::{Transport, describe, digest, every_rank, micro_batches, micro_grads};

type Res<T> = Result<T, Box<dyn Error>>;

/// Command-line settings.
struct Args {
    steps: usize,
    finetune_steps: usize,
    batch: usize,
    lr: f64,
    seed: u64,
    dir: Option<PathBuf>,
    device: String,
    /// Steps of the parity, resume and save-cost checks (part 6).
    check_steps: usize,
    /// An async save every this many steps in the save-cost check.
    save_every: usize,
    /// Micro-batches per rank and step, across ranks: one process with
    /// `--accumulate 2` steps as 2 ranks do.
    accumulate: usize,
    /// Reduce over NCCL on the device (feature `nccl`) instead of MPI.
    nccl: bool,
    /// ZeRO stage 1 across ranks: each rank keeps and steps the AdamW
    /// moments of its slice only.
    zero: bool,
    /// Across ranks: save the parameters and the optimizer's state into
    /// this directory after `save_at` steps.
    checkpoint: Option<PathBuf>,
    save_at: usize,
    /// Across ranks: start from a checkpoint `--checkpoint` wrote (at any
    /// number of ranks, ZeRO or not).
    resume: Option<PathBuf>,
}

impl Args {
    fn parse() -> Res<Self> {
        let mut a = Args {
            steps: 300,
            finetune_steps: 60,
            batch: 16,
            lr: 1e-2,
            seed: 7,
            dir: None,
            device: "cpu".to_owned(),
            check_steps: 40,
            save_every: 10,
            accumulate: 1,
            nccl: false,
            zero: false,
            checkpoint: None,
            save_at: 0,
            resume: None,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--steps" => a.steps = value()?.parse()?,
                "--finetune-steps" => a.finetune_steps = value()?.parse()?,
                "--batch" => a.batch = value()?.parse()?,
                "--lr" => a.lr = value()?.parse()?,
                "--seed" => a.seed = value()?.parse()?,
                "--dir" => a.dir = Some(value()?.into()),
                "--device" => a.device = value()?,
                "--check-steps" => a.check_steps = value()?.parse()?,
                "--save-every" => a.save_every = value()?.parse()?,
                "--accumulate" => a.accumulate = value()?.parse()?,
                "--nccl" => a.nccl = true,
                "--zero" => a.zero = true,
                "--checkpoint" => a.checkpoint = Some(value()?.into()),
                "--save-at" => a.save_at = value()?.parse()?,
                "--resume" => a.resume = Some(value()?.into()),
                "-h" | "--help" => {
                    println!(
                        "train_llama2_c [--steps N] [--finetune-steps N] [--batch N] [--lr X] \
                         [--seed N] [--dir PATH (default: a new directory under the temp dir)] \
                         [--device cpu|cuda] [--check-steps N] [--save-every N] \
                         [--accumulate MICRO-BATCHES] [--nccl] [--zero] \
                         [--checkpoint DIR --save-at STEP] [--resume DIR]"
                    );
                    std::process::exit(0);
                }
                other => return Err(format!("unknown flag {other}; try --help").into()),
            }
        }
        if a.batch == 0 || a.accumulate == 0 {
            return Err("--batch and --accumulate must be positive".into());
        }
        if a.save_every == 0 || a.check_steps < 2 {
            return Err("--save-every must be positive and --check-steps at least 2".into());
        }
        if a.checkpoint.is_some() != (a.save_at > 0) {
            return Err("--checkpoint DIR and --save-at STEP (at least 1) go together".into());
        }
        Ok(a)
    }
}

/// SplitMix64: batch offsets and sampling (the example needs no `rand`).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1_u64 << 24) as f32
    }
}

/// The model: byte-level, 2 layers of width 128. Only the head trains
/// (see the file's comment), so the width serves the head's features, and
/// fewer random layers keep more of the current byte in them: 128 × 2
/// reached 88–89 % of the unigram entropy in 300 steps where 64 × 4
/// reached 91–99 %.
fn config() -> Config {
    Config {
        dim: 128,
        hidden_dim: 344,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 4,
        vocab_size: 256,
        seq_len: 64,
        norm_eps: 1e-5,
    }
}

/// The rotary tables, computed. `Cache::new` first asks the builder for
/// `freq_cis_real`/`_imag`: candle's training example hands it the
/// `VarMap`'s builder, which creates them as zero variables (so the
/// rotation is zero). An empty builder fails the get and the cache
/// computes them.
fn rotary(cfg: &Config, dev: &Device) -> Res<Cache> {
    let none = VarBuilder::from_tensors(HashMap::new(), DType::F32, dev);
    Ok(Cache::new(false, cfg, none.pp("rot"))?)
}

/// `b` windows of `t` bytes at `starts`, and the next byte of each.
fn batch(text: &[u8], starts: &[usize], t: usize, dev: &Device) -> Res<(Tensor, Tensor)> {
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for &s in starts {
        x.extend(text[s..s + t].iter().map(|&c| u32::from(c)));
        y.extend(text[s + 1..s + t + 1].iter().map(|&c| u32::from(c)));
    }
    Ok((
        Tensor::from_vec(x, (starts.len(), t), dev)?,
        Tensor::from_vec(y, (starts.len() * t,), dev)?,
    ))
}

fn loss(model: &Llama, cache: &mut Cache, x: &Tensor, y: &Tensor) -> Res<Tensor> {
    let logits = model.forward(x, 0, cache)?;
    Ok(candle_nn::loss::cross_entropy(&logits.flatten_to(1)?, y)?)
}

/// Mean loss over fixed, evenly spaced windows of `text`, and the logits'
/// bits of the first window (for the bit-for-bit checks).
fn evaluate(model: &Llama, text: &[u8], b: usize, dev: &Device) -> Res<(f64, Vec<u32>)> {
    let t = config().seq_len;
    let span = text.len() - t - 1;
    let starts: Vec<usize> = (0..b).map(|i| i * span / b).collect();
    let (x, y) = batch(text, &starts, t, dev)?;
    let mut cache = rotary(&config(), dev)?;
    let logits = model.forward(&x, 0, &mut cache)?;
    let l = candle_nn::loss::cross_entropy(&logits.flatten_to(1)?, &y)?;
    let first: Vec<f32> = logits.i(0)?.flatten_all()?.to_vec1()?;
    Ok((
        f64::from(l.to_scalar::<f32>()?),
        first.iter().map(|v| v.to_bits()).collect(),
    ))
}

/// The entropy of the byte distribution of `text`, in nats.
fn unigram_entropy(text: &[u8]) -> f64 {
    let mut counts = [0_usize; 256];
    for &c in text {
        counts[c as usize] += 1;
    }
    let n = text.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.ln()
        })
        .sum()
}

/// `n` bytes after `prompt`, sampled at temperature `temp` (no KV cache:
/// the model is small and the window short).
fn generate(
    model: &Llama,
    prompt: &str,
    n: usize,
    temp: f32,
    rng: &mut SplitMix,
    dev: &Device,
) -> Res<String> {
    let t = config().seq_len;
    let mut bytes: Vec<u8> = prompt.bytes().collect();
    for _ in 0..n {
        let window = &bytes[bytes.len().saturating_sub(t)..];
        let x = Tensor::from_vec(
            window.iter().map(|&c| u32::from(c)).collect::<Vec<_>>(),
            (1, window.len()),
            dev,
        )?;
        let mut cache = rotary(&config(), dev)?;
        let logits = model.forward(&x, 0, &mut cache)?.i((0, window.len() - 1))?;
        let probs: Vec<f32> =
            candle_nn::ops::softmax(&(logits / f64::from(temp))?, D::Minus1)?.to_vec1()?;
        let mut r = rng.unit();
        let mut pick = probs.len() - 1;
        for (i, p) in probs.iter().enumerate() {
            if r < *p {
                pick = i;
                break;
            }
            r -= p;
        }
        bytes.push(pick as u8);
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Every variable's name and bits.
fn snapshot(store: &CandleStore) -> Res<Vec<(String, Vec<u32>)>> {
    let mut out = Vec::new();
    for (k, v) in store.named_vars()? {
        let bits = v.flatten_all()?.to_vec1::<f32>()?;
        out.push((k, bits.iter().map(|x| x.to_bits()).collect()));
    }
    Ok(out)
}

/// The names whose values differ between two snapshots.
fn changed(before: &[(String, Vec<u32>)], after: &[(String, Vec<u32>)]) -> Vec<String> {
    before
        .iter()
        .zip(after)
        .filter(|(b, a)| b.1 != a.1)
        .map(|(b, _)| b.0.clone())
        .collect()
}

/// `AdamW` steps on random windows of `text`; returns the mean loss of the
/// last tenth of the steps.
fn train(
    model: &Llama,
    opt: &mut AdamW,
    text: &[u8],
    steps: usize,
    a: &Args,
    rng: &mut SplitMix,
    dev: &Device,
) -> Res<f64> {
    let t = config().seq_len;
    let mut cache = rotary(&config(), dev)?;
    let tail = (steps / 10).max(1);
    let mut sum = 0.0;
    let t0 = Instant::now();
    for step in 0..steps {
        let starts: Vec<usize> = (0..a.batch)
            .map(|_| rng.below(text.len() - t - 1))
            .collect();
        let (x, y) = batch(text, &starts, t, dev)?;
        let l = loss(model, &mut cache, &x, &y)?;
        opt.backward_step(&l)?;
        let v = f64::from(l.to_scalar::<f32>()?);
        if step + tail >= steps {
            sum += v;
        }
        if step % 50 == 0 || step + 1 == steps {
            println!(
                "  step {step:4}: loss {v:.4} ({:.1} s)",
                t0.elapsed().as_secs_f64()
            );
        }
    }
    Ok(sum / tail.min(steps).max(1) as f64)
}

fn check(ok: bool, what: &str, failures: &mut Vec<String>) {
    println!("  {} {what}", if ok { "ok:  " } else { "FAIL:" });
    if !ok {
        failures.push(what.to_owned());
    }
}

/// The shard files an index names, in order.
fn shard_paths(dir: &Path) -> Res<Vec<PathBuf>> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json"))?)?;
    let mut files: Vec<&str> = index["weight_map"]
        .as_object()
        .ok_or("the index has no weight_map")?
        .values()
        .filter_map(|v| v.as_str())
        .collect();
    files.sort_unstable();
    files.dedup();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// The device `--device` names.
fn device(name: &str) -> Res<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Device::new_cuda(0).map_err(|e| {
            format!("--device cuda: {e} (build with --features cuda, on a machine with a GPU)")
                .into()
        }),
        other => Err(format!("--device {other}: cpu or cuda").into()),
    }
}

fn main() -> Res<()> {
    let a = Args::parse()?;
    #[cfg(feature = "mpi")]
    let universe = mpi::initialize().ok_or("MPI was already initialised")?;
    #[cfg(feature = "mpi")]
    let world = universe.world();
    #[cfg(not(feature = "mpi"))]
    let world = scopetree::ranks::SingleProcess;
    let world: &dyn Collective = &world;
    let saves = a.checkpoint.is_some() || a.resume.is_some();
    if world.size() > 1 || a.accumulate > 1 || a.nccl || a.zero || saves {
        return across_ranks(&a, world);
    }
    let dev = device(&a.device)?;
    println!("device: {:?}", dev.location());
    let cfg = config();
    let mut failures = Vec::new();
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("scopetree-llama2-c-{}", std::process::id())),
    };
    let (base_dir, adapter_dir) = (dir.join("base"), dir.join("adapter"));

    let text = lipsum::LIBER_PRIMUS.as_bytes();
    let (train_text, held_out) = text.split_at(text.len() * 9 / 10);
    let entropy = unigram_entropy(text);
    println!(
        "text: lipsum::LIBER_PRIMUS, {} bytes; training on {}, holding out {}; unigram entropy {entropy:.4} nats/byte",
        text.len(),
        train_text.len(),
        held_out.len()
    );

    // 1. Train, with the parameters in the store.
    let store = CandleStore::new();
    let model = Llama::load(store.var_builder(DType::F32, &dev), cfg.clone())?;
    let params: usize = store.all_vars()?.iter().map(|v| v.elem_count()).sum();
    println!(
        "llama2_c: {} layers, dim {}, {} tensors, {params} parameters, all in the store",
        cfg.n_layers,
        cfg.dim,
        store.names()?.len()
    );
    let initial = snapshot(&store)?;
    let (start, _) = evaluate(&model, held_out, a.batch, &dev)?;
    println!("held-out loss before training: {start:.4}");
    let params_adamw = ParamsAdamW {
        lr: a.lr,
        ..ParamsAdamW::default()
    };
    let mut opt = AdamW::new(store.trainable_vars("")?, params_adamw.clone())?;
    let mut rng = SplitMix(a.seed);
    println!(
        "training {} steps, batch {} × {} bytes:",
        a.steps, a.batch, cfg.seq_len
    );
    train(&model, &mut opt, train_text, a.steps, &a, &mut rng, &dev)?;
    let (trained_loss, trained_bits) = evaluate(&model, held_out, a.batch, &dev)?;
    println!(
        "held-out loss after training: {trained_loss:.4} ({:.0} % of the unigram entropy)",
        100.0 * trained_loss / entropy
    );
    println!(
        "tensors that changed: {:?}",
        changed(&initial, &snapshot(&store)?)
    );
    check(
        trained_loss < 0.5 * start && trained_loss < entropy,
        "the held-out loss falls below half its initial value and below the unigram entropy",
        &mut failures,
    );

    // 2. Publish as a sharded Hugging Face checkpoint, with its config.
    let report = store.save_sharded(&base_dir, &SaveOptions::new().max_shard_size(256 * 1024))?;
    let config_json = serde_json::json!({
        "model_type": "llama2_c",
        "dim": cfg.dim, "hidden_dim": cfg.hidden_dim, "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
        "vocab_size": cfg.vocab_size, "seq_len": cfg.seq_len, "norm_eps": cfg.norm_eps,
    });
    std::fs::write(
        base_dir.join("config.json"),
        serde_json::to_vec_pretty(&config_json)?,
    )?;
    println!(
        "saved {} tensors in {} shards to {}",
        report.keys.len(),
        report.shards.len(),
        base_dir.display()
    );

    // 3. Read back with candle's own loader, and generate.
    let shards = shard_paths(&base_dir)?;
    // SAFETY: the shards were written above and nothing modifies or removes
    // them while they are mapped.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&shards, DType::F32, &dev)? };
    let published = Llama::load(vb, cfg.clone())?;
    let (_, published_bits) = evaluate(&published, held_out, a.batch, &dev)?;
    check(
        published_bits == trained_bits,
        "candle's from_mmaped_safetensors over the shards gives the trained logits, bit for bit",
        &mut failures,
    );
    println!("generated by the model candle loaded (temperature 0.8):");
    for prompt in ["Sed ut ", "Quam ob rem ", "Nam "] {
        let line = generate(&published, prompt, 80, 0.8, &mut rng, &dev)?;
        println!("  {line:?}");
    }

    // 4. Fine-tune the top block, the final norm and the head.
    let top = format!("model.layers.{}", cfg.n_layers - 1);
    store.freeze("model")?;
    store.unfreeze(&top)?;
    store.unfreeze("model.norm")?;
    let tuned: Vec<String> = store
        .names()?
        .into_iter()
        .filter(|n| !store.is_frozen(n))
        .collect();
    let model = Llama::load(store.var_builder(DType::F32, &dev), cfg.clone())?;
    let mut opt = AdamW::new(store.trainable_vars("")?, params_adamw)?;
    let lorem = lipsum::LOREM_IPSUM.as_bytes();
    let before = snapshot(&store)?;
    let (lorem_before, _) = evaluate(&model, lorem, a.batch, &dev)?;
    println!(
        "fine-tuning {} of {} tensors on lipsum::LOREM_IPSUM ({} bytes), {} steps:",
        tuned.len(),
        before.len(),
        lorem.len(),
        a.finetune_steps
    );
    train(
        &model,
        &mut opt,
        lorem,
        a.finetune_steps,
        &a,
        &mut rng,
        &dev,
    )?;
    let (lorem_after, tuned_bits) = evaluate(&model, lorem, a.batch, &dev)?;
    println!("loss on LOREM_IPSUM: {lorem_before:.4} before, {lorem_after:.4} after");
    let moved = changed(&before, &snapshot(&store)?);
    println!("tensors that changed: {moved:?}");
    check(
        moved.iter().all(|n| tuned.contains(n)),
        "every frozen tensor is bit-identical after fine-tuning",
        &mut failures,
    );

    // 5. Ship the tuned tensors as an adapter; base + adapter gives the
    //    fine-tuned model back.
    let keep = tuned.clone();
    let report = store.save_sharded(
        &adapter_dir,
        &SaveOptions::new().filter(move |k| keep.iter().any(|t| t == k)),
    )?;
    println!(
        "adapter: {} tensors in {}",
        report.keys.len(),
        adapter_dir.display()
    );
    // Both loads name the device: a second `load` would place the first's
    // waiting variables on the CPU before reading the adapter into them.
    let fresh = CandleStore::new();
    fresh.load_on(&base_dir, &LoadOptions::new().create(true), &dev)?;
    fresh.load_on(&adapter_dir, &LoadOptions::new().allow_missing(true), &dev)?;
    fresh.seal();
    let reloaded = Llama::load(fresh.var_builder(DType::F32, &dev), cfg.clone())?;
    check(
        fresh.unused()?.is_empty(),
        "the model asked for every tensor of base + adapter",
        &mut failures,
    );
    let (_, reloaded_bits) = evaluate(&reloaded, lorem, a.batch, &dev)?;
    check(
        reloaded_bits == tuned_bits,
        "base + adapter, loaded again, gives the fine-tuned logits, bit for bit",
        &mut failures,
    );

    // 6. On the chosen device: the store against VarMap, a resume through
    //    files, the cost of saves beside training, tokens per second.
    device_checks(&a, &dev, &base_dir, &dir, train_text, &mut failures)?;

    if a.dir.is_none() {
        std::fs::remove_dir_all(&dir)?;
    }
    if !failures.is_empty() {
        eprintln!("failed: {failures:?}");
        std::process::exit(1);
    }
    Ok(())
}

/// The window starts of step `step`: drawn from `(seed, step)` alone, so a
/// run resumed at any step draws what the uninterrupted run drew, and every
/// rank draws the same global batch.
fn step_starts(text: &[u8], seed: u64, step: usize, b: usize) -> Vec<usize> {
    let t = config().seq_len;
    let mut rng = SplitMix(seed ^ (step as u64).wrapping_mul(0xA24B_AED4_963E_E407));
    (0..b).map(|_| rng.below(text.len() - t - 1)).collect()
}

/// The batch of step `step` (see [`step_starts`]).
fn step_batch(
    text: &[u8],
    seed: u64,
    step: usize,
    b: usize,
    dev: &Device,
) -> Res<(Tensor, Tensor)> {
    batch(
        text,
        &step_starts(text, seed, step, b),
        config().seq_len,
        dev,
    )
}

/// Steps `from..to` of `opt` on `model`; returns the seconds taken (the
/// device synchronized at the end).
fn steps<O: Optimizer>(
    model: &Llama,
    opt: &mut O,
    text: &[u8],
    (from, to): (usize, usize),
    a: &Args,
    dev: &Device,
    mut after_step: impl FnMut(usize) -> Res<()>,
) -> Res<f64> {
    let mut cache = rotary(&config(), dev)?;
    dev.synchronize()?;
    let t0 = Instant::now();
    for step in from..to {
        let (x, y) = step_batch(text, a.seed, step, a.batch, dev)?;
        let l = loss(model, &mut cache, &x, &y)?;
        opt.backward_step(&l)?;
        after_step(step + 1)?;
    }
    dev.synchronize()?;
    Ok(t0.elapsed().as_secs_f64())
}

/// Every variable's bits, by name.
fn bits_of(named: Vec<(String, candle_core::Var)>) -> Res<Vec<(String, Vec<u32>)>> {
    let mut out = Vec::new();
    for (k, v) in named {
        let vals: Vec<f32> = v.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
        out.push((k, vals.iter().map(|x| x.to_bits()).collect()));
    }
    out.sort_by(|x, y| x.0.cmp(&y.0));
    Ok(out)
}

/// A fresh store holding the checkpoint `from`, on `dev`, with the model
/// built on it.
fn loaded(from: &Path, dev: &Device) -> Res<(CandleStore, Llama)> {
    let store = CandleStore::new();
    store.load_on(from, &LoadOptions::new().create(true), dev)?;
    store.seal();
    let model = Llama::load(store.var_builder(DType::F32, dev), config())?;
    Ok((store, model))
}

fn device_checks(
    a: &Args,
    dev: &Device,
    base: &Path,
    dir: &Path,
    text: &[u8],
    failures: &mut Vec<String>,
) -> Res<()> {
    let n = a.check_steps;
    let params = ParamsAdamW {
        lr: a.lr,
        ..ParamsAdamW::default()
    };
    println!(
        "on {:?}, from the published checkpoint, {n} steps each:",
        dev.location()
    );

    // The store with scopetree's AdamW against VarMap with candle's, on
    // the same device, from the same values.
    let map = VarMap::new();
    let map_model = Llama::load(VarBuilder::from_varmap(&map, DType::F32, dev), config())?;
    let mut named: Vec<(String, candle_core::Var)> = map
        .data()
        .lock()
        .map_err(|_| "lock")?
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    named.sort_by(|x, y| x.0.cmp(&y.0));
    let (store, model) = loaded(base, dev)?;
    for (k, v) in &named {
        let ours = store
            .var(k)?
            .ok_or_else(|| format!("{k} is not in the checkpoint"))?;
        v.set(ours.as_tensor())?;
    }
    let mut opt_map = AdamW::new(
        named.iter().map(|(_, v)| v.clone()).collect(),
        params.clone(),
    )?;
    let mut opt = StoreAdamW::for_store(&store, "", params.clone())?;
    let t_map = steps(&map_model, &mut opt_map, text, (0, n), a, dev, |_| Ok(()))?;
    let t_ours = steps(&model, &mut opt, text, (0, n), a, dev, |_| Ok(()))?;
    check(
        bits_of(named)? == bits_of(store.named_vars()?)?,
        &format!(
            "the store with scopetree's AdamW and VarMap with candle's AdamW end bit-identical on {:?}",
            dev.location()
        ),
        failures,
    );
    let tokens = (n * a.batch * config().seq_len) as f64;
    println!(
        "tokens/s on {:?}: {:.0} (store), {:.0} (VarMap)",
        dev.location(),
        tokens / t_ours,
        tokens / t_map
    );
    if !dev.is_cpu() {
        let m = n.min(10);
        let (cpu_store, cpu_model) = loaded(base, &Device::Cpu)?;
        let mut cpu_opt = StoreAdamW::for_store(&cpu_store, "", params.clone())?;
        let t_cpu = steps(
            &cpu_model,
            &mut cpu_opt,
            text,
            (0, m),
            a,
            &Device::Cpu,
            |_| Ok(()),
        )?;
        let cpu_rate = (m * a.batch * config().seq_len) as f64 / t_cpu;
        println!(
            "FIGURE tokens/s: {:.0} on {:?} against {cpu_rate:.0} on the CPU ({:.1}x)",
            tokens / t_ours,
            dev.location(),
            tokens / t_ours / cpu_rate
        );
    }

    // A run that never stops, against one saved at step k (parameters and
    // optimizer state, beside training) and resumed from the files in a
    // fresh store and optimizer.
    let k = n / 2;
    let (whole, whole_model) = loaded(base, dev)?;
    let mut whole_opt = StoreAdamW::for_store(&whole, "", params.clone())?;
    steps(&whole_model, &mut whole_opt, text, (0, n), a, dev, |_| {
        Ok(())
    })?;
    let (first, first_model) = loaded(base, dev)?;
    let mut first_opt = StoreAdamW::for_store(&first, "", params.clone())?;
    steps(&first_model, &mut first_opt, text, (0, k), a, dev, |_| {
        Ok(())
    })?;
    let ck = dir.join(format!("step-{k}"));
    let mut saver = AsyncSaver::new(256 << 20);
    saver.save_sharded(
        &[
            (&first, ck.join("model")),
            (first_opt.state(), ck.join("optim")),
        ],
        &SaveOptions::new(),
    )?;
    // Training goes on past the save; the save holds the values of step k.
    steps(
        &first_model,
        &mut first_opt,
        text,
        (k, k + 3),
        a,
        dev,
        |_| Ok(()),
    )?;
    saver.wait()?;
    let (resumed, resumed_model) = loaded(&ck.join("model"), dev)?;
    let mut resumed_opt = StoreAdamW::for_store(&resumed, "", params.clone())?;
    resumed_opt
        .state()
        .load(ck.join("optim"), &LoadOptions::new())?;
    steps(
        &resumed_model,
        &mut resumed_opt,
        text,
        (k, n),
        a,
        dev,
        |_| Ok(()),
    )?;
    check(
        bits_of(resumed.named_vars()?)? == bits_of(whole.named_vars()?)?
            && resumed_opt.step_count()? == n as u64,
        &format!(
            "a run resumed at step {k} from its async save ends bit-identical to one that never stopped"
        ),
        failures,
    );

    // The cost of saves beside training: the same steps without saves and
    // with an async save every `save_every` steps, in turn, twice.
    let (s2, m2) = loaded(base, dev)?;
    let mut o2 = StoreAdamW::for_store(&s2, "", params)?;
    let state2 = o2.state().clone();
    let mut plain = Vec::new();
    let mut saving = Vec::new();
    let mut blocked: Vec<f64> = Vec::new();
    let mut copies: Vec<f64> = Vec::new();
    let mut at = 0;
    for round in 0..2 {
        plain.push(steps(&m2, &mut o2, text, (at, at + n), a, dev, |_| Ok(()))?);
        at += n;
        let save_dir = dir.join(format!("saves-{round}"));
        let t = steps(&m2, &mut o2, text, (at, at + n), a, dev, |step| {
            if step % a.save_every == 0 {
                let d = save_dir.join(format!("step-{step}"));
                let staged = saver.save_sharded(
                    &[(&s2, d.join("model")), (&state2, d.join("optim"))],
                    &SaveOptions::new(),
                )?;
                blocked.push(staged.blocked.as_secs_f64());
                if let Some(c) = saver.last_copy_time() {
                    copies.push(c.as_secs_f64());
                }
            }
            Ok(())
        })?;
        saver.wait()?;
        if let Some(c) = saver.last_copy_time() {
            copies.push(c.as_secs_f64());
        }
        saving.push(t);
        at += n;
    }
    let (p, w) = (
        plain.iter().sum::<f64>() / plain.len() as f64,
        saving.iter().sum::<f64>() / saving.len() as f64,
    );
    let ratio = p / w;
    let max_block = blocked.iter().copied().fold(0.0, f64::max);
    println!(
        "FIGURE async saves: {:.1} steps/s with a save every {} steps against {:.1} without: {ratio:.3}x; {} saves, longest block {:.3} ms, staging {} B",
        n as f64 / w,
        a.save_every,
        n as f64 / p,
        blocked.len(),
        max_block * 1e3,
        saver.staging_bytes()
    );
    if let Some(copy) = copies.iter().copied().reduce(f64::max) {
        println!(
            "FIGURE save blocking: longest block {:.3} ms against the device-to-host copy of the state {:.3} ms ({:.2}x)",
            max_block * 1e3,
            copy * 1e3,
            max_block / copy
        );
    }
    Ok(())
}

/// Replaces candle's random initial values (its RNG cannot be seeded) with
/// values drawn from `rng`, variable by variable in name order, with the
/// spread of candle-nn's defaults: the norms' ones, the embedding's unit
/// variance, and Kaiming's ±√(6/fan_in) for the linear layers.
fn seeded_init(store: &CandleStore, rng: &mut SplitMix) -> Res<()> {
    for (name, var) in store.named_vars()? {
        let dims = var.dims().to_vec();
        let values: Vec<f32> = if name.ends_with("norm.weight") {
            vec![1.0; var.elem_count()]
        } else {
            let bound = if name.starts_with("model.embed_tokens") {
                3_f64.sqrt()
            } else {
                (6.0 / dims[dims.len() - 1] as f64).sqrt()
            };
            (0..var.elem_count())
                .map(|_| ((2.0 * f64::from(rng.unit()) - 1.0) * bound) as f32)
                .collect()
        };
        var.set(&Tensor::from_vec(values, dims, var.device())?)?;
    }
    Ok(())
}

/// The optimizer across ranks: replicated, or ZeRO stage 1 (`--zero`).
enum Step {
    Replicated(StoreAdamW),
    Zero(ZeroAdamW),
}

/// Data-parallel training across the ranks of `world` (see the file's
/// comment): `--steps` steps from seeded values, then the checks.
fn across_ranks(a: &Args, world: &dyn Collective) -> Res<()> {
    let (rank, ranks) = (world.rank(), world.size());
    let micro = micro_batches(a.batch, rank, ranks, a.accumulate)?;
    // Rank 0 prints.
    macro_rules! say {
        ($($t:tt)*) => { if rank == 0 { println!($($t)*); } };
    }
    let dev = device(&a.device)?;
    say!("device: {:?}", dev.location());
    let transport = Transport::new(a.nccl, world, &dev)?;
    say!("gradients reduced over {}", transport.name());
    let cfg = config();
    let text = lipsum::LIBER_PRIMUS.as_bytes();
    let (train_text, held_out) = text.split_at(text.len() * 9 / 10);
    let entropy = unigram_entropy(text);

    let store = CandleStore::new();
    let model = Llama::load(store.var_builder(DType::F32, &dev), cfg.clone())?;
    seeded_init(&store, &mut SplitMix(a.seed ^ 0x5EED))?;
    // Every rank starts from rank 0's values and reduces the gradients of
    // every variable the optimizer steps.
    let mut plan = CandlePlan::new(world, &store, &PlanOptions::new())?;
    transport.broadcast(&mut plan, world)?;
    let params = ParamsAdamW {
        lr: a.lr,
        ..ParamsAdamW::default()
    };
    // Replicated: every rank steps every variable; ZeRO: its slice only.
    let mut opt = if a.zero {
        Step::Zero(ZeroAdamW::new(world, &plan, params)?)
    } else {
        Step::Replicated(StoreAdamW::for_store(&store, "", params)?)
    };
    // Resumed: the parameters and the optimizer's state, the latest
    // checkpoint in a manager's directory, of any number of ranks, ZeRO or
    // replicated (both hold AdamW's whole state, `<name>.m`, `<name>.v`
    // and `step`), both parts or neither, at the step it was saved.
    let first = match &a.resume {
        None => 0,
        Some(dir) => {
            let manager = CheckpointManager::new(dir, 1)?;
            let found = match &mut opt {
                Step::Replicated(opt) => {
                    manager.load_latest(world, &mut plan, &mut Training::new(&store, opt))?
                }
                Step::Zero(opt) => {
                    manager.load_latest(world, &mut plan, &mut Training::new(&store, opt))?
                }
            };
            let (done, _) = found.ok_or_else(|| format!("no checkpoint in {}", dir.display()))?;
            say!("resumed from {} at step {done}", dir.display());
            usize::try_from(done)?
        }
    };
    let vars = plan.vars().to_vec();
    say!(
        "ranks: {ranks}; {} steps of a global batch of {} windows of {} bytes, {} per rank in {} micro-batch(es)",
        a.steps,
        a.batch,
        cfg.seq_len,
        a.batch / ranks,
        a.accumulate
    );
    let (start, _) = evaluate(&model, held_out, a.batch, &dev)?;
    let losses = every_rank(world, start)?;
    let mut consistent = losses.iter().all(|l| l.to_bits() == start.to_bits());
    say!("held-out loss before training: {}", describe(&losses));

    let mut cache = rotary(&cfg, &dev)?;
    dev.synchronize()?;
    let t0 = Instant::now();
    for step in first..a.steps {
        let starts = step_starts(train_text, a.seed, step, a.batch);
        let (mut grads, sum) = micro_grads(&micro, &vars, |range| {
            let (x, y) = batch(train_text, &starts[range], cfg.seq_len, &dev)?;
            loss(&model, &mut cache, &x, &y)
        })?;
        match &mut opt {
            Step::Replicated(opt) => {
                transport.all_reduce(&mut plan, world, &mut grads)?;
                opt.step(&grads)?;
            }
            Step::Zero(opt) => {
                transport.reduce_scatter(&mut plan, world, &mut grads)?;
                opt.step(&grads)?;
                transport.all_gather(&mut plan, world)?;
            }
        }
        if let (Some(dir), true) = (&a.checkpoint, step + 1 == a.save_at) {
            // The parameters and the optimizer's state in one managed
            // checkpoint, every rank a shard of each (with ZeRO, its
            // moments).
            let manager = CheckpointManager::new(dir, 1)?;
            let done = u64::try_from(step + 1)?;
            let opts = SaveOptions::new();
            match &mut opt {
                Step::Replicated(opt) => {
                    manager.save(world, &mut plan, &Training::new(&store, opt), done, &opts)?
                }
                Step::Zero(opt) => {
                    manager.save(world, &mut plan, &Training::new(&store, opt), done, &opts)?
                }
            };
            say!("saved after step {step} into {}", dir.display());
        }
        if step % 50 == 0 || step + 1 == a.steps {
            // The training loss over the global batch: the ranks' mean.
            let mut total = [0.0];
            world.all_reduce_sum_f64(&[sum], &mut total)?;
            say!(
                "  step {step:4}: training loss {:.4} ({:.1} s)",
                total[0] / ranks as f64,
                t0.elapsed().as_secs_f64()
            );
        }
    }
    dev.synchronize()?;
    let secs = t0.elapsed().as_secs_f64();
    plan.check_consistency(world)?;
    let (end, _) = evaluate(&model, held_out, a.batch, &dev)?;
    let losses = every_rank(world, end)?;
    consistent &= losses.iter().all(|l| l.to_bits() == end.to_bits());
    say!(
        "held-out loss after training: {} ({:.0} % of the unigram entropy)",
        describe(&losses),
        100.0 * end / entropy
    );
    say!(
        "FIGURE ranks: {:.0} tokens/s over {ranks} rank(s) of {} micro-batch(es) on {:?}, {}",
        (a.steps * a.batch * cfg.seq_len) as f64 / secs,
        a.accumulate,
        dev.location(),
        format!(
            "{} over {}",
            if a.zero { "ZeRO stage 1" } else { "reduced" },
            transport.name()
        )
    );
    say!("parameters: digest {}", digest(&store)?);
    if !consistent {
        return Err("the held-out losses differ between ranks".into());
    }
    if end >= start {
        eprintln!("the held-out loss did not fall: {start:.4} before, {end:.4} after");
        std::process::exit(1);
    }
    Ok(())
}
