//! NCCL over CUDA tensors (feature `nccl`) at a world of one, the only
//! world one GPU allows (NCCL refuses two ranks on one device): every
//! call of `ranks::Nccl` with exact results, its errors, `CandlePlan`'s
//! all-reduce and broadcast over NCCL against its MPI path on the CPU, bit
//! for bit, ZeRO over NCCL (`ZeroAdamW`'s moments on the GPU) against
//! replicated AdamW steps on the CPU, and the watchdog aborting a call that waits past its timeout
//! (in a child process, which must exit with status 3).
//!
//! A test binary without libtest's harness: without a device every check
//! prints `skipped: no CUDA device` and counts as ignored.
//!
//! ```text
//! cargo test --release --features nccl --test cuda_nccl
//! ```

#[path = "support/gpu_harness.rs"]
#[macro_use]
mod gpu_harness;

use std::process::ExitCode;
use std::time::Duration;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Init;
use gpu_harness::{Check, Why, bits_of as bits};
use scopetree::candle::CandleStore;
use scopetree::ranks::{
    CandlePlan, Error, Nccl, PlanOptions, Reduce, STALL_EXIT_CODE, SingleProcess, ZeroAdamW,
};

type R = Result<(), String>;

/// Set in the child process of the watchdog check.
const STALL_CHILD: &str = "SCOPETREE_NCCL_STALL_CHILD";

fn main() -> ExitCode {
    if std::env::var_os(STALL_CHILD).is_some() {
        return stall_child();
    }
    let checks: &[Check] = &[
        ("calls_at_one_rank_give_their_input_exactly", calls),
        ("bad_inputs_are_errors_that_change_nothing", errors),
        (
            "plan_all_reduce_over_nccl_matches_the_mpi_path_on_the_cpu",
            plan_all_reduce,
        ),
        (
            "plan_broadcast_over_nccl_keeps_the_roots_values",
            plan_broadcast,
        ),
        (
            "zero_over_nccl_with_moments_on_the_device_matches_the_cpus_replicated_steps",
            zero,
        ),
        (
            "the_watchdog_aborts_a_call_past_its_timeout_and_exits_3",
            watchdog,
        ),
    ];
    gpu_harness::run(checks)
}

/// `n` distinct values of `dtype` on `dev`, as a `rows × (n / rows)` matrix.
fn values(n: usize, rows: usize, dtype: DType, dev: &Device) -> Result<Tensor, String> {
    Tensor::arange(0.0, n as f64, dev)
        .and_then(|t| t.affine(0.37, -3.0))
        .and_then(|t| if dtype == DType::U32 { t.abs() } else { Ok(t) })
        .and_then(|t| t.to_dtype(dtype))
        .and_then(|t| t.reshape((rows, n / rows)))
        .why("values")
}

fn calls(dev: &Device) -> R {
    let nccl = Nccl::new(&SingleProcess, dev).why("init")?;
    ensure!((nccl.rank(), nccl.size()) == (0, 1), "rank and size");
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16, DType::U32] {
        let t = values(4096, 64, dtype, dev)?;
        // A transposed view and a narrowed one: NCCL gets contiguous copies.
        for (what, x) in [
            ("whole", t.clone()),
            ("transposed", t.t().why("t")?),
            ("narrowed", t.narrow(1, 3, 40).why("narrow")?),
        ] {
            let before = bits(&x)?;
            let sum = nccl.all_reduce_sum(&x).why("all-reduce")?;
            ensure!(sum.dims() == x.dims(), "{dtype:?} {what}: all-reduce shape");
            ensure!(
                bits(&sum)? == before,
                "{dtype:?} {what}: all-reduce of one rank"
            );
            let b = nccl.broadcast(0, &x).why("broadcast")?;
            ensure!(bits(&b)? == before, "{dtype:?} {what}: broadcast");
            let rs = nccl.reduce_scatter_sum(&x).why("reduce-scatter")?;
            ensure!(
                rs.dims() == [x.elem_count()],
                "{dtype:?} {what}: reduce-scatter shape"
            );
            ensure!(bits(&rs)? == before, "{dtype:?} {what}: reduce-scatter");
            let ag = nccl.all_gather(&x).why("all-gather")?;
            ensure!(bits(&ag)? == before, "{dtype:?} {what}: all-gather");
            ensure!(
                bits(&x)? == before,
                "{dtype:?} {what}: a call changed its input"
            );
        }
    }
    Ok(())
}

