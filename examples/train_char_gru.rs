//! A character-level GRU language model trained with candle-nn and AdamW on
//! a real text, with every parameter in a scopetree store.
//!
//! The text is Cicero's *De finibus* I (`lipsum::LIBER_PRIMUS`, 49,068
//! characters, shipped in the `lipsum` crate: nothing is downloaded). The
//! model is `emb` (an embedding), `gru` (one GRU layer) and `out` (a linear
//! head), built through [`CandleStore::var_builder`], so the variables are
//! `emb.weight`, `gru.weight_ih_l0`, … in the tree. The example prints the
//! training and held-out loss per epoch against the unigram entropy of the
//! text (the loss of a model that knows only character frequencies), samples
//! a line, and can save and resume:
//!
//! ```text
//! cargo run --release --features candle --example train_char_gru
//! cargo run --release --features candle --example train_char_gru -- --epochs 4 --save /tmp/gru.safetensors
//! cargo run --release --features candle --example train_char_gru -- --epochs 2 --resume /tmp/gru.safetensors
//! ```
//!
//! A resumed run loads the checkpoint into an empty store before the model
//! is built (`LoadOptions::create`), seals the store so that a layer name
//! the file lacks is an error rather than a fresh variable, builds the model
//! (which reuses every loaded variable, checked for shape and dtype), and
//! lists the file's names the model never asked for. The optimizer is
//! scopetree's `AdamW` (candle's, step for step, which `--parity N` checks
//! against a `VarMap` with candle's own), whose moments and step count
//! `--save` writes beside the model (`PATH.optim.safetensors`) and
//! `--resume` reads back, so a resumed run goes on bit for bit.
//!
//! The run fails (exit status 1) if the held-out loss does not end below
//! 80 % of the unigram entropy.
//!
//! The initial values are drawn from `--seed` (candle's CPU RNG cannot be
//! seeded), with the spread of candle-nn's defaults, so a run is
//! deterministic.
//!
//! **Across processes.** Built with the `mpi` feature, the example also runs
//! under `mpirun`, one rank per process, through `ranks::CandlePlan`:
//!
//! ```text
//! cargo build --release --features candle,mpi --example train_char_gru
//! mpirun -np 2 target/release/examples/train_char_gru --epochs 2
//! ```
//!
//! Every rank draws the same global batch of `--batch` windows and trains
//! on its share (rank r takes the r-th slice); after `backward`, the plan
//! averages the gradients in candle's `GradStore` over the ranks
//! (`Reduce::Mean`), so every rank takes the same AdamW step. Rank 0's
//! initial values are broadcast first, the ranks check after every epoch
//! that their parameters are bit-identical, and rank 0 prints, with the
//! held-out loss of every rank (computed by each on the same held-out text)
//! and whether those are bit-identical. One process runs the same code in a
//! world of one rank (`SingleProcess`), with or without the feature.
//!
//! `--accumulate N` splits each rank's share into N micro-batches, adds
//! their gradients in order and divides by N before the ranks' mean: one
//! process with `--accumulate 2` ends bit-identical to 2 ranks (the same
//! `parameters: digest`), which CI checks; with `--device cuda`, the
//! ranks' all-reduce reads the device gradients a bucket segment at a time
//! (see `docs/ranks/candle.md`); with `--nccl` too (feature `nccl`, one GPU
//! per rank), they are reduced over NCCL on the device, started through the
//! MPI world (see `docs/ranks/gpu.md`).

use std::collections::BTreeMap;
use std::error::Error;
use std::time::Instant;

use candle_core::{D, DType, Device, Module, Tensor};
use candle_nn::VarMap;
use candle_nn::rnn::{GRU, GRUConfig, RNN};
use candle_nn::{AdamW, Embedding, Linear, Optimizer, ParamsAdamW, VarBuilder};
use scopetree::candle::{AdamW as StoreAdamW, CandleStore};
use scopetree::checkpoint::LoadOptions;
use scopetree::ranks::{CandlePlan, Collective, PlanOptions};

#[path = "support/data_parallel.rs"]
mod data_parallel;
use data_parallel::{Transport, describe, digest, every_rank, micro_batches, micro_grads};

type Res<T> = Result<T, Box<dyn Error>>;

