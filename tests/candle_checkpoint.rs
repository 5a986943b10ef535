//! Checkpoints of candle tensors through `CandleStore` (issue 11): save and
//! strict load round-trip bit-exactly into a model already built; files
//! interoperate with candle's `VarMap::load`, `VarMap::save` and
//! `VarBuilder::from_mmaped_safetensors`, byte for byte; a load before the
//! model is built creates each variable once; a strict load that does not
//! match (missing, unexpected, wrong shape, wrong dtype, corrupted file)
//! names every key and changes nothing, where `VarMap::load` writes some
//! variables before it fails. A proptest mutates a file with checksums
//! (cut, flipped, spliced bytes, header and data): every load, strict, new
//! variables or new ones converted to bf16, fails changing nothing, or
//! loads exactly what the file holds as the `safetensors` crate reads it.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use scopetree::candle::{CandleStore, Error};
use scopetree::checkpoint::{self, DtypePolicy, LoadOptions, Mismatch};
use scopetree::sharing::{GLOBAL_VARIABLES, TRAINABLE_VARIABLES};

type R = Result<(), Box<dyn std::error::Error>>;

const CPU: Device = Device::Cpu;

#[path = "support/candle_tiny.rs"]
mod candle_tiny;
#[path = "support/mutations.rs"]
mod mutations;
use candle_tiny::{NAMES, Tiny, names_of};

fn vb(store: &CandleStore) -> VarBuilder<'static> {
    store.var_builder(DType::F32, &CPU)
}

/// The element bits of an F32 tensor.
fn bits(t: &Tensor) -> Vec<u32> {
    assert_eq!(t.dtype(), DType::F32);
    t.flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .expect("an F32 tensor")
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// Every variable's name, shape and bits.
type Snap = Vec<(String, Vec<usize>, Vec<u32>)>;

fn snapshot(store: &CandleStore) -> Snap {
    store
        .named_vars()
        .expect("the store's names are valid dotted names")
        .into_iter()
        .map(|(k, v)| (k, v.dims().to_vec(), bits(&v)))
        .collect()
}

fn snapshot_varmap(varmap: &VarMap) -> Snap {
    let data = varmap.data().lock().expect("lock");
    let mut s: Snap = data
        .iter()
        .map(|(k, v)| (k.clone(), v.dims().to_vec(), bits(v)))
        .collect();
    s.sort_by(|a, b| a.0.cmp(&b.0));
    s
}

/// How many variables differ between two snapshots of the same names.
fn changed(before: &Snap, after: &Snap) -> usize {
    assert_eq!(before.len(), after.len());
    before
        .iter()
        .zip(after)
        .filter(|(b, a)| {
            assert_eq!(a.0, b.0);
            a.2 != b.2
        })
        .count()
}

/// A store with the model built and one AdamW step taken (values that are
/// no longer the initial ones).
fn trained() -> Result<(CandleStore, Tiny), Box<dyn std::error::Error>> {
    let store = CandleStore::new();
    let model = Tiny::build(&vb(&store))?;
    let mut opt = AdamW::new(store.trainable_vars("")?, ParamsAdamW::default())?;
    opt.backward_step(&model.loss()?)?;
    Ok((store, model))
}

/// The store's tensors by name, to write altered files with candle.
fn tensors(store: &CandleStore) -> HashMap<String, Tensor> {
    store
        .named_vars()
        .expect("the store's names are valid dotted names")
        .into_iter()
        .map(|(k, v)| (k, v.as_tensor().copy().expect("copy")))
        .collect()
}

fn write(path: &Path, ts: &HashMap<String, Tensor>) {
    candle_core::safetensors::save(ts, path).expect("candle writes the file");
}

// ----- round trip ---------------------------------------------------------------

#[test]
fn save_then_strict_load_is_bit_exact_and_the_built_model_sees_it() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.safetensors");
    let (a, model_a) = trained()?;
    let report = a.save(&path)?;
    assert_eq!(report.keys, NAMES);

    let b = CandleStore::new();
    let model_b = Tiny::build(&vb(&b))?;
    let out_a = bits(&model_a.logits()?);
    assert_ne!(bits(&model_b.logits()?), out_a);

    let report = b.load(&path, &LoadOptions::new())?;
    assert_eq!(report.loaded, NAMES);
    assert!(report.created.is_empty() && report.missing.is_empty() && report.unused.is_empty());
    assert_eq!(snapshot(&b), snapshot(&a));
    // The model built before the load holds the loaded values.
    assert_eq!(bits(&model_b.logits()?), out_a);
    // And still trains them: its tensors are the Vars.
    let grads = model_b.loss()?.backward()?;
    for (name, v) in b.named_vars()? {
        assert!(grads.get(v.as_tensor()).is_some(), "{name}");
    }
    Ok(())
}

