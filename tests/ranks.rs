//! The ranks layer in one process, without MPI: the single-process world,
//! manifests and their comparison, the error messages, and a plan's calls
//! on a world of one, and the all-reduce's sums at 2 to 4 ranks run as
//! threads (`support/thread_world.rs`), fused in buckets or sent from the
//! variables' own buffers. The multi-rank behaviour over MPI (agreement
//! across ranks, broadcast, sums, divergence) runs under `mpirun` in
//! `tests/ranks_mpi.rs`.

#[path = "support/thread_world.rs"]
mod thread_world;

use scopetree::checkpoint::{self, Dtype, SaveOptions, Tensor};
use scopetree::ranks::{
    Collective, DIGEST_BYTES, Error, Manifest, ManifestEntry, Partition, Piece, PlanOptions,
    Reduce, SingleProcess, SyncPlan,
};
use scopetree::sharing::{Initializer, VarSpec, VariableStore};
use scopetree::{ScopeId, ScopeTree, VarId};

type R = Result<(), Box<dyn std::error::Error>>;

/// Asserts that `msg` contains every one of `parts`.
#[track_caller]
fn says(err: &impl std::fmt::Display, parts: &[&str]) {
    let msg = err.to_string();
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
    }
}

/// A model scope `model` with `enc/w` (Tensor<f32> [2, 3]), `enc/b`
/// (Vec<f32> [3]), `dec/w` (Vec<f64> [4]) and `dec/w_box` (Box<[f32]> [2]).
fn model() -> Result<(ScopeTree, ScopeId, Vec<VarId>), Box<dyn std::error::Error>> {
    let mut tree = ScopeTree::new();
    let model = tree.new_named_scope(tree.root(), "model")?;
    let enc = tree.new_named_scope(model, "enc")?;
    let dec = tree.new_named_scope(model, "dec")?;
    let w = tree.var(enc, "w")?;
    tree.set(
        w,
        Tensor::new(vec![2, 3], vec![1.0_f32, 2.0, 3.0, 4.0, 5.0, 6.0])?,
    )?;
    let b = tree.var(enc, "b")?;
    tree.set(b, vec![0.5_f32, -1.0, 2.0])?;
    let dw = tree.var(dec, "w")?;
    tree.set(dw, vec![1.0_f64, 2.0, 3.0, 4.0])?;
    let bx = tree.var(dec, "w_box")?;
    tree.set(bx, vec![7.0_f32, 8.0].into_boxed_slice())?;
    Ok((tree, model, vec![w, b, dw, bx]))
}

fn entry(key: &str, dtype: Dtype, shape: &[usize]) -> ManifestEntry {
    ManifestEntry {
        key: key.into(),
        dtype,
        shape: shape.to_vec(),
    }
}

/// A manifest made of `entries`, through the byte form ranks exchange.
fn manifest(entries: &[ManifestEntry]) -> Manifest {
    let mut tree = ScopeTree::new();
    for e in entries {
        let (scope, name) = match e.key.rsplit_once('/') {
            Some((s, n)) => {
                let mut at = tree.root();
                for part in s.split('/') {
                    at = match tree.kid(at, part).unwrap() {
                        Some(k) => k,
                        None => tree.new_named_scope(at, part).unwrap(),
                    };
                }
                (at, n)
            }
            None => (tree.root(), e.key.as_str()),
        };
        let v = tree.var(scope, name).unwrap();
        let n: usize = e.shape.iter().product();
        match e.dtype {
            Dtype::F64 => tree.set(v, Tensor::new(e.shape.clone(), vec![0.0_f64; n]).unwrap()),
            _ => tree.set(v, Tensor::new(e.shape.clone(), vec![0.0_f32; n]).unwrap()),
        }
        .unwrap();
    }
    Manifest::of_tree(&tree, tree.root()).unwrap()
}

#[test]
fn the_single_process_world_is_the_identity() -> R {
    let w = SingleProcess;
    assert_eq!((w.rank(), w.size()), (0, 1));
    let mut r32 = [0.0_f32; 3];
    w.all_reduce_sum_f32(&[1.0, -2.0, 3.5], &mut r32)?;
    assert_eq!(r32, [1.0, -2.0, 3.5]);
    let mut r64 = [0.0_f64; 2];
    w.all_reduce_sum_f64(&[1e300, -0.0], &mut r64)?;
    assert_eq!(
        r64.map(f64::to_bits),
        [1e300_f64.to_bits(), (-0.0_f64).to_bits()]
    );
    let mut buf = [1_u8, 2, 3];
    w.broadcast_bytes(0, &mut buf)?;
    assert_eq!(buf, [1, 2, 3]);
    let mut all = [[0_u8; DIGEST_BYTES]];
    w.all_gather_digest(&[9; DIGEST_BYTES], &mut all)?;
    assert_eq!(all, [[9; DIGEST_BYTES]]);
    w.barrier()?;
    Ok(())
}

