//! The candle store on a CUDA device (feature `cuda`): loads straight to the
//! device (created, in place, before the build, converted), their checks
//! and atomicity, device mismatches, saves from the device, `AdamW`, and
//! the ranks layer over a device store (the all-reduce through host
//! staging, the manager and the async saver at one rank; ZeRO's
//! reduce-scatter and all-gather, and the broadcast, at two ranks as
//! threads). Each check compares
//! with the same work on the CPU, bit for bit.
//!
//! A test binary without libtest's harness: without a device every check
//! prints `skipped: no CUDA device` and counts as ignored.
//!
//! ```text
//! cargo test --release --features cuda --test cuda_store
//! ```

#[path = "support/gpu_harness.rs"]
#[macro_use]
mod gpu_harness;
#[path = "support/thread_world.rs"]
mod thread_world;

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;

use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{Init, Optimizer, VarBuilder};
use gpu_harness::{Check, Why};
use scopetree::candle::{AdamW, CandleStore, Error};
use scopetree::checkpoint::{self, Checkpointable, FloatDtype, LoadOptions, SaveOptions};

type R = Result<(), String>;

fn main() -> ExitCode {
    let checks: &[Check] = &[
        ("load_on_creates_every_dtype_on_the_device", load_on_creates),
        (
            "load_before_build_goes_to_the_models_device",
            load_before_build,
        ),
        ("strict_load_into_device_vars_stays_in_place", in_place),
        ("create_with_a_dtype_conversion_on_the_device", conversion),
        ("bad_checksum_or_missing_name_changes_no_device_var", atomic),
        ("device_mismatch_names_both_devices", mismatch),
        ("saves_of_device_vars_match_cpu_saves_byte_for_byte", saves),
        ("device_memory_of_a_load_is_the_tensors", device_memory),
        ("adamw_on_the_device_matches_candles", adamw),
        (
            "ranks_all_reduce_of_device_gradients_matches_the_cpus",
            ranks_all_reduce,
        ),
        (
            "ranks_zero_exchange_and_broadcast_at_2_thread_ranks_match_the_cpus",
            ranks_zero,
        ),
        (
            "ranks_manager_and_async_saver_keep_a_device_store",
            ranks_checkpoints,
        ),
    ];
    gpu_harness::run(checks)
}

/// A model of `n` tensors `layers.NN.w` of `elems` values of `dtype`, plus
/// one of each other dtype, on `device`.
fn model(n: usize, elems: usize, dtype: DType, device: &Device) -> Result<CandleStore, String> {
    let store = CandleStore::new();
    for i in 0..n {
        let v: Vec<f32> = (0..elems)
            .map(|k| i as f32 + (k % 977) as f32 / 1000.0)
            .collect();
        let t = Tensor::from_vec(v, elems, device)
            .why("tensor")?
            .to_dtype(dtype)
            .why("dtype")?;
        let name = format!("layers.{i:02}.w");
        store
            .get(elems, &name, Init::Const(0.0), dtype, device)
            .why("get")?;
        store
            .var(&name)
            .why("var")?
            .ok_or("made")?
            .set(&t)
            .why("set")?;
    }
    for (name, dt) in [
        ("extra.u8", DType::U8),
        ("extra.u32", DType::U32),
        ("extra.i64", DType::I64),
        ("extra.f64", DType::F64),
        ("extra.f16", DType::F16),
        ("extra.f32", DType::F32),
    ] {
        let t = Tensor::arange(0_u32, 7, device)
            .why("arange")?
            .to_dtype(dt)
            .why("dtype")?;
        store
            .get(7, name, Init::Const(0.0), dt, device)
            .why("get")?;
        store
            .var(name)
            .why("var")?
            .ok_or("made")?
            .set(&t)
            .why("set")?;
    }
    Ok(store)
}

/// A variable's name, dtype, whether it is on a CUDA device, its bytes.
type Held = (String, DType, bool, Vec<u8>);

/// Every variable's name, dtype, device kind and little-endian bytes.
fn contents(store: &CandleStore) -> Result<Vec<Held>, String> {
    let mut out = Vec::new();
    for (k, v) in store.named_vars().why("named_vars")? {
        let mut bytes = Vec::new();
        v.write_le(1 << 20, &mut |p| {
            bytes.extend_from_slice(p);
            Ok(())
        })
        .why("bytes")?;
        out.push((k, v.as_tensor().dtype(), v.device().is_cuda(), bytes));
    }
    Ok(out)
}

