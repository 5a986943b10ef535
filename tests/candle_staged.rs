//! The candle store's staged loads on the CPU: every path that is not
//! specific to a device (readers, staging windows, checksums, the order of
//! the checks, placement of loaded variables, conversions, the staging
//! budget). `tests/cuda_*.rs` run the same loads onto a GPU.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Init;
use scopetree::candle::{CandleStore, Error};
use scopetree::checkpoint::{self, FloatDtype, LoadOptions, SaveOptions};

/// A store of `n` tensors `layers.NN.w` of `elems` values each (value `i
/// + k / 1000` at element k of tensor i), plus one of every other dtype.
fn model(n: usize, elems: usize, dtype: DType) -> CandleStore {
    let store = CandleStore::new();
    for i in 0..n {
        let v: Vec<f32> = (0..elems).map(|k| i as f32 + k as f32 / 1000.0).collect();
        let t = Tensor::from_vec(v, elems, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let name = format!("layers.{i:02}.w");
        store
            .get(elems, &name, Init::Const(0.0), dtype, &Device::Cpu)
            .unwrap();
        store.var(&name).unwrap().unwrap().set(&t).unwrap();
    }
    for (name, dt) in [
        ("extra.u8", DType::U8),
        ("extra.u32", DType::U32),
        ("extra.i64", DType::I64),
        ("extra.f64", DType::F64),
        ("extra.f16", DType::F16),
    ] {
        let t = Tensor::arange(0_u32, 7, &Device::Cpu)
            .unwrap()
            .to_dtype(dt)
            .unwrap();
        store
            .get(7, name, Init::Const(0.0), dt, &Device::Cpu)
            .unwrap();
        store.var(name).unwrap().unwrap().set(&t).unwrap();
    }
    store
}

/// Every variable's name and bytes (as f64 values, which every dtype here
/// converts to exactly).
fn contents(store: &CandleStore) -> Vec<(String, Vec<f64>)> {
    store
        .named_vars()
        .unwrap()
        .into_iter()
        .map(|(k, v)| {
            let vals = v
                .as_tensor()
                .to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            (k, vals)
        })
        .collect()
}

/// The same store with every value zero (the model built, not loaded).
fn zeroed(like: &CandleStore) -> CandleStore {
    let store = CandleStore::new();
    for (k, v) in like.named_vars().unwrap() {
        store
            .get(v.shape(), &k, Init::Const(0.0), v.dtype(), v.device())
            .unwrap();
    }
    store
}

/// The metadata entry of every tensor's checksum (as the ranks'
/// checkpoints carry them), but for the keys `leaving_out`.
fn checksums(store: &CandleStore, leaving_out: &[&str]) -> HashMap<String, String> {
    let mut meta = HashMap::new();
    for (k, v) in store.named_vars().unwrap() {
        if leaving_out.contains(&k.as_str()) {
            continue;
        }
        let mut bytes = Vec::new();
        checkpoint::Checkpointable::write_le(&v, 1 << 20, &mut |p| {
            bytes.extend_from_slice(p);
            Ok(())
        })
        .unwrap();
        let sum = xxhash_rust::xxh3::xxh3_128(&bytes);
        meta.insert(format!("scopetree_xxh3/{k}"), format!("{sum:032x}"));
    }
    meta
}

/// Saves `store` sharded into `dir` with a checksum of every tensor in each
/// shard's metadata.
fn save_with_checksums(store: &CandleStore, dir: &Path, shard: u64) {
    let meta = checksums(store, &[]);
    store
        .save_sharded(
            dir,
            &SaveOptions::new().max_shard_size(shard).metadata(meta),
        )
        .unwrap();
}

/// Flips one byte of the last tensor's data in the last shard of `dir`.
fn corrupt_last_shard(dir: &Path) -> String {
    let mut shards: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    let last = shards.last().unwrap();
    let mut bytes = std::fs::read(last).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0x55;
    std::fs::write(last, bytes).unwrap();
    last.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn a_load_through_small_windows_and_many_readers_reads_every_byte() {
    let src = model(6, 100_000, DType::F32);
    let dir = tempfile::tempdir().unwrap();
    src.save_sharded(dir.path(), &SaveOptions::new().max_shard_size(900_000))
        .unwrap();
    let want = contents(&src);
    for (budget, readers) in [(0, 1), (256 << 10, 3), (1 << 20, 8), (256 << 20, 2)] {
        let opts = LoadOptions::new().staging_budget(budget).readers(readers);
        // In place, into the built model.
        let built = zeroed(&src);
        built.load(dir.path(), &opts).unwrap();
        assert_eq!(contents(&built), want, "in place, budget {budget}");
        // Created, before the model is built.
        let fresh = CandleStore::new();
        fresh
            .load_on(dir.path(), &opts.clone().create(true), &Device::Cpu)
            .unwrap();
        assert_eq!(contents(&fresh), want, "created, budget {budget}");
    }
}

#[test]
fn conversions_go_through_the_staging_windows_and_round_like_the_checkpoint_layer() {
    let src = model(3, 70_001, DType::BF16);
    let dir = tempfile::tempdir().unwrap();
    src.save_sharded(dir.path(), &SaveOptions::new()).unwrap();
    // bf16 -> f32 is exact: the values must be those of the bf16 model.
    let fresh = CandleStore::new();
    let opts = LoadOptions::new()
        .create(true)
        .create_floats_as(FloatDtype::F32)
        .staging_budget(0);
    fresh.load_on(dir.path(), &opts, &Device::Cpu).unwrap();
    let w = fresh.var("layers.02.w").unwrap().unwrap();
    assert_eq!(w.dtype(), DType::F32);
    assert_eq!(contents(&fresh), contents(&src));
    // f32 -> bf16 into an existing bf16 model rounds as `checkpoint::load`
    // does (both use the same conversion).
    let f32_src = model(2, 5_000, DType::F32);
    let f = dir.path().join("f32.safetensors");
    f32_src.save(&f).unwrap();
    let built = zeroed(&model(2, 5_000, DType::BF16));
    let convert = LoadOptions::new()
        .dtype_policy(checkpoint::DtypePolicy::Convert)
        .allow_missing(true)
        .allow_unused(true)
        .staging_budget(0);
    built.load(&f, &convert).unwrap();
    let want: Vec<f64> = f32_src
        .var("layers.01.w")
        .unwrap()
        .unwrap()
        .as_tensor()
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap();
    let got: Vec<f64> = built
        .var("layers.01.w")
        .unwrap()
        .unwrap()
        .as_tensor()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(got, want);
}

#[test]
fn checksums_are_verified_and_a_bad_one_in_the_last_shard_changes_nothing() {
    let src = model(5, 50_000, DType::F32);
    let dir = tempfile::tempdir().unwrap();
    save_with_checksums(&src, dir.path(), 500_000);
    // A good checkpoint loads, with its checksums.
    let built = zeroed(&src);
    built.load(dir.path(), &LoadOptions::new()).unwrap();
    assert_eq!(contents(&built), contents(&src));

    let shard = corrupt_last_shard(dir.path());
    // In place: every checksum is verified before any Var is written.
    let built = zeroed(&src);
    let before = contents(&built);
    let held = built.var("layers.00.w").unwrap().unwrap();
    let err = built.load(dir.path(), &LoadOptions::new()).unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(checkpoint::Error::Corrupted { path, .. }) if path.contains(&shard)),
        "{err}"
    );
    assert!(err.to_string().contains("checksum"), "{err}");
    assert_eq!(contents(&built), before, "nothing changed");
    assert_eq!(
        held.as_tensor()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        0.0
    );
    // Created: nothing is made.
    let fresh = CandleStore::new();
    let err = fresh
        .load_on(dir.path(), &LoadOptions::new().create(true), &Device::Cpu)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(checkpoint::Error::Corrupted { .. })),
        "{err}"
    );
    assert_eq!(fresh.with_store(|s| s.tree().var_count()), 0);
    // Through a conversion (staged windows): the same.
    let fresh = CandleStore::new();
    let opts = LoadOptions::new()
        .create(true)
        .create_floats_as(FloatDtype::F64);
    let err = fresh.load_on(dir.path(), &opts, &Device::Cpu).unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(checkpoint::Error::Corrupted { .. })),
        "{err}"
    );
    assert_eq!(fresh.with_store(|s| s.tree().var_count()), 0);
}

