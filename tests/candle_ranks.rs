//! `ranks::CandlePlan` in one process (features `candle`): a world of one
//! rank leaves a training run bit-identical, gradients that do not fit
//! their variable stop the call with nothing changed, frozen variables stay
//! out, checkpoints round-trip; `all_reduce_in_place` gives
//! `all_reduce`'s sums in the gradients' own storage at 1 to 3 ranks run
//! as threads, and leaves shared storages alone. The multi-rank checks
//! over MPI are in `tests/ranks_mpi_candle.rs`, run under `mpirun`.

#[path = "support/thread_world.rs"]
mod thread_world;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{AdamW, Init, Optimizer, ParamsAdamW};
use scopetree::candle::CandleStore;
use scopetree::checkpoint::LoadOptions;
use scopetree::ranks::{CandlePlan, Collective, Digest, Error, PlanOptions, Reduce, SingleProcess};

type R = Result<(), Box<dyn std::error::Error>>;

const CPU: Device = Device::Cpu;

/// A small model: `emb` (embedding 7 × 4), `fc` (linear 4 → 3).
struct Tiny {
    emb: candle_nn::Embedding,
    fc: candle_nn::Linear,
}

impl Tiny {
    fn new(store: &CandleStore) -> Result<Self, Box<dyn std::error::Error>> {
        let vb = store.var_builder(DType::F32, &CPU);
        Ok(Tiny {
            emb: candle_nn::embedding(7, 4, vb.pp("emb"))?,
            fc: candle_nn::linear(4, 3, vb.pp("fc"))?,
        })
    }

    fn loss(&self, step: u32) -> candle_core::Result<Tensor> {
        let x = Tensor::new(&[step % 7, (step * 3 + 1) % 7, 5], &CPU)?;
        let y = Tensor::new(&[step % 3, 1, 2], &CPU)?;
        candle_nn::loss::cross_entropy(&self.fc.forward(&self.emb.forward(&x)?)?, &y)
    }
}

/// Every gradient of `grads` for `vars`, as bits (`None` where absent).
fn bits(grads: &GradStore, vars: &[candle_core::Var]) -> Vec<Option<Vec<u32>>> {
    vars.iter()
        .map(|v| {
            grads.get(v.as_tensor()).map(|g| {
                g.flatten_all()
                    .and_then(|g| g.to_vec1::<f32>())
                    .expect("an f32 gradient")
                    .iter()
                    .map(|x| x.to_bits())
                    .collect()
            })
        })
        .collect()
}

#[test]
fn a_world_of_one_trains_bit_identically_to_no_plan() -> R {
    let dir = tempfile::tempdir()?;
    let a = CandleStore::new();
    let model_a = Tiny::new(&a)?;
    a.save(dir.path().join("init.safetensors"))?;
    let b = CandleStore::new();
    b.load(
        dir.path().join("init.safetensors"),
        &LoadOptions::new().create(true),
    )?;
    let model_b = Tiny::new(&b)?;

    let world = SingleProcess;
    let mut plan = CandlePlan::new(&world, &b, &PlanOptions::new().bucket_bytes(12))?;
    assert!(plan.reduce_buckets() > 3, "variables span several buckets");
    plan.broadcast(&world, 0)?;
    let mut opt_a = AdamW::new(a.trainable_vars("")?, ParamsAdamW::default())?;
    let mut opt_b = AdamW::new(plan.vars().to_vec(), ParamsAdamW::default())?;
    for step in 0..10 {
        let la = model_a.loss(step)?;
        let lb = model_b.loss(step)?;
        assert_eq!(
            la.to_scalar::<f32>()?.to_bits(),
            lb.to_scalar::<f32>()?.to_bits(),
            "step {step}"
        );
        opt_a.backward_step(&la)?;
        let mut grads = lb.backward()?;
        let before = bits(&grads, plan.vars());
        plan.all_reduce(&world, &mut grads, Reduce::Mean)?;
        assert_eq!(bits(&grads, plan.vars()), before, "step {step}");
        opt_b.step(&grads)?;
    }
    plan.check_consistency(&world)?;
    Ok(())
}

/// A world of two ranks in which the other rank always holds what this one
/// holds: a sum doubles every element, exactly.
struct Mirror;

impl Collective for Mirror {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        2
    }
    fn all_reduce_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        for (r, s) in recv.iter_mut().zip(send) {
            *r = 2.0 * s;
        }
        Ok(())
    }
    fn all_reduce_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        for (r, s) in recv.iter_mut().zip(send) {
            *r = 2.0 * s;
        }
        Ok(())
    }
    fn reduce_scatter_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        // Rank 0's block, held alike by both ranks.
        for (r, s) in recv.iter_mut().zip(send) {
            *r = 2.0 * s;
        }
        Ok(())
    }
    fn reduce_scatter_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        for (r, s) in recv.iter_mut().zip(send) {
            *r = 2.0 * s;
        }
        Ok(())
    }
    fn broadcast_bytes(&self, _root: usize, _buf: &mut [u8]) -> Result<(), Error> {
        Ok(())
    }
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), Error> {
        for block in recv.chunks_mut(send.len().max(1)) {
            block.copy_from_slice(&send[..block.len()]);
        }
        Ok(())
    }
    fn all_gather_digest(&self, mine: &Digest, all: &mut [Digest]) -> Result<(), Error> {
        all.fill(*mine);
        Ok(())
    }
    fn barrier(&self) -> Result<(), Error> {
        Ok(())
    }
}

