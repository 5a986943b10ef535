//! Checkpoints against the reference implementation: Python's
//! `safetensors.numpy`, single files and sharded Hugging Face checkpoints
//! with bf16 tensors (numpy's bf16 from `ml_dtypes`). Ignored by default
//! (they need Python); `.ci/run` installs the packages and runs them with
//! `cargo test --release --test checkpoint_python -- --ignored`.
//! When they run, a missing Python or package fails with how to install it.

use std::process::Command;

use half::f16;
use scopetree::checkpoint::{self, LoadOptions, SaveOptions, Separator, Tensor};
use scopetree::{ScopeTree, VarId};
use serde_json::Value;

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

// Sharded checkpoints in the Hugging Face layout, with bf16 tensors (numpy
// has bf16 through `ml_dtypes`, which `.ci/run` installs).

/// Writes a two-shard Hugging Face checkpoint into `sys.argv[1]`: bf16
/// tensors (and one f32) from `safetensors.numpy.save_file`, and the
/// index; prints each tensor's dtype, shape and raw little-endian bytes.
const WRITE_SHARDED: &str = r#"
import json, os, sys
import numpy as np
import ml_dtypes
from safetensors.numpy import save_file
d = sys.argv[1]
def vals(n, k):
    return (np.arange(n, dtype=np.float32) * 0.37 * k - 1.0)
shards = {
    "model-00001-of-00002.safetensors": {
        "model.embed_tokens.weight": vals(32, 1).reshape(8, 4).astype(ml_dtypes.bfloat16),
        "model.layers.0.mlp.up_proj.weight": vals(16, 2).reshape(4, 4).astype(ml_dtypes.bfloat16),
    },
    "model-00002-of-00002.safetensors": {
        "lm_head.weight": vals(32, 3).reshape(8, 4).astype(ml_dtypes.bfloat16),
        "model.norm.weight": vals(4, 4),
    },
}
weight_map, total, out = {}, 0, {}
for name, tensors in shards.items():
    save_file(tensors, os.path.join(d, name), metadata={"format": "pt"})
    for k, a in tensors.items():
        weight_map[k] = name
        total += a.nbytes
        out[k] = [str(a.dtype), list(a.shape), a.tobytes().hex()]
with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
print(json.dumps(out))
"#;

/// Reads the sharded checkpoint in `sys.argv[1]` as the Hugging Face
/// tools do: the index, then each shard with `safetensors.numpy`, checking
/// that each shard holds exactly the names the index gives it and has
/// `format` metadata; prints every tensor as in `WRITE_SHARDED`.
const READ_SHARDED: &str = r#"
import json, os, sys
import numpy as np
import ml_dtypes
from safetensors import safe_open
d = sys.argv[1]
index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
out, total = {}, 0
for shard in sorted(set(index["weight_map"].values())):
    with safe_open(os.path.join(d, shard), framework="numpy") as f:
        assert f.metadata()["format"] == "pt", f.metadata()
        names = sorted(f.keys())
        assert names == sorted(k for k, v in index["weight_map"].items() if v == shard), (shard, names)
        for k in names:
            a = f.get_tensor(k)
            total += a.nbytes
            out[k] = [str(a.dtype), list(a.shape), a.tobytes().hex()]
