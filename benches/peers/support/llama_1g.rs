//! A Llama (candle-transformers' `llama`) of about 1 GiB of `f32`
//! parameters, saved once as a Hugging Face sharded checkpoint: the model
//! the sharded-load bench and its peak-memory probe build.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use candle_transformers::models::llama::{Config, Llama, LlamaConfig, LlamaEosToks};
use scopetree::candle::CandleStore;
use scopetree::checkpoint::SaveOptions;

/// `big`: 16 layers of width 1024, a 32,000-token vocabulary and an untied
/// head, 271 M parameters (1.08 GB of `f32`); otherwise a tiny one for
/// criterion's test mode.
pub fn config(big: bool) -> Config {
    let (hidden, inter, layers, vocab) = if big {
        (1024, 2816, 16, 32_000)
    } else {
        (32, 64, 2, 96)
    };
    LlamaConfig {
        hidden_size: hidden,
        intermediate_size: inter,
        vocab_size: vocab,
        num_hidden_layers: layers,
        num_attention_heads: 16,
        num_key_value_heads: Some(16),
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        bos_token_id: Some(1),
        eos_token_id: Some(LlamaEosToks::Single(2)),
        rope_scaling: None,
        max_position_embeddings: 256,
        tie_word_embeddings: Some(false),
    }
    .into_config(false)
}

/// The shard files of the checkpoint in `dir`, made (with random weights,
/// in shards of at most 300 MB) if the directory holds none yet.
pub fn checkpoint(dir: &Path, cfg: &Config) -> Vec<PathBuf> {
    if !dir.join("model.safetensors.index.json").exists() {
        let store = CandleStore::new();
        Llama::load(store.var_builder(DType::F32, &Device::Cpu), cfg).unwrap();
        let opts = SaveOptions::new().max_shard_size(300_000_000);
        store.save_sharded(dir, &opts).unwrap();
    }
    let mut shards: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    shards
}
