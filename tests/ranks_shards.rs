//! Checkpoints written and read by every rank (`SyncPlan::save_shards`,
//! `SyncPlan::load_shards`) in one process: the Hugging Face layout as
//! written, strict and atomic loads, scratch left out, and the other
//! checkpoint forms loading the same way. Across real ranks (saved on N,
//! loaded on 1..N, the same error on every rank) they run under `mpirun`
//! in `tests/ranks_mpi.rs`.

use std::collections::BTreeMap;
use std::path::Path;

use scopetree::checkpoint::{self, FloatDtype, SaveOptions, Tensor};
use scopetree::ranks::{Error, PlanOptions, SingleProcess, SyncPlan};
use scopetree::{ScopeId, ScopeTree, VarId};

type R = Result<(), Box<dyn std::error::Error>>;

/// A model scope with `enc/w` (Tensor<f32> [2, 3]), `enc/b` (Vec<f32>
/// [3]), `dec/w` (Vec<f64> [4]) and `dec/w@GRAD` (Vec<f64> [4]).
fn model(seed: f32) -> Result<(ScopeTree, ScopeId, Vec<VarId>), Box<dyn std::error::Error>> {
    let mut tree = ScopeTree::new();
    let model = tree.new_named_scope(tree.root(), "model")?;
    let enc = tree.new_named_scope(model, "enc")?;
    let dec = tree.new_named_scope(model, "dec")?;
    let w = tree.var(enc, "w")?;
    let vals: Vec<f32> = (0..6).map(|i| seed + i as f32).collect();
    tree.set(w, Tensor::new(vec![2, 3], vals)?)?;
    let b = tree.var(enc, "b")?;
    tree.set(b, vec![seed * 0.5, -1.0, 2.0])?;
    let dw = tree.var(dec, "w")?;
    tree.set(dw, vec![f64::from(seed); 4])?;
    let g = tree.var(dec, "w@GRAD")?;
    tree.set(g, vec![-f64::from(seed); 4])?;
    Ok((tree, model, vec![w, b, dw, g]))
}

fn values(tree: &ScopeTree, vars: &[VarId]) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let mut out: Vec<f64> = tree
        .get::<Tensor<f32>>(vars[0])?
        .data()
        .iter()
        .map(|&x| f64::from(x))
        .collect();
    out.extend(tree.get::<Vec<f32>>(vars[1])?.iter().map(|&x| f64::from(x)));
    out.extend(tree.get::<Vec<f64>>(vars[2])?);
    out.extend(tree.get::<Vec<f64>>(vars[3])?);
    Ok(out)
}

fn scratch() -> PlanOptions {
    PlanOptions::new().scratch(|key| key.ends_with("@GRAD"))
}

/// The index's weight map, read as JSON.
fn weight_map(dir: &Path) -> Result<BTreeMap<String, String>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(dir.join("model.safetensors.index.json"))?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    let map = json["weight_map"]
        .as_object()
        .ok_or("no weight_map")?
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    Ok(map)
}