#[test]
fn the_single_process_world_rejects_misuse() {
    let w = SingleProcess;
    let err = w.all_reduce_sum_f32(&[1.0; 3], &mut [0.0; 2]).unwrap_err();
    assert!(matches!(err, Error::BadBuffers { .. }));
    says(&err, &["3 elements", "of 2"]);
    let err = w.broadcast_bytes(2, &mut [0; 1]).unwrap_err();
    says(&err, &["rank 2", "world of 1", "below 1"]);
    let mut two = [[0_u8; DIGEST_BYTES]; 2];
    assert!(matches!(
        w.all_gather_digest(&[0; DIGEST_BYTES], &mut two),
        Err(Error::BadBuffers { .. })
    ));
}

#[test]
fn a_manifest_lists_full_names_dtypes_and_shapes_in_name_order() -> R {
    let (tree, model, _) = model()?;
    let m = Manifest::of_tree(&tree, model)?;
    assert_eq!(
        m.entries(),
        [
            entry("dec/w", Dtype::F64, &[4]),
            entry("dec/w_box", Dtype::F32, &[2]),
            entry("enc/b", Dtype::F32, &[3]),
            entry("enc/w", Dtype::F32, &[2, 3]),
        ]
    );
    assert_eq!(m.scope(), "model");
    assert_eq!(Manifest::from_bytes(&m.to_bytes(), "model")?, m);
    Ok(())
}

#[test]
fn a_manifest_leaves_out_unnamed_scopes() -> R {
    let (mut tree, model, _) = model()?;
    let step = tree.new_scope(model)?;
    let h = tree.var(step, "h")?;
    tree.set(h, String::from("scratch, not synchronised"))?;
    assert_eq!(Manifest::of_tree(&tree, model)?.entries().len(), 4);
    Ok(())
}

#[test]
fn a_store_manifest_uses_the_store() -> R {
    let mut store = VariableStore::new();
    let mut root = store.root_scope();
    root.set_initializer(Initializer::with_shape(|s: &[usize]| {
        Tensor::new(s.to_vec(), vec![0.0_f32; s.iter().product()]).unwrap()
    }));
    store.get_variable(
        &root,
        VarSpec::<Tensor<f32>>::new("layer/kernel").shape([3, 4]),
    )?;
    let m = Manifest::of_store(&store)?;
    assert_eq!(m.entries(), [entry("layer/kernel", Dtype::F32, &[3, 4])]);
    Ok(())
}

#[test]
fn unsupported_values_are_named_with_the_scope_and_what_to_do() -> R {
    let (mut tree, model, _) = model()?;
    let enc = tree.kid(model, "enc")?.unwrap();
    let s = tree.var(enc, "steps")?;
    tree.set(s, 3_u64)?;
    let err = Manifest::of_tree(&tree, model).unwrap_err();
    assert!(matches!(err, Error::Unsupported { ref key, .. } if key == "enc/steps"));
    says(
        &err,
        &[
            "`enc/steps`",
            "scope `model`",
            "holds u64",
            "Vec, Box<[_]> or checkpoint::Tensor",
        ],
    );
    tree.clear(s)?;
    let err = Manifest::of_tree(&tree, model).unwrap_err();
    says(&err, &["`enc/steps`", "has no value"]);
    // Half floats are checkpointable but not synchronised.
    tree.set(s, vec![half::f16::ZERO; 2])?;
    says(
        &Manifest::of_tree(&tree, model).unwrap_err(),
        &["holds Vec<f16>"],
    );
    Ok(())
}

#[test]
fn digests_differ_for_a_name_a_dtype_or_a_shape() {
    let base = manifest(&[
        entry("a", Dtype::F32, &[2, 3]),
        entry("b", Dtype::F32, &[4]),
    ]);
    let same = manifest(&[
        entry("a", Dtype::F32, &[2, 3]),
        entry("b", Dtype::F32, &[4]),
    ]);
    assert_eq!(base.digest(), same.digest());
    for other in [
        manifest(&[
            entry("a", Dtype::F32, &[3, 2]),
            entry("b", Dtype::F32, &[4]),
        ]),
        manifest(&[entry("a", Dtype::F32, &[6]), entry("b", Dtype::F32, &[4])]),
        manifest(&[
            entry("a", Dtype::F64, &[2, 3]),
            entry("b", Dtype::F32, &[4]),
        ]),
        manifest(&[
            entry("a", Dtype::F32, &[2, 3]),
            entry("c", Dtype::F32, &[4]),
        ]),
        manifest(&[entry("a", Dtype::F32, &[2, 3])]),
    ] {
        assert_ne!(base.digest(), other.digest(), "{:?}", other.entries());
    }
}

