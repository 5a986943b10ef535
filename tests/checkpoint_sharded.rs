//! Sharded checkpoints in the Hugging Face layout (issue 22): shards
//! `model-0000k-of-0000n.safetensors` of a bounded size plus
//! `model.safetensors.index.json`. A save cuts in key order and writes the
//! index last; a load from the index or its directory is strict and atomic
//! across every shard (one error for every problem, the tree unchanged);
//! the index decides which shard a tensor is read from; bad indexes are
//! clear errors; bf16 and f16 convert on load and on save.

use std::path::Path;

use half::bf16;
use scopetree::checkpoint::{
    self, BadFile, BadIndex, DtypePolicy, Error, FloatDtype, LoadOptions, SaveOptions, Separator,
    Tensor,
};
use scopetree::{ScopeTree, VarId};
use serde_json::Value;

const INDEX: &str = "model.safetensors.index.json";

/// A model of six tensors in two layers: `layers.{0,1}.{w,b}` f32,
/// `embed` f32 [8, 4] and `steps` i64; `fill` makes the values distinct.
fn model(fill: f32) -> (ScopeTree, Vec<(String, VarId)>) {
    let mut t = ScopeTree::new();
    let root = t.root();
    let layers = t.new_named_scope(root, "layers").unwrap();
    let mut vars = Vec::new();
    for l in 0..2 {
        let s = t.new_named_scope(layers, l.to_string()).unwrap();
        let w = t.var(s, "w").unwrap();
        t.set(
            w,
            Tensor::new(
                vec![4, 4],
                (0..16).map(|i| fill * (i as f32 + l as f32)).collect(),
            )
            .unwrap(),
        )
        .unwrap();
        let b = t.var(s, "b").unwrap();
        t.set(b, vec![fill * 0.5 + l as f32 * fill; 4]).unwrap();
        vars.push((format!("layers.{l}.w"), w));
        vars.push((format!("layers.{l}.b"), b));
    }
    let e = t.var(root, "embed").unwrap();
    t.set(
        e,
        Tensor::new(
            vec![8, 4],
            (0..32).map(|i| fill * i as f32 * 0.25).collect(),
        )
        .unwrap(),
    )
    .unwrap();
    vars.push(("embed".into(), e));
    let n = t.var(root, "steps").unwrap();
    t.set(n, vec![(fill * 10.0) as i64; 2]).unwrap();
    vars.push(("steps".into(), n));
    vars.sort();
    (t, vars)
}

/// Every variable's key and value bits (f32 as bits, i64 as is).
fn state(t: &ScopeTree, vars: &[(String, VarId)]) -> Vec<(String, Vec<u64>)> {
    vars.iter()
        .map(|(k, v)| {
            let bits: Vec<u64> = if let Ok(x) = t.get::<Tensor<f32>>(*v) {
                x.data().iter().map(|f| u64::from(f.to_bits())).collect()
            } else if let Ok(x) = t.get::<Vec<f32>>(*v) {
                x.iter().map(|f| u64::from(f.to_bits())).collect()
            } else {
                t.get::<Vec<i64>>(*v)
                    .unwrap()
                    .iter()
                    .map(|&i| i as u64)
                    .collect()
            };
            (k.clone(), bits)
        })
        .collect()
}

fn dot() -> SaveOptions {
    SaveOptions::new().separator(Separator::Dot)
}

fn dot_load() -> LoadOptions {
    LoadOptions::new().separator(Separator::Dot)
}

/// Saves `model(1.0)` in shards of at most 100 tensor bytes.
fn saved(dir: &Path) -> checkpoint::SaveReport {
    let (t, _) = model(1.0);
    checkpoint::save_sharded(&t, t.root(), dir, &dot().max_shard_size(100)).unwrap()
}

fn index(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join(INDEX)).unwrap()).unwrap()
}

