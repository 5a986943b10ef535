//! Small burn modules for the burn tests (ndarray backend), and a snapshot
//! of a module's every tensor (path, dtype, shape, bytes, id) to compare
//! modules bit for bit.
#![allow(dead_code)]

use burn_core as burn;
use burn_core::module::{Module, Param, ParamId};
use burn_core::tensor::{Bool, DType, Device, Int, Tensor, TensorData};
use burn_store::{ModuleSnapshot, bridge};

/// One parameter of every dtype burn's ndarray backend holds.
#[derive(Module, Debug)]
pub struct AllDtypes {
    pub f32: Param<Tensor<2>>,
    pub f64: Param<Tensor<2>>,
    pub i64: Param<Tensor<1, Int>>,
    pub i32: Param<Tensor<1, Int>>,
    pub i16: Param<Tensor<1, Int>>,
    pub i8: Param<Tensor<1, Int>>,
    pub u64: Param<Tensor<1, Int>>,
    pub u32: Param<Tensor<1, Int>>,
    pub u16: Param<Tensor<1, Int>>,
    pub u8: Param<Tensor<1, Int>>,
    pub flags: Param<Tensor<2, Bool>>,
}

/// A deterministic stream of 64-bit words (splitmix64).
pub struct Bits(pub u64);

impl Bits {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn int_param<E: burn_core::tensor::Element>(
    v: Vec<E>,
    dtype: DType,
    device: &Device,
) -> Param<Tensor<1, Int>> {
    let n = v.len();
    Param::initialized(
        ParamId::new(),
        Tensor::from_data(TensorData::new(v, [n]), (device, dtype)),
    )
}

impl AllDtypes {
    /// Values from `seed`: floats of every bit pattern class (NaN payloads,
    /// infinities, signed zeros, subnormals), integers across their range.
    /// With `seed == 0`, all zeros (false). Fresh `ParamId`s.
    pub fn new(seed: u64, device: &Device) -> Self {
        let mut b = Bits(seed);
        let mut word = move || if seed == 0 { 0 } else { b.next() };
        let specials32 = [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7fa0_0001),
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            f32::from_bits(1),
            f32::MAX,
            f32::MIN_POSITIVE,
        ];
        let f32s: Vec<f32> = (0..12)
            .map(|i| {
                if seed != 0 && i < specials32.len() {
                    specials32[i]
                } else {
                    f32::from_bits(word() as u32)
                }
            })
            .collect();
        let f64s: Vec<f64> = (0..6)
            .map(|i| {
                if seed != 0 && i == 0 {
                    f64::from_bits(0x7ff0_0000_0000_0123)
                } else {
                    f64::from_bits(word())
                }
            })
            .collect();
        let flags: Vec<bool> = (0..6).map(|_| word() & 1 == 1).collect();
        Self {
            f32: Param::from_tensor(Tensor::from_data(
                TensorData::new(f32s, [3, 4]),
                (device, DType::F32),
            )),
            f64: Param::from_tensor(Tensor::from_data(
                TensorData::new(f64s, [2, 3]),
                (device, DType::F64),
            )),
            i64: int_param((0..5).map(|_| word() as i64).collect(), DType::I64, device),
            i32: int_param((0..5).map(|_| word() as i32).collect(), DType::I32, device),
            i16: int_param((0..5).map(|_| word() as i16).collect(), DType::I16, device),
            i8: int_param((0..5).map(|_| word() as i8).collect(), DType::I8, device),
            u64: int_param((0..5).map(|_| word()).collect(), DType::U64, device),
            u32: int_param((0..5).map(|_| word() as u32).collect(), DType::U32, device),
            u16: int_param((0..5).map(|_| word() as u16).collect(), DType::U16, device),
            u8: int_param((0..5).map(|_| word() as u8).collect(), DType::U8, device),
            flags: Param::initialized(
                ParamId::new(),
                Tensor::from_data(
                    TensorData::new(flags, [2, 3]),
                    (device, DType::Bool(burn_core::tensor::BoolStore::Native)),
                ),
            ),
        }
    }
}