#[test]
fn compare_names_the_first_difference_and_the_ranks_on_each_side() {
    let good = || {
        manifest(&[
            entry("a", Dtype::F32, &[2, 3]),
            entry("z", Dtype::F32, &[4]),
        ])
    };
    let shape = manifest(&[
        entry("a", Dtype::F32, &[3, 2]),
        entry("z", Dtype::F32, &[5]),
    ]);
    assert!(Manifest::compare(&[good(), good(), good()]).is_ok());
    let err = Manifest::compare(&[good(), shape, good(), good()]).unwrap_err();
    let Error::Disagree { key, sides, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(key, "a");
    assert_eq!(
        sides,
        &[
            ("F32 [2, 3]".to_owned(), vec![0, 2, 3]),
            ("F32 [3, 2]".to_owned(), vec![1])
        ]
    );
    says(
        &err,
        &[
            "ranks disagree",
            "first difference at `a`: F32 [2, 3] on ranks 0, 2-3; F32 [3, 2] on rank 1",
            "same names, dtypes and shapes",
        ],
    );

    // A name only one rank has: absent on the others.
    let renamed = manifest(&[
        entry("a", Dtype::F32, &[2, 3]),
        entry("y", Dtype::F32, &[4]),
    ]);
    let err = Manifest::compare(&[good(), renamed]).unwrap_err();
    says(
        &err,
        &["first difference at `y`: absent on rank 0; F32 [4] on rank 1"],
    );
    let err =
        Manifest::compare(&[good(), manifest(&[entry("a", Dtype::F32, &[2, 3])])]).unwrap_err();
    says(&err, &["at `z`: F32 [4] on rank 0; absent on rank 1"]);
}

#[test]
fn disagreement_messages_stay_short() {
    let long = "x".repeat(100_000);
    let ms: Vec<Manifest> = (0..300)
        .map(|r| manifest(&[entry(&long, Dtype::F32, &[r + 1])]))
        .collect();
    let err = Manifest::compare(&ms).unwrap_err();
    let msg = err.to_string();
    assert!(msg.len() < 1000, "{} bytes: {msg}", msg.len());
    says(&err, &["… 292 more groups", "(100000 bytes)"]);
}

#[test]
fn bad_manifest_bytes_are_an_error() {
    let ok = manifest(&[entry("a", Dtype::F32, &[2])]).to_bytes();
    for cut in 1..ok.len() {
        assert!(
            Manifest::from_bytes(&ok[..cut], "").is_err(),
            "cut at {cut}"
        );
    }
    let mut bad_dtype = ok.clone();
    bad_dtype[9] = 200; // the dtype code after the 8-byte length and the key `a`
    says(
        &Manifest::from_bytes(&bad_dtype, "").unwrap_err(),
        &["dtype code 200"],
    );
    let mut twice = ok.clone();
    twice.extend_from_slice(&ok);
    says(
        &Manifest::from_bytes(&twice, "").unwrap_err(),
        &["out of order"],
    );
}

#[test]
fn a_plan_in_one_process_reduces_to_the_identity_and_mean_divides_by_one() -> R {
    let (mut tree, model, vars) = model()?;
    let before: Vec<u8> = bytes(&tree, &vars)?;
    let mut plan = SyncPlan::new(
        &SingleProcess,
        &tree,
        model,
        &PlanOptions::new().bucket_bytes(8),
    )?;
    // 2 + 3 + 6 f32 elements in buckets of 2, and 4 f64 in buckets of 1.
    assert_eq!(plan.reduce_buckets(), 6 + 4);
    for op in [Reduce::Sum, Reduce::Mean] {
        plan.all_reduce(&SingleProcess, &mut tree, op)?;
        assert_eq!(bytes(&tree, &vars)?, before);
    }
    plan.broadcast(&SingleProcess, &mut tree, 0)?;
    assert_eq!(bytes(&tree, &vars)?, before);
    plan.check_consistency(&SingleProcess, &tree)?;
    Ok(())
}

/// Every variable's bytes, in order.
fn bytes(tree: &ScopeTree, vars: &[VarId]) -> Result<Vec<u8>, scopetree::Error> {
    let mut out = Vec::new();
    out.extend(
        tree.get::<Tensor<f32>>(vars[0])?
            .data()
            .iter()
            .flat_map(|x| x.to_le_bytes()),
    );
    out.extend(
        tree.get::<Vec<f32>>(vars[1])?
            .iter()
            .flat_map(|x| x.to_le_bytes()),
    );
    out.extend(
        tree.get::<Vec<f64>>(vars[2])?
            .iter()
            .flat_map(|x| x.to_le_bytes()),
    );
    out.extend(
        tree.get::<Box<[f32]>>(vars[3])?
            .iter()
            .flat_map(|x| x.to_le_bytes()),
    );
    Ok(out)
}

#[test]
fn reducing_integers_is_refused_before_anything_is_sent() -> R {
    let (mut tree, model, _) = model()?;
    let n = tree.var(model, "count")?;
    tree.set(n, vec![1_i64, 2])?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, model, &PlanOptions::new())?;
    plan.broadcast(&SingleProcess, &mut tree, 0)?; // integers broadcast fine
    let err = plan
        .all_reduce(&SingleProcess, &mut tree, Reduce::Sum)
        .unwrap_err();
    says(
        &err,
        &[
            "`count`",
            "scope `model`",
            "holds Vec<i64>",
            "f32 or f64 only",
        ],
    );
    Ok(())
}