#[test]
fn sums_and_means_reach_the_grad_store_in_every_bucket_size() -> R {
    let store = CandleStore::new();
    let w = store.get((2, 3), "a.w", Init::Const(1.0), DType::F32, &CPU)?;
    let v = store.get(5, "b.v", Init::Const(1.0), DType::F64, &CPU)?;
    let idle = store.get(4, "c.idle", Init::Const(1.0), DType::F32, &CPU)?;
    let cw = Tensor::new(&[[1.0_f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &CPU)?;
    let cv = Tensor::new(&[7.0_f64, 8.0, 9.0, 10.0, 11.0], &CPU)?;
    // Fused in buckets, and sent from the gradients' own storage into
    // buffers that become the result tensors (direct from 1 byte).
    let cases = [4, 8, 12, 1 << 20]
        .into_iter()
        .flat_map(|b| [(b, usize::MAX), (b, 1)]);
    for (bucket, direct) in cases {
        let opts = PlanOptions::new().bucket_bytes(bucket).direct_bytes(direct);
        let mut plan = CandlePlan::new(&Mirror, &store, &opts)?;
        for (op, factor) in [(Reduce::Sum, 2.0), (Reduce::Mean, 1.0)] {
            let loss = (w.mul(&cw)?.sum_all()? + v.mul(&cv)?.sum_all()?.to_dtype(DType::F32)?)?;
            let mut grads = loss.backward()?;
            plan.all_reduce(&Mirror, &mut grads, op)?;
            let gw = grads.get(&w).expect("w's gradient").to_vec2::<f32>()?;
            let want: Vec<Vec<f32>> = cw
                .to_vec2::<f32>()?
                .iter()
                .map(|r| r.iter().map(|x| x * factor as f32).collect())
                .collect();
            assert_eq!(gw, want, "bucket {bucket}, direct {direct}, {op:?}");
            let gv = grads.get(&v).expect("v's gradient").to_vec1::<f64>()?;
            let want: Vec<f64> = cv.to_vec1::<f64>()?.iter().map(|x| x * factor).collect();
            assert_eq!(gv, want, "bucket {bucket}, direct {direct}, {op:?}");
            assert!(
                grads.get(&idle).is_none(),
                "no rank had a gradient of c.idle"
            );
        }
    }
    Ok(())
}

#[test]
fn a_gradient_that_does_not_fit_its_variable_changes_nothing() -> R {
    let store = CandleStore::new();
    let w = store.get(3, "w", Init::Const(1.0), DType::F32, &CPU)?;
    let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    let mut grads = w.sum_all()?.backward()?;
    grads.insert(&w, Tensor::zeros(4, DType::F32, &CPU)?);
    let err = plan
        .all_reduce(&SingleProcess, &mut grads, Reduce::Sum)
        .unwrap_err();
    assert!(
        matches!(err, Error::Changed { ref key, .. } if key == "w"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("its gradient is F32 [4], the variable F32 [3]"),
        "{err}"
    );
    assert_eq!(grads.get(&w).expect("kept").dims(), &[4]);
    Ok(())
}

#[test]
fn frozen_and_filtered_variables_stay_out_of_the_plan() -> R {
    let store = CandleStore::new();
    let _model = Tiny::new(&store)?;
    store.freeze("emb")?;
    let plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    let keys: Vec<&str> = plan
        .manifest()
        .entries()
        .iter()
        .map(|e| e.key.as_str())
        .collect();
    assert_eq!(keys, ["fc.bias", "fc.weight"]);
    let plan = CandlePlan::new(
        &SingleProcess,
        &store,
        &PlanOptions::new().filter(|k| k.ends_with("weight")),
    )?;
    assert_eq!(plan.vars().len(), 1);
    let err =
        CandlePlan::new(&SingleProcess, &store, &PlanOptions::new().bucket_bytes(0)).unwrap_err();
    assert!(matches!(err, Error::BadOption { .. }), "{err}");
    Ok(())
}

#[test]
fn checkpoints_round_trip_and_a_file_that_does_not_fit_changes_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let store = CandleStore::new();
    let _model = Tiny::new(&store)?;
    let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    let path = dir.path().join("tiny.safetensors");
    let saved = plan.save_on_root(&SingleProcess, &store, &path, 0)?;
    assert_eq!(saved.expect("rank 0 saves").keys.len(), 3);
    let before = plan.digest()?;
    let w = &plan.vars()[2];
    w.set(&w.ones_like()?)?;
    assert_ne!(plan.digest()?, before);
    plan.load_on_all(&SingleProcess, &store, &path)?;
    assert_eq!(plan.digest()?, before);

    // A model with another head does not fit the file: nothing changes.
    let other = CandleStore::new();
    let vb = other.var_builder(DType::F32, &CPU);
    candle_nn::embedding(7, 4, vb.pp("emb"))?;
    candle_nn::linear(4, 5, vb.pp("fc"))?;
    let mut plan = CandlePlan::new(&SingleProcess, &other, &PlanOptions::new())?;
    let digest = plan.digest()?;
    let err = plan.load_on_all(&SingleProcess, &other, &path).unwrap_err();
    assert!(err.to_string().contains("fc.weight"), "{err}");
    assert!(matches!(err, Error::Checkpoint(_)), "{err}");
    assert_eq!(plan.digest()?, digest);
    Ok(())
}

/// A store with `Tiny`'s variables and two frozen ones of other dtypes
/// (`stats.mean`, BF16; `stats.count`, U32), out of the plan but in its
/// checkpoints.
fn tiny_with_frozen() -> Result<(CandleStore, Tiny), Box<dyn std::error::Error>> {
    let store = CandleStore::new();
    let model = Tiny::new(&store)?;
    store.get(5, "stats.mean", Init::Const(0.25), DType::BF16, &CPU)?;
    store.get(3, "stats.count", Init::Const(7.0), DType::U32, &CPU)?;
    store.freeze("stats")?;
    Ok((store, model))
}

/// Every variable's name, dtype, shape and bytes as they are held.
fn held(store: &CandleStore) -> Result<Vec<(String, String)>, Box<dyn std::error::Error>> {
    use scopetree::checkpoint::Checkpointable;
    let mut out = Vec::new();
    for (k, v) in store.named_vars()? {
        let t = v.as_tensor();
        let bytes = Checkpointable::try_le_bytes(&v)?;
        out.push((k, format!("{:?} {:?} {:?}", t.dtype(), t.dims(), bytes)));
    }
    Ok(out)
}

/// Sets every variable of `store` to other values (ones, of its dtype).
fn scramble(store: &CandleStore) -> R {
    for (_, v) in store.named_vars()? {
        v.set(&v.ones_like()?)?;
    }
    Ok(())
}

#[test]
fn shards_round_trip_every_variable_frozen_ones_too() -> R {
    let dir = tempfile::tempdir()?;
    let (store, _model) = tiny_with_frozen()?;
    let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new().bucket_bytes(12))?;
    assert_eq!(
        plan.vars().len(),
        3,
        "the frozen variables stay out of the plan"
    );
    let before = held(&store)?;
    let saved = plan.save_shards(&SingleProcess, &store, dir.path(), &Default::default())?;
    assert_eq!(saved.shards, ["model-00001-of-00001.safetensors"]);
    assert_eq!(
        saved.mine.as_deref(),
        Some("model-00001-of-00001.safetensors")
    );
    let keys = [
        "emb.weight",
        "fc.bias",
        "fc.weight",
        "stats.count",
        "stats.mean",
    ];
    assert_eq!(saved.keys, keys);
    assert_eq!(saved.bytes, (7 * 4 + 3 + 3 * 4) * 4 + 3 * 4 + 5 * 2);
    assert!(dir.path().join("model.safetensors.index.json").is_file());

    scramble(&store)?;
    assert_ne!(held(&store)?, before);
    let loaded = plan.load_shards(&SingleProcess, &store, dir.path())?;
    assert_eq!(loaded.keys, keys);
    assert_eq!(loaded.bytes, saved.bytes);
    assert_eq!(held(&store)?, before);
    Ok(())
}

#[test]
fn candle_reads_the_shards_bit_for_bit_with_no_conversion() -> R {
    let dir = tempfile::tempdir()?;
    let (store, _model) = tiny_with_frozen()?;
    let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    plan.save_shards(&SingleProcess, &store, dir.path(), &Default::default())?;
    // The shards the index names, as a reader of the layout finds them.
    let index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dir.path().join("model.safetensors.index.json"),
    )?)?;
    let mut shards: Vec<std::path::PathBuf> = index["weight_map"]
        .as_object()
        .expect("a weight map")
        .values()
        .map(|f| dir.path().join(f.as_str().expect("a file name")))
        .collect();
    shards.sort();
    shards.dedup();
    let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&shards, DType::F32, &CPU)? };
    for (key, v) in store.named_vars()? {
        let t = v.as_tensor();
        let got = vb.get_with_hints_dtype(t.dims(), &key, Init::Const(0.0), t.dtype())?;
        assert_eq!(got.dtype(), t.dtype(), "{key}");
        assert_eq!(got.dims(), t.dims(), "{key}");
        let bits = |x: &Tensor| -> candle_core::Result<Vec<u8>> {
            Ok(x.flatten_all()?
                .to_dtype(DType::F64)?
                .to_vec1::<f64>()?
                .iter()
                .flat_map(|f| f.to_le_bytes())
                .collect())
        };
        assert_eq!(bits(&got)?, bits(t)?, "{key}");
    }
    // The metadata a loader of the format looks for.
    let meta = scopetree::checkpoint::inspect(dir.path())?;
    assert_eq!(meta.len(), 5);
    Ok(())
}

