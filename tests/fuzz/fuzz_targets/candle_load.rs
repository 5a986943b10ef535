//! The candle store's loads of a sharded checkpoint: the store saved with
//! `save_sharded` in three shards (each shard's metadata holding the xxh3
//! checksum of every tensor, as the ranks' checkpoints carry them), one of
//! its four files changed by the input: bytes written over it, its end cut
//! off, or all of it replaced. Then one of the store's loads, chosen by
//! the input, with a staging budget and a number of readers the input
//! picks too (a load that converts floats stages them, and a budget of 128
//! KiB stages the 80 KB tensor in two pieces):
//!
//! - strict, in place, into the built model (every value zero), its floats
//!   of the file's dtypes or of others (`DtypePolicy::Convert`), with
//!   `rollback` or not;
//! - creating every variable on the CPU (`load_on`) in an empty store,
//!   floats kept or converted (`create_floats_as`);
//! - deferred (`load`, then `place`): checked against the files, the files
//!   changed before the check or between the check and the read.
//!
//! What must hold: the load fails, with a message under 1,000 bytes and
//! the store as it was (every value zero, or no variable and no load
//! waiting), or every variable of the store holds the bytes its file
//! declares for it, converted to its dtype, and a tensor of a shard that
//! records checksums holds exactly the bytes saved: no change to the data
//! gets past the checksums. (A checksum covers a tensor's bytes, not the
//! dtype and shape its header gives them: a header that relabels them
//! reaches a creating load, whose variables then take the header's dtype
//! and shape; a load into a built model refuses it.)
//!
//! The save's id (of the time and the process, and of varying length) is
//! replaced by a fixed one in every file, so that the checkpoint, and what
//! an input means, is the same in every run.
//! A load of it unchanged must succeed in every mode, checked before the
//! first input.

#![no_main]

mod common;

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use candle_core::{DType, Device, Tensor};
use candle_nn::Init;
use half::{bf16, f16};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use scopetree::candle::CandleStore;
use scopetree::checkpoint::{
    self, Checkpointable, Dtype, DtypePolicy, FloatDtype, LoadOptions, SaveOptions,
};

/// The store's variables: name, dtype, shape. `layers.0.w` (80,000 bytes)
/// is larger than a staging buffer of the smallest budget (64 KiB).
const VARS: [(&str, DType, &[usize]); 7] = [
    ("embed.weight", DType::BF16, &[4, 8]),
    ("layers.0.w", DType::F32, &[20_000]),
    ("layers.0.b", DType::F16, &[6]),
    ("layers.1.w", DType::F32, &[3, 5]),
    ("layers.1.scale", DType::F64, &[2]),
    ("tokens", DType::U8, &[7]),
    ("steps", DType::I64, &[3]),
];

/// Values that take every path of a float conversion: signed zeros,
/// infinities, NaN, a subnormal, one past f16's range, a tie of bf16
/// (1 + 2^-8, to even: 1) and of f16 (1 + 2^-11), and 65,520, halfway
/// between f16's largest value and 2^16 (to even: infinity).
const SPECIAL: [f32; 9] = [
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    1e-40,
    3.0e38,
    1.0 + 1.0 / 256.0,
    1.0 + 1.0 / 2048.0,
    65_520.0,
];

/// A float dtype a load converts to.
#[derive(Arbitrary, Clone, Copy, Debug)]
enum Floats {
    F16,
    BF16,
    F32,
}