/// Command-line settings.
struct Args {
    epochs: usize,
    steps: usize,
    batch: usize,
    seq: usize,
    hidden: usize,
    embed: usize,
    lr: f64,
    seed: u64,
    save: Option<String>,
    resume: Option<String>,
    device: String,
    /// Steps of the store-against-VarMap check before training (0: none).
    parity: usize,
    /// Micro-batches per rank and step, their gradients averaged before
    /// the ranks': one process with `--accumulate 2` steps as 2 ranks do.
    accumulate: usize,
    /// Reduce over NCCL on the device (feature `nccl`) instead of MPI.
    nccl: bool,
}

impl Args {
    fn parse() -> Res<Self> {
        let mut a = Args {
            epochs: 6,
            steps: 40,
            batch: 32,
            seq: 48,
            hidden: 96,
            embed: 24,
            lr: 1e-2,
            seed: 7,
            save: None,
            resume: None,
            device: "cpu".to_owned(),
            parity: 0,
            accumulate: 1,
            nccl: false,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--epochs" => a.epochs = value()?.parse()?,
                "--steps" => a.steps = value()?.parse()?,
                "--batch" => a.batch = value()?.parse()?,
                "--seq" => a.seq = value()?.parse()?,
                "--hidden" => a.hidden = value()?.parse()?,
                "--lr" => a.lr = value()?.parse()?,
                "--seed" => a.seed = value()?.parse()?,
                "--save" => a.save = Some(value()?),
                "--resume" => a.resume = Some(value()?),
                "--device" => a.device = value()?,
                "--parity" => a.parity = value()?.parse()?,
                "--accumulate" => a.accumulate = value()?.parse()?,
                "--nccl" => a.nccl = true,
                "-h" | "--help" => {
                    println!(
                        "train_char_gru [--epochs N] [--steps N per epoch] [--batch N] [--seq N] \
                         [--hidden N] [--lr X] [--seed N] [--save PATH] [--resume PATH] \
                         [--device cpu|cuda] [--parity STEPS] [--accumulate MICRO-BATCHES] [--nccl]"
                    );
                    std::process::exit(0);
                }
                other => return Err(format!("unknown flag {other}; try --help").into()),
            }
        }
        if a.batch == 0 || a.seq == 0 || a.hidden == 0 || a.accumulate == 0 {
            return Err("--batch, --seq, --hidden and --accumulate must be positive".into());
        }
        Ok(a)
    }
}

/// SplitMix64: a small deterministic generator for batch offsets and
/// sampling (the example needs no `rand`).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// A number in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1_u64 << 53) as f64
    }
}

/// The text as character indices, and the alphabet.
struct Corpus {
    chars: Vec<char>,
    ids: Vec<u32>,
}

impl Corpus {
    fn new(text: &str) -> Self {
        let set: std::collections::BTreeSet<char> = text.chars().collect();
        let chars: Vec<char> = set.into_iter().collect();
        let index: BTreeMap<char, u32> = chars.iter().zip(0..).map(|(&c, i)| (c, i)).collect();
        let ids = text.chars().map(|c| index[&c]).collect();
        Corpus { chars, ids }
    }

    /// The entropy of the character distribution, in nats: the loss of the
    /// best model that ignores context.
    fn unigram_entropy(&self) -> f64 {
        let mut counts = vec![0_usize; self.chars.len()];
        for &i in &self.ids {
            counts[i as usize] += 1;
        }
        let n = self.ids.len() as f64;
        counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / n;
                -p * p.ln()
            })
            .sum()
    }
}

/// Inputs and next-character targets, `(batch, seq)` each, starting at
/// `starts` in `ids`.
fn batch(ids: &[u32], starts: &[usize], seq: usize, dev: &Device) -> Res<(Tensor, Tensor)> {
    let mut x = Vec::with_capacity(starts.len() * seq);
    let mut y = Vec::with_capacity(starts.len() * seq);
    for &s in starts {
        x.extend_from_slice(&ids[s..s + seq]);
        y.extend_from_slice(&ids[s + 1..s + seq + 1]);
    }
    Ok((
        Tensor::from_vec(x, (starts.len(), seq), dev)?,
        Tensor::from_vec(y, (starts.len() * seq,), dev)?,
    ))
}

/// Embedding → GRU → linear head.
struct CharGru {
    emb: Embedding,
    gru: GRU,
    out: Linear,
}

impl CharGru {
    fn new(vb: &VarBuilder<'_>, vocab: usize, embed: usize, hidden: usize) -> Res<Self> {
        Ok(CharGru {
            emb: candle_nn::embedding(vocab, embed, vb.pp("emb"))?,
            gru: candle_nn::rnn::gru(embed, hidden, GRUConfig::default(), vb.pp("gru"))?,
            out: candle_nn::linear(hidden, vocab, vb.pp("out"))?,
        })
    }

