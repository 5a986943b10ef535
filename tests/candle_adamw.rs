//! `scopetree::candle::AdamW`: candle-nn's AdamW step for step, with its
//! state in a store that saves and loads, so a resumed run continues bit
//! for bit.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Optimizer, ParamsAdamW, VarBuilder, VarMap};
use scopetree::candle::{AdamW, CandleStore};
use scopetree::checkpoint::LoadOptions;

/// A two-layer MLP on fixed inputs; its loss after `steps` AdamW steps.
struct Net {
    l1: candle_nn::Linear,
    l2: candle_nn::Linear,
}

impl Net {
    fn new(vb: &VarBuilder<'_>) -> Net {
        Net {
            l1: candle_nn::linear(6, 16, vb.pp("l1")).unwrap(),
            l2: candle_nn::linear(16, 3, vb.pp("l2")).unwrap(),
        }
    }
    fn loss(&self, step: usize) -> Tensor {
        let x = Tensor::arange(0_u32, 48, &Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .reshape((8, 6))
            .unwrap();
        let x = ((x * 0.01).unwrap() + step as f64 * 0.1)
            .unwrap()
            .sin()
            .unwrap();
        let y = self
            .l2
            .forward(&self.l1.forward(&x).unwrap().tanh().unwrap())
            .unwrap();
        y.sqr().unwrap().mean_all().unwrap()
    }
}

fn params() -> ParamsAdamW {
    ParamsAdamW {
        lr: 0.05,
        weight_decay: 0.1,
        ..ParamsAdamW::default()
    }
}

/// Every parameter's bits, by name.
fn bits(named: Vec<(String, candle_core::Var)>) -> Vec<(String, Vec<u32>)> {
    named
        .into_iter()
        .map(|(k, v)| {
            let vals: Vec<f32> = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            (k, vals.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

/// Random initial values (candle's CPU RNG cannot be seeded), saved, in a
/// VarMap.
fn init(dir: &std::path::Path) -> (VarMap, std::path::PathBuf) {
    let map = VarMap::new();
    Net::new(&VarBuilder::from_varmap(&map, DType::F32, &Device::Cpu));
    let f = dir.join("init.safetensors");
    map.save(&f).unwrap();
    (map, f)
}

/// A store holding the values of `f`.
fn store_of(f: &std::path::Path) -> CandleStore {
    let store = CandleStore::new();
    store
        .load_on(f, &LoadOptions::new().create(true), &Device::Cpu)
        .unwrap();
    store
}

#[test]
fn steps_are_bit_identical_to_candles_adamw() {
    let dir = tempfile::tempdir().unwrap();
    let (map, f) = init(dir.path());
    let store = store_of(&f);
    let a = Net::new(&VarBuilder::from_varmap(&map, DType::F32, &Device::Cpu));
    let b = Net::new(&store.var_builder(DType::F32, &Device::Cpu));
    let mut opt_a = candle_nn::AdamW::new(map.all_vars(), params()).unwrap();
    // VarMap's all_vars are in hash order: name ours by the store.
    let mut opt_b = AdamW::for_store(&store, "", params()).unwrap();
    for step in 0..25 {
        opt_a.backward_step(&a.loss(step)).unwrap();
        opt_b.backward_step(&b.loss(step)).unwrap();
    }
    let mut from_map: Vec<_> = map
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    from_map.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(bits(from_map), bits(store.named_vars().unwrap()));
    assert_eq!(opt_b.step_count().unwrap(), 25);
}

#[test]
fn a_run_resumed_from_saved_parameters_and_state_ends_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let (_, f) = init(dir.path());
    // One run of 20 steps.
    let whole = store_of(&f);
    let net = Net::new(&whole.var_builder(DType::F32, &Device::Cpu));
    let mut opt = AdamW::for_store(&whole, "", params()).unwrap();
    for step in 0..20 {
        opt.backward_step(&net.loss(step)).unwrap();
    }
    // The same, stopped after 12 steps, saved, and resumed in a new store.
    let first = store_of(&f);
    let net = Net::new(&first.var_builder(DType::F32, &Device::Cpu));
    let mut opt = AdamW::for_store(&first, "", params()).unwrap();
    for step in 0..12 {
        opt.backward_step(&net.loss(step)).unwrap();
    }
    first
        .save_sharded(dir.path().join("model"), &Default::default())
        .unwrap();
    opt.state()
        .save_sharded(dir.path().join("optim"), &Default::default())
        .unwrap();

    let resumed = CandleStore::new();
    resumed
        .load(dir.path().join("model"), &LoadOptions::new().create(true))
        .unwrap();
    resumed.seal();
    let net = Net::new(&resumed.var_builder(DType::F32, &Device::Cpu));
    let mut opt = AdamW::for_store(&resumed, "", params()).unwrap();
    opt.state()
        .load(dir.path().join("optim"), &LoadOptions::new())
        .unwrap();
    assert_eq!(opt.step_count().unwrap(), 12);
    for step in 12..20 {
        opt.backward_step(&net.loss(step)).unwrap();
    }
    assert_eq!(
        bits(resumed.named_vars().unwrap()),
        bits(whole.named_vars().unwrap())
    );
    // Without the state, the moments start afresh and the run differs.
    let fresh = CandleStore::new();
    fresh
        .load(dir.path().join("model"), &LoadOptions::new().create(true))
        .unwrap();
    let net = Net::new(&fresh.var_builder(DType::F32, &Device::Cpu));
    let mut opt = AdamW::for_store(&fresh, "", params()).unwrap();
    for step in 12..20 {
        opt.backward_step(&net.loss(step)).unwrap();
    }
    assert_ne!(
        bits(fresh.named_vars().unwrap()),
        bits(whole.named_vars().unwrap())
    );
}
