//! Checkpoints: save → load round trips of every value type, keys and
//! separators, subtrees and stores, strict and relaxed loads, create, dtype
//! policy, and saves that must fail.

use half::{bf16, f16};
use scopetree::checkpoint::{
    self, Dtype, DtypePolicy, Error, LoadOptions, SaveOptions, Separator, Tensor,
};
use scopetree::sharing::{Initializer, VarSpec, VariableStore};
use scopetree::{ScopeId, ScopeTree, VarId};

type R = Result<(), Box<dyn std::error::Error>>;

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// A tree with one variable of every built-in type, in nested scopes.
fn every_type() -> Result<(ScopeTree, Vec<VarId>), Box<dyn std::error::Error>> {
    let mut t = ScopeTree::new();
    let enc = t.new_named_scope(t.root(), "enc")?;
    let l1 = t.new_named_scope(enc, "layer_1")?;
    let mut vars = Vec::new();
    macro_rules! put {
        ($scope:expr, $name:expr, $v:expr) => {{
            let v = t.var($scope, $name)?;
            t.set(v, $v)?;
            vars.push(v);
        }};
    }
    put!(l1, "f32", vec![1.5_f32, -2.25, f32::MIN_POSITIVE, f32::NAN]);
    put!(l1, "f64", vec![1e-300_f64, -0.0, f64::INFINITY]);
    put!(l1, "i8", vec![i8::MIN, 0, i8::MAX]);
    put!(l1, "i16", vec![i16::MIN, 7, i16::MAX]);
    put!(l1, "i32", vec![i32::MIN, 7, i32::MAX]);
    put!(l1, "i64", vec![i64::MIN, 7, i64::MAX]);
    put!(enc, "u8", vec![0_u8, 255]);
    put!(enc, "u16", vec![0_u16, u16::MAX]);
    put!(enc, "u32", vec![0_u32, u32::MAX]);
    put!(enc, "u64", vec![0_u64, u64::MAX]);
    put!(enc, "bool", vec![true, false, true]);
    put!(enc, "f16", vec![f16::from_f32(0.5), f16::MAX]);
    put!(enc, "bf16", vec![bf16::from_f32(-3.0), bf16::MIN_POSITIVE]);
    put!(t.root(), "boxed", vec![1_i32, 2, 3].into_boxed_slice());
    put!(
        t.root(),
        "shaped",
        Tensor::new(vec![2, 3], (0..6).map(|i| i as f32).collect())?
    );
    put!(t.root(), "scalar", Tensor::new(vec![], vec![42_u64])?);
    put!(
        t.root(),
        "empty",
        Tensor::new(vec![0, 4], Vec::<f32>::new())?
    );
    Ok((t, vars))
}

/// Every variable's value as (key, dtype, shape, bytes), by saving a
/// snapshot through the public trait (independent of the file).
fn snapshot(t: &ScopeTree, vars: &[VarId]) -> Vec<(String, Vec<u8>)> {
    use scopetree::checkpoint::Checkpointable;
    let mut out = Vec::new();
    for &v in vars {
        let bytes = if let Ok(x) = t.get::<Vec<f32>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<f64>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<i8>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<i16>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<i32>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<i64>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<u8>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<u16>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<u32>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<u64>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<bool>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<f16>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Vec<bf16>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Box<[i32]>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Tensor<f32>>(v) {
            x.le_bytes().into_owned()
        } else if let Ok(x) = t.get::<Tensor<u64>>(v) {
            x.le_bytes().into_owned()
        } else {
            panic!("unexpected type {:?}", t.type_name(v))
        };
        out.push((t.var_path(v).unwrap(), bytes));
    }
    out
}

