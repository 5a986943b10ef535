//! Resuming training from a `CheckpointStore` checkpoint (ndarray backend
//! with autodiff, burn-optim's Adam): a run stopped half-way and resumed
//! in a fresh model and optimizer ends bit-identical to one that never
//! stopped, because the load gives the parameters back their `ParamId`s,
//! under which burn-optim keys the Adam moments. Through burn-store's
//! `SafetensorsStore`, which keeps the fresh model's ids, the moments are
//! lost and the runs differ (burn #5130).

use burn_core as burn;
use burn_core::module::Module;
use burn_core::tensor::{Device, Tensor, TensorData, activation::relu};
use burn_nn::{Linear, LinearConfig};
use burn_optim::{AdamConfig, GradientsParams, ModuleOptimizer};
use burn_store::{ModuleSnapshot, SafetensorsStore};
use scopetree::burn::CheckpointStore;

#[derive(Module, Debug)]
struct Mlp {
    a: Linear,
    b: Linear,
}

impl Mlp {
    fn new(seed: u64, device: &Device) -> Self {
        device.seed(seed);
        Self {
            a: LinearConfig::new(3, 16).init(device),
            b: LinearConfig::new(16, 1).init(device),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.b.forward(relu(self.a.forward(x)))
    }
}

/// Batch `step`: 8 points of y = x0 - 2 x1 + x2 / 2, made from the step.
fn batch(step: usize, device: &Device) -> (Tensor<2>, Tensor<2>) {
    let xs: Vec<f32> = (0..24)
        .map(|i| (((step * 24 + i) * 2_654_435_761) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let ys: Vec<f32> = xs
        .chunks(3)
        .map(|p| p[0] - 2.0 * p[1] + 0.5 * p[2])
        .collect();
    (
        Tensor::from_data(TensorData::new(xs, [8, 3]), device),
        Tensor::from_data(TensorData::new(ys, [8, 1]), device),
    )
}

fn train(
    mut model: Mlp,
    optim: &mut ModuleOptimizer,
    steps: std::ops::Range<usize>,
    device: &Device,
) -> Mlp {
    for step in steps {
        let (x, y) = batch(step, device);
        let loss = (model.forward(x) - y).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
    }
    model
}

fn bytes(m: &Mlp) -> Vec<Vec<u8>> {
    m.collect(None, None, false)
        .iter()
        .map(|t| burn_store::bridge::to_data(t).unwrap().as_bytes().to_vec())
        .collect()
}

#[test]
fn a_resumed_run_ends_bit_identical_to_one_that_never_stopped() {
    let device = Device::default().autodiff();
    let dir = tempfile::tempdir().unwrap();

    let mut optim = AdamConfig::new().init();
    let whole = train(Mlp::new(1, &device), &mut optim, 0..8, &device);

    let mut optim = AdamConfig::new().init();
    let half = train(Mlp::new(1, &device), &mut optim, 0..4, &device);
    let ck = dir.path().join("ck");
    half.save_into(&mut CheckpointStore::sharded(&ck).max_shard_size(128))
        .unwrap();
    optim.save(ck.join("optimizer.bpk")).unwrap();
    drop((half, optim));

    // A fresh process: another initialization, a new optimizer.
    let mut resumed = Mlp::new(2, &device);
    resumed
        .load_from(&mut CheckpointStore::sharded(&ck))
        .unwrap();
    let mut optim = AdamConfig::new()
        .init()
        .load(ck.join("optimizer.bpk"))
        .unwrap();
    let resumed = train(resumed, &mut optim, 4..8, &device);
    assert_eq!(bytes(&resumed), bytes(&whole));

    // The same through SafetensorsStore: the ids are the fresh model's,
    // the saved Adam moments match none of them, and the runs part.
    let mut optim = AdamConfig::new().init();
    let half = train(Mlp::new(1, &device), &mut optim, 0..4, &device);
    let file = dir.path().join("burn.safetensors");
    half.save_into(&mut SafetensorsStore::from_file(&file))
        .unwrap();
    optim.save(dir.path().join("optimizer2.bpk")).unwrap();
    let mut other = Mlp::new(2, &device);
    other
        .load_from(&mut SafetensorsStore::from_file(&file))
        .unwrap();
    let mut optim = AdamConfig::new()
        .init()
        .load(dir.path().join("optimizer2.bpk"))
        .unwrap();
    let other = train(other, &mut optim, 4..8, &device);
    assert_ne!(bytes(&other), bytes(&whole));
}
