//! Times [`CandlePlan::all_reduce`] against raw MPI over the same bytes,
//! under `mpirun` (features `candle` and `mpi`):
//!
//! ```text
//! cargo build --release --features candle,mpi --example candle_bench
//! mpirun -np 2 target/release/examples/candle_bench [MB] [REPS] [TENSORS] [--bucket BYTES] [--direct BYTES] [--device cpu|cuda] [--zero]
//! ```
//!
//! With `--device cuda` (feature `cuda`) the variables and gradients are on
//! CUDA device 0 (every rank on the same GPU works: MPI moves host
//! buffers), so the plan stages them through the host a bucket segment at a
//! time, and each timed call ends with a device synchronise; the raw MPI
//! calls still move host memory: the staging's cost against MPI alone.
//!
//! - The gradients: a [`CandleStore`] of `TENSORS` `f32` variables (300 by
//!   default) of sizes growing as i², `MB` megabytes in all (100 by
//!   default), as `ranks_bench`'s, and a candle `GradStore` holding a
//!   gradient of every variable (all `0.5`). Before each call the
//!   `GradStore` gets back those gradients (as after a new `backward`), out
//!   of the timed span.
//! - Each round times, in an order shuffled anew each round:
//!   [`CandlePlan::all_reduce`] (sum) and
//!   [`CandlePlan::all_reduce_in_place`] (sum, on gradients of its own)
//!   with the plan's bucket
//!   ([`DEFAULT_BUCKET_BYTES`] unless `--bucket`; `--direct` sets
//!   [`PlanOptions::direct_bytes`], `off` for none), raw `MPI_Allreduce`s of
//!   a flat buffer of the same bytes in chunks of the bucket, and one raw
//!   `MPI_Allreduce` of the whole buffer. After the warm-up round, rank 0
//!   checks that the reduced gradients are `0.5 × ranks`.
//! - With `--zero`, each round also times ZeRO stage 1's exchange:
//!   [`CandlePlan::reduce_scatter`] (sum) then [`CandlePlan::all_gather`],
//!   against raw `MPI_Reduce`s of each rank's slice of the flat buffer to
//!   it and `MPI_Allgather`s of the slices, in chunks of the bucket.
//! - Each figure is the median, with the range (min–max), of `REPS` rounds
//!   (9 by default) after one warm-up round; each time is the slowest
//!   rank's (every rank starts after a barrier, and the ranks take the
//!   maximum of their times). Ratios are those of the medians, followed by
//!   the range of the ratios within each round; the line ends with
//!   `default` when the bucket is the default. Rank 0 prints the figures,
//!   and first the load average (`/proc/loadavg`).

#[path = "rounds.rs"]
mod rounds;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use candle_nn::Init;
use mpi::traits::Communicator;
use scopetree::candle::CandleStore;
use scopetree::ranks::{
    CandlePlan, DEFAULT_BUCKET_BYTES, DEFAULT_DIRECT_BYTES, PlanOptions, Reduce,
};

use rounds::{
    RawMpi, Spread, bytes_label, compare_line, load_average, once, order, per_round, sizes,
    take_bytes_flag, whole_line,
};

/// The gradient every element holds before a call.
const GRAD: f32 = 0.5;

/// The store of `count` variables of sizes growing as i², `total` `f32`
/// elements in all, on `dev`.
fn store(total: usize, count: usize, dev: &Device) -> CandleStore {
    let store = CandleStore::new();
    for (i, n) in sizes(total, count).into_iter().enumerate() {
        store
            .get(n, &format!("t{i:03}"), Init::Const(0.0), DType::F32, dev)
            .unwrap();
    }
    store
}

/// `grads` with `fresh` as the gradient of each of `plan`'s variables.
fn refill(grads: &mut GradStore, plan: &CandlePlan, fresh: &[Tensor]) {
    for (v, g) in plan.vars().iter().zip(fresh) {
        grads.insert(v.as_tensor(), g.clone());
    }
}