fn bytes_only(c: &[Held]) -> Vec<(String, DType, Vec<u8>)> {
    c.iter()
        .map(|(k, d, _, b)| (k.clone(), *d, b.clone()))
        .collect()
}

fn all_on(store: &CandleStore, cuda: bool) -> R {
    for (k, v) in store.named_vars().why("named_vars")? {
        ensure!(
            v.device().is_cuda() == cuda,
            "{k} is on {:?}",
            v.device().location()
        );
    }
    Ok(())
}

fn tmp() -> Result<tempfile::TempDir, String> {
    tempfile::tempdir().why("tempdir")
}

fn load_on_creates(dev: &Device) -> R {
    let cpu = model(5, 300_001, DType::BF16, &Device::Cpu)?;
    let dir = tmp()?;
    cpu.save_sharded(dir.path(), &SaveOptions::new().max_shard_size(1 << 20))
        .why("save")?;
    let want = bytes_only(&contents(&cpu)?);
    for budget in [0, 1 << 20, 256 << 20] {
        let store = CandleStore::new();
        let opts = LoadOptions::new().create(true).staging_budget(budget);
        store.load_on(dir.path(), &opts, dev).why("load_on")?;
        all_on(&store, true)?;
        ensure!(
            bytes_only(&contents(&store)?) == want,
            "values differ at budget {budget}"
        );
        // The staging kept is page-locked memory within the budget.
        ensure!(
            store.staging_bytes() <= budget.max(128 << 10) + (8 << 20),
            "staging {}",
            store.staging_bytes()
        );
    }
    Ok(())
}

/// A small candle-nn model: embedding, RMS norm, linear head.
fn small(
    vb: &VarBuilder<'_>,
) -> candle_core::Result<(candle_nn::Embedding, candle_nn::RmsNorm, candle_nn::Linear)> {
    Ok((
        candle_nn::embedding(300, 64, vb.pp("emb"))?,
        candle_nn::rms_norm(64, 1e-5, vb.pp("norm"))?,
        candle_nn::linear(64, 300, vb.pp("head"))?,
    ))
}

fn logits(
    m: &(candle_nn::Embedding, candle_nn::RmsNorm, candle_nn::Linear),
    dev: &Device,
) -> Result<Vec<u32>, String> {
    let ids = Tensor::arange(0_u32, 40, dev).why("ids")?;
    let h = m.0.forward(&ids).why("emb")?;
    let h = m.1.forward(&h).why("norm")?;
    let y = m.2.forward(&h).why("head")?;
    let v: Vec<f32> = y.flatten_all().why("flat")?.to_vec1().why("to_vec1")?;
    Ok(v.iter().map(|x| x.to_bits()).collect())
}

fn load_before_build(dev: &Device) -> R {
    let dir = tmp()?;
    let trained = CandleStore::new();
    small(&trained.var_builder(DType::F32, &Device::Cpu)).why("build")?;
    let f = dir.path().join("small.safetensors");
    trained.save(&f).why("save")?;
    // candle's own loader on the device.
    // SAFETY: the file was written above and nothing changes it while mapped.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&f], DType::F32, dev) }.why("mmap")?;
    let want = logits(&small(&vb).why("candle build")?, dev)?;
    // Ours: loaded before the build, placed by the build's first get.
    let store = CandleStore::new();
    store
        .load(&f, &LoadOptions::new().create(true))
        .why("load")?;
    ensure!(store.is_pending(), "the load waits for the build");
    store.seal();
    let m = small(&store.var_builder(DType::F32, dev)).why("sealed build on the device")?;
    all_on(&store, true)?;
    ensure!(store.unused().why("unused")?.is_empty(), "unused names");
    ensure!(
        logits(&m, dev)? == want,
        "logits differ from candle's loader"
    );
    Ok(())
}

