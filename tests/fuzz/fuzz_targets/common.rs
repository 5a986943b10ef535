//! The model the fuzzed checkpoints load into, its observable state, and
//! the checks every load must pass, whatever the bytes.

// Each target uses a part of it.
#![allow(dead_code)]

use std::sync::LazyLock;

use libfuzzer_sys::arbitrary::{self, Arbitrary};

use scopetree::checkpoint::{
    self, Checkpointable, DtypePolicy, FileTensor, FloatDtype, LoadOptions, Tensor,
};
use scopetree::{ScopeTree, VarId};

#[path = "../../support/bad_files_model.rs"]
mod bad_files_model;
pub use bad_files_model::model;

/// What a load may change: each model variable's bytes, the counts of
/// scopes and variables, and the dump of the whole tree (names, types).
#[derive(Debug, PartialEq)]
pub struct State {
    bytes: Vec<Vec<u8>>,
    counts: (usize, usize),
    dump: String,
}

/// The tree's [`State`].
pub fn state(t: &ScopeTree, [a, b, c]: [VarId; 3]) -> State {
    State {
        bytes: vec![
            t.get::<Vec<f32>>(a).unwrap().le_bytes().into_owned(),
            t.get::<Tensor<i16>>(b).unwrap().le_bytes().into_owned(),
            t.get::<Vec<u8>>(c).unwrap().le_bytes().into_owned(),
        ],
        counts: (t.scope_count(), t.var_count()),
        dump: t.dump(t.root()).unwrap().to_string(),
    }
}

/// A failed load's error: its message under 1,000 bytes whatever the
/// input.
pub fn check_error(e: &impl std::fmt::Display) {
    let msg = e.to_string();
    assert!(
        msg.len() < 1000,
        "a message of {} bytes: {msg:.300}",
        msg.len()
    );
}

/// After a load into the model succeeded: each model variable the file
/// declares holds the bytes the file has for it, read from `data` (a
/// file's bytes after its header); the others are as in `before`.
pub fn check_loaded(
    t: &ScopeTree,
    vars: [VarId; 3],
    before: &State,
    tensors: &[FileTensor],
    data: &[u8],
) {
    let now = state(t, vars);
    for (i, key) in ["a", "s/b", "s/c"].iter().enumerate() {
        let expected = match tensors.iter().find(|ft| ft.key == *key) {
            Some(ft) => &data[ft.begin as usize..ft.end as usize],
            None => before.bytes[i].as_slice(),
        };
        assert_eq!(now.bytes[i], expected, "{key}'s bytes");
    }
}

/// The data section of a single file: the bytes after its header, when
/// the header's length is within the file.
pub fn data_of(file: &[u8]) -> Option<&[u8]> {
    let len = u64::from_le_bytes(file.get(..8)?.try_into().ok()?);
    file.get(usize::try_from(len).ok()?.checked_add(8)?..)
}

/// Whether `r` is an error, checked as [`check_error`] checks it.
pub fn failed<T, E: std::fmt::Display>(r: &Result<T, E>) -> bool {
    match r {
        Ok(_) => false,
        Err(e) => {
            check_error(e);
            true
        }
    }
}

/// Saves the filled model as a sharded checkpoint into `dir`: a shard a
/// tensor, and the index.
pub fn save_sharded(dir: &std::path::Path) {
    let (t, _) = model(true);
    let opts = checkpoint::SaveOptions::new().max_shard_size(1);
    checkpoint::save_sharded(&t, t.root(), dir, &opts).unwrap();
}

/// Where each input is written (a `tmpfs` `TMPDIR` keeps it in memory).
static DIR: LazyLock<tempfile::TempDir> = LazyLock::new(|| tempfile::tempdir().unwrap());

/// `file` as a single-file checkpoint: `inspect`, then a strict load, a
/// creating load and a creating load converting floats to f32, each into
/// the model. A load fails, leaving the tree as it was, with a short
/// message, or succeeds on a file `inspect` accepts, the model's variables
/// holding exactly the file's bytes (the converting load excepted).
pub fn check_file(file: &[u8]) {
    let path = DIR.path().join("f.safetensors");
    std::fs::write(&path, file).unwrap();
    let declared = checkpoint::inspect(&path);
    let _ = failed(&declared);

    let converting = LoadOptions::new()
        .create(true)
        .allow_missing(true)
        .create_floats_as(FloatDtype::F32)
        .dtype_policy(DtypePolicy::Convert);
    let loads = [
        (LoadOptions::new(), true),
        (LoadOptions::new().create(true).allow_missing(true), true),
        (converting, false),
    ];
    for (opts, exact) in loads {
        let (mut t, vars) = model(false);
        let before = state(&t, vars);
        let root = t.root();
        let loaded = checkpoint::load(&mut t, root, &path, &opts);
        if failed(&loaded) {
            assert_eq!(state(&t, vars), before, "a failed load changed the tree");
            continue;
        }
        let tensors = declared.as_ref().expect("a file inspect rejects loaded");
        if exact {
            let data = data_of(file).expect("a loaded file has a data section");
            check_loaded(&t, vars, &before, tensors, data);
        }
    }
}

/// How an input changes a file of a saved checkpoint.
#[derive(Arbitrary, Debug)]
pub enum Change {
    /// Bytes written at offsets (taken modulo the file's length).
    Overwrite(Vec<(u16, u8)>),
    /// The file cut to this many bytes (modulo its length).
    Cut(u16),
    /// The file's bytes replaced.
    Replace(Vec<u8>),
}

/// `bytes` changed as `change` says.
pub fn changed(bytes: &[u8], change: &Change) -> Vec<u8> {
    let mut out = bytes.to_vec();
    match change {
        Change::Overwrite(at) => {
            for &(i, b) in at {
                let i = usize::from(i) % out.len();
                out[i] = b;
            }
        }
        Change::Cut(len) => out.truncate(usize::from(*len) % out.len()),
        Change::Replace(new) => out = new.clone(),
    }
    out
}

/// Whether the shard's metadata records any checksum
/// (`scopetree_xxh3/<key>`), as a loader sees it: then a loader checks
/// every tensor of it.
pub fn records_checksums(shard: &[u8]) -> bool {
    let header = data_of(shard).map_or(&[][..], |data| &shard[8..shard.len() - data.len()]);
    let Ok(serde_json::Value::Object(top)) = serde_json::from_slice(header) else {
        return false;
    };
    top.get("__metadata__")
        .and_then(serde_json::Value::as_object)
        .is_some_and(|m| m.keys().any(|k| k.starts_with("scopetree_xxh3/")))
}