// ----- interop with candle ------------------------------------------------------

#[test]
fn a_scopetree_file_loads_in_varmap_and_in_the_mmaped_builder() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("scopetree.safetensors");
    let (a, model_a) = trained()?;
    a.save(&path)?;
    let want = snapshot(&a);

    let mut varmap = VarMap::new();
    let model_vm = Tiny::build(&VarBuilder::from_varmap(&varmap, DType::F32, &CPU))?;
    varmap.load(&path)?;
    assert_eq!(snapshot_varmap(&varmap), want);
    assert_eq!(bits(&model_vm.logits()?), bits(&model_a.logits()?));

    // SAFETY: the file is a temporary file of this test, written above and
    // not modified while the memory map lives.
    let mm = unsafe { VarBuilder::from_mmaped_safetensors(&[&path], DType::F32, &CPU)? };
    for (name, shape, b) in &want {
        assert_eq!(&bits(&mm.get(shape.as_slice(), name)?), b, "{name}");
    }
    let model_mm = Tiny::build(&mm)?;
    assert_eq!(bits(&model_mm.logits()?), bits(&model_a.logits()?));
    Ok(())
}

#[test]
fn a_varmap_file_loads_strictly_and_both_stores_save_the_same_bytes() -> R {
    let dir = tempfile::tempdir()?;
    let vm_file = dir.path().join("varmap.safetensors");
    let st_file = dir.path().join("scopetree.safetensors");

    // VarMap → scopetree.
    let varmap = VarMap::new();
    Tiny::build(&VarBuilder::from_varmap(&varmap, DType::F32, &CPU))?;
    varmap.save(&vm_file)?;
    let store = CandleStore::new();
    Tiny::build(&vb(&store))?;
    assert_eq!(store.load(&vm_file, &LoadOptions::new())?.loaded, NAMES);
    assert_eq!(snapshot(&store), snapshot_varmap(&varmap));
    store.save(&st_file)?;
    assert_eq!(std::fs::read(&st_file)?, std::fs::read(&vm_file)?);

    // scopetree → VarMap, with other values.
    let (a, _) = trained()?;
    a.save(&st_file)?;
    let mut varmap = VarMap::new();
    Tiny::build(&VarBuilder::from_varmap(&varmap, DType::F32, &CPU))?;
    varmap.load(&st_file)?;
    varmap.save(&vm_file)?;
    assert_eq!(std::fs::read(&vm_file)?, std::fs::read(&st_file)?);
    Ok(())
}

// ----- load before build --------------------------------------------------------

#[test]
fn load_before_build_creates_each_variable_once() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.safetensors");
    let (a, model_a) = trained()?;
    a.save(&path)?;

    let b = CandleStore::new();
    let report = b.load(&path, &LoadOptions::new().create(true))?;
    assert_eq!(report.created, NAMES);
    assert_eq!(report.loaded, NAMES);
    assert_eq!(b.names()?, NAMES);
    assert_eq!(b.unused()?, NAMES);
    let created: Vec<_> = b
        .named_vars()?
        .into_iter()
        .map(|(_, v)| v.as_tensor().id())
        .collect();

    b.seal();
    let model_b = Tiny::build(&vb(&b))?;
    assert_eq!(b.names()?, NAMES, "no variable created twice");
    let after: Vec<_> = b
        .named_vars()?
        .into_iter()
        .map(|(_, v)| v.as_tensor().id())
        .collect();
    assert_eq!(after, created, "the model holds the loaded Vars");
    assert_eq!(snapshot(&b), snapshot(&a));
    assert!(b.unused()?.is_empty());
    assert_eq!(bits(&model_b.logits()?), bits(&model_a.logits()?));
    assert_eq!(b.trainable_vars("")?.len(), 7);
    Ok(())
}