/// Overwrites every value with zeros of the same type and length.
fn zero(t: &mut ScopeTree, vars: &[VarId]) -> Result<(), scopetree::Error> {
    for &v in vars {
        macro_rules! z {
            ($($ty:ty),*) => {$(
                if let Ok(x) = t.get_mut::<Vec<$ty>>(v) { x.fill(<$ty>::default()); continue; }
            )*};
        }
        z!(
            f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, bool, f16, bf16
        );
        if let Ok(x) = t.get_mut::<Box<[i32]>>(v) {
            x.fill(0);
        } else if let Ok(x) = t.get_mut::<Tensor<f32>>(v) {
            x.data_mut().fill(0.0);
        } else if let Ok(x) = t.get_mut::<Tensor<u64>>(v) {
            x.data_mut().fill(0);
        }
    }
    Ok(())
}

#[test]
fn every_type_round_trips_bit_exactly() -> R {
    let d = dir();
    let (mut t, vars) = every_type()?;
    let before = snapshot(&t, &vars);
    let path = d.path().join("all.safetensors");
    let saved = checkpoint::save(&t, t.root(), &path, &SaveOptions::new())?;
    assert_eq!(saved.keys.len(), vars.len());
    zero(&mut t, &vars)?;
    assert_ne!(snapshot(&t, &vars), before);
    let root = t.root();
    let report = checkpoint::load(&mut t, root, &path, &LoadOptions::new())?;
    assert_eq!(report.loaded.len(), vars.len());
    assert!(report.missing.is_empty() && report.unused.is_empty() && report.created.is_empty());
    assert_eq!(snapshot(&t, &vars), before);
    // The shaped value keeps its shape in the file.
    let shaped = checkpoint::inspect(&path)?
        .into_iter()
        .find(|f| f.key == "shaped")
        .expect("shaped saved");
    assert_eq!((shaped.dtype, shaped.shape), (Dtype::F32, vec![2, 3]));
    Ok(())
}

#[test]
fn keys_are_full_names_sorted_with_either_separator() -> R {
    let d = dir();
    let (t, _) = every_type()?;
    let slash = checkpoint::save(&t, t.root(), d.path().join("a"), &SaveOptions::new())?;
    assert!(slash.keys.contains(&"enc/layer_1/f32".to_string()));
    assert!(slash.keys.windows(2).all(|w| w[0] < w[1]));
    let dot = checkpoint::save(
        &t,
        t.root(),
        d.path().join("b"),
        &SaveOptions::new().separator(Separator::Dot),
    )?;
    assert!(dot.keys.contains(&"enc.layer_1.f32".to_string()));
    let file_keys: Vec<_> = checkpoint::inspect(d.path().join("b"))?
        .into_iter()
        .map(|f| f.key)
        .collect();
    assert!(file_keys.contains(&"enc.layer_1.f32".to_string()));
    Ok(())
}

#[test]
fn equal_trees_give_byte_identical_files() -> R {
    let d = dir();
    let (a, _) = every_type()?;
    let (b, _) = every_type()?;
    checkpoint::save(&a, a.root(), d.path().join("a"), &SaveOptions::new())?;
    checkpoint::save(&b, b.root(), d.path().join("b"), &SaveOptions::new())?;
    assert_eq!(
        std::fs::read(d.path().join("a"))?,
        std::fs::read(d.path().join("b"))?
    );
    Ok(())
}

#[test]
fn a_subtree_saves_with_relative_keys_and_loads_into_another_subtree() -> R {
    let d = dir();
    let mut t = ScopeTree::new();
    let enc = t.new_named_scope(t.root(), "enc")?;
    let l = t.new_named_scope(enc, "l")?;
    let w = t.var(l, "w")?;
    t.set(w, vec![1.0_f32, 2.0])?;
    let outside = t.var(t.root(), "outside")?;
    t.set(outside, vec![9_u8])?;
    let path = d.path().join("sub");
    let r = checkpoint::save(&t, enc, &path, &SaveOptions::new())?;
    assert_eq!(r.keys, ["l/w"]);
    // Load into a copy under another scope name.
    let dec = t.new_named_scope(t.root(), "dec")?;
    let l2 = t.new_named_scope(dec, "l")?;
    let w2 = t.var(l2, "w")?;
    t.set(w2, vec![0.0_f32; 2])?;
    checkpoint::load(&mut t, dec, &path, &LoadOptions::new())?;
    assert_eq!(t.get::<Vec<f32>>(w2)?, &[1.0, 2.0]);
    Ok(())
}

