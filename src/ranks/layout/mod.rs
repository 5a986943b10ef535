//! Layout: how a plan's variables and their optimizer state are cut across
//! the ranks. The [`Partition`](crate::ranks::Partition) of ZeRO stage 1
//! (each rank's contiguous slice), the [sliced state](crate::ranks::SlicedState)
//! whose pieces follow it, and moving that state between whole tensors and
//! the ranks' pieces. The exchanges over these cuts (`reduce_scatter`,
//! `all_gather`) are the plan's, in `plan/`: [`SyncPlan`](crate::ranks::SyncPlan)
//! owns their buffers.
//!
//! | file | role |
//! |---|---|
//! | `partition.rs` | [`Partition`](crate::ranks::Partition), [`Piece`](crate::ranks::Piece): each rank's slice (ZeRO) |
//! | `sliced.rs` | [`SlicedState`](crate::ranks::SlicedState): optimizer state held as each rank's pieces, and its layout |
//! | `slices.rs` | moving sliced state between whole tensors and the ranks' pieces |
//!
//! It may import `vars/`, `transport/` and the layer's `error.rs`.

pub(super) mod partition;
pub(super) mod sliced;
pub(super) mod slices;