/// A linear layer and a norm, as a two-layer network would have them.
#[derive(Module, Debug)]
pub struct Block {
    pub w: Param<Tensor<2>>,
    pub b: Param<Tensor<1>>,
}

/// Two blocks and a head: several tensors of several sizes.
#[derive(Module, Debug)]
pub struct Net {
    pub blocks: Vec<Block>,
    pub head: Param<Tensor<2>>,
}

fn counted(start: f32, shape: [usize; 2], device: &Device) -> Tensor<2> {
    let n = shape[0] * shape[1];
    let v: Vec<f32> = (0..n).map(|i| start + i as f32 * 0.25).collect();
    Tensor::from_data(TensorData::new(v, shape), device)
}

impl Net {
    /// A net whose values all start at `start` and count up by 0.25.
    pub fn new(start: f32, device: &Device) -> Self {
        let block = |k: usize| Block {
            w: Param::from_tensor(counted(start + k as f32 * 100.0, [4, 8], device)),
            b: Param::from_tensor(
                counted(start + k as f32 * 100.0 + 50.0, [1, 8], device).reshape([8]),
            ),
        };
        Self {
            blocks: vec![block(0), block(1)],
            head: Param::from_tensor(counted(start + 1000.0, [8, 2], device)),
        }
    }
}

/// One tensor of a module: path, dtype, shape, bytes and `ParamId`.
pub type Snap = (String, DType, Vec<usize>, Vec<u8>, Option<u64>);