#[test]
fn unnamed_scopes_are_left_out_and_reported() -> R {
    let d = dir();
    let mut t = ScopeTree::new();
    let step = t.new_scope(t.root())?;
    let h = t.var(step, "h")?;
    t.set(h, "not a tensor".to_string())?;
    let w = t.var(t.root(), "w")?;
    t.set(w, vec![1_i16])?;
    let r = checkpoint::save(&t, t.root(), d.path().join("u"), &SaveOptions::new())?;
    assert_eq!(r.keys, ["w"]);
    assert_eq!(r.unnamed_scopes, [t.path(step)?]);
    Ok(())
}

#[test]
fn non_tensors_fail_naming_every_one_unless_skipped() -> R {
    let d = dir();
    let mut t = ScopeTree::new();
    let a = t.new_named_scope(t.root(), "a")?;
    let s = t.var(a, "label")?;
    t.set(s, "hello".to_string())?;
    let n = t.var(t.root(), "count")?;
    t.set(n, 3_usize)?;
    t.var(t.root(), "unset")?;
    let w = t.var(t.root(), "w")?;
    t.set(w, vec![1.0_f32])?;
    let path = d.path().join("nt");
    let err = checkpoint::save(&t, t.root(), &path, &SaveOptions::new()).unwrap_err();
    let Error::NotTensors { vars } = &err else {
        panic!("{err}")
    };
    let keys: Vec<_> = vars.iter().map(|v| v.key.as_str()).collect();
    assert_eq!(keys, ["a/label", "count", "unset"]);
    let msg = err.to_string();
    assert!(msg.contains("a/label (alloc::string::String)"), "{msg}");
    assert!(msg.contains("unset (no value)"), "{msg}");
    assert!(!path.exists(), "a failed save writes nothing");
    let r = checkpoint::save(
        &t,
        t.root(),
        &path,
        &SaveOptions::new().skip_non_tensors(true),
    )?;
    assert_eq!(r.keys, ["w"]);
    assert_eq!(r.skipped.len(), 3);
    Ok(())
}

#[test]
fn dotted_names_that_collide_are_an_error() -> R {
    let d = dir();
    let mut t = ScopeTree::new();
    let a = t.new_named_scope(t.root(), "a")?;
    let x = t.var(a, "b")?;
    t.set(x, vec![1_u8])?;
    let y = t.var(t.root(), "a.b")?;
    t.set(y, vec![2_u8])?;
    let err = checkpoint::save(
        &t,
        t.root(),
        d.path().join("c"),
        &SaveOptions::new().separator(Separator::Dot),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::KeyCollision { ref key, .. } if key == "a.b"),
        "{err}"
    );
    Ok(())
}

/// A small model: enc/w [2,3] as Tensor, enc/b Vec of 3, out/w Vec of 6.
fn small() -> Result<(ScopeTree, [VarId; 3]), scopetree::Error> {
    let mut t = ScopeTree::new();
    let enc = t.new_named_scope(t.root(), "enc")?;
    let out = t.new_named_scope(t.root(), "out")?;
    let w = t.var(enc, "w")?;
    t.set(w, Tensor::new(vec![2, 3], vec![1.0_f32; 6]).unwrap())?;
    let b = t.var(enc, "b")?;
    t.set(b, vec![2.0_f32; 3])?;
    let o = t.var(out, "w")?;
    t.set(o, vec![3.0_f32; 6])?;
    Ok((t, [w, b, o]))
}

fn values(t: &ScopeTree, [w, b, o]: [VarId; 3]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (
        t.get::<Tensor<f32>>(w).unwrap().data().to_vec(),
        t.get::<Vec<f32>>(b).unwrap().clone(),
        t.get::<Vec<f32>>(o).unwrap().clone(),
    )
}

