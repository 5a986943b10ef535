//! Ranks: data-parallel training across processes and hosts. Each process
//! (a *rank*) holds its own tree; a collective library (MPI, feature `mpi`)
//! carries the bytes; this layer adds what MPI does not check.
//!
//! - [`Collective`]: the few collective calls scopetree needs (all-reduce
//!   and reduce-scatter of `f32` and `f64`, broadcast and all-gather of
//!   bytes, all-gather of a 16-byte digest, barrier). [`SingleProcess`] implements them for a world of one, so the
//!   same code runs in one process without MPI; with the `mpi` feature, MPI's
//!   `SimpleCommunicator` implements them.
//! - [`Manifest`]: the variables of a scope (full names, dtypes, shapes in
//!   full-name order). Ranks [agree](Manifest::agree) on it by digest before
//!   any collective that depends on it; on a mismatch every rank returns the
//!   same [`Error::Disagree`], naming the first variable that differs and the
//!   ranks on each side.
//! - [`SyncPlan`]: a scope's variables, agreed once, with their buckets and
//!   buffers. [`broadcast`](SyncPlan::broadcast) the parameters from a root
//!   rank, [`all_reduce`](SyncPlan::all_reduce) the gradients (sum or mean,
//!   in place, large variables from their own buffers and small ones in
//!   buckets of 2 MiB by default, allocating nothing),
//!   [`check_consistency`](SyncPlan::check_consistency) of the parameters'
//!   bytes, and checkpoints across ranks
//!   ([`save_on_root`](SyncPlan::save_on_root),
//!   [`load_on_all`](SyncPlan::load_on_all)).
//! - `CandlePlan` (feature `candle`): the same for a
//!   `CandleStore`'s trainable variables, whose
//!   gradients it reduces in candle's `GradStore`.
//! - [`Partition`]: optimizer state partitioned across ranks (ZeRO stage
//!   1). A plan cuts its variables into one contiguous slice per rank of
//!   about equal bytes ([`partition`](SyncPlan::partition)),
//!   [`reduce_scatter`](SyncPlan::reduce_scatter)s gradients so that each
//!   rank holds the reduced values of its slice, and
//!   [`all_gather`](SyncPlan::all_gather)s the parameters once each rank
//!   stepped its slice.
//! - [`Watch`]: the watchdog. Every collective call of a plan is watched
//!   with the plan's [timeout](PlanOptions::timeout) (10 minutes by
//!   default, as NCCL's watchdog): a rank still waiting when it has passed
//!   prints which call it waited in, the scope, the step
//!   ([`Watch::set_step`]) and how long, and exits with
//!   [`STALL_EXIT_CODE`], so that `mpirun` ends the job.
//!
//! The files, from the bottom up (each imports only files above it in
//! this list):
//!
//! | file | role |
//! |---|---|
//! | `error.rs` | [`Error`], the layer's errors |
//! | `transport/watchdog.rs` | [`Watch`]: a rank that waits too long in a collective call ends its process |
//! | `transport/collective.rs` | [`Collective`], [`SingleProcess`], [`Digest`] |
//! | `vars/checksum.rs` | the checksums ranks compare (xxh3-128) |
//! | `transport/mpi.rs` | [`Collective`] for MPI's communicator (feature `mpi`) |
//! | `vars/access.rs` | how a variable's value is read as bytes, by type |
//! | `vars/manifest.rs` | [`Manifest`] and its agreement |
//! | `layout/partition.rs` | [`Partition`]: each rank's slice (ZeRO) |
//! | `plan/options.rs` | [`PlanOptions`], [`Reduce`], [`DEFAULT_BUCKET_BYTES`] |
//! | `plan/agree.rs` | how ranks exchange failures and arguments before a collective |
//! | `vars/values.rs` | a plan's variables as bytes; the float types it reduces |
//! | `plan/buckets.rs`, `plan/bucketed.rs` | cutting variables into buckets; the bucketed all-reduce and broadcast |
//! | `plan/consistency.rs` | the consistency check: the first variable whose bytes differ |
//! | `plan/scatter.rs` | the buffers and copies of ZeRO's reduce-scatter and all-gather |
//! | `plan/sync_plan.rs` | [`SyncPlan`]: agreement, broadcast, all-reduce, consistency |
//! | `plan/zero.rs` | [`SyncPlan`]'s partitioned exchange (ZeRO stage 1) |
//! | `checkpoints/checkpoint.rs` | [`SyncPlan`]'s checkpoints on one rank: `save_on_root`, `load_on_all` |
//! | `checkpoints/shards.rs` | [`SyncPlan`]'s checkpoints written and read by every rank: `save_shards`, `load_shards` |
//! | `checkpoints/manager.rs` | [`CheckpointManager`]: a step per directory, the latest pointer, keep-last-K |
//! | `checkpoints/async_save.rs` | [`AsyncSaver`]: saves written by a background thread beside training |
//! | `candle/plan.rs` | `CandlePlan` (feature `candle`) |
//! | `candle/in_place.rs` | the in-place swap of `CandlePlan::all_reduce_in_place` |
//! | `candle/shards.rs` | `CandlePlan`'s checkpoints written and read by every rank: `save_shards`, `load_shards` |
//!
//! Synchronised values are `Vec`, `Box<[_]>` and
//! [`checkpoint::Tensor`](crate::checkpoint::Tensor) of `f32`, `f64` and the
//! fixed-size integers (reductions: `f32` and `f64` only). The layer sits
//! above the tree, sharing and checkpoint layers and uses them; none of them
//! uses it. It needs the `safetensors` feature (on by default); the MPI
//! implementation needs `mpi`. See `docs/distributed.md`.
//!
//! ```
//! use scopetree::{ScopeTree, ranks::{PlanOptions, Reduce, SingleProcess, SyncPlan}};
//! let world = SingleProcess; // or `universe.world()` under MPI
//! let mut tree = ScopeTree::new();
//! let params = tree.new_named_scope(tree.root(), "params")?;
//! let grads = tree.new_named_scope(tree.root(), "grads")?;
//! let w = tree.var(params, "w")?;
//! tree.set(w, vec![0.5_f32; 8])?;
//! let g = tree.var(grads, "w")?;
//! tree.set(g, vec![0.0_f32; 8])?;
//!
//! let mut p = SyncPlan::new(&world, &tree, params, &PlanOptions::new())?;
//! let mut gp = SyncPlan::new(&world, &tree, grads, &PlanOptions::new())?;
//! p.broadcast(&world, &mut tree, 0)?; // every rank starts from rank 0's parameters
//! for _step in 0..3 {
//!     tree.get_mut::<Vec<f32>>(g)?.fill(0.25); // the backward pass
//!     gp.all_reduce(&world, &mut tree, Reduce::Mean)?;
//!     // … the optimizer step, the same on every rank …
//! }
//! p.check_consistency(&world, &tree)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(feature = "candle")]
mod candle;
mod checkpoints;
mod error;
mod layout;
mod plan;
mod transport;
mod vars;

#[cfg(feature = "candle")]
pub use candle::plan::CandlePlan;
pub use checkpoints::async_save::AsyncSaver;
pub use checkpoints::manager::{CheckpointManager, LATEST_FILE};
pub use checkpoints::shards::{ShardedLoad, ShardedSave};
pub use error::Error;
pub use layout::partition::{Partition, Piece};
pub use layout::sliced::SlicedState;
pub use plan::options::{
    DEFAULT_BUCKET_BUFFERS, DEFAULT_BUCKET_BYTES, DEFAULT_DIRECT_BYTES, PlanOptions, Reduce,
};
pub use plan::sync_plan::SyncPlan;
pub use transport::collective::{Collective, DIGEST_BYTES, Digest, SingleProcess};
pub use transport::pipeline::Pipeline;
pub use transport::watchdog::{DEFAULT_TIMEOUT, STALL_EXIT_CODE, Watch};
pub use vars::manifest::{Manifest, ManifestEntry};
