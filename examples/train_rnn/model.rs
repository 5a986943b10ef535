//! The model of `examples/train_rnn`: an Elman RNN in plain `f32` vectors,
//! trained with backpropagation through time on step scopes, data-parallel on
//! worker scopes. Shared with `tests/train_rnn.rs` through `#[path]`.
//!
//! The task, generated from a seed: read a sequence of random tokens `0..k`
//! and, at every step, predict the token seen `delay` steps before (`Echo`,
//! the default) or the running sum of the tokens so far modulo `k` (`Sum`).
//! Chance is `1/k`.
//!
//! The tree while training with two workers (`k` = tokens, `B` = sequences
//! per worker, `H` = hidden size; every value is a `Vec<f32>`):
//!
//! ```text
//! <root>        Wxh [H×k] Whh [H×H] bh [H] Why [k×H] by [k]   parameters
//! ├─ optim      <param>@GRAD  <param>@M  <param>@V  step      reduced gradients, Adam moments, updates done
//! ├─ worker_0   <param>@GRAD  h0 [B×H]  dh_next  dh            the worker's gradients and scratch
//! │  ├─ #step 0   x [B×k] y [B×k] h [B×H] p [B×k]             one scope per time step
//! │  └─ …         (T step scopes, recycled every batch)
//! ├─ worker_1   …
//! └─ eval       h0; two ping-pong step scopes (x y h p)
//! ```
//!
//! Across processes (`Trainer::with_world`, one rank per process, each with
//! its own tree as above): the batch is split between every worker of every
//! rank; after the workers, each rank's summed gradients (`optim/*@GRAD`)
//! are all-reduced over the ranks, and every rank takes the same Adam step.
//! Rank 0's parameters and optimiser state are broadcast at the start, and
//! checkpoints are saved by rank 0 and loaded by every rank.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use scopetree::checkpoint::SaveOptions;
use scopetree::ranks::{
    self, AsyncSaver, CheckpointManager, Collective, PlanOptions, Reduce, SingleProcess,
    SlicedState, SyncPlan, Watch,
};
use scopetree::{ScopeId, ScopeTree, StepScopes, StepVar, VarId, WorkerScope};

/// The trainer's error: whichever layer failed (the tree's `Error`, the step
/// scopes' `StepError`, the worker split's `WorkerError`, a checkpoint's
/// `checkpoint::Error`).
pub type Error = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The state every rank holds alike in the replicated mode: the parameters
/// (the root's variables) and everything under `optim` (reduced gradients,
/// Adam moments, the update count), not the workers' and evaluation's
/// scratch, so a run can resume with another number of workers.
fn replicated_key(key: &str) -> bool {
    !key.contains('/') || key.starts_with("optim/")
}

/// The keys a checkpoint holds: the replicated state less the gradients
/// (see [`gradient_key`]).
fn checkpoint_key(key: &str) -> bool {
    replicated_key(key) && !gradient_key(key)
}

/// The reduced gradients `optim/<param>@GRAD`: scratch of one update that a
/// plan synchronises but no checkpoint holds. Under ZeRO each rank holds
/// partly reduced sums there, so a checkpoint with them would differ
/// between the modes and the numbers of ranks for the same state.
fn gradient_key(key: &str) -> bool {
    key.ends_with("@GRAD")
}

/// A piece of one parameter's Adam moments: its first element in the
/// parameter, then `m` and `v`.
pub type MomentPiece = (usize, Vec<f32>, Vec<f32>);

/// The parameters: the root's own variables.
fn param_key(key: &str) -> bool {
    !key.contains('/')
}

/// The Adam moments, under `optim`.
fn moment_key(key: &str) -> bool {
    key.starts_with("optim/") && (key.ends_with("@M") || key.ends_with("@V"))
}

/// Watches an all-reduce of `of` made straight on `world` (not through a
/// plan) with the plans' `timeout`, until the guard drops.
fn watch(world: &dyn Collective, of: &str, timeout: Option<Duration>) -> Watch {
    Watch::arm(world.rank(), "all-reduce", &Arc::from(of), timeout)
}

/// The plans' options: `cfg`'s timeout.
fn plan_options(cfg: &Config) -> PlanOptions {
    match cfg.timeout {
        Some(t) => PlanOptions::new().timeout(t),
        None => PlanOptions::new().without_timeout(),
    }
}

/// The piece of each parameter (in `PARAMS` order) whose Adam step `rank`
/// takes: its slice of the gradients' partition with `zero`, else the whole
/// parameter. The parameters' plan must cut the same way.
fn shards(
    grad_plan: &SyncPlan,
    param_plan: &SyncPlan,
    rank: usize,
    zero: bool,
) -> Result<[(usize, usize); 5], Error> {
    if grad_plan.partition() != param_plan.partition() {
        return Err(
            "the gradients and the parameters are partitioned differently; \
                    give them the same names, dtypes and shapes"
                .into(),
        );
    }
    let entries = grad_plan.manifest().entries();
    let mut out = [(0, 0); 5];
    for (i, name) in PARAMS.iter().enumerate() {
        let key = format!("{name}@GRAD");
        let at = entries
            .iter()
            .position(|e| e.key == key)
            .ok_or_else(|| format!("no gradient `optim/{key}` in the plan"))?;
        out[i] = if zero {
            grad_plan
                .partition()
                .piece_of(rank, at)
                .map_or((0, 0), |p| (p.start, p.len))
        } else {
            (0, entries[at].shape.iter().product())
        };
    }
    Ok(out)
}

