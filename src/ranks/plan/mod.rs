//! Plan: [`SyncPlan`](crate::ranks::SyncPlan), a scope's variables agreed
//! once, and every collective it runs on them. The options every rank
//! passes, how ranks settle failures and arguments before a call, the
//! buckets and the bucketed all-reduce and broadcast, the consistency
//! check, and ZeRO stage 1's exchange (`reduce_scatter`, `all_gather`) over
//! the cuts of `layout/`, whose buffers the plan owns.
//!
//! The files, from the bottom up (each imports only files above it in
//! this list):
//!
//! | file | role |
//! |---|---|
//! | `options.rs` | [`PlanOptions`](crate::ranks::PlanOptions), [`Reduce`](crate::ranks::Reduce), [`DEFAULT_BUCKET_BYTES`](crate::ranks::DEFAULT_BUCKET_BYTES) |
//! | `agree.rs` | how ranks exchange failures and arguments before a collective |
//! | `buckets.rs`, `bucketed.rs` | cutting variables into buckets; the bucketed all-reduce and broadcast |
//! | `consistency.rs` | the consistency check: the first variable whose bytes differ |
//! | `scatter.rs` | the buffers and copies of ZeRO's reduce-scatter and all-gather |
//! | `sync_plan.rs` | [`SyncPlan`](crate::ranks::SyncPlan): agreement, broadcast, all-reduce, consistency |
//! | `zero.rs` | [`SyncPlan`](crate::ranks::SyncPlan)'s partitioned exchange (ZeRO stage 1) |
//!
//! It may import `layout/`, `vars/`, `transport/` and the layer's `error.rs`.

pub(super) mod agree;
pub(super) mod bucketed;
pub(super) mod buckets;
pub(super) mod consistency;
pub(super) mod options;
pub(super) mod scatter;
pub(super) mod sync_plan;
pub(super) mod zero;