fn in_place(dev: &Device) -> R {
    let src = model(3, 100_000, DType::F32, &Device::Cpu)?;
    let dir = tmp()?;
    src.save_sharded(dir.path(), &SaveOptions::new().max_shard_size(500_000))
        .why("save")?;
    let built = model(3, 100_000, DType::F32, dev)?;
    for (_, v) in built.named_vars().why("vars")? {
        v.set(&v.zeros_like().why("zeros")?).why("zero")?;
    }
    let held: Var = built.var("layers.01.w").why("var")?.ok_or("built")?;
    let id = held.as_tensor().id();
    built
        .load(dir.path(), &LoadOptions::new().staging_budget(1 << 20))
        .why("load")?;
    all_on(&built, true)?;
    ensure!(
        bytes_only(&contents(&built)?) == bytes_only(&contents(&src)?),
        "values differ"
    );
    let now = built.var("layers.01.w").why("var")?.ok_or("kept")?;
    ensure!(
        now.as_tensor().id() == id,
        "the Var was replaced, not written in place"
    );
    let first: f32 = held
        .as_tensor()
        .get(1)
        .why("get")?
        .to_scalar()
        .why("scalar")?;
    ensure!(first == 1.001, "the held Var sees {first}");
    Ok(())
}

fn conversion(dev: &Device) -> R {
    let src = model(2, 200_003, DType::BF16, &Device::Cpu)?;
    let dir = tmp()?;
    src.save_sharded(dir.path(), &SaveOptions::new())
        .why("save")?;
    let opts = LoadOptions::new()
        .create(true)
        .create_floats_as(FloatDtype::F32);
    let cpu = CandleStore::new();
    cpu.load_on(dir.path(), &opts, &Device::Cpu)
        .why("cpu load")?;
    let gpu = CandleStore::new();
    gpu.load_on(dir.path(), &opts.clone().staging_budget(1 << 20), dev)
        .why("device load")?;
    all_on(&gpu, true)?;
    let w = gpu.var("layers.00.w").why("var")?.ok_or("made")?;
    ensure!(
        w.as_tensor().dtype() == DType::F32,
        "made {:?}",
        w.as_tensor().dtype()
    );
    ensure!(
        bytes_only(&contents(&gpu)?) == bytes_only(&contents(&cpu)?),
        "conversions differ"
    );
    Ok(())
}

/// Saves with a checksum of every tensor in each shard's metadata.
fn save_with_checksums(store: &CandleStore, dir: &Path) -> R {
    let mut meta = HashMap::new();
    for (k, v) in store.named_vars().why("vars")? {
        let mut bytes = Vec::new();
        v.write_le(1 << 20, &mut |p| {
            bytes.extend_from_slice(p);
            Ok(())
        })
        .why("bytes")?;
        let sum = xxhash_rust::xxh3::xxh3_128(&bytes);
        meta.insert(format!("scopetree_xxh3/{k}"), format!("{sum:032x}"));
    }
    store
        .save_sharded(
            dir,
            &SaveOptions::new().max_shard_size(300_000).metadata(meta),
        )
        .why("save")?;
    Ok(())
}

fn atomic(dev: &Device) -> R {
    let src = model(4, 60_000, DType::F32, &Device::Cpu)?;
    let dir = tmp()?;
    save_with_checksums(&src, dir.path())?;
    let mut shards: Vec<_> = std::fs::read_dir(dir.path())
        .why("dir")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    let last = shards.last().ok_or("no shard")?;
    let mut bytes = std::fs::read(last).why("read")?;
    let n = bytes.len();
    bytes[n - 5] ^= 0x33;
    std::fs::write(last, bytes).why("write")?;

    let built = model(4, 60_000, DType::F32, dev)?;
    let before = contents(&built)?;
    let err = built
        .load(dir.path(), &LoadOptions::new())
        .err()
        .ok_or("a corrupt shard loaded")?;
    ensure!(
        matches!(&err, Error::Checkpoint(checkpoint::Error::Corrupted { .. })),
        "not a checksum error: {err}"
    );
    ensure!(contents(&built)? == before, "a device var changed");
    let fresh = CandleStore::new();
    let err = fresh
        .load_on(dir.path(), &LoadOptions::new().create(true), dev)
        .err()
        .ok_or("a corrupt shard loaded")?;
    ensure!(
        matches!(&err, Error::Checkpoint(checkpoint::Error::Corrupted { .. })),
        "{err}"
    );
    ensure!(
        fresh.with_store(|s| s.tree().var_count()) == 0,
        "variables made"
    );
    // A missing name: refused before any read.
    built
        .get(3, "head.bias", Init::Const(1.0), DType::F32, dev)
        .why("get")?;
    let before = contents(&built)?;
    let err = built
        .load(dir.path(), &LoadOptions::new())
        .err()
        .ok_or("loaded")?;
    ensure!(err.to_string().contains("head.bias"), "{err}");
    ensure!(contents(&built)? == before, "a device var changed");
    Ok(())
}