/// A shard that records the checksums of its other tensors but not of one
/// (an entry lost after the save) is refused before any Var is written:
/// that tensor could not be checked.
#[test]
fn a_tensor_without_its_checksum_beside_checked_ones_is_refused() {
    let src = model(3, 1000, DType::F32);
    let dir = tempfile::tempdir().unwrap();
    let meta = checksums(&src, &["layers.01.w"]);
    src.save_sharded(dir.path(), &SaveOptions::new().metadata(meta))
        .unwrap();
    let built = zeroed(&src);
    let before = contents(&built);
    let err = built.load(dir.path(), &LoadOptions::new()).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Checkpoint(checkpoint::Error::BadFile {
                problem: checkpoint::BadFile::MissingChecksum { key },
                ..
            }) if key == "layers.01.w"
        ),
        "{err}"
    );
    assert!(err.to_string().contains("layers.01.w"), "{err}");
    assert_eq!(contents(&built), before, "nothing changed");
}

#[test]
fn a_missing_name_fails_before_any_read_and_names_it() {
    let src = model(3, 1_000, DType::F32);
    let dir = tempfile::tempdir().unwrap();
    src.save_sharded(dir.path(), &SaveOptions::new().max_shard_size(4_000))
        .unwrap();
    let built = zeroed(&src);
    built
        .get(4, "head.bias", Init::Const(7.0), DType::F32, &Device::Cpu)
        .unwrap();
    let before = contents(&built);
    let err = built.load(dir.path(), &LoadOptions::new()).unwrap_err();
    assert!(err.to_string().contains("head.bias"), "{err}");
    assert_eq!(contents(&built), before);
}