#[test]
fn a_tree_changed_since_the_plan_is_an_error_and_nothing_changes() -> R {
    let (mut tree, model, vars) = model()?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, model, &PlanOptions::new())?;
    tree.get_mut::<Vec<f32>>(vars[1])?.push(9.0);
    let before = tree.get::<Vec<f32>>(vars[1])?.clone();
    let err = plan
        .all_reduce(&SingleProcess, &mut tree, Reduce::Mean)
        .unwrap_err();
    assert!(matches!(err, Error::Changed { ref key, .. } if key == "enc/b"));
    says(
        &err,
        &[
            "`enc/b`",
            "scope `model`",
            "16 bytes, 12 when planned",
            "build a new plan",
        ],
    );
    assert_eq!(tree.get::<Vec<f32>>(vars[1])?, &before);
    assert!(matches!(
        plan.check_consistency(&SingleProcess, &tree),
        Err(Error::Changed { .. })
    ));
    tree.get_mut::<Vec<f32>>(vars[1])?.pop();
    tree.remove_var(vars[2])?;
    let err = plan.broadcast(&SingleProcess, &mut tree, 0).unwrap_err();
    says(&err, &["`dec/w`", "changed since the plan"]);
    Ok(())
}

#[test]
fn the_digest_sees_one_changed_bit() -> R {
    let (mut tree, model, vars) = model()?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, model, &PlanOptions::new())?;
    let d = plan.digest(&tree)?;
    assert_eq!(plan.digest(&tree)?, d);
    let x = &mut tree.get_mut::<Vec<f64>>(vars[2])?[3];
    *x = f64::from_bits(x.to_bits() ^ 1);
    assert_ne!(plan.digest(&tree)?, d);
    Ok(())
}

#[test]
fn a_checkpoint_saved_and_loaded_in_one_process_round_trips() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("model.safetensors");
    let (mut tree, model, vars) = model()?;
    let before = bytes(&tree, &vars)?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, model, &PlanOptions::new())?;
    let report = plan.save_on_root(&SingleProcess, &tree, &path, 0, &SaveOptions::new())?;
    assert_eq!(report.map(|r| r.keys.len()), Some(4));
    tree.get_mut::<Vec<f64>>(vars[2])?.fill(0.0);
    let report = plan.load_on_all(&SingleProcess, &mut tree, &path)?;
    assert_eq!(report.loaded.len(), 4);
    assert_eq!(bytes(&tree, &vars)?, before);
    Ok(())
}

/// Scratch variables are synchronised but never saved: the checkpoint of a
/// plan with scratch holds the rest, byte for byte the file of a plan
/// without them; it loads back leaving the scratch alone, and a file that
/// still holds the scratch (an older save) loads too, its scratch ignored.
#[test]
fn scratch_is_synchronised_but_left_out_of_checkpoints() -> R {
    let dir = tempfile::tempdir()?;
    let (with, without) = (dir.path().join("with.st"), dir.path().join("without.st"));
    let (mut tree, model, vars) = model()?;
    let dec_w = |key: &str| key == "dec/w";
    let scratch = PlanOptions::new().scratch(dec_w);
    let mut plan = SyncPlan::new(&SingleProcess, &tree, model, &scratch)?;
    assert_eq!(
        plan.manifest().entries().len(),
        4,
        "the plan synchronises scratch"
    );
    let saved = plan.save_on_root(&SingleProcess, &tree, &with, 0, &SaveOptions::new())?;
    let keys = saved.map(|r| r.keys).unwrap_or_default();
    assert_eq!(keys.len(), 3);
    assert!(!keys.iter().any(|k| k == "dec/w"), "{keys:?}");
    let rest = PlanOptions::new().filter(move |key| !dec_w(key));
    let plain = SyncPlan::new(&SingleProcess, &tree, model, &rest)?;
    plain.save_on_root(&SingleProcess, &tree, &without, 0, &SaveOptions::new())?;
    assert_eq!(std::fs::read(&with)?, std::fs::read(&without)?);

    // The load fills the rest and leaves the scratch as it is.
    let before = bytes(&tree, &vars)?;
    tree.get_mut::<Vec<f32>>(vars[1])?.fill(0.0);
    tree.get_mut::<Vec<f64>>(vars[2])?.fill(9.0);
    let report = plan.load_on_all(&SingleProcess, &mut tree, &with)?;
    assert_eq!(report.loaded.len(), 3);
    assert_eq!(tree.get::<Vec<f64>>(vars[2])?, &[9.0; 4]);
    tree.get_mut::<Vec<f64>>(vars[2])?
        .copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(bytes(&tree, &vars)?, before);

    // A file with the scratch in it loads, the scratch ignored.
    let all = dir.path().join("all.st");
    let full = SyncPlan::new(&SingleProcess, &tree, model, &PlanOptions::new())?;
    full.save_on_root(&SingleProcess, &tree, &all, 0, &SaveOptions::new())?;
    tree.get_mut::<Vec<f64>>(vars[2])?.fill(9.0);
    let report = plan.load_on_all(&SingleProcess, &mut tree, &all)?;
    assert_eq!(report.loaded.len(), 3);
    assert_eq!(tree.get::<Vec<f64>>(vars[2])?, &[9.0; 4]);
    Ok(())
}