fn mismatch(dev: &Device) -> R {
    let on_dev = model(1, 10, DType::F32, dev)?;
    let dir = tmp()?;
    let f = dir.path().join("m.safetensors");
    on_dev.save(&f).why("save")?;
    let before = contents(&on_dev)?;
    let err = on_dev
        .load_on(&f, &LoadOptions::new(), &Device::Cpu)
        .err()
        .ok_or("loaded across devices")?;
    let text = err.to_string();
    ensure!(matches!(err, Error::LoadDevice { .. }), "{text}");
    ensure!(text.contains("Cpu") && text.contains("Cuda"), "{text}");
    ensure!(contents(&on_dev)? == before, "changed");
    // A model built on the CPU from variables loaded onto the device.
    let store = CandleStore::new();
    store
        .load_on(&f, &LoadOptions::new().create(true), dev)
        .why("load")?;
    let err = store
        .get(
            10,
            "layers.00.w",
            Init::Const(0.0),
            DType::F32,
            &Device::Cpu,
        )
        .err()
        .ok_or("a CPU get of a device variable")?;
    let text = err.to_string();
    ensure!(text.contains("Cpu") && text.contains("Cuda"), "{text}");
    Ok(())
}

fn saves(dev: &Device) -> R {
    let cpu = model(3, 500_000, DType::F32, &Device::Cpu)?;
    let gpu = model(3, 500_000, DType::F32, dev)?;
    let dir = tmp()?;
    let (a, b) = (
        dir.path().join("cpu.safetensors"),
        dir.path().join("gpu.safetensors"),
    );
    cpu.save(&a).why("cpu save")?;
    gpu.save(&b).why("device save")?;
    ensure!(
        std::fs::read(&a).why("read")? == std::fs::read(&b).why("read")?,
        "files differ"
    );
    for (opts, name) in [
        (SaveOptions::new().max_shard_size(1 << 20), "sharded"),
        (SaveOptions::new().floats_as(FloatDtype::BF16), "bf16"),
    ] {
        let (da, db) = (
            dir.path().join(format!("c-{name}")),
            dir.path().join(format!("g-{name}")),
        );
        cpu.save_sharded(&da, &opts).why("cpu save")?;
        gpu.save_sharded(&db, &opts).why("device save")?;
        let back_a = CandleStore::new();
        back_a
            .load_on(&da, &LoadOptions::new().create(true), &Device::Cpu)
            .why("load")?;
        let back_b = CandleStore::new();
        back_b
            .load_on(&db, &LoadOptions::new().create(true), &Device::Cpu)
            .why("load")?;
        ensure!(
            contents(&back_a)? == contents(&back_b)?,
            "{name} saves differ"
        );
    }
    Ok(())
}

fn device_memory(dev: &Device) -> R {
    let Device::Cuda(c) = dev else {
        return Err("not a CUDA device".into());
    };
    let ctx = c.cuda_stream().context().clone();
    let src = model(4, 32 << 20, DType::BF16, &Device::Cpu)?; // 256 MiB of tensors
    let dir = tmp()?;
    src.save_sharded(dir.path(), &SaveOptions::new().max_shard_size(20 << 20))
        .why("save")?;
    drop(src);
    let tensor_bytes: u64 = checkpoint::inspect(dir.path())
        .why("inspect")?
        .iter()
        .map(|t| t.end - t.begin)
        .sum();
    ctx.synchronize().why("sync")?;
    let (free0, _) = ctx.mem_get_info().why("mem")?;
    let store = CandleStore::new();
    store
        .load_on(dir.path(), &LoadOptions::new().create(true), dev)
        .why("load")?;
    ctx.synchronize().why("sync")?;
    let (free1, _) = ctx.mem_get_info().why("mem")?;
    let used = free0.saturating_sub(free1) as u64;
    println!(
        "  device memory: {used} B used for {tensor_bytes} B of tensors ({:.3}x)",
        used as f64 / tensor_bytes as f64
    );
    // The driver hands memory out in 2 MiB pages.
    // Within 5 % of the tensors, and the 32 MiB by which the driver's
    // memory pool grows (a 64 MiB load took 96 MiB on an H200).
    let allowed = tensor_bytes + tensor_bytes / 20 + (32 << 20);
    ensure!(used <= allowed, "{used} B for {tensor_bytes} B");
    Ok(())
}