fn write_index(dir: &Path, v: &Value) {
    std::fs::write(dir.join(INDEX), serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

#[test]
fn a_sharded_save_cuts_in_key_order_and_writes_the_hugging_face_layout() {
    let d = tempfile::tempdir().unwrap();
    let r = saved(d.path());
    // In key order, a new shard when the next tensor does not fit: embed
    // 128 B alone (over the cap); layers.0.b 16 + layers.0.w 64 +
    // layers.1.b 16 = 96; layers.1.w 64 + steps 16 = 80.
    let names: Vec<String> = (1..=3)
        .map(|k| format!("model-{k:05}-of-00003.safetensors"))
        .collect();
    assert_eq!(r.shards, names);
    let idx = index(d.path());
    assert_eq!(idx["metadata"]["total_size"], 128 + 96 + 80);
    let wm = idx["weight_map"].as_object().unwrap();
    let got: Vec<(&str, &str)> = wm
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("embed", names[0].as_str()),
            ("layers.0.b", &names[1]),
            ("layers.0.w", &names[1]),
            ("layers.1.b", &names[1]),
            ("layers.1.w", &names[2]),
            ("steps", &names[2]),
        ]
    );
    // Every shard is a plain safetensors file with the metadata the Hugging
    // Face loaders require.
    for n in &names {
        let bytes = std::fs::read(d.path().join(n)).unwrap();
        let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
        assert_eq!(header["__metadata__"]["format"], "pt", "{n}");
    }
    // A cap of 0 gives every tensor its own shard.
    let (t, _) = model(1.0);
    let e = tempfile::tempdir().unwrap();
    let r = checkpoint::save_sharded(&t, t.root(), e.path(), &dot().max_shard_size(0)).unwrap();
    assert_eq!(r.shards.len(), 6);
}

#[test]
fn a_sharded_checkpoint_loads_from_its_index_or_its_directory_exactly() {
    let d = tempfile::tempdir().unwrap();
    saved(d.path());
    let (src, src_vars) = model(1.0);
    let expected = state(&src, &src_vars);
    for from in [d.path().to_path_buf(), d.path().join(INDEX)] {
        let (mut t, vars) = model(0.0);
        let root = t.root();
        let r = checkpoint::load(&mut t, root, &from, &dot_load()).unwrap();
        assert_eq!(r.loaded.len(), 6);
        assert!(r.missing.is_empty() && r.unused.is_empty() && r.unassigned.is_empty());
        assert_eq!(state(&t, &vars), expected, "{}", from.display());
    }
    // Before the model is built: every variable created from the shards.
    let mut fresh = ScopeTree::new();
    let root = fresh.root();
    let r = checkpoint::load(&mut fresh, root, d.path(), &dot_load().create(true)).unwrap();
    assert_eq!(r.created.len(), 6);
    let layers = fresh.kid(root, "layers").unwrap().unwrap();
    let l1 = fresh.kid(layers, "1").unwrap().unwrap();
    let w = fresh.find_local_var(l1, "w").unwrap().unwrap();
    assert_eq!(fresh.get::<Vec<f32>>(w).unwrap()[3], 4.0);
}

#[test]
fn a_directory_with_one_file_loads_it_and_an_empty_one_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let (src, _) = model(1.0);
    checkpoint::save(&src, src.root(), d.path().join("model.safetensors"), &dot()).unwrap();
    let (mut t, vars) = model(0.0);
    let root = t.root();
    checkpoint::load(&mut t, root, d.path(), &dot_load()).unwrap();
    let (src, src_vars) = model(1.0);
    assert_eq!(state(&t, &vars), state(&src, &src_vars));

    let e = tempfile::tempdir().unwrap();
    let err = checkpoint::load(&mut t, root, e.path(), &dot_load()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(err.to_string().contains(INDEX), "{err}");
}

