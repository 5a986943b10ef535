//! Checkpoints against the reference implementation: Python's
//! `safetensors.numpy`. Ignored by default (they need Python); `.ci/run`
//! installs the packages and runs them with
//! `cargo test --release --test checkpoint_python -- --ignored`.
//! When they run, a missing Python or package fails with how to install it.

use std::process::Command;

use half::f16;
use scopetree::checkpoint::{self, LoadOptions, SaveOptions, Separator, Tensor};
use scopetree::{ScopeTree, VarId};
use serde_json::Value;

const HOW: &str = "install them with `pip install safetensors numpy` \
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
    assert!(out.status.success(), "python3 failed: {stderr}");
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Reads a file with `safetensors.numpy.load_file` and prints every tensor
/// as {key: [numpy dtype, shape, little-endian hex bytes]}.
const READ: &str = r#"
import json, sys
import numpy as np
from safetensors.numpy import load_file
d = load_file(sys.argv[1])
out = {}
for k, a in d.items():
    le = a.astype(a.dtype.newbyteorder('<'), copy=False)
    out[k] = [str(a.dtype), list(a.shape), le.tobytes().hex()]
print(json.dumps(out))
"#;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A tree with every dtype numpy has (all but bf16), names with `.`-free
/// scopes so both separators round-trip.
type Expected = Vec<(String, &'static str, Vec<usize>, Vec<u8>)>;

fn tree() -> (ScopeTree, Expected) {
    use scopetree::checkpoint::Checkpointable;
    let mut t = ScopeTree::new();
    let enc = t.new_named_scope(t.root(), "encoder").unwrap();
    let l0 = t.new_named_scope(enc, "layer_0").unwrap();
    let mut expect = Vec::new();
    macro_rules! put {
        ($scope:expr, $path:expr, $name:expr, $np:expr, $v:expr) => {{
            let v = $v;
            let shape = Checkpointable::shape(&v).into_owned();
            let bytes = v.le_bytes().into_owned();
            let var = t.var($scope, $name).unwrap();
            t.set(var, v).unwrap();
            expect.push((format!("{}{}", $path, $name), $np, shape, bytes));
        }};
    }
    put!(
        l0,
        "encoder/layer_0/",
        "weight",
        "float32",
        Tensor::new(vec![3, 4], (0..12).map(|i| i as f32 * 0.25 - 1.0).collect()).unwrap()
    );
    put!(
        l0,
        "encoder/layer_0/",
        "bias",
        "float64",
        vec![1e-300_f64, -2.5, 3.0]
    );
    put!(enc, "encoder/", "i8", "int8", vec![i8::MIN, -1, i8::MAX]);
    put!(enc, "encoder/", "i16", "int16", vec![i16::MIN, 2]);
    put!(enc, "encoder/", "i32", "int32", vec![i32::MIN, 3]);
    put!(enc, "encoder/", "i64", "int64", vec![i64::MIN, 4]);
    put!(enc, "encoder/", "u8", "uint8", vec![255_u8, 0]);
    put!(enc, "encoder/", "u16", "uint16", vec![u16::MAX]);
    put!(enc, "encoder/", "u32", "uint32", vec![u32::MAX]);
    put!(enc, "encoder/", "u64", "uint64", vec![u64::MAX]);
    put!(t.root(), "", "mask", "bool", vec![true, false, true]);
    put!(
        t.root(),
        "",
        "half",
        "float16",
        vec![f16::from_f32(0.5), f16::MAX]
    );
    put!(
        t.root(),
        "",
        "scalar",
        "float32",
        Tensor::new(vec![], vec![7.0_f32]).unwrap()
    );
    (t, expect)
}

#[test]
#[ignore = "needs python3 with safetensors and numpy: pip install safetensors numpy; run with cargo test --release --test checkpoint_python -- --ignored"]
fn python_reads_every_tensor_scopetree_writes() {
    let d = tempfile::tempdir().unwrap();
    let (t, expect) = tree();
    for sep in [Separator::Slash, Separator::Dot] {
        let p = d.path().join(format!("w{sep:?}.safetensors"));
        checkpoint::save(&t, t.root(), &p, &SaveOptions::new().separator(sep)).unwrap();
        let out = python(READ, &[p.to_str().unwrap()]);
        let got: serde_json::Map<String, Value> = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(got.len(), expect.len(), "{out}");
        for (key, np, shape, bytes) in &expect {
            let key = key.replace('/', sep.as_str());
            let entry = got
                .get(&key)
                .unwrap_or_else(|| panic!("python lacks {key}: {out}"));
            let want = serde_json::json!([np, shape, hex(bytes)]);
            assert_eq!(entry, &want, "{key}");
        }
    }
}

/// Writes, with `safetensors.numpy.save_file`, deterministic tensors under
/// dotted (PyTorch-style) and slashed names.
const WRITE: &str = r#"
import sys
import numpy as np
from safetensors.numpy import save_file
save_file({
    "model.embed.weight": (np.arange(24, dtype=np.float32) * 0.5 - 3).reshape(4, 6),
    "model.embed.bias": np.array([1, -2, 3], dtype=np.int64),
    "model.head.mask": np.array([[True, False], [False, True]]),
    "model.head.scale": np.array([0.5, 1.5], dtype=np.float16),
}, sys.argv[1], metadata={"format": "np"})
save_file({
    "enc/w": np.arange(6, dtype=np.float64).reshape(2, 3),
    "enc/b": np.array([7, 8, 9], dtype=np.uint16),
}, sys.argv[2])
"#;

fn find(t: &ScopeTree, path: &[&str]) -> VarId {
    let (name, dirs) = path.split_last().unwrap();
    let mut s = t.root();
    for d in dirs {
        s = t
            .kid(s, *d)
            .unwrap()
            .unwrap_or_else(|| panic!("no scope {d}"));
    }
    t.find_local_var(s, *name)
        .unwrap()
        .unwrap_or_else(|| panic!("no var {name}"))
}

#[test]
#[ignore = "needs python3 with safetensors and numpy: pip install safetensors numpy; run with cargo test --release --test checkpoint_python -- --ignored"]
fn scopetree_reads_what_python_writes() {
    let d = tempfile::tempdir().unwrap();
    let dotted = d.path().join("dotted.safetensors");
    let slashed = d.path().join("slashed.safetensors");
    python(
        WRITE,
        &[dotted.to_str().unwrap(), slashed.to_str().unwrap()],
    );

    // Dotted names into an empty tree: scopes are built from the file.
    let mut t = ScopeTree::new();
    let root = t.root();
    let opts = LoadOptions::new()
        .separator(Separator::Dot)
        .create(true)
        .create_shaped(true);
    let r = checkpoint::load(&mut t, root, &dotted, &opts).unwrap();
    assert_eq!(r.created.len(), 4);
    let w = t
        .get::<Tensor<f32>>(find(&t, &["model", "embed", "weight"]))
        .unwrap();
    assert_eq!(w.shape(), &[4, 6]);
    let want: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    assert_eq!(w.data(), &want[..]);
    let b = t
        .get::<Tensor<i64>>(find(&t, &["model", "embed", "bias"]))
        .unwrap();
    assert_eq!(b.data(), &[1, -2, 3]);
    let m = t
        .get::<Tensor<bool>>(find(&t, &["model", "head", "mask"]))
        .unwrap();
    assert_eq!(
        (m.shape(), m.data()),
        (&[2, 2][..], &[true, false, false, true][..])
    );
    let s = t
        .get::<Tensor<f16>>(find(&t, &["model", "head", "scale"]))
        .unwrap();
    assert_eq!(s.data(), &[f16::from_f32(0.5), f16::from_f32(1.5)]);

    // Slashed names into a built tree, strictly.
    let mut t = ScopeTree::new();
    let enc = t.new_named_scope(t.root(), "enc").unwrap();
    let w = t.var(enc, "w").unwrap();
    t.set(w, vec![0.0_f64; 6]).unwrap();
    let b = t.var(enc, "b").unwrap();
    t.set(b, vec![0_u16; 3]).unwrap();
    let root = t.root();
    let r = checkpoint::load(&mut t, root, &slashed, &LoadOptions::new()).unwrap();
    assert_eq!(r.loaded, ["enc/b", "enc/w"]);
    assert_eq!(
        t.get::<Vec<f64>>(w).unwrap(),
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    );
    assert_eq!(t.get::<Vec<u16>>(b).unwrap(), &[7, 8, 9]);
}