fn adamw(dev: &Device) -> R {
    let dir = tmp()?;
    let init = CandleStore::new();
    candle_nn::linear(32, 16, init.var_builder(DType::F32, &Device::Cpu).pp("fc")).why("build")?;
    let f = dir.path().join("init.safetensors");
    init.save(&f).why("save")?;
    // candle's AdamW over a VarMap on the device.
    let mut map = candle_nn::VarMap::new();
    let lin_a = candle_nn::linear(
        32,
        16,
        VarBuilder::from_varmap(&map, DType::F32, dev).pp("fc"),
    )
    .why("build")?;
    map.load(&f).why("varmap load")?;
    let store = CandleStore::new();
    store
        .load_on(&f, &LoadOptions::new().create(true), dev)
        .why("load")?;
    let lin_b =
        candle_nn::linear(32, 16, store.var_builder(DType::F32, dev).pp("fc")).why("build")?;
    let mut vars: Vec<(String, Var)> = map
        .data()
        .lock()
        .map_err(|_| "lock")?
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let mut opt_a = candle_nn::AdamW::new(
        vars.iter().map(|(_, v)| v.clone()).collect(),
        Default::default(),
    )
    .why("adamw")?;
    let mut opt_b = AdamW::for_store(&store, "", Default::default()).why("adamw")?;
    let x = Tensor::arange(0_u32, 256, dev)
        .why("x")?
        .to_dtype(DType::F32)
        .why("f32")?
        .reshape((8, 32))
        .why("reshape")?;
    let x = (x * 0.01).why("scale")?.sin().why("sin")?;
    for _ in 0..10 {
        opt_a
            .backward_step(
                &lin_a
                    .forward(&x)
                    .why("fwd")?
                    .sqr()
                    .why("sqr")?
                    .mean_all()
                    .why("mean")?,
            )
            .why("step")?;
        opt_b
            .backward_step(
                &lin_b
                    .forward(&x)
                    .why("fwd")?
                    .sqr()
                    .why("sqr")?
                    .mean_all()
                    .why("mean")?,
            )
            .why("step")?;
    }
    for (k, v) in &vars {
        let ours = store.var(k).why("var")?.ok_or("missing")?;
        let (a, b): (Vec<f32>, Vec<f32>) = (
            v.flatten_all().why("flat")?.to_vec1().why("vec")?,
            ours.flatten_all().why("flat")?.to_vec1().why("vec")?,
        );
        ensure!(
            a.iter()
                .map(|x| x.to_bits())
                .eq(b.iter().map(|x| x.to_bits())),
            "{k} differs"
        );
    }
    Ok(())
}

/// `f32` and `f64` variables of several sizes on `dev`, the same values on
/// every device.
fn mixed(dev: &Device) -> Result<CandleStore, String> {
    let store = CandleStore::new();
    let vars: [(&str, usize, DType); 6] = [
        ("a", 3, DType::F32),
        ("b", 1000, DType::F64),
        ("c", 70_000, DType::F32),
        ("d", 5, DType::F32),
        ("e", 33, DType::F64),
        // With `c`, a run of two staged gradients: one stream of chunks.
        ("f", 50_000, DType::F32),
    ];
    for (name, n, dtype) in vars {
        store
            .get(n, name, Init::Const(0.0), dtype, dev)
            .why("get")?;
    }
    for (name, v) in store.named_vars().why("named_vars")? {
        let n = v.elem_count();
        let t = Tensor::arange(0.0, n as f64, dev)
            .and_then(|t| t.affine(0.001, 0.5))
            .and_then(|t| t.to_dtype(v.as_tensor().dtype()))
            .why(&name)?;
        v.set(&t).why("set")?;
    }
    Ok(store)
}

/// The gradients of `Σ sin(w) · w` over the plan's variables, and each one
/// as bits (as `f64`).
fn device_grads(vars: &[Var]) -> Result<(candle_core::backprop::GradStore, Vec<Vec<u64>>), String> {
    let mut loss: Option<Tensor> = None;
    for v in vars {
        let term = v
            .as_tensor()
            .sin()
            .and_then(|s| s.mul(v.as_tensor()))
            .and_then(|t| t.sum_all())
            .and_then(|t| t.to_dtype(DType::F64))
            .why("term")?;
        loss = Some(match loss {
            None => term,
            Some(l) => (l + term).why("sum")?,
        });
    }
    let grads = loss.ok_or("no loss")?.backward().why("backward")?;
    let bits = grad_bits(&grads, vars)?;
    Ok((grads, bits))
}

