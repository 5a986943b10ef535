//! Times the ranks layer against raw MPI, under `mpirun` (feature `mpi`):
//!
//! ```text
//! cargo build --release --features mpi --example ranks_bench
//! mpirun -np 2 target/release/examples/ranks_bench [MB] [REPS] [TENSORS] [--direct BYTES]
//! mpirun -np 2 target/release/examples/ranks_bench [MB] [REPS] [TENSORS] --direct-sweep
//! mpirun -np 2 target/release/examples/ranks_bench [MB] [REPS] [TENSORS] --pairs-sweep
//! mpirun -np 2 target/release/examples/ranks_bench [MB] [REPS] [TENSORS] --zero [--direct BYTES]
//! mpirun -np 2 --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
//!     target/release/examples/ranks_bench   # MPI's TCP transport over loopback
//! ```
//!
//! - The bucket sweep: the all-reduce of a store's gradients (`TENSORS`
//!   `f32` tensors, 300 by default, of sizes growing as i², `MB` megabytes
//!   in all, 100 by default) through [`SyncPlan::all_reduce`] (sum), for
//!   buckets of 1, 2, 4, 8, 16, 25, 50 and 100 MiB (and
//!   [`DEFAULT_BUCKET_BYTES`] if it is not among them), against raw
//!   `MPI_Allreduce`s of a flat buffer of the same bytes in chunks of the
//!   bucket's size, and against one raw `MPI_Allreduce` of the whole
//!   buffer. One line per bucket size; the default bucket's line ends with
//!   `default`. Every plan is built with
//!   `PlanOptions::new().bucket_bytes(b)`, and with `--direct BYTES` also
//!   `.direct_bytes(BYTES)` (`off` or `usize::MAX`: every variable goes
//!   through the buckets; `K`/`KiB` and `M`/`MiB` suffixes are read).
//! - `--direct-sweep` instead: at the default bucket, the all-reduce with
//!   the variables of at least 16 KiB, 64 KiB, 256 KiB, 1 MiB, 4 MiB (and
//!   [`DEFAULT_DIRECT_BYTES`]) sent from their own buffers, and with none
//!   (`off`), against the same raw calls; one line per threshold, the
//!   default's ending with `default`. Nothing else runs then.
//! - `--pairs-sweep` instead: with every variable fused (direct off),
//!   buckets of 1 and 25 MiB with 1, 2, 4 and 8 bucket buffer pairs,
//!   against raw chunks of the bucket. Nothing else runs then.
//! - `--zero` instead: the ZeRO stage-1 exchange of the same gradients,
//!   [`SyncPlan::reduce_scatter`] (sum) then [`SyncPlan::all_gather`], of a
//!   plan with `PlanOptions::new()` (with `--direct BYTES`,
//!   `.direct_bytes(BYTES)`), of one with `.direct_bytes(usize::MAX)`
//!   (`direct off`: every piece through the padded buffers), and raw MPI
//!   over one flat `f32` buffer of the same bytes: one
//!   `MPI_Reduce_scatter_block` (sum) of `size × block` elements (`block`
//!   = ⌈elements / size⌉) into one block, then one `MPI_Allgather` of a
//!   block's bytes into `size × block`'s. Each of the three is timed as the
//!   whole exchange (both calls in one timing) and, as separate
//!   configurations, each half alone: nine configurations a round. Before
//!   each of the plans' runs (untimed) every element is set back to 0.5,
//!   so that sums do not grow over the rounds. After the warm-up round
//!   both plans run the exchange once from 0.5 everywhere, and every
//!   element of both trees must be 0.5 × ranks (exact in `f32`) and the
//!   two trees bit-identical, else the run ends (`MPI_Abort`). Three
//!   lines, labels `reduce-scatter + all-gather`, `reduce-scatter` and
//!   `all-gather`, each as `LABEL: SyncPlan 40.1 ms (38.2–43.0); direct off
//!   80.3 ms (…); raw MPI over one flat buffer 70.2 ms (…); ratio to raw
//!   1.75x, direct off to raw 0.87x (rounds: 1.60–1.90x, 0.80–0.95x)`: the
//!   ratios are raw / SyncPlan and raw / direct off (above 1: faster than
//!   raw). Nothing else runs then.
//! - Otherwise also the consistency digest's cost per MB (local hashing,
//!   and the whole check with its all-gathers), and the watchdog's cost:
//!   [`SyncPlan::all_reduce`] of 1 MB (one tensor) with the default timeout
//!   against the same without a timeout (`PlanOptions::without_timeout`),
//!   in batches of 20 calls, `10 × REPS` batches each, taking turns.
//!
//! Each figure is the median, with the range (min–max), of `REPS` rounds (9
//! by default) after one warm-up round. Within a round every configuration
//! (the raw call, the raw chunks of each size, each plan) runs once, in an
//! order shuffled anew each round, so that load from other processes hits
//! them alike. Each time is the slowest rank's: every rank starts after a
//! barrier, and the ranks take the maximum of their times. Ratios are those
//! of the medians, followed by the range of the ratios within each round.
//! Rank 0 prints the figures, and first the load average (`/proc/loadavg`).

