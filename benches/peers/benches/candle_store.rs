//! scopetree's `CandleStore` against candle-nn's `VarMap` as the store
//! behind `VarBuilder`, in one run, each pair in one group so the medians sit
//! side by side:
//!
//! - `candle_build/{varmap,scopetree}/d{64,8}`: building every parameter of a
//!   small GPT-style transformer with candle-nn layers (`embedding`,
//!   `layer_norm`, `linear`) on a fresh store, made in criterion's setup.
//!   16 layers, 4 heads; `d64` has `d_model` 64, `d8` has `d_model` 8 so
//!   that every tensor is tiny and the per-name cost (name joining, locking,
//!   lookup, insertion) dominates the random initialisation.
//! - `candle_build_interleaved/{varmap,scopetree}/d{64,8}`: the same
//!   builds, each iteration building through both stores in alternating
//!   order and timing only its own (store creation and drops untimed).
//! - `candle_rebuild_interleaved/{varmap,scopetree}/d8`: the `d8` model
//!   built again, interleaved, through a store that already holds every
//!   parameter (a build after loading a checkpoint): every `get` is a reuse.
//! - `candle_step/{varmap,scopetree}`: one training step (forward, backward,
//!   AdamW step) of the `d64` model built once through each store, both from
//!   the same weights (the bench asserts bit-identical losses before and
//!   after a first step). `varmap_again` repeats the `VarMap` step after
//!   scopetree's, as a measure of the machine's drift. Every function starts
//!   from the initial weights with a fresh optimizer: the step's cost follows
//!   the training state (the one batch is learnt until gradients get tiny).
//! - `candle_step_interleaved/{varmap,scopetree}`: the same two steps, each
//!   iteration running one step of each store in alternating order and
//!   timing only its own (the drift between functions cancels).
//! - `candle_save/{varmap,scopetree}` and `candle_load/{varmap,scopetree}`:
//!   that model's parameters to a `.safetensors` file and back into the
//!   built model (`VarMap::save`/`load`; `CandleStore::save`/`load`, strict
//!   and atomic). The bench asserts that both files are byte-identical.
//!
//! Run: `cargo bench -p scopetree-peers --bench candle_store` (builds
//! candle; not part of CI).

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use scopetree::candle::CandleStore;
use scopetree::checkpoint::LoadOptions;

#[path = "../support/gpt.rs"]
mod gpt;
#[path = "../../support/timing.rs"]
mod timing;
use gpt::{Config, D8, D64, Gpt, build, tensor_count};
use timing::{interleaved, interleaved_timed};

/// Sequences per training batch.
const BATCH: usize = 4;

/// A fixed batch: tokens, next tokens, positions and the causal mask.
struct Batch {
    x: Tensor,
    y: Tensor,
    pos: Tensor,
    mask: Tensor,
}

fn batch(cfg: Config) -> Result<Batch> {
    let dev = Device::Cpu;
    let (t, v) = (cfg.seq, cfg.vocab);
    let tokens: Vec<u32> = (0..BATCH * (t + 1))
        .map(|i| ((i * 7 + i / 3) % v) as u32)
        .collect();
    let all = Tensor::from_vec(tokens, (BATCH, t + 1), &dev)?;
    let mask: Vec<f32> = (0..t * t)
        .map(|i| if i % t > i / t { -1e9 } else { 0.0 })
        .collect();
    Ok(Batch {
        x: all.narrow(1, 0, t)?.contiguous()?,
        y: all.narrow(1, 1, t)?.contiguous()?,
        pos: Tensor::arange(0u32, t as u32, &dev)?,
        mask: Tensor::from_vec(mask, (t, t), &dev)?,
    })
}

fn loss(model: &Gpt, b: &Batch) -> Result<Tensor> {
    let logits = model.forward(&b.x, &b.pos, &b.mask)?;
    let n = BATCH * model.cfg.seq;
    candle_nn::loss::cross_entropy(&logits.reshape((n, model.cfg.vocab))?, &b.y.flatten_all()?)
}

/// One training step; returns the loss before the update.
fn step(model: &Gpt, opt: &mut AdamW, b: &Batch) -> Result<f32> {
    let l = loss(model, b)?;
    opt.backward_step(&l)?;
    l.to_scalar::<f32>()
}

fn adamw(vars: Vec<candle_core::Var>) -> AdamW {
    let params = ParamsAdamW {
        lr: 1e-3,
        ..ParamsAdamW::default()
    };
    AdamW::new(vars, params).expect("adamw")
}

fn varmap_model(cfg: Config) -> (VarMap, Gpt) {
    let map = VarMap::new();
    let model = build(
        &VarBuilder::from_varmap(&map, DType::F32, &Device::Cpu),
        cfg,
    )
    .unwrap();
    (map, model)
}