#[test]
fn the_shards_are_a_hugging_face_checkpoint_that_loads_back() -> R {
    let dir = tempfile::tempdir()?;
    let (mut tree, scope, vars) = model(1.0)?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &scratch())?;
    let saved = plan.save_shards(&SingleProcess, &tree, dir.path(), &SaveOptions::new())?;
    assert_eq!(saved.shards, ["model-00001-of-00001.safetensors"]);
    assert_eq!(
        saved.mine.as_deref(),
        Some("model-00001-of-00001.safetensors")
    );
    assert_eq!(saved.keys, ["dec/w", "enc/b", "enc/w"]);
    assert_eq!(saved.bytes, 32 + 12 + 24);
    let map = weight_map(dir.path())?;
    assert_eq!(map.len(), 3, "{map:?}");
    assert!(!map.contains_key("dec/w@GRAD"), "scratch is left out");
    // Every shard says it is a PyTorch-layout file, as the Hugging Face
    // loaders require.
    let shard = std::fs::read(dir.path().join(&saved.shards[0]))?;
    let n = u64::from_le_bytes(shard[..8].try_into()?) as usize;
    let header: serde_json::Value = serde_json::from_slice(&shard[8..8 + n])?;
    assert_eq!(header["__metadata__"]["format"], "pt");

    // The checkpoint layer reads it as any sharded checkpoint.
    let mut other = model(7.0)?;
    checkpoint::load(
        &mut other.0,
        other.1,
        dir.path(),
        &checkpoint::LoadOptions::new().filter(|k| !k.ends_with("@GRAD")),
    )?;
    let before = values(&tree, &vars)?;
    assert_eq!(values(&other.0, &other.2)?[..13], before[..13]);

    // The plan reads it back; the scratch keeps its value.
    tree.get_mut::<Vec<f32>>(vars[1])?.fill(0.0);
    tree.get_mut::<Vec<f64>>(vars[3])?.fill(5.0);
    let loaded = plan.load_shards(&SingleProcess, &mut tree, dir.path())?;
    assert_eq!(loaded.keys, ["dec/w", "enc/b", "enc/w"]);
    assert_eq!(loaded.bytes, 68);
    let after = values(&tree, &vars)?;
    assert_eq!(after[..13], before[..13]);
    assert_eq!(after[13..], [5.0; 4]);
    Ok(())
}

#[test]
fn a_checkpoint_that_does_not_fit_changes_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let (tree, scope, _) = model(1.0)?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &scratch())?;
    plan.save_shards(&SingleProcess, &tree, dir.path(), &SaveOptions::new())?;

    // Another model: a missing variable, a shape that differs.
    let (mut other, oscope, ovars) = model(3.0)?;
    let enc = other.kid(oscope, "enc")?.ok_or("enc")?;
    let extra = other.var(enc, "extra")?;
    other.set(extra, vec![0.0_f32; 2])?;
    other.set(ovars[1], vec![0.0_f32; 4])?;
    let mut oplan = SyncPlan::new(&SingleProcess, &other, oscope, &scratch())?;
    let before = (
        values(&other, &ovars)?,
        other.get::<Vec<f32>>(extra)?.clone(),
    );
    let err = oplan
        .load_shards(&SingleProcess, &mut other, dir.path())
        .unwrap_err();
    let msg = err.to_string();
    for part in ["enc/extra", "enc/b"] {
        assert!(msg.contains(part), "{msg}");
    }
    assert!(matches!(err, Error::Checkpoint(_)), "{err:?}");
    let after = (
        values(&other, &ovars)?,
        other.get::<Vec<f32>>(extra)?.clone(),
    );
    assert_eq!(before, after);

    // A shard deleted: a clear error, nothing changed.
    let (mut tree2, scope2, vars2) = model(9.0)?;
    let mut plan2 = SyncPlan::new(&SingleProcess, &tree2, scope2, &scratch())?;
    std::fs::remove_file(dir.path().join("model-00001-of-00001.safetensors"))?;
    let before = values(&tree2, &vars2)?;
    let err = plan2
        .load_shards(&SingleProcess, &mut tree2, dir.path())
        .unwrap_err();
    assert!(err.to_string().contains("model-00001-of-00001"), "{err}");
    assert_eq!(values(&tree2, &vars2)?, before);
    Ok(())
}

#[test]
fn a_single_file_and_a_checkpoint_layer_shard_set_load_the_same_way() -> R {
    let dir = tempfile::tempdir()?;
    let (tree, scope, vars) = model(2.0)?;
    let want = values(&tree, &vars)?;
    let plan = SyncPlan::new(&SingleProcess, &tree, scope, &scratch())?;
    let file = dir.path().join("one.safetensors");
    plan.save_on_root(&SingleProcess, &tree, &file, 0, &SaveOptions::new())?;
    let sharded = dir.path().join("sharded");
    checkpoint::save_sharded(
        &tree,
        scope,
        &sharded,
        &SaveOptions::new()
            .max_shard_size(16)
            .filter(|k| !k.ends_with("@GRAD")),
    )?;
    assert!(checkpoint::inspect(&sharded)?.len() == 3);
    for path in [file.as_path(), sharded.as_path()] {
        let (mut t, s, v) = model(0.0)?;
        let mut p = SyncPlan::new(&SingleProcess, &t, s, &scratch())?;
        p.load_shards(&SingleProcess, &mut t, path)?;
        assert_eq!(values(&t, &v)?[..13], want[..13], "{}", path.display());
    }
    Ok(())
}

