//! The model the candle peer benches and probes build: a small GPT-style
//! transformer (embeddings, 16 pre-norm blocks of attention and MLP, a
//! final norm and a head), named as GPT-2 names its tensors, built with
//! candle-nn layers through any `VarBuilder`.

use candle_core::{D, Module, Result, Tensor};
use candle_nn::{Embedding, LayerNorm, Linear, VarBuilder};

/// The shape of the transformer.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub layers: usize,
    pub d_model: usize,
    pub heads: usize,
    pub vocab: usize,
    pub seq: usize,
}

pub const D64: Config = Config {
    layers: 16,
    d_model: 64,
    heads: 4,
    vocab: 64,
    seq: 16,
};

pub const D8: Config = Config { d_model: 8, ..D64 };

/// One pre-norm transformer block: `ln1`, `attn.{q,k,v,o}`, `ln2`,
/// `mlp.{fc,proj}`.
pub struct Block {
    ln1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln2: LayerNorm,
    fc: Linear,
    proj: Linear,
}

/// `wte`, `wpe`, `h.{i}` blocks, `ln_f`, `head`.
pub struct Gpt {
    pub cfg: Config,
    wte: Embedding,
    wpe: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Linear,
}

/// Tensors a model of `cfg` names: two embeddings, 16 per block, the final
/// norm's two, the head's two.
pub fn tensor_count(cfg: Config) -> usize {
    2 + 16 * cfg.layers + 2 + 2
}

pub fn build(vb: &VarBuilder, cfg: Config) -> Result<Gpt> {
    let d = cfg.d_model;
    let wte = candle_nn::embedding(cfg.vocab, d, vb.pp("wte"))?;
    let wpe = candle_nn::embedding(cfg.seq, d, vb.pp("wpe"))?;
    let mut blocks = Vec::with_capacity(cfg.layers);
    for i in 0..cfg.layers {
        let b = vb.pp("h").pp(i);
        let attn = b.pp("attn");
        let mlp = b.pp("mlp");
        blocks.push(Block {
            ln1: candle_nn::layer_norm(d, 1e-5, b.pp("ln1"))?,
            q: candle_nn::linear(d, d, attn.pp("q"))?,
            k: candle_nn::linear(d, d, attn.pp("k"))?,
            v: candle_nn::linear(d, d, attn.pp("v"))?,
            o: candle_nn::linear(d, d, attn.pp("o"))?,
            ln2: candle_nn::layer_norm(d, 1e-5, b.pp("ln2"))?,
            fc: candle_nn::linear(d, 4 * d, mlp.pp("fc"))?,
            proj: candle_nn::linear(4 * d, d, mlp.pp("proj"))?,
        });
    }
    let ln_f = candle_nn::layer_norm(d, 1e-5, vb.pp("ln_f"))?;
    let head = candle_nn::linear(d, cfg.vocab, vb.pp("head"))?;
    Ok(Gpt {
        cfg,
        wte,
        wpe,
        blocks,
        ln_f,
        head,
    })
}

/// Layer norm through candle's differentiable slow path: `LayerNorm`'s
/// forward on a contiguous input is a custom op without a backward pass.
fn norm(ln: &LayerNorm, x: &Tensor) -> Result<Tensor> {
    let bias = ln.bias().expect("layer_norm has a bias");
    candle_nn::ops::layer_norm_slow(x, ln.weight(), bias, 1e-5)
}

impl Gpt {
    /// Logits `(batch, seq, vocab)` of tokens `x: (batch, seq)`; `mask` is
    /// the causal mask `(seq, seq)`.
    pub fn forward(&self, x: &Tensor, pos: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (b, t) = x.dims2()?;
        let (d, h) = (self.cfg.d_model, self.cfg.heads);
        let hd = d / h;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut x = self
            .wte
            .forward(x)?
            .broadcast_add(&self.wpe.forward(pos)?)?;
        let heads = |y: Tensor| -> Result<Tensor> {
            y.reshape((b, t, h, hd))?.transpose(1, 2)?.contiguous()
        };
        for blk in &self.blocks {
            let a = norm(&blk.ln1, &x)?;
            let q = heads(blk.q.forward(&a)?)?;
            let k = heads(blk.k.forward(&a)?)?;
            let v = heads(blk.v.forward(&a)?)?;
            let att = (q.matmul(&k.t()?.contiguous()?)? * scale)?.broadcast_add(mask)?;
            let att = candle_nn::ops::softmax(&att, D::Minus1)?;
            let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, d))?;
            x = (x + blk.o.forward(&y)?)?;
            let m = norm(&blk.ln2, &x)?;
            let m = blk.proj.forward(&blk.fc.forward(&m)?.gelu()?)?;
            x = (x + m)?;
        }
        self.head.forward(&norm(&self.ln_f, &x)?)
    }
}