/// The members of the sharing collection `key`, sorted by path: (tree
/// path, recorded shape, created trainable).
type Members = Vec<(String, Option<Vec<usize>>, Option<bool>)>;

fn members(store: &CandleStore, key: &str) -> Members {
    store.with_store(|s| {
        let mut m: Members = s
            .collection(key, None)
            .expect("the collection lists")
            .into_iter()
            .map(|(path, id)| {
                let shape = s
                    .initial_shape(id)
                    .expect("a live var")
                    .and_then(|x| x.to_vec());
                (path, shape, s.is_trainable(id).expect("a live var"))
            })
            .collect();
        m.sort();
        m
    })
}

/// `NAMES` as tree paths with their shapes in `Tiny`, and a trainable flag.
fn tiny_members(trainable: impl Fn(&str) -> bool) -> Members {
    let shapes: [&[usize]; 7] = [&[8, 4], &[15], &[15], &[15, 5], &[15, 4], &[8], &[8, 5]];
    NAMES
        .iter()
        .zip(shapes)
        .map(|(k, s)| (k.replace('.', "/"), Some(s.to_vec()), Some(trainable(k))))
        .collect()
}

#[test]
fn variables_a_load_creates_join_the_collections_with_their_shapes() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.safetensors");
    let (a, _) = trained()?;
    a.save(&path)?;

    let b = CandleStore::new();
    assert_eq!(
        b.load(&path, &LoadOptions::new().create(true))?.created,
        NAMES
    );
    assert_eq!(members(&b, GLOBAL_VARIABLES), tiny_members(|_| true));
    assert_eq!(members(&b, TRAINABLE_VARIABLES), tiny_members(|_| true));
    assert_eq!(
        names_of(&b, &b.trainable_vars_in(TRAINABLE_VARIABLES)?),
        NAMES
    );
    assert_eq!(names_of(&b, &b.trainable_vars("")?), NAMES);

    // The model's gets reuse them: the collections gain no member, and an
    // optimizer over the collection moves every variable.
    b.seal();
    let model = Tiny::build(&vb(&b))?;
    assert_eq!(members(&b, GLOBAL_VARIABLES), tiny_members(|_| true));
    assert_eq!(members(&b, TRAINABLE_VARIABLES), tiny_members(|_| true));
    let vars = b.trainable_vars_in(TRAINABLE_VARIABLES)?;
    assert_eq!(names_of(&b, &vars), NAMES);
    let before = snapshot(&b);
    AdamW::new(vars, ParamsAdamW::default())?.backward_step(&model.loss()?)?;
    assert_eq!(changed(&before, &snapshot(&b)), 7);
    Ok(())
}

#[test]
fn variables_a_load_creates_under_a_frozen_prefix_are_left_out_by_the_store_and_come_back_on_unfreeze()
-> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.safetensors");
    let (a, _) = trained()?;
    a.save(&path)?;

    let b = CandleStore::new();
    b.freeze("gru")?;
    assert_eq!(
        b.load(&path, &LoadOptions::new().create(true))?.created,
        NAMES
    );
    let frozen = |k: &str| k.starts_with("gru.");
    // Freezing is the candle store's rule: the sharing layer records every
    // variable it adopts as trainable, so that unfreeze can bring it back.
    assert_eq!(members(&b, GLOBAL_VARIABLES), tiny_members(|_| true));
    assert_eq!(members(&b, TRAINABLE_VARIABLES), tiny_members(|_| true));
    let want = ["emb.weight", "out.bias", "out.weight"];
    assert_eq!(
        names_of(&b, &b.trainable_vars_in(TRAINABLE_VARIABLES)?),
        want
    );
    assert_eq!(names_of(&b, &b.trainable_vars("")?), want);

    b.seal();
    let model = Tiny::build(&vb(&b))?;
    let before = snapshot(&b);
    AdamW::new(
        b.trainable_vars_in(TRAINABLE_VARIABLES)?,
        ParamsAdamW::default(),
    )?
    .backward_step(&model.loss()?)?;
    for (b, a) in before.iter().zip(&snapshot(&b)) {
        if frozen(&a.0) {
            assert_eq!(a.2, b.2, "the frozen {} moved", a.0);
        } else {
            assert_ne!(a.2, b.2, "{} did not move", a.0);
        }
    }
    b.unfreeze("gru")?;
    assert_eq!(
        names_of(&b, &b.trainable_vars_in(TRAINABLE_VARIABLES)?),
        NAMES
    );
    assert_eq!(names_of(&b, &b.trainable_vars("")?), NAMES);
    Ok(())
}