#[test]
fn strict_load_lists_every_problem_and_changes_nothing() -> R {
    let d = dir();
    // The file: enc/w [3,2] (wrong shape), enc/b as f64 (wrong dtype),
    // extra/x (unexpected); out/w missing.
    let mut f = ScopeTree::new();
    let enc = f.new_named_scope(f.root(), "enc")?;
    let extra = f.new_named_scope(f.root(), "extra")?;
    let w = f.var(enc, "w")?;
    f.set(w, Tensor::new(vec![3, 2], vec![9.0_f32; 6])?)?;
    let b = f.var(enc, "b")?;
    f.set(b, vec![9.0_f64; 3])?;
    let x = f.var(extra, "x")?;
    f.set(x, vec![9.0_f32])?;
    let path = d.path().join("bad");
    checkpoint::save(&f, f.root(), &path, &SaveOptions::new())?;

    let (mut t, vars) = small()?;
    let before = values(&t, vars);
    let root = t.root();
    let err = checkpoint::load(&mut t, root, &path, &LoadOptions::new()).unwrap_err();
    let Error::Mismatch {
        missing,
        unexpected,
        mismatched,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(missing, &["out/w"]);
    assert_eq!(unexpected, &["extra/x"]);
    let shown: Vec<_> = mismatched.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "enc/b: file F64 [3], tree F32 [3] (flat: any shape of as many elements)",
            "enc/w: file F32 [3, 2], tree F32 [2, 3]",
        ]
    );
    let msg = err.to_string();
    assert!(msg.contains("nothing was loaded"), "{msg}");
    assert_eq!(values(&t, vars), before);
    assert_eq!(t.var_count(), 3);
    Ok(())
}

#[test]
fn allow_missing_and_unused_load_the_rest_and_report() -> R {
    let d = dir();
    let mut f = ScopeTree::new();
    let enc = f.new_named_scope(f.root(), "enc")?;
    let b = f.var(enc, "b")?;
    f.set(b, vec![7.0_f32; 3])?;
    let x = f.var(f.root(), "x")?;
    f.set(x, vec![1_u8])?;
    let path = d.path().join("p");
    checkpoint::save(&f, f.root(), &path, &SaveOptions::new())?;

    let (mut t, vars) = small()?;
    let root = t.root();
    let only_missing = LoadOptions::new().allow_missing(true);
    let err = checkpoint::load(&mut t, root, &path, &only_missing).unwrap_err();
    assert!(
        matches!(&err, Error::Mismatch { unexpected, missing, .. } if unexpected == &["x"] && missing.is_empty()),
        "{err}"
    );
    let r = checkpoint::load(&mut t, root, &path, &only_missing.allow_unused(true))?;
    assert_eq!(r.loaded, ["enc/b"]);
    assert_eq!(r.missing, ["enc/w", "out/w"]);
    assert_eq!(r.unused, ["x"]);
    assert_eq!(values(&t, vars).1, vec![7.0; 3]);
    assert_eq!(values(&t, vars).2, vec![3.0; 6]);
    Ok(())
}

#[test]
fn create_builds_the_tree_from_the_file() -> R {
    let d = dir();
    let (src, vars) = small()?;
    let path = d.path().join("m");
    checkpoint::save(&src, src.root(), &path, &SaveOptions::new())?;
    // Into an empty tree.
    let mut t = ScopeTree::new();
    let root = t.root();
    let r = checkpoint::load(&mut t, root, &path, &LoadOptions::new().create(true))?;
    assert_eq!(r.created, ["enc/b", "enc/w", "out/w"]);
    assert_eq!(r.loaded, r.created);
    let enc = t.kid(root, "enc")?.expect("enc");
    let w = t.find_local_var(enc, "w")?.expect("w");
    assert_eq!(t.get::<Vec<f32>>(w)?, &vec![1.0; 6]);
    // Into a partial tree, shaped: only out/w is created.
    let mut p = ScopeTree::new();
    let enc = p.new_named_scope(p.root(), "enc")?;
    let pw = p.var(enc, "w")?;
    p.set(pw, Tensor::new(vec![2, 3], vec![0.0_f32; 6])?)?;
    let pb = p.var(enc, "b")?;
    p.set(pb, vec![0.0_f32; 3])?;
    let root = p.root();
    let r = checkpoint::load(
        &mut p,
        root,
        &path,
        &LoadOptions::new().create(true).create_shaped(true),
    )?;
    assert_eq!(r.created, ["out/w"]);
    let out = p.kid(root, "out")?.expect("out");
    let ow = p.find_local_var(out, "w")?.expect("w");
    assert_eq!(p.get::<Tensor<f32>>(ow)?.shape(), &[6]);
    assert_eq!(p.get::<Tensor<f32>>(ow)?.data(), &values(&src, vars).2[..]);
    assert_eq!(p.get::<Tensor<f32>>(pw)?.data(), &values(&src, vars).0[..]);
    Ok(())
}

