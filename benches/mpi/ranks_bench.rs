//! Times the ranks layer against raw MPI, under `mpirun` (feature `mpi`):
//!
//! ```text
//! cargo build --release --features mpi --example ranks_bench
//! mpirun -np 2 target/release/examples/ranks_bench [MB] [REPS] [TENSORS] [--direct BYTES]
//! mpirun -np 2 target/release/examples/ranks_bench [MB] [REPS] [TENSORS] --direct-sweep
//! mpirun -np 2 target/release/examples/ranks_bench [MB] [REPS] [TENSORS] --pairs-sweep
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

use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator;
use scopetree::checkpoint::Tensor;
use scopetree::ranks::{
    DEFAULT_BUCKET_BUFFERS, DEFAULT_BUCKET_BYTES, DEFAULT_DIRECT_BYTES, PlanOptions, Reduce,
    SyncPlan,
};
use scopetree::{ScopeId, ScopeTree};

use rounds::{
    RawMpi, Spread, bytes_label, compare_line, load_average, once, order, sizes, take_bytes_flag,
    whole_line,
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
    if sweep_direct && direct.is_some() {
        eprintln!("--direct-sweep sweeps the direct threshold itself: leave out --direct");
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
        let mode = if sweep_pairs {
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
        raw: RawMpi::new(total),
        reps,
    };
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