#[test]
fn an_f64_file_loaded_before_build_is_not_converted_for_an_f32_model() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("f64.safetensors");
    let a = CandleStore::new();
    Tiny::build(&a.var_builder(DType::F64, &CPU))?;
    a.save(&path)?;

    let b = CandleStore::new();
    b.load(&path, &LoadOptions::new().create(true))?;
    let err = Tiny::build(&vb(&b))
        .err()
        .expect("an F32 build over F64 vars");
    assert!(
        err.to_string().contains("holds F64, but F32 was asked for"),
        "{err}"
    );
    assert_eq!(b.names()?, NAMES);
    for (name, v) in b.named_vars()? {
        assert_eq!(v.dtype(), DType::F64, "{name}");
    }
    // The direct call names both dtypes.
    match b.get(
        (8, 4),
        "emb.weight",
        candle_nn::Init::Const(0.),
        DType::F32,
        &CPU,
    ) {
        Err(Error::DtypeMismatch { name, asked, found }) => {
            assert_eq!(name, "emb.weight");
            assert_eq!((asked, found), (DType::F32, DType::F64));
        }
        other => panic!("expected DtypeMismatch, got {other:?}"),
    }
    // Built in F64, the model reuses every loaded variable.
    Tiny::build(&b.var_builder(DType::F64, &CPU))?;
    assert!(b.unused()?.is_empty());
    Ok(())
}

// ----- strict loads that do not match --------------------------------------------

/// Loads `path` strictly into `store` and checks the mismatch it reports,
/// and that no variable changed.
fn assert_mismatch(
    store: &CandleStore,
    path: &Path,
    missing: &[&str],
    unexpected: &[&str],
    mismatched: &[Mismatch],
) {
    let before = snapshot(store);
    let err = store.load(path, &LoadOptions::new()).unwrap_err();
    match err {
        Error::Checkpoint(checkpoint::Error::Mismatch {
            path: p,
            missing: m,
            unexpected: u,
            mismatched: x,
            unassigned: a,
        }) => {
            let file = path.file_name().and_then(|f| f.to_str()).expect("a name");
            assert!(p.ends_with(file), "{p}");
            assert_eq!(m, missing);
            assert_eq!(u, unexpected);
            assert_eq!(x, mismatched);
            assert!(a.is_empty(), "a single file assigns every tensor: {a:?}");
        }
        other => panic!("expected Mismatch, got {other:?}"),
    }
    assert_eq!(changed(&before, &snapshot(store)), 0);
    assert_eq!(snapshot(store), before);
}

fn mismatch(key: &str, file: &str, tree: &str) -> Mismatch {
    Mismatch {
        key: key.into(),
        file: file.into(),
        tree: tree.into(),
    }
}