    /// Logits `(batch × seq, vocab)` for inputs `(batch, seq)`.
    fn logits(&self, x: &Tensor) -> Res<Tensor> {
        let e = self.emb.forward(x)?;
        let hs: Vec<Tensor> = self.gru.seq(&e)?.into_iter().map(|s| s.h).collect();
        let h = Tensor::stack(&hs, 1)?;
        let (b, t, d) = h.dims3()?;
        Ok(self.out.forward(&h.reshape((b * t, d))?)?)
    }

    fn loss(&self, x: &Tensor, y: &Tensor) -> Res<Tensor> {
        Ok(candle_nn::loss::cross_entropy(&self.logits(x)?, y)?)
    }

    /// `n` characters after `prompt`, sampled at temperature `temp`.
    fn sample(
        &self,
        corpus: &Corpus,
        prompt: &str,
        n: usize,
        temp: f64,
        rng: &mut SplitMix,
        dev: &Device,
    ) -> Res<String> {
        let index: BTreeMap<char, u32> =
            corpus.chars.iter().zip(0..).map(|(&c, i)| (c, i)).collect();
        let mut state = self.gru.zero_state(1)?;
        let mut out = String::from(prompt);
        let mut last = None;
        for c in prompt.chars() {
            let id = *index
                .get(&c)
                .ok_or_else(|| format!("{c:?} is not in the text"))?;
            let e = self.emb.forward(&Tensor::new(&[id], dev)?)?;
            state = self.gru.step(&e, &state)?;
            last = Some(state.h.clone());
        }
        let mut h = last.ok_or("empty prompt")?;
        for _ in 0..n {
            let logits = (self.out.forward(&h)?.squeeze(0)? / temp)?;
            let probs: Vec<f32> = candle_nn::ops::softmax(&logits, D::Minus1)?.to_vec1()?;
            let mut r = rng.unit() as f32;
            let mut pick = probs.len() - 1;
            for (i, p) in probs.iter().enumerate() {
                if r < *p {
                    pick = i;
                    break;
                }
                r -= p;
            }
            out.push(corpus.chars[pick]);
            let e = self.emb.forward(&Tensor::new(&[pick as u32], dev)?)?;
            state = self.gru.step(&e, &state)?;
            h = state.h.clone();
        }
        Ok(out)
    }
}

/// Replaces candle's random initial values with values drawn from `rng`
/// (uniform, with the variance of candle-nn's defaults), variable by
/// variable in name order.
fn seeded_init(store: &CandleStore, hidden: usize, rng: &mut SplitMix) -> Res<()> {
    for (name, var) in store.named_vars()? {
        let dims = var.dims().to_vec();
        let bound = match name.as_str() {
            // Randn(0, 1).
            "emb.weight" => 3_f64.sqrt(),
            // Zeros.
            "gru.bias_ih_l0" | "gru.bias_hh_l0" => 0.0,
            // Uniform ±1/√fan_in.
            "out.bias" => 1.0 / (hidden as f64).sqrt(),
            // Kaiming (uniform for the GRU, normal for the head): ±√(6/fan_in).
            _ => (6.0 / dims[dims.len() - 1] as f64).sqrt(),
        };
        let values: Vec<f32> = (0..var.elem_count())
            .map(|_| ((2.0 * rng.unit() - 1.0) * bound) as f32)
            .collect();
        var.set(&Tensor::from_vec(values, dims, var.device())?)?;
    }
    Ok(())
}

/// Where the optimizer state of the checkpoint `path` is saved.
fn optim_path(path: &str) -> String {
    format!("{path}.optim.safetensors")
}