#[test]
fn floats_as_bf16_writes_bf16_shards() -> R {
    let dir = tempfile::tempdir()?;
    let (tree, scope, _) = model(1.0)?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &scratch())?;
    let saved = plan.save_shards(
        &SingleProcess,
        &tree,
        dir.path(),
        &SaveOptions::new().floats_as(FloatDtype::BF16),
    )?;
    assert_eq!(saved.bytes, (4 + 3 + 6) * 2);
    let dtypes: Vec<_> = checkpoint::inspect(dir.path())?
        .into_iter()
        .map(|t| t.dtype)
        .collect();
    assert!(
        dtypes.iter().all(|d| *d == checkpoint::Dtype::BF16),
        "{dtypes:?}"
    );
    Ok(())
}

#[test]
fn a_directory_that_cannot_be_made_is_an_error_and_writes_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"not a directory")?;
    let (tree, scope, _) = model(1.0)?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &scratch())?;
    let err = plan
        .save_shards(
            &SingleProcess,
            &tree,
            blocker.join("ckpt"),
            &SaveOptions::new(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Checkpoint(_)), "{err:?}");
    assert_eq!(std::fs::read(&blocker)?, b"not a directory");
    Ok(())
}

#[test]
fn the_manager_keeps_the_last_k_and_a_failed_save_leaves_the_previous_latest() -> R {
    use scopetree::ranks::CheckpointManager;
    let dir = tempfile::tempdir()?;
    let (mut tree, scope, vars) = model(1.0)?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &scratch())?;
    let manager = CheckpointManager::new(dir.path(), 2)?;
    assert!(manager.latest()?.is_none());
    for step in [10, 20, 30] {
        tree.get_mut::<Vec<f32>>(vars[1])?.fill(step as f32);
        manager.save(&SingleProcess, &mut plan, &tree, step, &SaveOptions::new())?;
    }
    assert_eq!(manager.steps()?, [20, 30]);
    assert_eq!(manager.latest()?.map(|(s, _)| s), Some(30));

    // A save that cannot write (its directory is a file) fails, and the
    // pointer still names step 30, which loads.
    std::fs::write(manager.step_dir(40), b"in the way")?;
    tree.get_mut::<Vec<f32>>(vars[1])?.fill(40.0);
    let err = manager
        .save(&SingleProcess, &mut plan, &tree, 40, &SaveOptions::new())
        .unwrap_err();
    assert!(matches!(err, Error::Checkpoint(_)), "{err:?}");
    assert_eq!(manager.latest()?.map(|(s, _)| s), Some(30));
    let (step, _) = manager
        .load_latest(&SingleProcess, &mut plan, &mut tree)?
        .ok_or("a checkpoint")?;
    assert_eq!(step, 30);
    assert_eq!(tree.get::<Vec<f32>>(vars[1])?, &[30.0; 3]);

    // A save stopped before its index (a shard, no index) is left out of
    // the steps, and the next save removes it with the old ones.
    std::fs::remove_file(manager.step_dir(40))?;
    std::fs::create_dir(manager.step_dir(35))?;
    std::fs::write(
        manager
            .step_dir(35)
            .join("model-00001-of-00001.safetensors"),
        b"torn",
    )?;
    assert_eq!(manager.steps()?, [20, 30]);
    manager.save(&SingleProcess, &mut plan, &tree, 50, &SaveOptions::new())?;
    assert_eq!(manager.steps()?, [30, 50]);
    assert!(!manager.step_dir(35).exists() && !manager.step_dir(20).exists());
    Ok(())
}

