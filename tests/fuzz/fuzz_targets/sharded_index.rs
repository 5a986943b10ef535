//! Any bytes as the index of a sharded checkpoint whose shards are whole
//! (a tensor each, of the model's values): `inspect` of the directory and
//! a strict load into the model with other values. The load fails, leaving
//! the tree as it was, with a short message, or holds the saved values: an
//! index can only name the shards' tensors, never change their bytes.

#![no_main]

mod common;

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use scopetree::checkpoint::{self, LoadOptions};

/// The shards, saved once; each input overwrites the index.
static DIR: LazyLock<tempfile::TempDir> = LazyLock::new(|| {
    let dir = tempfile::tempdir().unwrap();
    common::save_sharded(dir.path());
    dir
});

fuzz_target!(|index: &[u8]| {
    let dir = DIR.path();
    std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
    let _ = common::failed(&checkpoint::inspect(dir));

    let (mut t, vars) = common::model(false);
    let before = common::state(&t, vars);
    let root = t.root();
    let loaded = checkpoint::load(&mut t, root, dir, &LoadOptions::new());
    if common::failed(&loaded) {
        assert_eq!(
            common::state(&t, vars),
            before,
            "a failed load changed the tree"
        );
    } else {
        let (saved, saved_vars) = common::model(true);
        assert_eq!(common::state(&t, vars), common::state(&saved, saved_vars));
    }
});
