//! `CandlePlan`'s collectives over CUDA tensors under `mpirun` (features
//! `cuda` and `mpi`), every process on the same one GPU: each rank holds a
//! store on the GPU and the same store on the CPU, with this rank's values
//! and gradients (made on the CPU, so both hold the same bits), and runs
//! every call on both, one after the other: `all_reduce` and
//! `all_reduce_in_place` (sum and mean; buckets that split variables,
//! variables sent from their own buffers, the defaults), ZeRO's
//! `reduce_scatter` and `all_gather`, and `broadcast`. The GPU's results
//! must be the CPU path's, bit for bit, and every rank's must be rank 0's
//! (a hash of the bits, gathered).
//!
//! A test binary without libtest's harness, run under `mpirun` (rank 0
//! prints the lines):
//!
//! ```text
//! cargo build --release --features cuda,mpi --test cuda_ranks
//! mpirun -np 4 target/release/deps/cuda_ranks-<hash>
//! ```
//!
//! Without a device every check prints `skipped: no CUDA device` and counts
//! as ignored (every rank skips alike).

#[path = "support/gpu_harness.rs"]
#[macro_use]
#[allow(
    dead_code,
    reason = "this file uses the harness's helpers, not its runner"
)]
mod gpu_harness;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Init;
use gpu_harness::{Why, bits_of};
use mpi::topology::SimpleCommunicator;
use scopetree::candle::CandleStore;
use scopetree::ranks::{CandlePlan, Collective, PlanOptions, Reduce};

type World = SimpleCommunicator;
type R = Result<(), String>;

/// `f32` and `f64` variables of several sizes: fused ones, ones that a
/// bucket of 4,096 bytes splits, and ones sent from their own buffers.
const VARS: [(&str, usize, DType); 6] = [
    ("a", 3, DType::F32),
    ("b", 1000, DType::F64),
    ("c", 70_000, DType::F32),
    ("d", 5, DType::F32),
    ("e", 33, DType::F64),
    ("f", 50_000, DType::F32),
];

/// Elements `i·scale + shift` of `n` of `dtype`, made on the CPU.
fn ramp(n: usize, scale: f64, shift: f64, dtype: DType) -> Result<Tensor, String> {
    Tensor::arange(0.0, n as f64, &Device::Cpu)
        .and_then(|t| t.affine(scale, shift))
        .and_then(|t| t.to_dtype(dtype))
        .why("a ramp")
}

/// The store of [`VARS`] on `dev`, with this rank's values (the CPU's
/// bits on every device), and its plan over `world`.
fn store(
    world: &World,
    dev: &Device,
    opts: &PlanOptions,
) -> Result<(CandleStore, CandlePlan), String> {
    let s = CandleStore::new();
    for (name, n, dtype) in VARS {
        s.get(n, name, Init::Const(0.0), dtype, dev).why(name)?;
    }
    let r = world.rank() as f64;
    for (_, v) in s.named_vars().why("named_vars")? {
        let t = ramp(v.elem_count(), 0.001, 0.5 + r, v.dtype())?;
        v.set(&t.to_device(dev).why("to_device")?).why("set")?;
    }
    let plan = CandlePlan::new(world, &s, opts).why("plan")?;
    Ok((s, plan))
}

/// This rank's gradients of `vars` (made on the CPU, then moved to their
/// device), with clones of them.
fn grads(world: &World, vars: &[Var]) -> Result<GradStore, String> {
    let r = world.rank() as f64;
    let mut g = GradStore::default();
    for (k, v) in vars.iter().enumerate() {
        let t = ramp(v.elem_count(), 0.37 + r, 1.0 / (k as f64 + 3.0), v.dtype())?;
        g.insert(v.as_tensor(), t.to_device(v.device()).why("to_device")?);
    }
    Ok(g)
}