/// The store with scopetree's AdamW against a `VarMap` with candle's, from
/// the same values on the same device, `a.parity` steps: bit for bit.
fn parity(
    store: &CandleStore,
    model: &CharGru,
    a: &Args,
    vocab: usize,
    train: &[u32],
    dev: &Device,
    params: ParamsAdamW,
) -> Res<()> {
    let map = VarMap::new();
    let map_model = CharGru::new(
        &VarBuilder::from_varmap(&map, DType::F32, dev),
        vocab,
        a.embed,
        a.hidden,
    )?;
    let mut named: Vec<(String, candle_core::Var)> = map
        .data()
        .lock()
        .map_err(|_| "lock")?
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    named.sort_by(|x, y| x.0.cmp(&y.0));
    // Both start from the store's values; the store's are put back after.
    let saved: Vec<(String, Tensor)> = store
        .named_vars()?
        .into_iter()
        .map(|(k, v)| (k, v.as_tensor().copy().expect("copy")))
        .collect();
    for (k, v) in &named {
        v.set(
            store
                .var(k)?
                .ok_or_else(|| format!("{k} missing"))?
                .as_tensor(),
        )?;
    }
    let mut opt_map = AdamW::new(
        named.iter().map(|(_, v)| v.clone()).collect(),
        params.clone(),
    )?;
    let mut opt = StoreAdamW::new(store.trainable_named_vars("")?, params)?;
    let mut rng = SplitMix(a.seed ^ 0xFACE);
    for _ in 0..a.parity {
        let starts: Vec<usize> = (0..a.batch)
            .map(|_| rng.below(train.len() - a.seq - 1))
            .collect();
        let (x, y) = batch(train, &starts, a.seq, dev)?;
        opt_map.backward_step(&map_model.loss(&x, &y)?)?;
        opt.backward_step(&model.loss(&x, &y)?)?;
    }
    let mut same = true;
    for (k, v) in &named {
        let ours = store.var(k)?.ok_or("missing")?;
        let (p, q): (Vec<f32>, Vec<f32>) =
            (v.flatten_all()?.to_vec1()?, ours.flatten_all()?.to_vec1()?);
        same &= p
            .iter()
            .map(|x| x.to_bits())
            .eq(q.iter().map(|x| x.to_bits()));
    }
    println!(
        "{} the store with scopetree's AdamW and VarMap with candle's AdamW, {} steps on {:?}",
        if same { "bit-identical:" } else { "DIFFERENT:" },
        a.parity,
        dev.location()
    );
    for (k, t) in saved {
        store.var(&k)?.ok_or("missing")?.set(&t)?;
    }
    if !same {
        return Err("the store and VarMap differ".into());
    }
    Ok(())
}