#[path = "rounds.rs"]
mod rounds;

use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};
use scopetree::checkpoint::Tensor;
use scopetree::ranks::{
    DEFAULT_BUCKET_BUFFERS, DEFAULT_BUCKET_BYTES, DEFAULT_DIRECT_BYTES, PlanOptions, Reduce,
    SyncPlan,
};
use scopetree::{ScopeId, ScopeTree, VarId};

use rounds::{
    RawMpi, Spread, bytes_label, compare_line, load_average, once, order, per_round, sizes,
    take_bytes_flag, whole_line,
};

/// The bucket sizes of the sweep, in MiB.
const BUCKETS_MIB: [usize; 8] = [1, 2, 4, 8, 16, 25, 50, 100];

/// The thresholds of `--direct-sweep`, in bytes (`usize::MAX`: off).
const DIRECTS: [usize; 6] = [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, usize::MAX];

/// `count` tensors of sizes growing as i², `total` f32 elements in all.
fn gradients(total: usize, count: usize) -> (ScopeTree, ScopeId) {
    let mut tree = ScopeTree::new();
    let grads = tree.new_named_scope(tree.root(), "grads").unwrap();
    for (i, n) in sizes(total, count).into_iter().enumerate() {
        let v = tree.var(grads, format!("t{i:03}")).unwrap();
        tree.set(v, Tensor::new(vec![n], vec![0.5_f32; n]).unwrap())
            .unwrap();
    }
    (tree, grads)
}

/// What a round runs once.
#[derive(Clone, Copy)]
enum Config {
    /// One raw `MPI_Allreduce` of the whole buffer.
    Whole,
    /// Raw `MPI_Allreduce`s in chunks of this many bytes.
    Chunks(usize),
    /// The all-reduce of the plan of this index.
    Plan(usize),
}

/// The gradients and what the rounds compare them with.
struct Bench {
    world: SimpleCommunicator,
    tree: ScopeTree,
    grads: ScopeId,
    raw: RawMpi,
    reps: usize,
}

impl Bench {
    /// The plan of the gradients with `opts` (a collective call).
    fn plan(&self, opts: &PlanOptions) -> SyncPlan {
        SyncPlan::new(&self.world, &self.tree, self.grads, opts).unwrap()
    }

    /// The times of each of `configs` in each of `reps` rounds, after one
    /// warm-up round; within a round the configurations run in a shuffled
    /// order (see [`order`]).
    fn measure(&mut self, configs: &[Config], plans: &mut [SyncPlan]) -> Vec<Vec<f64>> {
        let mut times: Vec<Vec<f64>> = configs
            .iter()
            .map(|_| Vec::with_capacity(self.reps))
            .collect();
        for round in 0..=self.reps {
            for i in order(configs.len(), round) {
                let world = &self.world;
                let t = match configs[i] {
                    Config::Whole => once(world, || self.raw.whole(world)),
                    Config::Chunks(bytes) => once(world, || self.raw.chunks(world, bytes)),
                    Config::Plan(p) => once(world, || {
                        plans[p]
                            .all_reduce(world, &mut self.tree, Reduce::Sum)
                            .unwrap();
                    }),
                };
                if round > 0 {
                    times[i].push(t);
                }
            }
        }
        times
    }
}