#[test]
fn a_strict_load_that_does_not_match_names_every_key_and_changes_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let (a, _) = trained()?;
    let good = tensors(&a);
    let target = CandleStore::new();
    Tiny::build(&vb(&target))?;

    let mut ts = good.clone();
    ts.remove("out.bias");
    let missing = dir.path().join("missing.safetensors");
    write(&missing, &ts);
    assert_mismatch(&target, &missing, &["out.bias"], &[], &[]);

    let mut ts = good.clone();
    ts.insert("extra.w".into(), Tensor::ones(3, DType::F32, &CPU)?);
    let extra = dir.path().join("extra.safetensors");
    write(&extra, &ts);
    assert_mismatch(&target, &extra, &[], &["extra.w"], &[]);

    let mut ts = good.clone();
    ts.insert(
        "gru.weight_ih_l0".into(),
        Tensor::ones((12, 3), DType::F32, &CPU)?,
    );
    let shape = dir.path().join("shape.safetensors");
    write(&shape, &ts);
    assert_mismatch(
        &target,
        &shape,
        &[],
        &[],
        &[mismatch("gru.weight_ih_l0", "F32 [12, 3]", "F32 [15, 4]")],
    );

    let ts: HashMap<String, Tensor> = good
        .iter()
        .map(|(k, t)| (k.clone(), t.to_dtype(DType::F64).expect("to f64")))
        .collect();
    let f64_file = dir.path().join("f64.safetensors");
    write(&f64_file, &ts);
    let shapes = [
        "[8, 4]", "[15]", "[15]", "[15, 5]", "[15, 4]", "[8]", "[8, 5]",
    ];
    let want: Vec<Mismatch> = NAMES
        .iter()
        .zip(shapes)
        .map(|(k, s)| mismatch(k, &format!("F64 {s}"), &format!("F32 {s}")))
        .collect();
    assert_mismatch(&target, &f64_file, &[], &[], &want);

    // All at once: one error with every list.
    let mut ts = good.clone();
    ts.remove("out.bias");
    ts.insert("extra.w".into(), Tensor::ones(3, DType::F32, &CPU)?);
    ts.insert("emb.weight".into(), Tensor::ones((8, 5), DType::F32, &CPU)?);
    let all = dir.path().join("all.safetensors");
    write(&all, &ts);
    assert_mismatch(
        &target,
        &all,
        &["out.bias"],
        &["extra.w"],
        &[mismatch("emb.weight", "F32 [8, 5]", "F32 [8, 4]")],
    );
    Ok(())
}

#[test]
fn varmap_load_writes_before_it_fails_where_scopetree_writes_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let (a, _) = trained()?;
    let mut ts = tensors(&a);
    ts.remove("out.bias");
    let path = dir.path().join("missing.safetensors");
    write(&path, &ts);

    let mut varmap = VarMap::new();
    Tiny::build(&VarBuilder::from_varmap(&varmap, DType::F32, &CPU))?;
    let before = snapshot_varmap(&varmap);
    assert!(varmap.load(&path).is_err());
    let candle_changed = changed(&before, &snapshot_varmap(&varmap));
    // candle's count depends on HashMap order (0 to 6 of 7); not asserted.
    eprintln!("VarMap::load changed {candle_changed} of 7 variables before failing");

    let store = CandleStore::new();
    Tiny::build(&vb(&store))?;
    let before = snapshot(&store);
    assert!(store.load(&path, &LoadOptions::new()).is_err());
    assert_eq!(changed(&before, &snapshot(&store)), 0);
    Ok(())
}

// ----- lenient loads, dtype conversion ---------------------------------------------

