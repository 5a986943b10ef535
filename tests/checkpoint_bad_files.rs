//! Checkpoints: malformed files. Each listed malformation is a clear error
//! and leaves the tree unchanged; a proptest mutates valid files (truncate,
//! flip, splice bytes in header and data) and checks that every load either
//! fails leaving the tree unchanged or loads exactly what the file holds.
//! A second proptest does the same to sharded checkpoints: bytes of the
//! index or a shard mutated, a shard deleted or reused, names moved, added,
//! given twice, or copied into a shard the index does not assign them to;
//! a load that succeeds holds the bytes of the shard the index names.

#[path = "support/bad_files_model.rs"]
mod bad_files_model;
#[path = "support/mutations.rs"]
mod mutations;

use std::path::Path;

use bad_files_model::model;
use mutations::{Mutation, apply, mutation};
use proptest::prelude::*;
use scopetree::checkpoint::{
    self, BadFile, Checkpointable, Error, LoadOptions, SaveOptions, Tensor,
};
use scopetree::{ScopeTree, VarId};

/// Each variable's key and bytes.
fn state(t: &ScopeTree, [a, b, c]: [VarId; 3]) -> Vec<(String, Vec<u8>)> {
    vec![
        (
            "a".into(),
            t.get::<Vec<f32>>(a).unwrap().le_bytes().into_owned(),
        ),
        (
            "s/b".into(),
            t.get::<Tensor<i16>>(b).unwrap().le_bytes().into_owned(),
        ),
        (
            "s/c".into(),
            t.get::<Vec<u8>>(c).unwrap().le_bytes().into_owned(),
        ),
    ]
}

fn valid_file() -> Vec<u8> {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("v");
    let (t, _) = model(true);
    checkpoint::save(&t, t.root(), &p, &SaveOptions::new()).unwrap();
    std::fs::read(&p).unwrap()
}

/// A file from a header text and data bytes.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Loads `bytes` into a filled model; returns the error after checking that
/// the tree did not change.
fn load_err(bytes: &[u8]) -> Error {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("bad.safetensors");
    std::fs::write(&p, bytes).unwrap();
    let (mut t, vars) = model(false);
    let before = state(&t, vars);
    let counts = (t.scope_count(), t.var_count());
    let root = t.root();
    let err = checkpoint::load(&mut t, root, &p, &LoadOptions::new().create(true))
        .expect_err("a malformed file must not load");
    assert_eq!(
        state(&t, vars),
        before,
        "tree changed by a failed load: {err}"
    );
    assert_eq!((t.scope_count(), t.var_count()), counts);
    let msg = err.to_string();
    assert!(msg.contains("bad.safetensors"), "{msg}");
    assert!(msg.len() < 700, "message too long: {} bytes", msg.len());
    err
}

fn problem(bytes: &[u8]) -> BadFile {
    match load_err(bytes) {
        Error::BadFile { problem, .. } => problem,
        other => panic!("expected BadFile, got {other}"),
    }
}

const GOOD_A: &str = r#""a":{"dtype":"F32","shape":[5],"data_offsets":[0,20]}"#;

#[test]
fn an_empty_file() {
    assert_eq!(problem(b""), BadFile::Empty);
}

#[test]
fn a_file_shorter_than_the_header_length() {
    assert_eq!(problem(b"\x05\0\0"), BadFile::TooShort { len: 3 });
}

#[test]
fn a_header_length_past_the_end() {
    let mut f = valid_file();
    let len = f.len() as u64;
    f[..8].copy_from_slice(&(len).to_le_bytes());
    assert!(
        matches!(problem(&f), BadFile::HeaderPastEnd { header_len, file_len } if header_len == len && file_len == len)
    );
    f[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(problem(&f), BadFile::HeaderPastEnd { .. }));
}

#[test]
fn a_header_that_is_not_utf8() {
    let mut f = valid_file();
    f[9] = 0xff;
    assert_eq!(problem(&f), BadFile::NotUtf8 { at: 1 });
}