#[test]
fn a_checkpoint_that_does_not_fit_the_plan_changes_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("other.safetensors");
    let (mut tree, model, vars) = model()?;
    let mut other = ScopeTree::new();
    let enc = other.new_named_scope(other.root(), "enc")?;
    let w = other.var(enc, "w")?;
    other.set(w, Tensor::new(vec![3, 2], vec![0.0_f32; 6])?)?;
    checkpoint::save(&other, other.root(), &path, &SaveOptions::new())?;
    let before = bytes(&tree, &vars)?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, model, &PlanOptions::new())?;
    let err = plan
        .load_on_all(&SingleProcess, &mut tree, &path)
        .unwrap_err();
    says(
        &err,
        &[
            "does not match",
            "enc/w: file F32 [3, 2], tree F32 [2, 3]",
            "dec/w",
        ],
    );
    assert_eq!(bytes(&tree, &vars)?, before);
    Ok(())
}

#[test]
fn a_plan_refuses_empty_buckets_and_bad_roots() -> R {
    let (mut tree, model, _) = model()?;
    let err = SyncPlan::new(
        &SingleProcess,
        &tree,
        model,
        &PlanOptions::new().bucket_bytes(0),
    )
    .unwrap_err();
    says(&err, &["bucket of 0 bytes"]);
    let mut plan = SyncPlan::new(&SingleProcess, &tree, model, &PlanOptions::new())?;
    assert!(matches!(
        plan.broadcast(&SingleProcess, &mut tree, 1),
        Err(Error::BadRank {
            rank: 1,
            size: 1,
            ..
        })
    ));
    let err = plan
        .save_on_root(
            &SingleProcess,
            &tree,
            "/nonexistent/x",
            3,
            &SaveOptions::new(),
        )
        .unwrap_err();
    says(&err, &["rank 3"]);
    Ok(())
}

#[test]
fn a_filtered_plan_holds_and_checkpoints_only_the_keys_it_keeps() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("kept.safetensors");
    let (mut tree, model, vars) = model()?;
    // Scratch the plan leaves out: a string (unsupported) and a buffer.
    let scratch = tree.new_named_scope(model, "scratch")?;
    let note = tree.var(scratch, "note")?;
    tree.set(note, String::from("not synchronised"))?;
    let buf = tree.var(scratch, "buf")?;
    tree.set(buf, vec![1.0_f32; 3])?;
    let opts = PlanOptions::new().filter(|key| !key.starts_with("scratch/"));
    let mut plan = SyncPlan::new(&SingleProcess, &tree, model, &opts)?;
    assert_eq!(plan.manifest().entries().len(), 4);
    plan.all_reduce(&SingleProcess, &mut tree, Reduce::Mean)?;
    // The options' own separator and filter give way to the plan's.
    let theirs = SaveOptions::new()
        .separator(checkpoint::Separator::Dot)
        .filter(|_| false);
    let report = plan.save_on_root(&SingleProcess, &tree, &path, 0, &theirs)?;
    assert_eq!(
        report.map(|r| r.keys),
        Some(vec![
            "dec/w".to_owned(),
            "dec/w_box".into(),
            "enc/b".into(),
            "enc/w".into()
        ])
    );
    let before = bytes(&tree, &vars)?;
    tree.get_mut::<Vec<f64>>(vars[2])?.fill(0.0);
    tree.get_mut::<Vec<f32>>(buf)?.fill(5.0);
    let report = plan.load_on_all(&SingleProcess, &mut tree, &path)?;
    assert_eq!(report.loaded.len(), 4);
    assert_eq!(bytes(&tree, &vars)?, before);
    assert_eq!(
        tree.get::<Vec<f32>>(buf)?,
        &[5.0; 3],
        "left out, left alone"
    );
    Ok(())
}

