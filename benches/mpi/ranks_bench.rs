//! Times the ranks layer against raw MPI, under `mpirun` (feature `mpi`):
//!
//! ```text
//! cargo build --release --features mpi --example ranks_bench
//! mpirun -np 2 target/release/examples/ranks_bench [MB] [REPS] [TENSORS]
//! ```
//!
//! - the all-reduce of a store's gradients (`TENSORS` `f32` tensors, 300 by
//!   default, of sizes growing as i², `MB` megabytes in all, 100 by
//!   default) through
//!   [`SyncPlan::all_reduce`], for buckets of 1, 4, 25 and 100 MiB, against
//!   one raw `MPI_Allreduce` of a flat buffer of the same bytes, and against
//!   raw `MPI_Allreduce`s of that buffer in chunks of the bucket's size;
//! - the consistency digest's cost per MB (local hashing, and the whole
//!   check with its all-gathers);
//! - the watchdog's cost: [`SyncPlan::all_reduce`] of 1 MB (one tensor)
//!   with the default timeout against the same without a timeout
//!   (`PlanOptions::without_timeout`), in batches of 20 calls, `10 × REPS`
//!   batches each, taking turns.
//!
//! Each figure is the median of `REPS` rounds (9 by default), after one
//! warm-up round; within a round the variants take turns, so that load from
//! other processes hits them alike. Rank 0 prints the figures.

use std::time::Instant;

use mpi::collective::SystemOperation;
use mpi::traits::{Communicator, CommunicatorCollectives};
use scopetree::checkpoint::Tensor;
use scopetree::ranks::{PlanOptions, Reduce, SyncPlan};
use scopetree::{ScopeId, ScopeTree};

/// `count` tensors of sizes growing as i² (as a model's mix of biases and
/// weights), `total` f32 elements in all.
fn gradients(total: usize, count: usize) -> (ScopeTree, ScopeId) {
    let mut tree = ScopeTree::new();
    let grads = tree.new_named_scope(tree.root(), "grads").unwrap();
    let weights: Vec<usize> = (1..=count).map(|i| i * i).collect();
    let sum: usize = weights.iter().sum();
    let mut left = total;
    for (i, w) in weights.iter().enumerate() {
        let n = if i + 1 == weights.len() {
            left
        } else {
            (total * w / sum).max(1)
        };
        left -= n;
        let v = tree.var(grads, format!("t{i:03}")).unwrap();
        tree.set(v, Tensor::new(vec![n], vec![0.5_f32; n]).unwrap())
            .unwrap();
    }
    (tree, grads)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The median time of `reps` runs of `f` (after one warm-up), in seconds;
/// every rank starts each run together.
fn time(world: &mpi::topology::SimpleCommunicator, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut xs = Vec::with_capacity(reps);
    for _ in 0..reps {
        world.barrier();
        let t = Instant::now();
        f();
        xs.push(t.elapsed().as_secs_f64());
    }
    median(xs)
}

/// Times one run of `f`, every rank starting together, in seconds.
fn once(world: &mpi::topology::SimpleCommunicator, f: impl FnOnce()) -> f64 {
    world.barrier();
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mb: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let reps: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(9);
    let count: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(300);
    let universe = mpi::initialize().expect("MPI initialises once");
    let world = universe.world();
    let me = world.rank() == 0;
    let total = mb * 1_000_000 / 4;
    let (mut tree, grads) = gradients(total, count);

    // The raw call and every bucket size take turns within each round, so
    // that load from other processes hits them alike.
    let send = vec![0.5_f32; total];
    let mut recv = vec![0.0_f32; total];
    let buckets_mib = [1_usize, 4, 25, 100];
    let mut plans: Vec<SyncPlan> = buckets_mib
        .iter()
        .map(|&b| {
            SyncPlan::new(
                &world,
                &tree,
                grads,
                &PlanOptions::new().bucket_bytes(b << 20),
            )
            .unwrap()
        })
        .collect();
    let mut raw = Vec::new();
    let mut ours = vec![Vec::new(); plans.len()];
    let mut chunked = vec![Vec::new(); plans.len()];
    for round in 0..=reps {
        let r = once(&world, || {
            world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
        });
        let mut t = Vec::new();
        let mut c = Vec::new();
        for (plan, &b) in plans.iter_mut().zip(&buckets_mib) {
            // Raw MPI over the same bytes in chunks of the bucket's size:
            // what the layer costs beyond its copies and checks.
            let n = (b << 20) / 4;
            c.push(once(&world, || {
                for (s, r) in send.chunks(n).zip(recv.chunks_mut(n)) {
                    world.all_reduce_into(s, r, SystemOperation::sum());
                }
            }));
            t.push(once(&world, || {
                plan.all_reduce(&world, &mut tree, Reduce::Sum).unwrap();
            }));
        }
        if round > 0 {
            raw.push(r);
            for (o, t) in ours.iter_mut().zip(t) {
                o.push(t);
            }
            for (o, c) in chunked.iter_mut().zip(c) {
                o.push(c);
            }
        }
    }
    drop((send, recv));
    let raw = median(raw);
    if me {
        println!(
            "ranks: {}; gradients: {count} f32 tensors, {mb} MB; median of {reps} rounds",
            world.size()
        );
        println!(
            "raw MPI_Allreduce of one flat buffer of {mb} MB: {:.1} ms ({:.2} GB/s)",
            raw * 1e3,
            mb as f64 / 1e3 / raw
        );
        for (((b, plan), o), c) in buckets_mib.iter().zip(&plans).zip(ours).zip(chunked) {
            let (t, c) = (median(o), median(c));
            println!(
                "buckets of {b:>3} MiB ({:>3} calls): SyncPlan::all_reduce {:.1} ms; raw MPI in \
                 chunks of {b} MiB {:.1} ms; ratio to one raw call {:.2}x, to raw chunks {:.2}x",
                plan.reduce_buckets(),
                t * 1e3,
                c * 1e3,
                raw / t,
                c / t
            );
        }
    }
    drop(plans);
    let mut plan = SyncPlan::new(&world, &tree, grads, &PlanOptions::new()).unwrap();
    let local = time(&world, reps, || {
        plan.digest(&tree).unwrap();
    });
    let check = time(&world, reps, || {
        plan.check_consistency(&world, &tree).unwrap();
    });
    if me {
        println!(
            "digest of {mb} MB: {:.1} ms local ({:.2} ms/MB), {:.1} ms with the check's all-gathers",
            local * 1e3,
            local * 1e3 / mb as f64,
            check * 1e3
        );
    }

    // The watchdog's cost: a 1 MB all-reduce with the default timeout (the
    // call watched) and without one, in batches of 20 calls taking turns.
    let (mut small, one_mb) = gradients(250_000, 1);
    let mut watched = SyncPlan::new(&world, &small, one_mb, &PlanOptions::new()).unwrap();
    let opts = PlanOptions::new().without_timeout();
    let mut unwatched = SyncPlan::new(&world, &small, one_mb, &opts).unwrap();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..=10 * reps {
        let mut batch = |plan: &mut SyncPlan| {
            once(&world, || {
                for _ in 0..20 {
                    plan.all_reduce(&world, &mut small, Reduce::Sum).unwrap();
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
    if me {
        let (w, u) = (median(with), median(without));
        println!(
            "SyncPlan::all_reduce of 1 MB: {:.1} µs with the watchdog (default timeout), {:.1} µs \
             without a timeout ({:+.2} %); median of {} batches of 20 calls",
            w * 1e6,
            u * 1e6,
            (w / u - 1.0) * 100.0,
            10 * reps
        );
    }
}