#[test]
fn uninitialised_variables_are_filled() -> R {
    let d = dir();
    let (src, _) = small()?;
    let path = d.path().join("m");
    checkpoint::save(&src, src.root(), &path, &SaveOptions::new())?;
    let mut t = ScopeTree::new();
    let enc = t.new_named_scope(t.root(), "enc")?;
    let out = t.new_named_scope(t.root(), "out")?;
    let w = t.var(enc, "w")?;
    t.var(enc, "b")?;
    t.var(out, "w")?;
    let root = t.root();
    checkpoint::load(&mut t, root, &path, &LoadOptions::new().create_shaped(true))?;
    assert_eq!(t.get::<Tensor<f32>>(w)?.shape(), &[2, 3]);
    Ok(())
}

#[test]
fn dtype_policy_converts_floats_only() -> R {
    let d = dir();
    let mut f = ScopeTree::new();
    let w = f.var(f.root(), "w")?;
    f.set(w, vec![0.5_f32, -1.25, 3.0])?;
    let path = d.path().join("f");
    checkpoint::save(&f, f.root(), &path, &SaveOptions::new())?;

    let mut t = ScopeTree::new();
    let w64 = t.var(t.root(), "w")?;
    t.set(w64, vec![0.0_f64; 3])?;
    let root = t.root();
    let err = checkpoint::load(&mut t, root, &path, &LoadOptions::new()).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    let conv = LoadOptions::new().dtype_policy(DtypePolicy::Convert);
    checkpoint::load(&mut t, root, &path, &conv)?;
    assert_eq!(t.get::<Vec<f64>>(w64)?, &[0.5, -1.25, 3.0]);

    let mut h = ScopeTree::new();
    let wh = h.var(h.root(), "w")?;
    h.set(wh, vec![bf16::ZERO; 3])?;
    let root = h.root();
    checkpoint::load(&mut h, root, &path, &conv)?;
    assert_eq!(h.get::<Vec<bf16>>(wh)?[1], bf16::from_f32(-1.25));

    let mut i = ScopeTree::new();
    let wi = i.var(i.root(), "w")?;
    i.set(wi, vec![0_i32; 3])?;
    let root = i.root();
    let err = checkpoint::load(&mut i, root, &path, &conv).unwrap_err();
    assert!(
        err.to_string().contains("only float dtypes convert"),
        "{err}"
    );
    assert_eq!(i.get::<Vec<i32>>(wi)?, &[0; 3]);
    Ok(())
}

