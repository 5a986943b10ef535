//! NCCL (feature `nccl`): [`Nccl`](crate::ranks::Nccl), NCCL's collectives
//! over CUDA tensors, started through any
//! [`Collective`](crate::ranks::Collective) (MPI under `mpirun`), and
//! `CandlePlan`'s calls over it. The top room of the ranks layer: it uses
//! the candle room and the rooms below it, and nothing imports it.
//!
//! | file | role |
//! |---|---|
//! | `comm.rs` | [`Nccl`](crate::ranks::Nccl): the communicator, its calls on the device's stream, the watchdog that aborts it |
//! | `plan.rs` | `CandlePlan::all_reduce_nccl` and `CandlePlan::broadcast_nccl`: the plan's buckets and agreement over NCCL |
//! | `zero.rs` | `CandlePlan::reduce_scatter_nccl` and `CandlePlan::all_gather_nccl`: ZeRO stage 1 on the device |

pub(super) mod comm;
pub(super) mod plan;
pub(super) mod zero;