#[test]
fn shards_that_do_not_fit_or_are_corrupted_change_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let (store, _model) = tiny_with_frozen()?;
    let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    plan.save_shards(&SingleProcess, &store, dir.path(), &Default::default())?;

    // A variable the files lack.
    let (more, _m) = tiny_with_frozen()?;
    more.get(2, "extra", Init::Const(1.0), DType::F32, &CPU)?;
    scramble(&more)?;
    let mut plan_more = CandlePlan::new(&SingleProcess, &more, &PlanOptions::new())?;
    let before = held(&more)?;
    let err = plan_more
        .load_shards(&SingleProcess, &more, dir.path())
        .unwrap_err();
    assert!(matches!(err, Error::Checkpoint(_)), "{err}");
    assert!(err.to_string().contains("extra"), "{err}");
    assert_eq!(held(&more)?, before);

    // A tensor the store lacks.
    let fewer = CandleStore::new();
    let _m = Tiny::new(&fewer)?;
    fewer.get(5, "stats.mean", Init::Const(1.0), DType::BF16, &CPU)?;
    let mut plan_fewer = CandlePlan::new(
        &SingleProcess,
        &fewer,
        &PlanOptions::new().filter(|k| !k.starts_with("stats")),
    )?;
    let before = held(&fewer)?;
    let err = plan_fewer
        .load_shards(&SingleProcess, &fewer, dir.path())
        .unwrap_err();
    assert!(err.to_string().contains("stats.count"), "{err}");
    assert_eq!(held(&fewer)?, before);

    // A tensor of another shape, and one of another dtype.
    let other = CandleStore::new();
    let vb = other.var_builder(DType::F32, &CPU);
    candle_nn::embedding(7, 4, vb.pp("emb"))?;
    candle_nn::linear(4, 5, vb.pp("fc"))?;
    other.get(5, "stats.mean", Init::Const(1.0), DType::F32, &CPU)?;
    other.get(3, "stats.count", Init::Const(1.0), DType::U32, &CPU)?;
    other.freeze("stats")?;
    let mut plan_other = CandlePlan::new(&SingleProcess, &other, &PlanOptions::new())?;
    let before = held(&other)?;
    let err = plan_other
        .load_shards(&SingleProcess, &other, dir.path())
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("fc.weight") && text.contains("stats.mean"),
        "{text}"
    );
    assert_eq!(held(&other)?, before);

    // A shard whose bytes changed after the save: its checksum tells.
    scramble(&store)?;
    let before = held(&store)?;
    let shard = dir.path().join("model-00001-of-00001.safetensors");
    let mut bytes = std::fs::read(&shard)?;
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&shard, &bytes)?;
    let err = plan
        .load_shards(&SingleProcess, &store, dir.path())
        .unwrap_err();
    assert!(
        matches!(err, Error::Corrupted { ref key, .. } if key == "stats.mean"),
        "{err}"
    );
    assert_eq!(held(&store)?, before);

    // A missing shard.
    std::fs::remove_file(&shard)?;
    let err = plan
        .load_shards(&SingleProcess, &store, dir.path())
        .unwrap_err();
    assert!(matches!(err, Error::Checkpoint(_)), "{err}");
    assert_eq!(held(&store)?, before);
    Ok(())
}