#[test]
fn a_header_that_is_not_json() {
    assert!(matches!(
        problem(&file("{\"a\":", &[])),
        BadFile::BadJson { .. }
    ));
    assert!(matches!(
        problem(&file("[1,2]", &[])),
        BadFile::BadJson { .. }
    ));
    let err = load_err(&file("{\"a\":", &[]));
    assert!(err.to_string().contains("is not valid JSON"), "{err}");
}

#[test]
fn an_entry_without_offsets_or_with_a_bad_dtype() {
    let h = r#"{"a":{"dtype":"F32","shape":[5]}}"#;
    assert!(matches!(problem(&file(h, &[0; 20])), BadFile::BadEntry { key, .. } if key == "a"));
    let h = r#"{"a":{"dtype":"F33","shape":[5],"data_offsets":[0,20]}}"#;
    assert!(matches!(
        problem(&file(h, &[0; 20])),
        BadFile::BadEntry { .. }
    ));
    let h = r#"{"a":{"dtype":"F32","shape":[-5],"data_offsets":[0,20]}}"#;
    assert!(matches!(
        problem(&file(h, &[0; 20])),
        BadFile::BadEntry { .. }
    ));
    let h = r#"{"__metadata__":{"k":1}}"#;
    assert!(matches!(problem(&file(h, &[])), BadFile::BadEntry { .. }));
}

/// The header is read in one pass: an entry of the wrong form after good
/// ones is that entry's problem, named by its own key, while a header that
/// ends inside an entry is broken JSON, not a bad entry.
#[test]
fn a_bad_entry_is_named_by_its_key_and_a_cut_entry_is_bad_json() {
    let h = format!(r#"{{{GOOD_A},"b":{{"dtype":"F32","shape":"five"}}}}"#);
    assert!(
        matches!(problem(&file(&h, &[0; 20])), BadFile::BadEntry { ref key, .. } if key == "b"),
        "{h}"
    );
    let h = format!(r#"{{{GOOD_A},"b":{{"dtype":"F3"#);
    assert!(
        matches!(problem(&file(&h, &[0; 20])), BadFile::BadJson { .. }),
        "{h}"
    );
}

#[test]
fn a_duplicate_key() {
    let h = format!(
        "{{{GOOD_A},{}}}",
        r#""a":{"dtype":"F32","shape":[5],"data_offsets":[20,40]}"#
    );
    assert_eq!(
        problem(&file(&h, &[0; 40])),
        BadFile::DuplicateKey { key: "a".into() }
    );
}

#[test]
fn offsets_out_of_range() {
    let h = r#"{"a":{"dtype":"F32","shape":[5],"data_offsets":[0,20]}}"#;
    assert!(matches!(
        problem(&file(h, &[0; 12])),
        BadFile::OutOfRange {
            end: 20,
            data_len: 12,
            ..
        }
    ));
    let h = r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}"#;
    assert!(matches!(
        problem(&file(h, &[0; 12])),
        BadFile::OutOfRange { .. }
    ));
    let h = r#"{"a":{"dtype":"F32","shape":[5],"data_offsets":[18446744073709551600,18446744073709551615]}}"#;
    assert!(matches!(
        problem(&file(h, &[0; 12])),
        BadFile::OutOfRange { .. }
    ));
}

#[test]
fn overlapping_ranges() {
    let h = format!(
        "{{{GOOD_A},{}}}",
        r#""s/c":{"dtype":"U8","shape":[4],"data_offsets":[16,20]}"#
    );
    assert!(matches!(
        problem(&file(&h, &[0; 20])),
        BadFile::Overlap { .. }
    ));
}

#[test]
fn holes_between_or_after_tensors() {
    let h = format!(
        "{{{}}}",
        r#""a":{"dtype":"F32","shape":[5],"data_offsets":[4,24]}"#
    );
    assert_eq!(
        problem(&file(&h, &[0; 24])),
        BadFile::Hole { at: 0, len: 4 }
    );
    let h = format!("{{{GOOD_A}}}");
    assert_eq!(
        problem(&file(&h, &[0; 27])),
        BadFile::Hole { at: 20, len: 7 }
    );
}

#[test]
fn a_shape_that_disagrees_with_its_range() {
    let h = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,20]}}"#;
    assert!(matches!(
        problem(&file(h, &[0; 20])),
        BadFile::SizeMismatch { bytes: 20, .. }
    ));
    // 10^12 elements declared over 20 bytes: rejected before any allocation.
    let h = r#"{"a":{"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,20]}}"#;
    let p = problem(&file(h, &[0; 20]));
    assert!(
        matches!(&p, BadFile::SizeMismatch { shape, .. } if shape == &[1_000_000, 1_000_000]),
        "{p}"
    );
    // A shape whose product overflows.
    let h = r#"{"a":{"dtype":"F32","shape":[18446744073709551615,18446744073709551615,4],"data_offsets":[0,20]}}"#;
    assert!(matches!(
        problem(&file(h, &[0; 20])),
        BadFile::SizeMismatch { .. }
    ));
}

