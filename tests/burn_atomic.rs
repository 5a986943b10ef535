//! Side by side, on one bad checkpoint: burn-store's own `SafetensorsStore`
//! returns an error after it has already changed the module (it applies
//! first and validates after), while scopetree's `CheckpointStore` returns
//! one error naming every problem and leaves the module as it was.

#[path = "support/burn_models.rs"]
mod models;

use burn_core as burn;
use burn_core::module::{Module, Param};
use burn_core::tensor::{Device, Tensor};
use burn_store::{ModuleSnapshot, SafetensorsStore};
use models::values;
use scopetree::burn::{CheckpointStore, Error};

#[derive(Module, Debug)]
struct Saved {
    a: Param<Tensor<1>>,
    b: Param<Tensor<2>>,
}

#[derive(Module, Debug)]
struct Model {
    a: Param<Tensor<1>>,
    b: Param<Tensor<2>>,
    c: Param<Tensor<1>>,
}

fn model(device: &Device) -> Model {
    Model {
        a: Param::from_tensor(Tensor::zeros([4], device)),
        b: Param::from_tensor(Tensor::zeros([2, 3], device)),
        c: Param::from_tensor(Tensor::zeros([2], device)),
    }
}

/// A checkpoint of `a` (right), `b` of the wrong shape, and no `c`.
fn bad_checkpoint(dir: &std::path::Path) -> std::path::PathBuf {
    let d = Device::default();
    let path = dir.join("bad.safetensors");
    Saved {
        a: Param::from_tensor(Tensor::ones([4], &d)),
        b: Param::from_tensor(Tensor::ones([3, 2], &d)),
    }
    .save_into(&mut SafetensorsStore::from_file(&path))
    .unwrap();
    path
}

#[test]
fn safetensors_store_changes_the_module_on_a_failed_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = bad_checkpoint(dir.path());
    let mut m = model(&Device::default());
    let before = values(&m);
    let err = m
        .load_from(&mut SafetensorsStore::from_file(&path))
        .expect_err("burn-store refuses the load");
    // ... but `a` was already replaced when it said so.
    assert_ne!(
        values(&m),
        before,
        "burn-store's store left the module unchanged: {err}"
    );
    assert_eq!(
        m.a.val().into_data().try_into_vec::<f32>().unwrap(),
        [1.0; 4]
    );
}

#[test]
fn checkpoint_store_names_every_problem_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = bad_checkpoint(dir.path());
    let mut m = model(&Device::default());
    let before = values(&m);
    let err = m
        .load_from(&mut CheckpointStore::from_file(&path))
        .unwrap_err();
    assert_eq!(values(&m), before);
    let Error::Mismatch {
        missing,
        mismatched,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(missing, &["c"]);
    assert_eq!(mismatched.len(), 1);
    assert_eq!(mismatched[0].key, "b");
    assert_eq!(
        m.a.val().into_data().try_into_vec::<f32>().unwrap(),
        [0.0; 4]
    );
}