fn errors(dev: &Device) -> R {
    let err = Nccl::new(&SingleProcess, &Device::Cpu).expect_err("NCCL on the CPU");
    ensure!(matches!(err, Error::Nccl { .. }), "init on the CPU: {err}");
    let nccl = Nccl::new(&SingleProcess, dev).why("init")?;
    let host = Tensor::new(&[1.0_f32, 2.0], &Device::Cpu).why("host")?;
    let err = nccl.all_reduce_sum(&host).expect_err("a CPU tensor");
    let text = err.to_string();
    ensure!(
        matches!(err, Error::Nccl { .. }) && text.contains("Cpu") && text.contains("Cuda"),
        "a CPU tensor: {text}"
    );
    let x = values(8, 2, DType::F32, dev)?;
    let err = nccl.broadcast(1, &x).expect_err("root 1 of 1");
    ensure!(
        matches!(
            err,
            Error::BadRank {
                rank: 1,
                size: 1,
                ..
            }
        ),
        "{err}"
    );
    let small = Tensor::new(&[1_i16, 2], dev);
    if let Ok(small) = small {
        let err = nccl.all_reduce_sum(&small).expect_err("I16");
        ensure!(err.to_string().contains("I16"), "I16: {err}");
    }
    let err = nccl
        .with_timeout(Some(Duration::ZERO))
        .expect_err("a zero timeout");
    ensure!(matches!(err, Error::BadOption { .. }), "{err}");
    // The plan: a gradient on the CPU, everything else on the device.
    let nccl = Nccl::new(&SingleProcess, dev).why("init")?;
    let store = mixed(dev)?;
    let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new()).why("plan")?;
    let vars = plan.vars().to_vec();
    let mut grads = grads_of(&vars)?;
    grads.insert(
        vars[0].as_tensor(),
        vars[0].as_tensor().to_device(&Device::Cpu).why("cpu")?,
    );
    let before = grad_bits(&grads, &vars)?;
    let err = plan
        .all_reduce_nccl(&SingleProcess, &nccl, &mut grads, Reduce::Sum)
        .expect_err("a CPU gradient");
    ensure!(err.to_string().contains("gradient `a`"), "{err}");
    ensure!(
        grad_bits(&grads, &vars)? == before,
        "a failed all-reduce changed a gradient"
    );
    let err = plan
        .broadcast_nccl(&SingleProcess, &nccl, 1)
        .expect_err("root 1 of 1");
    ensure!(matches!(err, Error::BadRank { .. }), "{err}");
    Ok(())
}

/// Five variables: fused `f32` and `f64` ones, and `c` large enough to be
/// sent on its own.
fn mixed(dev: &Device) -> Result<CandleStore, String> {
    let store = CandleStore::new();
    for (name, n, dtype) in [
        ("a", 3, DType::F32),
        ("b", 1000, DType::F64),
        ("c", 70_000, DType::F32),
        ("d", 5, DType::F32),
        ("e", 33, DType::F64),
    ] {
        let v = store
            .get(n, name, Init::Const(0.0), dtype, dev)
            .why("get")?;
        let t = Tensor::arange(0.0, n as f64, dev)
            .and_then(|t| t.affine(0.001, 0.5))
            .and_then(|t| t.to_dtype(dtype))
            .why(name)?;
        store
            .var(name)
            .why("var")?
            .ok_or("made")?
            .set(&t)
            .why("set")?;
        drop(v);
    }
    Ok(store)
}

/// The gradients of `Σ sin(w) · w` over `vars`.
fn grads_of(vars: &[Var]) -> Result<GradStore, String> {
    let mut loss: Option<Tensor> = None;
    for v in vars {
        let term = (v.as_tensor().sin())
            .and_then(|s| s.mul(v.as_tensor()))
            .and_then(|t| t.sum_all())
            .and_then(|t| t.to_dtype(DType::F64))
            .why("term")?;
        loss = Some(match loss {
            None => term,
            Some(l) => (l + term).why("sum")?,
        });
    }
    loss.ok_or("no loss")?.backward().why("backward")
}

fn grad_bits(grads: &GradStore, vars: &[Var]) -> Result<Vec<Vec<u64>>, String> {
    vars.iter()
        .map(|v| bits(grads.get(v.as_tensor()).ok_or("a gradient is missing")?))
        .collect()
}