/// Saves `model(1.0)` with `save_shards` into a new directory, then
/// rewrites its one shard as `change` makes it.
fn saved_and_changed(
    change: impl FnOnce(&mut Vec<u8>) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<tempfile::TempDir, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let (tree, scope, _) = model(1.0)?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &scratch())?;
    let saved = plan.save_shards(&SingleProcess, &tree, dir.path(), &SaveOptions::new())?;
    let shard = dir.path().join(&saved.shards[0]);
    let mut bytes = std::fs::read(&shard)?;
    change(&mut bytes)?;
    std::fs::write(&shard, &bytes)?;
    Ok(dir)
}

/// The error of `load_shards` of `dir` into `model(5.0)`, once checked
/// that the failed load changed no value.
fn failed_load(dir: &Path) -> Result<Error, Box<dyn std::error::Error>> {
    let (mut other, scope, vars) = model(5.0)?;
    let mut plan = SyncPlan::new(&SingleProcess, &other, scope, &scratch())?;
    let before = values(&other, &vars)?;
    let err = plan
        .load_shards(&SingleProcess, &mut other, dir)
        .unwrap_err();
    assert_eq!(values(&other, &vars)?, before, "{err}");
    Ok(err)
}

/// A shard whose data bytes were changed after the save (its header
/// intact) is found by the checksums the save wrote, and the load changes
/// nothing.
#[test]
fn a_corrupted_shard_is_found_by_its_checksums_and_changes_nothing() -> R {
    let dir = saved_and_changed(|bytes| {
        let last = bytes.len() - 1; // the last byte of the last tensor's data
        bytes[last] ^= 0x40;
        Ok(())
    })?;
    let err = failed_load(dir.path())?;
    assert!(matches!(err, Error::Corrupted { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("enc/w") && msg.contains("corrupted"), "{msg}");

    // bf16 shards carry the checksum of every tensor as written: of the
    // converted bytes, which a loader checks before it converts them.
    let (tree, scope, _) = model(1.0)?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &scratch())?;
    let bf = tempfile::tempdir()?;
    plan.save_shards(
        &SingleProcess,
        &tree,
        bf.path(),
        &SaveOptions::new().floats_as(FloatDtype::BF16),
    )?;
    let file = bf.path().join("model-00001-of-00001.safetensors");
    let text = std::fs::read(&file)?;
    let header_len = u64::from_le_bytes(text[..8].try_into()?) as usize;
    let header: serde_json::Value = serde_json::from_slice(&text[8..8 + header_len])?;
    let data = &text[8 + header_len..];
    for t in checkpoint::inspect(&file)? {
        assert_eq!(t.dtype, checkpoint::Dtype::BF16, "{}", t.key);
        let sum = xxhash_rust::xxh3::xxh3_128(&data[t.begin as usize..t.end as usize]);
        let recorded = &header["__metadata__"][format!("scopetree_xxh3/{}", t.key)];
        assert_eq!(
            recorded.as_str(),
            Some(format!("{sum:032x}").as_str()),
            "{}",
            t.key
        );
    }
    Ok(())
}

/// A shard whose metadata lost the checksum of one tensor (its key changed
/// by a byte), while it records the others', is refused: that tensor could
/// not be checked, so its bytes, changed too here, never reach the tree.
#[test]
fn a_tensor_whose_checksum_entry_is_gone_is_refused_and_changes_nothing() -> R {
    let dir = saved_and_changed(|bytes| {
        let entry = b"scopetree_xxh3/enc/w";
        let at = (bytes.windows(entry.len()))
            .position(|w| w == entry)
            .ok_or("no checksum entry")?;
        bytes[at + 1] = b'C'; // "sCopetree_xxh3/enc/w": an unknown entry now
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        Ok(())
    })?;
    let err = failed_load(dir.path())?;
    let msg = err.to_string();
    assert!(
        matches!(
            &err,
            Error::Checkpoint(checkpoint::Error::BadFile {
                problem: checkpoint::BadFile::MissingChecksum { key },
                ..
            }) if key == "enc/w"
        ),
        "{err:?}"
    );
    assert!(msg.contains("enc/w") && msg.contains("checksums"), "{msg}");
    Ok(())
}

/// A save beside training writes what `save_shards` writes, from a copy
/// taken when it started, and reuses its staging buffers from save to save.
#[test]
fn an_async_save_writes_the_state_it_started_with() -> R {
    use scopetree::ranks::AsyncSaver;
    let dir = tempfile::tempdir()?;
    let (mut tree, scope, vars) = model(1.0)?;
    let want = values(&tree, &vars)?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &scratch())?;
    let mut saver = AsyncSaver::new();
    saver.save(
        &SingleProcess,
        &mut plan,
        &tree,
        dir.path().join("a"),
        &SaveOptions::new(),
    )?;
    assert!(saver.is_pending());
    // Training goes on while the shard is written.
    tree.get_mut::<Vec<f32>>(vars[1])?.fill(-3.0);
    let done = saver.wait(&SingleProcess)?.ok_or("a save under way")?;
    assert!(!saver.is_pending());
    assert_eq!(done.bytes, 68);
    assert_eq!(saver.staging_bytes(), 68, "this rank's part only");
    plan.save_shards(
        &SingleProcess,
        &tree,
        dir.path().join("b"),
        &SaveOptions::new(),
    )?;
    assert_eq!(
        weight_map(&dir.path().join("a"))?,
        weight_map(&dir.path().join("b"))?
    );

    let (mut t, s, v) = model(0.0)?;
    let mut p = SyncPlan::new(&SingleProcess, &t, s, &scratch())?;
    p.load_shards(&SingleProcess, &mut t, dir.path().join("a"))?;
    assert_eq!(
        values(&t, &v)?[..13],
        want[..13],
        "the state when the save started"
    );

    // The next save finishes nothing new and keeps the buffers.
    saver.save(
        &SingleProcess,
        &mut plan,
        &tree,
        dir.path().join("c"),
        &SaveOptions::new(),
    )?;
    saver.wait(&SingleProcess)?;
    assert_eq!(saver.staging_bytes(), 68);
    assert!(saver.wait(&SingleProcess)?.is_none());
    Ok(())
}

