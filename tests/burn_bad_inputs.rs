//! Every bad input a `CheckpointStore` load meets, on burn's ndarray
//! backend: each is a clear error naming the file, and the module is
//! unchanged after it. Mismatches of every kind in one error; an index
//! naming a missing shard; a truncated shard; a tensor two shards hold; a
//! malformed index; a remapping that merges two names; bytes that fail
//! their checksum in the first shard and in a later one (with and without
//! `rollback`); messages bounded whatever the names. A proptest mutates a
//! saved file (cut, flipped, spliced bytes, header and data): each load
//! fails leaving the module unchanged, or loads exactly what the file
//! holds as the `safetensors` crate reads it.

#[path = "support/burn_models.rs"]
mod models;
#[path = "support/mutations.rs"]
mod mutations;

use std::path::{Path, PathBuf};

use burn_core as burn;
use burn_core::module::{Module, Param};
use burn_core::tensor::{DType, Device, Tensor, TensorData};
use burn_store::ModuleSnapshot;
use models::{Net, values};
use scopetree::burn::{CheckpointStore, Error};
use scopetree::checkpoint::{self, BadFile, BadIndex};

fn device() -> Device {
    Device::default()
}

/// A sharded checkpoint of `Net::new(1.0)`, one tensor a shard, in `dir`.
fn sharded(dir: &Path) -> PathBuf {
    let ck = dir.join("ck");
    Net::new(1.0, &device())
        .save_into(&mut CheckpointStore::sharded(&ck).max_shard_size(0))
        .unwrap();
    ck
}

/// The shard file that holds `key`, per the index.
fn shard_of(ck: &Path, key: &str) -> PathBuf {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    ck.join(index["weight_map"][key].as_str().unwrap())
}

/// Loads `ck` into a fresh `Net::new(0.0)` with `store`; asserts the
/// load fails and the module is unchanged; returns the error.
fn fails_unchanged(store: &mut CheckpointStore) -> Error {
    let mut net = Net::new(0.0, &device());
    let before = models::snapshot(&net);
    let err = net.load_from(store).unwrap_err();
    assert_eq!(
        models::snapshot(&net),
        before,
        "the failed load changed the module: {err}"
    );
    err
}

#[derive(Module, Debug)]
struct Four {
    a: Param<Tensor<1>>,
    b: Param<Tensor<2>>,
    c: Param<Tensor<1>>,
}

#[derive(Module, Debug)]
struct Other {
    b: Param<Tensor<2>>,
    c: Param<Tensor<1>>,
    d: Param<Tensor<1>>,
}

#[test]
fn one_error_names_every_mismatch_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.safetensors");
    let d = device();
    Other {
        b: Param::from_tensor(Tensor::ones([3, 2], &d)),
        c: Param::from_tensor(Tensor::from_data(
            TensorData::new(vec![1.0_f64; 4], [4]),
            (&d, DType::F64),
        )),
        d: Param::from_tensor(Tensor::ones([2], &d)),
    }
    .save_into(&mut CheckpointStore::from_file(&path))
    .unwrap();
    let four = || Four {
        a: Param::from_tensor(Tensor::zeros([2], &d)),
        b: Param::from_tensor(Tensor::zeros([2, 3], &d)),
        c: Param::from_tensor(Tensor::zeros([4], &d)),
    };
    let mut m = four();
    let before = values(&m);
    let err = m
        .load_from(&mut CheckpointStore::from_file(&path))
        .unwrap_err();
    assert_eq!(values(&m), before);
    let Error::Mismatch {
        path: shown,
        missing,
        unused,
        mismatched,
        unassigned,
    } = &err
    else {
        panic!("{err}")
    };
    assert!(shown.ends_with("other.safetensors"));
    assert_eq!(missing, &["a"]);
    assert_eq!(unused, &["d"]);
    assert!(unassigned.is_empty());
    let keys: Vec<_> = mismatched.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(keys, ["b", "c"]);
    assert_eq!(mismatched[0].file, "F32 [3, 2]");
    assert_eq!(mismatched[0].tree, "F32 [2, 3]");
    assert_eq!(mismatched[1].file, "F64 [4]");
    let msg = err.to_string();
    for part in [
        "other.safetensors",
        "missing from the checkpoint [a]",
        "not in the module [d]",
        "b: file F32 [3, 2], module F32 [2, 3]",
        "nothing was loaded",
    ] {
        assert!(msg.contains(part), "{part} not in {msg}");
    }

    // allow_missing and allow_unused accept those parts, not the mismatches.
    let err = m
        .load_from(
            &mut CheckpointStore::from_file(&path)
                .allow_missing(true)
                .allow_unused(true),
        )
        .unwrap_err();
    let Error::Mismatch {
        missing,
        unused,
        mismatched,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert!(missing.is_empty() && unused.is_empty());
    assert_eq!(mismatched.len(), 2);
    assert_eq!(values(&m), before);
}