/// The gradients [`device_grads`] makes for a CPU copy of [`mixed`]'s
/// store, moved (exactly) to the device of `vars` (a plan's variables of
/// `mixed`): the same bits on every device, whatever its `sin`.
fn cpu_grads_on(vars: &[Var]) -> Result<(candle_core::backprop::GradStore, Vec<Vec<u64>>), String> {
    use scopetree::ranks::{CandlePlan, PlanOptions, SingleProcess};
    let cpu = mixed(&Device::Cpu)?;
    let cpu_vars = CandlePlan::new(&SingleProcess, &cpu, &PlanOptions::new())
        .why("plan")?
        .vars()
        .to_vec();
    let (on_cpu, bits) = device_grads(&cpu_vars)?;
    let mut grads = candle_core::backprop::GradStore::default();
    for (v, c) in vars.iter().zip(&cpu_vars) {
        let g = on_cpu.get(c.as_tensor()).ok_or("a gradient")?;
        grads.insert(v.as_tensor(), g.to_device(v.device()).why("to_device")?);
    }
    Ok((grads, bits))
}

fn grad_bits(
    grads: &candle_core::backprop::GradStore,
    vars: &[Var],
) -> Result<Vec<Vec<u64>>, String> {
    vars.iter()
        .map(|v| gpu_harness::bits_of(grads.get(v.as_tensor()).ok_or("a gradient is missing")?))
        .collect()
}

fn ranks_all_reduce(dev: &Device) -> R {
    use scopetree::ranks::{CandlePlan, PlanOptions, Reduce, SingleProcess};
    // Fused buckets that split variables, direct ones in chunks, defaults.
    for opts in [
        PlanOptions::new().bucket_bytes(4096).direct_bytes(64 << 10),
        PlanOptions::new(),
    ] {
        for op in [Reduce::Sum, Reduce::Mean] {
            for in_place in [false, true] {
                let what = format!("{opts:?} {op:?} in place {in_place}");
                let mut got = Vec::new();
                for d in [&Device::Cpu, dev] {
                    let store = mixed(d)?;
                    let mut plan = CandlePlan::new(&SingleProcess, &store, &opts).why("plan")?;
                    let vars = plan.vars().to_vec();
                    let (mut grads, before) = cpu_grads_on(&vars)?;
                    if in_place {
                        plan.all_reduce_in_place(&SingleProcess, &mut grads, op)
                    } else {
                        plan.all_reduce(&SingleProcess, &mut grads, op)
                    }
                    .why(&what)?;
                    let after = grad_bits(&grads, &vars)?;
                    ensure!(
                        after == before,
                        "{what}: one rank changed a gradient on {d:?}"
                    );
                    for v in &vars {
                        let g = grads.get(v.as_tensor()).ok_or("a gradient")?;
                        ensure!(
                            g.device().same_device(v.device()),
                            "{what}: a gradient left its device"
                        );
                    }
                    got.push(after);
                }
                ensure!(
                    got[0] == got[1],
                    "{what}: the device's sums differ from the CPU's"
                );
            }
        }
    }
    Ok(())
}