assert total == index["metadata"]["total_size"], (total, index["metadata"])
print(json.dumps(out))
"#;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
#[ignore = "needs python3 with safetensors, numpy and ml_dtypes: pip install safetensors numpy ml_dtypes; run with cargo test --release --test checkpoint_python -- --ignored"]
fn scopetree_loads_a_sharded_bf16_checkpoint_python_writes() {
    use half::bf16;
    use scopetree::checkpoint::FloatDtype;
    let d = tempfile::tempdir().unwrap();
    let out = python(WRITE_SHARDED, &[d.path().to_str().unwrap()]);
    let written: serde_json::Map<String, Value> =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}; {HOW}"));

    // Into an empty tree, as f32: each value is its bf16 widened.
    let mut t = ScopeTree::new();
    let root = t.root();
    let opts = LoadOptions::new()
        .separator(Separator::Dot)
        .create(true)
        .create_floats_as(FloatDtype::F32);
    let r = checkpoint::load(&mut t, root, d.path(), &opts).unwrap();
    assert_eq!(r.created.len(), 4);
    for (key, entry) in &written {
        let path: Vec<&str> = key.split('.').collect();
        let got = t.get::<Vec<f32>>(find(&t, &path)).unwrap();
        let bytes = unhex(entry[2].as_str().unwrap());
        let want: Vec<f32> = match entry[0].as_str().unwrap() {
            "bfloat16" => bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            "float32" => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            other => panic!("{key}: dtype {other}"),
        };
        assert_eq!(got, &want, "{key}");
    }

    // Into the same names held as bf16, strictly: the very bytes.
    let mut exact = ScopeTree::new();
    let root = exact.root();
    let opts = LoadOptions::new().separator(Separator::Dot).create(true);
    checkpoint::load(
        &mut exact,
        root,
        d.path().join("model.safetensors.index.json"),
        &opts,
    )
    .unwrap();
    let lm = exact
        .get::<Vec<bf16>>(find(&exact, &["lm_head", "weight"]))
        .unwrap();
    let raw: Vec<u8> = lm.iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(hex(&raw), written["lm_head.weight"][2].as_str().unwrap());
}

#[test]
#[ignore = "needs python3 with safetensors, numpy and ml_dtypes: pip install safetensors numpy ml_dtypes; run with cargo test --release --test checkpoint_python -- --ignored"]
fn python_reads_a_sharded_bf16_save_of_scopetree() {
    use half::bf16;
    use scopetree::checkpoint::FloatDtype;
    let mut t = ScopeTree::new();
    let root = t.root();
    let model = t.new_named_scope(root, "model").unwrap();
    let mut want = Vec::new();
    for l in 0..3 {
        let layer = t.new_named_scope(model, format!("layer_{l}")).unwrap();
        let w = t.var(layer, "weight").unwrap();
        let vals: Vec<f32> = (0..64)
            .map(|i| (i as f32 - 20.0) * 0.013 * (l + 1) as f32)
            .collect();
        want.push((format!("model.layer_{l}.weight"), "bfloat16", vals.clone()));
        t.set(w, Tensor::new(vec![8, 8], vals).unwrap()).unwrap();
    }
    let steps = t.var(root, "steps").unwrap();
    t.set(steps, vec![7_i64, -1]).unwrap();
    let d = tempfile::tempdir().unwrap();
    let opts = SaveOptions::new()
        .separator(Separator::Dot)
        .max_shard_size(200)
        .floats_as(FloatDtype::BF16);
    let r = checkpoint::save_sharded(&t, root, d.path(), &opts).unwrap();
    assert!(r.shards.len() >= 2, "{:?}", r.shards);

    let out = python(READ_SHARDED, &[d.path().to_str().unwrap()]);
    let got: serde_json::Map<String, Value> =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}; {HOW}"));
    assert_eq!(got.len(), 4, "{out}");
    for (key, np, vals) in &want {
        let bytes: Vec<u8> = vals
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(
            got[key],
            serde_json::json!([np, [8, 8], hex(&bytes)]),
            "{key}"
        );
    }
    let steps_bytes: Vec<u8> = [7_i64, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(
        got["steps"],
        serde_json::json!(["int64", [2], hex(&steps_bytes)])
    );
}

// Rounding to bf16 against `ml_dtypes`: numpy's `astype(ml_dtypes.bfloat16)`
// rounds an f32 to nearest, ties to even. From f64 it rounds through f32
// (twice, so it can be wrong just above a bf16 tie); there Python checks
// scopetree against the exact nearest-even value instead, and that every
// disagreement with `ml_dtypes` is such a double rounding.

/// Reads `sys.argv[1]` (the f32 values `x32` and the f64 values `x64`) and
/// `sys.argv[2]` (the same saved as bf16); prints, as JSON, the indices
/// where scopetree's bf16 bytes differ from `ml_dtypes` (f32), from the
/// exact nearest-even bf16 (f64), and where `ml_dtypes` differs from the
/// exact value for another reason than rounding twice (f64).
const COMPARE_BF16: &str = r#"
import json, sys
from fractions import Fraction
import numpy as np
import ml_dtypes
from safetensors import safe_open