#[test]
fn a_load_that_creates_waits_for_the_first_get_and_goes_to_its_device() {
    let src = model(2, 1_000, DType::F32);
    let dir = tempfile::tempdir().unwrap();
    src.save_sharded(dir.path(), &SaveOptions::new()).unwrap();
    let fresh = CandleStore::new();
    let report = fresh
        .load(dir.path(), &LoadOptions::new().create(true))
        .unwrap();
    assert_eq!(report.created.len(), 7);
    assert!(fresh.is_pending());
    // Named, and known to VarBuilder's `contains_tensor`, before any read.
    assert_eq!(fresh.names().unwrap().len(), 7);
    assert!(fresh.is_pending());
    let vb = fresh.var_builder(DType::F32, &Device::Cpu);
    assert!(vb.contains_tensor("layers.00.w"));
    // The first get places every loaded variable on its device.
    fresh.seal();
    let w = vb.get(1_000, "layers.01.w").unwrap();
    assert!(!fresh.is_pending());
    assert!(w.device().is_cpu());
    assert_eq!(contents(&fresh), contents(&src));
    assert!(fresh.unused().unwrap().contains(&"layers.00.w".to_owned()));
}

#[test]
fn a_deferred_load_whose_file_went_bad_fails_at_the_get_and_makes_nothing() {
    let src = model(2, 10_000, DType::F32);
    let dir = tempfile::tempdir().unwrap();
    save_with_checksums(&src, dir.path(), u64::MAX);
    let fresh = CandleStore::new();
    fresh
        .load(dir.path(), &LoadOptions::new().create(true))
        .unwrap();
    corrupt_last_shard(dir.path());
    let err = fresh
        .get(
            10_000,
            "layers.00.w",
            Init::Const(0.0),
            DType::F32,
            &Device::Cpu,
        )
        .unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(checkpoint::Error::Corrupted { .. })),
        "{err}"
    );
    assert!(!fresh.is_pending());
    // Unsealed, the get made its own variable; the load made none.
    assert_eq!(fresh.with_store(|s| s.tree().var_count()), 0);
}

#[test]
fn a_call_that_needs_values_before_any_get_places_them_on_the_cpu() {
    let src = model(1, 10, DType::F32);
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("m.safetensors");
    src.save(&f).unwrap();
    let fresh = CandleStore::new();
    fresh.load(&f, &LoadOptions::new().create(true)).unwrap();
    let v: Var = fresh.var("layers.00.w").unwrap().expect("placed");
    assert!(v.device().is_cpu());
    assert!(!fresh.is_pending());
    // A later load names the device of its new variables.
    let other = CandleStore::new();
    other.load(&f, &LoadOptions::new().create(true)).unwrap();
    other.place(&Device::Cpu).unwrap();
    assert_eq!(contents(&other), contents(&src));
}

#[test]
fn rollback_reads_into_new_memory_and_the_held_var_still_sees_the_file() {
    let src = model(2, 3_000, DType::F32);
    let dir = tempfile::tempdir().unwrap();
    src.save_sharded(dir.path(), &SaveOptions::new()).unwrap();
    let built = zeroed(&src);
    let held = built.var("layers.01.w").unwrap().unwrap();
    built
        .load(dir.path(), &LoadOptions::new().rollback(true))
        .unwrap();
    assert_eq!(contents(&built), contents(&src));
    let got: Vec<f32> = held.as_tensor().to_vec1().unwrap();
    assert_eq!(got[1], 1.001);
}

#[test]
fn saves_stream_every_dtype_and_match_the_checkpoint_bytes() {
    let src = model(3, 40_000, DType::BF16);
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.safetensors");
    src.save(&a).unwrap();
    // candle reads every tensor back identical.
    let read = candle_core::safetensors::load(&a, &Device::Cpu).unwrap();
    for (k, v) in src.named_vars().unwrap() {
        let t = &read[&k];
        assert_eq!(t.dtype(), v.dtype());
        let d = (t.to_dtype(DType::F64).unwrap() - v.as_tensor().to_dtype(DType::F64).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert_eq!(d, 0.0, "{k}");
    }
    // floats_as converts while streaming, as the checkpoint layer rounds.
    let b = dir.path().join("b");
    src.save_sharded(&b, &SaveOptions::new().floats_as(FloatDtype::F32))
        .unwrap();
    let back = CandleStore::new();
    back.load_on(&b, &LoadOptions::new().create(true), &Device::Cpu)
        .unwrap();
    assert_eq!(
        back.var("layers.00.w").unwrap().unwrap().dtype(),
        DType::F32
    );
    assert_eq!(contents(&back), contents(&src));
}