/// ZeRO's exchange at 2 ranks (threads of this process, each with its own
/// store on `dev`): `reduce_scatter` of gradients that differ by rank,
/// then, after each rank moved its slice's values by its own amount,
/// `all_gather`; then rank 1's values, moved again, `broadcast` from it.
/// The gradients and the values, on every rank, have the bits of the same
/// exchanges on the CPU; every rank holds each rank's moved slice after
/// the all-gather, and the same values after the broadcast.
fn ranks_zero(dev: &Device) -> R {
    use scopetree::ranks::{CandlePlan, Collective, PlanOptions, Reduce};
    type Bits = (Vec<Vec<u64>>, Vec<Vec<u64>>);
    // Chunks of several pieces and partial ones; the default bucket.
    for opts in [PlanOptions::new().bucket_bytes(4096), PlanOptions::new()] {
        let mut got: Vec<Vec<Bits>> = Vec::new();
        for d in [&Device::Cpu, dev] {
            let ranks = thread_world::run(2, |world| -> Result<Bits, String> {
                // The CPU's values on every device (a device's `affine` in
                // `mixed` may round otherwise).
                let store = mixed(d)?;
                let cpu_store = mixed(&Device::Cpu)?;
                let mut plan = CandlePlan::new(world, &store, &opts).why("plan")?;
                let start = CandlePlan::new(&scopetree::ranks::SingleProcess, &cpu_store, &opts)
                    .why("plan")?;
                let vars = plan.vars().to_vec();
                for (v, c) in vars.iter().zip(start.vars()) {
                    v.set(&c.as_tensor().to_device(d).why("to_device")?)
                        .why("set")?;
                }
                let (cpu, _) = cpu_grads_on(&vars)?;
                let scale = (world.rank() + 1) as f64;
                let mut grads = candle_core::backprop::GradStore::default();
                for v in &vars {
                    let g = cpu.get(v.as_tensor()).ok_or("a gradient")?;
                    grads.insert(v.as_tensor(), g.affine(scale, 0.0).why("scale")?);
                }
                plan.reduce_scatter(world, &mut grads, Reduce::Mean)
                    .why("reduce-scatter")?;
                let g = grad_bits(&grads, &vars)?;
                for v in &vars {
                    v.set(&v.as_tensor().affine(1.0, scale).why("move")?)
                        .why("set")?;
                }
                plan.all_gather(world).why("all-gather")?;
                // Each piece holds its owner's values: the start plus its
                // owner's rank + 1.
                for r in 0..world.size() {
                    for p in plan.partition().pieces(r) {
                        let (v, s) = (&vars[p.var], &start.vars()[p.var]);
                        let piece = |t: &Tensor| {
                            t.flatten_all()
                                .and_then(|t| t.narrow(0, p.start, p.len))
                                .and_then(|t| t.to_device(&Device::Cpu))
                        };
                        let want = piece(s.as_tensor())
                            .and_then(|t| t.affine(1.0, (r + 1) as f64))
                            .why("want")?;
                        let have = piece(v.as_tensor()).why("have")?;
                        ensure!(
                            gpu_harness::bits_of(&have)? == gpu_harness::bits_of(&want)?,
                            "rank {}: rank {r}'s piece of variable {} on {d:?}",
                            world.rank(),
                            p.var
                        );
                    }
                }
                // Then rank 1's values, moved again, broadcast to both.
                if world.rank() == 1 {
                    for v in &vars {
                        v.set(&v.as_tensor().affine(0.5, 10.0).why("move")?)
                            .why("set")?;
                    }
                }
                plan.broadcast(world, 1).why("broadcast")?;
                let values = (vars.iter())
                    .map(|v| gpu_harness::bits_of(v.as_tensor()))
                    .collect::<Result<_, _>>()?;
                Ok((g, values))
            });
            got.push(ranks.into_iter().collect::<Result<_, _>>()?);
        }
        ensure!(
            got[0] == got[1],
            "{opts:?}: the device's ZeRO exchange differs from the CPU's"
        );
        ensure!(
            got[1][0].1 == got[1][1].1,
            "{opts:?}: the ranks' values differ"
        );
    }
    Ok(())
}

fn ranks_checkpoints(dev: &Device) -> R {
    use scopetree::ranks::{AsyncSaver, CandlePlan, CheckpointManager, PlanOptions, SingleProcess};
    for budget in [u64::MAX, 0] {
        let dir = tmp()?;
        let mut store = mixed(dev)?;
        let want = contents(&store)?;
        let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new()).why("plan")?;
        let manager = CheckpointManager::new(dir.path(), 1).why("manager")?;
        let mut saver = AsyncSaver::with_budget(budget);
        let started = saver
            .save_managed(
                &SingleProcess,
                &manager,
                &mut plan,
                &store,
                1,
                &SaveOptions::new(),
            )
            .why("save")?;
        ensure!(started.in_background == (budget > 0), "{started:?}");
        for v in plan.vars() {
            v.set(&v.zeros_like().why("zeros")?).why("scramble")?;
        }
        saver.wait(&SingleProcess).why("wait")?;
        manager
            .load_latest(&SingleProcess, &mut plan, &mut store)
            .why("load")?
            .ok_or("no checkpoint")?;
        all_on(&store, true)?;
        ensure!(
            contents(&store)? == want,
            "budget {budget}: loaded other values"
        );
    }
    Ok(())
}
