//! The small sequence model the candle tests build: `emb` (8 → 4), `gru`
//! (4 → 5), `out` (5 → 8), on a fixed batch of two sequences of 4 tokens;
//! and how to name a list of the store's `Var`s.

use candle_core::{Device, Module, Tensor, Var};
use candle_nn::VarBuilder;
use candle_nn::rnn::{GRUConfig, RNN};
use scopetree::candle::CandleStore;

/// Its 7 variables, sorted.
pub const NAMES: [&str; 7] = [
    "emb.weight",
    "gru.bias_hh_l0",
    "gru.bias_ih_l0",
    "gru.weight_hh_l0",
    "gru.weight_ih_l0",
    "out.bias",
    "out.weight",
];

/// emb → gru → out.
pub struct Tiny {
    pub emb: candle_nn::Embedding,
    pub gru: candle_nn::GRU,
    pub out: candle_nn::Linear,
}

impl Tiny {
    /// Builds the model through `vb`.
    pub fn build(vb: &VarBuilder) -> candle_core::Result<Self> {
        Ok(Self {
            emb: candle_nn::embedding(8, 4, vb.pp("emb"))?,
            gru: candle_nn::gru(4, 5, GRUConfig::default(), vb.pp("gru"))?,
            out: candle_nn::linear(5, 8, vb.pp("out"))?,
        })
    }

    /// Logits `(8, 8)` of the fixed batch.
    pub fn logits(&self) -> candle_core::Result<Tensor> {
        let ids = Tensor::new(&[[1u32, 2, 3, 4], [7, 6, 5, 0]], &Device::Cpu)?;
        let states = self.gru.seq(&self.emb.forward(&ids)?)?;
        let hs: Vec<Tensor> = states.iter().map(|s| s.h().clone()).collect();
        self.out.forward(&Tensor::stack(&hs, 1)?)?.reshape((8, 8))
    }

    /// Cross-entropy of the fixed batch against fixed targets.
    pub fn loss(&self) -> candle_core::Result<Tensor> {
        let targets = Tensor::new(&[2u32, 3, 4, 5, 6, 5, 0, 1], &Device::Cpu)?;
        candle_nn::loss::cross_entropy(&self.logits()?, &targets)
    }
}

/// The names of `vars`, found by tensor identity among the store's.
pub fn names_of(store: &CandleStore, vars: &[Var]) -> Vec<String> {
    let named = store
        .named_vars()
        .expect("the store's names are valid dotted names");
    vars.iter()
        .map(|v| {
            named
                .iter()
                .find(|(_, n)| n.as_tensor().id() == v.as_tensor().id())
                .map(|(k, _)| k.clone())
                .expect("a var of the store")
        })
        .collect()
}
