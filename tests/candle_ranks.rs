//! `ranks::CandlePlan` in one process (features `candle`): a world of one
//! rank leaves a training run bit-identical, gradients that do not fit
//! their variable stop the call with nothing changed, frozen variables stay
//! out, checkpoints round-trip. The multi-rank checks are in
//! `tests/ranks_mpi_candle.rs`, run under `mpirun`.

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
    for bucket in [4, 8, 12, 1 << 20] {
        let mut plan = CandlePlan::new(&Mirror, &store, &PlanOptions::new().bucket_bytes(bucket))?;
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
            assert_eq!(gw, want, "bucket {bucket}, {op:?}");
            let gv = grads.get(&v).expect("v's gradient").to_vec1::<f64>()?;
            let want: Vec<f64> = cv.to_vec1::<f64>()?.iter().map(|x| x * factor).collect();
            assert_eq!(gv, want, "bucket {bucket}, {op:?}");
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
