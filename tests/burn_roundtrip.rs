//! Round trips of burn modules through `scopetree::burn::CheckpointStore`
//! (ndarray backend): every dtype burn's ndarray backend has, bit for bit,
//! through one file and through shards; the `ParamId`s given back; floats
//! saved as bf16 / f16 correctly rounded; lazy parameters never
//! initialized by a load; the sharded layout and its metadata.

#[path = "support/burn_models.rs"]
mod models;

use burn_core as burn;
use burn_core::module::{Module, Param, ParamId};
use burn_core::tensor::{DType, Device, Tensor, TensorData};
use burn_store::ModuleSnapshot;
use half::{bf16, f16};
use models::{AllDtypes, Net, ids, snapshot, values};
use scopetree::burn::{CheckpointStore, Error};
use scopetree::checkpoint::{self, DtypePolicy, FloatDtype};

fn device() -> Device {
    Device::default()
}

#[test]
fn every_dtype_round_trips_bit_for_bit_through_a_file_and_through_shards() {
    let dir = tempfile::tempdir().unwrap();
    let saved = AllDtypes::new(7, &device());
    let want = snapshot(&saved);
    assert_eq!(want.len(), 11);
    for (name, mut store) in [
        (
            "file",
            CheckpointStore::from_file(dir.path().join("m.safetensors")),
        ),
        (
            "sharded",
            CheckpointStore::sharded(dir.path().join("shards")).max_shard_size(40),
        ),
    ] {
        saved.save_into(&mut store).unwrap();
        let mut loaded = AllDtypes::new(0, &device());
        assert_ne!(values(&loaded), values(&saved));
        let result = loaded.load_from(&mut store).unwrap();
        assert_eq!(result.applied.len(), 11, "{name}");
        assert!(
            result.missing.is_empty() && result.unused.is_empty(),
            "{name}"
        );
        // Values, dtypes, shapes and ids, bit for bit (NaN payloads too).
        assert_eq!(snapshot(&loaded), want, "{name}");
    }
    let shards = checkpoint::inspect(dir.path().join("shards")).unwrap();
    let files: std::collections::BTreeSet<_> = shards.iter().map(|t| t.shard.clone()).collect();
    assert!(files.len() >= 3, "{files:?}");
}

#[test]
fn param_ids_come_back_unless_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("net.safetensors");
    let saved = Net::new(1.0, &device());
    saved
        .save_into(&mut CheckpointStore::from_file(&path))
        .unwrap();

    let mut kept = Net::new(0.0, &device());
    let own = ids(&kept);
    kept.load_from(&mut CheckpointStore::from_file(&path).param_ids(false))
        .unwrap();
    assert_eq!(ids(&kept), own);
    assert_eq!(values(&kept), values(&saved));

    let mut restored = Net::new(0.0, &device());
    restored
        .load_from(&mut CheckpointStore::from_file(&path))
        .unwrap();
    assert_eq!(ids(&restored), ids(&saved));
}

/// A module whose one parameter panics if anything initializes it.
#[derive(Module, Debug)]
struct Lazy {
    w: Param<Tensor<2>>,
}

#[test]
fn a_load_never_initializes_a_lazy_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lazy.safetensors");
    let eager = Lazy {
        w: Param::from_tensor(Tensor::from_data(
            TensorData::new(vec![1.5_f32; 6], [2, 3]),
            &device(),
        )),
    };
    eager
        .save_into(&mut CheckpointStore::from_file(&path))
        .unwrap();
    let mut lazy = Lazy {
        w: Param::uninitialized(
            ParamId::new(),
            |_, _| panic!("the load initialized a lazy parameter"),
            device(),
            false,
            [2, 3].into(),
        ),
    };
    assert!(!lazy.w.is_initialized());
    lazy.load_from(&mut CheckpointStore::from_file(&path))
        .unwrap();
    assert_eq!(values(&lazy), values(&eager));

    // A shape mismatch is found from the lazy shape, without initializing.
    let mut other = Lazy {
        w: Param::uninitialized(
            ParamId::new(),
            |_, _| panic!("the load initialized a lazy parameter"),
            device(),
            false,
            [3, 2].into(),
        ),
    };
    let err = other
        .load_from(&mut CheckpointStore::from_file(&path))
        .unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    assert!(!other.w.is_initialized());
}

/// f32 values that exercise rounding: ties, just above and below ties,
/// overflow to infinity, subnormals of both targets, NaN.
fn rounding_values() -> Vec<f32> {
    let mut v = vec![
        1.0 + f32::EPSILON * 64.0, // a bf16 tie, rounds to even
        1.0 + f32::EPSILON * 192.0,
        1.0 + f32::EPSILON * 65.0,
        1.0 + f32::EPSILON * 63.0,
        65520.0, // rounds to f16 infinity
        65519.0,
        3.0e38,
        1.0e-8,
        -1.0e-40,
        f32::from_bits(0x0000_8000),
        f32::NAN,
        -0.0,
    ];
    let mut b = models::Bits(99);
    v.extend((0..52).map(|_| f32::from_bits(b.next() as u32)));
    v
}