#[test]
fn allow_missing_and_allow_unused_load_the_rest_and_report_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("four.safetensors");
    let d = device();
    Four {
        a: Param::from_tensor(Tensor::ones([2], &d)),
        b: Param::from_tensor(Tensor::ones([2, 3], &d)),
        c: Param::from_tensor(Tensor::ones([4], &d)),
    }
    .save_into(&mut CheckpointStore::from_file(&path))
    .unwrap();
    let mut other = Other {
        b: Param::from_tensor(Tensor::zeros([2, 3], &d)),
        c: Param::from_tensor(Tensor::zeros([4], &d)),
        d: Param::from_tensor(Tensor::zeros([2], &d)),
    };
    let err = other
        .load_from(&mut CheckpointStore::from_file(&path).allow_missing(true))
        .unwrap_err();
    assert!(
        matches!(&err, Error::Mismatch { unused, missing, .. } if unused == &["a"] && missing.is_empty()),
        "{err}"
    );
    let err = other
        .load_from(&mut CheckpointStore::from_file(&path).allow_unused(true))
        .unwrap_err();
    assert!(
        matches!(&err, Error::Mismatch { missing, unused, .. } if missing == &["d"] && unused.is_empty()),
        "{err}"
    );
    let r = other
        .load_from(
            &mut CheckpointStore::from_file(&path)
                .allow_missing(true)
                .allow_unused(true),
        )
        .unwrap();
    assert_eq!(r.applied, ["b", "c"]);
    assert_eq!(r.missing, [("d".to_owned(), "Struct:Other".to_owned())]);
    assert_eq!(r.unused, ["a"]);
    assert_eq!(
        other.b.val().into_data().try_into_vec::<f32>().unwrap(),
        [1.0; 6]
    );
    assert_eq!(
        other.d.val().into_data().try_into_vec::<f32>().unwrap(),
        [0.0; 2]
    );
}

#[test]
fn an_index_naming_a_missing_shard_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let ck = sharded(dir.path());
    let gone = shard_of(&ck, "blocks.1.b");
    std::fs::remove_file(&gone).unwrap();
    let err = fails_unchanged(&mut CheckpointStore::sharded(&ck));
    let Error::Checkpoint(checkpoint::Error::BadIndex {
        problem: BadIndex::MissingShard { file, keys },
        ..
    }) = &err
    else {
        panic!("{err}")
    };
    assert_eq!(file, gone.file_name().unwrap().to_str().unwrap());
    assert_eq!(keys, &["blocks.1.b"]);
    assert!(err.to_string().contains(file.as_str()), "{err}");
}

#[test]
fn a_truncated_shard_names_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let ck = sharded(dir.path());
    // The shard read last: still found before anything changes.
    let last = shard_of(&ck, "head");
    let len = std::fs::metadata(&last).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
    f.set_len(len - 5).unwrap();
    let err = fails_unchanged(&mut CheckpointStore::sharded(&ck));
    let Error::Checkpoint(checkpoint::Error::BadFile { path, problem }) = &err else {
        panic!("{err}")
    };
    assert!(
        path.ends_with(last.file_name().unwrap().to_str().unwrap()),
        "{err}"
    );
    assert!(
        matches!(problem, BadFile::OutOfRange { .. } | BadFile::Hole { .. }),
        "{err}"
    );
}