#[test]
fn allow_missing_and_allow_unused_report_exact_lists() -> R {
    let dir = tempfile::tempdir()?;
    let (a, _) = trained()?;
    let mut ts = tensors(&a);
    ts.remove("out.bias");
    ts.insert("extra.w".into(), Tensor::ones(3, DType::F32, &CPU)?);
    let path = dir.path().join("partial.safetensors");
    write(&path, &ts);

    let store = CandleStore::new();
    Tiny::build(&vb(&store))?;
    let before = snapshot(&store);

    // One allowance is not enough: the other list still fails, nothing moves.
    let cases: [(LoadOptions, &[&str], &[&str]); 2] = [
        (LoadOptions::new().allow_missing(true), &[], &["extra.w"]),
        (LoadOptions::new().allow_unused(true), &["out.bias"], &[]),
    ];
    for (opts, want_missing, want_unexpected) in cases {
        match store.load(&path, &opts).unwrap_err() {
            Error::Checkpoint(checkpoint::Error::Mismatch {
                missing,
                unexpected,
                mismatched,
                ..
            }) => {
                assert_eq!(missing, want_missing);
                assert_eq!(unexpected, want_unexpected);
                assert!(mismatched.is_empty());
            }
            other => panic!("expected Mismatch, got {other:?}"),
        }
        assert_eq!(snapshot(&store), before);
    }

    let report = store.load(
        &path,
        &LoadOptions::new().allow_missing(true).allow_unused(true),
    )?;
    assert_eq!(
        report.loaded,
        [&NAMES[..5], &NAMES[6..]].concat(),
        "all but out.bias"
    );
    assert_eq!(report.missing, ["out.bias"]);
    assert_eq!(report.unused, ["extra.w"]);
    assert!(report.created.is_empty());
    let after = snapshot(&store);
    let want = snapshot(&a);
    for ((b, a), w) in before.iter().zip(&after).zip(&want) {
        if a.0 == "out.bias" {
            assert_eq!(a, b, "a missing variable keeps its value");
        } else {
            assert_eq!(a, w, "{} was not loaded", a.0);
        }
    }
    assert_eq!(store.names()?, NAMES, "allow_unused creates nothing");
    Ok(())
}

#[test]
fn dtype_policy_convert_rounds_an_f64_file_into_f32_vars() -> R {
    let dir = tempfile::tempdir()?;
    let store = CandleStore::new();
    Tiny::build(&vb(&store))?;
    // F64 values that F32 cannot hold exactly.
    let mut ts = HashMap::new();
    let mut want = Vec::new();
    for (i, (name, v)) in store.named_vars()?.into_iter().enumerate() {
        let n = v.elem_count();
        let vals: Vec<f64> = (0..n)
            .map(|j| ((i * 100 + j) as f64 * 0.37).sin() / 3.0)
            .collect();
        assert!(vals.iter().any(|&x| f64::from(x as f32) != x));
        want.push((
            name.clone(),
            v.dims().to_vec(),
            vals.iter()
                .map(|&x| (x as f32).to_bits())
                .collect::<Vec<_>>(),
        ));
        ts.insert(name, Tensor::from_vec(vals, v.dims(), &CPU)?);
    }
    let path = dir.path().join("f64.safetensors");
    write(&path, &ts);

    let report = store.load(
        &path,
        &LoadOptions::new().dtype_policy(DtypePolicy::Convert),
    )?;
    assert_eq!(report.loaded, NAMES);
    assert_eq!(snapshot(&store), want);
    for (_, v) in store.named_vars()? {
        assert_eq!(v.dtype(), DType::F32);
    }
    Ok(())
}

// ----- corrupted files -----------------------------------------------------------

#[test]
fn a_truncated_file_is_an_error_and_changes_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.safetensors");
    let (a, _) = trained()?;
    a.save(&path)?;
    let bytes = std::fs::read(&path)?;

    let store = CandleStore::new();
    Tiny::build(&vb(&store))?;
    let before = snapshot(&store);
    for len in [bytes.len() - 1, bytes.len() / 2, 5, 0] {
        std::fs::write(&path, &bytes[..len])?;
        let err = store.load(&path, &LoadOptions::new()).unwrap_err();
        assert!(
            matches!(err, Error::Checkpoint(checkpoint::Error::BadFile { .. })),
            "{len} bytes: {err:?}"
        );
        assert_eq!(snapshot(&store), before, "{len} bytes");
    }
    // Loading before build from a truncated file creates nothing either.
    let empty = CandleStore::new();
    std::fs::write(&path, &bytes[..bytes.len() / 2])?;
    assert!(empty.load(&path, &LoadOptions::new().create(true)).is_err());
    assert!(empty.names()?.is_empty());
    Ok(())
}

#[test]
fn a_missing_file_is_an_io_error() -> R {
    let store = CandleStore::new();
    Tiny::build(&vb(&store))?;
    let before = snapshot(&store);
    let err = store
        .load("/nonexistent/tiny.safetensors", &LoadOptions::new())
        .unwrap_err();
    assert!(
        matches!(err, Error::Checkpoint(checkpoint::Error::Io { .. })),
        "{err:?}"
    );
    assert_eq!(snapshot(&store), before);
    Ok(())
}