#[test]
fn one_error_lists_every_problem_whichever_shard_holds_it_and_nothing_changes() {
    let d = tempfile::tempdir().unwrap();
    saved(d.path());
    // The tree: no `steps` (in the last shard), an extra `head`, and
    // `layers.1.w` of another shape (in the last shard too), and `embed`
    // of another dtype (in the first).
    let (mut t, vars) = model(0.0);
    let root = t.root();
    let steps = vars.iter().find(|(k, _)| k == "steps").unwrap().1;
    t.remove_var(steps).unwrap();
    let head = t.var(root, "head").unwrap();
    t.set(head, vec![0.0_f32; 3]).unwrap();
    let l1w = vars.iter().find(|(k, _)| k == "layers.1.w").unwrap().1;
    t.set(l1w, Tensor::new(vec![2, 8], vec![0.0_f32; 16]).unwrap())
        .unwrap();
    let embed = vars.iter().find(|(k, _)| k == "embed").unwrap().1;
    t.set(embed, Tensor::new(vec![8, 4], vec![0.0_f64; 32]).unwrap())
        .unwrap();
    let kept: Vec<_> = vars
        .iter()
        .filter(|(k, _)| k != "steps" && k != "embed")
        .cloned()
        .collect();
    let before = state(&t, &kept);
    let err = checkpoint::load(&mut t, root, d.path(), &dot_load()).unwrap_err();
    let Error::Mismatch {
        missing,
        unexpected,
        mismatched,
        path,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(missing, &["head"]);
    assert_eq!(unexpected, &["steps"]);
    let keys: Vec<&str> = mismatched.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(keys, ["embed", "layers.1.w"]);
    assert!(path.ends_with(INDEX), "{path}");
    assert_eq!(state(&t, &kept), before);
}

#[test]
fn a_bad_shard_read_last_leaves_the_tree_unchanged() {
    let d = tempfile::tempdir().unwrap();
    let r = saved(d.path());
    let last = d.path().join(r.shards.last().unwrap());
    // Cut the last shard's data: its header no longer fits the file.
    let bytes = std::fs::read(&last).unwrap();
    std::fs::write(&last, &bytes[..bytes.len() - 4]).unwrap();
    let (mut t, vars) = model(0.0);
    let before = state(&t, &vars);
    let root = t.root();
    let err = checkpoint::load(&mut t, root, d.path(), &dot_load()).unwrap_err();
    assert!(
        matches!(&err, Error::BadFile { path, problem: BadFile::OutOfRange { key, .. } }
            if key == "layers.1.w" && path.ends_with("model-00003-of-00003.safetensors")),
        "{err}"
    );
    assert_eq!(state(&t, &vars), before);
    // Creating into an empty tree: nothing made.
    let mut e = ScopeTree::new();
    let root = e.root();
    assert!(checkpoint::load(&mut e, root, d.path(), &dot_load().create(true)).is_err());
    assert_eq!((e.scope_count(), e.var_count()), (1, 0));
}

fn bad_index(dir: &Path) -> BadIndex {
    let (mut t, vars) = model(0.0);
    let before = state(&t, &vars);
    let root = t.root();
    let err = checkpoint::load(&mut t, root, dir, &dot_load()).unwrap_err();
    assert_eq!(state(&t, &vars), before, "a failed load changed the tree");
    match err {
        Error::BadIndex { problem, path } => {
            assert!(path.ends_with(INDEX), "{path}");
            problem
        }
        other => panic!("not BadIndex: {other}"),
    }
}

#[test]
fn a_name_mapped_to_a_missing_shard_is_named_with_its_tensors() {
    let d = tempfile::tempdir().unwrap();
    let r = saved(d.path());
    std::fs::remove_file(d.path().join(&r.shards[2])).unwrap();
    assert_eq!(
        bad_index(d.path()),
        BadIndex::MissingShard {
            file: r.shards[2].clone(),
            keys: vec!["layers.1.w".into(), "steps".into()]
        }
    );
}

#[test]
fn a_shard_that_lacks_a_name_the_index_gives_it() {
    let d = tempfile::tempdir().unwrap();
    let r = saved(d.path());
    let mut idx = index(d.path());
    idx["weight_map"]["layers.9.w"] = r.shards[1].clone().into();
    write_index(d.path(), &idx);
    assert_eq!(
        bad_index(d.path()),
        BadIndex::ShardLacks {
            file: r.shards[1].clone(),
            keys: vec!["layers.9.w".into()]
        }
    );
}

#[test]
fn a_name_the_weight_map_gives_twice_and_shard_names_outside_the_directory() {
    let d = tempfile::tempdir().unwrap();
    let r = saved(d.path());
    let text = std::fs::read_to_string(d.path().join(INDEX)).unwrap();
    // A second entry for `embed`, in the last shard, first in the map.
    let dup = text.replacen(
        "\"weight_map\": {",
        &format!("\"weight_map\": {{\n    \"embed\": \"{}\",", r.shards[2]),
        1,
    );
    std::fs::write(d.path().join(INDEX), dup).unwrap();
    assert_eq!(
        bad_index(d.path()),
        BadIndex::DuplicateName {
            key: "embed".into(),
            first: r.shards[2].clone(),
            second: r.shards[0].clone()
        }
    );
    for file in ["../model-00001-of-00004.safetensors", "/etc/hostname", ""] {
        let mut idx = index(&{
            let e = tempfile::tempdir().unwrap();
            saved(e.path());
            let v = index(e.path());
            write_index(d.path(), &v);
            d.path().to_path_buf()
        });
        idx["weight_map"]["embed"] = file.into();
        write_index(d.path(), &idx);
        assert_eq!(
            bad_index(d.path()),
            BadIndex::BadShardName {
                key: "embed".into(),
                file: file.into()
            }
        );
    }
    for text in ["", "{", "[]", "{\"weight_map\": 3}", "{\"metadata\": {}}"] {
        std::fs::write(d.path().join(INDEX), text).unwrap();
        let p = bad_index(d.path());
        assert!(
            matches!(p, BadIndex::BadJson { .. } | BadIndex::NoWeightMap),
            "{text}: {p:?}"
        );
    }
}

/// A shard reused from another save holds a tensor the index assigns
/// elsewhere: it is never read from there. A strict load reports it; a
/// lenient one loads the assigned copy and lists the other.
#[test]
fn the_index_decides_which_shard_a_tensor_is_read_from() {
    let d = tempfile::tempdir().unwrap();
    let r = saved(d.path());
    // The last shard rewritten to hold its tensors and a stale copy of
    // `embed` (zeros).
    let (src, _) = model(1.0);
    let mut other = ScopeTree::new();
    let root = other.root();
    let s = other.var(root, "steps").unwrap();
    other.set(s, vec![10_i64; 2]).unwrap();
    let layers = other.new_named_scope(root, "layers").unwrap();
    let l1 = other.new_named_scope(layers, "1").unwrap();
    let w = other.var(l1, "w").unwrap();
    let src_l1w = src
        .find_var(
            src.kid(src.kid(src.root(), "layers").unwrap().unwrap(), "1")
                .unwrap()
                .unwrap(),
            "w",
        )
        .unwrap()
        .unwrap();
    other
        .set(w, src.get::<Tensor<f32>>(src_l1w).unwrap().clone())
        .unwrap();
    let e = other.var(root, "embed").unwrap();
    other
        .set(e, Tensor::new(vec![8, 4], vec![0.0_f32; 32]).unwrap())
        .unwrap();
    let last = d.path().join(&r.shards[2]);
    let meta = checkpoint_metadata(&last);
    checkpoint::save(&other, root, &last, &dot().metadata(meta)).unwrap();

    let (mut t, vars) = model(0.0);
    let before = state(&t, &vars);
    let root = t.root();
    let err = checkpoint::load(&mut t, root, d.path(), &dot_load()).unwrap_err();
    assert!(
        matches!(&err, Error::Mismatch { unassigned, missing, unexpected, mismatched, .. }
            if unassigned == &[("embed".to_string(), r.shards[2].clone())]
                && missing.is_empty() && unexpected.is_empty() && mismatched.is_empty()),
        "{err}"
    );
    assert!(
        err.to_string().contains("embed in model-00003-of-00003"),
        "{err}"
    );
    assert_eq!(state(&t, &vars), before);

    let report = checkpoint::load(&mut t, root, d.path(), &dot_load().allow_unused(true)).unwrap();
    assert_eq!(
        report.unassigned,
        [("embed".to_string(), r.shards[2].clone())]
    );
    let (src, src_vars) = model(1.0);
    assert_eq!(
        state(&t, &vars),
        state(&src, &src_vars),
        "embed from shard 1"
    );
}

/// The `__metadata__` of a shard, as a map.
fn checkpoint_metadata(p: &Path) -> std::collections::HashMap<String, String> {
    let bytes = std::fs::read(p).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    header["__metadata__"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn a_save_stopped_between_its_shards_and_its_index_is_caught() {
    let d = tempfile::tempdir().unwrap();
    saved(d.path());
    let old_index = std::fs::read(d.path().join(INDEX)).unwrap();
    // A second save with other values, same shards; then its index is
    // "lost": the old index is back, beside the new shards.
    let (t, _) = model(2.0);
    checkpoint::save_sharded(&t, t.root(), d.path(), &dot().max_shard_size(100)).unwrap();
    std::fs::write(d.path().join(INDEX), old_index).unwrap();
    assert!(matches!(bad_index(d.path()), BadIndex::TornSave { .. }));
}

#[test]
fn a_new_save_removes_the_shards_only_the_old_index_named() {
    let d = tempfile::tempdir().unwrap();
    let old = saved(d.path());
    std::fs::write(d.path().join("notes.txt"), "mine").unwrap();
    let (t, vars) = model(3.0);
    let new = checkpoint::save_sharded(&t, t.root(), d.path(), &dot()).unwrap();
    assert_eq!(new.shards, ["model-00001-of-00001.safetensors"]);
    for s in &old.shards {
        assert!(!d.path().join(s).exists(), "{s} left behind");
    }
    assert!(d.path().join("notes.txt").exists());
    let (mut back, back_vars) = model(0.0);
    let root = back.root();
    checkpoint::load(&mut back, root, d.path(), &dot_load()).unwrap();
    assert_eq!(state(&back, &back_vars), state(&t, &vars));
}

#[test]
fn inspect_reads_an_index_shard_by_shard() {
    let d = tempfile::tempdir().unwrap();
    let r = saved(d.path());
    let tensors = checkpoint::inspect(d.path().join(INDEX)).unwrap();
    let got: Vec<(&str, &str)> = tensors
        .iter()
        .map(|t| (t.key.as_str(), t.shard.as_deref().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("embed", r.shards[0].as_str()),
            ("layers.0.b", &r.shards[1]),
            ("layers.0.w", &r.shards[1]),
            ("layers.1.b", &r.shards[1]),
            // In data order: safetensors puts the 8-byte dtype first.
            ("steps", &r.shards[2]),
            ("layers.1.w", &r.shards[2]),
        ]
    );
    let one = d.path().join("one.safetensors");
    let (t, _) = model(1.0);
    checkpoint::save(&t, t.root(), &one, &dot()).unwrap();
    assert!(
        checkpoint::inspect(&one)
            .unwrap()
            .iter()
            .all(|t| t.shard.is_none())
    );
}

#[test]
fn bf16_saves_and_loads_convert_floats_and_keep_integers() {
    let d = tempfile::tempdir().unwrap();
    let (src, _) = model(1.1);
    let opts = dot().max_shard_size(100).floats_as(FloatDtype::BF16);
    checkpoint::save_sharded(&src, src.root(), d.path(), &opts).unwrap();
    let dtypes: Vec<_> = checkpoint::inspect(d.path())
        .unwrap()
        .into_iter()
        .map(|t| (t.key, t.dtype))
        .collect();
    assert!(
        dtypes
            .iter()
            .all(|(k, dt)| (k == "steps") == (*dt == checkpoint::Dtype::I64)
                && (k == "steps" || *dt == checkpoint::Dtype::BF16))
    );
    // Half the float bytes: 288 f32 bytes + 16 i64 bytes -> 144 + 16.
    assert_eq!(index(d.path())["metadata"]["total_size"], 144 + 16);

    let (mut t, vars) = model(0.0);
    let root = t.root();
    // Exact dtypes refuse; Convert rounds each value through bf16.
    assert!(matches!(
        checkpoint::load(&mut t, root, d.path(), &dot_load()),
        Err(Error::Mismatch { .. })
    ));
    checkpoint::load(
        &mut t,
        root,
        d.path(),
        &dot_load().dtype_policy(DtypePolicy::Convert),
    )
    .unwrap();
    let (src, src_vars) = model(1.1);
    let rounded: Vec<(String, Vec<u64>)> = state(&src, &src_vars)
        .into_iter()
        .map(|(k, bits)| {
            if k == "steps" {
                return (k, bits);
            }
            let r = bits
                .into_iter()
                .map(|b| {
                    let f = f32::from_bits(b as u32);
                    u64::from(bf16::from_f32(f).to_f32().to_bits())
                })
                .collect();
            (k, r)
        })
        .collect();
    assert_eq!(state(&t, &vars), rounded);

    // Into a fresh tree, created as f32 from bf16.
    let mut fresh = ScopeTree::new();
    let root = fresh.root();
    let load = dot_load().create(true).create_floats_as(FloatDtype::F32);
    checkpoint::load(&mut fresh, root, d.path(), &load).unwrap();
    let embed = fresh.find_local_var(root, "embed").unwrap().unwrap();
    assert_eq!(
        fresh.get::<Vec<f32>>(embed).unwrap()[5],
        bf16::from_f32(1.1 * 5.0 * 0.25).to_f32()
    );
    let steps = fresh.find_local_var(root, "steps").unwrap().unwrap();
    assert_eq!(fresh.get::<Vec<i64>>(steps).unwrap(), &[11, 11]);
    // And saved back as f32, then as f16: each a float conversion of it.
    let e = tempfile::tempdir().unwrap();
    checkpoint::save_sharded(&fresh, root, e.path(), &dot().floats_as(FloatDtype::F16)).unwrap();
    assert!(
        checkpoint::inspect(e.path())
            .unwrap()
            .iter()
            .any(|t| t.dtype == checkpoint::Dtype::F16)
    );
}

#[test]
fn messages_stay_short_with_long_names() {
    let d = tempfile::tempdir().unwrap();
    let r = saved(d.path());
    let mut idx = index(d.path());
    let long = "x".repeat(100_000);
    idx["weight_map"][long.as_str()] = r.shards[0].clone().into();
    write_index(d.path(), &idx);
    let (mut t, _) = model(0.0);
    let root = t.root();
    let err = checkpoint::load(&mut t, root, d.path(), &dot_load()).unwrap_err();
    assert!(matches!(err, Error::BadIndex { .. }), "{err}");
    assert!(
        err.to_string().len() < 1_000,
        "{} bytes",
        err.to_string().len()
    );
}

#[test]
fn a_store_saves_and_loads_sharded_with_its_recorded_shapes() {
    use scopetree::sharing::{Initializer, VarSpec, VariableStore};
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let init = Initializer::with_shape(|s: &[usize]| vec![1.5_f32; s.iter().product::<usize>()]);
    let w = store
        .get_variable(
            &root,
            VarSpec::<Vec<f32>>::new("w").shape([6]).initializer(init),
        )
        .unwrap();
    let d = tempfile::tempdir().unwrap();
    checkpoint::save_store_sharded(&store, d.path(), &SaveOptions::new()).unwrap();
    let t = &checkpoint::inspect(d.path()).unwrap()[0];
    assert_eq!(t.shape, [6]);
    store.tree_mut().set(w, vec![0.0_f32; 6]).unwrap();
    checkpoint::load_store(&mut store, d.path(), &LoadOptions::new()).unwrap();
    assert_eq!(store.tree().get::<Vec<f32>>(w).unwrap(), &[1.5; 6]);
}