#[test]
fn a_truncated_file() {
    let f = valid_file();
    for cut in [f.len() - 1, f.len() - 9, 20, 9, 8] {
        let err = load_err(&f[..cut]);
        assert!(matches!(err, Error::BadFile { .. }), "cut {cut}: {err}");
    }
}

#[test]
fn a_long_key_keeps_the_message_short() {
    let key = "k".repeat(100_000);
    let h = format!(r#"{{"{key}":{{"dtype":"F32","shape":[4],"data_offsets":[0,20]}}}}"#);
    let err = load_err(&file(&h, &[0; 20]));
    assert!(err.to_string().len() < 700);
}

#[test]
fn a_valid_file_loads_exactly() {
    let f = valid_file();
    check_mutated(&f);
}

/// Loads `bytes` into a zero model: an error must leave the tree unchanged;
/// success must leave every variable holding exactly the file's bytes.
fn check_mutated(bytes: &[u8]) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.safetensors");
    std::fs::write(&p, bytes).unwrap();
    let (mut t, vars) = model(false);
    let before = state(&t, vars);
    let root = t.root();
    match checkpoint::load(&mut t, root, &p, &LoadOptions::new()) {
        Err(_) => assert_eq!(state(&t, vars), before),
        Ok(report) => {
            assert_eq!(report.loaded.len(), 3);
            assert_eq!(state(&t, vars), file_values(&p, bytes));
        }
    }
    // Creating into an empty tree: on error the tree stays empty.
    let mut e = ScopeTree::new();
    let root = e.root();
    if checkpoint::load(&mut e, root, &p, &LoadOptions::new().create(true)).is_err() {
        assert_eq!((e.scope_count(), e.var_count()), (1, 0));
    }
}

/// Each key's bytes as the file declares them.
fn file_values(p: &Path, bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let start = 8 + n;
    let mut out: Vec<_> = checkpoint::inspect(p)
        .unwrap()
        .into_iter()
        .map(|f| {
            (
                f.key,
                bytes[start + f.begin as usize..start + f.end as usize].to_vec(),
            )
        })
        .collect();
    out.sort();
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn mutated_files_fail_cleanly_or_load_exactly(ms in prop::collection::vec(mutation(), 1..4)) {
        let mut f = valid_file();
        for m in &ms {
            f = apply(f, m);
        }
        check_mutated(&f);
    }
}

// Sharded checkpoints: the index and its shards, mutated byte by byte and
// edited in the ways real indexes go wrong (a shard deleted, a name moved
// to another shard, a name added, a name given twice, a tensor copied into
// a shard the index does not assign it to).

const INDEX: &str = "model.safetensors.index.json";