def load(path):
    with safe_open(path, framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}

src, bf = load(sys.argv[1]), load(sys.argv[2])
assert bf["x32"].dtype == ml_dtypes.bfloat16 and bf["x64"].dtype == ml_dtypes.bfloat16
out = {"n32": int(src["x32"].size), "n64": int(src["x64"].size)}

# f32: every byte as ml_dtypes rounds it.
got32 = bf["x32"].view(np.uint16)
want32 = src["x32"].astype(ml_dtypes.bfloat16).view(np.uint16)
out["f32_differ"] = [int(i) for i in np.nonzero(got32 != want32)[0]]

# f64: the exact nearest bf16, ties to even, by rational arithmetic among
# ml_dtypes' bf16 and its two neighbours (infinity counts as 2^128).
def magnitude(m):
    if m == 0x7f80:
        return Fraction(2) ** 128
    e, f = m >> 7, m & 0x7f
    return Fraction(f, 2 ** 133) if e == 0 else Fraction(f | 0x80) * Fraction(2) ** (e - 134)

def exact(x, ml):
    if not np.isfinite(x):
        return ml
    a, sign = abs(Fraction(float(x))), int(ml) & 0x8000
    if np.signbit(x) != bool(sign):
        return ml  # not reached: rounding keeps the sign
    cands = [m for m in ((int(ml) & 0x7fff) + d for d in (-1, 0, 1)) if 0 <= m <= 0x7f80]
    best = min(cands, key=lambda m: (abs(magnitude(m) - a), m & 1))
    return sign | best

x64 = src["x64"]
ml64 = x64.astype(ml_dtypes.bfloat16).view(np.uint16)
got64 = bf["x64"].view(np.uint16)
exact64 = np.array([exact(x, m) for x, m in zip(x64, ml64)], dtype=np.uint16)
out["f64_differ_from_exact"] = [int(i) for i in np.nonzero(got64 != exact64)[0]]
via32 = x64.astype(np.float32)
twice = (via32.astype(np.float64) != x64) & ((via32.view(np.uint32) & 0xffff) == 0x8000)
ml_wrong = ml64 != exact64
out["ml_dtypes_rounds_twice"] = int(np.count_nonzero(ml_wrong))
out["ml_dtypes_differs_otherwise"] = [int(i) for i in np.nonzero(ml_wrong & ~twice)[0]]
out["f64_differ_from_ml_dtypes_unexplained"] = [
    int(i) for i in np.nonzero((got64 != ml64) & ~twice)[0]]
print(json.dumps(out))
"#;

