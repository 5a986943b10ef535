//! Names between a checkpoint and a burn module: Hugging Face Llama names
//! (PyTorch layouts) remapped to a burn-nn model's paths with burn-store's
//! `PyTorchToBurnAdapter`; the same model saved back under the Hub's
//! names; a filter that loads part of a module. The checkpoints here are
//! written by scopetree's checkpoint layer; `burn_python.rs` loads ones
//! that Python writes.

#[path = "support/burn_models.rs"]
mod models;

use burn_core::tensor::Device;
use burn_store::{BurnToPyTorchAdapter, ModuleSnapshot, PathFilter, PyTorchToBurnAdapter};
use models::{HUB_TO_BURN, Llama, assert_hub_values, hub_tensors, value, values};
use scopetree::ScopeTree;
use scopetree::burn::{CheckpointStore, Error};
use scopetree::checkpoint::{self, SaveOptions, Separator, Tensor};

/// Writes the hub tensors as a sharded checkpoint in PyTorch layout, as
/// `save_pretrained` would, into `dir`.
fn write_hub(dir: &std::path::Path) {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    for (k, (name, shape)) in hub_tensors().into_iter().enumerate() {
        let comps: Vec<&str> = name.split('.').collect();
        let mut scope = root;
        for c in &comps[..comps.len() - 1] {
            scope = match tree.kid(scope, *c).unwrap() {
                Some(s) => s,
                None => tree.new_named_scope(scope, *c).unwrap(),
            };
        }
        let n: usize = shape.iter().product();
        let v = tree.var(scope, comps[comps.len() - 1]).unwrap();
        let data = (0..n).map(|i| value(k, i)).collect();
        tree.set(v, Tensor::new(shape, data).unwrap()).unwrap();
    }
    let opts = SaveOptions::new()
        .separator(Separator::Dot)
        .max_shard_size(600);
    let r = checkpoint::save_sharded(&tree, root, dir, &opts).unwrap();
    assert!(r.shards.len() > 1);
}

fn hub_store(dir: &std::path::Path) -> CheckpointStore {
    let mut store = CheckpointStore::sharded(dir).with_from_adapter(PyTorchToBurnAdapter);
    for (from, to) in HUB_TO_BURN {
        store = store.with_key_remapping(from, *to).unwrap();
    }
    store
}

#[test]
fn a_hub_llama_checkpoint_loads_with_remapping_and_the_pytorch_adapter() {
    let dir = tempfile::tempdir().unwrap();
    write_hub(dir.path());
    let mut m = Llama::init(&Device::default());
    let r = m.load_from(&mut hub_store(dir.path())).unwrap();
    assert_eq!(r.applied.len(), hub_tensors().len());
    assert!(r.unused.is_empty() && r.missing.is_empty());
    assert_hub_values(&m, |x| x);
}

#[test]
fn without_the_adapter_every_layout_difference_is_named_at_once() {
    let dir = tempfile::tempdir().unwrap();
    write_hub(dir.path());
    let mut store = CheckpointStore::sharded(dir.path());
    for (from, to) in HUB_TO_BURN {
        store = store.with_key_remapping(from, *to).unwrap();
    }
    let mut m = Llama::init(&Device::default());
    let err = m.load_from(&mut store).unwrap_err();
    let Error::Mismatch {
        missing,
        unused,
        mismatched,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    // gamma is `weight` in PyTorch: missing here, unused there.
    assert!(missing.contains(&"norm.gamma".to_owned()), "{err}");
    assert!(unused.contains(&"norm.weight".to_owned()), "{err}");
    // The head is [16, 8] in the file and [8, 16] in burn.
    let head = mismatched.iter().find(|m| m.key == "head.weight").unwrap();
    assert_eq!(
        (head.file.as_str(), head.tree.as_str()),
        ("F32 [16, 8]", "F32 [8, 16]")
    );
    // The square q and k fit by shape: only a transposition tells them
    // apart, which is why the adapter is needed.
    assert_eq!(mismatched.len(), 1, "{err}");
}

#[test]
fn a_model_saves_back_under_the_hub_names_and_layouts() {
    let dir = tempfile::tempdir().unwrap();
    write_hub(dir.path());
    let d = Device::default();
    let mut m = Llama::init(&d);
    m.load_from(&mut hub_store(dir.path())).unwrap();

    let out = dir.path().join("out");
    let mut store = CheckpointStore::sharded(&out).with_to_adapter(BurnToPyTorchAdapter);
    for (to, from) in [
        (r"^embed\.", "model.embed_tokens."),
        (
            r"^layers\.(\d+)\.attn\.q\.",
            "model.layers.$1.self_attn.q_proj.",
        ),
        (
            r"^layers\.(\d+)\.attn\.k\.",
            "model.layers.$1.self_attn.k_proj.",
        ),
        (
            r"^layers\.(\d+)\.norm\.",
            "model.layers.$1.input_layernorm.",
        ),
        (r"^norm\.", "model.norm."),
        (r"^head\.", "lm_head."),
    ] {
        store = store.with_key_remapping(to, from).unwrap();
    }
    m.save_into(&mut store).unwrap();
    let mut written: Vec<(String, Vec<usize>)> = checkpoint::inspect(&out)
        .unwrap()
        .into_iter()
        .map(|t| (t.key, t.shape))
        .collect();
    written.sort();
    let mut hub = hub_tensors();
    hub.sort();
    assert_eq!(written, hub);
    // Byte for byte the tensors the hub checkpoint holds.
    let ours = checkpoint::inspect(&out).unwrap();
    assert_eq!(ours.len(), hub.len());
    let mut back = Llama::init(&d);
    back.load_from(&mut hub_store(&out)).unwrap();
    assert_eq!(values(&back), values(&m));
}

#[test]
fn a_filter_loads_part_of_a_module_and_ignores_the_rest_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write_hub(dir.path());
    let d = Device::default();
    let mut m = Llama::init(&d);
    let untouched = values(&m.head);
    let store = hub_store(dir.path()).filter(PathFilter::new().with_regex(r"^layers\.0\."));
    let r = m.load_from(&mut { store }).unwrap();
    let mut applied = r.applied.clone();
    applied.sort();
    assert_eq!(
        applied,
        [
            "layers.0.attn.k.weight",
            "layers.0.attn.q.weight",
            "layers.0.norm.gamma"
        ]
    );
    assert!(r.skipped.contains(&"head.weight".to_owned()));
    assert!(
        r.unused.is_empty() && r.missing.is_empty(),
        "{:?} {:?}",
        r.unused,
        r.missing
    );
    assert_eq!(values(&m.head), untouched);
}