/// The first element of each variable's gradient in `grads`.
fn firsts(grads: &GradStore, plan: &CandlePlan) -> Vec<f32> {
    plan.vars()
        .iter()
        .map(|v| {
            let g = grads
                .get(v.as_tensor())
                .expect("a gradient of every variable");
            g.flatten_all()
                .and_then(|g| g.get(0))
                .and_then(|g| g.to_scalar::<f32>())
                .unwrap()
        })
        .collect()
}

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    let bucket = take_bytes_flag(&mut args, "--bucket");
    let direct = take_bytes_flag(&mut args, "--direct");
    let zero = match args.iter().position(|a| a == "--zero") {
        Some(i) => {
            args.remove(i);
            true
        }
        None => false,
    };
    let dev = match args.iter().position(|a| a == "--device") {
        None => Device::Cpu,
        Some(i) => {
            let name = args.get(i + 1).cloned().unwrap_or_default();
            args.drain(i..(i + 2).min(args.len()));
            match name.as_str() {
                "cpu" => Device::Cpu,
                "cuda" => Device::new_cuda(0).unwrap_or_else(|e| {
                    eprintln!("--device cuda: {e} (build with --features cuda,mpi on a machine with a GPU)");
                    std::process::exit(2);
                }),
                other => {
                    eprintln!("--device {other}: cpu or cuda");
                    std::process::exit(2);
                }
            }
        }
    };
    let sync = || dev.synchronize().expect("the device synchronises");
    let mb: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let reps: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(9);
    let count: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(300);
    let load = load_average();
    let universe = mpi::initialize().expect("MPI initialises once");
    let world = universe.world();
    let total = mb * 1_000_000 / 4;
    let store = store(total, count, &dev);
    let bucket_bytes = bucket.unwrap_or(DEFAULT_BUCKET_BYTES);
    let mut opts = PlanOptions::new().bucket_bytes(bucket_bytes);
    if let Some(d) = direct {
        opts = opts.direct_bytes(d);
    }
    let mut plan = CandlePlan::new(&world, &store, &opts).unwrap();
    let fresh: Vec<Tensor> = plan
        .vars()
        .iter()
        .map(|v| Tensor::full(GRAD, v.dims(), &dev).unwrap())
        .collect();
    // The in-place call's own plan (a plan's spares go to the tensors
    // `all_reduce` makes, and come back from the gradients that
    // `all_reduce_in_place` writes into: one plan for both would have each
    // call find the other's leftovers) and gradients (it writes into their
    // storage).
    let mut plan_in_place = CandlePlan::new(&world, &store, &opts).unwrap();
    let fresh_in_place: Vec<Tensor> = plan
        .vars()
        .iter()
        .map(|v| Tensor::full(GRAD, v.dims(), &dev).unwrap())
        .collect();
    // ZeRO's own plan and gradients (its results replace the gradients of
    // its slice).
    let mut plan_zero = CandlePlan::new(&world, &store, &opts).unwrap();
    let mut grads_zero = GradStore::default();
    let mut grads = GradStore::default();
    let mut grads_in_place = GradStore::default();
    let mut raw = RawMpi::new(total);
    if world.rank() == 0 {
        let label = |bytes: usize, default: usize| {
            let l = bytes_label(bytes);
            if bytes == default {
                format!("{l} (the default)")
            } else {
                l
            }
        };
        println!(
            "candle_bench: ranks: {}; gradients: {count} f32 tensors, {mb} MB in a CandleStore on {:?}; \
             bucket {}, direct {}; median (min–max) of {reps} rounds after a warm-up, the \
             configurations in a new order each round, each time the slowest rank's",
            world.size(),
            dev.location(),
            label(bucket_bytes, DEFAULT_BUCKET_BYTES),
            match opts.direct_bytes_value() {
                usize::MAX => "off".to_owned(),
                d => format!("from {}", label(d, DEFAULT_DIRECT_BYTES)),
            },
        );
        println!("load average at start: {load}");
    }

    // 0: one raw call, 1: raw chunks of the bucket, 2: the plan, 3: the
    // plan in place; with `--zero`, 4: ZeRO's raw calls, 5: the plan's
    // reduce-scatter and all-gather.
    let configs = if zero { 6 } else { 4 };
    let mut times: Vec<Vec<f64>> = (0..configs).map(|_| Vec::with_capacity(reps)).collect();
    for round in 0..=reps {
        for i in order(configs, round) {
            let t = match i {
                0 => once(&world, || raw.whole(&world)),
                1 => once(&world, || raw.chunks(&world, bucket_bytes)),
                2 => {
                    refill(&mut grads, &plan, &fresh);
                    sync();
                    once(&world, || {
                        plan.all_reduce(&world, &mut grads, Reduce::Sum).unwrap();
                        sync();
                    })
                }
                4 => once(&world, || raw.zero(&world, bucket_bytes)),
                5 => {
                    refill(&mut grads_zero, &plan, &fresh);
                    sync();
                    once(&world, || {
                        (plan_zero.reduce_scatter(&world, &mut grads_zero, Reduce::Sum)).unwrap();
                        plan_zero.all_gather(&world).unwrap();
                        sync();
                    })
                }
                _ => {
                    refill(&mut grads_in_place, &plan, &fresh_in_place);
                    sync();
                    once(&world, || {
                        plan_in_place
                            .all_reduce_in_place(&world, &mut grads_in_place, Reduce::Sum)
                            .unwrap();
                        sync();
                    })
                }
            };
            if round > 0 {
                times[i].push(t);
            }
        }
        if round == 0 {
            let want = GRAD * world.size() as f32;
            if zero {
                // This rank's slice holds the sums; the others its own.
                let me = world.rank() as usize;
                for p in plan_zero.partition().pieces(me) {
                    let g = grads_zero.get(plan_zero.vars()[p.var].as_tensor()).unwrap();
                    let got = g.flatten_all().and_then(|g| g.get(p.start)).unwrap();
                    assert_eq!(got.to_scalar::<f32>().unwrap(), want, "ZeRO's sums");
                }
            }
        }
        if round == 0 && world.rank() == 0 {
            let want = GRAD * world.size() as f32;
            for g in [&grads, &grads_in_place] {
                let got = firsts(g, &plan);
                assert!(
                    got.iter().all(|&x| x == want),
                    "reduced gradients {got:?}, want {want}"
                );
            }
        }
    }
    if world.rank() == 0 {
        println!("{}", whole_line(mb, &times[0]));
        for (name, ours) in [
            ("CandlePlan::all_reduce", &times[2]),
            ("CandlePlan::all_reduce_in_place", &times[3]),
        ] {
            println!(
                "{}{}",
                compare_line(
                    &format!("bucket of {}", bytes_label(bucket_bytes)),
                    plan.reduce_buckets(),
                    name,
                    ours,
                    &times[1],
                    bucket_bytes,
                    &times[0],
                ),
                if bucket_bytes == DEFAULT_BUCKET_BYTES {
                    "; default"
                } else {
                    ""
                }
            );
        }
        if zero {
            let (ours, raw) = (Spread::of(&times[5]), Spread::of(&times[4]));
            println!(
                "ZeRO stage 1, bucket of {}: CandlePlan::reduce_scatter + all_gather {}; raw \
                 MPI_Reduce + MPI_Allgather in chunks of the bucket {}; ratio to raw {:.2}x \
                 (rounds: {}), to raw all-reduce chunks {:.2}x",
                bytes_label(bucket_bytes),
                ours.ms(),
                raw.ms(),
                raw.median / ours.median,
                Spread::of(&per_round(&times[4], &times[5])).range_x(),
                Spread::of(&times[1]).median / ours.median,
            );
        }
    }
}