/// Every tensor of `m`, by path.
pub fn snapshot<M: Module>(m: &M) -> Vec<Snap> {
    let mut out: Vec<_> = m
        .collect(None, None, false)
        .into_iter()
        .map(|t| {
            let data = bridge::to_data(&t).expect("a module tensor reads back");
            (
                t.name.clone(),
                t.dtype,
                t.shape.to_vec(),
                data.as_bytes().to_vec(),
                t.param_id,
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The `ParamId`s of `m`, by path.
pub fn ids<M: Module>(m: &M) -> Vec<(String, Option<u64>)> {
    snapshot(m).into_iter().map(|s| (s.0, s.4)).collect()
}

/// The values of `m` only (no ids), by path.
pub fn values<M: Module>(m: &M) -> Vec<(String, DType, Vec<usize>, Vec<u8>)> {
    snapshot(m)
        .into_iter()
        .map(|s| (s.0, s.1, s.2, s.3))
        .collect()
}

/// A fresh `ParamId`, to tell ids apart.
pub fn fresh_id() -> ParamId {
    ParamId::new()
}

/// Llama's attention projections (no bias), as burn-nn layers.
#[derive(Module, Debug)]
pub struct Attn {
    pub q: burn_nn::Linear,
    pub k: burn_nn::Linear,
}

/// One Llama-shaped layer.
#[derive(Module, Debug)]
pub struct Layer {
    pub attn: Attn,
    pub norm: burn_nn::RmsNorm,
}

/// A tiny Llama-shaped model with burn's own names: `embed.weight`,
/// `layers.N.attn.{q,k}.weight` (`[in, out]`), `layers.N.norm.gamma`,
/// `norm.gamma`, `head.weight`.
#[derive(Module, Debug)]
pub struct Llama {
    pub embed: burn_nn::Embedding,
    pub layers: Vec<Layer>,
    pub norm: burn_nn::RmsNorm,
    pub head: burn_nn::Linear,
}

/// Vocabulary, width and depth of [`Llama::init`].
pub const VOCAB: usize = 16;
pub const DIM: usize = 8;
pub const LAYERS: usize = 2;

impl Llama {
    /// Built lazily (no parameter initialized until used or loaded).
    pub fn init(device: &Device) -> Self {
        let linear = |i, o| {
            burn_nn::LinearConfig::new(i, o)
                .with_bias(false)
                .init(device)
        };
        Self {
            embed: burn_nn::EmbeddingConfig::new(VOCAB, DIM).init(device),
            layers: (0..LAYERS)
                .map(|_| Layer {
                    attn: Attn {
                        q: linear(DIM, DIM),
                        k: linear(DIM, DIM),
                    },
                    norm: burn_nn::RmsNormConfig::new(DIM).init(device),
                })
                .collect(),
            norm: burn_nn::RmsNormConfig::new(DIM).init(device),
            head: linear(DIM, VOCAB),
        }
    }
}

/// The Hugging Face names and PyTorch shapes of [`Llama`]'s tensors, in
/// a fixed order (the order `value` numbers them in).
pub fn hub_tensors() -> Vec<(String, Vec<usize>)> {
    let mut out = vec![("model.embed_tokens.weight".to_owned(), vec![VOCAB, DIM])];
    for l in 0..LAYERS {
        out.push((
            format!("model.layers.{l}.self_attn.q_proj.weight"),
            vec![DIM, DIM],
        ));
        out.push((
            format!("model.layers.{l}.self_attn.k_proj.weight"),
            vec![DIM, DIM],
        ));
        out.push((
            format!("model.layers.{l}.input_layernorm.weight"),
            vec![DIM],
        ));
    }
    out.push(("model.norm.weight".to_owned(), vec![DIM]));
    out.push(("lm_head.weight".to_owned(), vec![VOCAB, DIM]));
    out
}

/// Element `i` (row-major, PyTorch layout) of hub tensor number `k`: what
/// the Python and Rust writers both write.
pub fn value(k: usize, i: usize) -> f32 {
    (k * 1000 + i) as f32 * 0.001 - 0.5
}

/// The remapping from Hugging Face Llama names to [`Llama`]'s paths.
pub const HUB_TO_BURN: &[(&str, &str)] = &[
    (r"^model\.embed_tokens\.", "embed."),
    (r"^model\.layers\.", "layers."),
    (r"\.self_attn\.q_proj\.", ".attn.q."),
    (r"\.self_attn\.k_proj\.", ".attn.k."),
    (r"\.input_layernorm\.", ".norm."),
    (r"^model\.norm\.", "norm."),
    (r"^lm_head\.", "head."),
];

/// Checks that `m` holds the hub values: PyTorch's `[out, in]` Linear
/// weights transposed into burn's `[in, out]`, `round` applied to each
/// value (the identity for f32 files).
pub fn assert_hub_values(m: &Llama, round: impl Fn(f32) -> f32) {
    let hub = hub_tensors();
    let idx = |name: &str| hub.iter().position(|(n, _)| n == name).unwrap();
    let read = |t: Tensor<2>| t.into_data().try_into_vec::<f32>().unwrap();
    let read1 = |t: Tensor<1>| t.into_data().try_into_vec::<f32>().unwrap();
    let want_plain =
        |k: usize, n: usize| -> Vec<f32> { (0..n).map(|i| round(value(k, i))).collect() };
    let want_t = |k: usize, rows: usize, cols: usize| -> Vec<f32> {
        // burn [cols, rows] from PyTorch [rows, cols].
        let mut v = vec![0.0; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                v[c * rows + r] = round(value(k, r * cols + c));
            }
        }
        v
    };
    assert_eq!(
        read(m.embed.weight.val()),
        want_plain(idx("model.embed_tokens.weight"), VOCAB * DIM)
    );
    for (l, layer) in m.layers.iter().enumerate() {
        let q = idx(&format!("model.layers.{l}.self_attn.q_proj.weight"));
        let k = idx(&format!("model.layers.{l}.self_attn.k_proj.weight"));
        let n = idx(&format!("model.layers.{l}.input_layernorm.weight"));
        assert_eq!(
            read(layer.attn.q.weight.val()),
            want_t(q, DIM, DIM),
            "layer {l} q"
        );
        assert_eq!(
            read(layer.attn.k.weight.val()),
            want_t(k, DIM, DIM),
            "layer {l} k"
        );
        assert_eq!(
            read1(layer.norm.gamma.val()),
            want_plain(n, DIM),
            "layer {l} norm"
        );
    }
    assert_eq!(
        read1(m.norm.gamma.val()),
        want_plain(idx("model.norm.weight"), DIM)
    );
    assert_eq!(
        read(m.head.weight.val()),
        want_t(idx("lm_head.weight"), VOCAB, DIM)
    );
}
