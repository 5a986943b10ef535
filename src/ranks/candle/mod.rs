//! Candle (feature `candle`): [`CandlePlan`](crate::ranks::CandlePlan), the
//! plan of a `CandleStore`'s trainable variables, whose gradients it
//! reduces in candle's `GradStore`, with the in-place all-reduce and the
//! checkpoints every rank writes and reads. The top room of the ranks
//! layer: it uses the plan's rooms below it, and nothing imports it.
//!
//! | file | role |
//! |---|---|
//! | `chunks.rs` | exchanges of tensors off the host a chunk at a time through staging (page-locked on CUDA), two chunks in flight: the all-reduce of large gradients, ZeRO's reduce-scatter and all-gather |
//! | `host.rs` | host copies of candle tensors: a CPU tensor's bytes read and written in place, a device tensor's pieces through host memory, the error naming a variable |
//! | `in_tensors.rs` | tensors as the values of a bucketed broadcast, written in place on their devices |
//! | `in_place.rs` | the in-place swap of `CandlePlan::all_reduce_in_place` |
//! | `plan.rs` | [`CandlePlan`](crate::ranks::CandlePlan): agreement, broadcast, all-reduce, consistency, checkpoints on one rank |
//! | `shards.rs` | `CandlePlan`'s checkpoints written and read by every rank: `save_shards`, `load_shards` |
//! | `staging.rs` | `CandlePlan` as a [`ShardedPlan`](crate::ranks::ShardedPlan): kept by a `CheckpointManager`, written beside training by an `AsyncSaver` |
//! | `training.rs` | [`Training`](crate::ranks::Training): a store with its optimizer (`ZeroAdamW` or a replicated `AdamW`), one checkpoint a `CheckpointManager` keeps, loaded both parts or neither |
//! | `zero.rs` | ZeRO stage 1 for `CandlePlan`: its partition, `reduce_scatter` of a `GradStore`, `all_gather` of the `Var`s |
//! | `zero_adamw.rs` | [`ZeroAdamW`](crate::ranks::ZeroAdamW): AdamW over one rank's slice, its moments on the device |
//! | `zero_state.rs` | `ZeroAdamW`'s state in checkpoints: `save_shards` by every rank, `load_shards` at any number of ranks |
//!
//! It may import every room of the layer: `checkpoints/`, `plan/`,
//! `layout/`, `vars/`, `transport/` and `error.rs`.

pub(super) mod chunks;
pub(super) mod host;
pub(super) mod in_place;
pub(super) mod in_tensors;
pub(super) mod plan;
pub(super) mod shards;
pub(super) mod staging;
pub(super) mod training;
pub(super) mod zero;
pub(super) mod zero_adamw;
pub(super) mod zero_state;
