//! A checkpoint that a plan saved at a world of one
//! (`SyncPlan::save_shards`: one shard whose metadata carries each
//! tensor's xxh3 checksum and the save's id, and the index), with one of
//! its two files changed by the input: bytes written over it, its end cut
//! off, or all of it replaced. A plan's `load_shards` into the model with
//! other values fails, leaving the tree as it was, with a short message,
//! or the model holds exactly the saved values: no change to the files
//! gets past the checksums and the checks of the headers and the index.
//! The one exception: a shard whose every checksum entry is gone reads as
//! a file another program wrote, which records none; a load of it must
//! then hold exactly the file's bytes.
//!
//! The checkpoint is `fixtures/rank_checkpoint`, saved once from the
//! filled model (`common::model(true)`) and committed, so that an input
//! means the same bytes in every run (a save's id differs from save to
//! save). A load of it unchanged must succeed, checked before the first
//! input.

#![no_main]

mod common;

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use scopetree::checkpoint;
use scopetree::ranks::{PlanOptions, SingleProcess, SyncPlan};

#[derive(Arbitrary, Debug)]
struct Input {
    /// The index rather than the shard.
    index: bool,
    change: common::Change,
}

/// The checkpoint, copied into a directory of its own: the directory, and
/// its two files' paths and bytes (the shard first).
struct Saved {
    _dir: tempfile::TempDir,
    files: [(PathBuf, Vec<u8>); 2],
}

static SAVED: LazyLock<Saved> = LazyLock::new(|| {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/rank_checkpoint");
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| {
        let bytes = std::fs::read(from.join(name)).unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        (path, bytes)
    };
    let files = [
        file("model-00001-of-00001.safetensors"),
        file("model.safetensors.index.json"),
    ];
    let (mut t, vars) = common::model(false);
    let mut plan = SyncPlan::new(&SingleProcess, &t, t.root(), &PlanOptions::new()).unwrap();
    plan.load_shards(&SingleProcess, &mut t, dir.path())
        .expect("the fixture loads unchanged");
    let (filled, filled_vars) = common::model(true);
    assert_eq!(common::state(&t, vars), common::state(&filled, filled_vars));
    Saved { _dir: dir, files }
});

fuzz_target!(|input: Input| {
    let saved = &*SAVED;
    for (path, bytes) in &saved.files {
        std::fs::write(path, bytes).unwrap();
    }
    let (path, bytes) = &saved.files[usize::from(input.index)];
    std::fs::write(path, common::changed(bytes, &input.change)).unwrap();

    let (mut t, vars) = common::model(false);
    let before = common::state(&t, vars);
    let mut plan = SyncPlan::new(&SingleProcess, &t, t.root(), &PlanOptions::new()).unwrap();
    let dir = path.parent().unwrap();
    let loaded = plan.load_shards(&SingleProcess, &mut t, dir);
    if common::failed(&loaded) {
        assert_eq!(
            common::state(&t, vars),
            before,
            "a failed load changed the tree"
        );
    } else if common::records_checksums(&std::fs::read(&saved.files[0].0).unwrap()) {
        let (filled, filled_vars) = common::model(true);
        assert_eq!(
            common::state(&t, vars),
            common::state(&filled, filled_vars),
            "a load that passed holds other values than the saved ones"
        );
    } else {
        // Every checksum entry is gone: the shard reads as another
        // writer's file, with nothing to check its bytes against, and the
        // model holds what it holds.
        let shard = &saved.files[0].0;
        let tensors = checkpoint::inspect(shard).expect("a shard that loaded");
        let file = std::fs::read(shard).unwrap();
        let data = common::data_of(&file).expect("a shard that loaded");
        common::check_loaded(&t, vars, &before, &tensors, data);
    }
});