/// The bits of each variable's gradient in `g`.
fn grad_bits(g: &GradStore, vars: &[Var]) -> Result<Vec<Vec<u64>>, String> {
    vars.iter()
        .map(|v| bits_of(g.get(v.as_tensor()).ok_or("a gradient is missing")?))
        .collect()
}

/// The bits of each variable's value.
fn value_bits(vars: &[Var]) -> Result<Vec<Vec<u64>>, String> {
    vars.iter().map(|v| bits_of(v.as_tensor())).collect()
}

/// Fails unless every rank's `bits` hash to rank 0's.
fn ranks_agree(world: &World, bits: &[Vec<u64>], what: &str) -> R {
    let mut h = DefaultHasher::new();
    bits.hash(&mut h);
    let mine = h.finish().to_le_bytes();
    let mut all = vec![0_u8; 8 * world.size()];
    world.all_gather_bytes(&mine, &mut all).why("all-gather")?;
    let differ: Vec<usize> = (0..world.size())
        .filter(|&r| all[8 * r..8 * r + 8] != all[..8])
        .collect();
    ensure!(
        differ.is_empty(),
        "{what}: ranks {differ:?} differ from rank 0"
    );
    Ok(())
}

fn all_reduce(world: &World, dev: &Device) -> R {
    for opts in [
        PlanOptions::new().bucket_bytes(4096).direct_bytes(64 << 10),
        PlanOptions::new()
            .bucket_bytes(4096)
            .direct_bytes(usize::MAX),
        PlanOptions::new(),
    ] {
        for op in [Reduce::Sum, Reduce::Mean] {
            for in_place in [false, true] {
                let what = format!("{opts:?} {op:?} in place {in_place}");
                let mut got = Vec::new();
                for d in [&Device::Cpu, dev] {
                    let (_s, mut plan) = store(world, d, &opts)?;
                    let vars = plan.vars().to_vec();
                    let mut g = grads(world, &vars)?;
                    if in_place {
                        plan.all_reduce_in_place(world, &mut g, op)
                    } else {
                        plan.all_reduce(world, &mut g, op)
                    }
                    .why(&what)?;
                    for v in &vars {
                        let t = g.get(v.as_tensor()).ok_or("a gradient")?;
                        ensure!(t.device().same_device(d), "{what}: a gradient left {d:?}");
                    }
                    got.push(grad_bits(&g, &vars)?);
                }
                ensure!(
                    got[0] == got[1],
                    "{what}: the GPU's sums differ from the CPU's"
                );
                ranks_agree(world, &got[1], &what)?;
            }
        }
    }
    Ok(())
}

fn zero(world: &World, dev: &Device) -> R {
    for opts in [PlanOptions::new().bucket_bytes(4096), PlanOptions::new()] {
        let what = format!("{opts:?}");
        let mut got = Vec::new();
        for d in [&Device::Cpu, dev] {
            let (_s, mut plan) = store(world, d, &opts)?;
            let vars = plan.vars().to_vec();
            let mut g = grads(world, &vars)?;
            plan.reduce_scatter(world, &mut g, Reduce::Mean)
                .why("reduce-scatter")?;
            let reduced = grad_bits(&g, &vars)?;
            // Each rank moves its values (its slice is what the others
            // take), then every slice goes to every rank.
            let step = world.rank() as f64 + 1.0;
            for v in &vars {
                v.set(&v.as_tensor().affine(0.5, step).why("move")?)
                    .why("set")?;
            }
            plan.all_gather(world).why("all-gather")?;
            got.push((reduced, value_bits(&vars)?));
        }
        ensure!(
            got[0].0 == got[1].0,
            "{what}: the GPU's reduce-scatter differs from the CPU's"
        );
        ensure!(
            got[0].1 == got[1].1,
            "{what}: the GPU's all-gather differs from the CPU's"
        );
        ranks_agree(
            world,
            &got[1].1,
            &format!("{what}: the values after the all-gather"),
        )?;
    }
    Ok(())
}