/// A valid sharded checkpoint of the model, one tensor a shard: its files'
/// names and bytes, the index first.
fn valid_sharded() -> Vec<(String, Vec<u8>)> {
    let d = tempfile::tempdir().unwrap();
    let (t, _) = model(true);
    let r = checkpoint::save_sharded(
        &t,
        t.root(),
        d.path(),
        &SaveOptions::new().max_shard_size(0),
    )
    .unwrap();
    std::iter::once(INDEX.to_owned())
        .chain(r.shards)
        .map(|n| {
            let bytes = std::fs::read(d.path().join(&n)).unwrap();
            (n, bytes)
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Edit {
    /// Mutate the bytes of file `k` (0: the index).
    Bytes(usize, Mutation),
    /// Delete shard `k`.
    RemoveShard(usize),
    /// Assign key `k` to shard `s` in the index.
    Reassign(usize, usize),
    /// Add an unknown name, assigned to shard `s`.
    AddName(usize),
    /// Give key `k` a second entry, for shard `s`, first in the map.
    Duplicate(usize, usize),
    /// Copy shard `a` over shard `b` (a reused shard).
    CopyShard(usize, usize),
    /// Rewrite shard `s` to hold, beside its own tensor, another value of
    /// key `k` (a stale copy the index does not assign there).
    Stray(usize, usize),
}

const KEYS: [&str; 3] = ["a", "s/b", "s/c"];

fn edit(files: &mut Vec<(String, Vec<u8>)>, e: &Edit) {
    let shard = |s: usize| 1 + s % 3;
    let index = || -> serde_json::Value {
        serde_json::from_slice(&files[0].1).unwrap_or(serde_json::Value::Null)
    };
    match e {
        Edit::Bytes(k, m) => {
            let k = k % files.len();
            files[k].1 = apply(std::mem::take(&mut files[k].1), m);
        }
        Edit::RemoveShard(s) if files.len() > 1 => {
            files.remove(1 + s % (files.len() - 1));
        }
        Edit::RemoveShard(_) => {}
        Edit::Reassign(k, s) | Edit::AddName(s @ k) => {
            let mut v = index();
            let name = if matches!(e, Edit::AddName(_)) {
                "s/zz"
            } else {
                KEYS[k % 3]
            };
            if let Some(map) = v.get_mut("weight_map").and_then(|m| m.as_object_mut()) {
                map.insert(
                    name.into(),
                    format!("model-{:05}-of-00003.safetensors", shard(*s)).into(),
                );
            }
            files[0].1 = serde_json::to_vec(&v).unwrap();
        }
        Edit::Duplicate(k, s) => {
            let text = String::from_utf8_lossy(&files[0].1).into_owned();
            let entry = format!(
                "\"weight_map\": {{\"{}\": \"model-{:05}-of-00003.safetensors\",",
                KEYS[k % 3],
                shard(*s)
            );
            files[0].1 = text.replacen("\"weight_map\": {", &entry, 1).into_bytes();
        }
        Edit::Stray(k, s) => {
            let (key, s) = (KEYS[k % 3], shard(*s));
            if s < files.len() {
                if let Some(bytes) = with_stray(&files[s].1, key) {
                    files[s].1 = bytes;
                }
            }
        }
        Edit::CopyShard(a, b) => {
            let (a, b) = (shard(*a), shard(*b));
            if a < files.len() && b < files.len() {
                files[b].1 = files[a].1.clone();
            }
        }
    }
}

fn sharded_edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (0..4_usize, mutation()).prop_map(|(k, m)| Edit::Bytes(k, m)),
        1 => (0..3_usize).prop_map(Edit::RemoveShard),
        1 => (0..3_usize, 0..3_usize).prop_map(|(k, s)| Edit::Reassign(k, s)),
        1 => (0..3_usize).prop_map(Edit::AddName),
        1 => (0..3_usize, 0..3_usize).prop_map(|(k, s)| Edit::Duplicate(k, s)),
        1 => (0..3_usize, 0..3_usize).prop_map(|(a, b)| Edit::CopyShard(a, b)),
        1 => (0..3_usize, 0..3_usize).prop_map(|(k, s)| Edit::Stray(k, s)),
    ]
}

/// `shard` rewritten with a stale value (all bytes 0x11, of the model's
/// dtype and shape) of `key` beside its own tensors, keeping its metadata;
/// `None` if the shard does not read or already holds `key`.
fn with_stray(shard: &[u8], key: &str) -> Option<Vec<u8>> {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("s");
    std::fs::write(&p, shard).unwrap();
    let mut t = ScopeTree::new();
    let root = t.root();
    checkpoint::load(&mut t, root, &p, &LoadOptions::new().create(true)).ok()?;
    let comps: Vec<&str> = key.split('/').collect();
    let mut s = root;
    for c in &comps[..comps.len() - 1] {
        s = match t.kid(s, *c).unwrap() {
            Some(k) => k,
            None => t.new_named_scope(s, *c).unwrap(),
        };
    }
    let v = t.create_var(s, comps[comps.len() - 1]).ok()?;
    match key {
        "a" => t.set(v, vec![f32::from_le_bytes([0x11; 4]); 5]),
        "s/b" => t.set(v, Tensor::new(vec![2, 3], vec![0x1111_i16; 6]).unwrap()),
        _ => t.set(v, vec![0x11_u8; 4]),
    }
    .unwrap();
    let n = u64::from_le_bytes(shard[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&shard[8..8 + n]).ok()?;
    let meta = header["__metadata__"]
        .as_object()?
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    checkpoint::save(&t, root, &p, &SaveOptions::new().metadata(meta)).ok()?;
    Some(std::fs::read(&p).unwrap())
}

/// Each key's bytes as the index and its shards declare them: read from
/// the shard the index assigns it to.
fn sharded_values(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = checkpoint::inspect(dir)
        .unwrap()
        .into_iter()
        .map(|f| {
            let bytes = std::fs::read(dir.join(f.shard.as_deref().unwrap())).unwrap();
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let start = 8 + n;
            (
                f.key,
                bytes[start + f.begin as usize..start + f.end as usize].to_vec(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Loads the edited checkpoint into a zero model (strict, then lenient):
/// an error leaves the tree unchanged; a success leaves each variable
/// holding the bytes of the shard the index assigns it to.
fn check_sharded(files: &[(String, Vec<u8>)]) {
    let d = tempfile::tempdir().unwrap();
    for (n, bytes) in files {
        std::fs::write(d.path().join(n), bytes).unwrap();
    }
    for opts in [LoadOptions::new(), LoadOptions::new().allow_unused(true)] {
        let (mut t, vars) = model(false);
        let before = state(&t, vars);
        let root = t.root();
        match checkpoint::load(&mut t, root, d.path(), &opts) {
            Err(e) => {
                assert_eq!(state(&t, vars), before, "{e}");
                assert!(e.to_string().len() < 2_000, "{e}");
            }
            Ok(report) => {
                assert_eq!(report.loaded.len(), 3);
                assert_eq!(state(&t, vars), sharded_values(d.path()));
            }
        }
    }
    let mut e = ScopeTree::new();
    let root = e.root();
    if checkpoint::load(&mut e, root, d.path(), &LoadOptions::new().create(true)).is_err() {
        assert_eq!((e.scope_count(), e.var_count()), (1, 0));
    }
}

#[test]
fn a_valid_sharded_checkpoint_loads_exactly() {
    check_sharded(&valid_sharded());
    let (mut t, vars) = model(false);
    let d = tempfile::tempdir().unwrap();
    for (n, bytes) in valid_sharded() {
        std::fs::write(d.path().join(n), bytes).unwrap();
    }
    let root = t.root();
    checkpoint::load(&mut t, root, d.path(), &LoadOptions::new()).unwrap();
    let (full, full_vars) = model(true);
    assert_eq!(state(&t, vars), state(&full, full_vars));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn edited_sharded_checkpoints_fail_cleanly_or_load_exactly(
        edits in prop::collection::vec(sharded_edit(), 1..4)
    ) {
        let mut files = valid_sharded();
        for e in &edits {
            edit(&mut files, e);
        }
        check_sharded(&files);
    }
}