/// f32 values for the bf16 comparison: the issue's example, special
/// values, random patterns (NaNs as the canonical quiet NaN of their sign:
/// `ml_dtypes` drops a NaN's payload, `half` keeps its top bits), and each
/// side of random bf16 ties.
fn bf16_cases_f32(rng: &mut u64) -> Vec<f32> {
    let mut next = || {
        *rng = rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut bits: Vec<u32> = vec![
        0x3e5a_8007,
        0x3e5a_8000,
        0x3e5b_8000,
        0,
        0x8000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0xffc0_0000,
        0x7f7f_ffff,
        0x7f7f_8000,
        0x0000_0001,
        0x8000_8000,
        0x0000_8001,
        0x0080_0000,
    ];
    for _ in 0..5_000 {
        let r = next();
        let u = r as u32;
        bits.push(if u & 0x7fff_ffff > 0x7f80_0000 {
            (u & 0x8000_0000) | 0x7fc0_0000
        } else {
            u
        });
        // A bf16 tie: a finite bf16 pattern with half its last bit below.
        let t = (r >> 32) as u32 & 0xffff;
        if t & 0x7f80 != 0x7f80 {
            let mid = (t << 16) | 0x8000;
            bits.extend([mid, mid + 1, mid - 1, mid + 2, mid - 2, mid + 0x7fff]);
        }
    }
    bits.into_iter().map(f32::from_bits).collect()
}

/// f64 values for the bf16 comparison: special values, random patterns,
/// the f32 cases widened, and each side of bf16 ties by one and two f64
/// steps and by less than half an f32 step (where rounding through f32
/// rounds twice).
fn bf16_cases_f64(rng: &mut u64, f32s: &[f32]) -> Vec<f64> {
    let mut v: Vec<f64> = vec![
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        f64::MAX,
        1e300,
        -1e-300,
        f64::from_bits(1),
        1.0 + 2.0_f64.powi(-8) + 2.0_f64.powi(-40),
    ];
    for _ in 0..5_000 {
        *rng = rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let x = f64::from_bits(z ^ (z >> 31));
        v.push(if x.is_nan() { f64::NAN.copysign(x) } else { x });
    }
    for &x in f32s {
        let w = f64::from(x);
        v.push(w);
        if w.is_finite() && w != 0.0 && f32::to_bits(x) & 0xffff == 0x8000 {
            let b = w.to_bits();
            for d in [1, 2, 1 << 20, (1 << 28) - 1, 1 << 28] {
                v.extend([f64::from_bits(b + d), f64::from_bits(b - d)]);
            }
        }
    }
    v
}

#[test]
#[ignore = "needs python3 with safetensors, numpy and ml_dtypes: pip install safetensors numpy ml_dtypes; run with cargo test --release --test checkpoint_python -- --ignored"]
fn bf16_saves_round_as_ml_dtypes_does() {
    use scopetree::checkpoint::FloatDtype;
    let mut rng = 0xbf16_u64;
    let x32 = bf16_cases_f32(&mut rng);
    let x64 = bf16_cases_f64(&mut rng, &x32);
    // Values where rounding through f32 to nearest lands on a bf16 tie.
    #[allow(clippy::cast_possible_truncation)]
    let twice = x64
        .iter()
        .filter(|&&x| (x as f32).to_bits() & 0xffff == 0x8000 && f64::from(x as f32) != x)
        .count();
    assert!(twice > 1000, "{twice}");
    let mut t = ScopeTree::new();
    let root = t.root();
    for (name, set) in [("x32", 0), ("x64", 1)] {
        let v = t.var(root, name).unwrap();
        if set == 0 {
            t.set(v, x32.clone()).unwrap();
        } else {
            t.set(v, x64.clone()).unwrap();
        }
    }
    let d = tempfile::tempdir().unwrap();
    let (src, bf) = (
        d.path().join("src.safetensors"),
        d.path().join("bf16.safetensors"),
    );
    checkpoint::save(&t, root, &src, &SaveOptions::new()).unwrap();
    let opts = SaveOptions::new().floats_as(FloatDtype::BF16);
    checkpoint::save(&t, root, &bf, &opts).unwrap();

    let out = python(COMPARE_BF16, &[src.to_str().unwrap(), bf.to_str().unwrap()]);
    let r: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}; {HOW}"));
    assert_eq!(r["n32"], x32.len(), "{out}");
    assert_eq!(r["n64"], x64.len(), "{out}");
    let none = serde_json::json!([]);
    let at32 = |k: &str| -> Vec<u32> {
        r[k].as_array()
            .unwrap()
            .iter()
            .take(5)
            .map(|i| x32[i.as_u64().unwrap() as usize].to_bits())
            .collect()
    };
    let at64 = |k: &str| -> Vec<u64> {
        r[k].as_array()
            .unwrap()
            .iter()
            .take(5)
            .map(|i| x64[i.as_u64().unwrap() as usize].to_bits())
            .collect()
    };
    assert_eq!(r["f32_differ"], none, "f32 bits {:x?}", at32("f32_differ"));
    assert_eq!(
        r["f64_differ_from_exact"],
        none,
        "f64 bits {:x?}",
        at64("f64_differ_from_exact")
    );
    assert_eq!(
        r["f64_differ_from_ml_dtypes_unexplained"],
        none,
        "f64 bits {:x?}",
        at64("f64_differ_from_ml_dtypes_unexplained")
    );
    assert_eq!(
        r["ml_dtypes_differs_otherwise"],
        none,
        "the exact reference is off: {:x?}",
        at64("ml_dtypes_differs_otherwise")
    );
}