#[test]
fn floats_saved_as_bf16_and_f16_are_correctly_rounded() {
    let dir = tempfile::tempdir().unwrap();
    let xs = rounding_values();
    let n = xs.len();
    let make = |v: Vec<f32>| Lazy {
        w: Param::from_tensor(Tensor::from_data(TensorData::new(v, [n / 4, 4]), &device())),
    };
    let saved = make(xs.clone());
    for (dtype, round) in [
        (
            FloatDtype::BF16,
            (|x: f32| bf16::from_f32(x).to_f32()) as fn(f32) -> f32,
        ),
        (FloatDtype::F16, |x: f32| f16::from_f32(x).to_f32()),
    ] {
        let ck = dir.path().join(format!("{dtype:?}"));
        saved
            .save_into(&mut CheckpointStore::sharded(&ck).floats_as(dtype))
            .unwrap();
        assert_eq!(checkpoint::inspect(&ck).unwrap()[0].dtype, dtype.dtype());

        // Exact by default: a bf16 file does not load into f32 silently.
        let mut strict = make(vec![0.0; n]);
        let err = strict
            .load_from(&mut CheckpointStore::sharded(&ck))
            .unwrap_err();
        match &err {
            Error::Mismatch { mismatched, .. } => {
                assert_eq!(mismatched.len(), 1, "{err}");
                assert!(
                    mismatched[0].file.contains(&format!("{:?}", dtype.dtype())),
                    "{err}"
                );
            }
            e => panic!("{e}"),
        }
        assert_eq!(values(&strict), values(&make(vec![0.0; n])));

        let mut loaded = make(vec![0.0; n]);
        loaded
            .load_from(&mut CheckpointStore::sharded(&ck).dtype_policy(DtypePolicy::Convert))
            .unwrap();
        let got = loaded.w.val().into_data().try_into_vec::<f32>().unwrap();
        assert_eq!(loaded.w.val().dtype(), DType::F32);
        for (x, y) in xs.iter().zip(&got) {
            let want = round(*x);
            assert!(
                want.to_bits() == y.to_bits() || (want.is_nan() && y.is_nan()),
                "{dtype:?}: {x:e} ({:#x}) came back {y:e}, want {want:e}",
                x.to_bits()
            );
        }
    }
}

#[test]
fn f64_saved_as_f16_rounds_once_as_the_checkpoint_layer_does() {
    let dir = tempfile::tempdir().unwrap();
    // Just above an f16 tie: rounding through f32 first would round twice.
    let xs = vec![
        1.0 + 2f64.powi(-11) + 2f64.powi(-40),
        2049.0000001,
        -3.3e-5,
        1.0e300,
    ];
    #[derive(Module, Debug)]
    struct D {
        w: Param<Tensor<1>>,
    }
    let saved = D {
        w: Param::from_tensor(Tensor::from_data(
            TensorData::new(xs.clone(), [xs.len()]),
            (&device(), DType::F64),
        )),
    };
    let ck = dir.path().join("f16");
    saved
        .save_into(&mut CheckpointStore::sharded(&ck).floats_as(FloatDtype::F16))
        .unwrap();
    // Read back as f16 by the checkpoint layer.
    let mut tree = scopetree::ScopeTree::new();
    let root = tree.root();
    let opts = checkpoint::LoadOptions::new()
        .separator(checkpoint::Separator::Dot)
        .create(true);
    checkpoint::load(&mut tree, root, &ck, &opts).unwrap();
    let w = tree.find_local_var(root, "w").unwrap().unwrap();
    let got = tree.get::<Vec<f16>>(w).unwrap();
    assert_eq!(got[0], f16::from_bits(0x3c01), "one rounding, up");
    assert_eq!(got[1], f16::from_f32(2050.0));
    assert_eq!(got[3], f16::INFINITY);
}

#[test]
fn a_sharded_save_records_checksums_ids_and_removes_stale_shards() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let net = Net::new(3.0, &device());
    net.save_into(&mut CheckpointStore::sharded(&ck).max_shard_size(64))
        .unwrap();
    let n_small = std::fs::read_dir(&ck).unwrap().count();
    assert!(n_small > 3, "{n_small}");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(map.len(), 5);
    assert!(map.contains_key("blocks.1.w") && map.contains_key("head"));
    // Each shard's header: "format": "pt", a checksum and an id per tensor.
    let shard = ck.join(map["head"].as_str().unwrap());
    let bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let meta = &header["__metadata__"];
    assert_eq!(meta["format"], "pt");
    assert_eq!(meta["scopetree_xxh3/head"].as_str().unwrap().len(), 32);
    assert_eq!(
        meta["scopetree_burn_param/head"].as_str().unwrap(),
        net.head.id.val().to_string()
    );

    // Saved again in one shard: the old shards go.
    net.save_into(&mut CheckpointStore::sharded(&ck)).unwrap();
    let left: Vec<_> = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    let mut back = Net::new(0.0, &device());
    back.load_from(&mut CheckpointStore::sharded(&ck)).unwrap();
    assert_eq!(snapshot(&back), snapshot(&net));
}

#[test]
fn a_save_that_cannot_write_leaves_the_old_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let old = Net::new(1.0, &device());
    old.save_into(&mut CheckpointStore::from_file(&path))
        .unwrap();
    let before = std::fs::read(&path).unwrap();
    // A directory that is a file cannot hold shards.
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, b"x").unwrap();
    let err = Net::new(2.0, &device())
        .save_into(&mut CheckpointStore::sharded(blocker.join("ck")))
        .unwrap_err();
    assert!(matches!(err, Error::Checkpoint(_)), "{err}");
    assert!(err.to_string().contains("blocker"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
}
