//! Transport: how bytes move between the ranks, and the watchdog around each
//! move. The lowest room of the ranks layer: it knows nothing of trees,
//! manifests or plans.
//!
//! | file | role |
//! |---|---|
//! | `pipeline.rs` | [`Pipeline`](crate::ranks::Pipeline): the buckets of one all-reduce, filled and drained around their transfers |
//! | `collective.rs` | [`Collective`](crate::ranks::Collective), [`SingleProcess`](crate::ranks::SingleProcess), [`Digest`](crate::ranks::Digest) |
//! | `mpi.rs` | [`Collective`](crate::ranks::Collective) for MPI's communicator (feature `mpi`) |
//! | `watchdog.rs` | [`Watch`](crate::ranks::Watch): a rank that waits too long in a collective call ends its process |
//! | `mirror.rs` | `Mirror`, a stand-in world of identical ranks for the candle plans' unit tests (tests with feature `candle` only) |
//!
//! It may import the layer's `error.rs` only.

pub(super) mod collective;
#[cfg(all(test, feature = "candle"))]
pub(crate) mod mirror;
#[cfg(feature = "mpi")]
pub(super) mod mpi;
pub(super) mod pipeline;
pub(super) mod watchdog;