#[test]
fn a_store_round_trips_and_checks_the_shapes_it_recorded() -> R {
    let d = dir();
    let mut store = VariableStore::new();
    let mut r = store.root_scope();
    r.set_initializer(Initializer::with_shape(|s: &[usize]| {
        let n = s.iter().product::<usize>();
        Tensor::new(s.to_vec(), (0..n).map(|i| i as f32).collect()).unwrap()
    }));
    r.set_initializer(Initializer::with_shape(|s: &[usize]| {
        vec![1.0_f32; s.iter().product::<usize>()]
    }));
    let k = store.get_variable(&r, VarSpec::<Tensor<f32>>::new("kernel").shape([3, 4]))?;
    let b = store.get_variable(&r, VarSpec::<Vec<f32>>::new("bias").shape([12]))?;
    let path = d.path().join("store");
    let rep = checkpoint::save_store(&store, &path, &SaveOptions::new())?;
    assert_eq!(rep.keys, ["bias", "kernel"]);
    let info = checkpoint::inspect(&path)?;
    let shapes: Vec<_> = info
        .iter()
        .map(|f| (f.key.as_str(), f.shape.clone()))
        .collect();
    assert!(shapes.contains(&("kernel", vec![3, 4])), "{shapes:?}");
    store
        .tree_mut()
        .get_mut::<Tensor<f32>>(k)?
        .data_mut()
        .fill(0.0);
    checkpoint::load_store(&mut store, &path, &LoadOptions::new())?;
    assert_eq!(store.tree().get::<Tensor<f32>>(k)?.data()[11], 11.0);
    // A flat value of the same count but another shape fits a plain tree,
    // not a store that recorded [12].
    let mut f = ScopeTree::new();
    let fk = f.var(f.root(), "kernel")?;
    f.set(fk, Tensor::new(vec![3, 4], vec![0.0_f32; 12])?)?;
    let fb = f.var(f.root(), "bias")?;
    f.set(fb, Tensor::new(vec![3, 4], vec![5.0_f32; 12])?)?;
    let other = d.path().join("other");
    checkpoint::save(&f, f.root(), &other, &SaveOptions::new())?;
    let err = checkpoint::load_store(&mut store, &other, &LoadOptions::new()).unwrap_err();
    assert!(
        err.to_string()
            .contains("bias: file F32 [3, 4], tree F32 [12]"),
        "{err}"
    );
    assert_eq!(store.tree().get::<Vec<f32>>(b)?, &vec![1.0; 12]);
    let mut plain = store.into_tree();
    let root = plain.root();
    checkpoint::load(&mut plain, root, &other, &LoadOptions::new())?;
    assert_eq!(plain.get::<Vec<f32>>(b)?, &vec![5.0; 12]);
    Ok(())
}

#[test]
fn a_save_replaces_the_file_whole_and_leaves_no_temporary() -> R {
    let d = dir();
    let (t, _) = small()?;
    let path = d.path().join("m.safetensors");
    std::fs::write(&path, b"old contents")?;
    checkpoint::save(&t, t.root(), &path, &SaveOptions::new())?;
    assert_eq!(checkpoint::inspect(&path)?.len(), 3);
    let names: Vec<_> = std::fs::read_dir(d.path())?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    assert_eq!(names, ["m.safetensors"]);
    // A save into a missing directory fails and creates nothing.
    let err =
        checkpoint::save(&t, t.root(), d.path().join("no/such"), &SaveOptions::new()).unwrap_err();
    assert!(matches!(err, Error::Write { .. }), "{err}");
    Ok(())
}

#[test]
fn stale_and_foreign_scopes_are_tree_errors() -> R {
    let d = dir();
    let (mut t, _) = small()?;
    let s: ScopeId = t.new_named_scope(t.root(), "gone")?;
    t.delete_scope(s)?;
    let err = checkpoint::save(&t, s, d.path().join("x"), &SaveOptions::new()).unwrap_err();
    assert!(
        matches!(err, Error::Tree(scopetree::Error::StaleScope { .. })),
        "{err}"
    );
    let other = ScopeTree::new();
    let err = checkpoint::load(
        &mut t,
        other.root(),
        d.path().join("x"),
        &LoadOptions::new(),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::Tree(scopetree::Error::ForeignScope { .. })),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_filter_limits_both_sides_of_a_load() -> R {
    let d = dir();
    let (mut t, [w, b, o]) = small()?;
    let keep = |k: &str| k.starts_with("enc/");
    let path = d.path().join("f");
    let r = checkpoint::save(&t, t.root(), &path, &SaveOptions::new().filter(keep))?;
    assert_eq!(r.keys, ["enc/b", "enc/w"]);
    t.set(b, vec![0.0_f32; 3])?;
    let root = t.root();
    // Unfiltered, out/w is missing from the file.
    assert!(checkpoint::load(&mut t, root, &path, &LoadOptions::new()).is_err());
    let r = checkpoint::load(&mut t, root, &path, &LoadOptions::new().filter(keep))?;
    assert_eq!(r.loaded, ["enc/b", "enc/w"]);
    assert!(r.missing.is_empty());
    assert_eq!(values(&t, [w, b, o]).1, vec![2.0; 3]);
    Ok(())
}

#[cfg(unix)]
#[test]
fn a_new_checkpoint_is_world_readable_and_a_replaced_one_keeps_its_mode() -> R {
    use std::os::unix::fs::PermissionsExt;
    let d = dir();
    let (t, _) = small()?;
    let path = d.path().join("m");
    checkpoint::save(&t, t.root(), &path, &SaveOptions::new())?;
    assert_eq!(
        std::fs::metadata(&path)?.permissions().mode() & 0o777,
        0o644
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640))?;
    checkpoint::save(&t, t.root(), &path, &SaveOptions::new())?;
    assert_eq!(
        std::fs::metadata(&path)?.permissions().mode() & 0o777,
        0o640
    );
    Ok(())
}