#[test]
fn messages_stay_under_1_kib_for_deep_scopes_and_long_names() -> R {
    let mut tree = ScopeTree::new();
    let top = tree.new_named_scope(tree.root(), "x".repeat(1 << 20))?;
    let mut s = top;
    for _ in 0..10_000 {
        s = tree.new_named_scope(s, "layer")?;
    }
    let v = tree.var(s, "w".repeat(1 << 20))?;
    tree.set(v, String::from("not a tensor"))?;
    let short = |e: &Error| {
        let n = e.to_string().len();
        assert!(n < 1024, "{n} bytes: {}", &e.to_string()[..300]);
    };
    // The synchronised scope is the deepest but one: a long path, a long key.
    let scope = tree.parent(s)?.unwrap();
    let err = Manifest::of_tree(&tree, scope).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }));
    short(&err);
    tree.set(v, vec![0.0_f32; 2])?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &PlanOptions::new())?;
    tree.get_mut::<Vec<f32>>(v)?.push(1.0);
    let err = plan
        .all_reduce(&SingleProcess, &mut tree, Reduce::Sum)
        .unwrap_err();
    assert!(matches!(err, Error::Changed { .. }));
    short(&err);
    tree.remove_var(v)?;
    let err = plan.check_consistency(&SingleProcess, &tree).unwrap_err();
    short(&err);
    Ok(())
}

// ----- ZeRO stage 1: the partition rule, and its calls on a world of one --

/// Checks the partition rule: `part` cuts the variables laid end to end in
/// manifest order into `n` contiguous slices in rank order, covering every
/// element once, each rank's bytes within one element of `⌊(r+1)T/n⌋ −
/// ⌊rT/n⌋`.
#[track_caller]
fn check_partition(part: &Partition, m: &Manifest, n: usize) {
    let vars: Vec<(usize, usize)> = m
        .entries()
        .iter()
        .map(|e| (e.dtype.bitsize() / 8, e.shape.iter().product()))
        .collect();
    let total: usize = vars.iter().map(|(s, l)| s * l).sum();
    assert_eq!(part.ranks(), n);
    // The global byte offset of each piece must be the next one.
    let starts: Vec<usize> = vars
        .iter()
        .scan(0, |at, (s, l)| {
            let here = *at;
            *at += s * l;
            Some(here)
        })
        .collect();
    let mut next = 0;
    for r in 0..n {
        let mut bytes = 0;
        for p in part.pieces(r) {
            let (size, len) = vars[p.var];
            assert!(p.len > 0 && p.start + p.len <= len, "rank {r}: {p:?}");
            assert_eq!(starts[p.var] + p.start * size, next, "rank {r}: {p:?}");
            next += p.len * size;
            bytes += p.len * size;
        }
        assert_eq!(bytes, part.bytes(r));
        let share = total * (r + 1) / n - total * r / n;
        assert!(
            bytes.abs_diff(share) < 8,
            "rank {r}: {bytes} bytes, share {share}"
        );
    }
    assert_eq!(next, total, "not every element has an owner");
}

#[test]
fn the_partition_is_contiguous_complete_and_balanced_for_any_world() {
    let shapes: [&[ManifestEntry]; 4] = [
        &[
            entry("Whh", Dtype::F32, &[64, 64]),
            entry("Why", Dtype::F32, &[10, 64]),
            entry("Wxh", Dtype::F32, &[64, 10]),
            entry("bh", Dtype::F32, &[64]),
            entry("by", Dtype::F32, &[10]),
        ],
        &[
            entry("a", Dtype::F64, &[3]),
            entry("b", Dtype::F32, &[0]),
            entry("c", Dtype::F32, &[5]),
            entry("d", Dtype::F64, &[7, 2]),
            entry("e", Dtype::F32, &[1]),
        ],
        &[entry("one", Dtype::F64, &[1])],
        &[],
    ];
    for entries in shapes {
        let m = manifest(entries);
        for n in 1..=9 {
            let part = Partition::new(&m, n).unwrap();
            check_partition(&part, &m, n);
            // Deterministic: the same manifest cuts the same way.
            assert_eq!(part, Partition::new(&m, n).unwrap());
        }
    }
    // train_rnn's parameters (hidden 64, 10 tokens): 21 800 bytes, a
    // quarter each at 4 ranks (cut back to whole f32s), `Whh` split
    // between all four.
    let m = manifest(shapes[0]);
    let part = Partition::new(&m, 4).unwrap();
    assert_eq!(
        (0..4).map(|r| part.bytes(r)).collect::<Vec<_>>(),
        [5448, 5452, 5448, 5452]
    );
    assert_eq!(
        part.piece_of(0, 0),
        Some(Piece {
            var: 0,
            start: 0,
            len: 1362
        })
    );
    assert_eq!(
        part.piece_of(3, 0),
        Some(Piece {
            var: 0,
            start: 4087,
            len: 9
        })
    );
    assert_eq!(part.piece_of(0, 1), None);
    // More ranks than elements: some own nothing.
    let m = manifest(shapes[2]);
    let part = Partition::new(&m, 3).unwrap();
    assert_eq!((part.bytes(0), part.bytes(1), part.bytes(2)), (0, 0, 8));
    assert!(part.pieces(0).is_empty() && part.pieces(7).is_empty());
}