fn broadcast(world: &World, dev: &Device) -> R {
    let root = world.size() - 1;
    for opts in [PlanOptions::new().bucket_bytes(12), PlanOptions::new()] {
        let what = format!("{opts:?} from rank {root}");
        let mut got = Vec::new();
        for d in [&Device::Cpu, dev] {
            let (_s, mut plan) = store(world, d, &opts)?;
            plan.broadcast(world, root).why(&what)?;
            got.push(value_bits(plan.vars())?);
        }
        ensure!(
            got[0] == got[1],
            "{what}: the GPU's values differ from the CPU's"
        );
        ranks_agree(world, &got[1], &what)?;
        // The root's own values: rank `root`'s ramp.
        let want: Vec<Vec<u64>> = (VARS.iter())
            .map(|&(_, n, dtype)| {
                let t = ramp(n, 0.001, 0.5 + root as f64, dtype)?;
                bits_of(&t)
            })
            .collect::<Result<_, _>>()?;
        // The plan's variables are in name order, as `VARS`.
        ensure!(got[1] == want, "{what}: not the root's values");
    }
    Ok(())
}

type Named = (&'static str, fn(&World, &Device) -> R);

fn main() -> ExitCode {
    let Some(universe) = mpi::initialize() else {
        eprintln!("MPI was already initialised");
        return ExitCode::FAILURE;
    };
    let world = universe.world();
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(300));
        eprintln!("cuda_ranks: still running after 5 minutes; a collective hangs");
        std::process::exit(3);
    });
    let checks: &[Named] = &[
        (
            "ranks_all_reduce_of_cuda_gradients_matches_the_cpu_path",
            all_reduce,
        ),
        (
            "ranks_zero_exchange_of_cuda_tensors_matches_the_cpu_path",
            zero,
        ),
        (
            "ranks_broadcast_of_cuda_values_matches_the_cpu_path",
            broadcast,
        ),
    ];
    let me = world.rank();
    let n = world.size();
    if me == 0 {
        println!("\nrunning {} tests at {n} ranks", checks.len());
    }
    let device = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            if me == 0 {
                for (name, _) in checks {
                    println!("test {name} ... ignored, skipped: no CUDA device");
                }
                let why = e.to_string();
                println!(
                    "skipped: no CUDA device ({})",
                    why.lines().next().unwrap_or("")
                );
                println!(
                    "\ntest result: ok. 0 passed; 0 failed; {} ignored; 0 measured; 0 filtered out\n",
                    checks.len()
                );
            }
            return ExitCode::SUCCESS;
        }
    };
    let mut failed = 0;
    for (name, check) in checks {
        let t0 = Instant::now();
        let outcome = check(&world, &device);
        if let Err(e) = &outcome {
            eprintln!("rank {me}: {name}: {e}");
        }
        // Every rank learns which ranks failed.
        let mut flags = vec![0_u8; n];
        let mine = [u8::from(outcome.is_err())];
        let gathered = world.all_gather_bytes(&mine, &mut flags);
        let failing: Vec<usize> = (0..n).filter(|&r| flags[r] != 0).collect();
        let ok = gathered.is_ok() && failing.is_empty();
        if !ok {
            failed += 1;
        }
        if me == 0 {
            let s = t0.elapsed().as_secs_f64();
            if ok {
                println!("PASS {name} ({n} ranks, {s:.2} s)");
                println!("test {name} ... ok");
            } else {
                let why = outcome.err().unwrap_or_else(|| "on other ranks".into());
                println!("FAIL {name} ({n} ranks; ranks {failing:?}): {why}");
                println!("test {name} ... FAILED");
            }
        }
    }
    if me == 0 {
        let verdict = if failed == 0 { "ok" } else { "FAILED" };
        println!(
            "\ntest result: {verdict}. {} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out\n",
            checks.len() - failed
        );
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