#[test]
fn load_shards_reads_a_single_file_and_any_sharded_checkpoint() -> R {
    let dir = tempfile::tempdir()?;
    let (store, _model) = tiny_with_frozen()?;
    let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    let before = held(&store)?;

    let file = dir.path().join("one.safetensors");
    plan.save_on_root(&SingleProcess, &store, &file, 0)?;
    scramble(&store)?;
    let loaded = plan.load_shards(&SingleProcess, &store, &file)?;
    assert_eq!(loaded.keys.len(), 5);
    assert_eq!(held(&store)?, before);

    let sharded = dir.path().join("hf");
    let opts = scopetree::checkpoint::SaveOptions::new().max_shard_size(64);
    let report = store.save_sharded(&sharded, &opts)?;
    assert!(report.shards.len() > 2, "{:?}", report.shards);
    scramble(&store)?;
    plan.load_shards(&SingleProcess, &store, &sharded)?;
    assert_eq!(held(&store)?, before);
    Ok(())
}

#[test]
fn shards_saved_as_bf16_hold_bf16_floats_with_the_checksums_of_their_bytes() -> R {
    use scopetree::checkpoint::{Dtype, FloatDtype, SaveOptions};
    let dir = tempfile::tempdir()?;
    let (store, _model) = tiny_with_frozen()?;
    let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    let opts = SaveOptions::new().floats_as(FloatDtype::BF16);
    let saved = plan.save_shards(&SingleProcess, &store, dir.path(), &opts)?;
    assert_eq!(
        saved.bytes,
        ((7 * 4 + 3 + 3 * 4) * 2 + 3 * 4 + 5 * 2) as u64
    );
    let file = scopetree::checkpoint::inspect(dir.path())?;
    for t in &file {
        let want = if t.key == "stats.count" {
            Dtype::U32
        } else {
            Dtype::BF16
        };
        assert_eq!(t.dtype, want, "{}", t.key);
    }
    // Every tensor's checksum, of its bytes as written (converted or not).
    let shard = dir.path().join(&saved.shards[0]);
    let bytes = std::fs::read(&shard)?;
    let (n, header) = safetensors::SafeTensors::read_metadata(&bytes)?;
    let meta = header.metadata().as_ref().expect("metadata");
    let mut sums = 0;
    for (key, info) in header.tensors() {
        let data = &bytes[8 + n + info.data_offsets.0..8 + n + info.data_offsets.1];
        let sum = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(data));
        assert_eq!(
            meta.get(&format!("scopetree_xxh3/{key}")),
            Some(&sum),
            "{key}"
        );
        sums += 1;
    }
    assert_eq!(sums, file.len());
    // A store loads them, converting, with every checksum checked.
    let fresh = CandleStore::new();
    let opts = LoadOptions::new().create(true);
    fresh.load_on(dir.path(), &opts, &CPU)?;
    assert_eq!(fresh.with_store(|s| s.tree().var_count()), file.len());
    // A converted tensor changed on disk no longer loads.
    let w = header.info("fc.weight").expect("fc.weight");
    let mut bad = bytes.clone();
    bad[8 + n + w.data_offsets.0] ^= 0x40;
    std::fs::write(&shard, &bad)?;
    let fresh = CandleStore::new();
    let err = fresh.load_on(dir.path(), &opts, &CPU).unwrap_err();
    assert!(
        err.to_string().contains("fc.weight") && err.to_string().contains("checksum"),
        "{err}"
    );
    assert_eq!(fresh.with_store(|s| s.tree().var_count()), 0);
    std::fs::write(&shard, &bytes)?;
    // candle reads the converted floats; the store, of F32, does not fit.
    let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&[shard], DType::F32, &CPU)? };
    assert_eq!(vb.get((3, 4), "fc.weight")?.dtype(), DType::F32);
    let before = held(&store)?;
    let err = plan
        .load_shards(&SingleProcess, &store, dir.path())
        .unwrap_err();
    assert!(err.to_string().contains("fc.weight"), "{err}");
    assert_eq!(held(&store)?, before);
    Ok(())
}