// ----- mutated files ---------------------------------------------------------

/// The names, shapes and values of the mutated files' model (`f32`).
const MUTATED: [(&str, &[usize]); 3] = [("a", &[5]), ("s.b", &[2, 3]), ("s.c", &[4])];

/// The model's file, every tensor's checksum in its metadata (as the ranks'
/// and the async saves write them), through the `safetensors` crate.
fn checked_file() -> Vec<u8> {
    let mut data = Vec::new();
    let mut meta = HashMap::new();
    for (k, (name, shape)) in MUTATED.iter().enumerate() {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| k as f32 * 10.0 + i as f32 * 0.5).collect();
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let sum = xxhash_rust::xxh3::xxh3_128(&bytes);
        meta.insert(format!("scopetree_xxh3/{name}"), format!("{sum:032x}"));
        data.push((name.to_string(), shape.to_vec(), bytes));
    }
    let views: Vec<_> = data
        .iter()
        .map(|(name, shape, bytes)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .unwrap();
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize(views, Some(meta)).unwrap()
}

/// A store holding the model, every value zero.
fn mutated_model() -> CandleStore {
    let store = CandleStore::new();
    for (name, shape) in MUTATED {
        store
            .get(shape, name, candle_nn::Init::Const(0.0), DType::F32, &CPU)
            .unwrap();
    }
    store
}

/// Each variable's name, dtype, shape and values' bits (widened to `f32`,
/// which every `bf16` is exactly).
type Held = Vec<(String, DType, Vec<usize>, Vec<u32>)>;

fn held(store: &CandleStore) -> Held {
    let vars = store.named_vars().unwrap();
    vars.into_iter()
        .map(|(k, v)| {
            let t = v.as_tensor();
            let wide = t.to_dtype(DType::F32).unwrap();
            (k, t.dtype(), t.dims().to_vec(), bits(&wide))
        })
        .collect()
}