/// A background write that fails is reported by the next wait; the
/// manager's pointer still names the previous checkpoint, which loads.
#[test]
fn a_failed_background_write_is_reported_at_the_wait_and_the_latest_stays() -> R {
    use scopetree::ranks::{AsyncSaver, CheckpointManager};
    let dir = tempfile::tempdir()?;
    let (mut tree, scope, vars) = model(1.0)?;
    let mut plan = SyncPlan::new(&SingleProcess, &tree, scope, &scratch())?;
    let manager = CheckpointManager::new(dir.path(), 2)?;
    let mut saver = AsyncSaver::new();
    saver.save_managed(
        &SingleProcess,
        &manager,
        &mut plan,
        &tree,
        1,
        &SaveOptions::new(),
    )?;
    assert!(manager.latest()?.is_none(), "not visible before the wait");
    saver.wait(&SingleProcess)?;
    assert_eq!(manager.latest()?.map(|(s, _)| s), Some(1));

    // Step 2's shard cannot be written: a directory stands at its path.
    let blocked = manager.step_dir(2).join("model-00001-of-00001.safetensors");
    std::fs::create_dir_all(blocked.join("in-the-way"))?;
    tree.get_mut::<Vec<f32>>(vars[1])?.fill(2.0);
    saver.save_managed(
        &SingleProcess,
        &manager,
        &mut plan,
        &tree,
        2,
        &SaveOptions::new(),
    )?;
    let err = saver.wait(&SingleProcess).unwrap_err();
    assert!(matches!(err, Error::Checkpoint(_)), "{err:?}");
    assert_eq!(manager.latest()?.map(|(s, _)| s), Some(1));
    assert!(
        !manager
            .step_dir(2)
            .join("model.safetensors.index.json")
            .exists()
    );
    let (step, _) = manager
        .load_latest(&SingleProcess, &mut plan, &mut tree)?
        .ok_or("a checkpoint")?;
    assert_eq!(step, 1);
    assert_eq!(tree.get::<Vec<f32>>(vars[1])?, &[0.5, -1.0, 2.0]);
    Ok(())
}