/// Training settings (the example's flags).
#[derive(Clone, Debug)]
pub struct Config {
    /// Time steps per sequence (T).
    pub seq_len: usize,
    /// Hidden units (H).
    pub hidden: usize,
    /// The task.
    pub task: Task,
    /// Number of distinct tokens (k); also the modulus of the running sum.
    pub tokens: usize,
    /// Epochs.
    pub epochs: usize,
    /// Parameter updates per epoch.
    pub updates_per_epoch: usize,
    /// Sequences per update, split between the workers.
    pub batch: usize,
    /// Worker threads (worker scopes).
    pub workers: usize,
    /// Adam learning rate.
    pub lr: f32,
    /// Seed of every random draw.
    pub seed: u64,
    /// Held-out sequences evaluated after each epoch.
    pub eval_seqs: usize,
    /// ZeRO stage 1: each rank keeps the Adam moments of its own slice of
    /// the parameters only (`ranks::Partition`), the gradients are
    /// reduce-scattered and the parameters all-gathered.
    pub zero: bool,
    /// The longest any collective call may wait (`--timeout`; `None`: no
    /// limit): past it, the watchdog ends the process (`ranks::Watch`).
    pub timeout: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seq_len: 20,
            hidden: 64,
            task: Task::Echo { delay: 5 },
            tokens: 10,
            epochs: 10,
            updates_per_epoch: 50,
            batch: 32,
            workers: 2,
            lr: 0.01,
            seed: 7,
            eval_seqs: 512,
            zero: false,
            timeout: Some(ranks::DEFAULT_TIMEOUT),
        }
    }
}

/// What the network learns to predict at every step.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Task {
    /// The token seen `delay` steps ago (steps before that are not scored).
    Echo {
        /// How far back, at most 7.
        delay: usize,
    },
    /// The running sum of the tokens so far, modulo the number of tokens.
    Sum,
}

impl Task {
    /// Feeds `tok` to a sequence's `state` and returns the target of this
    /// step, if it is scored. `state` starts at 0 for every sequence.
    pub fn advance(self, state: &mut u64, t: usize, tok: usize, k: usize) -> Option<usize> {
        match self {
            Task::Sum => {
                *state = (*state + tok as u64) % k as u64;
                Some(*state as usize)
            }
            Task::Echo { delay } => {
                let old = (*state >> (8 * delay)) & 0xff;
                *state = ((*state << 8) | tok as u64) & (u64::MAX >> (8 * (7 - delay)));
                (t >= delay).then_some(old as usize)
            }
        }
    }
}