/// The bucket sizes of the sweep, in bytes, with the default among them.
fn bucket_sizes() -> Vec<usize> {
    let mut sizes: Vec<usize> = BUCKETS_MIB.iter().map(|&m| m << 20).collect();
    if !sizes.contains(&DEFAULT_BUCKET_BYTES) {
        sizes.push(DEFAULT_BUCKET_BYTES);
        sizes.sort_unstable();
    }
    sizes
}

/// The thresholds of the direct sweep, with the default among them.
fn direct_sizes() -> Vec<usize> {
    let mut sizes = DIRECTS.to_vec();
    if !sizes.contains(&DEFAULT_DIRECT_BYTES) {
        sizes.push(DEFAULT_DIRECT_BYTES);
        sizes.sort_unstable();
    }
    sizes
}

/// The ending of a default's line: `; default`, else nothing.
fn mark(is_default: bool) -> &'static str {
    if is_default { "; default" } else { "" }
}

/// The bucket sweep: every bucket size against raw chunks of that size and
/// one raw call, all in the same rounds.
fn bucket_sweep(b: &mut Bench, mb: usize, direct: Option<usize>) {
    let buckets = bucket_sizes();
    let mut plans: Vec<SyncPlan> = buckets
        .iter()
        .map(|&bytes| {
            let opts = PlanOptions::new().bucket_bytes(bytes);
            b.plan(&match direct {
                Some(d) => opts.direct_bytes(d),
                None => opts,
            })
        })
        .collect();
    let mut configs = vec![Config::Whole];
    for (p, &bytes) in buckets.iter().enumerate() {
        configs.push(Config::Chunks(bytes));
        configs.push(Config::Plan(p));
    }
    let times = b.measure(&configs, &mut plans);
    if b.world.rank() != 0 {
        return;
    }
    println!("{}", whole_line(mb, &times[0]));
    for (p, &bytes) in buckets.iter().enumerate() {
        let line = compare_line(
            &format!("buckets of {:>7}", bytes_label(bytes)),
            plans[p].reduce_buckets(),
            "SyncPlan::all_reduce",
            &times[2 + 2 * p],
            &times[1 + 2 * p],
            bytes,
            &times[0],
        );
        println!("{line}{}", mark(bytes == DEFAULT_BUCKET_BYTES));
    }
}

/// The direct sweep: at the default bucket, each threshold against raw
/// chunks of the bucket and one raw call, all in the same rounds.
fn direct_sweep(b: &mut Bench, mb: usize) {
    let directs = direct_sizes();
    let mut plans: Vec<SyncPlan> = directs
        .iter()
        .map(|&d| b.plan(&PlanOptions::new().direct_bytes(d)))
        .collect();
    let mut configs = vec![Config::Whole, Config::Chunks(DEFAULT_BUCKET_BYTES)];
    configs.extend((0..plans.len()).map(Config::Plan));
    let times = b.measure(&configs, &mut plans);
    if b.world.rank() != 0 {
        return;
    }
    println!("{}", whole_line(mb, &times[0]));
    for (p, &d) in directs.iter().enumerate() {
        let label = match d {
            usize::MAX => "direct off".to_owned(),
            d => format!("direct from {}", bytes_label(d)),
        };
        let line = compare_line(
            &format!("{label:<19}"),
            plans[p].reduce_buckets(),
            "SyncPlan::all_reduce",
            &times[2 + p],
            &times[1],
            DEFAULT_BUCKET_BYTES,
            &times[0],
        );
        println!("{line}{}", mark(d == DEFAULT_DIRECT_BYTES));
    }
}

/// The pairs sweep: with every variable fused (direct off), buckets of 1
/// and 25 MiB with 1, 2, 4 and 8 bucket buffer pairs (1: one bucket at a
/// time; 2W: W transfers in flight), against raw chunks of the bucket, all
/// in the same rounds.
fn pairs_sweep(b: &mut Bench, mb: usize) {
    let buckets = [1_usize << 20, DEFAULT_BUCKET_BYTES];
    let pairs = [1_usize, 2, 4, 8];
    let mut plans = Vec::new();
    let mut configs = vec![Config::Whole];
    for &bytes in &buckets {
        configs.push(Config::Chunks(bytes));
        for &n in &pairs {
            let opts = PlanOptions::new()
                .bucket_bytes(bytes)
                .direct_bytes(usize::MAX)
                .bucket_buffers(n);
            configs.push(Config::Plan(plans.len()));
            plans.push(b.plan(&opts));
        }
    }
    let times = b.measure(&configs, &mut plans);
    if b.world.rank() != 0 {
        return;
    }
    println!("{}", whole_line(mb, &times[0]));
    let mut at = 1;
    let mut p = 0;
    for &bytes in &buckets {
        let chunks = at;
        at += 1;
        for &n in &pairs {
            let line = compare_line(
                &format!("buckets of {:>7}, {n} pair(s)", bytes_label(bytes)),
                plans[p].reduce_buckets(),
                "SyncPlan::all_reduce",
                &times[at],
                &times[chunks],
                bytes,
                &times[0],
            );
            println!("{line}{}", mark(n == DEFAULT_BUCKET_BUFFERS));
            at += 1;
            p += 1;
        }
    }
}