#[test]
fn a_tensor_that_two_shards_hold_is_named_with_its_shard() {
    let dir = tempfile::tempdir().unwrap();
    let ck = sharded(dir.path());
    // Rewrite the shard of `head` so that it also holds `blocks.0.b`, whose
    // shard is another: the copy is unassigned.
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let save_id = index["metadata"]["scopetree_save_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let head_shard = shard_of(&ck, "head");
    let mut tree = scopetree::ScopeTree::new();
    let root = tree.root();
    let head = tree.var(root, "head").unwrap();
    tree.set(
        head,
        checkpoint::Tensor::new(vec![8, 2], vec![9.0_f32; 16]).unwrap(),
    )
    .unwrap();
    let blocks = tree.new_named_scope(root, "blocks").unwrap();
    let zero = tree.new_named_scope(blocks, "0").unwrap();
    let b = tree.var(zero, "b").unwrap();
    tree.set(b, vec![7.0_f32; 8]).unwrap();
    let meta = [
        ("scopetree_save_id".to_owned(), save_id),
        ("format".to_owned(), "pt".to_owned()),
    ];
    checkpoint::save(
        &tree,
        root,
        &head_shard,
        &checkpoint::SaveOptions::new()
            .separator(checkpoint::Separator::Dot)
            .metadata(meta.into_iter().collect()),
    )
    .unwrap();
    let err = fails_unchanged(&mut CheckpointStore::sharded(&ck));
    let Error::Mismatch {
        unassigned,
        missing,
        unused,
        mismatched,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    let shard = head_shard.file_name().unwrap().to_str().unwrap().to_owned();
    assert_eq!(unassigned, &[("blocks.0.b".to_owned(), shard.clone())]);
    assert!(missing.is_empty() && unused.is_empty() && mismatched.is_empty());
    assert!(err.to_string().contains(&shard), "{err}");

    // The index decides: with allow_unused the copy is skipped, and the
    // shard the index names is the one read.
    let mut net = Net::new(0.0, &device());
    let r = net
        .load_from(&mut CheckpointStore::sharded(&ck).allow_unused(true))
        .unwrap();
    assert_eq!(r.unused, ["blocks.0.b"]);
    assert_eq!(values(&net)[0], values(&Net::new(1.0, &device()))[0]);

    // A name the index gives twice, with two shards, names both.
    let text = std::fs::read_to_string(ck.join("model.safetensors.index.json")).unwrap();
    let twice = text.replacen(
        "\"weight_map\": {",
        &format!(
            "\"weight_map\": {{\n    \"head\": \"{}\",",
            shard_of(&ck, "blocks.0.w")
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
        ),
        1,
    );
    std::fs::write(ck.join("model.safetensors.index.json"), twice).unwrap();
    let err = fails_unchanged(&mut CheckpointStore::sharded(&ck));
    let Error::Checkpoint(checkpoint::Error::BadIndex {
        problem: BadIndex::DuplicateName { key, first, second },
        ..
    }) = &err
    else {
        panic!("{err}")
    };
    assert_eq!(key, "head");
    assert_ne!(first, second);
    assert!(
        err.to_string().contains(first.as_str()) && err.to_string().contains(second.as_str()),
        "{err}"
    );
}

#[test]
fn a_malformed_index_and_a_missing_file_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let ck = sharded(dir.path());
    std::fs::write(
        ck.join("model.safetensors.index.json"),
        b"{\"weight_map\": [1, 2]}",
    )
    .unwrap();
    let err = fails_unchanged(&mut CheckpointStore::sharded(&ck));
    assert!(
        matches!(
            &err,
            Error::Checkpoint(checkpoint::Error::BadIndex {
                problem: BadIndex::BadJson { .. },
                ..
            })
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("model.safetensors.index.json"),
        "{err}"
    );
    let err = fails_unchanged(&mut CheckpointStore::from_file(
        dir.path().join("none.safetensors"),
    ));
    assert!(
        matches!(&err, Error::Checkpoint(checkpoint::Error::Io { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("none.safetensors"), "{err}");
}

#[test]
fn a_remapping_that_merges_two_names_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ck = sharded(dir.path());
    let store = CheckpointStore::sharded(&ck)
        .with_key_remapping(r"^blocks\.\d\.", "blocks.0.")
        .unwrap();
    let err = fails_unchanged(&mut { store });
    let Error::Collision {
        name,
        first,
        second,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(name, "blocks.0.b");
    assert_eq!(
        (first.as_str(), second.as_str()),
        ("blocks.0.b", "blocks.1.b")
    );
    assert!(matches!(
        CheckpointStore::sharded(&ck).with_key_remapping("(", ""),
        Err(Error::BadPattern { .. })
    ));
}

/// Flips one byte of the data of the shard holding `key`.
fn corrupt(ck: &Path, key: &str) -> PathBuf {
    let shard = shard_of(ck, key);
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&shard, bytes).unwrap();
    shard
}

#[test]
fn bytes_that_fail_their_checksum_in_the_first_shard_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ck = sharded(dir.path());
    let shard = corrupt(&ck, "blocks.0.b");
    let err = fails_unchanged(&mut CheckpointStore::sharded(&ck));
    let Error::Data {
        file,
        key,
        rolled_back,
        reason,
    } = &err
    else {
        panic!("{err}")
    };
    assert!(file.ends_with(shard.file_name().unwrap().to_str().unwrap()));
    assert_eq!(key, "blocks.0.b");
    assert!(*rolled_back);
    assert!(reason.contains("xxh3"), "{err}");
    assert!(err.to_string().contains("the module is as it was"), "{err}");
}

/// The keys of the one-file checkpoint at `path`, in the order of their
/// bytes in the file, with where their bytes start in it (safetensors'
/// own header parser).
fn keys_in_file_order(path: &Path) -> Vec<(String, usize)> {
    let bytes = std::fs::read(path).unwrap();
    let (n, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut keys: Vec<(String, usize)> = (meta.tensors().into_iter())
        .map(|(k, info)| (k, 8 + n + info.data_offsets.0))
        .collect();
    keys.sort_by_key(|(_, at)| *at);
    keys
}

/// With several tensors of one file failing their checksums, the error
/// names the first in the file, whichever check ends first (the checks run
/// on a second thread, behind the reads).
#[test]
fn of_two_bad_tensors_in_one_file_the_first_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("net.safetensors");
    Net::new(1.0, &device())
        .save_into(&mut CheckpointStore::from_file(&path))
        .unwrap();
    let keys = keys_in_file_order(&path);
    assert!(keys.len() >= 3, "{keys:?}");
    let mut bytes = std::fs::read(&path).unwrap();
    for (_, at) in [&keys[1], &keys[keys.len() - 1]] {
        bytes[*at] ^= 0x40;
    }
    std::fs::write(&path, bytes).unwrap();
    let err = fails_unchanged(&mut CheckpointStore::from_file(&path));
    let Error::Data { key, reason, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(key, &keys[1].0, "{err}");
    assert!(reason.contains("xxh3"), "{err}");
}

#[test]
fn a_failure_in_a_later_shard_is_rolled_back_with_rollback() {
    let dir = tempfile::tempdir().unwrap();
    let ck = sharded(dir.path());
    corrupt(&ck, "head");

    // Without rollback: the error says what was loaded.
    let mut net = Net::new(0.0, &device());
    let before = values(&net);
    let err = net
        .load_from(&mut CheckpointStore::sharded(&ck))
        .unwrap_err();
    assert!(
        matches!(&err, Error::Data { rolled_back: false, key, .. } if key == "head"),
        "{err}"
    );
    assert!(err.to_string().contains("rollback(true)"), "{err}");
    assert_ne!(values(&net), before);

    let err = fails_unchanged(&mut CheckpointStore::sharded(&ck).rollback(true));
    assert!(
        matches!(
            &err,
            Error::Data {
                rolled_back: true,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn messages_stay_short_whatever_the_names() {
    #[derive(Module, Debug)]
    struct Long {
        w: Param<Tensor<1>>,
    }
    let dir = tempfile::tempdir().unwrap();
    let long = "x".repeat(100_000);
    let path = dir.path().join("long.safetensors");
    Long {
        w: Param::from_tensor(Tensor::ones([3], &device())),
    }
    .save_into(
        &mut CheckpointStore::from_file(&path)
            .with_key_remapping("^w$", long.as_str())
            .unwrap(),
    )
    .unwrap();
    let mut m = Long {
        w: Param::from_tensor(Tensor::zeros([3], &device())),
    };
    let err = m
        .load_from(&mut CheckpointStore::from_file(&path))
        .unwrap_err();
    assert!(matches!(&err, Error::Mismatch { .. }), "{err}");
    assert!(
        err.to_string().len() < 700,
        "{} bytes",
        err.to_string().len()
    );
}

/// Asserts that the load that failed with `e` left `net` as `before`,
/// with a message under 1,000 bytes.
fn failed_cleanly(net: &Net, before: &[models::Snap], e: &Error) {
    assert_eq!(
        models::snapshot(net),
        before,
        "a failed load changed the module: {e}"
    );
    let shown = e.to_string();
    assert!(shown.len() < 1000, "{} bytes: {shown}", shown.len());
}

/// Loads the file `bytes` into a fresh `Net::new(0.0)`: a failure leaves it
/// unchanged, with a short message; a success leaves each of its tensors
/// holding the bytes the file gives that name, as the `safetensors` crate
/// reads the file.
fn check_mutated(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("net.safetensors");
    std::fs::write(&path, bytes).unwrap();
    let mut net = Net::new(0.0, &device());
    let before = models::snapshot(&net);
    match net.load_from(&mut CheckpointStore::from_file(&path)) {
        Err(e) => failed_cleanly(&net, &before, &e),
        Ok(_) => {
            let file = safetensors::SafeTensors::deserialize(bytes)
                .expect("a file the load took is one safetensors reads");
            for (name, dtype, shape, data) in values(&net) {
                let t = file
                    .tensor(&name)
                    .expect("every loaded name is in the file");
                assert_eq!(t.shape(), shape.as_slice(), "{name}");
                assert_eq!(
                    (t.dtype(), dtype),
                    (safetensors::Dtype::F32, DType::F32),
                    "{name}"
                );
                assert_eq!(t.data(), data.as_slice(), "{name}");
            }
        }
    }
}

/// The bytes of `Net::new(1.0)` saved as one file.
fn net_file() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("net.safetensors");
    Net::new(1.0, &device())
        .save_into(&mut CheckpointStore::from_file(&path))
        .unwrap();
    std::fs::read(&path).unwrap()
}

#[test]
fn the_unmutated_file_loads_exactly() {
    let bytes = net_file();
    check_mutated(&bytes);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("net.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    let mut net = Net::new(0.0, &device());
    net.load_from(&mut CheckpointStore::from_file(&path))
        .unwrap();
    assert_eq!(values(&net), values(&Net::new(1.0, &device())));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    #[test]
    fn mutated_files_fail_cleanly_or_load_exactly(
        ms in proptest::collection::vec(mutations::mutation(), 1..4)
    ) {
        check_mutated(&mutations::apply_all(net_file(), &ms));
    }
}

/// `Net::new(1.0)` saved sharded, a tensor a shard: each file's name and
/// bytes, the index first.
fn net_shards() -> Vec<(String, Vec<u8>)> {
    let dir = tempfile::tempdir().unwrap();
    let ck = sharded(dir.path());
    mutations::read_files(&ck)
}

/// Loads the sharded checkpoint `files` into a fresh `Net::new(0.0)` with
/// `rollback`: a failure leaves it unchanged, with a short message; a
/// success leaves each tensor holding the bytes of the shard the index
/// names for it.
fn check_sharded_mutated(files: &[(String, Vec<u8>)]) {
    let dir = tempfile::tempdir().unwrap();
    mutations::write_files(dir.path(), files);
    let mut net = Net::new(0.0, &device());
    let before = models::snapshot(&net);
    match net.load_from(&mut CheckpointStore::sharded(dir.path()).rollback(true)) {
        Err(e) => failed_cleanly(&net, &before, &e),
        Ok(_) => {
            let held = checkpoint::inspect(dir.path()).expect("a loaded checkpoint reads back");
            for (name, _, shape, data) in values(&net) {
                let t = held
                    .iter()
                    .find(|t| t.key == name)
                    .expect("every loaded name is in the index");
                let shard = std::fs::read(dir.path().join(t.shard.as_deref().unwrap())).unwrap();
                let n = u64::from_le_bytes(shard[..8].try_into().unwrap()) as usize;
                let range = 8 + n + t.begin as usize..8 + n + t.end as usize;
                assert_eq!(t.shape, shape, "{name}");
                assert_eq!(&shard[range], data.as_slice(), "{name}");
            }
        }
    }
}

#[test]
fn the_unmutated_sharded_checkpoint_loads_exactly() {
    let files = net_shards();
    assert_eq!(files.len(), 6, "the index and a shard per tensor");
    check_sharded_mutated(&files);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    #[test]
    fn mutated_sharded_checkpoints_fail_cleanly_with_rollback_or_load_exactly(
        file in 0..6_usize,
        ms in proptest::collection::vec(mutations::mutation(), 1..4)
    ) {
        let mut files = net_shards();
        files[file].1 = mutations::apply_all(std::mem::take(&mut files[file].1), &ms);
        check_sharded_mutated(&files);
    }
}