/// The same tree saved with the same metadata gives the same bytes (a
/// sharded save's id aside, which is new each save): the metadata's entries
/// are written sorted by key, not in the order of a `HashMap`, which
/// differs from map to map.
#[test]
fn the_same_tree_and_metadata_save_the_same_bytes() -> R {
    let d = dir();
    let (t, _) = small()?;
    let meta = || {
        (0..24)
            .map(|i| (format!("key{i}"), format!("value{i}")))
            .collect::<std::collections::HashMap<_, _>>()
    };
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    checkpoint::save(&t, t.root(), &a, &SaveOptions::new().metadata(meta()))?;
    checkpoint::save(&t, t.root(), &b, &SaveOptions::new().metadata(meta()))?;
    assert!(std::fs::read(&a)? == std::fs::read(&b)?, "two saves differ");
    let text = String::from_utf8_lossy(&std::fs::read(&a)?).into_owned();
    let (k2, k10) = (
        text.find("\"key2\"").unwrap(),
        text.find("\"key10\"").unwrap(),
    );
    assert!(k10 < k2, "sorted as strings: {text:.200}");

    let opts = || SaveOptions::new().metadata(meta()).max_shard_size(1);
    let (sa, sb) = (d.path().join("sa"), d.path().join("sb"));
    checkpoint::save_sharded(&t, t.root(), &sa, &opts())?;
    checkpoint::save_sharded(&t, t.root(), &sb, &opts())?;
    let mut names: Vec<_> = std::fs::read_dir(&sa)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    names.sort();
    assert!(names.len() > 2, "{names:?}");
    let id = |dir: &std::path::Path| -> Result<String, Box<dyn std::error::Error>> {
        let index = std::fs::read(dir.join("model.safetensors.index.json"))?;
        let index: serde_json::Value = serde_json::from_slice(&index)?;
        Ok(index["metadata"]["scopetree_save_id"]
            .as_str()
            .ok_or("no save id")?
            .to_owned())
    };
    let (ia, ib) = (id(&sa)?, id(&sb)?);
    for name in names {
        // The ids may differ in length (a counter in hex), so the headers
        // are compared as text with the id taken out, then the data.
        let json = name.to_string_lossy().ends_with(".json");
        let x = without_id(&std::fs::read(sa.join(&name))?, &ia, json);
        let y = without_id(&std::fs::read(sb.join(&name))?, &ib, json);
        assert!(x == y, "{name:?} differs beyond the save id");
    }
    Ok(())
}

/// A file of a sharded save with its save id `id` taken out: the index's
/// text (`json`), or a shard's header text, without its padding, then its
/// data. Fails if the id is not in the text.
fn without_id(bytes: &[u8], id: &str, json: bool) -> Vec<u8> {
    let (text, data) = if json {
        (bytes, &[][..])
    } else {
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        (&bytes[8..8 + n], &bytes[8 + n..])
    };
    let text = String::from_utf8_lossy(text);
    assert!(text.contains(id), "no save id in {text:.200}");
    let text = text.trim_end().replace(id, "ID");
    [text.as_bytes(), data].concat()
}