/// `(name, shape, f32 bytes)` of each tensor in `dtype`, as a load that
/// succeeded must hold them, sorted by name.
fn in_dtype(tensors: Vec<(String, Vec<usize>, Vec<u8>)>, dtype: DType) -> Held {
    let mut out: Held = tensors
        .into_iter()
        .map(|(name, shape, data)| {
            let f = Tensor::from_raw_buffer(&data, DType::F32, &shape, &CPU).unwrap();
            let wide = f.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap();
            (name, dtype, shape, bits(&wide))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The tensors of the file `bytes` as the `safetensors` crate reads them.
fn file_tensors(bytes: &[u8]) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let file = safetensors::SafeTensors::deserialize(bytes)
        .expect("a file a load took is one safetensors reads");
    file.tensors()
        .into_iter()
        .map(|(name, t)| {
            assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
            (name, t.shape().to_vec(), t.data().to_vec())
        })
        .collect()
}

/// The tensors of the sharded checkpoint in `dir`: each from the shard its
/// index names.
fn sharded_tensors(dir: &Path) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    checkpoint::inspect(dir)
        .expect("a loaded checkpoint reads back")
        .into_iter()
        .map(|t| {
            assert_eq!(t.dtype, checkpoint::Dtype::F32, "{}", t.key);
            let shard = std::fs::read(dir.join(t.shard.as_deref().unwrap())).unwrap();
            let n = u64::from_le_bytes(shard[..8].try_into().unwrap()) as usize;
            let data = shard[8 + n + t.begin as usize..8 + n + t.end as usize].to_vec();
            (t.key, t.shape, data)
        })
        .collect()
}

/// Loads `path` three ways: strictly into the built model, and into a new
/// store as they are and converted to `bf16` (read at once, with
/// `load_on`). A failure leaves the store as it was, with a short message;
/// a success holds what `tensors` reads, in the load's dtype.
fn check_loads(path: &Path, tensors: &dyn Fn() -> Vec<(String, Vec<usize>, Vec<u8>)>) {
    let create = LoadOptions::new().create(true);
    let bf16 = create
        .clone()
        .create_floats_as(checkpoint::FloatDtype::BF16);
    for (store, opts, dtype) in [
        (mutated_model(), LoadOptions::new(), DType::F32),
        (CandleStore::new(), create, DType::F32),
        (CandleStore::new(), bf16, DType::BF16),
    ] {
        let before = held(&store);
        match store.load_on(path, &opts, &CPU) {
            Err(e) => {
                assert_eq!(held(&store), before, "a failed load changed the store: {e}");
                let shown = e.to_string();
                assert!(shown.len() < 1000, "{} bytes: {shown}", shown.len());
            }
            Ok(_) => assert_eq!(held(&store), in_dtype(tensors(), dtype)),
        }
    }
}

/// [`check_loads`] of the file `bytes`.
fn check_mutated(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    std::fs::write(&path, bytes).unwrap();
    check_loads(&path, &|| file_tensors(bytes));
}

/// [`check_loads`] of the sharded checkpoint `files` (names and bytes).
fn check_sharded_mutated(files: &[(String, Vec<u8>)]) {
    let dir = tempfile::tempdir().unwrap();
    mutations::write_files(dir.path(), files);
    check_loads(dir.path(), &|| sharded_tensors(dir.path()));
}

/// The model saved sharded by the store, a tensor a shard, every
/// tensor's checksum in each shard's metadata: each file's name and bytes,
/// the index first.
fn checked_shards() -> Vec<(String, Vec<u8>)> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.safetensors");
    std::fs::write(&file, checked_file()).unwrap();
    let store = CandleStore::new();
    store
        .load_on(&file, &LoadOptions::new().create(true), &CPU)
        .unwrap();
    let meta: HashMap<String, String> = safetensors::SafeTensors::read_metadata(&checked_file())
        .unwrap()
        .1
        .metadata()
        .clone()
        .unwrap();
    let ck = dir.path().join("ck");
    let opts = checkpoint::SaveOptions::new()
        .max_shard_size(0)
        .metadata(meta);
    store.save_sharded(&ck, &opts).unwrap();
    mutations::read_files(&ck)
}

#[test]
fn the_unmutated_checked_file_loads_exactly_every_way() {
    let bytes = checked_file();
    check_mutated(&bytes);
    let store = mutated_model();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    store.load(&path, &LoadOptions::new()).unwrap();
    assert_eq!(held(&store), in_dtype(file_tensors(&bytes), DType::F32));
    // A flipped data byte fails its checksum.
    let mut bad = bytes.clone();
    let n = bad.len();
    bad[n - 1] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    let err = store.load(&path, &LoadOptions::new()).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    #[test]
    fn mutated_checked_files_fail_cleanly_or_load_exactly(
        ms in proptest::collection::vec(mutations::mutation(), 1..4)
    ) {
        check_mutated(&mutations::apply_all(checked_file(), &ms));
    }

    #[test]
    fn mutated_checked_sharded_checkpoints_fail_cleanly_or_load_exactly(
        file in 0..4_usize,
        ms in proptest::collection::vec(mutations::mutation(), 1..4)
    ) {
        let mut files = checked_shards();
        files[file].1 = mutations::apply_all(std::mem::take(&mut files[file].1), &ms);
        check_sharded_mutated(&files);
    }
}

#[test]
fn the_unmutated_checked_shards_load_exactly_every_way() {
    let files = checked_shards();
    assert_eq!(files.len(), 4, "the index and a shard per tensor");
    check_sharded_mutated(&files);
    // Each shard carries the checksums: a flipped data byte of the last
    // shard fails its checksum, and a strict load changes nothing.
    let mut bad = files.clone();
    let last = bad.len() - 1;
    let n = bad[last].1.len();
    bad[last].1[n - 1] ^= 1;
    let dir = tempfile::tempdir().unwrap();
    mutations::write_files(dir.path(), &bad);
    let store = mutated_model();
    let before = held(&store);
    let err = store.load(dir.path(), &LoadOptions::new()).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
    assert_eq!(held(&store), before);
}