#[test]
fn a_partition_of_no_ranks_is_refused() {
    let m = manifest(&[entry("w", Dtype::F32, &[4])]);
    let err = Partition::new(&m, 0).unwrap_err();
    assert!(matches!(err, Error::BadOption { .. }), "{err}");
    says(&err, &["into 0 ranks; pass the world's size (at least 1)"]);
}

#[test]
fn single_process_block_collectives_are_the_identity_and_check_lengths() -> R {
    let w = SingleProcess;
    let mut r32 = [0.0_f32; 2];
    w.reduce_scatter_sum_f32(&[1.5, -2.0], &mut r32)?;
    assert_eq!(r32, [1.5, -2.0]);
    let mut r64 = [0.0_f64; 1];
    w.reduce_scatter_sum_f64(&[3.0], &mut r64)?;
    assert_eq!(r64, [3.0]);
    let mut all = [0_u8; 3];
    w.all_gather_bytes(&[1, 2, 3], &mut all)?;
    assert_eq!(all, [1, 2, 3]);
    let err = w.reduce_scatter_sum_f32(&[1.0; 3], &mut r32).unwrap_err();
    assert!(matches!(
        err,
        Error::BadBuffers {
            op: "reduce-scatter",
            ..
        }
    ));
    says(&err, &["a buffer of 3 elements for 1 block(s) of 2"]);
    assert!(w.reduce_scatter_sum_f64(&[1.0; 2], &mut r64).is_err());
    assert!(w.all_gather_bytes(&[1, 2], &mut all).is_err());
    // A reduce to one rank: rank 0 is the only root.
    w.reduce_sum_f32(0, &[0.5, 4.0], &mut r32)?;
    assert_eq!(r32, [0.5, 4.0]);
    w.reduce_sum_f64(0, &[-1.0], &mut r64)?;
    assert_eq!(r64, [-1.0]);
    let err = w.reduce_sum_f32(1, &[1.0; 2], &mut r32).unwrap_err();
    assert!(matches!(
        err,
        Error::BadRank {
            rank: 1,
            size: 1,
            ..
        }
    ));
    says(&err, &["root of a reduce"]);
    assert!(matches!(
        w.reduce_sum_f64(0, &[1.0; 3], &mut r64),
        Err(Error::BadBuffers { .. })
    ));
    Ok(())
}

#[test]
fn reduce_scatter_and_all_gather_on_one_rank_keep_every_value() -> R {
    let (mut tree, scope, vars) = model()?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &PlanOptions::new())?;
    assert_eq!(plan.partition().ranks(), 1);
    plan.reduce_scatter(&SingleProcess, &mut tree, Reduce::Mean)?;
    plan.all_gather(&SingleProcess, &mut tree)?;
    assert_eq!(
        tree.get::<Tensor<f32>>(vars[0])?.data(),
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(tree.get::<Vec<f64>>(vars[2])?, &[1.0, 2.0, 3.0, 4.0]);
    // An integer variable: all-gathered as bytes, never reduced.
    let steps = tree.var(scope, "steps")?;
    tree.set(steps, vec![3_i64, 4])?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &PlanOptions::new())?;
    plan.all_gather(&SingleProcess, &mut tree)?;
    assert_eq!(tree.get::<Vec<i64>>(steps)?, &[3, 4]);
    let err = plan
        .reduce_scatter(&SingleProcess, &mut tree, Reduce::Sum)
        .unwrap_err();
    assert!(
        matches!(err, Error::Unsupported { ref key, .. } if key == "steps"),
        "{err}"
    );
    // A tree that changed since the plan.
    tree.get_mut::<Vec<f64>>(vars[2])?.push(5.0);
    let err = plan.all_gather(&SingleProcess, &mut tree).unwrap_err();
    assert!(
        matches!(err, Error::Changed { ref key, .. } if key == "dec/w"),
        "{err}"
    );
    Ok(())
}

/// Rank `rank`'s gradients: `a` (Vec<f32> [5]), `b` (Tensor<f32> [4, 10]),
/// `c` (Box<[f64]> [30]), `d` (Vec<f64> [100]), element `i` of the `v`th
/// being `v * 10 + rank * 1000 + i + 0.25`.
fn rank_grads(rank: usize) -> (ScopeTree, ScopeId, Vec<VarId>) {
    let x = |v: usize, i: usize| (v * 10 + rank * 1000 + i) as f64 + 0.25;
    let mut tree = ScopeTree::new();
    let g = tree.new_named_scope(tree.root(), "grads").expect("a scope");
    let a = tree.var(g, "a").expect("a var");
    tree.set(a, (0..5).map(|i| x(0, i) as f32).collect::<Vec<f32>>())
        .expect("set");
    let b = tree.var(g, "b").expect("a var");
    let data: Vec<f32> = (0..40).map(|i| x(1, i) as f32).collect();
    tree.set(b, Tensor::new(vec![4, 10], data).expect("a tensor"))
        .expect("set");
    let c = tree.var(g, "c").expect("a var");
    let boxed: Box<[f64]> = (0..30).map(|i| x(2, i)).collect();
    tree.set(c, boxed).expect("set");
    let d = tree.var(g, "d").expect("a var");
    tree.set(d, (0..100).map(|i| x(3, i)).collect::<Vec<f64>>())
        .expect("set");
    (tree, g, vec![a, b, c, d])
}