/// The parts of the ZeRO exchange that `--zero` times, with their labels.
const HALVES: [(Half, &str); 3] = [
    (Half::Both, "reduce-scatter + all-gather"),
    (Half::Scatter, "reduce-scatter"),
    (Half::Gather, "all-gather"),
];

/// A part of the ZeRO exchange.
#[derive(Clone, Copy)]
enum Half {
    /// The reduce-scatter then the all-gather, in one timing.
    Both,
    /// The reduce-scatter (sum) alone.
    Scatter,
    /// The all-gather alone.
    Gather,
}

/// Raw MPI over a flat `f32` buffer of the gradients' bytes: what a plan's
/// ZeRO exchange is measured against, with no copies.
struct RawZero {
    /// `size` blocks to reduce-scatter.
    send: Vec<f32>,
    /// This rank's reduced block.
    block: Vec<f32>,
    /// A block's bytes to all-gather, and every rank's.
    mine: Vec<u8>,
    all: Vec<u8>,
}

impl RawZero {
    /// Buffers for `total` elements over `size` ranks: blocks of
    /// ⌈total / size⌉ elements.
    fn new(total: usize, size: usize) -> Self {
        let block = total.div_ceil(size);
        RawZero {
            send: vec![0.5; block * size],
            block: vec![0.0; block],
            mine: vec![0; block * 4],
            all: vec![0; block * 4 * size],
        }
    }

    /// The part `half` of the exchange: one `MPI_Reduce_scatter_block`
    /// (sum), one `MPI_Allgather` of bytes, or both.
    fn run(&mut self, world: &SimpleCommunicator, half: Half) {
        if matches!(half, Half::Both | Half::Scatter) {
            let sum = SystemOperation::sum();
            world.reduce_scatter_block_into(&self.send[..], &mut self.block[..], sum);
        }
        if matches!(half, Half::Both | Half::Gather) {
            world.all_gather_into(&self.mine[..], &mut self.all[..]);
        }
    }
}

/// Sets every element of `vars` (the gradients) back to 0.5.
fn reset(tree: &mut ScopeTree, vars: &[VarId]) {
    for &v in vars {
        tree.get_mut::<Tensor<f32>>(v).unwrap().data_mut().fill(0.5);
    }
}

/// The part `half` of the ZeRO exchange of `plan` (sum), with every
/// element set to 0.5 first, untimed; the slowest rank's time.
fn zero_run(b: &mut Bench, vars: &[VarId], plan: &mut SyncPlan, half: Half) -> f64 {
    reset(&mut b.tree, vars);
    let (world, tree) = (&b.world, &mut b.tree);
    once(world, || {
        if matches!(half, Half::Both | Half::Scatter) {
            plan.reduce_scatter(world, tree, Reduce::Sum).unwrap();
        }
        if matches!(half, Half::Both | Half::Gather) {
            plan.all_gather(world, tree).unwrap();
        }
    })
}