/// The gradients of `store`'s variables for `rank`'s loss: `w` × a matrix
/// of the rank's, plus `v` × a vector of the rank's.
fn rank_grads(w: &Tensor, v: &Tensor, rank: usize) -> Result<GradStore, candle_core::Error> {
    let r = rank as f32;
    let cw = Tensor::new(&[[1.0_f32 + r, 2.0, 3.0], [4.0, 5.0 * r, 6.0]], &CPU)?;
    let cv = Tensor::new(&[7.0_f64, 8.0 + r as f64, 9.0, 10.0, 11.0], &CPU)?;
    (w.mul(&cw)?.sum_all()? + v.mul(&cv)?.sum_all()?.to_dtype(DType::F32)?)?.backward()
}

#[test]
fn in_place_gives_the_same_sums_as_new_tensors_in_the_gradients_own_storage() -> R {
    for n in 1..=3 {
        // Every gradient from its own storage (direct from 4 bytes), in
        // buckets of 8 bytes, and every gradient fused (the default).
        for opts in [
            PlanOptions::new().direct_bytes(4).bucket_bytes(8),
            PlanOptions::new(),
        ] {
            let out = thread_world::run(n, |world| -> Result<_, String> {
                let e = |x: &dyn std::fmt::Display| x.to_string();
                let store = CandleStore::new();
                let w = store
                    .get((2, 3), "a.w", Init::Const(1.0), DType::F32, &CPU)
                    .map_err(|x| e(&x))?;
                let v = store
                    .get(5, "b.v", Init::Const(1.0), DType::F64, &CPU)
                    .map_err(|x| e(&x))?;
                let mut plan = CandlePlan::new(world, &store, &opts).map_err(|x| e(&x))?;
                let mut got = Vec::new();
                for op in [Reduce::Sum, Reduce::Mean] {
                    let me = world.rank();
                    let mut new = rank_grads(&w, &v, me).map_err(|x| e(&x))?;
                    plan.all_reduce(world, &mut new, op).map_err(|x| e(&x))?;
                    let mut inplace = rank_grads(&w, &v, me).map_err(|x| e(&x))?;
                    let before = inplace.get(&w).expect("a gradient").clone();
                    plan.all_reduce_in_place(world, &mut inplace, op)
                        .map_err(|x| e(&x))?;
                    let flat = |g: &GradStore| -> Result<(Vec<f32>, Vec<f64>), String> {
                        let gw = g.get(&w).expect("w's gradient").flatten_all();
                        let gv = g.get(&v).expect("v's gradient");
                        Ok((
                            gw.and_then(|t| t.to_vec1()).map_err(|x| e(&x))?,
                            gv.to_vec1().map_err(|x| e(&x))?,
                        ))
                    };
                    let (a, b) = (flat(&new)?, flat(&inplace)?);
                    let seen: Vec<f32> = before
                        .flatten_all()
                        .and_then(|t| t.to_vec1())
                        .map_err(|x| e(&x))?;
                    got.push((a, b, seen));
                }
                Ok(got)
            });
            for (rank, got) in out.into_iter().enumerate() {
                let got = got?;
                for (((aw, av), (bw, bv), seen), op) in got.into_iter().zip(["sum", "mean"]) {
                    let what = format!("{n} ranks, rank {rank}, {op}, {opts:?}");
                    let bits = |x: &[f32]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&aw), bits(&bw), "{what}: w");
                    assert_eq!(
                        av.iter().map(|y| y.to_bits()).collect::<Vec<_>>(),
                        bv.iter().map(|y| y.to_bits()).collect::<Vec<_>>(),
                        "{what}: v"
                    );
                    // In place: a clone taken before the call sees the
                    // sums, when the gradient went from its own storage;
                    // fused, it keeps its values (with one rank the sums
                    // are the values, and rank 1's values are the means).
                    if opts.direct_bytes_value() == 4 && n > 1 {
                        assert_eq!(bits(&seen), bits(&bw), "{what}: in place");
                    } else if n > 1 && op == "sum" {
                        assert_ne!(bits(&seen), bits(&bw), "{what}: fused, a new tensor");
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn in_place_writes_no_gradient_in_place_when_two_share_a_storage() -> R {
    let out = thread_world::run(2, |world| -> Result<_, String> {
        let e = |x: &dyn std::fmt::Display| x.to_string();
        let store = CandleStore::new();
        let a = store
            .get((2, 3), "a", Init::Const(1.0), DType::F32, &CPU)
            .map_err(|x| e(&x))?;
        let b = store
            .get((2, 3), "b", Init::Const(1.0), DType::F32, &CPU)
            .map_err(|x| e(&x))?;
        let opts = PlanOptions::new().direct_bytes(4);
        let mut plan = CandlePlan::new(world, &store, &opts).map_err(|x| e(&x))?;
        // One tensor is the gradient of both variables.
        let r = world.rank() as f32 + 1.0;
        let shared =
            Tensor::new(&[[r, 2.0 * r, 3.0], [4.0, 5.0, 6.0 * r]], &CPU).map_err(|x| e(&x))?;
        let mut grads = (a.sum_all().map_err(|x| e(&x))? + b.sum_all().map_err(|x| e(&x))?)
            .and_then(|l| l.backward())
            .map_err(|x| e(&x))?;
        grads.insert(&a, shared.clone());
        grads.insert(&b, shared.clone());
        plan.all_reduce_in_place(world, &mut grads, Reduce::Sum)
            .map_err(|x| e(&x))?;
        let get = |v: &Tensor| -> Result<Vec<Vec<f32>>, String> {
            let t = grads.get(v).expect("a gradient");
            t.to_vec2().map_err(|x| e(&x))
        };
        let kept = shared.to_vec2::<f32>().map_err(|x| e(&x))?;
        Ok((get(&a)?, get(&b)?, kept))
    });
    // Ranks 1 and 2 (r = 1, 2): the sum of r·x and of x.
    let want = vec![vec![3.0_f32, 6.0, 6.0], vec![8.0, 10.0, 18.0]];
    for (rank, got) in out.into_iter().enumerate() {
        let (ga, gb, kept) = got?;
        assert_eq!(ga, want, "rank {rank}: a");
        assert_eq!(gb, want, "rank {rank}: b");
        let r = rank as f32 + 1.0;
        assert_eq!(
            kept[0],
            [r, 2.0 * r, 3.0],
            "rank {rank}: the shared tensor is untouched"
        );
    }
    Ok(())
}

/// Sets every variable of `store` to `base + i` for element `i` (in its
/// dtype), the same on every rank.
fn fill(store: &CandleStore, base: f64) -> Result<(), String> {
    let e = |x: candle_core::Error| x.to_string();
    for (_, v) in store.named_vars().map_err(|x| x.to_string())? {
        let t = Tensor::arange(0.0, v.elem_count() as f64, &CPU)
            .and_then(|t| t.affine(1.0, base))
            .and_then(|t| t.to_dtype(v.as_tensor().dtype()))
            .and_then(|t| t.reshape(v.dims()))
            .map_err(e)?;
        v.set(&t).map_err(e)?;
    }
    Ok(())
}

/// Loaded at 2 and 3 ranks, every rank's part reaches every rank through
/// buckets of a few bytes, which end inside elements of every dtype
/// (BF16, U32, F32): the values come back bit for bit everywhere.
#[test]
fn load_shards_at_2_and_3_ranks_moves_parts_in_buckets_that_split_elements() -> R {
    for n in 2..=3 {
        for bucket in [3, 5, 1 << 20] {
            let dir = tempfile::tempdir()?;
            let root = dir.path().to_owned();
            let out = thread_world::run(n, |world| -> Result<_, String> {
                let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", world.rank());
                let (store, _model) = tiny_with_frozen().map_err(|x| e(&x))?;
                fill(&store, 0.5)?;
                let opts = PlanOptions::new().bucket_bytes(bucket);
                let mut plan = CandlePlan::new(world, &store, &opts).map_err(|x| e(&x))?;
                let before = held(&store).map_err(|x| e(&x))?;
                plan.save_shards(world, &store, &root, &Default::default())
                    .map_err(|x| e(&x))?;
                scramble(&store).map_err(|x| e(&x))?;
                let scrambled = held(&store).map_err(|x| e(&x))?;
                let loaded = plan.load_shards(world, &store, &root).map_err(|x| e(&x))?;
                Ok((
                    before,
                    scrambled,
                    held(&store).map_err(|x| e(&x))?,
                    loaded.keys,
                ))
            });
            let mut parts = 0;
            for (rank, got) in out.into_iter().enumerate() {
                let (before, scrambled, after, keys) = got?;
                assert_ne!(scrambled, before, "{n} ranks, bucket {bucket}");
                assert_eq!(after, before, "{n} ranks, bucket {bucket}, rank {rank}");
                parts += keys.len();
            }
            assert_eq!(parts, 5, "{n} ranks: each variable read by one rank");
        }
    }
    Ok(())
}

/// At 3 ranks, a corrupted tensor in the last rank's part stops the load
/// on every rank before any rank writes its own, sound, part: every store
/// is unchanged, with no copy of the old values kept to put back.
#[test]
fn a_corrupted_part_at_3_ranks_changes_no_rank_store() -> R {
    let dir = tempfile::tempdir()?;
    let root = dir.path().to_owned();
    let saved = thread_world::run(3, |world| -> Result<_, String> {
        let (store, _model) = tiny_with_frozen().map_err(|x| x.to_string())?;
        fill(&store, 0.5)?;
        let mut plan =
            CandlePlan::new(world, &store, &PlanOptions::new()).map_err(|x| x.to_string())?;
        let saved = plan
            .save_shards(world, &store, &root, &Default::default())
            .map_err(|x| x.to_string())?;
        Ok(saved.shards)
    });
    let shards = saved.into_iter().next().expect("rank 0")?;
    assert_eq!(shards.len(), 3, "one shard per rank");
    // The last byte of the last shard: its last tensor's data.
    let last = root.join(&shards[2]);
    let mut bytes = std::fs::read(&last)?;
    let end = bytes.len() - 1;
    bytes[end] ^= 0x40;
    std::fs::write(&last, &bytes)?;

    let out = thread_world::run(3, |world| -> Result<_, String> {
        let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", world.rank());
        let (store, _model) = tiny_with_frozen().map_err(|x| e(&x))?;
        scramble(&store).map_err(|x| e(&x))?;
        let mut plan = CandlePlan::new(world, &store, &PlanOptions::new()).map_err(|x| e(&x))?;
        let before = held(&store).map_err(|x| e(&x))?;
        let err = plan.load_shards(world, &store, &root).err();
        Ok((before, held(&store).map_err(|x| e(&x))?, err))
    });
    let mut corrupted = 0;
    for (rank, got) in out.into_iter().enumerate() {
        let (before, after, err) = got?;
        assert_eq!(after, before, "rank {rank}: a refused load changed values");
        match err {
            Some(Error::Corrupted { .. }) => corrupted += 1,
            Some(Error::PeerFailed { .. }) => {}
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    assert_eq!(corrupted, 1, "the rank that reads the last part");
    Ok(())
}

#[test]
fn a_manager_and_an_async_saver_keep_a_candle_store_at_1_to_3_ranks() -> R {
    use scopetree::ranks::{AsyncSaver, CheckpointManager};
    for n in 1..=3 {
        let dir = tempfile::tempdir()?;
        let root = dir.path().to_owned();
        let out = thread_world::run(n, |world| -> Result<_, String> {
            let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", world.rank());
            let (mut store, _model) = tiny_with_frozen().map_err(|x| e(&x))?;
            let mut plan =
                CandlePlan::new(world, &store, &PlanOptions::new()).map_err(|x| e(&x))?;
            let manager = CheckpointManager::new(&root, 2).map_err(|x| e(&x))?;
            let mut saver = AsyncSaver::new();
            let mut snapshots = Vec::new();
            for step in 1..=3_u64 {
                fill(&store, step as f64)?;
                snapshots.push(held(&store).map_err(|x| e(&x))?);
                saver
                    .save_managed(
                        world,
                        &manager,
                        &mut plan,
                        &store,
                        step,
                        &Default::default(),
                    )
                    .map_err(|x| e(&x))?;
                // Training goes on: the save holds the values of the call.
                fill(&store, -100.0 * step as f64)?;
            }
            let done = saver.wait(world).map_err(|x| e(&x))?;
            let staged = saver.staging_bytes();
            let steps = manager.steps().map_err(|x| e(&x))?;
            fill(&store, 0.5)?;
            let latest = manager
                .load_latest(world, &mut plan, &mut store)
                .map_err(|x| e(&x))?
                .map(|(step, _)| step);
            let async_loaded = held(&store).map_err(|x| e(&x))?;
            // A save in the caller's time, under the same manager.
            fill(&store, 4.0)?;
            let four = held(&store).map_err(|x| e(&x))?;
            manager
                .save(world, &mut plan, &store, 4, &Default::default())
                .map_err(|x| e(&x))?;
            fill(&store, 0.5)?;
            manager
                .load_latest(world, &mut plan, &mut store)
                .map_err(|x| e(&x))?;
            let sync_loaded = held(&store).map_err(|x| e(&x))?;
            Ok((
                done,
                staged,
                steps,
                latest,
                snapshots,
                async_loaded,
                four,
                sync_loaded,
            ))
        });
        let mut shards_written = 0;
        for (rank, got) in out.into_iter().enumerate() {
            let (done, staged, steps, latest, snapshots, async_loaded, four, sync_loaded) = got?;
            let done = done.expect("a save was under way");
            let what = format!("{n} ranks, rank {rank}");
            if rank == 0 {
                // Rank 0 prunes, after the ranks agree the save is whole.
                assert_eq!(steps, [2, 3], "{what}: the last two kept");
            }
            assert_eq!(latest, Some(3), "{what}");
            assert_eq!(async_loaded, snapshots[2], "{what}: step 3 as of its call");
            assert_eq!(sync_loaded, four, "{what}: step 4");
            assert_eq!(done.shards.len(), n.min(done.shards.len()), "{what}");
            // A rank stages its own shard only.
            assert!(staged as u64 >= done.bytes, "{what}: {staged} bytes");
            shards_written += usize::from(done.mine.is_some());
        }
        assert!(shards_written >= 1 && shards_written <= n, "{n} ranks");
        // candle reads the async save's shards as they are, and each holds
        // the checksums of its tensors: a flipped byte is caught.
        let step3 = CheckpointManager::new(&root, 2)?.step_dir(3);
        let (store, _model) = tiny_with_frozen()?;
        let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
        plan.load_shards(&SingleProcess, &store, &step3)?;
        let shard = std::fs::read_dir(&step3)?
            .filter_map(Result::ok)
            .map(|f| f.path())
            .find(|p| p.to_string_lossy().ends_with(".safetensors"))
            .expect("a shard");
        let mut bytes = std::fs::read(&shard)?;
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&shard, &bytes)?;
        scramble(&store)?;
        let before = held(&store)?;
        let err = plan
            .load_shards(&SingleProcess, &store, &step3)
            .unwrap_err();
        assert!(matches!(err, Error::Corrupted { .. }), "{n} ranks: {err}");
        assert_eq!(
            held(&store)?,
            before,
            "{n} ranks: a refused load changed values"
        );
    }
    Ok(())
}

#[test]
fn an_async_save_over_its_budget_writes_a_candle_store_in_the_call() -> R {
    use scopetree::ranks::AsyncSaver;
    let dir = tempfile::tempdir()?;
    let root = dir.path().to_owned();
    // Rank 0 is over its budget, rank 1 is not: both shards land, and the
    // wait publishes the save.
    let out = thread_world::run(2, |world| -> Result<_, String> {
        let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", world.rank());
        let (store, _model) = tiny_with_frozen().map_err(|x| e(&x))?;
        fill(&store, 3.0)?;
        let want = held(&store).map_err(|x| e(&x))?;
        let mut plan = CandlePlan::new(world, &store, &PlanOptions::new()).map_err(|x| e(&x))?;
        let budget = if world.rank() == 0 { 0 } else { u64::MAX };
        let mut saver = AsyncSaver::with_budget(budget);
        let started = saver
            .save(world, &mut plan, &store, &root, &Default::default())
            .map_err(|x| e(&x))?;
        let staged = saver.staging_bytes();
        fill(&store, -1.0)?;
        let before_wait = root.join("model.safetensors.index.json").exists();
        let done = saver.wait(world).map_err(|x| e(&x))?;
        Ok((started, staged, before_wait, done.is_some(), want))
    });
    let mut want = None;
    for (rank, got) in out.into_iter().enumerate() {
        let (started, staged, before_wait, done, w) = got?;
        assert!(started.bytes > 0, "rank {rank}: {started:?}");
        assert_eq!(started.in_background, rank == 1, "rank {rank}: {started:?}");
        assert_eq!(staged == 0, rank == 0, "rank {rank}: {staged} bytes staged");
        assert!(!before_wait && done, "rank {rank}: published by the wait");
        want = Some(w);
    }
    let (store, _model) = tiny_with_frozen()?;
    let mut plan = CandlePlan::new(&SingleProcess, &store, &PlanOptions::new())?;
    plan.load_shards(&SingleProcess, &store, &root)?;
    assert_eq!(Some(held(&store)?), want, "the values of the call");
    Ok(())
}

#[test]
fn broadcast_gives_every_rank_the_roots_values_in_any_bucket() -> R {
    // f32 and f64 variables of odd lengths: chunks that span variables and
    // split them, at 2 and 3 ranks, from each root.
    for n in [2, 3] {
        for root in 0..n {
            for bucket in [4, 12, 40, usize::MAX] {
                let opts = PlanOptions::new().bucket_bytes(bucket);
                let out = thread_world::run(n, |world| -> Result<_, String> {
                    let e = |x: &dyn std::fmt::Display| x.to_string();
                    let store = CandleStore::new();
                    let r = world.rank() as f64;
                    let shapes: [(&str, usize, DType); 4] = [
                        ("a", 3, DType::F32),
                        ("b", 5, DType::F64),
                        ("c", 7, DType::F32),
                        ("d", 1, DType::F64),
                    ];
                    for (name, len, dtype) in shapes {
                        store
                            .get(len, name, Init::Const(0.0), dtype, &CPU)
                            .map_err(|x| e(&x))?;
                    }
                    for (_, v) in store.named_vars().map_err(|x| e(&x))? {
                        let len = v.elem_count();
                        let t = Tensor::arange(0.0, len as f64, &CPU)
                            .and_then(|t| t.affine(0.25, 100.0 * r + len as f64))
                            .and_then(|t| t.to_dtype(v.dtype()))
                            .map_err(|x| e(&x))?;
                        v.set(&t).map_err(|x| e(&x))?;
                    }
                    let mut plan = CandlePlan::new(world, &store, &opts).map_err(|x| e(&x))?;
                    plan.broadcast(world, root).map_err(|x| e(&x))?;
                    (plan.vars().iter())
                        .map(|v| {
                            (v.as_tensor().to_dtype(DType::F64))
                                .and_then(|t| t.to_vec1::<f64>())
                                .map_err(|x| e(&x))
                        })
                        .collect::<Result<Vec<_>, _>>()
                });
                let out: Vec<Vec<Vec<f64>>> = out.into_iter().collect::<Result<_, _>>()?;
                let want: Vec<Vec<f64>> = [("a", 3), ("b", 5), ("c", 7), ("d", 1)]
                    .iter()
                    .map(|&(_, len)| {
                        (0..len)
                            .map(|i| 0.25 * i as f64 + 100.0 * root as f64 + len as f64)
                            .collect()
                    })
                    .collect();
                for (rank, got) in out.iter().enumerate() {
                    assert_eq!(
                        got, &want,
                        "{n} ranks, root {root}, rank {rank}, bucket {bucket}"
                    );
                }
            }
        }
    }
    Ok(())
}