/// Mean loss over fixed, evenly spaced windows of `ids`.
fn eval_loss(model: &CharGru, ids: &[u32], a: &Args, dev: &Device) -> Res<f64> {
    let span = ids.len() - a.seq - 1;
    let starts: Vec<usize> = (0..a.batch).map(|i| i * span / a.batch).collect();
    let (x, y) = batch(ids, &starts, a.seq, dev)?;
    Ok(f64::from(model.loss(&x, &y)?.to_scalar::<f32>()?))
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
    let (rank, ranks) = (world.rank(), world.size());
    // This rank's share of every global batch, in micro-batches.
    let micro = micro_batches(a.batch, rank, ranks, a.accumulate)?;
    // Rank 0 prints.
    macro_rules! say {
        ($($t:tt)*) => { if rank == 0 { println!($($t)*); } };
    }
    let dev = match a.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::new_cuda(0).map_err(|e| {
            format!("--device cuda: {e} (build with --features cuda, on a machine with a GPU)")
        })?,
        other => return Err(format!("--device {other}: cpu or cuda").into()),
    };
    say!("device: {:?}", dev.location());
    let transport = Transport::new(a.nccl, world, &dev)?;
    say!("gradients reduced over {}", transport.name());
    let corpus = Corpus::new(lipsum::LIBER_PRIMUS);
    let vocab = corpus.chars.len();
    let split = corpus.ids.len() * 9 / 10;
    let (train, held_out) = corpus.ids.split_at(split);
    if a.seq + 2 > held_out.len() {
        return Err(format!(
            "--seq {} is too long: the held-out text has {} characters",
            a.seq,
            held_out.len()
        )
        .into());
    }
    let entropy = corpus.unigram_entropy();
    say!(
        "text: lipsum::LIBER_PRIMUS, {} characters, {vocab} distinct; training on {}, holding out {}",
        corpus.ids.len(),
        train.len(),
        held_out.len()
    );
    say!("unigram entropy: {entropy:.4} nats/char (the loss of a context-free model)");
    say!(
        "ranks: {ranks}; global batch {} windows, {} per rank in {} micro-batch(es)",
        a.batch,
        a.batch / ranks,
        a.accumulate
    );

    let store = CandleStore::new();
    if let Some(path) = &a.resume {
        let report = store.load_on(path, &LoadOptions::new().create(true), &dev)?;
        store.seal();
        say!(
            "resumed from {path}: {} tensors created, sealed",
            report.created.len()
        );
    }
    let vb = store.var_builder(DType::F32, &dev);
    let model = CharGru::new(&vb, vocab, a.embed, a.hidden)?;
    if a.resume.is_none() {
        seeded_init(&store, a.hidden, &mut SplitMix(a.seed ^ 0x5EED))?;
    }
    if a.resume.is_some() {
        let unused = store.unused()?;
        if !unused.is_empty() {
            say!("names in the checkpoint the model never asked for: {unused:?}");
        }
    }
    let names = store.names()?;
    let params: usize = store.all_vars()?.iter().map(|v| v.elem_count()).sum();
    say!(
        "model: {} tensors in the tree, {params} parameters: {}",
        names.len(),
        names.join(", ")
    );

    // Every rank starts from rank 0's values, and reduces the gradients of
    // the variables the optimizer steps.
    let mut plan = CandlePlan::new(world, &store, &PlanOptions::new())?;
    transport.broadcast(&mut plan, world)?;
    let params = ParamsAdamW {
        lr: a.lr,
        ..ParamsAdamW::default()
    };
    if a.parity > 0 {
        parity(&store, &model, &a, vocab, train, &dev, params.clone())?;
    }
    // scopetree's AdamW: candle's, step for step, with its moments and step
    // count in a store that `--save` writes beside the model and `--resume`
    // reads back, so a resumed run continues bit for bit.
    let named = store.trainable_named_vars("")?;
    let mut opt = StoreAdamW::new(named, params)?;
    if let Some(path) = &a.resume {
        let state = optim_path(path);
        if std::path::Path::new(&state).exists() {
            opt.state().load(&state, &LoadOptions::new())?;
            say!("optimizer state from {state}: step {}", opt.step_count()?);
        }
    }
    // Epochs already trained (a resumed run goes on where the saved one
    // stopped), so that epoch e draws the same batches in both.
    let done = usize::try_from(opt.step_count()?)? / a.steps.max(1);
    let mut rng = SplitMix(a.seed);
    let start = eval_loss(&model, held_out, &a, &dev)?;
    // Every rank takes part in the all-gather, rank 0 prints.
    let losses = every_rank(world, start)?;
    say!("epoch  0: held-out loss {}", describe(&losses));
    let mut last = start;
    let mut consistent = true;
    let vars = plan.vars().to_vec();
    for epoch in 1..=a.epochs {
        let t0 = Instant::now();
        let mut sum = 0.0;
        let mut rng =
            SplitMix(a.seed ^ ((done + epoch) as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        for _ in 0..a.steps {
            let starts: Vec<usize> = (0..a.batch)
                .map(|_| rng.below(train.len() - a.seq - 1))
                .collect();
            let (mut grads, loss) = micro_grads(&micro, &vars, |range| {
                let (x, y) = batch(train, &starts[range], a.seq, &dev)?;
                model.loss(&x, &y)
            })?;
            sum += loss;
            transport.all_reduce(&mut plan, world, &mut grads)?;
            opt.step(&grads)?;
        }
        // The training loss over the global batches: the mean of the ranks'.
        let mut total = [0.0];
        world.all_reduce_sum_f64(&[sum / a.steps.max(1) as f64], &mut total)?;
        plan.check_consistency(world)?;
        last = eval_loss(&model, held_out, &a, &dev)?;
        let losses = every_rank(world, last)?;
        consistent &= losses.iter().all(|l| l.to_bits() == last.to_bits());
        let secs = t0.elapsed().as_secs_f64();
        say!(
            "epoch {:2}: training loss {:.4}, held-out loss {} ({:.0} % of the unigram entropy), {secs:.1} s, {:.0} tokens/s",
            done + epoch,
            total[0] / ranks as f64,
            describe(&losses),
            100.0 * last / entropy,
            (a.steps * a.batch * a.seq) as f64 / secs
        );
    }
    say!("final held-out loss: {last}");
    let line = model.sample(&corpus, "Sed ut ", 100, 0.7, &mut rng, &dev)?;
    say!("sample: {line}");
    if let Some(path) = &a.save {
        if let Some(report) = plan.save_on_root(world, &store, path, 0)? {
            say!("saved {} tensors to {path}", report.keys.len());
        }
        if rank == 0 {
            let state = optim_path(path);
            opt.state().save(&state)?;
            say!(
                "saved the optimizer state (step {}) to {state}",
                opt.step_count()?
            );
        }
    }
    say!("parameters: digest {}", digest(&store)?);
    if !consistent {
        return Err("the held-out losses differ between ranks".into());
    }
    if last >= 0.8 * entropy {
        eprintln!(
            "held-out loss {last:.4} did not fall below 80 % of the unigram entropy ({:.4})",
            0.8 * entropy
        );
        std::process::exit(1);
    }
    Ok(())
}