/// Checks the exchange of both `plans` from 0.5 everywhere: every element
/// 0.5 × ranks after each, the two bit-identical. Ends the run
/// (`MPI_Abort`) on a wrong value.
fn zero_check(b: &mut Bench, vars: &[VarId], plans: &mut [SyncPlan; 2]) {
    let want = 0.5 * b.world.size() as f32;
    let mut first: Vec<Vec<u32>> = Vec::new();
    for (p, plan) in plans.iter_mut().enumerate() {
        zero_run(b, vars, plan, Half::Both);
        for (i, &v) in vars.iter().enumerate() {
            let data = b.tree.get::<Tensor<f32>>(v).unwrap().data();
            let wrong = match first.get(i) {
                _ if data.iter().any(|&x| x != want) => Some(format!("an element is not {want}")),
                Some(bits) if !data.iter().map(|x| x.to_bits()).eq(bits.iter().copied()) => {
                    Some("the plans' values differ".to_owned())
                }
                _ => None,
            };
            if let Some(what) = wrong {
                eprintln!(
                    "ranks_bench --zero: rank {}, plan {p}, variable {i}: {what}",
                    b.world.rank()
                );
                b.world.abort(3);
            }
            if p == 0 {
                first.push(data.iter().map(|x| x.to_bits()).collect());
            }
        }
    }
}

/// The ZeRO exchange: the plan with the default direct threshold (or
/// `direct`), the plan with direct off and raw MPI over one flat buffer,
/// each timed whole and by halves, all in the same rounds; the two plans'
/// results checked after the warm-up round.
fn zero(b: &mut Bench, total: usize, direct: Option<usize>) {
    let vars: Vec<VarId> = b
        .tree
        .local_vars(b.grads)
        .unwrap()
        .map(|(_, v)| v)
        .collect();
    let ours = PlanOptions::new();
    let ours = match direct {
        Some(d) => ours.direct_bytes(d),
        None => ours,
    };
    let mut plans = [
        b.plan(&ours),
        b.plan(&PlanOptions::new().direct_bytes(usize::MAX)),
    ];
    let mut raw = RawZero::new(total, b.world.size() as usize);
    // Configuration c: half c % 3 of plan 0, plan 1 or raw MPI (c / 3 = 2).
    let mut times: Vec<Vec<f64>> = (0..9).map(|_| Vec::with_capacity(b.reps)).collect();
    for round in 0..=b.reps {
        for c in order(9, round) {
            let half = HALVES[c % 3].0;
            let t = match c / 3 {
                2 => once(&b.world, || raw.run(&b.world, half)),
                p => zero_run(b, &vars, &mut plans[p], half),
            };
            if round > 0 {
                times[c].push(t);
            }
        }
        if round == 0 {
            zero_check(b, &vars, &mut plans);
        }
    }
    if b.world.rank() != 0 {
        return;
    }
    for (h, (_, label)) in HALVES.iter().enumerate() {
        let (ours, off, raw) = (&times[h], &times[3 + h], &times[6 + h]);
        let (o, f, r) = (Spread::of(ours), Spread::of(off), Spread::of(raw));
        println!(
            "{label}: SyncPlan {}; direct off {}; raw MPI over one flat buffer {}; ratio to raw \
             {:.2}x, direct off to raw {:.2}x (rounds: {}, {})",
            o.ms(),
            f.ms(),
            r.ms(),
            r.median / o.median,
            r.median / f.median,
            Spread::of(&per_round(raw, ours)).range_x(),
            Spread::of(&per_round(raw, off)).range_x(),
        );
    }
}

/// The consistency digest's cost: local hashing, and the whole check.
fn digest(b: &mut Bench, mb: usize) {
    let mut plan = b.plan(&PlanOptions::new());
    let (mut local, mut check) = (Vec::new(), Vec::new());
    for round in 0..=b.reps {
        let l = once(&b.world, || {
            plan.digest(&b.tree).unwrap();
        });
        let c = once(&b.world, || {
            plan.check_consistency(&b.world, &b.tree).unwrap();
        });
        if round > 0 {
            local.push(l);
            check.push(c);
        }
    }
    if b.world.rank() == 0 {
        let (l, c) = (Spread::of(&local), Spread::of(&check));
        println!(
            "digest of {mb} MB: {:.1} ms local ({:.2} ms/MB), {:.1} ms with the check's \
             all-gathers; ranges {:.1}–{:.1} ms, {:.1}–{:.1} ms",
            l.median * 1e3,
            l.median * 1e3 / mb as f64,
            c.median * 1e3,
            l.min * 1e3,
            l.max * 1e3,
            c.min * 1e3,
            c.max * 1e3
        );
    }
}

