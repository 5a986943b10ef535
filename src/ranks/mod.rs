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
//! - `Nccl` (feature `nccl`): NCCL's collectives over CUDA tensors, started
//!   through any [`Collective`] (rank 0's id broadcast over MPI), for
//!   `CandlePlan::all_reduce_nccl` and `broadcast_nccl`; its calls have a
//!   watchdog of their own that aborts the communicator.
//! - [`Watch`]: the watchdog. Every collective call of a plan is watched
//!   with the plan's [timeout](PlanOptions::timeout) (10 minutes by
//!   default, as NCCL's watchdog): a rank still waiting when it has passed
//!   prints which call it waited in, the scope, the step
//!   ([`Watch::set_step`]) and how long, and exits with
//!   [`STALL_EXIT_CODE`], so that `mpirun` ends the job.
//!
//! The layer's rooms, from the bottom up: each sub-folder may import the
//! rooms above it in this list, never one below it, and no two files make a
//! circle (`scripts/layers.py` checks both in CI). Each room's `mod.rs`
//! lists its files.
//!
//! | room | files | role |
//! |---|---|---|
//! | `error.rs` | `error.rs` | [`Error`], the layer's errors |
//! | `transport/` | `pipeline.rs`, `collective.rs`, `mpi.rs`, `watchdog.rs` | how bytes move: [`Collective`], [`SingleProcess`], [`Digest`], [`Pipeline`], MPI's communicator (feature `mpi`), and [`Watch`], which ends a rank that waits too long in a collective call |
//! | `vars/` | `access.rs`, `checksum.rs`, `values.rs`, `manifest.rs` | what the ranks see of a plan's variables: their bytes by type, the checksums ranks compare (xxh3-128), the float types a plan reduces, and the [`Manifest`] they agree on |
//! | `layout/` | `partition.rs`, `sliced.rs`, `slices.rs` | how variables and optimizer state are cut across ranks: [`Partition`] (ZeRO stage 1), [`SlicedState`], and moving sliced state between whole tensors and the ranks' pieces |
//! | `plan/` | `options.rs`, `agree.rs`, `buckets.rs`, `bucketed.rs`, `consistency.rs`, `scatter.rs`, `sync_plan.rs`, `zero.rs` | [`SyncPlan`] and its collectives: [`PlanOptions`], [`Reduce`], agreement on failures and arguments, the bucketed all-reduce and broadcast, the consistency check, ZeRO's reduce-scatter and all-gather |
//! | `checkpoints/` | `checkpoint.rs`, `state_shards.rs`, `shards.rs`, `manager.rs`, `async_save.rs` | [`SyncPlan`]'s checkpoints across ranks: on one rank (`save_on_root`, `load_on_all`), by every rank (`save_shards`, `load_shards`, the sliced state's shards), [`CheckpointManager`], [`AsyncSaver`] |
//! | `candle/` | `plan.rs`, `in_place.rs`, `shards.rs`, `staging.rs`, `zero.rs`, `zero_adamw.rs` | `CandlePlan` (feature `candle`), with `all_reduce_in_place`, its sharded checkpoints and ZeRO stage 1 (`ZeroAdamW`) |
//! | `nccl/` | `comm.rs`, `plan.rs` | `Nccl` (feature `nccl`): NCCL's collectives over CUDA tensors, started over any [`Collective`], and `CandlePlan`'s all-reduce and broadcast over it |
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
#[cfg(feature = "nccl")]
mod nccl;
mod plan;
mod transport;
mod vars;

#[cfg(feature = "candle")]
pub use candle::plan::CandlePlan;
#[cfg(feature = "candle")]
pub use candle::training::{OPTIMIZER_DIR, Training, TrainingOptimizer};
#[cfg(feature = "candle")]
pub use candle::zero_adamw::ZeroAdamW;
pub use checkpoints::async_save::{AsyncSaver, SaveStarted};
pub use checkpoints::manager::{CheckpointManager, LATEST_FILE};
pub use checkpoints::plans::{ShardedPlan, StagedPlan};
pub use checkpoints::shards::{ShardedLoad, ShardedSave};
pub use error::Error;
pub use layout::partition::{Partition, Piece};
pub use layout::sliced::SlicedState;
#[cfg(feature = "nccl")]
pub use nccl::comm::Nccl;
pub use plan::options::{
    DEFAULT_BUCKET_BUFFERS, DEFAULT_BUCKET_BYTES, DEFAULT_DIRECT_BYTES, PlanOptions, Reduce,
};
pub use plan::sync_plan::SyncPlan;
pub use transport::collective::{Collective, DIGEST_BYTES, Digest, SingleProcess};
pub use transport::pipeline::Pipeline;
pub use transport::watchdog::{DEFAULT_TIMEOUT, STALL_EXIT_CODE, Watch};
pub use vars::manifest::{Manifest, ManifestEntry};
