//! The files are ordinary safetensors: what burn-store's own
//! `SafetensorsStore` writes loads through scopetree's `CheckpointStore`,
//! and what `CheckpointStore` writes (one file, or each shard) loads
//! through `SafetensorsStore`, bit for bit; `get_tensor`, `keys` and
//! `get_all_tensors` agree with burn-store's.

#[path = "support/burn_models.rs"]
mod models;

use burn_core as burn;
use burn_core::module::{Module, Param};
use burn_core::tensor::{Bool, Device, Int, Tensor};
use burn_store::{ModuleSnapshot, ModuleStore, SafetensorsStore, bridge};
use models::{AllDtypes, Net, values};
use scopetree::burn::CheckpointStore;

/// The dtypes burn-store's `SafetensorsStore` handles (not `U16`).
#[derive(Module, Debug)]
struct Mixed {
    f32: Param<Tensor<2>>,
    f64: Param<Tensor<2>>,
    i64: Param<Tensor<1, Int>>,
    i32: Param<Tensor<1, Int>>,
    i16: Param<Tensor<1, Int>>,
    i8: Param<Tensor<1, Int>>,
    u64: Param<Tensor<1, Int>>,
    u32: Param<Tensor<1, Int>>,
    u8: Param<Tensor<1, Int>>,
    flags: Param<Tensor<2, Bool>>,
}

fn mixed(seed: u64, d: &Device) -> Mixed {
    let a = AllDtypes::new(seed, d);
    Mixed {
        f32: a.f32,
        f64: a.f64,
        i64: a.i64,
        i32: a.i32,
        i16: a.i16,
        i8: a.i8,
        u64: a.u64,
        u32: a.u32,
        u8: a.u8,
        flags: a.flags,
    }
}

#[test]
fn u16_saves_and_loads_here_and_not_through_safetensors_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = Device::default();
    let saved = AllDtypes::new(3, &d);
    let theirs = saved.save_into(&mut SafetensorsStore::from_file(
        dir.path().join("t.safetensors"),
    ));
    assert!(theirs.is_err(), "burn-store 0.22 refuses U16");
    let path = dir.path().join("o.safetensors");
    saved
        .save_into(&mut CheckpointStore::from_file(&path))
        .unwrap();
    let mut loaded = AllDtypes::new(0, &d);
    loaded
        .load_from(&mut CheckpointStore::from_file(&path))
        .unwrap();
    assert_eq!(values(&loaded), values(&saved));
}

#[test]
fn a_safetensors_store_file_loads_through_checkpoint_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("burn.safetensors");
    let d = Device::default();
    let saved = mixed(5, &d);
    saved
        .save_into(&mut SafetensorsStore::from_file(&path))
        .unwrap();
    let mut loaded = mixed(0, &d);
    let r = loaded
        .load_from(&mut CheckpointStore::from_file(&path))
        .unwrap();
    assert_eq!(r.applied.len(), 10);
    assert_eq!(values(&loaded), values(&saved));
}

#[test]
fn checkpoint_store_files_and_shards_load_through_safetensors_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = Device::default();
    let saved = mixed(11, &d);
    let file = dir.path().join("ours.safetensors");
    saved
        .save_into(&mut CheckpointStore::from_file(&file))
        .unwrap();
    let mut loaded = mixed(0, &d);
    loaded
        .load_from(&mut SafetensorsStore::from_file(&file))
        .unwrap();
    assert_eq!(values(&loaded), values(&saved));

    // Each shard is a plain safetensors file: burn-store loads them one by
    // one into one module.
    let ck = dir.path().join("shards");
    saved
        .save_into(&mut CheckpointStore::sharded(&ck).max_shard_size(64))
        .unwrap();
    let mut loaded = mixed(0, &d);
    let mut shards: Vec<_> = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    assert!(shards.len() > 2);
    let mut applied = 0;
    for shard in &shards {
        let r = loaded
            .load_from(&mut SafetensorsStore::from_file(shard).allow_partial(true))
            .unwrap();
        applied += r.applied.len();
    }
    assert_eq!(applied, 10);
    assert_eq!(values(&loaded), values(&saved));
}

#[test]
fn listings_agree_with_safetensors_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = Device::default();
    let net = Net::new(2.0, &d);
    let path = dir.path().join("net.safetensors");
    net.save_into(&mut CheckpointStore::from_file(&path))
        .unwrap();
    let mut ours = CheckpointStore::from_file(&path);
    let mut theirs = SafetensorsStore::from_file(&path);
    assert_eq!(ours.keys().unwrap(), theirs.keys().unwrap());
    for key in theirs.keys().unwrap() {
        let a = bridge::to_data(ours.get_tensor(&key).unwrap().unwrap()).unwrap();
        let b = bridge::to_data(theirs.get_tensor(&key).unwrap().unwrap()).unwrap();
        assert_eq!(a.as_bytes(), b.as_bytes(), "{key}");
        assert_eq!(a.shape(), b.shape(), "{key}");
    }
    assert!(ours.get_tensor("nope").unwrap().is_none());

    // A sharded checkpoint lists every tensor of every shard, by name.
    let ck = dir.path().join("ck");
    net.save_into(&mut CheckpointStore::sharded(&ck).max_shard_size(0))
        .unwrap();
    let mut sharded = CheckpointStore::sharded(&ck);
    assert_eq!(sharded.keys().unwrap(), ours.keys().unwrap());
    let all = sharded.get_all_tensors().unwrap();
    assert_eq!(all.len(), 5);
    let head = bridge::to_data(&all["head"]).unwrap();
    assert_eq!(head.as_bytes(), net.head.val().into_data().as_bytes());
    assert_eq!(all["head"].param_id, Some(net.head.id.val()));
}
