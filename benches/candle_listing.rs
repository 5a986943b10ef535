//! What a save beside training costs the training loop before any byte
//! moves: listing a candle store's variables by dotted name, on a
//! llama-shaped store (32 layers of 9 tensors, an embedding, a norm and a
//! head: 291 variables, 4 `f32` elements each, so that copies cost next to
//! nothing).
//!
//! Group `candle_listing`:
//! - `named_vars`: `CandleStore::named_vars`, the listing every save and
//!   `AsyncSaver::save_sharded` starts with;
//! - `async_save_blocked`: `AsyncSaver::save_sharded`'s time in the caller
//!   (listing, staging, starting the writer), the background write waited
//!   for outside the timed span.
//!
//! `cargo bench --features candle --bench candle_listing`

use std::hint::black_box;
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use candle_nn::Init;
use criterion::{Criterion, criterion_group, criterion_main};
use scopetree::candle::{AsyncSaver, CandleStore};
use scopetree::checkpoint::SaveOptions;

const LAYERS: usize = 32;

/// The llama-shaped store.
fn store() -> CandleStore {
    let store = CandleStore::new();
    let mut names = vec![
        "model.embed_tokens.weight".to_owned(),
        "model.norm.weight".to_owned(),
        "lm_head.weight".to_owned(),
    ];
    for l in 0..LAYERS {
        for t in [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
            "input_layernorm",
            "post_attention_layernorm",
        ] {
            names.push(format!("model.layers.{l}.{t}.weight"));
        }
    }
    for n in &names {
        store
            .get(4, n, Init::Const(0.5), DType::F32, &Device::Cpu)
            .expect("a fresh name");
    }
    store
}

fn candle_listing(c: &mut Criterion) {
    let store = store();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut g = c.benchmark_group("candle_listing");
    g.bench_function("named_vars", |b| {
        b.iter(|| black_box(store.named_vars().expect("a listing")));
    });
    let mut saver = AsyncSaver::new(64 << 20);
    g.bench_function("async_save_blocked", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                let to = dir.path().join(format!("{}", i % 2));
                let t = Instant::now();
                let staged = saver
                    .save_sharded(&[(&store, to)], &SaveOptions::new())
                    .expect("a save");
                total += t.elapsed();
                black_box(staged);
                saver.wait().expect("the write");
            }
            total
        });
    });
    g.finish();
}

criterion_group!(benches, candle_listing);
criterion_main!(benches);