/// SplitMix64: a tiny seeded generator, enough for initial weights and data.
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for `stream` (0: training data, 1: held-out data, 2:
    /// weights) and `id` (a sequence number) under `seed`.
    pub fn new(seed: u64, stream: u64, id: u64) -> Self {
        let mut g = SplitMix64(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        g.0 ^= g.next_u64() ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        g
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A draw from `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }

    /// A draw from `[-a, a)`.
    pub fn uniform(&mut self, a: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * a
    }
}

/// Names and shapes (rows, cols) of the parameters.
const PARAMS: [&str; 5] = ["Wxh", "Whh", "bh", "Why", "by"];

fn param_shapes(h: usize, k: usize) -> [(usize, usize); 5] {
    [(h, k), (h, h), (h, 1), (k, h), (k, 1)]
}

/// The per-step variables, resolved once.
#[derive(Copy, Clone, Debug)]
pub struct StepNames {
    /// Inputs, one-hot `[B×k]`.
    pub x: StepVar,
    /// Targets, one-hot `[B×k]`.
    pub y: StepVar,
    /// Hidden state `[B×H]`.
    pub h: StepVar,
    /// Output probabilities `[B×k]`.
    pub p: StepVar,
}

impl StepNames {
    fn declare(steps: &mut StepScopes, tree: &mut ScopeTree) -> Result<Self, Error> {
        Ok(StepNames {
            x: steps.declare(tree, "x")?,
            y: steps.declare(tree, "y")?,
            h: steps.declare(tree, "h")?,
            p: steps.declare(tree, "p")?,
        })
    }

    /// The step variables with their sizes for a batch of `b`.
    fn sized(&self, b: usize, h: usize, k: usize) -> [(StepVar, usize); 4] {
        [
            (self.x, b * k),
            (self.y, b * k),
            (self.h, b * h),
            (self.p, b * k),
        ]
    }
}

/// One worker: its scope, its step scopes and the handles it uses.
pub struct Worker {
    /// The worker's scope (a kid of the root).
    pub scope: ScopeId,
    /// One scope per time step, under `scope`.
    pub steps: StepScopes,
    /// The step variables.
    pub names: StepNames,
    /// Gradients of the parameters, in the worker's scope.
    grads: [VarId; 5],
    h0: VarId,
    dh_next: VarId,
    dh: VarId,
    /// Sequences per batch for this worker, and the first one's index in the batch.
    batch: usize,
    offset: usize,
}

/// The held-out evaluation: forward only, on two ping-pong step scopes.
pub struct Eval {
    /// Ping-pong step scopes under the `eval` scope.
    pub steps: StepScopes,
    /// The step variables.
    pub names: StepNames,
    h0: VarId,
    rngs: Vec<SplitMix64>,
    states: Vec<u64>,
}

/// Loss and accuracy over some tokens.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Summed cross-entropy.
    pub loss: f64,
    /// Tokens predicted right.
    pub correct: usize,
    /// Tokens seen.
    pub tokens: usize,
}

impl Stats {
    fn add(&mut self, o: Stats) {
        self.loss += o.loss;
        self.correct += o.correct;
        self.tokens += o.tokens;
    }

    /// Mean loss per token.
    pub fn mean_loss(&self) -> f64 {
        self.loss / self.tokens.max(1) as f64
    }

    /// Fraction of tokens predicted right.
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.tokens.max(1) as f64
    }
}

/// The model, its optimiser state, the workers and the evaluation, all in one
/// tree.
pub struct Trainer {
    /// Settings.
    pub cfg: Config,
    /// The variable store.
    pub tree: ScopeTree,
    /// The parameters, in the root scope.
    pub params: [VarId; 5],
    /// The workers.
    pub workers: Vec<Worker>,
    /// The held-out evaluation.
    pub eval: Eval,
    worker_scopes: Vec<ScopeId>,
    grads: [VarId; 5],
    /// `optim/<param>@M` and `@V`: absent for a parameter of which this rank
    /// owns no piece (ZeRO), and as long as the piece otherwise.
    adam_m: [Option<VarId>; 5],
    adam_v: [Option<VarId>; 5],
    /// The piece of each parameter whose Adam step this rank takes (first
    /// element, length): the whole parameter unless `cfg.zero`.
    shard: [(usize, usize); 5],
    /// The `optim` scope.
    optim: ScopeId,
    /// `optim/step`: the number of updates done, as a one-element `Vec<u64>`
    /// (kept in step with `updates` at every save and resume).
    step: VarId,
    updates: u64,
    /// The ranks (a world of one for a single process).
    world: Box<dyn Collective>,
    /// `optim/*@GRAD`, all-reduced after every update.
    grad_plan: SyncPlan,
    /// The parameters and the optimiser state (the checkpoint's keys):
    /// broadcast at the start, checked for consistency, saved and loaded.
    /// With `cfg.zero`, the parameters and `optim/step` only (the ranks'
    /// moments differ); saves and loads then gather the moments first.
    state_plan: SyncPlan,
    /// The parameters: all-gathered after each step with `cfg.zero`.
    param_plan: SyncPlan,
}

/// The parameter values as a worker or the evaluation reads them.
struct Weights<'a> {
    wxh: &'a [f32],
    whh: &'a [f32],
    bh: &'a [f32],
    why: &'a [f32],
    by: &'a [f32],
}

fn var_array(tree: &mut ScopeTree, scope: ScopeId, suffix: &str) -> Result<[VarId; 5], Error> {
    let mut out = Vec::with_capacity(5);
    for name in PARAMS {
        out.push(tree.create_var(scope, format!("{name}{suffix}"))?);
    }
    Ok([out[0], out[1], out[2], out[3], out[4]])
}

impl Trainer {
    /// Builds the tree: parameters (seeded Xavier-uniform), optimiser state,
    /// one worker scope per worker, the evaluation scope.
    ///
    /// # Errors
    /// Only on a bug in the model code (a tree misuse).
    // The tests build their trainers with it; the example goes through
    // `with_world`, one process being a world of one.
    #[allow(dead_code)]
    pub fn new(cfg: Config) -> Result<Self, Error> {
        Self::with_world(cfg, Box::new(SingleProcess))
    }

    /// [`new`](Self::new) as one rank of `world`: the batch is split between
    /// the `workers` of every rank (sequence by sequence, rank after rank),
    /// the gradients are summed over the ranks, and every rank starts from
    /// rank 0's parameters. A collective call: every rank makes it.
    ///
    /// # Errors
    /// When the batch has fewer sequences than the ranks have workers in
    /// all (on every rank), or when the ranks build different models.
    pub fn with_world(cfg: Config, world: Box<dyn Collective>) -> Result<Self, Error> {
        let (h, k) = (cfg.hidden, cfg.tokens);
        let (ranks, rank) = (world.size(), world.rank());
        let n = cfg.workers.max(1);
        if n * ranks > cfg.batch {
            return Err(format!(
                "{ranks} rank(s) x {n} worker(s) exceed the batch of {} sequences; \
                 give every worker at least one sequence (--batch)",
                cfg.batch
            )
            .into());
        }
        let mut tree = ScopeTree::new();
        let root = tree.root();
        let params = var_array(&mut tree, root, "")?;
        let mut rng = SplitMix64::new(cfg.seed, 2, 0);
        for (&p, (rows, cols)) in params.iter().zip(param_shapes(h, k)) {
            let a = if cols == 1 {
                0.0
            } else {
                (6.0 / (rows + cols) as f32).sqrt()
            };
            let v: Vec<f32> = (0..rows * cols).map(|_| rng.uniform(a)).collect();
            tree.set(p, v)?;
        }
        let optim = tree.new_named_scope(root, "optim")?;
        let grads = var_array(&mut tree, optim, "@GRAD")?;
        for (&v, (rows, cols)) in grads.iter().zip(param_shapes(h, k)) {
            tree.set(v, vec![0.0_f32; rows * cols])?;
        }
        let step = tree.create_var(optim, "step")?;
        tree.set(step, vec![0_u64])?;

        // Worker `i` of rank `r` is worker `r * n + i` of all of them.
        let all = n * ranks;
        let share = |g: usize| cfg.batch / all + usize::from(g < cfg.batch % all);
        let mut workers = Vec::with_capacity(n);
        let mut offset: usize = (0..rank * n).map(share).sum();
        for i in 0..n {
            let batch = share(rank * n + i);
            let scope = tree.new_named_scope(root, format!("worker_{i}"))?;
            let wgrads = var_array(&mut tree, scope, "@GRAD")?;
            let h0 = tree.create_var(scope, "h0")?;
            tree.set(h0, vec![0.0_f32; batch * h])?;
            let dh_next = tree.create_var(scope, "dh_next")?;
            tree.set(dh_next, vec![0.0_f32; batch * h])?;
            let dh = tree.create_var(scope, "dh")?;
            tree.set(dh, vec![0.0_f32; batch * h])?;
            for (&g, (rows, cols)) in wgrads.iter().zip(param_shapes(h, k)) {
                tree.set(g, vec![0.0_f32; rows * cols])?;
            }
            let mut steps = StepScopes::new(&tree, scope)?;
            let names = StepNames::declare(&mut steps, &mut tree)?;
            workers.push(Worker {
                scope,
                steps,
                names,
                grads: wgrads,
                h0,
                dh_next,
                dh,
                batch,
                offset,
            });
            offset += batch;
        }

        let eval_scope = tree.new_named_scope(root, "eval")?;
        let mut steps = StepScopes::ping_pong(&tree, eval_scope)?;
        let names = StepNames::declare(&mut steps, &mut tree)?;
        let h0 = tree.create_var(eval_scope, "h0")?;
        tree.set(h0, vec![0.0_f32; cfg.eval_seqs * h])?;
        let eval = Eval {
            steps,
            names,
            h0,
            rngs: Vec::with_capacity(cfg.eval_seqs),
            states: Vec::with_capacity(cfg.eval_seqs),
        };

        let worker_scopes = workers.iter().map(|w| w.scope).collect();
        let grad_plan = SyncPlan::new(
            &*world,
            &tree,
            optim,
            &plan_options(&cfg).filter(|key| key.ends_with("@GRAD")),
        )?;
        let param_plan =
            SyncPlan::new(&*world, &tree, root, &plan_options(&cfg).filter(param_key))?;
        let shard = shards(&grad_plan, &param_plan, rank, cfg.zero)?;
        // The Adam moments, of this rank's pieces only.
        let (mut adam_m, mut adam_v) = ([None; 5], [None; 5]);
        for (i, &(_, len)) in shard.iter().enumerate().filter(|(_, s)| s.1 > 0) {
            for (set, suffix) in [(&mut adam_m, "@M"), (&mut adam_v, "@V")] {
                let v = tree.create_var(optim, format!("{}{suffix}", PARAMS[i]))?;
                tree.set(v, vec![0.0_f32; len])?;
                set[i] = Some(v);
            }
        }
        let state_key: fn(&str) -> bool = if cfg.zero {
            |key| param_key(key) || key == "optim/step"
        } else {
            replicated_key
        };
        let mut state_opts = plan_options(&cfg).filter(state_key).scratch(gradient_key);
        if cfg.zero {
            // The moments, sliced as the gradients are: distributed saves
            // write each rank's slice, whole tensors under their own index.
            let moments = SlicedState::new(optim, ["@M", "@V"]).of(param_key);
            state_opts = state_opts.sliced_state(moments);
        }
        let mut state_plan = SyncPlan::new(&*world, &tree, root, &state_opts)?;
        if cfg.zero && state_plan.state_partition() != Some(grad_plan.partition()) {
            return Err("the moments are partitioned unlike the gradients".into());
        }
        state_plan.broadcast(&*world, &mut tree, 0)?;
        Ok(Trainer {
            cfg,
            tree,
            params,
            workers,
            eval,
            worker_scopes,
            grads,
            adam_m,
            adam_v,
            shard,
            optim,
            step,
            updates: 0,
            world,
            grad_plan,
            state_plan,
            param_plan,
        })
    }

    /// `stats` summed over the ranks (a collective call).
    ///
    /// # Errors
    /// Only on a misuse of the collective (a bug).
    pub fn global_stats(&self, stats: Stats) -> Result<Stats, ranks::Error> {
        let mine = [stats.loss, stats.correct as f64, stats.tokens as f64];
        let mut all = [0.0_f64; 3];
        let _watch = watch(&*self.world, "the loss and accuracy", self.cfg.timeout);
        self.world.all_reduce_sum_f64(&mine, &mut all)?;
        Ok(Stats {
            loss: all[0],
            correct: all[1] as usize,
            tokens: all[2] as usize,
        })
    }

    /// Checks that every rank holds bit-identical parameters and optimiser
    /// state (a collective call).
    ///
    /// # Errors
    /// `ranks::Error::Diverged` naming the first variable that differs.
    pub fn check_consistency(&mut self) -> Result<(), ranks::Error> {
        self.state_plan.check_consistency(&*self.world, &self.tree)
    }

    /// A 128-bit digest of the parameters and optimiser state, as hex: equal
    /// runs print equal digests.
    ///
    /// # Errors
    /// Only on a bug in the model code (a tree misuse).
    pub fn state_digest(&mut self) -> Result<String, ranks::Error> {
        let d = self.state_plan.digest(&self.tree)?;
        Ok(d.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Updates done so far (including those before a resume).
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// Saves the parameters and the optimiser state (Adam moments, the
    /// update count) to a safetensors file: rank 0 writes it, atomically,
    /// and every rank returns once it is whole (a collective call).
    ///
    /// # Errors
    /// When the file cannot be written (on every rank).
    ///
    /// With `cfg.zero` the file is the same: every rank's moments are first
    /// gathered into whole `@M`/`@V` variables on every rank (a collective
    /// call), rank 0 saves, and each rank then keeps its own pieces again.
    pub fn save(&mut self, path: &Path) -> Result<(), Error> {
        self.tree.set(self.step, vec![self.updates])?;
        if !self.cfg.zero {
            self.state_plan
                .save_on_root(&*self.world, &self.tree, path, 0, &SaveOptions::new())?;
            return Ok(());
        }
        self.with_whole_moments(|t| {
            let full = t.checkpoint_plan()?;
            full.save_on_root(&*t.world, &t.tree, path, 0, &SaveOptions::new())?;
            Ok(())
        })
    }

    /// A plan of every variable a checkpoint holds (the parameters and the
    /// optimiser state, whole), for the ZeRO mode's saves and loads while
    /// the moments are gathered (see [`with_whole_moments`](Self::with_whole_moments)).
    /// A collective call.
    fn checkpoint_plan(&self) -> Result<SyncPlan, ranks::Error> {
        SyncPlan::new(
            &*self.world,
            &self.tree,
            self.tree.root(),
            &plan_options(&self.cfg).filter(checkpoint_key),
        )
    }

    /// Saves the parameters and the optimiser state through `manager`,
    /// under the update count: every rank writes one shard of a Hugging
    /// Face sharded checkpoint (`SyncPlan::save_shards`), and the manager
    /// points `latest` at it once it is whole. Returns its directory. A
    /// collective call.
    ///
    /// # Errors
    /// When a shard, the index or the pointer cannot be written (on every
    /// rank); the previous checkpoint stays the latest.
    ///
    /// With `cfg.zero` each rank's slice of the moments goes into the
    /// moments' own shards (`optimizer-*.safetensors`), only the pieces of
    /// the tensors two slices split moving between ranks; either mode
    /// resumes from either layout.
    pub fn save_managed(&mut self, manager: &CheckpointManager) -> Result<PathBuf, Error> {
        self.tree.set(self.step, vec![self.updates])?;
        let step = self.updates;
        manager.save(
            &*self.world,
            &mut self.state_plan,
            &self.tree,
            step,
            &SaveOptions::new(),
        )?;
        Ok(manager.step_dir(step))
    }

    /// [`save_managed`](Self::save_managed) beside training: copies this
    /// rank's shard into `saver`'s staging buffers and returns while a
    /// background thread writes it; the next save or
    /// `saver.wait(world)` finishes it (the index, the pointer). Returns the
    /// step directory it will be. A collective call.
    ///
    /// # Errors
    /// The previous save's failure, or this one's checks, on every rank.
    pub fn save_managed_async(
        &mut self,
        manager: &CheckpointManager,
        saver: &mut AsyncSaver,
    ) -> Result<PathBuf, Error> {
        self.tree.set(self.step, vec![self.updates])?;
        let step = self.updates;
        saver.save_managed(
            &*self.world,
            manager,
            &mut self.state_plan,
            &self.tree,
            step,
            &SaveOptions::new(),
        )?;
        Ok(manager.step_dir(step))
    }

    /// Finishes `saver`'s save under way, if any (a collective call).
    ///
    /// # Errors
    /// When a rank could not write its shard, on every rank.
    pub fn finish_save(&mut self, saver: &mut AsyncSaver) -> Result<(), Error> {
        saver.wait(&*self.world)?;
        Ok(())
    }

    /// Loads the latest complete checkpoint of the manager's directory
    /// `dir`, at this run's number of ranks, each rank reading a share
    /// (`SyncPlan::load_shards`). Returns its directory. A collective call.
    ///
    /// # Errors
    /// When `dir` holds no complete checkpoint, or it cannot be read or
    /// does not match this model (then nothing changed), on every rank.
    pub fn resume_latest(&mut self, dir: &Path) -> Result<PathBuf, Error> {
        let manager = CheckpointManager::new(dir, 1)?;
        let found = manager.load_latest(&*self.world, &mut self.state_plan, &mut self.tree)?;
        let Some((step, _)) = found else {
            return Err(format!("{} holds no complete checkpoint", dir.display()).into());
        };
        // The load checked that `step` holds exactly one element.
        self.updates = self.tree.get::<Vec<u64>>(self.step)?[0];
        Ok(manager.step_dir(step))
    }

    /// Runs `f` while every rank holds the whole Adam moments: each rank's
    /// pieces are all-gathered into whole `optim/<param>@M` and `@V`
    /// variables (created where missing), and cut back to this rank's pieces
    /// afterwards (the variables of other ranks' slices removed), whatever
    /// `f` returned. A collective call; only with `cfg.zero`.
    fn with_whole_moments<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let sizes = param_shapes(self.cfg.hidden, self.cfg.tokens).map(|(r, c)| r * c);
        for i in 0..5 {
            let (s, n) = self.shard[i];
            for (set, suffix) in [(&mut self.adam_m, "@M"), (&mut self.adam_v, "@V")] {
                let mut whole = vec![0.0_f32; sizes[i]];
                match set[i] {
                    Some(v) => whole[s..s + n].copy_from_slice(self.tree.get::<Vec<f32>>(v)?),
                    None => {
                        set[i] = Some(
                            self.tree
                                .create_var(self.optim, format!("{}{suffix}", PARAMS[i]))?,
                        );
                    }
                }
                self.tree.set(set[i].ok_or("a moment variable")?, whole)?;
            }
        }
        let gathered = (|| -> Result<(), Error> {
            for suffix in ["@M", "@V"] {
                let mut plan = SyncPlan::new(
                    &*self.world,
                    &self.tree,
                    self.optim,
                    &plan_options(&self.cfg).filter(move |k| k.ends_with(suffix)),
                )?;
                if plan.partition() != self.grad_plan.partition() {
                    return Err("the moments are partitioned unlike the gradients".into());
                }
                plan.all_gather(&*self.world, &mut self.tree)?;
            }
            Ok(())
        })();
        let out = gathered.and_then(|()| f(self));
        for i in 0..5 {
            let (s, n) = self.shard[i];
            for set in [&mut self.adam_m, &mut self.adam_v] {
                let Some(v) = set[i] else { continue };
                if n == 0 {
                    self.tree.remove_var(v)?;
                    set[i] = None;
                } else {
                    let piece = self.tree.get::<Vec<f32>>(v)?[s..s + n].to_vec();
                    self.tree.set(v, piece)?;
                }
            }
        }
        out
    }

    /// The bytes of the Adam moments this rank's tree holds (every
    /// `optim/*@M` and `*@V` variable, whole or piece).
    ///
    /// # Errors
    /// Only on a bug in the model code (a tree misuse).
    pub fn moment_bytes(&self) -> Result<usize, Error> {
        let mut bytes = 0;
        for (name, v) in self.tree.local_vars(self.optim)? {
            if name.ends_with("@M") || name.ends_with("@V") {
                bytes += self.tree.get::<Vec<f32>>(v)?.len() * 4;
            }
        }
        Ok(bytes)
    }

    /// [`moment_bytes`](Self::moment_bytes) of every rank, by rank (a
    /// collective call).
    ///
    /// # Errors
    /// Only on a misuse of the collective (a bug).
    pub fn moment_bytes_per_rank(&self) -> Result<Vec<usize>, Error> {
        let n = self.world.size();
        let mut mine = vec![0.0_f64; n];
        mine[self.world.rank()] = self.moment_bytes()? as f64;
        let mut all = vec![0.0_f64; n];
        let _watch = watch(&*self.world, "the moments' sizes", self.cfg.timeout);
        self.world.all_reduce_sum_f64(&mine, &mut all)?;
        Ok(all.into_iter().map(|b| b as usize).collect())
    }

    /// A 128-bit digest of the parameters alone, as hex: the same in the
    /// replicated and the ZeRO mode when they compute the same parameters.
    ///
    /// # Errors
    /// Only on a bug in the model code (a tree misuse).
    pub fn params_digest(&mut self) -> Result<String, ranks::Error> {
        let d = self.param_plan.digest(&self.tree)?;
        Ok(d.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// A 128-bit digest of the whole Adam moments, as hex (with `cfg.zero`,
    /// gathered from every rank first: a collective call).
    ///
    /// # Errors
    /// Only on a bug in the model code (a tree misuse).
    pub fn moments_digest(&mut self) -> Result<String, Error> {
        let digest = |t: &mut Self| -> Result<String, Error> {
            let root = t.tree.root();
            let mut plan = SyncPlan::new(
                &*t.world,
                &t.tree,
                root,
                &plan_options(&t.cfg).filter(moment_key),
            )?;
            let d = plan.digest(&t.tree)?;
            Ok(d.iter().map(|b| format!("{b:02x}")).collect())
        };
        if self.cfg.zero {
            self.with_whole_moments(digest)
        } else {
            digest(self)
        }
    }

    /// This rank's piece of each parameter's Adam moments, `(m, v)`, in
    /// `PARAMS` order, with the first element of the piece (empty where
    /// this rank owns none).
    ///
    /// # Errors
    /// Only on a bug in the model code (a tree misuse).
    // The MPI tests compare them with the replicated mode's.
    #[allow(dead_code)]
    pub fn moment_pieces(&self) -> Result<Vec<MomentPiece>, Error> {
        let mut out = Vec::with_capacity(5);
        for i in 0..5 {
            let get = |v: Option<VarId>| -> Result<Vec<f32>, Error> {
                Ok(match v {
                    Some(v) => self.tree.get::<Vec<f32>>(v)?.clone(),
                    None => Vec::new(),
                })
            };
            out.push((self.shard[i].0, get(self.adam_m[i])?, get(self.adam_v[i])?));
        }
        Ok(out)
    }

    /// Loads what [`save`](Self::save) wrote, strictly: the file must hold
    /// every parameter and optimiser variable, with this model's shapes.
    /// Every rank loads it, then the ranks check that they agree (a
    /// collective call). Training then continues exactly where the saved run
    /// stopped.
    ///
    /// # Errors
    /// When the file cannot be read or does not match this model (then
    /// nothing changed), on every rank.
    ///
    /// With `cfg.zero` every rank loads the whole moments, then keeps its
    /// own pieces: a checkpoint of either mode resumes in either mode.
    pub fn resume(&mut self, path: &Path) -> Result<(), Error> {
        if self.cfg.zero {
            self.with_whole_moments(|t| {
                let mut full = t.checkpoint_plan()?;
                full.load_on_all(&*t.world, &mut t.tree, path)?;
                Ok(())
            })?;
        } else {
            self.state_plan
                .load_on_all(&*self.world, &mut self.tree, path)?;
        }
        // The load checked that `step` holds exactly one element.
        self.updates = self.tree.get::<Vec<u64>>(self.step)?[0];
        Ok(())
    }

    /// Sequences times steps processed by one update.
    pub fn steps_per_update(&self) -> usize {
        self.cfg.batch * self.cfg.seq_len
    }

    /// One parameter update: recycle and push the workers' step scopes, run
    /// the workers in parallel (forward and backward through time on their
    /// share of the batch), reduce their gradients and take an Adam step.
    ///
    /// # Errors
    /// Only on a bug in the model code (a tree misuse).
    pub fn train_update(&mut self) -> Result<Stats, Error> {
        // The update being made, from 1: the step a stalled call names.
        Watch::set_step(self.updates + 1);
        let cfg = &self.cfg;
        // Structure, on the whole tree: a fresh sequence of T step scopes per
        // worker. Handles from the previous update go stale here.
        for w in &mut self.workers {
            w.steps.recycle(&mut self.tree)?;
            for _ in 0..cfg.seq_len {
                w.steps.push(&mut self.tree)?;
            }
        }
        let first_seq = self.updates * cfg.batch as u64;
        let (workers, params) = (&self.workers, self.params);
        let results = self.tree.run_workers(&self.worker_scopes, |mut ws| {
            let w = &workers[ws.index()];
            run_worker(&mut ws, w, params, cfg, first_seq)
        })?;
        let mut stats = Stats::default();
        for r in results {
            stats.add(r?);
        }
        self.reduce_and_step()?;
        self.updates += 1;
        Ok(stats)
    }

    /// Sums the workers' gradients into `optim`, then over the ranks, clips
    /// their norm and takes an Adam step on the parameters (on the whole
    /// tree, after the split).
    fn reduce_and_step(&mut self) -> Result<(), Error> {
        let tree = &mut self.tree;
        let scale = 1.0 / (self.cfg.batch * self.cfg.seq_len) as f32;
        let mut norm2 = 0.0_f32;
        for i in 0..5 {
            tree.get_mut::<Vec<f32>>(self.grads[i])?.fill(0.0);
            for w in &self.workers {
                let [sum, g] = tree.get_disjoint_mut::<Vec<f32>, 2>([self.grads[i], w.grads[i]])?;
                for (s, d) in sum.iter_mut().zip(g.iter()) {
                    *s += d * scale;
                }
            }
        }
        // Each parameter's squared norm over the pieces this rank steps; with
        // ZeRO each is summed over the ranks (one rank's, plus zeros, when a
        // parameter lies in one rank's slice).
        let mut parts = [0.0_f32; 5];
        if self.cfg.zero {
            self.grad_plan
                .reduce_scatter(&*self.world, tree, Reduce::Sum)?;
        } else {
            self.grad_plan.all_reduce(&*self.world, tree, Reduce::Sum)?;
        }
        for (i, &(s, n)) in self.shard.iter().enumerate() {
            parts[i] = tree.get::<Vec<f32>>(self.grads[i])?[s..s + n]
                .iter()
                .map(|g| g * g)
                .sum::<f32>();
        }
        if self.cfg.zero {
            let mine = parts;
            let _watch = watch(&*self.world, "the gradients' norms", self.cfg.timeout);
            self.world.all_reduce_sum_f32(&mine, &mut parts)?;
        }
        for part in parts {
            norm2 += part;
        }
        let clip = (1.0 / norm2.sqrt().max(1e-12)).min(1.0);
        let t = (self.updates + 1) as i32;
        let (b1, b2, eps) = (0.9_f32, 0.999_f32, 1e-8_f32);
        let lr = self.cfg.lr * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
        for i in 0..5 {
            let ((s, n), Some(mi), Some(vi)) = (self.shard[i], self.adam_m[i], self.adam_v[i])
            else {
                continue; // another rank's slice
            };
            let [p, g, m, v] =
                tree.get_disjoint_mut::<Vec<f32>, 4>([self.params[i], self.grads[i], mi, vi])?;
            let (p, g) = (&mut p[s..s + n], &g[s..s + n]);
            for j in 0..n {
                let gj = g[j] * clip;
                m[j] = b1 * m[j] + (1.0 - b1) * gj;
                v[j] = b2 * v[j] + (1.0 - b2) * gj * gj;
                p[j] -= lr * m[j] / (v[j].sqrt() + eps);
            }
        }
        if self.cfg.zero {
            self.param_plan.all_gather(&*self.world, tree)?;
        }
        Ok(())
    }

    /// Loss and accuracy on `eval_seqs` held-out sequences (a seed stream the
    /// training data never uses), forward only, on two ping-pong step scopes.
    ///
    /// # Errors
    /// Only on a bug in the model code (a tree misuse).
    pub fn evaluate(&mut self) -> Result<Stats, Error> {
        let (h, k, b) = (self.cfg.hidden, self.cfg.tokens, self.cfg.eval_seqs);
        let tree = &mut self.tree;
        let ev = &mut self.eval;
        ev.steps.recycle(tree)?;
        ev.rngs.clear();
        ev.states.clear();
        for j in 0..b {
            ev.rngs.push(SplitMix64::new(self.cfg.seed, 1, j as u64));
            ev.states.push(0);
        }
        let mut stats = Stats::default();
        for _ in 0..self.cfg.seq_len {
            let t = ev.steps.push(tree)?;
            for (sv, len) in ev.names.sized(b, h, k) {
                tree.get_or_insert_with(ev.steps.var(sv, t)?, || vec![0.0_f32; len])?;
            }
            let [x, y] = tree.get_disjoint_mut::<Vec<f32>, 2>([
                ev.steps.var(ev.names.x, t)?,
                ev.steps.var(ev.names.y, t)?,
            ])?;
            for j in 0..b {
                let tok = ev.rngs[j].below(k);
                let target = self.cfg.task.advance(&mut ev.states[j], t, tok, k);
                one_hot(&mut x[j * k..(j + 1) * k], Some(tok));
                one_hot(&mut y[j * k..(j + 1) * k], target);
            }
            let h_prev = if t == 0 {
                ev.h0
            } else {
                ev.steps.var(ev.names.h, t - 1)?
            };
            let [wxh, whh, bh, why, by, x, y, hp, hs, p] =
                tree.get_disjoint_mut::<Vec<f32>, 10>([
                    self.params[0],
                    self.params[1],
                    self.params[2],
                    self.params[3],
                    self.params[4],
                    ev.steps.var(ev.names.x, t)?,
                    ev.steps.var(ev.names.y, t)?,
                    h_prev,
                    ev.steps.var(ev.names.h, t)?,
                    ev.steps.var(ev.names.p, t)?,
                ])?;
            let wts = Weights {
                wxh,
                whh,
                bh,
                why,
                by,
            };
            stats.add(forward_step(h, k, &wts, x, y, hp, hs, p));
        }
        Ok(stats)
    }
}

/// Writes a one-hot row; `None` writes zeros (an unscored target).
fn one_hot(row: &mut [f32], hot: Option<usize>) {
    row.fill(0.0);
    if let Some(i) = hot {
        row[i] = 1.0;
    }
}

/// One worker's share of an update, on its own thread: generate its
/// sequences into its step scopes, run forward through time, then backward,
/// accumulating the gradients in its scope. Reads the parameters (shared),
/// writes only its own subtree.
fn run_worker(
    ws: &mut WorkerScope<'_>,
    w: &Worker,
    params: [VarId; 5],
    cfg: &Config,
    first_seq: u64,
) -> Result<Stats, Error> {
    let (h, k, b, t_len) = (cfg.hidden, cfg.tokens, w.batch, cfg.seq_len);
    let wts = Weights {
        wxh: ws.shared::<Vec<f32>>(params[0])?,
        whh: ws.shared::<Vec<f32>>(params[1])?,
        bh: ws.shared::<Vec<f32>>(params[2])?,
        why: ws.shared::<Vec<f32>>(params[3])?,
        by: ws.shared::<Vec<f32>>(params[4])?,
    };
    let (steps, n) = (&w.steps, w.names);
    // Size the step buffers on the first update; later updates reuse them
    // (recycling moved them to this update's step variables).
    for t in 0..t_len {
        for (sv, len) in n.sized(b, h, k) {
            ws.get_or_insert_with(steps.var(sv, t)?, || vec![0.0_f32; len])?;
        }
    }
    for &g in &w.grads {
        ws.get_mut::<Vec<f32>>(g)?.fill(0.0);
    }
    // Data: sequence `first_seq + offset + j` of the training stream.
    for j in 0..b {
        let mut rng = SplitMix64::new(cfg.seed, 0, first_seq + (w.offset + j) as u64);
        let mut state = 0;
        for t in 0..t_len {
            let tok = rng.below(k);
            let target = cfg.task.advance(&mut state, t, tok, k);
            let [x, y] =
                ws.get_disjoint_mut::<Vec<f32>, 2>([steps.var(n.x, t)?, steps.var(n.y, t)?])?;
            one_hot(&mut x[j * k..(j + 1) * k], Some(tok));
            one_hot(&mut y[j * k..(j + 1) * k], target);
        }
    }
    // Forward through time: step t reads step t-1's hidden state.
    let mut stats = Stats::default();
    for t in 0..t_len {
        let h_prev = if t == 0 { w.h0 } else { steps.var(n.h, t - 1)? };
        let [x, y, hp, hs, p] = ws.get_disjoint_mut::<Vec<f32>, 5>([
            steps.var(n.x, t)?,
            steps.var(n.y, t)?,
            h_prev,
            steps.var(n.h, t)?,
            steps.var(n.p, t)?,
        ])?;
        stats.add(forward_step(h, k, &wts, x, y, hp, hs, p));
    }
    // Backward through time, from the last step to the first.
    ws.get_mut::<Vec<f32>>(w.dh_next)?.fill(0.0);
    for t in (0..t_len).rev() {
        let h_prev = if t == 0 { w.h0 } else { steps.var(n.h, t - 1)? };
        let [
            x,
            y,
            hp,
            hs,
            p,
            dh_next,
            dh,
            g_wxh,
            g_whh,
            g_bh,
            g_why,
            g_by,
        ] = ws.get_disjoint_mut::<Vec<f32>, 12>([
            steps.var(n.x, t)?,
            steps.var(n.y, t)?,
            h_prev,
            steps.var(n.h, t)?,
            steps.var(n.p, t)?,
            w.dh_next,
            w.dh,
            w.grads[0],
            w.grads[1],
            w.grads[2],
            w.grads[3],
            w.grads[4],
        ])?;
        backward_step(
            h,
            k,
            &wts,
            [x, y, hp, hs, p],
            dh_next,
            dh,
            [g_wxh, g_whh, g_bh, g_why, g_by],
        );
    }
    Ok(stats)
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `h = tanh(Wxh x + Whh h_prev + bh)`, `p = softmax(Why h + by)` for every
/// sequence of the batch; returns the cross-entropy against `y` and the hits.
#[allow(clippy::too_many_arguments)]
fn forward_step(
    hid: usize,
    k: usize,
    w: &Weights<'_>,
    x: &[f32],
    y: &[f32],
    h_prev: &[f32],
    h: &mut [f32],
    p: &mut [f32],
) -> Stats {
    let mut stats = Stats::default();
    let rows = h.chunks_exact_mut(hid).zip(h_prev.chunks_exact(hid));
    let io = x
        .chunks_exact(k)
        .zip(y.chunks_exact(k))
        .zip(p.chunks_exact_mut(k));
    for ((hb, hp), ((xb, yb), pb)) in rows.zip(io) {
        for (i, hi) in hb.iter_mut().enumerate() {
            let a = w.bh[i]
                + dot(&w.wxh[i * k..(i + 1) * k], xb)
                + dot(&w.whh[i * hid..(i + 1) * hid], hp);
            *hi = a.tanh();
        }
        let mut max = f32::NEG_INFINITY;
        for (c, pc) in pb.iter_mut().enumerate() {
            *pc = w.by[c] + dot(&w.why[c * hid..(c + 1) * hid], hb);
            max = max.max(*pc);
        }
        let mut z = 0.0;
        for pc in pb.iter_mut() {
            *pc = (*pc - max).exp();
            z += *pc;
        }
        for pc in pb.iter_mut() {
            *pc /= z;
        }
        let (mut best, mut target) = (0, None);
        for c in 0..k {
            if pb[c] > pb[best] {
                best = c;
            }
            if yb[c] > 0.5 {
                target = Some(c);
            }
        }
        let Some(target) = target else {
            continue; // an unscored step
        };
        stats.loss -= f64::from(pb[target].max(1e-12).ln());
        stats.correct += usize::from(best == target);
        stats.tokens += 1;
    }
    stats
}

/// Backpropagation through one step for every sequence of the batch:
/// accumulates the parameter gradients and turns `dh_next` (the gradient
/// reaching `h_t` from step `t + 1`) into the gradient reaching `h_{t-1}`.
fn backward_step(
    hid: usize,
    k: usize,
    w: &Weights<'_>,
    [x, y, h_prev, h, p]: [&mut Vec<f32>; 5],
    dh_next: &mut [f32],
    dh: &mut [f32],
    [g_wxh, g_whh, g_bh, g_why, g_by]: [&mut Vec<f32>; 5],
) {
    let rows = x
        .chunks_exact(k)
        .zip(y.chunks_exact(k))
        .zip(p.chunks_exact(k))
        .zip(h.chunks_exact(hid).zip(h_prev.chunks_exact(hid)))
        .zip(dh_next.chunks_exact_mut(hid).zip(dh.chunks_exact_mut(hid)));
    for ((((xb, yb), pb), (hb, hpb)), (dnb, dhb)) in rows {
        // Output layer: d logits = p - y (nothing for an unscored step).
        dhb.copy_from_slice(dnb);
        let scored = yb.iter().any(|&v| v > 0.5);
        for c in (0..k).filter(|_| scored) {
            let d = pb[c] - yb[c];
            g_by[c] += d;
            let why_c = &w.why[c * hid..(c + 1) * hid];
            let g_why_c = &mut g_why[c * hid..(c + 1) * hid];
            for ((g, &hi), (dhi, &wi)) in g_why_c.iter_mut().zip(hb).zip(dhb.iter_mut().zip(why_c))
            {
                *g += d * hi;
                *dhi += d * wi;
            }
        }
        // Through tanh, then into the input and recurrent weights.
        dnb.fill(0.0);
        for (i, (dhi, &hi)) in dhb.iter_mut().zip(hb).enumerate() {
            let da = *dhi * (1.0 - hi * hi);
            *dhi = da;
            g_bh[i] += da;
            for (g, &xj) in g_wxh[i * k..(i + 1) * k].iter_mut().zip(xb) {
                *g += da * xj;
            }
            let whh_i = &w.whh[i * hid..(i + 1) * hid];
            let g_whh_i = &mut g_whh[i * hid..(i + 1) * hid];
            for ((g, &hpj), (dn, &wij)) in
                g_whh_i.iter_mut().zip(hpb).zip(dnb.iter_mut().zip(whh_i))
            {
                *g += da * hpj;
                *dn += da * wij;
            }
        }
    }
}
