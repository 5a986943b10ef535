//! The same candle-nn model trained through `VarMap` and through
//! `CandleStore` (issue 11): a character-level GRU on Cicero's *De finibus*
//! I (`lipsum::LIBER_PRIMUS`), started from one set of weights, gives
//! bit-identical losses step after step and byte-identical checkpoint
//! files. candle's CPU RNG cannot be seeded, so model B starts from model
//! A's `VarMap::save`, loaded strictly.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::rnn::{GRUConfig, RNN};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use scopetree::candle::CandleStore;
use scopetree::checkpoint::LoadOptions;

type R = Result<(), Box<dyn std::error::Error>>;

const CPU: Device = Device::Cpu;
const BATCH: usize = 16;
const SEQ: usize = 32;
const STEPS: usize = 40;
const EMB: usize = 16;
const HIDDEN: usize = 64;
/// Between consecutive windows of the text (a prime, so windows spread over
/// the whole text without an RNG).
const STRIDE: usize = 2_903;

struct CharGru {
    emb: candle_nn::Embedding,
    gru: candle_nn::GRU,
    out: candle_nn::Linear,
    vocab: usize,
}

impl CharGru {
    fn build(vocab: usize, vb: &VarBuilder) -> candle_core::Result<Self> {
        Ok(Self {
            emb: candle_nn::embedding(vocab, EMB, vb.pp("emb"))?,
            gru: candle_nn::gru(EMB, HIDDEN, GRUConfig::default(), vb.pp("gru"))?,
            out: candle_nn::linear(HIDDEN, vocab, vb.pp("out"))?,
            vocab,
        })
    }

    /// Mean cross-entropy of predicting each next character.
    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
        let states = self.gru.seq(&self.emb.forward(inputs)?)?;
        // GRU::states_to_tensor concatenates to (B, T·H); stack to (B, T, H).
        let hs: Vec<Tensor> = states.iter().map(|s| s.h().clone()).collect();
        let logits = self.out.forward(&Tensor::stack(&hs, 1)?)?;
        let logits = logits.reshape((BATCH * SEQ, self.vocab))?;
        candle_nn::loss::cross_entropy(&logits, &targets.flatten_all()?)
    }
}

/// The text as character ids, and the vocabulary size.
fn corpus() -> (Vec<u32>, usize) {
    let chars: Vec<char> = lipsum::LIBER_PRIMUS.chars().collect();
    let mut vocab = chars.clone();
    vocab.sort_unstable();
    vocab.dedup();
    let ids = chars
        .iter()
        .map(|c| vocab.binary_search(c).expect("in the vocabulary") as u32)
        .collect();
    (ids, vocab.len())
}

/// Batch `step`: BATCH windows of SEQ + 1 characters at fixed strided
/// offsets, as (inputs, targets shifted by one).
fn batch(ids: &[u32], step: usize) -> candle_core::Result<(Tensor, Tensor)> {
    let span = ids.len() - (SEQ + 1);
    let mut inputs = Vec::with_capacity(BATCH * SEQ);
    let mut targets = Vec::with_capacity(BATCH * SEQ);
    for row in 0..BATCH {
        let at = ((step * BATCH + row) * STRIDE) % span;
        inputs.extend_from_slice(&ids[at..at + SEQ]);
        targets.extend_from_slice(&ids[at + 1..at + SEQ + 1]);
    }
    Ok((
        Tensor::from_vec(inputs, (BATCH, SEQ), &CPU)?,
        Tensor::from_vec(targets, (BATCH, SEQ), &CPU)?,
    ))
}

fn adamw(vars: Vec<candle_core::Var>) -> candle_core::Result<AdamW> {
    AdamW::new(
        vars,
        ParamsAdamW {
            lr: 3e-3,
            ..ParamsAdamW::default()
        },
    )
}

#[test]
fn varmap_and_scopetree_train_bit_identically_from_one_checkpoint() -> R {
    let (ids, vocab) = corpus();
    assert_eq!(ids.len(), 49_068);
    assert_eq!(vocab, 57);
    let dir = tempfile::tempdir()?;
    let init = dir.path().join("init.safetensors");

    // Model A on VarMap, its random initial weights saved.
    let varmap = VarMap::new();
    let model_a = CharGru::build(vocab, &VarBuilder::from_varmap(&varmap, DType::F32, &CPU))?;
    varmap.save(&init)?;

    // Model B on scopetree, started from A's weights (a strict load).
    let store = CandleStore::new();
    let model_b = CharGru::build(vocab, &store.var_builder(DType::F32, &CPU))?;
    let names = [
        "emb.weight",
        "gru.bias_hh_l0",
        "gru.bias_ih_l0",
        "gru.weight_hh_l0",
        "gru.weight_ih_l0",
        "out.bias",
        "out.weight",
    ];
    assert_eq!(store.load(&init, &LoadOptions::new())?.loaded, names);

    let mut opt_a = adamw(varmap.all_vars())?;
    let mut opt_b = adamw(store.trainable_vars("")?)?;
    let mut losses = Vec::with_capacity(STEPS);
    for step in 0..STEPS {
        let (inputs, targets) = batch(&ids, step)?;
        let loss_a = model_a.loss(&inputs, &targets)?;
        let loss_b = model_b.loss(&inputs, &targets)?;
        let (a, b) = (loss_a.to_scalar::<f32>()?, loss_b.to_scalar::<f32>()?);
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "step {step}: VarMap {a}, scopetree {b}"
        );
        losses.push(a);
        opt_a.backward_step(&loss_a)?;
        opt_b.backward_step(&loss_b)?;
    }
    // It learns: from about ln 57 ≈ 4.04 (or above) to well below.
    let (first, last) = (losses[0], losses[STEPS - 1]);
    eprintln!("loss at step 0: {first}, at step {}: {last}", STEPS - 1);
    assert!(first > 3.5, "step 0 loss {first}");
    assert!(last < first - 1.0, "losses {first} → {last}");

    // The trained weights save to the same bytes.
    let a_file = dir.path().join("varmap.safetensors");
    let b_file = dir.path().join("scopetree.safetensors");
    varmap.save(&a_file)?;
    store.save(&b_file)?;
    let (a_bytes, b_bytes) = (std::fs::read(&a_file)?, std::fs::read(&b_file)?);
    assert_eq!(a_bytes, b_bytes);
    // ... and they are the trained weights, not the initial ones.
    assert_ne!(std::fs::read(&init)?, b_bytes);
    Ok(())
}
