//! Checkpoints across ranks: [`SyncPlan`](crate::ranks::SyncPlan)'s saves
//! and loads. One rank saving and every rank loading one file; every rank
//! writing and reading a share of a Hugging Face sharded checkpoint, with
//! the sliced state under its own index; a directory of such checkpoints
//! kept by step; and saves written by a background thread beside training.
//!
//! The files, from the bottom up (each imports only files above it in
//! this list):
//!
//! | file | role |
//! |---|---|
//! | `checkpoint.rs` | [`SyncPlan`](crate::ranks::SyncPlan)'s checkpoints on one rank: `save_on_root`, `load_on_all` |
//! | `state_shards.rs` | the sliced state's part of a sharded checkpoint |
//! | `shards.rs` | [`SyncPlan`](crate::ranks::SyncPlan)'s checkpoints written and read by every rank: `save_shards`, `load_shards` |
//! | `staged.rs` | a save's shards staged for a background thread to write |
//! | `plans.rs` | [`ShardedPlan`](crate::ranks::ShardedPlan): the plans a manager keeps and a saver writes; [`SyncPlan`](crate::ranks::SyncPlan)'s staging |
//! | `manager.rs` | [`CheckpointManager`](crate::ranks::CheckpointManager): a step per directory, the latest pointer, keep-last-K |
//! | `async_save.rs` | [`AsyncSaver`](crate::ranks::AsyncSaver): saves written by a background thread beside training |
//!
//! It may import `plan/`, `layout/`, `vars/`, `transport/` and the
//! layer's `error.rs`.

pub(super) mod async_save;
pub(super) mod checkpoint;
pub(super) mod manager;
pub(super) mod plans;
pub(super) mod shards;
pub(super) mod staged;
pub(super) mod state_shards;