/// Every element of `rank_grads`' variables, as f64.
fn grad_values(tree: &ScopeTree, vars: &[VarId]) -> Vec<f64> {
    let mut out: Vec<f64> = Vec::new();
    out.extend(
        tree.get::<Vec<f32>>(vars[0])
            .expect("a")
            .iter()
            .map(|&x| f64::from(x)),
    );
    let b = tree.get::<Tensor<f32>>(vars[1]).expect("b");
    assert_eq!(b.shape(), [4, 10], "the tensor keeps its shape");
    out.extend(b.data().iter().map(|&x| f64::from(x)));
    out.extend(tree.get::<Box<[f64]>>(vars[2]).expect("c").iter());
    out.extend(tree.get::<Vec<f64>>(vars[3]).expect("d").iter());
    out
}

#[test]
fn sums_are_exact_whether_fused_or_sent_from_the_variables_own_buffers() {
    for ranks in 2..=4 {
        // The sums, in rank order as the thread world adds them, in each
        // variable's own type; then the means.
        let mut want_sum = vec![0.0_f64; 175];
        let mut want_sum32 = [0.0_f32; 45];
        for r in 0..ranks {
            let (tree, _, vars) = rank_grads(r);
            let v = grad_values(&tree, &vars);
            for (i, x) in v.iter().enumerate() {
                if i < 45 {
                    want_sum32[i] += *x as f32;
                } else {
                    want_sum[i] += x;
                }
            }
        }
        let n = ranks as f64;
        let sums: Vec<f64> = (0..175)
            .map(|i| {
                if i < 45 {
                    f64::from(want_sum32[i])
                } else {
                    want_sum[i]
                }
            })
            .collect();
        let means: Vec<f64> = (0..175)
            .map(|i| {
                if i < 45 {
                    f64::from(want_sum32[i] / ranks as f32)
                } else {
                    want_sum[i] / n
                }
            })
            .collect();
        for bucket in [8, 64, 1 << 20] {
            for direct in [1, 100, usize::MAX] {
                let got = thread_world::run(ranks, |w| {
                    let (mut tree, g, vars) = rank_grads(w.rank());
                    let opts = PlanOptions::new().bucket_bytes(bucket).direct_bytes(direct);
                    let mut plan = SyncPlan::new(w, &tree, g, &opts).expect("a plan");
                    plan.all_reduce(w, &mut tree, Reduce::Sum).expect("a sum");
                    let sum = grad_values(&tree, &vars);
                    let (mut tree, g, vars) = rank_grads(w.rank());
                    let mut plan = SyncPlan::new(w, &tree, g, &opts).expect("a plan");
                    plan.all_reduce(w, &mut tree, Reduce::Mean).expect("a mean");
                    let mean = grad_values(&tree, &vars);
                    (sum, mean, plan.reduce_buckets())
                });
                for (rank, (sum, mean, _)) in got.iter().enumerate() {
                    let case =
                        format!("{ranks} ranks, rank {rank}, bucket {bucket}, direct {direct}");
                    assert_eq!(sum, &sums, "{case}");
                    assert_eq!(mean, &means, "{case}");
                }
            }
        }
    }
}

#[test]
fn a_direct_variable_swaps_buffers_step_after_step_and_keeps_its_values() {
    let got = thread_world::run(2, |w| {
        let (mut tree, g, vars) = rank_grads(w.rank());
        let opts = PlanOptions::new().direct_bytes(1);
        let mut plan = SyncPlan::new(w, &tree, g, &opts).expect("a plan");
        let mut seen = Vec::new();
        for step in 0..3 {
            tree.get_mut::<Vec<f64>>(vars[3]).expect("d")[0] = f64::from(step);
            plan.all_reduce(w, &mut tree, Reduce::Sum).expect("a sum");
            seen.push(tree.get::<Vec<f64>>(vars[3]).expect("d")[0]);
        }
        seen
    });
    for seen in got {
        assert_eq!(seen, [0.0, 2.0, 4.0]);
    }
}

#[test]
fn ranks_that_pass_different_direct_sizes_stop_at_the_plan() {
    let got = thread_world::run(2, |w| {
        let (tree, g, _) = rank_grads(w.rank());
        let opts = PlanOptions::new().direct_bytes(if w.rank() == 0 { 1 } else { 1 << 20 });
        SyncPlan::new(w, &tree, g, &opts)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    for g in &got {
        let msg = g.as_ref().expect_err("different direct sizes");
        assert!(msg.contains("direct sizes"), "{msg}");
    }
}