fn scopetree_model(cfg: Config) -> (CandleStore, Gpt) {
    let store = CandleStore::new();
    let model = build(&store.var_builder(DType::F32, &Device::Cpu), cfg).unwrap();
    (store, model)
}

fn build_bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("candle_build");
    for (label, cfg) in [("d64", D64), ("d8", D8)] {
        let (map, _) = varmap_model(cfg);
        let (store, _) = scopetree_model(cfg);
        let n = tensor_count(cfg);
        assert_eq!(map.all_vars().len(), n);
        assert_eq!(store.names().unwrap().len(), n);
        let params: usize = store
            .all_vars()
            .unwrap()
            .iter()
            .map(|v| v.elem_count())
            .sum();
        println!(
            "candle_store: {label}: {} layers, d_model {}: {n} tensors, {params} parameters",
            cfg.layers, cfg.d_model
        );
        g.bench_function(BenchmarkId::new("varmap", label), |b| {
            b.iter_batched(
                VarMap::new,
                |map| {
                    let vb = VarBuilder::from_varmap(&map, DType::F32, &Device::Cpu);
                    let model = build(&vb, black_box(cfg)).unwrap();
                    (map, model)
                },
                BatchSize::SmallInput,
            )
        });
        g.bench_function(BenchmarkId::new("scopetree", label), |b| {
            b.iter_batched(
                CandleStore::new,
                |store| {
                    let vb = store.var_builder(DType::F32, &Device::Cpu);
                    let model = build(&vb, black_box(cfg)).unwrap();
                    (store, model)
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();

    // The same builds interleaved: every iteration builds the model through
    // both stores, in alternating order, and times only its own store's
    // build (store creation and drops untimed).
    let mut g = c.benchmark_group("candle_build_interleaved");
    for (label, cfg) in [("d64", D64), ("d8", D8)] {
        let ours = || {
            let store = CandleStore::new();
            timed_build(&store.var_builder(DType::F32, &Device::Cpu), cfg)
        };
        let theirs = || {
            let map = VarMap::new();
            timed_build(
                &VarBuilder::from_varmap(&map, DType::F32, &Device::Cpu),
                cfg,
            )
        };
        g.bench_function(BenchmarkId::new("varmap", label), |b| {
            b.iter_custom(|iters| interleaved_timed(iters, theirs, ours))
        });
        g.bench_function(BenchmarkId::new("scopetree", label), |b| {
            b.iter_custom(|iters| interleaved_timed(iters, ours, theirs))
        });
    }
    g.finish();

    // The `d8` model built again through a store that already holds every
    // parameter (a model built after loading its checkpoint): every `get` is
    // a reuse and nothing is initialised, so the stores' lookups (and
    // candle-nn's name joining, the same on both sides) are what is timed.
    let mut g = c.benchmark_group("candle_rebuild_interleaved");
    let (map, _) = varmap_model(D8);
    let (store, _) = scopetree_model(D8);
    let ours = || timed_build(&store.var_builder(DType::F32, &Device::Cpu), D8);
    let theirs = || timed_build(&VarBuilder::from_varmap(&map, DType::F32, &Device::Cpu), D8);
    g.bench_function("varmap/d8", |b| {
        b.iter_custom(|iters| interleaved_timed(iters, theirs, ours))
    });
    g.bench_function("scopetree/d8", |b| {
        b.iter_custom(|iters| interleaved_timed(iters, ours, theirs))
    });
    g.finish();
    assert_eq!(
        store.names().unwrap().len(),
        tensor_count(D8),
        "a rebuild creates nothing"
    );
    assert_eq!(map.all_vars().len(), tensor_count(D8));
}

/// The time of one build of the `cfg` model through `vb`; the model is
/// dropped after the clock stops (the store's drop, by the caller, too).
fn timed_build(vb: &VarBuilder, cfg: Config) -> std::time::Duration {
    let start = Instant::now();
    let model = build(vb, black_box(cfg));
    let took = start.elapsed();
    drop(model.unwrap());
    took
}

/// A scratch directory of this process.
fn scratch() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("scopetree-candle-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The same `D64` model through both stores, from the same weights (built
/// in scopetree, saved, loaded into the `VarMap`).
fn twin_models(dir: &Path) -> (VarMap, Gpt, CandleStore, Gpt) {
    let (store, ours) = scopetree_model(D64);
    let (mut map, theirs) = varmap_model(D64);
    let init = dir.join("init.safetensors");
    store.save(&init).unwrap();
    map.load(&init).unwrap();
    (map, theirs, store, ours)
}

/// Both models back to the initial weights `init`, with fresh optimizers:
/// a step's cost follows the training state (this one batch is learnt until
/// the gradients get tiny), so every benchmark function starts from the
/// same state.
fn level(map: &mut VarMap, store: &CandleStore, init: &Path) -> (AdamW, AdamW) {
    map.load(init).unwrap();
    store.load(init, &LoadOptions::new()).unwrap();
    (
        adamw(map.all_vars()),
        adamw(store.trainable_vars("").unwrap()),
    )
}

fn step_bench(c: &mut Criterion) {
    let dir = scratch();
    let (mut map, theirs, store, ours) = twin_models(&dir);
    let init = dir.join("init.safetensors");
    let b = batch(D64).unwrap();
    let (mut opt_v, mut opt_s) = level(&mut map, &store, &init);
    // Same weights, same work: the losses agree bit for bit before and after
    // a first step.
    for _ in 0..2 {
        let lv = step(&theirs, &mut opt_v, &b).unwrap();
        let ls = step(&ours, &mut opt_s, &b).unwrap();
        assert_eq!(lv.to_bits(), ls.to_bits());
        assert!(lv.is_finite());
    }

    let mut g = c.benchmark_group("candle_step");
    let (mut opt_v, _) = level(&mut map, &store, &init);
    g.bench_function("varmap", |bn| {
        bn.iter(|| step(&theirs, &mut opt_v, black_box(&b)).unwrap())
    });
    let (_, mut opt_s) = level(&mut map, &store, &init);
    g.bench_function("scopetree", |bn| {
        bn.iter(|| step(&ours, &mut opt_s, black_box(&b)).unwrap())
    });
    // The noise control (A/B/A): the VarMap step again, after scopetree's.
    // The two steps do the same arithmetic on the same tensors, so a gap
    // between `varmap` and `scopetree` no wider than the one between
    // `varmap` and `varmap_again` is the machine, not the store.
    let (mut opt_v, _) = level(&mut map, &store, &init);
    g.bench_function("varmap_again", |bn| {
        bn.iter(|| step(&theirs, &mut opt_v, black_box(&b)).unwrap())
    });
    g.finish();

    // The same two steps interleaved: every iteration of either function
    // runs one step of each store, in alternating order, and times only its
    // own store's. Both medians then come from the same minutes of the
    // machine, so drift between benchmark functions (the A/A gap above)
    // cannot show up as a gap between the stores.
    let (mut opt_v, mut opt_s) = level(&mut map, &store, &init);
    let mut g = c.benchmark_group("candle_step_interleaved");
    g.bench_function("varmap", |bn| {
        bn.iter_custom(|iters| {
            interleaved(
                iters,
                || {
                    step(&theirs, &mut opt_v, black_box(&b)).unwrap();
                },
                || {
                    step(&ours, &mut opt_s, black_box(&b)).unwrap();
                },
            )
        })
    });
    g.bench_function("scopetree", |bn| {
        bn.iter_custom(|iters| {
            interleaved(
                iters,
                || {
                    step(&ours, &mut opt_s, black_box(&b)).unwrap();
                },
                || {
                    step(&theirs, &mut opt_v, black_box(&b)).unwrap();
                },
            )
        })
    });
    g.finish();
    // Still the same weights: every iteration stepped both models.
    let lv = step(&theirs, &mut opt_v, &b).unwrap();
    let ls = step(&ours, &mut opt_s, &b).unwrap();
    assert_eq!(lv.to_bits(), ls.to_bits());
    let _ = std::fs::remove_dir_all(&dir);
}

fn checkpoint_bench(c: &mut Criterion) {
    let dir = scratch();
    let (mut map, _theirs, store, _ours) = twin_models(&dir);
    let theirs_file = dir.join("varmap.safetensors");
    let ours_file = dir.join("scopetree.safetensors");
    // Both files exist before any group runs, so that the check and the
    // loads below hold when a filter skips the saves.
    map.save(&theirs_file).unwrap();
    store.save(&ours_file).unwrap();

    let mut g = c.benchmark_group("candle_save");
    g.bench_function("varmap", |b| b.iter(|| map.save(&theirs_file).unwrap()));
    g.bench_function("scopetree", |b| b.iter(|| store.save(&ours_file).unwrap()));
    g.finish();
    assert_eq!(
        std::fs::read(&ours_file).unwrap(),
        std::fs::read(&theirs_file).unwrap()
    );

    let strict = LoadOptions::new();
    let mut g = c.benchmark_group("candle_load");
    g.bench_function("varmap", |b| b.iter(|| map.load(&theirs_file).unwrap()));
    g.bench_function("scopetree", |b| {
        b.iter(|| store.load(&ours_file, &strict).unwrap())
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, build_bench, step_bench, checkpoint_bench);
criterion_main!(benches);
