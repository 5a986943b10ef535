//! Trains a small Elman RNN with backpropagation through time on step scopes,
//! data-parallel on worker scopes, with handles resolved once and reused
//! every step. The task (generated from a seed): at every step, predict the
//! token seen 5 steps before (`--task echo`, or `echoN` for N steps), or the
//! running sum of the tokens so far modulo their number (`--task sum`).
//!
//! Each epoch prints the training loss and accuracy, the held-out accuracy,
//! the training speed in steps per second (one step = one time step of one
//! sequence, forward and backward) and the live scopes and variables of the
//! tree. See `docs/runtime.md`.
//!
//! Run with `cargo run --release --example train_rnn`, or with flags:
//! `-- --seq-len 20 --hidden 64 --epochs 10 --workers 2 --seed 7`
//! (also `--task`, `--tokens`, `--batch`, `--updates`, `--lr`, `--eval-seqs`).
//!
//! `--save PATH` writes the parameters and the optimiser state to a
//! safetensors checkpoint at the end (and after every N epochs with
//! `--save-every N`, atomically each time); `--resume PATH` loads one before
//! training (same model flags), and the run continues exactly where the
//! saved one stopped. The last line is a digest of the parameters and the
//! optimiser state: equal runs print equal digests.
//!
//! `--save-dir DIR` saves through a `ranks::CheckpointManager` instead:
//! one sub-directory per update count, a Hugging Face sharded checkpoint of
//! which every rank writes one shard, the `latest` pointer moved once it is
//! whole, and the last `--keep K` (3 by default) kept. `--resume DIR` loads
//! the latest complete one, at whatever number of ranks this run has, and
//! prints `resumed: parameters digest P, Adam moments digest M`, the same
//! at every number of ranks. `--epochs` counts the epochs after the resume.
//! `--async-save` writes the saves of `--save-every` beside training
//! (`ranks::AsyncSaver`): each rank copies its shard and a background
//! thread writes it while the next epoch runs.
//!
//! Across processes (feature `mpi`): `cargo build --release --features mpi
//! --example train_rnn`, then `mpirun -np 2 target/release/examples/train_rnn
//! --workers 1`. Each rank runs its `--workers` threads on its share of the
//! `--batch`; the gradients are summed over the ranks (see
//! `docs/ranks/training.md`), and after every epoch the ranks check that their
//! parameters are bit-identical. Rank 0 prints. Without `mpirun` (or without
//! the feature) the example is one process, as before.
//!
//! `--zero` partitions the optimiser state across the ranks (ZeRO stage 1):
//! each rank's tree holds the Adam moments of its own slice of the
//! parameters only, the gradients are reduce-scattered, each rank steps its
//! slice and the parameters are all-gathered. A `--save FILE` gathers the
//! whole moments to rank 0; `--save-dir` has each rank write its slice of
//! them as whole tensors under `optimizer.safetensors.index.json`, beside
//! the parameters' shards, with no gather. Both resume in either mode. The output
//! names the moments' bytes on every rank, and ends with digests of the
//! parameters and of the moments that the replicated mode prints too (and,
//! in the replicated mode only, the digest of the replicated state:
//! parameters, reduced gradients and optimiser state). Checkpoints leave
//! the gradients out (they are the plans' scratch, `PlanOptions::scratch`),
//! so both modes write the same file for the same state.
//!
//! `--timeout SECS` (600 by default, 0 for none) is the longest any
//! collective call may wait: a rank still waiting then (another rank
//! stalled or died) prints the call, the scope and the update it waited in,
//! and exits with status 3, which ends the `mpirun` job
//! (`scopetree::ranks::Watch`).

mod model;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use model::{Config, Task, Trainer};
use scopetree::ranks::{AsyncSaver, CheckpointManager, Collective};