/// `grads` of `from`'s variables as gradients of `to`'s (the same model on
/// another device), copied there.
fn moved(grads: &GradStore, from: &[Var], to: &[Var]) -> Result<GradStore, String> {
    let mut out = GradStore::default();
    for (f, t) in from.iter().zip(to) {
        let g = grads.get(f.as_tensor()).ok_or("a gradient")?;
        out.insert(t.as_tensor(), g.to_device(t.device()).why("to_device")?);
    }
    Ok(out)
}

fn plan_all_reduce(dev: &Device) -> R {
    let nccl = Nccl::new(&SingleProcess, dev).why("init")?;
    for opts in [
        PlanOptions::new().bucket_bytes(4096).direct_bytes(64 << 10),
        PlanOptions::new(),
    ] {
        for op in [Reduce::Sum, Reduce::Mean] {
            let what = format!("{opts:?} {op:?}");
            // The MPI path on the CPU.
            let store = mixed(&Device::Cpu)?;
            let mut plan = CandlePlan::new(&SingleProcess, &store, &opts).why("plan")?;
            let vars = plan.vars().to_vec();
            let mut grads = grads_of(&vars)?;
            plan.all_reduce(&SingleProcess, &mut grads, op).why(&what)?;
            let want = grad_bits(&grads, &vars)?;
            // NCCL on the device, from the CPU's gradients moved there
            // (exact copies: the devices' `sin` may differ in the last bit).
            let store = mixed(dev)?;
            let mut plan = CandlePlan::new(&SingleProcess, &store, &opts).why("plan")?;
            let cpu_vars = vars;
            let vars = plan.vars().to_vec();
            let mut grads = moved(&grads_of(&cpu_vars)?, &cpu_vars, &vars)?;
            let before = grad_bits(&grads, &vars)?;
            plan.all_reduce_nccl(&SingleProcess, &nccl, &mut grads, op)
                .why(&what)?;
            let got = grad_bits(&grads, &vars)?;
            ensure!(got == before, "{what}: one rank's sum changed a gradient");
            ensure!(got == want, "{what}: NCCL's sums differ from the CPU's");
            for v in &vars {
                let g = grads.get(v.as_tensor()).ok_or("a gradient")?;
                ensure!(
                    g.device().same_device(dev),
                    "{what}: a gradient left the device"
                );
                ensure!(g.dims() == v.dims(), "{what}: a gradient's shape");
            }
            // A variable without a gradient stays without one.
            let mut partial = moved(&grads_of(&cpu_vars[1..])?, &cpu_vars[1..], &vars[1..])?;
            plan.all_reduce_nccl(&SingleProcess, &nccl, &mut partial, op)
                .why(&what)?;
            ensure!(
                partial.get(vars[0].as_tensor()).is_none(),
                "{what}: a gradient appeared"
            );
        }
    }
    Ok(())
}

fn plan_broadcast(dev: &Device) -> R {
    let nccl = Nccl::new(&SingleProcess, dev).why("init")?;
    let store = mixed(dev)?;
    let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new()).why("plan")?;
    let before: Vec<Vec<u64>> = plan
        .vars()
        .iter()
        .map(|v| bits(v.as_tensor()))
        .collect::<Result<_, _>>()?;
    plan.broadcast_nccl(&SingleProcess, &nccl, 0)
        .why("broadcast")?;
    let after: Vec<Vec<u64>> = plan
        .vars()
        .iter()
        .map(|v| bits(v.as_tensor()))
        .collect::<Result<_, _>>()?;
    ensure!(after == before, "the root's values changed");
    Ok(())
}