/// Which load, and how.
#[derive(Arbitrary, Debug)]
enum Mode {
    /// Strict, in place, into the built model; its float variables of
    /// other dtypes than the file's when `convert`.
    InPlace { convert: bool, rollback: bool },
    /// `load_on` the CPU into an empty store, creating every variable.
    Create { floats: Option<Floats> },
    /// `load` into an empty store (deferred), then `place` on the CPU; the
    /// change made after the check when `after_check`.
    Deferred {
        floats: Option<Floats>,
        after_check: bool,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// The file changed: the three shards, then the index (modulo 4).
    file: u8,
    change: common::Change,
    mode: Mode,
    /// The staging budget: 128 KiB and this many 4 KiB more.
    staging: u8,
    /// Reader threads: 1 to 4.
    readers: u8,
}

/// The checkpoint in a directory of its own: the directory, its files'
/// paths and bytes (the shards in order, then the index), and each
/// tensor's saved bytes.
struct Saved {
    dir: tempfile::TempDir,
    files: Vec<(PathBuf, Vec<u8>)>,
    bytes: Vec<(String, Vec<u8>)>,
}

/// A variable's value: element `k` of variable `i`, a special value at
/// every 7th element of a float variable.
fn value(i: usize, k: usize, dtype: DType) -> f64 {
    if dtype.is_float() && k % 7 == 3 {
        return f64::from(SPECIAL[(i + k / 7) % SPECIAL.len()]);
    }
    ((i * 31 + k * 7) % 251) as f64 - 100.0
}

/// The store with every variable built and holding its values.
fn filled() -> CandleStore {
    let store = built(false);
    for (i, (name, dtype, shape)) in VARS.iter().enumerate() {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|k| value(i, k, *dtype)).collect();
        let t = Tensor::from_vec(v, *shape, &Device::Cpu)
            .unwrap()
            .to_dtype(*dtype)
            .unwrap();
        store.var(name).unwrap().unwrap().set(&t).unwrap();
    }
    store
}

/// The built model for an in-place load: every value zero, the float
/// variables of another dtype when `convert`.
fn built(convert: bool) -> CandleStore {
    let store = CandleStore::new();
    for (name, dtype, shape) in VARS {
        let dtype = match dtype {
            DType::BF16 | DType::F16 if convert => DType::F32,
            DType::F32 if convert => DType::BF16,
            DType::F64 if convert => DType::F32,
            d => d,
        };
        store
            .get(shape, name, Init::Const(0.0), dtype, &Device::Cpu)
            .unwrap();
    }
    store
}

/// A variable's bytes, little-endian.
fn bytes_of(var: &candle_core::Var) -> Vec<u8> {
    let mut out = Vec::new();
    Checkpointable::write_le(var, 1 << 20, &mut |p| {
        out.extend_from_slice(p);
        Ok(())
    })
    .unwrap();
    out
}

/// A variable of the store as a load leaves it (its `Debug` shows the
/// bytes' length and checksum).
#[derive(PartialEq)]
struct Held {
    key: String,
    dtype: DType,
    dims: Vec<usize>,
    bytes: Vec<u8>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sum = xxhash_rust::xxh3::xxh3_64(&self.bytes);
        write!(
            f,
            "{} {:?} {:?}: {} bytes, xxh3 {sum:016x}",
            self.key,
            self.dtype,
            self.dims,
            self.bytes.len()
        )
    }
}

/// What a load may change: every variable's name, dtype, shape and bytes,
/// and whether a load waits.
fn contents(store: &CandleStore) -> (Vec<Held>, bool) {
    let vars = store
        .named_vars()
        .unwrap()
        .into_iter()
        .map(|(key, v)| {
            let t = v.as_tensor();
            let (dtype, dims) = (t.dtype(), t.dims().to_vec());
            Held {
                key,
                dtype,
                dims,
                bytes: bytes_of(&v),
            }
        })
        .collect();
    (vars, store.is_pending())
}

/// The save's `id` in `file` (a shard, or the index when `shard` is
/// false) replaced by [`SAVE_ID`], a shard's header padded again to 8
/// bytes: ids differ in length from save to save.
fn with_fixed_id(file: &[u8], id: &str, shard: bool) -> Vec<u8> {
    let (from, to) = (format!("\"{id}\""), format!("\"{SAVE_ID}\""));
    if !shard {
        return String::from_utf8(file.to_vec())
            .unwrap()
            .replace(&from, &to)
            .into_bytes();
    }
    let data = common::data_of(file).unwrap();
    let header = std::str::from_utf8(&file[8..file.len() - data.len()]).unwrap();
    let mut header = header
        .trim_end_matches(' ')
        .replace(&from, &to)
        .into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let len = u64::try_from(header.len()).unwrap();
    [&len.to_le_bytes()[..], &header, data].concat()
}

/// The save id every run's checkpoint carries.
const SAVE_ID: &str = "candle-load-fuzz";