/// The watchdog's cost: a 1 MB all-reduce with the default timeout (the
/// call watched) and without one, in batches of 20 calls taking turns.
fn watchdog(world: &SimpleCommunicator, reps: usize) {
    let (mut small, one_mb) = gradients(250_000, 1);
    let mut watched = SyncPlan::new(world, &small, one_mb, &PlanOptions::new()).unwrap();
    let opts = PlanOptions::new().without_timeout();
    let mut unwatched = SyncPlan::new(world, &small, one_mb, &opts).unwrap();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..=10 * reps {
        let mut batch = |plan: &mut SyncPlan| {
            once(world, || {
                for _ in 0..20 {
                    plan.all_reduce(world, &mut small, Reduce::Sum).unwrap();
                }
            }) / 20.0
        };
        let (w, u) = if round % 2 == 0 {
            let w = batch(&mut watched);
            (w, batch(&mut unwatched))
        } else {
            let u = batch(&mut unwatched);
            (batch(&mut watched), u)
        };
        if round > 0 {
            with.push(w);
            without.push(u);
        }
    }
    if world.rank() == 0 {
        let (w, u) = (Spread::of(&with), Spread::of(&without));
        println!(
            "SyncPlan::all_reduce of 1 MB: {:.1} µs with the watchdog (default timeout), {:.1} µs \
             without a timeout ({:+.2} %); median of {} batches of 20 calls; ranges {:.1}–{:.1} \
             µs, {:.1}–{:.1} µs",
            w.median * 1e6,
            u.median * 1e6,
            (w.median / u.median - 1.0) * 100.0,
            10 * reps,
            w.min * 1e6,
            w.max * 1e6,
            u.min * 1e6,
            u.max * 1e6
        );
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    let direct = take_bytes_flag(&mut args, "--direct");
    let sweep_pairs = match args.iter().position(|a| a == "--pairs-sweep") {
        Some(i) => {
            args.remove(i);
            true
        }
        None => false,
    };
    let sweep_direct = match args.iter().position(|a| a == "--direct-sweep") {
        Some(i) => {
            args.remove(i);
            true
        }
        None => false,
    };
    let zero_mode = match args.iter().position(|a| a == "--zero") {
        Some(i) => {
            args.remove(i);
            true
        }
        None => false,
    };
    if sweep_direct && direct.is_some() {
        eprintln!("--direct-sweep sweeps the direct threshold itself: leave out --direct");
        std::process::exit(2);
    }
    if zero_mode && (sweep_direct || sweep_pairs) {
        eprintln!("--zero runs alone: leave out --direct-sweep and --pairs-sweep");
        std::process::exit(2);
    }
    let mb: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let reps: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(9);
    let count: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(300);
    let load = load_average();
    let universe = mpi::initialize().expect("MPI initialises once");
    let world = universe.world();
    let total = mb * 1_000_000 / 4;
    let (tree, grads) = gradients(total, count);
    if world.rank() == 0 {
        let direct = match direct {
            Some(usize::MAX) => "direct off".to_owned(),
            Some(d) => format!("direct from {}", bytes_label(d)),
            None => format!(
                "direct from {} (the default)",
                bytes_label(DEFAULT_DIRECT_BYTES)
            ),
        };
        let mode = if zero_mode {
            format!("ZeRO exchange, {direct}")
        } else if sweep_pairs {
            "pairs sweep, direct off".to_owned()
        } else if sweep_direct {
            format!(
                "direct sweep at the default bucket of {}",
                bytes_label(DEFAULT_BUCKET_BYTES)
            )
        } else {
            format!("bucket sweep, {direct}")
        };
        println!(
            "ranks: {}; gradients: {count} f32 tensors, {mb} MB; {mode}; median (min–max) of \
             {reps} rounds after a warm-up, the configurations in a new order each round, each \
             time the slowest rank's",
            world.size()
        );
        println!("load average at start: {load}");
    }
    let mut bench = Bench {
        world,
        tree,
        grads,
        raw: RawMpi::new(if zero_mode { 0 } else { total }),
        reps,
    };
    if zero_mode {
        zero(&mut bench, total, direct);
        return;
    }
    if sweep_direct {
        direct_sweep(&mut bench, mb);
        return;
    }
    if sweep_pairs {
        pairs_sweep(&mut bench, mb);
        return;
    }
    bucket_sweep(&mut bench, mb, direct);
    bench.raw = RawMpi::new(0);
    digest(&mut bench, mb);
    watchdog(&bench.world, reps);
}