/// Three ZeRO steps over NCCL on the device (`reduce_scatter_nccl`,
/// `ZeroAdamW` with its moments on the GPU, `all_gather_nccl`) against
/// three replicated ones on the device (`all_reduce_nccl`, scopetree's
/// AdamW), from the same gradients each step (the CPU's, moved, so exact
/// copies): the values bit for bit, the moments on the device.
fn zero(dev: &Device) -> R {
    let nccl = Nccl::new(&SingleProcess, dev).why("init")?;
    let params = candle_nn::ParamsAdamW {
        lr: 0.01,
        weight_decay: 0.1,
        ..candle_nn::ParamsAdamW::default()
    };
    let cpu = mixed(&Device::Cpu)?;
    let cvars = CandlePlan::new(&SingleProcess, &cpu, &PlanOptions::new())
        .why("plan")?
        .vars()
        .to_vec();
    let rep = mixed(dev)?;
    let mut rplan = CandlePlan::new(&SingleProcess, &rep, &PlanOptions::new()).why("plan")?;
    let mut ropt = scopetree::candle::AdamW::for_store(&rep, "", params.clone()).why("adamw")?;
    let zero = mixed(dev)?;
    let mut zplan = CandlePlan::new(&SingleProcess, &zero, &PlanOptions::new()).why("plan")?;
    let mut zopt = ZeroAdamW::new(&SingleProcess, &zplan, params).why("zero")?;
    let (rvars, zvars) = (rplan.vars().to_vec(), zplan.vars().to_vec());
    let before: Vec<Vec<u64>> = rvars
        .iter()
        .map(|v| bits(v.as_tensor()))
        .collect::<Result<_, _>>()?;
    for step in 0..3 {
        let what = format!("step {step}");
        // The gradients at the replicated run's values, on the CPU.
        for (c, r) in cvars.iter().zip(&rvars) {
            c.set(&r.as_tensor().to_device(&Device::Cpu).why("to cpu")?)
                .why("set")?;
        }
        let g = grads_of(&cvars)?;
        let mut rg = moved(&g, &cvars, &rvars)?;
        let mut zg = moved(&g, &cvars, &zvars)?;
        rplan
            .all_reduce_nccl(&SingleProcess, &nccl, &mut rg, Reduce::Mean)
            .why(&what)?;
        candle_nn::Optimizer::step(&mut ropt, &rg).why(&what)?;
        zplan
            .reduce_scatter_nccl(&SingleProcess, &nccl, &mut zg, Reduce::Mean)
            .why(&what)?;
        zopt.step(&zg).why(&what)?;
        zplan.all_gather_nccl(&SingleProcess, &nccl).why(&what)?;
    }
    let mut after = Vec::new();
    for (r, z) in rvars.iter().zip(&zvars) {
        let b = bits(r.as_tensor())?;
        ensure!(
            b == bits(z.as_tensor())?,
            "ZeRO and the replicated steps differ"
        );
        ensure!(z.device().same_device(dev), "a variable left the device");
        after.push(b);
    }
    ensure!(after != before, "nothing moved");
    for m in zopt.state().all_vars().why("state")? {
        if m.dims().is_empty() {
            continue; // the step count, on the CPU
        }
        ensure!(m.device().same_device(dev), "a moment is not on the GPU");
    }
    ensure!(zopt.step_count().why("count")? == 3, "three steps");
    Ok(())
}

/// The child of [`watchdog`]: queues a long computation, then a call with a
/// timeout of 1 ms, which must end the process with status 3.
fn stall_child() -> ExitCode {
    let run = || -> Result<(), String> {
        let dev = Device::new_cuda(0).why("device")?;
        let nccl = Nccl::new(&SingleProcess, &dev)
            .why("init")?
            .with_timeout(Some(Duration::from_millis(1)))
            .why("timeout")?;
        let a = Tensor::randn(0.0_f32, 1.0, (8192, 8192), &dev).why("randn")?;
        let mut b = a.clone();
        for _ in 0..40 {
            b = b.matmul(&a).why("matmul")?;
        }
        nccl.all_reduce_sum(&b.narrow(0, 0, 1).why("narrow")?)
            .why("all-reduce")?;
        Err("the call returned: the watchdog did not end the process".into())
    };
    if let Err(e) = run() {
        eprintln!("{e}");
    }
    ExitCode::FAILURE
}

fn watchdog(_dev: &Device) -> R {
    let exe = std::env::current_exe().why("current_exe")?;
    let out = std::process::Command::new(exe)
        .env(STALL_CHILD, "1")
        .output()
        .why("child")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(STALL_EXIT_CODE),
        "the child exited with {:?}: {stderr}",
        out.status
    );
    ensure!(
        stderr.contains("scopetree watchdog: rank 0 waited")
            && stderr.contains("in NCCL all-reduce on the GPU; timeout 0.001 s passed: aborting the NCCL communicator"),
        "the watchdog's line: {stderr}"
    );
    Ok(())
}