static SAVED: LazyLock<Saved> = LazyLock::new(|| {
    let store = filled();
    let mut bytes = Vec::new();
    let mut meta = std::collections::HashMap::new();
    for (k, v) in store.named_vars().unwrap() {
        let b = bytes_of(&v);
        let sum = xxhash_rust::xxh3::xxh3_128(&b);
        meta.insert(format!("scopetree_xxh3/{k}"), format!("{sum:032x}"));
        bytes.push((k, b));
    }
    let dir = tempfile::tempdir().unwrap();
    // The 80 KB tensor alone in a shard, the others in two more.
    let opts = SaveOptions::new().max_shard_size(160).metadata(meta);
    store.save_sharded(dir.path(), &opts).unwrap();

    let index_path = dir.path().join("model.safetensors.index.json");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let id = index["metadata"]["scopetree_save_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut shards: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    assert_eq!(shards.len(), 3, "{shards:?}");
    let files = shards
        .into_iter()
        .chain([index_path])
        .map(|path| {
            let shard = path.extension().is_some_and(|e| e == "safetensors");
            let b = with_fixed_id(&std::fs::read(&path).unwrap(), &id, shard);
            std::fs::write(&path, &b).unwrap();
            (path, b)
        })
        .collect();
    let saved = Saved { dir, files, bytes };

    // Unchanged, it loads in every mode.
    let whole = || common::Change::Overwrite(Vec::new());
    for mode in [
        Mode::InPlace {
            convert: false,
            rollback: false,
        },
        Mode::InPlace {
            convert: true,
            rollback: true,
        },
        Mode::Create { floats: None },
        Mode::Create {
            floats: Some(Floats::BF16),
        },
        Mode::Deferred {
            floats: Some(Floats::F32),
            after_check: true,
        },
    ] {
        let input = Input {
            file: 0,
            change: whole(),
            mode,
            staging: 0,
            readers: 2,
        };
        assert!(
            run(&saved, &input),
            "the unchanged checkpoint fails to load: {input:?}"
        );
    }
    saved
});

/// `opts` creating every variable, its floats as `floats` if given.
fn creating(opts: LoadOptions, floats: Option<Floats>) -> LoadOptions {
    let opts = opts.create(true);
    match floats {
        Some(f) => opts.create_floats_as(f.float_dtype()),
        None => opts,
    }
}

/// Fails, saying `what`, unless `store` holds no variable and waits for no
/// load.
fn assert_empty(store: &CandleStore, what: &str) {
    assert_eq!(contents(store), (Vec::new(), false), "{what}");
}

impl Floats {
    fn float_dtype(self) -> FloatDtype {
        match self {
            Self::F16 => FloatDtype::F16,
            Self::BF16 => FloatDtype::BF16,
            Self::F32 => FloatDtype::F32,
        }
    }
}

/// Runs one input's load on the checkpoint; whether it loaded. Panics when
/// what must hold does not.
fn run(saved: &Saved, input: &Input) -> bool {
    for (path, bytes) in &saved.files {
        std::fs::write(path, bytes).unwrap();
    }
    let (path, bytes) = &saved.files[usize::from(input.file) % saved.files.len()];
    let change = || std::fs::write(path, common::changed(bytes, &input.change)).unwrap();

    let mut opts = LoadOptions::new()
        .staging_budget((128 + usize::from(input.staging) * 4) << 10)
        .readers(1 + usize::from(input.readers) % 4);
    let dir = saved.dir.path();
    let (store, loaded) = match input.mode {
        Mode::InPlace { convert, rollback } => {
            change();
            if convert {
                opts = opts.dtype_policy(DtypePolicy::Convert);
            }
            let store = built(convert);
            let before = contents(&store);
            let loaded = store.load(dir, &opts.rollback(rollback));
            if common::failed(&loaded) {
                assert_eq!(contents(&store), before, "a failed load changed the store");
                return false;
            }
            (store, loaded)
        }
        Mode::Create { floats } => {
            change();
            let opts = creating(opts, floats);
            let store = CandleStore::new();
            let loaded = store.load_on(dir, &opts, &Device::Cpu);
            if common::failed(&loaded) {
                assert_empty(&store, "a failed load made variables");
                return false;
            }
            (store, loaded)
        }
        Mode::Deferred {
            floats,
            after_check,
        } => {
            if !after_check {
                change();
            }
            let opts = creating(opts, floats);
            let store = CandleStore::new();
            let loaded = store.load(dir, &opts);
            if common::failed(&loaded) {
                assert!(!after_check, "the unchanged files failed their check");
                assert!(!store.is_pending(), "a failed load waits");
                assert_empty(&store, "a failed load made variables");
                return false;
            }
            // Nothing to create (a checkpoint of no tensors) loads at once.
            if !store.is_pending() {
                assert!(
                    !after_check,
                    "a creating load before the build read the data"
                );
                return check_loaded(saved, &store, dir);
            }
            if after_check {
                change();
            }
            let placed = store.place(&Device::Cpu);
            if common::failed(&placed) {
                assert_empty(&store, "a failed place made variables");
                return false;
            }
            (store, loaded)
        }
    };
    drop(loaded);
    check_loaded(saved, &store, dir)
}

/// After a load succeeded: each variable of the store is a tensor of the
/// checkpoint (so a strict load into the built model loaded every one),
/// and holds the bytes the checkpoint declares for it, converted to its
/// dtype, and those bytes are the saved ones where the shard records
/// checksums. Returns `true`, for [`run`].
fn check_loaded(saved: &Saved, store: &CandleStore, dir: &Path) -> bool {
    let tensors = checkpoint::inspect(dir).expect("a checkpoint that loaded inspects");
    let (vars, pending) = contents(store);
    assert!(!pending, "a load waits after its place");
    for Held {
        key,
        dtype,
        dims,
        bytes: got,
    } in vars
    {
        let ft = tensors.iter().find(|t| t.key == key).unwrap_or_else(|| {
            panic!("`{key}` loaded, but the checkpoint declares no such tensor")
        });
        let shard =
            std::fs::read(dir.join(ft.shard.as_deref().expect("a sharded tensor"))).unwrap();
        let data = common::data_of(&shard).expect("a shard that loaded");
        let raw = &data[ft.begin as usize..ft.end as usize];
        assert_eq!(dims, ft.shape, "`{key}`'s shape");
        if common::records_checksums(&shard) {
            let (_, was) = saved.bytes.iter().find(|(k, _)| *k == key).unwrap();
            let first = raw.iter().zip(was.iter()).position(|(a, b)| a != b);
            assert!(
                raw == was.as_slice(),
                "`{key}`'s bytes changed (first at byte {first:?} of {}), and its checksum passed",
                raw.len()
            );
        }
        if let Some(want) = converted(raw, ft.dtype, dtype) {
            let (got, want) = if ft.dtype == Dtype::F64 && dtype == DType::F32 {
                (any_nan(&got), any_nan(&want))
            } else {
                (got, want)
            };
            assert!(
                got == want,
                "`{key}` holds other bytes than its file's, converted to {dtype:?}"
            );
        }
    }
    true
}

/// `f32` elements with every NaN made one (of its sign): an f64 NaN
/// converts to an f32 NaN of its sign whose payload no oracle here fixes.
fn any_nan(f32s: &[u8]) -> Vec<u8> {
    f32s.chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .map(|v| if v.is_nan() { f32::NAN.copysign(v) } else { v })
        .flat_map(f32::to_le_bytes)
        .collect()
}

/// `raw` (elements of `from`) as elements of `to`, converted as a load
/// converts floats (through f32, which holds every f16, bf16 and f32
/// exactly; f64 to f32 rounded to nearest); `None` for f64 to a 16-bit
/// float, rounded there in one step that `tests/float_rounding.rs` checks.
fn converted(raw: &[u8], from: Dtype, to: DType) -> Option<Vec<u8>> {
    if format!("{from:?}").eq_ignore_ascii_case(to.as_str()) {
        return Some(raw.to_vec());
    }
    let values: Vec<f32> = match from {
        Dtype::F16 => raw
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => raw
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F32 => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        Dtype::F64 if to == DType::F32 => raw
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()) as f32)
            .collect(),
        Dtype::F64 => return None,
        other => panic!("a {other:?} tensor loaded into a {to:?} variable"),
    };
    Some(match to {
        DType::F16 => values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F64 => values
            .iter()
            .flat_map(|v| f64::from(*v).to_le_bytes())
            .collect(),
        other => panic!("a {from:?} tensor loaded into a {other:?} variable"),
    })
}

fuzz_target!(|input: Input| {
    run(&SAVED, &input);
});
