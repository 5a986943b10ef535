//! Hugging Face checkpoints written by Python load into a burn module
//! through `CheckpointStore`: a Llama-shaped model in 3 shards with its
//! `model.safetensors.index.json`, in f32 and in bf16 (numpy's bf16 from
//! `ml_dtypes`), remapped to burn-nn's paths with burn-store's
//! `PyTorchToBurnAdapter`; and Python reads back what the store saves
//! under the Hub's names in bf16. Ignored by default (they need Python);
//! `.ci/run` installs the packages and runs them with
//! `cargo test --release --features burn-ndarray --test burn_python -- --ignored`.

#[path = "support/burn_models.rs"]
mod models;

use std::process::Command;

use burn_core::tensor::Device;
use burn_store::{BurnToPyTorchAdapter, ModuleSnapshot, PyTorchToBurnAdapter};
use half::bf16;
use models::{HUB_TO_BURN, Llama, assert_hub_values};
use scopetree::burn::CheckpointStore;
use scopetree::checkpoint::{DtypePolicy, FloatDtype};

const HOW: &str = "install them with `pip install safetensors numpy ml_dtypes` \
                   (Python 3 must be on PATH as `python3`)";

/// Runs a Python script with arguments; returns its stdout. Panics, saying
/// how to install what is missing, if Python or a package is absent.
fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}); {HOW}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("ModuleNotFoundError") || stderr.contains("ImportError") {
        panic!("python3 lacks a package: {stderr}; {HOW}");
    }
    assert!(out.status.success(), "python failed: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// The Hub tensors (names and PyTorch shapes, as `models::hub_tensors`),
/// with their values (as `models::value`, in f32 arithmetic).
const HUB: &str = r#"
import numpy as np
VOCAB, DIM, LAYERS = 16, 8, 2
names = [("model.embed_tokens.weight", (VOCAB, DIM))]
for l in range(LAYERS):
    names += [(f"model.layers.{l}.self_attn.q_proj.weight", (DIM, DIM)),
              (f"model.layers.{l}.self_attn.k_proj.weight", (DIM, DIM)),
              (f"model.layers.{l}.input_layernorm.weight", (DIM,))]
names += [("model.norm.weight", (DIM,)), ("lm_head.weight", (VOCAB, DIM))]
def value(k, shape):
    n = int(np.prod(shape))
    i = (np.arange(n, dtype=np.int64) + k * 1000).astype(np.float32)
    return (i * np.float32(0.001) - np.float32(0.5)).astype(np.float32).reshape(shape)
"#;

/// Writes the Hub tensors as 3 shards and an index, as `save_pretrained`.
const WRITE: &str = r#"
import json, sys
import ml_dtypes
from safetensors.numpy import save_file
out, dtype = sys.argv[1], sys.argv[2]
shards = [names[0:3], names[3:6], names[6:]]
weight_map, total = {}, 0
for s, group in enumerate(shards, 1):
    file = f"model-{s:05d}-of-{len(shards):05d}.safetensors"
    tensors = {}
    for name, shape in group:
        k = [n for n, _ in names].index(name)
        a = value(k, shape)
        if dtype == "bf16":
            a = a.astype(ml_dtypes.bfloat16)
        tensors[name] = a
        weight_map[name] = file
        total += a.nbytes
    save_file(tensors, f"{out}/{file}", metadata={"format": "pt"})
json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
          open(f"{out}/model.safetensors.index.json", "w"), indent=2)
print(len(weight_map))
"#;

/// Reads a sharded bf16 checkpoint and checks every Hub tensor's values.
const READ: &str = r#"
import json, sys
import ml_dtypes
from safetensors.numpy import load_file
d = sys.argv[1]
index = json.load(open(d + "/model.safetensors.index.json"))["weight_map"]
seen = {}
for f in sorted(set(index.values())):
    seen.update(load_file(d + "/" + f))
assert sorted(seen) == sorted(n for n, _ in names), sorted(seen)
for k, (name, shape) in enumerate(names):
    a = seen[name]
    assert a.dtype == ml_dtypes.bfloat16, (name, a.dtype)
    assert a.shape == shape, (name, a.shape)
    want = value(k, shape).astype(ml_dtypes.bfloat16)
    assert (a.view(np.uint16) == want.view(np.uint16)).all(), name
print("python read", len(seen), "bf16 tensors, all equal")
"#;

fn hub_store(dir: &std::path::Path) -> CheckpointStore {
    let mut store = CheckpointStore::sharded(dir).with_from_adapter(PyTorchToBurnAdapter);
    for (from, to) in HUB_TO_BURN {
        store = store.with_key_remapping(from, *to).unwrap();
    }
    store
}

#[test]
#[ignore = "needs python3 with safetensors, numpy and ml_dtypes: pip install safetensors numpy ml_dtypes; run with cargo test --release --features burn-ndarray --test burn_python -- --ignored"]
fn python_written_f32_and_bf16_hub_shards_load_into_a_burn_llama() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in ["f32", "bf16"] {
        let ck = dir.path().join(dtype);
        std::fs::create_dir_all(&ck).unwrap();
        let script = format!("{HUB}{WRITE}");
        let n = python(&script, &[ck.to_str().unwrap(), dtype]);
        assert_eq!(n.trim(), "9");
        let mut m = Llama::init(&Device::default());
        let mut store = hub_store(&ck);
        if dtype == "bf16" {
            // Exact by default: bf16 into f32 is a mismatch, named.
            let err = m.load_from(&mut hub_store(&ck)).unwrap_err();
            assert!(err.to_string().contains("BF16"), "{err}");
            store = store.dtype_policy(DtypePolicy::Convert);
        }
        let r = m.load_from(&mut store).unwrap();
        assert_eq!(r.applied.len(), 9);
        if dtype == "bf16" {
            assert_hub_values(&m, |x| bf16::from_f32(x).to_f32());
        } else {
            assert_hub_values(&m, |x| x);
        }
    }
}

#[test]
#[ignore = "needs python3 with safetensors, numpy and ml_dtypes: pip install safetensors numpy ml_dtypes; run with cargo test --release --features burn-ndarray --test burn_python -- --ignored"]
fn python_reads_a_bf16_hub_checkpoint_that_the_store_saves() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("f32");
    std::fs::create_dir_all(&ck).unwrap();
    python(&format!("{HUB}{WRITE}"), &[ck.to_str().unwrap(), "f32"]);
    let mut m = Llama::init(&Device::default());
    m.load_from(&mut hub_store(&ck)).unwrap();

    let out = dir.path().join("out");
    let mut store = CheckpointStore::sharded(&out)
        .max_shard_size(512)
        .floats_as(FloatDtype::BF16)
        .with_to_adapter(BurnToPyTorchAdapter);
    for (from, to) in [
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
        store = store.with_key_remapping(from, to).unwrap();
    }
    m.save_into(&mut store).unwrap();
    let said = python(&format!("{HUB}{READ}"), &[out.to_str().unwrap()]);
    assert!(said.contains("9 bf16 tensors, all equal"), "{said}");
}