const USAGE: &str = "usage: train_rnn [--seq-len N] [--hidden N] [--epochs N] [--workers N] \
[--seed N] [--task echo|echoN|sum] [--tokens N] [--batch N] [--updates N] [--lr X] [--eval-seqs N] \
[--save PATH | --save-dir DIR [--keep K] [--async-save]] [--save-every N] [--resume PATH|DIR] \
[--zero] [--timeout SECS]";

/// Checkpoint paths from `--save`, `--save-dir` and `--resume`, and
/// `--save-every` and `--keep`.
#[derive(Default)]
struct Checkpoints {
    save: Option<PathBuf>,
    save_dir: Option<PathBuf>,
    async_save: bool,
    keep: Option<usize>,
    every: Option<usize>,
    resume: Option<PathBuf>,
}

fn parse_args() -> Result<(Config, Checkpoints), String> {
    let mut cfg = Config::default();
    let mut ckpt = Checkpoints::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_owned());
        }
        if flag == "--zero" {
            cfg.zero = true;
            continue;
        }
        if flag == "--async-save" {
            ckpt.async_save = true;
            continue;
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let bad =
            |e: &dyn std::fmt::Display| format!("bad value {value:?} for {flag}: {e}\n{USAGE}");
        let int = || value.parse::<usize>().map_err(|e| bad(&e));
        match flag.as_str() {
            "--seq-len" => cfg.seq_len = int()?,
            "--hidden" => cfg.hidden = int()?,
            "--epochs" => cfg.epochs = int()?,
            "--workers" => cfg.workers = int()?,
            "--tokens" => cfg.tokens = int()?,
            "--task" => {
                cfg.task = match value.as_str() {
                    "sum" => Task::Sum,
                    "echo" => Task::Echo { delay: 5 },
                    _ => match value.strip_prefix("echo").and_then(|d| d.parse().ok()) {
                        Some(delay) if delay <= 7 => Task::Echo { delay },
                        _ => return Err(bad(&"expected sum, echo or echoN with N <= 7")),
                    },
                }
            }
            "--batch" => cfg.batch = int()?,
            "--updates" => cfg.updates_per_epoch = int()?,
            "--eval-seqs" => cfg.eval_seqs = int()?,
            "--seed" => cfg.seed = value.parse().map_err(|e| bad(&e))?,
            "--lr" => cfg.lr = value.parse().map_err(|e| bad(&e))?,
            "--save" => ckpt.save = Some(PathBuf::from(value)),
            "--save-dir" => ckpt.save_dir = Some(PathBuf::from(value)),
            "--keep" => ckpt.keep = Some(int()?),
            "--save-every" => ckpt.every = Some(int()?),
            "--resume" => ckpt.resume = Some(PathBuf::from(value)),
            "--timeout" => {
                let secs: f64 = value.parse().map_err(|e| bad(&e))?;
                cfg.timeout = match Duration::try_from_secs_f64(secs) {
                    Ok(Duration::ZERO) => None,
                    Ok(t) => Some(t),
                    Err(e) => return Err(bad(&e)),
                };
            }
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    let positive = [
        ("--seq-len", cfg.seq_len),
        ("--hidden", cfg.hidden),
        ("--workers", cfg.workers),
        ("--batch", cfg.batch),
        ("--updates", cfg.updates_per_epoch),
        ("--eval-seqs", cfg.eval_seqs),
    ];
    for (flag, v) in positive {
        if v == 0 {
            return Err(format!("{flag} must be at least 1\n{USAGE}"));
        }
    }
    if !(2..=256).contains(&cfg.tokens) {
        return Err(format!("--tokens must be in 2..=256\n{USAGE}"));
    }
    if cfg.workers > cfg.batch {
        return Err(format!(
            "--workers ({}) must not exceed --batch ({})\n{USAGE}",
            cfg.workers, cfg.batch
        ));
    }
    let saves = ckpt.save.is_some() || ckpt.save_dir.is_some();
    match (ckpt.every, saves) {
        (Some(0), _) => return Err(format!("--save-every must be at least 1\n{USAGE}")),
        (Some(_), false) => {
            return Err(format!(
                "--save-every needs --save PATH or --save-dir DIR\n{USAGE}"
            ));
        }
        _ => {}
    }
    if ckpt.save.is_some() && ckpt.save_dir.is_some() {
        return Err(format!(
            "give --save PATH or --save-dir DIR, not both\n{USAGE}"
        ));
    }
    if ckpt.async_save && ckpt.save_dir.is_none() {
        return Err(format!("--async-save needs --save-dir DIR\n{USAGE}"));
    }
    match (ckpt.keep, &ckpt.save_dir) {
        (Some(0), _) => return Err(format!("--keep must be at least 1\n{USAGE}")),
        (Some(_), None) => return Err(format!("--keep needs --save-dir DIR\n{USAGE}")),
        _ => {}
    }
    Ok((cfg, ckpt))
}

fn main() -> ExitCode {
    let (cfg, ckpt) = match parse_args() {
        Ok(parsed) => parsed,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    // With the feature, MPI starts here (a world of one without `mpirun`)
    // and ends when `universe` drops, after the run.
    #[cfg(feature = "mpi")]
    let (universe, world): (_, Box<dyn Collective>) = {
        let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
            eprintln!("error: MPI was already initialised");
            return ExitCode::FAILURE;
        };
        let world = universe.world();
        (universe, Box::new(world))
    };
    #[cfg(not(feature = "mpi"))]
    let world: Box<dyn Collective> = Box::new(scopetree::ranks::SingleProcess);
    let (rank, ranks) = (world.rank(), world.size());
    let code = match run(cfg, &ckpt, world) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if ranks > 1 => {
            // One write, so that the ranks' lines do not interleave.
            let line = format!("error on rank {rank}: {e}\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    };
    #[cfg(feature = "mpi")]
    drop(universe);
    code
}

fn run(cfg: Config, ckpt: &Checkpoints, world: Box<dyn Collective>) -> Result<(), model::Error> {
    // Every rank makes the same calls in the same order (the collective
    // ones inside the trainer); rank 0 prints.
    let (lead, ranks) = (world.rank() == 0, world.size());
    macro_rules! say {
        ($($arg:tt)*) => {
            if lead {
                println!($($arg)*);
            }
        };
    }
    // ` x 2 ranks` after the workers, across processes only.
    let per = if ranks > 1 {
        format!(" x {ranks} ranks")
    } else {
        String::new()
    };
    say!(
        "train_rnn: {task}, {k} tokens | seq len {T}, hidden {H}, batch {B}, {W} worker(s){per}, \
         {E} epochs x {U} updates, seed {S}{z} | chance {c:.1}%",
        task = match cfg.task {
            Task::Echo { delay } => format!("echo the token seen {delay} steps before"),
            Task::Sum => format!("running sum mod {}", cfg.tokens),
        },
        k = cfg.tokens,
        T = cfg.seq_len,
        H = cfg.hidden,
        B = cfg.batch,
        W = cfg.workers,
        E = cfg.epochs,
        U = cfg.updates_per_epoch,
        S = cfg.seed,
        z = if cfg.zero { " | zero" } else { "" },
        c = 100.0 / cfg.tokens as f64,
    );
    let mut trainer = Trainer::with_world(cfg.clone(), world)?;
    let per_rank = trainer.moment_bytes_per_rank()?;
    say!(
        "optimiser state (Adam moments) per rank: {} bytes{}",
        per_rank
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        if cfg.zero {
            " (partitioned, --zero)"
        } else {
            " (replicated)"
        }
    );
    let mut saver = AsyncSaver::new();
    let manager = match &ckpt.save_dir {
        Some(dir) => Some(CheckpointManager::new(dir, ckpt.keep.unwrap_or(3))?),
        None => None,
    };
    if let Some(path) = &ckpt.resume {
        let from = if path.is_dir() {
            let dir = trainer.resume_latest(path)?;
            format!("{} (latest complete: {})", path.display(), dir.display())
        } else {
            trainer.resume(path)?;
            path.display().to_string()
        };
        say!("resumed from {from} after {} updates", trainer.updates());
        // Collective calls: the moments are gathered under --zero.
        let moments = trainer.moments_digest()?;
        say!(
            "resumed: parameters digest {}, Adam moments digest {moments}",
            trainer.params_digest()?
        );
    }
    let mut train_secs = 0.0;
    let mut steps_done = 0usize;
    let mut last_acc = 0.0;
    for epoch in 1..=cfg.epochs {
        let start = Instant::now();
        let mut stats = model::Stats::default();
        for _ in 0..cfg.updates_per_epoch {
            let s = trainer.train_update()?;
            stats.loss += s.loss;
            stats.correct += s.correct;
            stats.tokens += s.tokens;
        }
        let stats = trainer.global_stats(stats)?;
        let secs = start.elapsed().as_secs_f64();
        let steps = cfg.updates_per_epoch * trainer.steps_per_update();
        train_secs += secs;
        steps_done += steps;
        let eval = trainer.evaluate()?;
        trainer.check_consistency()?;
        last_acc = eval.accuracy();
        say!(
            "epoch {epoch:>3}/{E}  loss {l:.4}  train acc {ta:5.1}%  held-out acc {ea:5.1}%  \
             {sps:>8.0} steps/s  tree: {sc} scopes, {vc} vars",
            E = cfg.epochs,
            l = stats.mean_loss(),
            ta = 100.0 * stats.accuracy(),
            ea = 100.0 * last_acc,
            sps = steps as f64 / secs,
            sc = trainer.tree.scope_count(),
            vc = trainer.tree.var_count(),
        );
        if let Some(every) = ckpt.every {
            if epoch % every == 0 && epoch < cfg.epochs {
                if let Some(path) = &ckpt.save {
                    trainer.save(path)?;
                    say!("saved after epoch {epoch} to {}", path.display());
                }
                if let Some(manager) = &manager {
                    if ckpt.async_save {
                        let dir = trainer.save_managed_async(manager, &mut saver)?;
                        say!(
                            "saving after epoch {epoch} to {} beside training",
                            dir.display()
                        );
                    } else {
                        let dir = trainer.save_managed(manager)?;
                        say!("saved after epoch {epoch} to {}", dir.display());
                    }
                }
            }
        }
    }
    say!(
        "final: held-out accuracy {a:.1}% (chance {c:.1}%) on {n} unseen sequences; \
         {sps:.0} steps/s over {s} training steps with {w} worker(s){per}",
        a = 100.0 * last_acc,
        c = 100.0 / cfg.tokens as f64,
        n = cfg.eval_seqs,
        sps = steps_done as f64 / train_secs.max(1e-9),
        s = steps_done,
        w = cfg.workers,
    );
    if let Some(path) = &ckpt.save {
        trainer.save(path)?;
        say!(
            "saved parameters and optimiser state after {} updates to {}",
            trainer.updates(),
            path.display()
        );
    }
    // The last save beside training, finished before the final one.
    trainer.finish_save(&mut saver)?;
    if let Some(manager) = &manager {
        let dir = trainer.save_managed(manager)?;
        say!(
            "saved parameters and optimiser state after {} updates to {}, every rank writing a shard",
            trainer.updates(),
            dir.display()
        );
    }
    // Collective calls: every rank makes them, rank 0 prints.
    let moments = trainer.moments_digest()?;
    say!("parameters: digest {}", trainer.params_digest()?);
    say!("Adam moments: digest {moments}");
    if !cfg.zero {
        // The ZeRO mode's gradients outside a rank's slice are that rank's
        // own: this digest (of the replicated state, gradients included) is
        // the replicated mode's only.
        say!(
            "parameters and optimiser state: digest {}",
            trainer.state_digest()?
        );
    }
    Ok(())
}
